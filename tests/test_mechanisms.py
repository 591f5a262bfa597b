"""cait.explain's mechanistic tools against independent computations: the logit lens against copies of the
model cut after each SA block, activation patching against whole runs with a hook putting the clean
output in, a set of CA heads ablated against forward pre-hooks zeroing their slices of attn.proj's input."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import randomise_

import cait
from cait import explain


@pytest.fixture(scope="module")
def small():
    """A random pico model with gammas far from their tiny init (every block matters), deeper than its
    default so that cached prefixes have something to share, with 4 heads, and a batch with targets."""
    torch.manual_seed(0)
    model = randomise_(cait.load_model("cait_pico_32", weights=False, depth=4, num_heads=4).model).eval()
    cfg = model.cfg
    x = torch.randn(3, cfg.in_chans, cfg.img_size, cfg.img_size, generator=torch.Generator().manual_seed(1))
    return model, x, torch.tensor([0, 4, 9])


def _target_logit(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return logits.gather(1, target.view(-1, 1))[:, 0]


# ---------------------------------------------------------------------------- head ablation of a set


def _heads_zeroed(model: torch.nn.Module, heads: list[tuple[int, int]]) -> torch.nn.Module:
    """A copy whose CA heads' slices of attn.proj's input are zeroed by forward pre-hooks."""
    twin = copy.deepcopy(model)
    width = model.cfg.embed_dim // model.cfg.num_heads
    for layer in {c for c, _ in heads}:

        def zero(module, args, layer=layer):
            o = args[0].clone()
            for c, h in heads:
                if c == layer:
                    o[..., h * width : (h + 1) * width] = 0
            return (o,)

        twin.blocks_token_only[layer].attn.proj.register_forward_pre_hook(zero)
    return twin


def test_a_set_of_one_head_is_the_single_head_ablation(small):
    model, x, target = small
    for layer, head in ((0, 1), (1, 3)):
        one = explain.head_ablation(model, x, heads=[(layer, head)])
        single = explain.head_ablation(model, x, layer=layer, head=head)
        torch.testing.assert_close(one.after, single.after, atol=0, rtol=0)
        torch.testing.assert_close(one.after, _heads_zeroed(model, [(layer, head)])(x), atol=1e-5, rtol=1e-5)
        assert one.heads == ((layer, head),)


@pytest.mark.parametrize("heads", [[(0, 0), (0, 2)], [(1, 1), (0, 3)], [(0, 0), (0, 1), (1, 2), (1, 3)]])
def test_ablating_several_heads_equals_zeroing_them_all_by_hand(small, heads):
    model, x, target = small
    out = explain.head_ablation(model, x, heads=heads)
    expected = _heads_zeroed(model, heads)(x)
    torch.testing.assert_close(out.before, model(x), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.after, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.delta(target), _target_logit(expected - model(x), target), atol=1e-5, rtol=1e-5)
    probs, classes = out.top(5)
    assert probs.shape == classes.shape == (3, 5)
    torch.testing.assert_close(classes, expected.topk(5, dim=-1).indices)
    singles = sum(explain.head_ablation(model, x, heads=[h]).delta(target) for h in heads)
    assert not torch.allclose(out.delta(target), singles, atol=1e-3), "heads interact: the set is not a sum"


def test_mean_ablation_of_a_set_and_bad_sets(small):
    model, x, _ = small
    reference = torch.randn(5, *x.shape[1:], generator=torch.Generator().manual_seed(2))
    means = explain.causal.mean_head_outputs(model, reference)  # [L, d]
    width = model.cfg.embed_dim // model.cfg.num_heads
    twin = copy.deepcopy(model)
    for layer, head in ((0, 1), (1, 0)):

        def fill(module, args, head=head, value=means[layer, head * width : (head + 1) * width]):
            o = args[0].clone()
            o[..., head * width : (head + 1) * width] = value
            return (o,)

        twin.blocks_token_only[layer].attn.proj.register_forward_pre_hook(fill)
    out = explain.head_ablation(model, x, heads=[(1, 0), (0, 1)], reference=reference)
    torch.testing.assert_close(out.after, twin(x), atol=1e-5, rtol=1e-5)
    assert out.heads == ((0, 1), (1, 0))
    for bad in ([(2, 0)], [(0, 4)], []):
        with pytest.raises(ValueError, match="no CA head"):
            explain.head_ablation(model, x, heads=bad)
    with pytest.raises(ValueError, match="heads="):
        explain.head_ablation(model, x, heads=[(0, 0)], layer=0, head=0)


# ---------------------------------------------------------------------------- logit lens


def test_logit_lens_equals_the_model_cut_after_each_sa_block(small):
    """Entry k is the model with only its first k SA blocks (a copy whose later blocks are dropped): the
    CA stage, norm and head then read the stream after block k - 1; the last entry is the model itself."""
    model, x, _ = small
    lens = explain.logit_lens(model, x)
    depth = model.cfg.depth
    assert lens.shape == (3, depth + 1, model.cfg.num_classes)
    torch.testing.assert_close(lens[:, -1], model(x), atol=1e-5, rtol=1e-5)
    for k in range(depth + 1):
        cut = copy.deepcopy(model)
        cut.blocks = cut.blocks[:k]
        torch.testing.assert_close(lens[:, k], cut(x), atol=1e-5, rtol=1e-5)
    assert (lens[:, 0] - lens[:, -1]).abs().max() > 1e-2  # the depths differ: the checks are not of one thing


def test_logit_lens_refuses_a_vit_style_class_token():
    model = cait.load_model("cait_pico_32", weights=False, class_token_at=1, depth_token_only=0).model
    with pytest.raises(cait.InputError, match="model has no class-attention stage.*class_token_at=1"):
        explain.logit_lens(model, torch.randn(1, 3, 32, 32))


# ---------------------------------------------------------------------------- activation patching


@pytest.fixture(scope="module")
def pair(small):
    """The batch as the clean images and a corrupted copy (noise added), with the patching of both."""
    model, clean, target = small
    corrupted = clean + 0.8 * torch.randn(clean.shape, generator=torch.Generator().manual_seed(3))
    blocks = explain.activation_patching(model, clean, corrupted, target)
    heads = explain.activation_patching(model, clean, corrupted, target, granularity="head")
    return model, clean, corrupted, target, blocks, heads


def _patched_by_hook(model, clean, corrupted, target, module, *, pre=False, cols=None) -> torch.Tensor:
    """The naive patching: record `module`'s output (pre: its input, only `cols` of it) in model(clean),
    then run model(corrupted) with a hook putting it in; the target logit minus the corrupted one's."""
    seen = []
    if pre:
        handle = module.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    else:
        handle = module.register_forward_hook(lambda m, args, out: seen.append(out))
    model(clean)
    handle.remove()

    def put(m, args, out=None):
        if not pre:
            return seen[0]
        o = args[0].clone()
        o[..., cols] = seen[0][..., cols]
        return (o,)

    handle = module.register_forward_pre_hook(put) if pre else module.register_forward_hook(put)
    try:
        patched = model(corrupted)
    finally:
        handle.remove()
    return _target_logit(patched - model(corrupted), target)


