"""The model against the paper's table and against timm's CaiT (the independent oracle)."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F
from _paper import MAIN_TABLE, paper_model
from conftest import randomise_
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

import cait
from cait.config import RELEASED, VARIANTS, is_paper_variant

PAPER_VARIANTS = [n for n in VARIANTS if is_paper_variant(n)]
SMALL_VARIANTS = [n for n in VARIANTS if not is_paper_variant(n)]
# A small config that differs from every named one in each dimension timm's Cait takes as a kwarg.
ODD_SMALL = cait.get_config("cait_pico_32").replace(
    img_size=48, patch_size=6, in_chans=2, embed_dim=48, depth=3, num_heads=3, num_classes=7, init_values=0.2
)


def meta_model(cfg: cait.CaiTConfig) -> cait.CaiT:
    with torch.device("meta"):
        return cait.CaiT(cfg)


def images(cfg: cait.CaiTConfig, batch: int = 2, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, cfg.in_chans, cfg.img_size, cfg.img_size, generator=gen)


# ---------------------------------------------------------------- the paper's table


def test_every_paper_variant_has_a_paper_row():
    in_table = {v for row in MAIN_TABLE for v in row.variants}
    assert set(PAPER_VARIANTS) == in_table


@pytest.mark.parametrize("name", PAPER_VARIANTS)
def test_params_and_flops_match_paper(name):
    cfg, row = VARIANTS[name], paper_model(name)
    model = meta_model(cfg)
    assert next(model.parameters()).is_meta
    assert (cfg.depth, cfg.depth_token_only, cfg.embed_dim, cfg.num_heads) == (
        row.depth,
        row.depth_token_only,
        row.embed_dim,
        row.num_heads,
    )
    params_224 = meta_model(cfg.replace(img_size=224)).num_params() / 1e6  # the paper counts at 224
    assert abs(params_224 - row.params_m) <= 0.1, f"{name}: {params_224:.3f}M vs paper {row.params_m}M"
    res = row.resolution(name)
    assert res == cfg.img_size
    flops = model.flops() / 1e9
    paper = row.flops_g[res]
    assert abs(flops - paper) / paper <= 0.03, f"{name}: {flops:.2f} GFLOPs vs paper {paper} at {res}"


@pytest.mark.parametrize("name", PAPER_VARIANTS)
def test_hyperparameters_match_paper(name):
    cfg, row = VARIANTS[name], paper_model(name)
    assert cfg.drop_path_rate == row.drop_path
    # The released XXS-36 weights were trained with eps 1e-5 (official cait_models.py), the table says 1e-6.
    expected_eps = 1e-5 if row.label == "XXS-36" else row.layerscale_eps
    assert cfg.init_values == expected_eps


@pytest.mark.parametrize(
    "spec",
    ["cait_pico_32", ODD_SMALL, cait.get_config("cait_pico_32").replace(talking_heads=False)],
    ids=["pico", "odd", "no-talking-heads"],
)
def test_flops_equal_what_runs(spec):
    """The analytic count equals torch's own count of the matmuls/convs that run (FLOPs = 2 x MACs);
    only norms, softmax, GELU and bias adds are left out, on purpose (the paper's convention)."""
    cfg = cait.get_config(spec) if isinstance(spec, str) else spec
    model = cait.CaiT(cfg)
    x = images(cfg, batch=1)
    # On the CPU the flop counter does not see inside the fused attention kernel, so count with SDPA's math
    # backend (same ops, spelled out). forward_insights is that same pass plus what its hooks form: each CA
    # layer's class-attention scores q k^T (d x (1+N) MACs), which the fused kernel never materialises.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as lean:
        model(x)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as observed:
        model.forward_insights(x)
    rows = 0 if cfg.class_token_at is not None else cfg.depth_token_only * cfg.embed_dim * (cfg.num_patches + 1)
    assert model.flops() == lean.get_total_flops() // 2 == observed.get_total_flops() // 2 - rows
    assert model.flops(img_size=2 * cfg.img_size) > 4 * model.flops()  # attention grows faster than N


# ---------------------------------------------------------------- parity with timm


def class_attention_of(timm_model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """timm's own class-attention softmax, captured at its attn_drop with the fused path switched off."""
    maps, hooks = [], []
    for blk in timm_model.blocks_token_only:
        blk.attn.fused_attn = False
        hooks.append(blk.attn.attn_drop.register_forward_hook(lambda m, i, out: maps.append(out[:, :, 0])))
    try:
        with torch.no_grad():
            timm_model(x)
    finally:
        for blk, h in zip(timm_model.blocks_token_only, hooks):
            h.remove()
            blk.attn.fused_attn = True
    return tuple(maps)


def batch_for(cfg: cait.CaiTConfig) -> torch.Tensor:
    return images(cfg, batch=1 if cfg.img_size > 64 else 3)


@pytest.mark.parametrize("spec", ["cait_xxs24_224", "cait_xxs24_384", ODD_SMALL], ids=["xxs24_224", "xxs24_384", "odd"])
def test_logits_and_class_attention_equal_timm(twins, spec):
    ours, theirs = twins(spec)
    cfg = ours.cfg
    x = batch_for(cfg)
    with torch.no_grad():
        ref = theirs(x)
        logits = ours(x)
        ins = ours.forward_insights(x)
    assert ref.abs().max() > 1.0  # the random weights give logits worth comparing
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)
    torch.testing.assert_close(ins.logits, logits, atol=1e-5, rtol=0)

    ref_maps = class_attention_of(theirs, x)
    assert len(ins.class_attention) == len(ref_maps) == cfg.depth_token_only
    for mine, ref_map in zip(ins.class_attention, ref_maps):
        assert mine.shape == (x.shape[0], cfg.num_heads, 1 + cfg.num_patches)
        # Deep random nets make tokens alike, so the maps are close to uniform; they still vary by far
        # more than the tolerance below, so the comparison tells maps apart.
        assert (ref_map.amax(-1) - ref_map.amin(-1)).min() > 1e-4
        torch.testing.assert_close(mine, ref_map, atol=1e-7, rtol=1e-4)


@pytest.mark.parametrize("spec", ["cait_xxs24_224", ODD_SMALL], ids=["xxs24_224", "odd"])
def test_input_gradients_equal_timm(twins, spec):
    ours, theirs = twins(spec)
    x = batch_for(ours.cfg)
    # Through a random projection of the logits (not just their sum), for timm, our lean forward and
    # (small config only, to keep the test fast) the logits of forward_insights, the output that keeps the graph.
    w = torch.randn(x.shape[0], ours.cfg.num_classes, generator=torch.Generator().manual_seed(1))
    paths = [theirs, ours] + ([lambda t: ours.forward_insights(t).logits] if ours.cfg.img_size <= 64 else [])
    grads = []
    for fn in paths:
        xi = x.clone().requires_grad_(True)
        (fn(xi) * w).sum().backward()
        grads.append(xi.grad)
    scale = grads[0].abs().max()
    assert scale > 0
    for grad in grads[1:]:
        torch.testing.assert_close(grad / scale, grads[0] / scale, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", RELEASED)
def test_parameter_names_equal_timm(name):
    with torch.device("meta"):
        theirs = timm.create_model(name, pretrained=False)
    ours = meta_model(VARIANTS[name])
    theirs_shapes = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    ours_shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert list(ours_shapes) == list(theirs_shapes)
    assert ours_shapes == theirs_shapes


def test_pos_embed_resize_equals_timm(tmp_path, twins):
    """A 224 checkpoint run at 384: our bicubic resampling equals timm's resample_abs_pos_embed without
    antialiasing (DeiT's fine-tuning rule: F.interpolate bicubic, align_corners=False), and the whole model
    then equals timm's 384 model given timm's resampled weights."""
    ours224, theirs224 = twins("cait_xxs24_224")
    path = tmp_path / "xxs24_224.pth"
    torch.save(theirs224.state_dict(), path)
    ours384 = cait.load_model("cait_xxs24_224", checkpoint=path, img_size=384).model
    assert ours384.cfg.img_size == 384 and ours384.pos_embed.shape == (1, 24 * 24, 192)

    state = theirs224.state_dict()
    state["pos_embed"] = timm.layers.resample_abs_pos_embed(
        state["pos_embed"], (24, 24), num_prefix_tokens=0, antialias=False
    )
    torch.testing.assert_close(ours384.pos_embed.data, state["pos_embed"], atol=1e-5, rtol=0)

    with torch.device("meta"):
        theirs384 = timm.create_model("cait_xxs24_384", pretrained=False)
    theirs384.load_state_dict(state, strict=True, assign=True)
    x = images(ours384.cfg, batch=1)
    with torch.no_grad():
        torch.testing.assert_close(ours384(x), theirs384.eval()(x), atol=1e-4, rtol=0)


# ---------------------------------------------------------------- small configs and the insight API


@pytest.mark.parametrize("name", SMALL_VARIANTS)
def test_small_variant_forward_and_insights(name):
    model = cait.load_model(name, weights=False).model
    randomise_(model)
    cfg, B = model.cfg, 2
    n, h, L = cfg.num_patches, cfg.num_heads, cfg.depth_token_only
    x = images(cfg, batch=B)
    sa_layers = (0, cfg.depth - 1)
    with torch.no_grad():
        logits = model(x)
        feats = model.forward_features(x)
        ins = model.forward_insights(x, sa_layers=sa_layers)
    assert logits.shape == (B, cfg.num_classes) and torch.isfinite(logits).all()
    assert feats.shape == (B, 1 + n, cfg.embed_dim)
    torch.testing.assert_close(model.forward_head(feats), logits)
    torch.testing.assert_close(ins.logits, logits, atol=1e-5, rtol=0)

    assert len(ins.class_attention) == L
    for attn in ins.class_attention:
        assert attn.shape == (B, h, 1 + n)
        torch.testing.assert_close(attn.sum(-1), torch.ones(B, h))
    expected = {"sa": cfg.depth, "ffn": cfg.depth, "ca": L, "ca_ffn": L}
    assert {k: v.shape for k, v in ins.residual_ratios.items()} == {k: (B, d) for k, d in expected.items()}
    assert all((v > 0).all() for v in ins.residual_ratios.values())
    assert ins.layerscale["sa_gamma_1"].shape == ins.layerscale["sa_gamma_2"].shape == (cfg.depth, cfg.embed_dim)
    assert ins.layerscale["ca_gamma_1"].shape == ins.layerscale["ca_gamma_2"].shape == (L, cfg.embed_dim)
    torch.testing.assert_close(ins.layerscale["sa_gamma_1"][0], model.blocks[0].gamma_1.detach())

    assert set(ins.self_attention) == set(sa_layers)
    for layer, (before, after) in ins.self_attention.items():
        assert before.shape == after.shape == (B, h, n, n)
        torch.testing.assert_close(before.sum(-1), torch.ones(B, h, n))  # softmax rows, before mixing
        # After mixing, each head is proj_w's affine mix of the softmaxed heads.
        proj_w = model.blocks[layer].attn.proj_w
        mixed = torch.einsum("gh,bhij->bgij", proj_w.weight, before) + proj_w.bias[None, :, None, None]
        torch.testing.assert_close(after, mixed, atol=1e-5, rtol=1e-4)
    assert not any(t.requires_grad for t in ins.class_attention)


def test_residual_ratio_is_branch_over_residual_norm():
    """The first SA block's ratio recomputed by hand from its input (patch embedding + position)."""
    model = randomise_(cait.load_model("cait_pico_32", weights=False).model)
    x = images(model.cfg)
    with torch.no_grad():
        ins = model.forward_insights(x)
        tokens = model.patch_embed(x) + model.pos_embed
        blk = model.blocks[0]
        branch = blk.gamma_1 * blk.attn(blk.norm1(tokens))
    expected = (branch.norm(dim=-1) / tokens.norm(dim=-1)).mean(dim=1)
    torch.testing.assert_close(ins.residual_ratios["sa"][:, 0], expected)


class _CallLog(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_lean_forward_uses_fused_class_attention():
    """Plain forward: the CA layers go through scaled_dot_product_attention and never build the
    attention matrix (the only softmaxes are the SA layers'); forward_insights runs that same pass and its
    hooks form each CA layer's attention row once more."""
    model = cait.load_model("cait_pico_32", weights=False).model
    x = images(model.cfg)
    with torch.no_grad(), _CallLog() as lean:
        model(x)
    assert lean.names.count(F.scaled_dot_product_attention.__name__) == model.cfg.depth_token_only
    assert lean.names.count("softmax") == model.cfg.depth
    with torch.no_grad(), _CallLog() as probed:
        model.forward_insights(x)
    assert probed.names.count(F.scaled_dot_product_attention.__name__) == model.cfg.depth_token_only
    assert probed.names.count("softmax") == model.cfg.depth + model.cfg.depth_token_only


def _drop_rate(block: torch.nn.Module) -> float:
    """A block's stochastic-depth probability: timm's DropPath keeps it as drop_prob, ours as p; an Identity
    (timm's block without one) drops nothing."""
    path = block.drop_path
    return 0.0 if isinstance(path, torch.nn.Identity) else float(getattr(path, "drop_prob", getattr(path, "p", -1)))


def test_training_mode_drops_paths_where_timm_does_and_never_in_the_class_attention_blocks():
    """With stochastic depth asked for, timm's CaiT drops the SA blocks' branches and never a CA block's (its
    drop_path is an Identity): ours block by block the same, and a CA block in training mode gives timm's
    output with the same weights, call after call (nothing random in it)."""
    from cait.reference import timm_cait

    cfg = cait.get_config("cait_pico_32").replace(drop_path_rate=0.3)
    ours = randomise_(cait.CaiT(cfg)).train()
    theirs = timm_cait(cfg, ours.state_dict()).train()
    for stage in ("blocks", "blocks_token_only"):
        want = [_drop_rate(b) for b in getattr(theirs, stage)]
        assert [_drop_rate(b) for b in getattr(ours, stage)] == want, stage
    assert {_drop_rate(b) for b in theirs.blocks} == {0.3} and {_drop_rate(b) for b in theirs.blocks_token_only} == {0}
    gen = torch.Generator().manual_seed(0)
    x, x_cls = torch.randn(4, cfg.num_patches, cfg.embed_dim, generator=gen), torch.randn(4, 1, cfg.embed_dim)
    for mine, timms in zip(ours.blocks_token_only, theirs.blocks_token_only):
        for _ in range(3):
            torch.testing.assert_close(mine(x, x_cls), timms(x, x_cls))
