"""Token patching into the class stage (`cait.explain.token_patching`) against timm's `Cait` with the same
weights, patched by a forward hook on its SA stage (`blocks`): an independent run of the full model that
shares no code with ours. Plus the two ends (every region at once is the clean run, no region the corrupted
one), the region layout, and the refusals."""

from __future__ import annotations

import pytest
import torch

import cait
from cait import explain
from cait.explain.token_patching import TokenPatchingError, class_stage_patched, region_boxes, region_masks

CFG = cait.get_config("cait_pico_32", img_size=48, depth=3)  # a 6 x 6 grid: region 4 leaves a smaller last row


@pytest.fixture(scope="module")
def pair():
    """A batch of clean images, noisy twins and targets."""
    g = torch.Generator().manual_seed(1)
    clean = torch.randn(3, 3, CFG.img_size, CFG.img_size, generator=g)
    corrupted = clean + 1.5 * torch.randn(clean.shape, generator=g)
    return clean, corrupted, torch.tensor([0, 4, 9])


def _sa_output(theirs, x: torch.Tensor) -> torch.Tensor:
    """timm's patch tokens after its SA stage (`blocks`), recorded by a forward hook."""
    seen = []
    handle = theirs.blocks.register_forward_hook(lambda m, args, out: seen.append(out))
    try:
        with torch.no_grad():
            theirs(x)
    finally:
        handle.remove()
    return seen[0]