def test_every_patch_equals_the_hooked_full_runs(pair):
    """Every entry against two whole forward passes with a hook: the class token a CA block outputs (but the
    last's), each branch (the attn / mlp module's output), each CA head."""
    model, clean, corrupted, target, got, by_head = pair
    blocks = list(model.blocks) + list(model.blocks_token_only)
    ca = model.cfg.depth_token_only
    assert got.class_token.shape == (3, ca - 1) and got.branches.shape == (3, len(blocks), 2)
    for c, blk in enumerate(model.blocks_token_only[:-1]):
        expected = _patched_by_hook(model, clean, corrupted, target, blk)
        torch.testing.assert_close(got.class_token[:, c], expected, atol=1e-5, rtol=1e-5)
    for i, blk in enumerate(blocks):
        for j, part in enumerate((blk.attn, blk.mlp)):
            expected = _patched_by_hook(model, clean, corrupted, target, part)
            torch.testing.assert_close(got.branches[:, i, j], expected, atol=1e-5, rtol=1e-5)
    width = model.cfg.embed_dim // model.cfg.num_heads
    assert by_head.heads.shape == (3, model.cfg.depth_token_only, model.cfg.num_heads)
    for c, blk in enumerate(model.blocks_token_only):
        for h in range(model.cfg.num_heads):
            cols = slice(h * width, (h + 1) * width)
            expected = _patched_by_hook(model, clean, corrupted, target, blk.attn.proj, pre=True, cols=cols)
            torch.testing.assert_close(by_head.heads[:, c, h], expected, atol=1e-5, rtol=1e-5)
    assert got.branches.abs().min() > 1e-4 and by_head.heads.abs().max() > 1e-2  # nothing checked is 0 = 0


