"""One image compared across two models (`cait.compare.image`): every number is the explain function's (or
`forward_insights`') run on that model alone; a model against itself differs nowhere; models of different sizes
pair their heads by layer and head, or by a run's matching; what cannot be compared is refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import randomise_
from PIL import Image

import cait
from cait import explain
from cait.compare.image import Seen, compare_image
from cait.compare.options import CompareError
from cait.explain._checks import ExplainInputError
from cait.explain.layerscale import layerscale_stats
from cait.preprocess import to_batch

SCENES = sorted((Path(__file__).parents[1] / "cait" / "examples").glob("scene_*.png"))


def batch(model, scene: Path = SCENES[0]) -> torch.Tensor:
    return to_batch([Image.open(scene)], model.cfg)


@pytest.fixture(scope="module")
def sizes():
    """The two shipped models: 28-px, 7x7 grid, 3 heads against 136-px, 17x17 grid, 4 heads."""
    return [cait.load_model(name).model.eval() for name in ("cait_nano_28", "cait_micro_136")]


@pytest.fixture(scope="module")
def pico():
    torch.manual_seed(0)
    with torch.no_grad():
        return randomise_(cait.load_model("cait_pico_32", weights=False, depth=3).model).eval()


def test_each_side_is_the_explain_functions_on_that_model_alone(sizes):
    a, b = sizes
    x_a, x_b = batch(a), batch(b)
    seen = compare_image(a, x_a, b, x_b, target=3)
    for model, x, maps, dla, top, ratios in (
        (a, x_a, seen.maps_a, seen.dla_a, seen.top_a, seen.ratios_a),
        (b, x_b, seen.maps_b, seen.dla_b, seen.top_b, seen.ratios_b),
    ):
        ca = explain.class_attention(model, x)
        np.testing.assert_allclose(maps, ca.maps[0].numpy(), atol=1e-6)
        np.testing.assert_allclose(dla, explain.direct_logit_attribution(model, x, 3).heads[0].numpy(), atol=1e-5)
        probs, classes = ca.logits[0].softmax(-1).topk(5)
        assert [c for c, _ in top] == classes.tolist()
        np.testing.assert_allclose([p for _, p in top], probs.detach().numpy(), atol=1e-6)
        with torch.no_grad():
            insights = model.forward_insights(x)
        for kind, values in insights.residual_ratios.items():
            np.testing.assert_allclose(ratios[kind], values[0].numpy(), atol=1e-6)
    rows = layerscale_stats(b)
    for stage, gamma in (("sa", "gamma_1"), ("ca", "gamma_2")):
        expected = [r["mean"] for r in rows if r["stage"] == stage and r["gamma"] == gamma]
        assert seen.gamma_b[f"{stage} {gamma}"] == pytest.approx(expected)
    assert len(seen.gamma_a["sa gamma_1"]) == a.cfg.depth and len(seen.gamma_b["sa gamma_1"]) == b.cfg.depth
    # different sizes: paired by layer and head as far as both go (3 heads of 4), no difference across grids
    assert seen.pairs == [((layer, head), (layer, head)) for layer in (1, 2) for head in (1, 2, 3)]
    assert seen.differences == [None] * 6 and seen.target == 3


def test_a_model_against_itself_differs_nowhere_and_defaults_to_its_top_class(pico):
    x = batch(pico)
    seen = compare_image(pico, x, pico, x)
    assert seen.target == seen.top_a[0][0] and seen.top_a == seen.top_b
    assert len(seen.pairs) == pico.cfg.depth_token_only * pico.cfg.num_heads
    assert all(np.abs(d).max() == 0 for d in seen.differences)
    np.testing.assert_array_equal(seen.dla_a, seen.dla_b)
    assert seen.gamma_a == seen.gamma_b and seen.ratios_a == seen.ratios_b
    other = batch(pico, SCENES[1])  # another image: the maps do differ, and the difference is B minus A
    seen = compare_image(pico, x, pico, other)
    np.testing.assert_allclose(seen.differences[1], seen.maps_b[0, 1] - seen.maps_a[0, 1])
    assert np.abs(seen.differences[1]).max() > 0


def test_model_as_seen_before_gives_the_same_numbers(sizes):
    """A's answer, maps and ratios taken from a pass already made (the app's analysis) change nothing."""
    a, b = sizes
    x_a, x_b = batch(a), batch(b)
    with torch.no_grad():
        insights = a.forward_insights(x_a)
    before = Seen(
        insights.logits[0].softmax(-1).numpy(),
        explain.ClassAttention.from_insights(insights).maps[0].numpy(),
        {kind: values[0].tolist() for kind, values in insights.residual_ratios.items()},
    )
    fresh, reused = compare_image(a, x_a, b, x_b), compare_image(a, x_a, b, x_b, seen_a=before)
    assert reused.target == fresh.target and reused.top_a == fresh.top_a and reused.top_b == fresh.top_b
    for name in ("maps_a", "maps_b", "dla_a", "dla_b"):
        np.testing.assert_array_equal(getattr(reused, name), getattr(fresh, name))
    assert reused.ratios_a == fresh.ratios_a and reused.ratios_b == fresh.ratios_b


def test_a_runs_matching_pairs_the_heads(sizes):
    a, b = sizes
    matching = [((2, 1), (1, 4), 0.9), ((1, 3), (2, 2), 0.5)]
    seen = compare_image(a, batch(a), b, batch(b), matching=matching)
    assert seen.pairs == [((2, 1), (1, 4)), ((1, 3), (2, 2))]


@pytest.mark.parametrize(
    "asked, said",
    [
        (dict(matching=[((1, 4), (1, 1), 0.9)]), "matching names CA head 1.4 of model A, which has 2 CA layers of 3"),
        (dict(target=10), "target must be a class in 0..9, got 10"),
        (dict(two=True), "x_a must hold one image, got a batch of 2"),
    ],
)
def test_what_cannot_be_compared_is_one_line(sizes, asked, said):
    a, b = sizes
    x_a = torch.cat([batch(a)] * 2) if asked.pop("two", False) else batch(a)
    with pytest.raises(ExplainInputError, match=said):
        compare_image(a, x_a, b, batch(b), **asked)


def test_models_of_different_class_sets_are_refused(pico):
    five = cait.load_model("cait_pico_32", weights=False, num_classes=5).model.eval()
    with pytest.raises(CompareError, match="the two models answer different classes"):
        compare_image(pico, batch(pico), five, batch(five))
