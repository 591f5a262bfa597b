"""The Mechanisms tab and the /analyze API's mechanism sections, without a server: the numbers drawn are
cait.explain's on the same inputs (the corrupted run rebuilt here from cait.corruptions), a set ablation's
top-5 is that of a twin model with those heads' outputs zeroed by hooks, and bad input is one message."""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from conftest import randomise_

import cait
from app import causal_view, layout, session
from app.handlers import Handlers, layerscale_figure
from app.mechanisms_view import SOURCES
from app.models import ModelCache, ModelChoice, load_model
from cait import explain
from cait.corruptions import corrupt
from cait.data import read_examples
from cait.preprocess import normalise, view_pixels

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "pico.safetensors"
    cait.save_weights(randomise_(cait.create_model("cait_pico_32"), seed=1), path)
    cache = ModelCache(lambda c: load_model(c, CPU), max_bytes=2**30)
    first = cache.get(ModelChoice(name=None, checkpoint=str(path)))
    _, page = layout.build_page(first, layerscale_figure(first))
    handlers = Handlers(page, cache, first.choice)
    examples = [str(e.path) for e in read_examples()[:3]]
    return handlers, first, session.analyse(first, examples[0]), examples


def patch(handlers, a, **named) -> dict:
    ask = dict(choice=a.choice, analysis=a, mx_class=None, mx_source=SOURCES[0], mx_corruption="gaussian_noise")
    ask |= dict(mx_severity=3, mx_example=None, mx_upload=None)
    return handlers.mechanisms_patch(**(ask | named))


def test_the_lens_drawn_is_explains(setup):
    handlers, loaded, a, _ = setup
    p, model = handlers.page, loaded.model
    target = int(np.argsort(a.probs)[-2])  # another class than the top one
    out = handlers.mechanisms_opened(a.choice, a, target)
    probs = explain.logit_lens(model, a.x).softmax(-1)[0]  # [D + 1, K]
    line, bars = out[p.mx_lens].data[1], out[p.mx_lens].data[0]
    assert list(line.y) == pytest.approx(probs[:, target].tolist(), abs=1e-6)
    assert list(bars.text) == [loaded.labels[int(i)] for i in probs.argmax(-1)]
    assert "after SA block 1" in line.hovertext[1] and "patch embedding" in line.hovertext[0]
    top1 = probs.argmax(-1).tolist()
    forms = next(k for k in range(len(top1)) if all(t == top1[-1] for t in top1[k:]))  # a plain loop
    assert out[p.mx_lens].layout.title.text.endswith("(top-1 from there on)") == (forms is not None)
    assert out[p.mx_class].value == target and "forward passes" in out[p.mx_cost]
    # a new image's follow-up: the lens at once while the tab is open, nothing while another is
    assert handlers.open_tab_follow_up(a.choice, a, layout.MECHANISMS_TAB)[p.mx_class].value == a.top_class
    assert isinstance(handlers.open_tab_follow_up(a.choice, a, layout.CLASS_ATTENTION_TAB), type(gr.skip()))


