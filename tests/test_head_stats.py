"""cait.explain.head_stats against direct computations: the entropy of class-attention maps, the ViT paper's
mean attention distance of self-attention heads, and the per-layer pass of a model."""

from __future__ import annotations

import math

import pytest
import torch

import cait
from cait.explain.head_stats import (
    attention_entropy,
    mean_attention_distance,
    mean_attention_distances,
    uniform_attention_distance,
)


def test_entropy_of_known_distributions():
    uniform, peaked = torch.full((4, 4), 1 / 16), torch.zeros(4, 4)
    peaked[2, 1] = 0.3  # one patch holds all of the map (the rest of the row went to the class token)
    two = torch.zeros(4, 4)
    two[0, 0] = two[3, 3] = 0.2
    out = attention_entropy(torch.stack([uniform, peaked, two]))
    assert out.tolist() == pytest.approx([math.log(16), 0.0, math.log(2)], abs=1e-6)


def test_entropy_equals_a_direct_sum_per_head():
    maps = torch.rand(2, 3, 5, 5)  # [CA layers, heads, g, g]
    got = attention_entropy(maps)
    assert got.shape == (2, 3)
    for layer in range(2):
        for head in range(3):
            p = maps[layer, head].flatten().double()
            p = p / p.sum()
            assert got[layer, head].item() == pytest.approx(-sum(float(q * q.log()) for q in p), rel=1e-5)


def distance_by_loops(attn: torch.Tensor, patch_size: int) -> float:
    """Mean over queries of sum_k |w_qk| / sum_k |w_qk| * distance(q, k), patch centres in pixels."""
    n = attn.shape[-1]
    g = int(round(n**0.5))
    total = 0.0
    for q in range(n):
        weights = attn[q].abs().double()
        weights = weights / weights.sum()
        qr, qc = divmod(q, g)
        for k in range(n):
            kr, kc = divmod(k, g)
            total += float(weights[k]) * math.hypot(qr - kr, qc - kc) * patch_size
    return total / n


def test_mean_attention_distance_equals_loops_also_for_negative_weights():
    attn = torch.randn(2, 9, 9)  # proj_w's weights: signed, rows not summing to 1
    got = mean_attention_distance(attn, patch_size=16)
    assert got.tolist() == pytest.approx([distance_by_loops(attn[h], 16) for h in range(2)], rel=1e-5)
    local = torch.eye(9)[None]  # every patch looks at itself only
    assert mean_attention_distance(local, patch_size=16).item() == 0.0
    with pytest.raises(ValueError, match="square patch grid"):
        mean_attention_distance(torch.rand(1, 8, 8), patch_size=16)


def test_mean_attention_distances_of_a_model_match_each_layers_own_maps():
    torch.manual_seed(0)
    model = cait.load_model("cait_pico_32", weights=False).model.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        got = mean_attention_distances(model, x)
        ins = model.forward_insights(x, sa_layers=tuple(range(model.cfg.depth)))
    assert got.shape == (2, model.cfg.depth, model.cfg.num_heads)
    for layer in range(model.cfg.depth):
        after_proj_w = ins.self_attention[layer][1]
        for b in range(2):
            for h in range(model.cfg.num_heads):
                want = distance_by_loops(after_proj_w[b, h], model.cfg.patch_size)
                assert got[b, layer, h].item() == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("grid, patch", [(17, 8), (28, 16)])  # cait_micro_136's grid; cait_m48_448's
def test_uniform_distance_is_exact_whatever_the_thread_count(grid, patch):
    """The uniform-attention level against a plain float64 sum over every pair of patch centres, equal bit for
    bit at 1 to 4 torch threads (torchrun's ranks run one thread each, one process more): one process and
    torchrun write the same summary.json."""
    centres = [(r * patch, c * patch) for r in range(grid) for c in range(grid)]
    want = math.fsum(math.dist(a, b) for a in centres for b in centres) / len(centres) ** 2
    threads = torch.get_num_threads()
    try:
        got = []
        for n in (1, 2, 3, 4):
            torch.set_num_threads(n)
            got.append(uniform_attention_distance(grid, patch))
    finally:
        torch.set_num_threads(threads)
    assert len(set(got)) == 1 and got[0] == pytest.approx(want, rel=1e-12)