def _timm_patched(theirs, source: torch.Tensor, base: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """timm's logits [B, M, K] on `base` [B, C, H, W] with, for each mask of masks [M, N] (or [B, M, N]), the
    patch tokens where it is True swapped by a forward hook on `blocks` for `source` [B, N, d] (timm's own SA
    output of the other image): every (image, mask) pair is one image of a single batched run."""
    B, M = base.shape[0], masks.shape[-2]
    masks = masks.expand(B, -1, -1).flatten(0, 1)
    swap = lambda m, args, out: torch.where(masks[..., None], source.repeat_interleave(M, 0), out)  # noqa: E731
    handle = theirs.blocks.register_forward_hook(swap)
    try:
        with torch.no_grad():
            return theirs(base.repeat_interleave(M, 0)).view(B, M, -1)
    finally:
        handle.remove()


def _at(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return logits.gather(1, target.view(-1, 1))[:, 0]


@pytest.mark.parametrize("region", [1, 4])
def test_every_region_equals_timm_patched_by_a_hook(twins, pair, region):
    """Each region's restored and broken logit against timm run whole with that region's tokens swapped."""
    ours, theirs = twins(CFG)
    clean, corrupted, target = pair
    got = explain.token_patching(ours, clean, corrupted, target, region=region, top=2)
    masks = region_masks(CFG.grid_size, region)
    side = -(-CFG.grid_size // region)
    assert got.restored.shape == got.broken.shape == (3, side, side)
    with torch.no_grad():
        clean_logit, corrupted_logit = _at(theirs(clean), target), _at(theirs(corrupted), target)
    torch.testing.assert_close(got.gap, clean_logit - corrupted_logit, atol=1e-5, rtol=1e-5)
    tokens = _sa_output(theirs, clean), _sa_output(theirs, corrupted)
    at = lambda logits: logits.gather(2, target.view(-1, 1, 1).expand(-1, logits.shape[1], 1))[..., 0]  # noqa: E731
    restored = at(_timm_patched(theirs, tokens[0], corrupted, masks)) - corrupted_logit[:, None]
    broken = clean_logit[:, None] - at(_timm_patched(theirs, tokens[1], clean, masks))
    torch.testing.assert_close(got.restored.flatten(1), restored, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.broken.flatten(1), broken, atol=1e-5, rtol=1e-5)
    best = got.restored.flatten(1).topk(2, dim=1).indices
    together = masks[best].any(1)[:, None]  # [B, 1, N]: each image's own two regions
    expected = at(_timm_patched(theirs, tokens[0], corrupted, together))[:, 0] - corrupted_logit
    torch.testing.assert_close(got.top_restored, expected, atol=1e-5, rtol=1e-5)
    spread = got.restored.flatten(1)
    assert (spread.amax(1) - spread.amin(1)).min() > 1e-3  # the regions differ: the checks tell them apart


def test_all_regions_at_once_is_the_clean_run_and_none_the_corrupted(twins, pair):
    ours, _ = twins(CFG)
    clean, corrupted, target = pair
    whole = explain.token_patching(ours, clean, corrupted, target, region=CFG.grid_size)
    assert whole.restored.shape == (3, 1, 1) and whole.gap.abs().min() > 1e-2
    torch.testing.assert_close(whole.restored[:, 0, 0], whole.gap, atol=1e-5, rtol=0)
    torch.testing.assert_close(whole.broken[:, 0, 0], whole.gap, atol=1e-5, rtol=0)
    torch.testing.assert_close(whole.fraction(whole.restored)[:, 0, 0], torch.ones(3), atol=1e-5, rtol=0)
    with torch.no_grad():
        tokens = [ours.forward_self_attention(x) for x in (clean, corrupted)]
        masks = torch.tensor([[True], [False]]).expand(2, CFG.num_patches)  # every patch, then none
        logits = class_stage_patched(ours, tokens[1], tokens[0], masks)
        torch.testing.assert_close(logits[:, 0], ours(clean), atol=1e-5, rtol=0)
        torch.testing.assert_close(logits[:, 1], ours(corrupted), atol=1e-5, rtol=0)
    # the single regions do not add up to the whole: the class stage is not linear in its tokens
    per_patch = explain.token_patching(ours, clean, corrupted, target, direction="restore")
    assert per_patch.broken is None and per_patch.top_restored is None
    assert not torch.allclose(per_patch.restored.sum((1, 2)), whole.gap, atol=1e-3)


def test_regions_partition_the_grid_and_their_boxes():
    masks = region_masks(6, 4)
    assert masks.shape == (4, 36) and masks.sum(0).eq(1).all()
    assert masks.sum(1).tolist() == [16, 8, 8, 4]
    assert masks[1].view(6, 6)[:4, 4:].all() and masks[3].view(6, 6)[4:, 4:].all()
    boxes = region_boxes(6, 4, 8)
    assert boxes.tolist() == [[0, 0, 32, 32], [32, 0, 48, 32], [0, 32, 32, 48], [32, 32, 48, 48]]
    one = explain.TokenPatching(torch.zeros(1), torch.zeros(1, 2), torch.zeros(1, 2), 4, 6, None, None)
    spread = one.on_patches(torch.tensor([[[1.0, 2.0], [3.0, 4.0]]]))
    assert spread.shape == (1, 6, 6) and spread[0, 5, 5] == 4 and spread[0, 3, 4] == 2 and spread[0, 4, 0] == 3


def test_bad_input_is_one_input_error(twins, pair):
    ours, _ = twins(CFG)
    clean, corrupted, target = pair
    bad = [
        (dict(region=0), "region must be a whole number of patches from 1 to 6"),
        (dict(region=7), "region must be"),
        (dict(region=1.5), "region must be"),
        (dict(direction="sideways"), "direction must be one of both, restore, break"),
        (dict(top=37), "top must be a whole number of regions from 0 to 36"),
        (dict(top=2, direction="break"), "ask direction restore or both"),
    ]
    for kwargs, message in bad:
        with pytest.raises(cait.InputError, match=message):
            explain.token_patching(ours, clean, corrupted, target, **kwargs)
    with pytest.raises(TokenPatchingError, match=r"target holds classes outside 0..9 \(this model has 10\)"):
        explain.token_patching(ours, clean, corrupted, torch.tensor([0, 1, 10]))
    with pytest.raises(TokenPatchingError, match="one corrupted image per clean one"):
        explain.token_patching(ours, clean, corrupted[:2], target)
    with pytest.raises(TokenPatchingError, match=r"clean must be a normalised batch \[B, 3, 48, 48\]"):
        explain.token_patching(ours, clean[:, :, :32], corrupted, target)
    vit = cait.load_model("cait_pico_32", weights=False, class_token_at=1, depth_token_only=0).model
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(TokenPatchingError, match="class-attention stage"):
        explain.token_patching(vit, x, x, torch.tensor([0]))


@pytest.mark.parametrize("region, direction", [(1, "both"), (4, "restore")])
def test_the_stated_cost_is_what_a_flop_counter_counts(pair, region, direction):
    """`token_patching_forwards` against torch's FLOP counter run over `token_patching` itself and over a
    plain forward (an independent count of the matrix products; the few multiply-adds it does not see, the
    class token's score against its own key and the swapped patches', keep the two within 1%)."""
    from torch.utils.flop_counter import FlopCounterMode

    from cait.explain.token_patching import token_patching_forwards

    torch.manual_seed(0)
    ours = cait.CaiT(CFG).eval().requires_grad_(False)  # the counter's module tracker wants no leaf needing grad
    clean, corrupted, target = (t[:1] for t in pair)

    def counted(fn) -> int:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            fn()
        return counter.get_total_flops()

    kw = dict(region=region, direction=direction)
    patching = counted(lambda: explain.token_patching(ours, clean, corrupted, target, **kw))
    whole = counted(lambda: ours(clean))
    stated = token_patching_forwards(ours, region=region, direction=direction)
    assert stated == pytest.approx(patching / whole, rel=0.01)


@pytest.mark.parametrize("residual_scale", ["scalar", "rezero", "none"])
def test_every_residual_scale_equals_the_models_own_class_stage_on_mixed_tokens(residual_scale):
    """The ablations' class stages (one gamma per branch, no norms with ReZero, no gamma) against the model's
    own `forward_class_attention` run on the patch tokens with a region swapped (the direct way, which shares
    no code with the cached keys and values)."""
    cfg = cait.get_config("cait_pico_32", residual_scale=residual_scale, init_values=0.5, depth=1)
    torch.manual_seed(0)
    model = cait.CaiT(cfg).eval()
    with torch.no_grad():  # ReZero starts its gammas at 0: give every branch a weight
        for name, p in model.named_parameters():
            if "gamma" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    g = torch.Generator().manual_seed(2)
    clean = torch.randn(2, 3, cfg.img_size, cfg.img_size, generator=g)
    corrupted, target = torch.randn(clean.shape, generator=g), torch.tensor([1, 3])
    got = explain.token_patching(model, clean, corrupted, target, region=2)
    masks = region_masks(cfg.grid_size, 2)
    with torch.no_grad():
        tokens = [model.forward_self_attention(x) for x in (clean, corrupted)]
        mixed = torch.where(masks[None, :, :, None], tokens[0][:, None], tokens[1][:, None])  # [B, M, N, d]
        logits = model.forward_head(model.forward_class_attention(mixed.flatten(0, 1))).view(2, len(masks), -1)
        corrupted_logit = model(corrupted).gather(1, target.view(-1, 1))
    expected = logits.gather(2, target.view(-1, 1, 1).expand(-1, len(masks), 1))[..., 0] - corrupted_logit
    assert expected.abs().max() > 1e-2  # the regions matter: the check can tell a wrong path apart
    torch.testing.assert_close(got.restored.flatten(1), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sharpen", [100, 200])  # the top score above the next by 7-58 and 27-232
def test_a_patch_holding_nearly_all_of_the_first_blocks_attention_is_taken_out_exactly(sharpen):
    """The first CA block's rows are the shared class token's sum over the base run with each region's entries
    read from the other run instead (`_stage._shared_class_attention`). With the block's query and key scaled
    up, one patch holds nearly all of the attention, by margins past float32's range of exp (88) at the larger
    scale; swapping it out must leave the rest exact, against the model's own `forward_class_attention` on the
    mixed tokens (the direct way)."""
    torch.manual_seed(3)
    model = cait.CaiT(cait.get_config("cait_pico_32", init_values=0.5, depth=1)).eval()
    attn = model.blocks_token_only[0].attn
    with torch.no_grad():
        for linear in (attn.q, attn.k):
            linear.weight.mul_(sharpen), linear.bias.mul_(sharpen)
        tokens, source = torch.randn(2, 2, model.cfg.num_patches, model.cfg.embed_dim)
        k = attn.k(model.blocks_token_only[0].norm1(tokens)).view(*tokens.shape[:2], attn.num_heads, -1)
        q = attn.q(model.blocks_token_only[0].norm1(model.cls_token)).view(1, attn.num_heads, -1)
        peak = (torch.einsum("bnhe,he->bhn", k, q[0]) * attn.scale).softmax(-1).amax(-1)
        masks = region_masks(model.cfg.grid_size, 1)
        got = class_stage_patched(model, tokens, source, masks)
        mixed = torch.where(masks[None, :, :, None], source[:, None], tokens[:, None]).flatten(0, 1)
        expected = model.forward_head(model.forward_class_attention(mixed)).view(got.shape)
    assert peak.min() > 0.998  # every image's every head: one patch holds nearly all of it
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