def test_patching_a_corruption_and_an_example_is_explains(setup):
    handlers, loaded, a, examples = setup
    p, model = handlers.page, loaded.model
    out = patch(handlers, a, mx_corruption="contrast", mx_severity=4)
    broken = corrupt(view_pixels(a.view)[None], "contrast", 4, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([a.top_class])
    want = explain.activation_patching(model, a.x, normalise(broken, model.cfg), target)
    heads = explain.activation_patching(model, a.x, normalise(broken, model.cfg), target, granularity="head")
    bars = out[p.mx_patch].data
    assert list(bars[0].y) == pytest.approx(want.branches[0, :, 0].tolist(), abs=1e-5)
    assert list(bars[1].y) == pytest.approx(want.branches[0, :, 1].tolist(), abs=1e-5)
    assert list(bars[2].y) == pytest.approx(want.class_token[0].tolist(), abs=1e-5)
    np.testing.assert_allclose(out[p.mx_patch_heads].data[0].z, heads.heads[0].numpy(), atol=1e-5)
    gap = float(want.gap[0])
    assert f"{float(want.branches[0, 0, 0]) / gap:.0%} of the gap" in bars[0].hovertext[0]
    assert out[p.mx_second].size == a.view.size
    # another image as the corrupted run: an example
    out = patch(handlers, a, mx_source=SOURCES[1], mx_example=examples[1])
    other = causal_view.reference_batch([examples[1]], model.cfg)
    want = explain.activation_patching(model, a.x, other, target)
    assert list(out[p.mx_patch].data[0].y) == pytest.approx(want.branches[0, :, 0].tolist(), abs=1e-5)


def test_patching_without_a_second_image_or_with_a_bad_file_is_one_message(setup, tmp_path):
    handlers, _, a, _ = setup
    p = handlers.page
    assert list(patch(handlers, a, mx_source=SOURCES[2])) == [p.mx_msg]
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    out = patch(handlers, a, mx_source=SOURCES[2], mx_upload=str(bad))
    assert list(out) == [p.mx_msg] and out[p.mx_msg].startswith("**Cannot patch:**")
    assert "\n" not in out[p.mx_msg]
    assert list(patch(handlers, a, analysis=None)) == [p.mx_msg]


def test_ablating_ticked_heads_equals_a_model_with_them_zeroed(setup):
    handlers, loaded, a, _ = setup
    model, cfg = loaded.model, loaded.model.cfg
    ticked = [0, cfg.num_heads + 1]  # CA1 head 1 and CA2 head 2
    html = handlers.mechanisms_ablate(a.choice, a, None, ticked, causal_view.ABLATIONS[0])[handlers.page.mx_ablation]
    assert "CA1 head 1, CA2 head 2" in html
    twin = cait.create_model("cait_pico_32")
    twin.load_state_dict(model.state_dict())
    twin.eval()
    width = cfg.embed_dim // cfg.num_heads

    def zero(head):
        def hook(module, args):
            o = args[0].clone()
            o[..., head * width : (head + 1) * width] = 0
            return (o,)

        return hook

    twin.blocks_token_only[0].attn.proj.register_forward_pre_hook(zero(0))
    twin.blocks_token_only[1].attn.proj.register_forward_pre_hook(zero(1))
    with torch.no_grad():
        after, before = twin(a.x)[0], model(a.x)[0]
    delta = float(after[a.top_class] - before[a.top_class])
    assert f"<b>{delta:+.3f}</b>" in html
    top = after.softmax(-1).topk(5)
    for v, i in zip(top.values, top.indices):
        assert f"<td>{loaded.labels[int(i)]}</td><td>{float(v):.3f}</td></tr>" in html
    assert (
        "Tick at least one head" in handlers.mechanisms_ablate(a.choice, a, None, [], "zero")[handlers.page.mx_ablation]
    )


def test_analyze_opts_into_the_lens_and_patching_by_keyword(setup):
    handlers, loaded, a, examples = setup
    handlers.default = loaded.choice
    model = loaded.model
    positional = handlers.analyze({"path": examples[0]}, "", -1, 32, True)  # the README's call still works
    assert "causal" in positional and "logit_lens" not in positional and "patching" not in positional
    out = handlers.analyze({"path": examples[0]}, logit_lens=True, patching="gaussian_noise:2")
    lens = explain.logit_lens(model, a.x).softmax(-1)[0]
    assert out["logit_lens"]["probability"] == pytest.approx(lens[:, a.top_class].tolist(), abs=1e-6)
    assert "layout" in out["logit_lens"] and "layout" in out["patching"]
    broken = corrupt(view_pixels(a.view)[None], "gaussian_noise", 2, generator=torch.Generator().manual_seed(0))
    want = explain.activation_patching(model, a.x, normalise(broken, model.cfg), torch.tensor([a.top_class]))
    assert out["patching"]["class_token"] == pytest.approx(want.class_token[0].tolist(), abs=1e-5)
    assert out["patching"]["gap"] == pytest.approx(float(want.gap[0]), abs=1e-5)
    assert (out["patching"]["corruption"], out["patching"]["severity"]) == ("gaussian_noise", 2)
    for bad in ("gaussian_noise", "fog:3", "gaussian_noise:9"):
        with pytest.raises(gr.Error):
            handlers.analyze({"path": examples[0]}, patching=bad)


def test_the_download_holds_the_tabs_lens_and_patching_as_analyze_gives_them(setup):
    handlers, loaded, _, examples = setup
    p, a = handlers.page, session.analyse(loaded, examples[0])  # nothing computed on it yet
    read = lambda out: json.loads(Path(out[p.json_file]).read_text())  # noqa: E731
    missing = json.loads(Path(handlers._numbers_file(loaded, a)).read_text())["not_computed"]
    assert "Mechanisms tab" in missing["logit_lens"] and "Mechanisms tab" in missing["patching"]
    target = int(np.argsort(a.probs)[-2])  # another class than the top one
    lensed = read(handlers.mechanisms_opened(a.choice, a, target))
    asked = handlers.analyze({"path": examples[0]}, target=target, logit_lens=True, patching="contrast:4")
    assert lensed["logit_lens"] == asked["logit_lens"] and "logit_lens" not in lensed["not_computed"]
    assert "patching" not in lensed and "patching" in lensed["not_computed"]
    patched = read(patch(handlers, a, mx_class=target, mx_corruption="contrast", mx_severity=4))
    assert patched["patching"] == asked["patching"] and list(patched["not_computed"]) == ["causal", "saliency"]
    assert patched["logit_lens"] == asked["logit_lens"]  # the lens stays when patching rewrites the file
    # another class's lens replaces it; an example as the corrupted run is named by its file
    assert read(handlers.mechanisms_class(a.choice, a, a.top_class))["logit_lens"]["target"] == a.top_class
    other = read(patch(handlers, a, mx_source=SOURCES[1], mx_example=examples[1]))["patching"]
    assert other["second_image"] == Path(examples[1]).name and "corruption" not in other


def test_gradient_rollout_is_in_the_saliency_tab_and_scored(setup):
    handlers, _, a, _ = setup
    assert ("gradient_rollout", "gradient_rollout") in handlers.page.sal_methods.choices
    named = dict(choice=a.choice, analysis=a, sal_methods=["gradient_rollout"], sal_class=2, cmap="inferno", alpha=0.5)
    steps = list(handlers.saliency(view="smooth", **named))
    table = steps[-2][handlers.page.sal_table]
    assert table[0][0] == "gradient_rollout" and table[0][1] is not None and table[0][2] is not None


def test_the_patch_button_passes_its_inputs_by_name(setup):
    from gradio.utils import check_function_inputs_match

    from app.mechanisms_events import PatchAsk

    handlers = setup[0]
    named = handlers.page.named(PatchAsk)
    assert list(named) == list(PatchAsk.__dataclass_fields__)
    assert check_function_inputs_match(handlers.mechanisms_patch, [], False, inputs_kwargs=named) is None