def test_patching_invariants(pair):
    model, clean, corrupted, target, got, by_head = pair
    gap = _target_logit(model(clean) - model(corrupted), target)
    assert gap.abs().min() > 1e-2
    torch.testing.assert_close(got.gap, gap, atol=1e-5, rtol=1e-5)
    # the whole stream after the SA stage, and the final class token, restore the gap by construction (here
    # by hooked runs): no entry reports them, and no entry equals the gap on every image
    for whole in (model.blocks[-1], model.blocks_token_only[-1]):
        torch.testing.assert_close(_patched_by_hook(model, clean, corrupted, target, whole), gap, atol=1e-5, rtol=1e-5)
    for entries in (got.class_token, got.branches.flatten(1), by_head.heads.flatten(1)):
        assert ((entries - gap[:, None]).abs() > 1e-4).any(0).all()
    assert got.heads is None and by_head.class_token is None and by_head.branches is None
    same = explain.activation_patching(model, clean, clean, target)  # nothing differs: nothing to restore
    assert same.class_token.abs().max() == 0 and same.branches.abs().max() == 0
    assert explain.activation_patching(model, clean, clean, target, granularity="head").heads.abs().max() == 0


def test_patching_a_branch_silenced_in_both_runs_restores_nothing(pair):
    """With gamma_1 = 0 an SA block's attention branch writes 0 in both runs: patching it changes nothing,
    though its unscaled output differs between the runs."""
    model, clean, corrupted, target, _, _ = pair
    silent = copy.deepcopy(model)
    with torch.no_grad():
        silent.blocks[1].gamma_1.zero_()
        silent.blocks_token_only[0].gamma_2.zero_()
    got = explain.activation_patching(silent, clean, corrupted, target)
    assert got.branches[:, 1, 0].abs().max() == 0 and got.branches[:, 4, 1].abs().max() == 0
    assert got.branches[:, 1, 1].abs().min() > 1e-4  # the same block's MLP branch still restores something


def test_patching_refuses_bad_input(small):
    model, x, target = small
    with pytest.raises(ValueError, match="granularity must be one of block, head"):
        explain.activation_patching(model, x, x, target, granularity="neuron")
    with pytest.raises(cait.InputError, match="corrupted: need one corrupted image per clean one"):
        explain.activation_patching(model, x, x[:2], target)


# ---------------------------------------------------------------------------- gradient-weighted rollout


def _captured_attention(model: torch.nn.Module) -> list[torch.Tensor]:
    """Hooks on every SA layer keeping the softmax output A (the tensor that proj_w mixes, the identity
    without talking heads) with its gradient retained: each attention module's _mix is wrapped."""
    kept = []
    for blk in model.blocks:
        attn, mix = blk.attn, blk.attn._mix

        def keep(proj, a, attn=attn, mix=mix):
            if proj is attn.proj_w:
                a.retain_grad()
                kept.append(a)
            return mix(proj, a)

        attn._mix = keep
    return kept


def _rule(attentions: list[torch.Tensor], n: int) -> torch.Tensor:
    """The paper's rule from its equations, given each layer's A (its .grad: dy_t/dA) in forward order:
    Ā = E_h[(∇A ⊙ A)⁺], R = I then R ← R + Ā R, over the tokens [cls, n patches]; a layer over the patches
    alone (before the class token exists) has zero rows and columns for it, a class-attention layer only
    the class token's row. The class row's patch columns on the grid."""
    B = attentions[0].shape[0]
    relevance = torch.eye(n + 1).repeat(B, 1, 1)
    for a in attentions:
        weighted = (a.grad * a).clamp(min=0).mean(dim=1)
        cam = torch.zeros_like(relevance)
        if weighted.shape[-2:] == (n, n):
            cam[:, 1:, 1:] = weighted
        else:
            cam[:, : weighted.shape[-2]] = weighted  # [B, 1 + n, 1 + n] or the class row [B, 1, 1 + n]
        relevance = relevance + cam @ relevance
    g = int(n**0.5)
    return relevance[:, 0, 1:].reshape(B, g, g)


