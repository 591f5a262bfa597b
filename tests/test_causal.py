"""The causal view (cait.explain.causal) against independent computations: the attribution's parts add
up to the logit, each knockout equals a copy of the model with that block's gammas zeroed, the cached
profile equals the naive loop, and a head ablation equals a pre-hook that zeroes that head's slice of
attn.proj's input."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import randomise_
from PIL import Image

import cait
from cait import explain
from cait.data import read_examples
from cait.preprocess import to_batch


@pytest.fixture(scope="module")
def small():
    """A random pico model whose gammas are far from their tiny init (so every block matters), deeper
    than its default to give the shared prefix something to share, and a batch with targets."""
    torch.manual_seed(0)
    model = randomise_(cait.load_model("cait_pico_32", weights=False, depth=4).model).eval()
    cfg = model.cfg
    x = torch.randn(3, cfg.in_chans, cfg.img_size, cfg.img_size)
    return model, x, torch.tensor([0, 4, 9])


def _target_logit(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return logits.gather(1, target.view(-1, 1))[:, 0]


def test_attribution_adds_up_to_the_logit(small):
    model, x, target = small
    a = explain.direct_logit_attribution(model, x, target)
    L, H, N = model.cfg.depth_token_only, model.cfg.num_heads, model.cfg.num_patches
    assert a.heads.shape == (3, L, H) and a.patches.shape == (3, L, H, N) and a.rest.shape == (3,)
    logit = _target_logit(model(x), target)
    torch.testing.assert_close(a.heads.sum((1, 2)) + a.rest, logit, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.rest, a.class_token + a.mlp.sum(1) + a.biases)
    torch.testing.assert_close(sum(a.parts().values()), logit, atol=1e-5, rtol=1e-5)
    assert not a.class_token.requires_grad and a.class_token.shape == a.biases.shape == (3,)
    assert min(a.class_token.abs().max(), a.mlp.abs().max(), a.biases.abs().max()) > 1e-3  # each part is there
    torch.testing.assert_close(a.patches.sum(-1) + a.self_read, a.heads, atol=1e-6, rtol=1e-5)
    assert a.heads.abs().max() > 1e-2  # the heads write something: the sums above are not 0 = 0
    assert a.patch_maps.shape == (3, L, H, model.cfg.grid_size, model.cfg.grid_size)


def _seen(model: torch.nn.Module, module: torch.nn.Module, x: torch.Tensor, *, pre: bool) -> torch.Tensor:
    """The input (pre=True) or output of `module` during model(x)."""
    seen = []
    if pre:
        hook = module.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    else:
        hook = module.register_forward_hook(lambda m, args, out: seen.append(out))
    try:
        model(x)
    finally:
        hook.remove()
    return seen[0]


def test_a_heads_attribution_is_its_direct_write_through_the_frozen_norm(small):
    """Independent of the decomposition: the head's write is what attn.proj's output loses when a
    pre-hook zeroes the head's input slice; read through the final norm with the intact input's mean
    and scale, and the head, it must equal the head's attribution. Likewise each MLP's output and the
    initial class token."""
    model, x, target = small
    a = explain.direct_logit_attribution(model, x, target)
    z = _seen(model, model.norm, x, pre=True)[:, 0]
    sigma = (z.var(-1, unbiased=False, keepdim=True) + model.norm.eps).sqrt()

    def frozen(v: torch.Tensor) -> torch.Tensor:
        return model.head((v - v.mean(-1, keepdim=True)) / sigma * model.norm.weight + model.norm.bias)

    for layer in range(model.cfg.depth_token_only):
        for head in range(model.cfg.num_heads):
            blk = model.blocks_token_only[layer]
            full = _seen(model, blk.attn.proj, x, pre=False)[:, 0]
            cut_model = _head_replaced(model, layer, head, None)
            cut = _seen(cut_model, cut_model.blocks_token_only[layer].attn.proj, x, pre=False)[:, 0]
            write = blk.gamma_1 * (full - cut)
            drop = _target_logit(frozen(z) - frozen(z - write), target)
            torch.testing.assert_close(a.heads[:, layer, head], drop, atol=1e-5, rtol=1e-4)
        blk = model.blocks_token_only[layer]  # the MLP's write, read from its output the same way
        write = blk.gamma_2 * _seen(model, blk.mlp, x, pre=False)[:, 0]
        drop = _target_logit(frozen(z) - frozen(z - write), target)
        torch.testing.assert_close(a.mlp[:, layer], drop, atol=1e-5, rtol=1e-4)
    drop = _target_logit(frozen(z) - frozen(z - model.cls_token[0, 0]), target)
    torch.testing.assert_close(a.class_token, drop, atol=1e-5, rtol=1e-4)


def _gammas_zeroed(model: torch.nn.Module, name: str, branch: str) -> torch.nn.Module:
    twin = copy.deepcopy(model)
    block = twin.get_submodule(name)
    with torch.no_grad():
        for g in {"both": ("gamma_1", "gamma_2"), "attn": ("gamma_1",), "mlp": ("gamma_2",)}[branch]:
            getattr(block, g).zero_()
    return twin


@pytest.mark.parametrize("branch", ["both", "attn", "mlp"])
def test_each_knockout_equals_a_copy_with_that_blocks_gammas_zeroed(small, branch):
    model, x, target = small
    profile = explain.knockout_profile(model, x, target, branch=branch)
    names = explain.causal.block_names(model)
    assert profile.shape == (3, model.cfg.depth + model.cfg.depth_token_only) and len(names) == profile.shape[1]
    base = _target_logit(model(x), target)
    for k, name in enumerate(names):
        knocked = _target_logit(_gammas_zeroed(model, name, branch)(x), target)
        torch.testing.assert_close(profile[:, k], knocked - base, atol=1e-5, rtol=1e-5)
    assert profile.abs().max() > 1e-2


def test_shared_prefix_profile_equals_the_naive_loop(small):
    model, x, target = small
    for branch in ("both", "attn"):
        torch.testing.assert_close(
            explain.knockout_profile(model, x, target, branch=branch),
            explain.knockout_profile(model, x, target, branch=branch, shared_prefix=False),
            atol=1e-5,
            rtol=1e-5,
        )
    with pytest.raises(ValueError, match="branch"):
        explain.knockout_profile(model, x, target, branch="ffn")


def test_knockouts_from_a_recorded_pass_equal_their_own_prefix(small):
    """SA states kept from a forward_insights pass (`recorded_sa_inputs`) stand in for the profile's own
    first forward: the same profile bit for bit; states that cannot be that pass's are refused."""
    model, x, target = small
    with torch.no_grad(), explain.causal.recorded_sa_inputs(model) as states:
        model.forward_insights(x, sa_layers=(0, 1))
    assert len(states) == model.cfg.depth + 1
    for branch in ("both", "mlp"):
        assert torch.equal(
            explain.knockout_profile(model, x, target, branch=branch, sa_inputs=states),
            explain.knockout_profile(model, x, target, branch=branch),
        )
    with pytest.raises(ValueError, match="sa_inputs must be 5 states of 3 images"):
        explain.knockout_profile(model, x, target, sa_inputs=states[:-1])
    with pytest.raises(ValueError, match="sa_inputs must be 5 states of 3 images"):
        explain.knockout_profile(model, x, target, sa_inputs=[s[:2] for s in states])
    with pytest.raises(ValueError, match="shared_prefix=False"):
        explain.knockout_profile(model, x, target, sa_inputs=states, shared_prefix=False)
    with pytest.raises(ValueError, match="no forward pass"), explain.causal.recorded_sa_inputs(model):
        pass


