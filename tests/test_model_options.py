"""The config switches used by the paper's ablations (Tables 1 and 2) do what they say."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import cait

X = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _make(**kw):
    torch.manual_seed(0)
    return cait.load_model("cait_pico_32", weights=False, **kw).model


@pytest.mark.parametrize(
    "kw",
    [
        dict(class_token_at=0, depth_token_only=0),
        dict(class_token_at=1, depth_token_only=0),
        dict(global_pool="avg", depth_token_only=0),
        dict(talking_heads=False, depth_token_only=0, class_token_at=0),
    ],
)
def test_flops_count_what_runs(kw):
    # Without the fused CA kernel every matmul is visible to torch's counter (which reports 2 FLOPs per MAC).
    model = _make(**kw)
    with FlopCounterMode(display=False) as counter:
        model(X[:1])
    assert model.flops() == counter.get_total_flops() // 2


def test_class_token_inserted_late_is_unseen_before():
    model = _make(class_token_at=1, depth_token_only=0)
    tokens = model.patch_embed(X) + model.pos_embed
    after_first = model.blocks[0](tokens)  # block 0 sees patches only
    expected = model.norm(model.blocks[1](torch.cat((model.cls_token.expand(2, -1, -1), after_first), dim=1)))
    assert torch.allclose(model.forward_features(X), expected, atol=1e-6)


def test_average_pooling_ignores_the_class_token():
    model = _make(global_pool="avg", depth_token_only=0)
    before = model(X)
    with torch.no_grad():
        model.cls_token.add_(5.0)
    assert torch.allclose(model(X), before)
    expected = model.head(model.forward_features(X)[:, 1:].mean(dim=1))
    assert torch.allclose(before, expected, atol=1e-6)


def test_residual_scale_variants():
    rezero = _make(residual_scale="rezero")
    # alpha = 0 and no pre-norm: at init every block is the identity.
    tokens = rezero.patch_embed(X) + rezero.pos_embed
    expected = rezero.norm(torch.cat((rezero.cls_token.expand(2, -1, -1), tokens), dim=1))
    assert torch.allclose(rezero.forward_features(X), expected, atol=1e-6)
    scalar = _make(residual_scale="scalar")
    assert scalar.blocks[0].gamma_1.shape == (1,) and scalar.blocks[0].gamma_1.item() == pytest.approx(0.1)
    plain = _make(residual_scale="none")
    assert not any("gamma" in k for k in plain.state_dict())
    ratios = plain.forward_insights(X).residual_ratios
    assert (ratios["sa"] > 0).all() and ratios["sa"].shape == (2, 2)
    with pytest.raises(ValueError, match="residual_scale"):
        _make(residual_scale="sometimes")


def test_unknown_override_is_named():
    with pytest.raises(TypeError, match="embed_dims"):
        cait.load_model("cait_pico_32", weights=False, embed_dims=64)
    with pytest.raises(ValueError, match="cait_xxs24_224"):
        cait.load_model("cait_xxs24_244", weights=False)


@pytest.mark.parametrize(
    "override,message",
    [
        (dict(num_heads=5), "num_heads 5 does not divide embed_dim 128"),
        (dict(img_size=60), "img_size 60 is not a multiple of patch_size 8"),
        (
            dict(residual_scale="sometimes"),
            "residual_scale must be one of layerscale, scalar, rezero, none, got 'sometimes'",
        ),
        (dict(global_pool="max"), "global_pool must be one of token, avg, got 'max'"),
        (dict(class_token_at=7), "class_token_at must be in [0, depth=6], got 7"),
        (dict(depth=-1), "depth must be >= 0, got -1"),
        (dict(embed_dim=0), "embed_dim must be positive, got 0"),
        (dict(drop_path_rate=1.0), "drop_path_rate is a probability in [0, 1), got 1.0"),
        (dict(crop_pct=0.0), "crop_pct must be in (0, 1], got 0.0"),
    ],
)
def test_a_config_that_makes_no_model_fails_with_its_reason(override, message):
    with pytest.raises(cait.ConfigError) as caught:
        cait.load_model("cait_nano_64", weights=False, **override)
    assert str(caught.value) == message  # one line, the fields named, before any module is built
    with pytest.raises(cait.ConfigError):
        cait.CaiTConfig(**{"depth": 6, **override})


def test_every_named_variant_is_a_valid_config():
    for name in cait.list_models():
        assert cait.get_config(name).replace() == cait.get_config(name)  # replace re-runs the checks


# proj_l's bias shifts all logits of a head alike, which the softmax ignores: its gradient is zero up to rounding.
# timm and the released checkpoints have it, so it stays; it still takes part in the forward.
_SHIFT_ONLY = "attn.proj_l.bias"
_TINY = cait.CaiTConfig(img_size=16, patch_size=8, num_classes=3, embed_dim=8, depth=2, num_heads=2)
_STRUCTURES = [
    dict(depth=depth, depth_token_only=ca, class_token_at=at, global_pool=pool, residual_scale=scale, talking_heads=th)
    for depth in (0, 2)
    for ca in (0, 1)
    for at in (None, *range(depth + 1))
    for pool in ("token", "avg")
    for scale in ("layerscale", "scalar", "rezero", "none")
    for th in (True, False)
]


def _unused_parameters(cfg: cait.CaiTConfig) -> list[str]:
    """Parameters of a model built from `cfg` that get no (or an all-zero) gradient from one forward/backward."""
    torch.manual_seed(0)
    model = cait.CaiT(cfg)
    with torch.no_grad():  # nonzero branch weights (rezero starts at 0, which would zero its branches' gradients)
        for name, p in model.named_parameters():
            if "gamma" in name:
                p.fill_(0.5)
    model(torch.randn(2, 3, 16, 16)).square().sum().backward()
    return [
        name
        for name, p in model.named_parameters()
        if p.grad is None or (not name.endswith(_SHIFT_ONLY) and not p.grad.any())
    ]


def _built_anyway(**fields) -> cait.CaiTConfig:
    """The tiny config with `fields` set past the checks (to show what a refused config would build)."""
    cfg = _TINY.replace()
    for key, value in fields.items():
        object.__setattr__(cfg, key, value)
    return cfg


@pytest.mark.parametrize("fields", _STRUCTURES, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_the_config_accepts_a_structure_exactly_when_every_parameter_is_used(fields):
    unused = _unused_parameters(_built_anyway(**fields))
    try:
        _TINY.replace(**fields)
    except cait.ConfigError as refusal:
        assert unused, f"refused, yet every parameter gets a gradient: {refusal}"
        assert "\n" not in str(refusal)
    else:
        assert not unused, f"accepted, yet {unused} get no gradient"


@pytest.mark.parametrize(
    "fields,message",
    [
        (
            dict(class_token_at=1, depth_token_only=2),
            "depth_token_only 2 builds class-attention blocks that never run: class_token_at 1 puts the class token "
            "in the SA stage instead (set depth_token_only 0)",
        ),
        (dict(global_pool="avg"), "depth_token_only 2 builds class-attention blocks that never reach the output"),
        (dict(depth_token_only=0), "the class token meets no patch"),
        (dict(depth_token_only=0, class_token_at=2, global_pool="avg"), "class_token_at 2 = depth adds a class token"),
    ],
)
def test_a_config_with_parts_that_never_run_is_refused_in_one_line(fields, message):
    with pytest.raises(cait.ConfigError) as caught:
        cait.load_model("cait_pico_32", weights=False, **fields)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_average_pooling_without_class_token_builds_none():
    model = _make(global_pool="avg", depth_token_only=0)
    assert "cls_token" not in model.state_dict() and "cls_token" not in dict(model.named_parameters())
