"""cait.explain against independent references: timm's class attention, IG completeness, rollout by
hand, metrics on oracle / uniform maps, and faithfulness on a model trained here for a few seconds."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import cait
from cait import explain
from cait.explain.attention import ROLLOUT_STAGES, rollouts
from cait.explain.attribution import patch_sum
from cait.explain.layerscale import layerscale_stats, layerscale_stats_from_metrics
from cait.explain.maps import overlay, overlays, regions_of_focus, upsample
from cait.explain.metrics import endpoint_probabilities

GRID, PATCH = 4, 8  # cait_pico_32: 32 px, patch 8


def pico(**overrides) -> cait.CaiT:
    torch.manual_seed(0)
    return cait.load_model("cait_pico_32", weights=False, **overrides).model


def sharpen(model: cait.CaiT, std: float = 0.5) -> cait.CaiT:
    """Random weights large enough that attention is far from uniform and logits differ."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * std / p.shape[1] ** 0.5 * 4)
            if "gamma" in name:
                p.fill_(1.0)
    return model


def object_scenes(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One bright 8x8 square on a noise background at a random patch; class = its colour channel."""
    x = 0.3 * torch.randn(n, 3, 32, 32, generator=gen)
    y = torch.randint(0, 3, (n,), generator=gen)
    pos = torch.randint(0, GRID * GRID, (n,), generator=gen)
    for i in range(n):
        r, c = divmod(int(pos[i]), GRID)
        x[i, y[i], r * PATCH : (r + 1) * PATCH, c * PATCH : (c + 1) * PATCH] += 2.0
    return x, y, pos


def patch_boxes(pos: torch.Tensor) -> torch.Tensor:
    r, c = pos // GRID, pos % GRID
    return torch.stack((c * PATCH, r * PATCH, (c + 1) * PATCH, (r + 1) * PATCH), dim=1).float()


@pytest.fixture(scope="module")
def trained():
    """pico trained to find a coloured square (~100% accuracy after a few seconds)."""
    gen = torch.Generator().manual_seed(0)
    model = pico(num_classes=3, drop_path_rate=0.0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(40):
        x, y, _ = object_scenes(32, gen)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    x, y, pos = object_scenes(24, gen)
    with torch.no_grad():
        assert (model(x).argmax(1) == y).float().mean() > 0.9, "synthetic task not learnt"
    return model, x, y, pos


# ---------------------------------------------------------------------------- class attention


def test_class_attention_equals_timm():
    from timm.models.cait import Cait, ClassAttn

    model = sharpen(pico())
    c = model.cfg
    ref = Cait(
        img_size=c.img_size,
        patch_size=c.patch_size,
        in_chans=c.in_chans,
        num_classes=c.num_classes,
        embed_dim=c.embed_dim,
        depth=c.depth,
        num_heads=c.num_heads,
        init_values=c.init_values,
        depth_token_only=c.depth_token_only,
    ).eval()
    ref.load_state_dict(model.state_dict(), strict=True)
    caught = []
    for m in ref.modules():
        if isinstance(m, ClassAttn):
            m.fused_attn = False  # materialise the softmax; attn_drop (identity in eval) receives it
            m.attn_drop.register_forward_hook(lambda mod, args, out: caught.append(out[:, :, 0]))
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref_logits = ref(x)
    ca = explain.class_attention(model, x)
    rows = torch.stack(caught, dim=1)  # [B, L, heads, 1+N]
    torch.testing.assert_close(ca.logits, ref_logits)
    torch.testing.assert_close(ca.maps, rows[..., 1:].reshape(3, 2, c.num_heads, GRID, GRID))
    torch.testing.assert_close(ca.self_share, rows[..., 0])
    torch.testing.assert_close(ca.maps.sum(dim=(-2, -1)) + ca.self_share, torch.ones(3, 2, c.num_heads))
    assert ca.maps.std() > 0.01, "attention is near uniform: the comparison would be weak"
    torch.testing.assert_close(ca.mean, ca.maps.mean(dim=2))


def test_wrong_input_size_is_a_clear_error():
    with pytest.raises(cait.InputError, match=r"x must be a normalised batch \[B, 3, 32, 32\]"):
        explain.class_attention(pico(), torch.zeros(1, 3, 64, 64))


def test_class_specific_attention_by_hand():
    """Against plain autograd through a re-implementation of the CA stage that exposes the attention."""
    model = sharpen(pico())
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    target = torch.tensor([4, 7])
    got = explain.class_specific_attention(model, x, target)

    with torch.no_grad():
        patches = model.patch_embed(x) + model.pos_embed
        for blk in model.blocks:
            patches = blk(patches)
    cls = model.cls_token.expand(2, -1, -1)
    attns = []
    for blk in model.blocks_token_only:
        u = blk.norm1(torch.cat((cls, patches), dim=1))
        B, N, C = u.shape
        split = lambda t: t.reshape(B, -1, 2, C // 2).transpose(1, 2)
        q, k, v = split(blk.attn.q(u[:, :1])), split(blk.attn.k(u)), split(blk.attn.v(u))
        a = ((q * blk.attn.scale) @ k.transpose(-2, -1)).softmax(-1)  # layer 2's depends on layer 1's
        attns.append(a)
        o = blk.attn.proj((a @ v).transpose(1, 2).reshape(B, 1, C))
        cls = cls + blk.gamma_1 * o
        cls = cls + blk.gamma_2 * blk.mlp(blk.norm2(cls))
    logits = model.head(model.norm(torch.cat((cls, patches), dim=1))[:, 0])
    grads = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), attns)
    expected = sum((a * g.clamp_min(0)).mean(dim=1)[:, 0, 1:] for a, g in zip(attns, grads))
    torch.testing.assert_close(got, expected.detach().reshape(2, GRID, GRID))
    assert (got >= 0).all() and got.sum() > 0


# ---------------------------------------------------------------------------- rollout


def hand_model(depth: int) -> cait.CaiT:
    """16 px, patch 8: 4 patches. Zero query/key weights make every attention uniform."""
    model = pico(img_size=16, depth=depth)
    with torch.no_grad():
        d = model.cfg.embed_dim
        for blk in model.blocks:
            blk.attn.qkv.weight[: 2 * d].zero_()
            blk.attn.qkv.bias[: 2 * d].zero_()
            blk.attn.proj_l.bias.zero_()
            blk.attn.proj_w.weight.copy_(torch.tensor([[1.0, 0.5], [-0.5, 1.0]]))
            blk.attn.proj_w.bias.zero_()
        for blk in model.blocks_token_only:
            for lin in (blk.attn.q, blk.attn.k):
                lin.weight.zero_()
                lin.bias.zero_()
    return model


def test_rollout_uniform_closed_form():
    # SA: (U + I)/2 with U = 1/4: columns sum to 1. CA rows a = 1/5 over [cls, 4 patches].
    # Class-token row over [cls source, patches]: s0 = [1, 0, 0, 0, 0]
    # s1 = (s0 + 0.2 s0 + 0.2 [0, 1, 1, 1, 1]) / 2 = [0.6, 0.1, 0.1, 0.1, 0.1]
    # s2 = (s1 + 0.2 s1 + 0.2 [0, 1, 1, 1, 1]) / 2 = [0.36, 0.16, 0.16, 0.16, 0.16]
    model = hand_model(depth=1)
    x = torch.randn(2, 3, 16, 16)
    for stage in ("after_proj_l", "after_proj_w"):  # proj_w of a uniform row is a constant row: same after renorm
        torch.testing.assert_close(explain.rollout(model, x, stage=stage), torch.full((2, 2, 2), 0.16))


def rollout_by_loops(before_after, ca_layers, mixing: str) -> list[float]:
    """Scalar-by-scalar rollout of one sample, the way the docstring states it: before_after per SA
    layer ([heads][n][n], [heads][n][n]), ca_layers per CA layer [heads][1+n]."""
    n = len(ca_layers[0][0]) - 1
    relevance = [[float(i == j) for j in range(n)] for i in range(n)]
    for before, after in before_after:  # each [heads][n][n]
        heads = len(before)
        step = []
        for i in range(n):
            if mixing == "before":
                row = [sum(before[h][i][j] for h in range(heads)) / heads for j in range(n)]
            else:
                row = [sum(max(after[h][i][j], 0.0) for h in range(heads)) / heads for j in range(n)]
                total = sum(row)
                row = [r / total for r in row]
            step.append([(row[j] + (i == j)) / 2 for j in range(n)])
        relevance = [[sum(step[i][k] * relevance[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
    source = [1.0] + [0.0] * n  # class token: all relevance on its learned constant
    for heads_rows in ca_layers:
        a = [sum(r[j] for r in heads_rows) / len(heads_rows) for j in range(n + 1)]
        mixed = [a[0] * source[0]] + [
            a[0] * source[1 + j] + sum(a[1 + k] * relevance[k][j] for k in range(n)) for j in range(n)
        ]
        source = [(s + m) / 2 for s, m in zip(source, mixed)]
    return source[1:]


def test_rollout_equals_loops_on_random_model():
    model = sharpen(pico(img_size=16, depth=2), std=0.3)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    ins = model.forward_insights(x, sa_layers=(0, 1))
    for mixing, stage in (("before", "after_proj_l"), ("after", "after_proj_w")):
        got = explain.rollout(model, x, stage=stage)
        for b in range(2):
            sa = [(ins.self_attention[l][0][b].tolist(), ins.self_attention[l][1][b].tolist()) for l in (0, 1)]
            ca = [a[b].tolist() for a in ins.class_attention]
            expected = torch.tensor(rollout_by_loops(sa, ca, mixing)).reshape(2, 2)
            torch.testing.assert_close(got[b], expected, atol=1e-5, rtol=1e-4)
    assert (ins.self_attention[0][1] < 0).any(), "after-mixing weights never negative: clamp untested"
    assert not torch.allclose(
        explain.rollout(model, x, stage="after_proj_l"), explain.rollout(model, x, stage="after_proj_w")
    )


def test_rollout_of_the_raw_stage_and_unknown_names():
    model = sharpen(pico(img_size=16, depth=2), std=0.3)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    ins = model.forward_insights(x, sa_layers=(0, 1), raw_attention=True)
    got = explain.rollout(model, x, stage="raw")
    for b in range(2):
        raw = [ins.raw_self_attention[l][b].tolist() for l in (0, 1)]  # row-stochastic, like after_proj_l
        ca = [a[b].tolist() for a in ins.class_attention]
        expected = torch.tensor(rollout_by_loops([(r, r) for r in raw], ca, "before")).reshape(2, 2)
        torch.testing.assert_close(got[b], expected, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(got, explain.rollout(model, x, stage="after_proj_l"))
    with pytest.raises(ValueError, match="stage must be one of raw, after_proj_l, after_proj_w"):
        explain.rollout(model, x, stage="middle")
    assert "rollout_before_mixing" not in explain.METHODS  # each method under one name
    with pytest.raises(ValueError, match="unknown method 'telepathy'; choose from ca1_mean"):
        explain.saliency_map(model, x, torch.tensor([0, 1]), "telepathy")


def test_method_options_reach_the_method():
    model = sharpen(pico())
    x, target = torch.randn(1, 3, 32, 32), torch.tensor([1])
    options = explain.MethodOptions(ig_steps=4, smoothgrad_samples=3, smoothgrad_stdev=0.3)
    ig = explain.saliency_map(model, x, target, "integrated_gradients", options)
    torch.testing.assert_close(ig, explain.attribution(model, x, target, "integrated_gradients", n_steps=4).patch)
    assert not torch.allclose(ig, explain.saliency_map(model, x, target, "integrated_gradients"))
    torch.manual_seed(0)
    smooth = explain.saliency_map(model, x, target, "smoothgrad", options)
    torch.manual_seed(0)
    direct = explain.attribution(model, x, target, "smoothgrad", nt_samples=3, stdevs=0.3).patch
    torch.testing.assert_close(smooth, direct)
    # methods without options ignore them
    torch.testing.assert_close(
        explain.saliency_map(model, x, target, "class_specific", options),
        explain.class_specific_attention(model, x, target),
    )


# ---------------------------------------------------------------------------- captum attributions


def test_integrated_gradients_completeness():
    model = pico().double()
    with torch.no_grad():
        model.head.weight.mul_(1000)  # a logit gap well above rounding; the logit stays linear in the head
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    target = torch.tensor([3, 9])
    att = explain.attribution(model, x, target, "integrated_gradients", n_steps=64)
    with torch.no_grad():
        gap = (model(x) - model(torch.zeros_like(x))).gather(1, target[:, None]).squeeze(1)
    assert gap.abs().min() > 0.05, "logit gap too small for a meaningful completeness check"
    total = att.raw.sum(dim=(1, 2, 3))
    assert ((total - gap).abs() <= 0.05 * gap.abs()).all(), (total, gap)
    torch.testing.assert_close(att.pixel, att.raw.abs().sum(dim=1))
    torch.testing.assert_close(att.patch, patch_sum(att.pixel, PATCH))


def test_occlusion_is_the_logit_drop_of_each_patch():
    model = sharpen(pico())
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    target = torch.tensor([1, 2])
    att = explain.attribution(model, x, target, "occlusion")
    r, c = 1, 2  # hide one patch by hand
    hidden = x.clone()
    hidden[:, :, r * PATCH : (r + 1) * PATCH, c * PATCH : (c + 1) * PATCH] = 0
    with torch.no_grad():
        drop = (model(x) - model(hidden)).gather(1, target[:, None]).squeeze(1)
    torch.testing.assert_close(att.patch[:, r, c], drop * PATCH * PATCH, rtol=1e-4, atol=1e-5)
    assert att.patch.shape == (2, GRID, GRID) and att.pixel.shape == (2, 32, 32)


def test_every_method_runs_by_name_even_under_inference_mode():
    model = pico()
    x, target = torch.randn(2, 3, 32, 32), torch.tensor([1, 2])
    with torch.inference_mode():
        heats = {name: fn(model, x, target) for name, fn in explain.METHODS.items()}
    for name, heat in heats.items():
        assert heat.shape == (2, GRID, GRID) and torch.isfinite(heat).all(), name
    assert all(p.requires_grad for p in model.parameters()), "parameters left frozen"
    with pytest.raises(ValueError, match="unknown attribution method"):
        explain.attribution(model, x, target, "gradcam")


# ---------------------------------------------------------------------------- maps and regions


def test_regions_of_focus_smallest_set_and_box():
    heat = torch.zeros(2, 4, 4)
    heat[0, 1, 2], heat[0, 3, 0], heat[0, 0, 0] = 0.55, 0.3, 0.15
    heat[1] = 1.0 / 16
    mask, boxes = regions_of_focus(heat, 0.5, img_size=32)
    assert mask[0].sum() == 1 and mask[0, 1, 2]
    torch.testing.assert_close(boxes[0], torch.tensor([16.0, 8.0, 24.0, 16.0]))
    assert mask[1].sum() == 8  # uniform: half of the patches
    mask, boxes = regions_of_focus(heat, 0.8, img_size=(32, 64))
    assert mask[0].sum() == 2 and mask[0, 3, 0]
    torch.testing.assert_close(boxes[0], torch.tensor([0.0, 8.0, 24.0, 32.0]) * torch.tensor([2.0, 1.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match="share"):
        regions_of_focus(heat, 1.5, img_size=32)


def test_upsample_and_overlay():
    heat = torch.arange(16.0).reshape(1, 4, 4)
    up = upsample(heat, 32)
    assert up.shape == (1, 32, 32)
    # the centre of patch (1, 2) lies between pixels 11/12 and 19/20: bilinear gives its value there
    torch.testing.assert_close(up[0, 11:13, 19:21].mean(), torch.tensor(6.0))
    image = Image.new("RGB", (40, 40), (10, 200, 30))
    assert overlay(image, heat[0], alpha=0.0).tobytes() == image.tobytes()
    full = overlay(image, heat[0], cmap="gray", alpha=1.0)
    assert full.getpixel((0, 0)) == (0, 0, 0) and full.getpixel((39, 39)) == (255, 255, 255)


def overlay_by_formula(image, heat_2d, *, cmap, alpha, value_range=None, smooth=True):
    """The overlay computed the straightforward way (matplotlib's colormap on every pixel, float blend):
    what `explain.maps.overlay`'s lookup table must reproduce byte for byte."""
    import matplotlib

    base = image.convert("RGB")
    size = (base.height, base.width)
    heat = upsample(heat_2d, size) if smooth else F.interpolate(heat_2d[None, None], size=size)[0, 0]
    heat = heat.numpy()
    lo, hi = value_range if value_range is not None else (float(heat.min()), float(heat.max()))
    heat = np.clip((heat - lo) / (hi - lo), 0, 1) if hi > lo else np.zeros_like(heat)
    colours = matplotlib.colormaps[cmap](heat)[..., :3]
    blended = (1 - alpha) * np.asarray(base, dtype=np.float32) / 255 + alpha * colours
    return Image.fromarray((blended.clip(0, 1) * 255).round().astype(np.uint8))


@pytest.mark.parametrize("cmap", ["inferno", "viridis", "jet", "gray"])
def test_overlay_lookup_gives_the_formulas_bytes(cmap):
    gen = torch.Generator().manual_seed(3)
    image = Image.fromarray(torch.randint(0, 256, (56, 56, 3), generator=gen, dtype=torch.uint8).numpy())
    heats = torch.rand(5, 7, 7, generator=gen) ** 3
    heats[1] = 0.25  # a flat map: the bottom colour
    heats[2, 3, 3] = torch.nan  # a bad value: the colormap's colour for NaN (and every pixel it touches)
    ranges = [None, None, (0.0, 0.5), (0.1, 0.9), None]
    for alpha in (0.0, 0.35, 0.5, 1.0):
        for smooth in (True, False):
            fast = overlays(image, heats, cmap=cmap, alpha=alpha, value_ranges=ranges, smooth=smooth)
            for heat, value_range, tile in zip(heats, ranges, fast):
                expected = overlay_by_formula(
                    image, heat, cmap=cmap, alpha=alpha, value_range=value_range, smooth=smooth
                )
                assert tile.tobytes() == expected.tobytes(), (alpha, smooth, value_range)
            one = overlay(image, heats[3], cmap=cmap, alpha=alpha, value_range=ranges[3], smooth=smooth)
            assert one.tobytes() == fast[3].tobytes()


# ---------------------------------------------------------------------------- metrics


def random_boxes(n: int, gen: torch.Generator) -> torch.Tensor:
    corners = torch.rand(n, 2, 2, generator=gen) * 32
    lo, hi = corners.min(dim=1).values, corners.max(dim=1).values
    return torch.cat((lo, hi + 4), dim=1).clamp(max=32)  # x0, y0, x1, y1


def test_pointing_game_oracle_and_uniform():
    gen = torch.Generator().manual_seed(7)
    boxes = random_boxes(2000, gen)
    centres = torch.arange(GRID) * PATCH + PATCH / 2
    inside_x = (centres >= boxes[:, 0:1]) & (centres <= boxes[:, 2:3])  # [n, g] columns
    inside_y = (centres >= boxes[:, 1:2]) & (centres <= boxes[:, 3:4])
    inside = inside_y[:, :, None] & inside_x[:, None, :]  # [n, g, g]
    has_centre = inside.flatten(1).any(dim=1)
    oracle = inside.float() + torch.rand(inside.shape, generator=gen) * 0.1
    assert explain.pointing_game(oracle[has_centre], boxes[has_centre], 32).all()
    uniform = explain.pointing_game(torch.ones(2000, GRID, GRID), boxes, 32).float().mean()
    chance = inside.flatten(1).float().mean(dim=1).mean()
    assert abs(uniform - chance) < 0.03, (uniform, chance)


def test_mass_in_box_oracle_and_uniform():
    gen = torch.Generator().manual_seed(8)
    boxes = random_boxes(200, gen)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / 32**2
    torch.testing.assert_close(explain.mass_in_box(torch.ones(200, GRID, GRID), boxes, 32), area)
    one_patch = torch.zeros(1, GRID, GRID)
    one_patch[0, 2, 1] = 5.0
    box = torch.tensor([[8.0, 16.0, 12.0, 24.0]])  # left half of that patch
    torch.testing.assert_close(explain.mass_in_box(one_patch, box, 32), torch.tensor([0.5]))


def test_deletion_and_insertion_reward_the_true_ranking(trained):
    model, x, y, pos = trained
    oracle = F.one_hot(pos, GRID * GRID).float().reshape(-1, GRID, GRID)
    random = torch.rand(oracle.shape, generator=torch.Generator().manual_seed(9))
    true_rank = explain.deletion_insertion(model, x, y, oracle, steps=8)
    random_rank = explain.deletion_insertion(model, x, y, random, steps=8)
    assert true_rank["deletion"].shape == (len(y), 9)
    torch.testing.assert_close(true_rank["deletion"][:, 0], random_rank["deletion"][:, 0])  # nothing hidden yet
    torch.testing.assert_close(true_rank["insertion"][:, -1], true_rank["deletion"][:, 0])  # all revealed
    assert true_rank["deletion_auc"].mean() < random_rank["deletion_auc"].mean() - 0.15
    assert true_rank["insertion_auc"].mean() > random_rank["insertion_auc"].mean() + 0.15
    default = explain.deletion_insertion(model, x[:2], y[:2], oracle[:2])
    assert default["insertion"].shape == (2, GRID * GRID + 1)  # one patch per step


def test_class_attention_points_at_the_object_once_trained(trained):
    model, x, y, pos = trained
    boxes = patch_boxes(pos)
    ca1 = explain.class_attention(model, x).mean[:, 0]
    assert explain.pointing_game(ca1, boxes, 32).float().mean() > 0.5  # chance: 1/16
    mask, region = regions_of_focus(ca1, img_size=32)
    assert explain.mass_in_box(mask.float(), boxes, 32).mean() > 0.3


# ---------------------------------------------------------------------------- talking heads, LayerScale


def test_talking_heads_inspector():
    model = sharpen(pico())
    x = torch.randn(2, 3, 32, 32)
    th = explain.talking_heads(model, x, 1)
    attn = model.blocks[1].attn
    torch.testing.assert_close(th.proj_w, attn.proj_w.weight)
    torch.testing.assert_close(th.proj_l, attn.proj_l.weight)
    mixed = torch.einsum("oh,bhij->boij", th.proj_w, th.after_proj_l) + attn.proj_w.bias[None, :, None, None]
    torch.testing.assert_close(th.after_proj_w, mixed)
    torch.testing.assert_close(th.after_proj_l.sum(-1), torch.ones(2, 2, 16))
    # raw: each head's own softmax(q k^T), recomputed from the block's input; proj_l mixes its logits
    block_in = {}
    handle = model.blocks[1].attn.register_forward_pre_hook(lambda m, args: block_in.setdefault("x", args[0]))
    with torch.no_grad():
        model(x)
    handle.remove()
    q, k, _ = attn.qkv(block_in["x"]).reshape(2, 16, 3, 2, -1).permute(2, 0, 3, 1, 4)
    logits = (q * attn.scale) @ k.transpose(-2, -1)
    torch.testing.assert_close(th.raw, logits.softmax(-1))
    mixed_logits = torch.einsum("oh,bhij->boij", th.proj_l, logits) + attn.proj_l.bias[None, :, None, None]
    torch.testing.assert_close(th.after_proj_l, mixed_logits.softmax(-1))
    assert not torch.allclose(th.raw, th.after_proj_l, atol=1e-3)
    plain = explain.talking_heads(pico(talking_heads=False), x, 0)
    torch.testing.assert_close(plain.proj_w, torch.eye(2))
    with pytest.raises(ValueError, match="SA layer must be in 0..1"):
        explain.talking_heads(model, x, 2)


def test_layerscale_stats_from_model():
    model = pico()
    with torch.no_grad():
        model.blocks[1].gamma_2.copy_(-torch.linspace(1, 32, 32))  # |gamma| = 1..32
    rows = layerscale_stats(model, torch.randn(2, 3, 32, 32))
    assert [(r["stage"], r["layer"], r["gamma"]) for r in rows[:4]] == [
        ("sa", 0, "gamma_1"),
        ("sa", 0, "gamma_2"),
        ("sa", 1, "gamma_1"),
        ("sa", 1, "gamma_2"),
    ]
    assert len(rows) == 2 * (2 + 2)
    row = rows[3]
    assert row["mean"] == pytest.approx(16.5) and row["median"] == pytest.approx(16.5)
    assert row["p10"] == pytest.approx(1 + 0.1 * 31) and row["p90"] == pytest.approx(1 + 0.9 * 31)
    assert all(r["residual_ratio"] > 0 for r in rows)
    assert rows[3]["residual_ratio"] > rows[2]["residual_ratio"]  # the huge gamma dominates its branch


def test_layerscale_stats_from_metrics(tmp_path):
    stats = {"mean": 0.1, "median": 0.09, "p10": 0.01, "p90": 0.2}
    row = lambda stage, layer, gamma, **s: {"stage": stage, "layer": layer, "gamma": gamma, **stats, **s}
    lines = [
        {"epoch": 1, "layerscale": [row("sa", 0, "gamma_1")]},
        {"epoch": 2, "layerscale": [row("sa", 0, "gamma_1", p90=0.3), row("ca", 1, "gamma_2")]},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + '\n{"epoch": 3, "layersc')  # torn last line
    rows = layerscale_stats_from_metrics(tmp_path)
    assert [(r["epoch"], r["stage"], r["layer"], r["gamma"]) for r in rows] == [
        (1, "sa", 0, "gamma_1"),
        (2, "sa", 0, "gamma_1"),
        (2, "ca", 1, "gamma_2"),
    ]
    assert rows[1]["p90"] == 0.3 and rows[2]["mean"] == 0.1
    with pytest.raises(FileNotFoundError, match="no metrics file"):
        layerscale_stats_from_metrics(tmp_path / "missing")
    path.write_text('{"epoch": 1, "layerscale": {"sa.0.gamma_1": [1.0]}}\n')  # a form nothing writes
    with pytest.raises(ValueError, match="epoch 1: 'layerscale' is not a list of rows"):
        layerscale_stats_from_metrics(path)
    path.write_text('{"epoch": 1, "loss": 2.3}\n')
    with pytest.raises(ValueError, match="no line has a 'layerscale' field"):
        layerscale_stats_from_metrics(path)


def test_perturbation_methods_in_small_batches_give_the_one_batch_numbers():
    """Deletion/insertion and occlusion run a few images per pass (faster on a CPU); the numbers are those
    of one pass over every perturbed image, up to float summation order (1e-5)."""
    model = sharpen(pico()).eval()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 32, 32, generator=gen)
    target = torch.tensor([1, 4])
    heat = torch.rand(2, GRID, GRID, generator=gen)
    assert explain.metrics.images_per_pass(cait.load_model("cait_xxs24_224", weights=False).model) == 8
    small = explain.deletion_insertion(model, x, target, heat, batch_size=3)  # the default is 94 for pico
    whole = explain.deletion_insertion(model, x, target, heat, batch_size=10_000)
    for key in ("deletion", "insertion", "deletion_auc", "insertion_auc"):
        torch.testing.assert_close(small[key], whole[key], atol=1e-5, rtol=1e-5)
    occlusion = explain.attribution(model, x, target, "occlusion", perturbations_per_eval=3).raw
    torch.testing.assert_close(
        occlusion,
        explain.attribution(model, x, target, "occlusion", perturbations_per_eval=10_000).raw,
        atol=1e-5,
        rtol=1e-5,
    )


def test_shared_work_gives_each_methods_own_map():
    """saliency_maps (rollouts from one forward, CA means read from given maps) gives what each method gives
    alone, in the asked order; only float summation order may differ (1e-6)."""
    model = sharpen(pico()).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(8))
    target = torch.tensor([1, 4])
    options = explain.MethodOptions(ig_steps=4, smoothgrad_samples=2)
    names = ["rollout_after_proj_w", "ca2_mean", "saliency", "rollout_raw", "ca1_mean", "rollout_after_proj_l"]
    maps = explain.class_attention(model, x).maps
    shared = list(explain.saliency_maps(model, x, target, names, options, class_attention_maps=maps))
    assert [n for n, _ in shared] == [explain.METHODS.canonical(n) for n in names]
    for name, heat in shared:
        torch.testing.assert_close(heat, explain.saliency_map(model, x, target, name, options), atol=1e-6, rtol=1e-6)
    by_stage = rollouts(model, x)
    assert set(by_stage) == set(ROLLOUT_STAGES)
    without_maps = dict(explain.saliency_maps(model, x, target, ["ca1_mean"]))  # then a forward pass of its own
    torch.testing.assert_close(without_maps["ca1_mean"], maps.mean(2)[:, 0])


def test_deletion_insertion_ends_given_or_computed_are_the_same():
    """The curves' two ends (intact image, all baseline) are shared by every map: given once
    (endpoint_probabilities) they are the numbers each call would compute, also for a single step."""
    model = sharpen(pico()).eval()
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 3, 32, 32, generator=gen)
    target = torch.tensor([0, 3])
    ends = endpoint_probabilities(model, x, target)
    with torch.no_grad():
        probs = lambda images: model(images).softmax(-1).gather(1, target[:, None])[:, 0]
        torch.testing.assert_close(ends, torch.stack((probs(x), probs(torch.zeros_like(x))), dim=1))
    for steps in (None, 1, 5):
        heat = torch.rand(2, GRID, GRID, generator=gen)
        own = explain.deletion_insertion(model, x, target, heat, steps)
        given = explain.deletion_insertion(model, x, target, heat, steps, endpoints=ends)
        for key in own:
            torch.testing.assert_close(own[key], given[key], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(own["deletion"][:, [0, -1]], ends)
        torch.testing.assert_close(own["insertion"][:, [-1, 0]], ends)