def _head_replaced(model: torch.nn.Module, layer: int, head: int, fill: torch.Tensor | None) -> torch.nn.Module:
    """A copy whose CA head's slice of attn.proj's input is overwritten by a forward pre-hook."""
    twin = copy.deepcopy(model)
    width = model.cfg.embed_dim // model.cfg.num_heads

    def replace(module, args):
        o = args[0].clone()
        o[..., head * width : (head + 1) * width] = 0 if fill is None else fill
        return (o,)

    twin.blocks_token_only[layer].attn.proj.register_forward_pre_hook(replace)
    return twin


def test_head_ablation_equals_zeroing_that_heads_slice_of_the_proj_input(small):
    model, x, _ = small
    for layer in range(model.cfg.depth_token_only):
        for head in range(model.cfg.num_heads):
            out = explain.head_ablation(model, x, layer=layer, head=head)
            torch.testing.assert_close(out.before, model(x), atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(out.after, _head_replaced(model, layer, head, None)(x), atol=1e-5, rtol=1e-5)
            assert (out.after - out.before).abs().max() > 1e-3


def test_mean_ablation_uses_the_heads_mean_output_over_the_reference(small):
    model, x, _ = small
    reference = torch.randn(5, *x.shape[1:], generator=torch.Generator().manual_seed(1))
    width = model.cfg.embed_dim // model.cfg.num_heads
    seen = []
    hook = model.blocks_token_only[0].attn.proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    model(reference)
    hook.remove()
    fill = seen[0][:, 0, width : 2 * width].mean(0)
    out = explain.head_ablation(model, x, layer=0, head=1, reference=reference)
    torch.testing.assert_close(out.after, _head_replaced(model, 0, 1, fill)(x), atol=1e-5, rtol=1e-5)
    every = explain.all_head_ablations(model, x, reference=reference)
    torch.testing.assert_close(every[:, 0, 1], out.after, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="no CA head"):
        explain.head_ablation(model, x, layer=2, head=0)


def test_shipped_model_on_example_scenes():
    model = cait.load_model(cait.DEFAULT_MODEL, pretrained=True).model
    files = read_examples()[:3]
    x = to_batch([Image.open(f.path) for f in files], model.cfg)
    target = torch.tensor([f.label for f in files])
    logits = model(x)
    a = explain.direct_logit_attribution(model, x, target)
    torch.testing.assert_close(a.total, _target_logit(logits, target), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(a.patches.sum(-1) + a.self_read, a.heads, atol=1e-4, rtol=1e-4)
    profile = explain.knockout_profile(model, x, target)
    naive = explain.knockout_profile(model, x, target, shared_prefix=False)
    torch.testing.assert_close(profile, naive, atol=1e-4, rtol=1e-4)
    # the trained model's first CA block carries the answer: knocking it out lowers the true class's logit
    assert (profile[:, model.cfg.depth] < 0).all()
