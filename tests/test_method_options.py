"""A saliency method's options live with the method: an option declared on one method's entry alone is bounded by
/analyze's checks, published by /analyze, has its control on the Saliency tab and reaches the method. The methods
of a CA layer follow the model's CA depth in the tab's menu and evaluation's cheap methods."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import gradio as gr
import pytest
import torch

import cait
from app import api, session
from app.loading import load_page_model
from app.models import ModelCache, ModelChoice
from app.shared import named
from app.tabs import saliency
from cait import explain
from cait.evaluate import cheap_methods
from cait.explain.attribution import SIGNED, Option, OptionError
from cait.explain.methods import Entry

SCENE = sorted((Path(__file__).resolve().parents[1] / "cait" / "examples").glob("scene_*.png"))[0]
TOY = Option("toy_gain", 1.0, "Toy gain", bounds=(0.5, 2.0), step=0.5)


@pytest.fixture(scope="module")
def loaded():
    cache = ModelCache(load_page_model, max_bytes=2**30, device=torch.device("cpu"))
    return cache.get(ModelChoice("cait_pico_32", random_init=True))


@pytest.fixture
def toy(monkeypatch) -> list[dict]:
    """The saliency method with one more option, toy_gain: the options each call got, in order."""
    calls: list[dict] = []

    def compute(model, x, target, **options):
        calls.append(options)
        return torch.full((x.shape[0], model.cfg.grid_size, model.cfg.grid_size), options["toy_gain"])

    monkeypatch.setitem(explain.METHODS._methods, "saliency", Entry(compute, (SIGNED, TOY)))
    return calls


def test_a_new_option_is_bounded_published_shown_and_passed(toy, loaded):
    with pytest.raises(OptionError, match="toy_gain must be between 0.5 and 2, got 3"):
        api.checked_call(loaded, method="saliency", target=0, causal=False, logit_lens=False, patching="", seed=0,
                         toy_gain=3)  # fmt: skip
    published = api.Analyze(None, None).published()
    last = list(inspect.signature(published).parameters.values())[-1]
    assert (last.name, last.default, last.annotation) == ("toy_gain", 1.0, float)  # after the published keywords
    with gr.Blocks(), gr.Tab("Saliency") as tab:
        parts = saliency.build(loaded, tab)
    control = parts.method_options["toy_gain"]
    assert (type(control), control.minimum, control.maximum, control.value, control.label) == (
        gr.Slider, 0.5, 2.0, 1.0, "Toy gain"
    )  # fmt: skip
    assert named(parts, saliency.SaliencyAsk, choice=None, analysis=None, cmap=None, alpha=None, view=None)[
        "toy_gain"
    ] is control  # fmt: skip
    a = session.analyse(loaded, str(SCENE))
    asked = dict(choice=a.choice, analysis=a, sal_methods=["saliency"], sal_class=2, cmap="gray", alpha=1.0)
    options = saliency.SaliencyAsk.of(dict(asked, view="patch grid", toy_gain=1.5)).options()
    heat = explain.saliency_map(loaded.model, a.x, torch.tensor([2]), "saliency", options)
    assert toy[-1] == {"signed": False, "toy_gain": 1.5} and torch.all(heat == 1.5)
    assert session.options_caption("saliency", options, 0) == "toy_gain 1.5"
    answer = api.answer(loaded, str(SCENE), method="saliency", target=2, causal=False, logit_lens=False, patching="",
                        seed=0, toy_gain=2.0)  # fmt: skip
    assert toy[-1]["toy_gain"] == 2.0 and answer["attribution"]["options"]["toy_gain"] == 2.0


def test_the_ca_layers_methods_follow_the_models_ca_depth(loaded):
    deep = dataclasses.replace(loaded, model=cait.CaiT(dataclasses.replace(loaded.cfg, depth_token_only=3)))
    menu = saliency.SaliencyTab(None, None, None)
    menu.parts = type("Parts", (), {"sal_class": "class", "sal_methods": "methods", "region_of": "regions"})()
    choices = [c[0] for c in menu.for_model(deep)["methods"].choices]
    assert choices[:4] == ["ca1_mean", "ca2_mean", "ca3_mean", "class_specific"]
    assert [c[0] for c in menu.for_model(loaded)["methods"].choices][:3] == ["ca1_mean", "ca2_mean", "class_specific"]
    assert {"ca1_mean", "ca2_mean", "ca3_mean", "rollout_raw"} <= set(cheap_methods(3))
    assert "ca3_mean" not in cheap_methods(2) and "integrated_gradients" not in cheap_methods(3)