@pytest.mark.parametrize("class_token_at", [0, 1])
def test_gradient_rollout_is_the_published_rule_on_a_vit_shaped_model(class_token_at):
    """At class_token_at=0 the paper's setting itself: every layer over [cls, patches]."""
    torch.manual_seed(0)
    model = cait.load_model(
        "cait_pico_32",
        weights=False,
        depth=3,
        num_heads=4,
        talking_heads=False,
        class_token_at=class_token_at,
        depth_token_only=0,
    ).model
    model = randomise_(model).eval()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    target = torch.tensor([1, 7, 7])
    twin = copy.deepcopy(model)
    kept = _captured_attention(twin)
    twin(x).gather(1, target.view(-1, 1)).sum().backward()
    expected = _rule(kept, model.cfg.num_patches)
    got = explain.gradient_rollout(model, x, target)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert expected.abs().max() > 1e-3 and not torch.allclose(expected[1], expected[2])  # depends on the image
    torch.testing.assert_close(explain.saliency_map(model, x, target, "gradient_rollout"), got)


def _explicit_class_attention(model: torch.nn.Module) -> list[torch.Tensor]:
    """Each CA layer's forward replaced by the same computation with its attention row [B, h, 1, 1+N]
    materialised and its gradient retained (the model's own path fuses it away)."""
    kept = []
    for blk in model.blocks_token_only:
        attn = blk.attn

        def forward(u, attn=attn):
            B, N, C = u.shape
            heads = lambda t: t.reshape(B, -1, attn.num_heads, C // attn.num_heads).transpose(1, 2)
            q, k, v = heads(attn.q(u[:, :1])), heads(attn.k(u)), heads(attn.v(u))
            a = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            a.retain_grad()
            kept.append(a)
            return attn.proj((a @ v).transpose(1, 2).reshape(B, 1, C))

        attn.forward = forward
    return kept


def test_gradient_rollout_on_cait_is_the_rule_over_class_and_patch_tokens(small):
    """CaiT with talking heads, as the docstring adapts the rule: one relevance matrix over [cls, patches],
    SA layers acting on the patches (A: the softmax proj_w mixes), then each CA layer's Ā with only the
    class token's row, R ← R + Ā R throughout; the class row over the patches."""
    model, x, target = small
    twin = copy.deepcopy(model)
    sa, ca = _captured_attention(twin), _explicit_class_attention(twin)
    twin(x).gather(1, target.view(-1, 1)).sum().backward()
    expected = _rule(sa + ca, model.cfg.num_patches)
    got = explain.gradient_rollout(model, x, target)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (sa[0].grad < 0).any() and expected.abs().max() > 1e-3


# ---------------------------------------------------------------------------- analysis/mechanisms.py


def test_the_analysis_scripts_numbers_are_the_models(tmp_path):
    """--quick on a tiny checkpoint: the lens's agreement, the gap and each branch's and head's restored share
    recomputed here from the 8 scenes and their corrupted views. The script's main in this process: make_all's
    run in tests/test_analysis.py starts it in a fresh interpreter, as a user does."""
    import json

    import mechanisms

    from cait.corruptions import corrupt
    from cait.data import read_images
    from cait.preprocess import normalise

    torch.manual_seed(0)
    model = randomise_(cait.load_model("cait_pico_32", weights=False).model).eval()
    path = tmp_path / "pico.safetensors"
    cait.save_weights(model, path, {"data": "fashion-mnist-scenes", "epochs_completed": "3"})
    args = ["--quick", "--checkpoint", path, "--corruption", "contrast", "--severity", "4", "--out", tmp_path / "out"]
    assert mechanisms.main([str(a) for a in args]) == 0
    data = json.loads((tmp_path / "out" / "mechanisms.json").read_text())
    views = read_images("fashion-mnist-scenes", model.cfg, limit=8, normalise=False)
    x = torch.stack([views[i][0] for i in range(8)])
    broken = corrupt(x, "contrast", 4, generator=torch.Generator().manual_seed(0))
    clean, corrupted = normalise(x, model.cfg), normalise(broken, model.cfg)
    target = model(clean).argmax(-1)
    agree = (explain.logit_lens(model, clean).argmax(-1) == target[:, None]).float().mean(0)
    assert [r["top1_agreement"] for r in data["lens"]] == pytest.approx(agree.tolist())
    patched = explain.activation_patching(model, clean, corrupted, target)
    gap = _target_logit(model(clean) - model(corrupted), target).mean()
    assert data["gap"]["mean"] == pytest.approx(gap.item(), abs=1e-5)
    for i, block in enumerate(data["blocks"]):
        for j, kind in enumerate(("attention", "MLP")):
            share = patched.branches[:, i, j].mean() / gap
            assert block[kind]["restored"] == pytest.approx(share.item(), abs=1e-4)
            low, high = block[kind]["restored_ci95"]
            assert low <= block[kind]["restored"] + 1e-9 and block[kind]["restored"] <= high + 1e-9
    heads = explain.activation_patching(model, clean, corrupted, target, granularity="head").heads
    assert [h["restored"] for h in data["heads"]] == pytest.approx((heads.mean(0).flatten() / gap).tolist(), abs=1e-4)
    best = max((s, n) for n, s in data["carriers"])
    assert f"{best[1]} ({best[0]:.0%})" in data["verdict"] and "contrast at severity 4" in data["verdict"]
    assert all("stream" not in b for b in data["blocks"]) and "orientation" in data["whole_stream"]
    assert data["blocks"][-2]["class_token"]["restored"] == pytest.approx(
        (patched.class_token[:, 0].mean() / gap).item()
    )
    # token patching: per image the rank correlation of the clean run's CA attention (mean over CA layers and
    # heads, per patch) with what each patch's clean tokens restore, recomputed here with numpy's ranks
    from scipy.stats import rankdata

    tokens = explain.token_patching(model, clean, corrupted, target)
    attention = explain.class_attention(model, clean).maps.mean((1, 2)).flatten(1).numpy()
    rho = []
    for a, r in zip(attention, tokens.restored.flatten(1).numpy()):
        rho.append(np.corrcoef(rankdata(a), rankdata(r))[0, 1])
    assert data["tokens"]["per_image_rank_correlation"] == pytest.approx(rho, abs=1e-6)
    got = data["tokens"]["rank_correlation"]
    assert got["mean"] == pytest.approx(np.mean(rho)) and got["ci95"][0] <= got["mean"] <= got["ci95"][1]
    assert f"mean rank correlation {np.mean(rho):.2f}" in data["verdict"]
    best_region = tokens.restored.flatten(1).max(1).values.mean() / gap
    assert data["tokens"]["best_region"]["restored"] == pytest.approx(best_region.item(), abs=1e-4)
    for name in ("mechanisms.png", "mechanisms.html", "token_patching.png"):
        assert (tmp_path / "out" / name).stat().st_size > 1000


# ---------------------------------------------------------------------------- hooks


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_every_hook_is_removed_however_the_pass_ends(small):
    """The hooks the explanations open (`cait.explain.hooks`) are gone after a pass that raised: each kind on
    its own, a head ablation's, and class-specific attention's cut of the SA graph stopped mid-pass."""
    from cait.explain.causal import _without_heads
    from cait.explain.hooks import before_each, recorded, silenced, substituted

    model, x, target = small
    blk, ca = model.blocks[0], model.blocks_token_only[0]
    opened = [
        recorded({"sa": (blk, False), "ca": (ca, True)}),
        substituted(blk, x),
        silenced(blk.attn),
        before_each([blk, ca], lambda: None),
        _without_heads(ca, [0, 1], None),
    ]
    for hooks in opened:
        with pytest.raises(RuntimeError, match="stop"), hooks:
            assert _hooks(model) > 0
            raise RuntimeError("stop")
        assert _hooks(model) == 0
    stop = lambda: (_ for _ in ()).throw(RuntimeError("stop"))  # noqa: E731
    with pytest.raises(RuntimeError, match="stop"), before_each([ca.attn], stop):
        explain.class_specific_attention(model, x, target)
    assert _hooks(model) == 0


HOOK_MODULES = {"cait/explain/hooks.py", "cait/insights.py"}  # the two that register forward hooks, thread-guarded


def test_forward_hooks_are_registered_only_by_the_hooks_modules():
    """Every forward hook of the library and the app goes through `cait.explain.hooks` (or `cait.insights`),
    whose hooks act on their own thread's passes only: the app runs quick views beside long work on one model,
    and a hook registered elsewhere (the Mechanisms tab's progress on the head, once) acted on every thread's
    passes. Read from the source: any call of a `register_forward_*hook` method outside those modules."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted([*root.joinpath("cait").rglob("*.py"), *root.joinpath("app").rglob("*.py")]):
        where = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=where)):
            if isinstance(node, ast.Attribute) and node.attr.startswith("register_forward_"):
                found.append(f"{where}:{node.lineno}")
    assert found and all(place.split(":")[0] in HOOK_MODULES for place in found), found
