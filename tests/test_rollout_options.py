"""The methods' options as the rollout demos and captum Insights offer them: rollout's head fusion (mean, max,
min) and discard ratio against a scalar-by-scalar computation of the rule `cait.explain.rollout` states and
through `MethodOptions` by method name; integrated gradients from each baseline (completeness)."""

from __future__ import annotations

import pytest
import torch
from test_explain import pico, sharpen

from cait import explain
from cait.explain.attribution import IG_BASELINES, ig_baseline


def fused_rows(heads: list, i: int, n: int, fusion: str) -> list[float]:
    """Row i of one layer's heads ([heads][n][n], already clamped) merged by `fusion`, renormalised."""
    pick = {"mean": lambda v: sum(v) / len(v), "max": max, "min": min}[fusion]
    row = [pick([h[i][j] for h in heads]) for j in range(n)]
    return [r / max(sum(row), 1e-12) for r in row]


def rollout_by_loops(after_proj_w, ca_layers, fusion: str, discard: float) -> list[float]:
    """One sample's rollout at stage after_proj_w: per SA layer the heads clamped at 0 and merged, rows
    renormalised, the lowest `discard` share of the n*n weights zeroed, then (A + I) with rows renormalised;
    CA rows merged the same way over [cls, patches]."""
    n = len(ca_layers[0][0]) - 1
    relevance = [[float(i == j) for j in range(n)] for i in range(n)]
    for layer in after_proj_w:  # [heads][n][n]
        clamped = [[[max(v, 0.0) for v in row] for row in head] for head in layer]
        a = [fused_rows(clamped, i, n, fusion) for i in range(n)]
        drop = int(discard * n * n)
        if drop:
            lowest = sorted((a[i][j], i, j) for i in range(n) for j in range(n))[:drop]
            for _, i, j in lowest:
                a[i][j] = 0.0
        step = []
        for i in range(n):
            row = [a[i][j] + (i == j) for j in range(n)]
            step.append([r / sum(row) for r in row])
        relevance = [[sum(step[i][k] * relevance[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
    source = [1.0] + [0.0] * n
    for heads_rows in ca_layers:
        a = fused_rows([[row] for row in heads_rows], 0, n + 1, fusion)
        mixed = [a[0] * source[0]] + [
            a[0] * source[1 + j] + sum(a[1 + k] * relevance[k][j] for k in range(n)) for j in range(n)
        ]
        source = [(s + m) / 2 for s, m in zip(source, mixed)]
    return source[1:]


@pytest.mark.parametrize("fusion,discard", [("mean", 0.0), ("max", 0.0), ("min", 0.0), ("mean", 0.5), ("max", 0.25)])
def test_rollout_options_equal_loops(fusion, discard):
    model = sharpen(pico(img_size=16, depth=2), std=0.3)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    ins = model.forward_insights(x, sa_layers=(0, 1))
    got = explain.rollout(model, x, stage="after_proj_w", head_fusion=fusion, discard_ratio=discard)
    for b in range(2):
        sa = [ins.self_attention[layer][1][b].tolist() for layer in (0, 1)]
        ca = [a[b].tolist() for a in ins.class_attention]
        want = torch.tensor(rollout_by_loops(sa, ca, fusion, discard)).reshape(2, 2)
        torch.testing.assert_close(got[b], want, atol=1e-5, rtol=1e-4)


def test_rollout_options_reach_the_methods_and_are_checked():
    model = sharpen(pico(img_size=16, depth=2), std=0.3)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    target = torch.tensor([0, 1])
    options = explain.MethodOptions(rollout_head_fusion="max", rollout_discard_ratio=0.5)
    want = explain.rollout(model, x, stage="after_proj_l", head_fusion="max", discard_ratio=0.5)
    assert torch.equal(explain.saliency_map(model, x, target, "rollout_after_proj_l", options), want)
    ((_, shared),) = explain.saliency_maps(model, x, target, ["rollout_after_proj_l"], options)
    assert torch.equal(shared, want)
    assert not torch.allclose(want, explain.rollout(model, x, stage="after_proj_l"))
    with pytest.raises(ValueError, match="head_fusion must be one of mean, max, min"):
        explain.rollout(model, x, head_fusion="median")
    with pytest.raises(ValueError, match=r"discard_ratio must be in \[0, 1\)"):
        explain.rollout(model, x, discard_ratio=1.0)


@pytest.mark.parametrize("baseline", IG_BASELINES)
def test_integrated_gradients_from_each_baseline_is_complete(baseline):
    """The attributions sum to the logit at the image minus the logit at the chosen baseline."""
    model = pico().double()
    with torch.no_grad():
        model.head.weight.mul_(1000)  # a logit gap well above rounding
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    target = torch.tensor([3, 9])
    options = explain.MethodOptions(ig_steps=64, ig_baseline=baseline)
    att = explain.attribution(model, x, target, "integrated_gradients", **options.captum_kwargs("integrated_gradients"))
    start = ig_baseline(x, baseline, model.cfg)
    with torch.no_grad():
        gap = (model(x) - model(start)).gather(1, target[:, None]).squeeze(1)
    total = att.raw.sum(dim=(1, 2, 3))
    assert ((total - gap).abs() <= 0.05 * gap.abs()).all(), (total, gap)
    black = ig_baseline(x, "black", model.cfg)  # a black picture, normalised: (0 - mean) / std
    torch.testing.assert_close(
        black[0, :, 0, 0], -torch.tensor(model.cfg.mean, dtype=x.dtype) / torch.tensor(model.cfg.std, dtype=x.dtype)
    )
    with pytest.raises(ValueError, match="unknown integrated-gradients baseline"):
        ig_baseline(x, "grey", model.cfg)


@pytest.mark.parametrize("method", ["integrated_gradients", "saliency", "smoothgrad"])
def test_signed_attributions_keep_the_sign_of_the_channel_sum(method):
    model = sharpen(pico())
    x, target = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2)), torch.tensor([1])
    options = explain.MethodOptions(ig_steps=8, smoothgrad_samples=4, signed=True)
    torch.manual_seed(0)
    att = explain.attribution(model, x, target, method, **options.captum_kwargs(method))
    torch.testing.assert_close(att.pixel, att.raw.sum(dim=1))
    assert (att.patch < 0).any() and (att.patch > 0).any()
    torch.manual_seed(0)
    plain = explain.attribution(
        model, x, target, method, **explain.MethodOptions(ig_steps=8, smoothgrad_samples=4).captum_kwargs(method)
    )
    assert (plain.patch >= 0).all()
    if method == "integrated_gradients":  # the same path integral, only the reduction differs
        torch.testing.assert_close(att.raw, plain.raw)
