"""The config switches used by the paper's ablations (Tables 1 and 2) do what they say."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import cait

X = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _make(**kw):
    torch.manual_seed(0)
    return cait.create_model("cait_pico_32", **kw)


@pytest.mark.parametrize(
    "kw",
    [
        dict(class_token_at=0, depth_token_only=0),
        dict(class_token_at=1, depth_token_only=0),
        dict(global_pool="avg", depth_token_only=0),
        dict(talking_heads=False, depth_token_only=0),
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
        cait.create_model("cait_pico_32", embed_dims=64)
    with pytest.raises(ValueError, match="cait_xxs24_224"):
        cait.create_model("cait_xxs24_244")


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
        cait.create_model("cait_nano_64", **override)
    assert str(caught.value) == message  # one line, the fields named, before any module is built
    with pytest.raises(cait.ConfigError):
        cait.CaiTConfig(**{"depth": 6, **override})


def test_every_named_variant_is_a_valid_config():
    for name in cait.list_models():
        assert cait.get_config(name).replace() == cait.get_config(name)  # replace re-runs the checks
