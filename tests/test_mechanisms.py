"""cait.explain's mechanistic tools against independent computations: a set of CA heads ablated equals
forward pre-hooks zeroing those heads' slices of attn.proj's input."""

from __future__ import annotations

import copy

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
    model = randomise_(cait.create_model("cait_pico_32", depth=4, num_heads=4)).eval()
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
    means = explain.mean_head_outputs(model, reference)  # [L, d]
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
