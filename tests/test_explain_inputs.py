"""Every public explanation checks its inputs at the door, as captum does: a bad x, target or model is a
`cait.InputError` whose message names the argument, never a raw error from deep inside torch nor a silent
answer (issue 46)."""

from __future__ import annotations

import pytest
import torch
from conftest import randomise_
from torch import nn

import cait
from cait import explain
from cait.explain.attention import rollouts
from cait.explain.head_stats import attention_distances_by_stage, mean_attention_distances
from cait.explain.layerscale import layerscale_stats
from cait.explain.metrics import endpoint_probabilities

B = 2


def _model(**overrides) -> nn.Module:
    return randomise_(cait.load_model("cait_pico_32", weights=False, **overrides).model).eval()


@pytest.fixture(scope="module")
def model():
    return _model()


@pytest.fixture(scope="module")
def avg_pooled():
    """The Table 2 ablation's head on the mean patch: no class-token head for the stage's tools to take apart."""
    return _model(global_pool="avg", depth_token_only=0)


def _x(model: nn.Module) -> torch.Tensor:
    cfg = model.cfg
    return torch.randn(B, cfg.in_chans, cfg.img_size, cfg.img_size, generator=torch.Generator().manual_seed(0))


def _good() -> torch.Tensor:
    """A good x for cait_pico_32 (when the argument under test is another)."""
    return torch.randn(B, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _heat() -> torch.Tensor:
    return torch.rand(B, 4, 4)  # cait_pico_32's 4 x 4 patch grid


# name -> (call(model, x, target), reads the class stage, takes a target, what x is called)
METHODS = {
    "class_attention": (lambda m, x, t: explain.class_attention(m, x), False, False, "x"),
    "class_specific_attention": (lambda m, x, t: explain.class_specific_attention(m, x, t), True, True, "x"),
    "rollout": (lambda m, x, t: explain.rollout(m, x), False, False, "x"),
    "rollouts": (lambda m, x, t: rollouts(m, x), False, False, "x"),
    "gradient_rollout": (lambda m, x, t: explain.gradient_rollout(m, x, t), False, True, "x"),
    "talking_heads": (lambda m, x, t: explain.talking_heads(m, x, 0), False, False, "x"),
    "attribution": (lambda m, x, t: explain.attribution(m, x, t, "saliency"), False, True, "x"),
    "saliency_map": (lambda m, x, t: explain.saliency_map(m, x, t, "ca1_mean"), False, True, "x"),
    "saliency_maps": (lambda m, x, t: list(explain.saliency_maps(m, x, t, ["ca1_mean"])), False, True, "x"),
    "direct_logit_attribution": (lambda m, x, t: explain.direct_logit_attribution(m, x, t), True, True, "x"),
    "knockout_profile": (lambda m, x, t: explain.knockout_profile(m, x, t), True, True, "x"),
    "head_ablation": (lambda m, x, t: explain.head_ablation(m, x, layer=0, head=0), True, False, "x"),
    "all_head_ablations": (lambda m, x, t: explain.all_head_ablations(m, x), True, False, "x"),
    "logit_lens": (lambda m, x, t: explain.logit_lens(m, x), True, False, "x"),
    "activation_patching": (lambda m, x, t: explain.activation_patching(m, x, x.clone(), t), True, True, "clean"),
    "mean_attention_distances": (lambda m, x, t: mean_attention_distances(m, x), False, False, "x"),
    "attention_distances_by_stage": (lambda m, x, t: attention_distances_by_stage(m, x), False, False, "x"),
    "layerscale_stats": (lambda m, x, t: layerscale_stats(m, x), False, False, "x"),
    "endpoint_probabilities": (lambda m, x, t: endpoint_probabilities(m, x, t), False, True, "x"),
    "deletion_insertion": (lambda m, x, t: explain.deletion_insertion(m, x, t, _heat(), 2), False, True, "x"),
    "token_patching": (lambda m, x, t: explain.token_patching(m, x, x.clone(), t), True, True, "clean"),
    "head_ablation reference": (
        lambda m, x, t: explain.head_ablation(m, _good(), layer=0, head=0, reference=x),
        True,
        False,
        "reference",
    ),
}
NAMES = sorted(METHODS)


def _bad_x(model: nn.Module) -> dict[str, tuple[torch.Tensor, str]]:
    """Each way x can be wrong, with what the message must say after the argument's name."""
    x = _x(model)
    nan = x.clone()
    nan[0, 0, 0, 0] = float("nan")
    return {
        "size": (torch.zeros(B, 3, 64, 64), r"must be a normalised batch \[B, 3, 32, 32\]"),
        "dims": (torch.zeros(3, 32, 32), r"must be a normalised batch"),
        "nan": (nan, "holds NaN or infinite values"),
        "raw pixels": ((x * 40 + 128).clamp(0, 255), r"holds values in \[.*\], not a normalised image"),
        "integers": (torch.zeros(B, 3, 32, 32, dtype=torch.uint8), "must be a float tensor"),
    }


@pytest.mark.parametrize("name", NAMES)
def test_bad_x_is_an_input_error_naming_it(model, name):
    call, _, _, called = METHODS[name]
    target = torch.zeros(B, dtype=torch.long)
    for what, (x, says) in _bad_x(model).items():
        with pytest.raises(cait.InputError, match=f"^{called} {says}"):
            call(model, x, target)
        assert what  # (the loop's label, for a failing run's traceback)


BAD_TARGETS = {
    "length": (torch.zeros(B + 1, dtype=torch.long), r"target must hold one class per image: 2 for x, got shape \[3\]"),
    "class range": (torch.tensor([0, 10]), r"target holds classes outside 0..9 \(this model has 10\)"),
    "negative": (torch.tensor([-1, 0]), r"target holds classes outside 0..9"),
    "floats": (torch.tensor([0.0, 1.0]), "target must hold integer class indices"),
}


@pytest.mark.parametrize("name", [n for n in NAMES if METHODS[n][2]])
def test_bad_target_is_an_input_error_naming_it(model, name):
    call = METHODS[name][0]
    x = _x(model)
    for target, says in BAD_TARGETS.values():
        with pytest.raises(cait.InputError, match=says):
            call(model, x, target)


@pytest.mark.parametrize("name", [n for n in NAMES if METHODS[n][1]])
def test_a_model_without_a_class_stage_is_refused_by_the_stage_tools(avg_pooled, name):
    """One shared check: the lens used to answer on an average-pooled model (issue 46)."""
    with pytest.raises(cait.InputError, match="model has no class-attention stage read by a class-token head"):
        METHODS[name][0](avg_pooled, _x(avg_pooled), torch.zeros(B, dtype=torch.long))


@pytest.mark.parametrize("name", NAMES)
def test_a_module_that_is_not_our_cait_is_refused(name):
    with pytest.raises(cait.InputError, match="model must be a CaiT from cait.load_model, got Linear"):
        METHODS[name][0](nn.Linear(3, 3), torch.zeros(B, 3, 32, 32), torch.zeros(B, dtype=torch.long))


def test_good_targets_in_the_forms_captum_takes(model):
    """One int for every image, a [B, 1] column and a list are read as [B] class indices: the check does not
    refuse what the methods accept."""
    x = _x(model)
    expected = explain.direct_logit_attribution(model, x, torch.tensor([3, 3])).heads
    for target in (3, [3, 3], torch.tensor([[3], [3]])):
        torch.testing.assert_close(explain.direct_logit_attribution(model, x, target).heads, expected)


def test_methods_that_name_a_ca_layer_follow_the_models_ca_depth_or_are_refused_in_one_line():
    """caK_mean is the mean over heads of CA layer K's class attention for every K the model has (a third CA
    layer has its method too); a layer the model lacks is one input error, also where the maps are given."""
    x, target = _good(), torch.zeros(B, dtype=torch.long)
    deep = _model(depth_token_only=3)
    got = explain.saliency_map(deep, x, target, "ca3_mean")
    torch.testing.assert_close(got, explain.class_attention(deep, x).maps[:, 2].mean(dim=1))
    shallow = _model(depth_token_only=1)
    maps = explain.class_attention(shallow, x).maps
    asks = {
        "saliency_map": lambda: explain.saliency_map(shallow, x, target, "ca2_mean"),
        "saliency_maps": lambda: list(explain.saliency_maps(shallow, x, target, ["ca1_mean", "ca2_mean"])),
        "given maps": lambda: list(explain.saliency_maps(shallow, x, target, ["ca2_mean"], class_attention_maps=maps)),
    }
    for ask in asks.values():
        with pytest.raises(cait.InputError, match=r"^method 'ca2_mean' reads CA layer 2; this model has 1") as e:
            ask()
        assert "\n" not in str(e.value)
    with pytest.raises(cait.InputError, match="unknown method 'ca0_mean'"):
        explain.saliency_map(shallow, x, target, "ca0_mean")
