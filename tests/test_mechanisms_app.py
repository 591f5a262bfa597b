"""The Mechanisms tab and the /analyze API's mechanism sections, without a server: the numbers drawn are
cait.explain's on the same inputs (the corrupted run rebuilt here from cait.corruptions), a set ablation's
top-5 is that of a twin model with those heads' outputs zeroed by hooks, and bad input is one message."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from conftest import randomise_
from PIL import Image
from test_app_long_work import Blocks  # which thread ran each block
from test_causal_view import signed_by_the_convention

import cait
from app import causal_view, mechanisms_view, session
from app.api import Analyze
from app.loading import load_page_model
from app.mechanisms_view import SOURCES
from app.models import ModelCache, ModelChoice
from app.shared import CLASS_ATTENTION_TAB, MECHANISMS_TAB
from app.texts import NO_IMAGE
from cait import explain
from cait.corruptions import corrupt
from cait.data import read_examples
from cait.preprocess import normalise, view_pixels
from cait.runtime import PrecisionChoice

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "pico.safetensors"
    cait.save_weights(randomise_(cait.load_model("cait_pico_32", weights=False).model, seed=1), path)
    from app_tabs import page_under_test

    cache = ModelCache(load_page_model, max_bytes=2**30, device=CPU)
    first = cache.get(ModelChoice(name=None, checkpoint=str(path)))
    handlers = page_under_test(cache, first.choice)
    examples = [str(e.path) for e in read_examples()[:3]]
    return handlers, first, session.analyse(first, examples[0]), examples


def patch(handlers, a, **named) -> dict:
    ask = dict(choice=a.choice, analysis=a, mx_class=None, mx_source=SOURCES[0], mx_corruption="gaussian_noise")
    ask |= dict(mx_severity=3, mx_example=None, mx_upload=None)
    return handlers.tabs.mechanisms.runs.patch(**(ask | named))


def test_the_lens_drawn_is_explains(setup):
    handlers, loaded, a, _ = setup
    p, model = handlers.p, loaded.model
    target = int(np.argsort(a.probs)[-2])  # another class than the top one
    out = handlers.tabs.mechanisms.opened(a.choice, a, target)
    probs = explain.logit_lens(model, a.x).softmax(-1)[0]  # [D + 1, K]
    line, bars = out[p.mx_lens].data[1], out[p.mx_lens].data[0]
    assert list(line.y) == pytest.approx(probs[:, target].tolist(), abs=1e-6)
    assert list(bars.text) == [loaded.labels[int(i)] for i in probs.argmax(-1)]
    assert "after SA block 1" in line.hovertext[1] and "patch embedding" in line.hovertext[0]
    top1 = probs.argmax(-1).tolist()
    forms = next(k for k in range(len(top1)) if all(t == top1[-1] for t in top1[k:]))  # a plain loop
    assert out[p.mx_lens].layout.title.text.endswith("(the top-1 from there on)") == (forms is not None)
    assert out[p.mx_class].value == target and "forward passes" in out[p.mx_cost]
    # a new image's follow-up: the lens at once while the tab is open, nothing while another is
    assert handlers.tabs.image.follow_up(a.choice, a, MECHANISMS_TAB)[p.mx_class].value == a.top_class
    assert isinstance(handlers.tabs.image.follow_up(a.choice, a, CLASS_ATTENTION_TAB), type(gr.skip()))


def test_patching_a_corruption_and_an_example_is_explains(setup):
    handlers, loaded, a, examples = setup
    p, model = handlers.p, loaded.model
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
    share = f"{float(want.branches[0, 0, 0]) / gap:.0%} of the gap" if abs(gap) >= 1 else "gap too small for a share"
    assert share in bars[0].hovertext[0]
    assert Image.open(out[p.mx_second]).size == a.view.size
    # another image as the corrupted run: an example
    out = patch(handlers, a, mx_source=SOURCES[1], mx_example=examples[1])
    other = causal_view.reference_batch([examples[1]], model.cfg)
    want = explain.activation_patching(model, a.x, other, target)
    assert list(out[p.mx_patch].data[0].y) == pytest.approx(want.branches[0, :, 0].tolist(), abs=1e-5)


def test_patching_without_a_second_image_or_with_a_bad_file_is_one_message(setup, tmp_path):
    """One message line, and no result of an earlier run left on show (N35), for patching and token patching."""
    handlers, _, a, _ = setup
    p = handlers.p
    emptied = {p.mx_second: None, p.mx_patch: None, p.mx_patch_heads: None}
    assert (
        patch(handlers, a, mx_source=SOURCES[2])
        == {p.mx_msg: "**Cannot patch:** choose a file for the corrupted run"} | emptied
    )
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    out = patch(handlers, a, mx_source=SOURCES[2], mx_upload=str(bad))
    assert out == {p.mx_msg: out[p.mx_msg]} | emptied and out[p.mx_msg].startswith("**Cannot patch:**")
    assert "\n" not in out[p.mx_msg]
    assert patch(handlers, a, analysis=None) == {p.mx_msg: NO_IMAGE} | emptied
    out = tokens(handlers, a, mx_source=SOURCES[2], mx_upload=str(bad))
    assert out == {p.mx_msg: out[p.mx_msg], p.mx_second: None, p.mx_tokens: None}
    assert out[p.mx_msg].startswith("**Cannot patch:**")


def test_ablating_ticked_heads_equals_a_model_with_them_zeroed(setup):
    handlers, loaded, a, _ = setup
    model, cfg = loaded.model, loaded.model.cfg
    ticked = [0, cfg.num_heads + 1]  # CA1 head 1 and CA2 head 2
    asked = dict(choice=a.choice, analysis=a, mx_class=None, mx_mode=causal_view.ABLATIONS[0])
    html = handlers.tabs.mechanisms.ablate(mx_heads=ticked, **asked)[handlers.p.mx_ablation]
    assert "CA1 head 1, CA2 head 2" in html
    twin = cait.load_model("cait_pico_32", weights=False).model
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
    assert "Tick at least one head" in handlers.tabs.mechanisms.ablate(mx_heads=[], **asked)[handlers.p.mx_ablation]


def test_analyze_opts_into_the_lens_and_patching_by_keyword(setup):
    handlers, loaded, a, examples = setup
    analyze = Analyze(handlers.cache, loaded.choice).analyze
    model = loaded.model
    positional = analyze({"path": examples[0]}, "", -1, 32, True)  # the README's call still works
    assert "causal" in positional and "logit_lens" not in positional and "patching" not in positional
    out = analyze({"path": examples[0]}, logit_lens=True, patching="gaussian_noise:2")
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
            analyze({"path": examples[0]}, patching=bad)


def test_the_download_holds_the_tabs_lens_and_patching_as_analyze_gives_them(setup):
    handlers, loaded, _, examples = setup
    p, a = handlers.p, session.analyse(loaded, examples[0])  # nothing computed on it yet
    read = lambda out: json.loads(Path(out[p.json_file]).read_text())  # noqa: E731
    # as the server runs it: each part on its lane, both with a one-image pass's threads (float sums follow them)
    analyze = Analyze(handlers.cache, loaded.choice).analyze
    missing = json.loads(Path(session.numbers_file(loaded, a)).read_text())["not_computed"]
    assert "Mechanisms tab" in missing["logit_lens"] and "Mechanisms tab" in missing["patching"]
    target = int(np.argsort(a.probs)[-2])  # another class than the top one
    lensed = read(handlers.tabs.mechanisms.opened(a.choice, a, target))
    asked = analyze({"path": examples[0]}, target=target, logit_lens=True, patching="contrast:4")
    assert lensed["logit_lens"] == asked["logit_lens"] and "logit_lens" not in lensed["not_computed"]
    assert "patching" not in lensed and "patching" in lensed["not_computed"]
    patched = read(patch(handlers, a, mx_class=target, mx_corruption="contrast", mx_severity=4))
    assert patched["patching"] == asked["patching"]
    assert list(patched["not_computed"]) == ["causal", "saliency", "token_patching"]
    assert patched["logit_lens"] == asked["logit_lens"]  # the lens stays when patching rewrites the file
    # another class's lens replaces it; an example as the corrupted run is named by its file
    assert read(handlers.tabs.mechanisms.choose_class(a.choice, a, a.top_class))["logit_lens"]["target"] == a.top_class
    other = read(patch(handlers, a, mx_source=SOURCES[1], mx_example=examples[1]))["patching"]
    assert other["second_image"] == Path(examples[1]).name and "corruption" not in other


def test_gradient_rollout_is_in_the_saliency_tab_and_scored(setup):
    handlers, _, a, _ = setup
    assert ("gradient_rollout", "gradient_rollout") in handlers.p.sal_methods.choices
    named = dict(choice=a.choice, analysis=a, sal_methods=["gradient_rollout"], sal_class=2, cmap="inferno", alpha=0.5)
    steps = list(handlers.tabs.saliency.run(view="smooth", **named))
    table = steps[-2][handlers.p.sal_table]
    assert table[0][0] == "gradient_rollout" and table[0][1] is not None and table[0][2] is not None


def test_errors_come_in_two_kinds_a_users_calm_line_and_an_internal_one_with_the_traceback_logged(
    setup, monkeypatch, caplog
):
    """As the wired page calls its handlers: a user's mistake (a `cait.InputError`) is its own calm line; a bug (a
    RuntimeError injected into the numbers) is one line saying an internal error happened, with the traceback in
    the server's log, never a calm wrong message."""
    import logging

    from app import mechanisms_view
    from app.shared import INTERNAL_ERROR
    from app.tabs.dataset import AtlasPlaces
    from app.ui import compose, wire

    handlers, loaded, a, _ = setup
    demo, page, tabs = compose(loaded, handlers.cache, AtlasPlaces.of(None, None))
    wire(demo, page, tabs, cache=handlers.cache, default=loaded.choice)
    patch_fn = next(fn.fn for fn in demo.fns.values() if fn.name == "patch")
    asked = dict(choice=a.choice, analysis=a, mx_class=None, mx_source=SOURCES[0], mx_corruption="gaussian_noise")
    asked |= dict(mx_severity=3, mx_example=None, mx_upload=None)
    msg = page.mechanisms.mx_msg
    calm = patch_fn(**(asked | dict(mx_source=SOURCES[2])))  # no second image chosen: the user's to mend
    assert calm[msg] == "**Cannot patch:** choose a file for the corrupted run"

    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch in a bug")

    monkeypatch.setattr(mechanisms_view, "patching_numbers", broken)
    caplog.set_level(logging.INFO, logger="cait.app")
    said = patch_fn(**asked)
    assert said[msg] == INTERNAL_ERROR and "\n" not in said[msg] and "shape mismatch" not in said[msg]
    assert said[page.mechanisms.mx_patch] is None  # no earlier run's bars left under the message
    (logged,) = [r for r in caplog.records if r.exc_info]
    assert logged.levelno == logging.ERROR and isinstance(logged.exc_info[1], RuntimeError)
    # a handler without a message line of its own answers with Gradio's error toast, in the same two kinds
    region = next(fn.fn for fn in demo.fns.values() if fn.name == "region")
    monkeypatch.setattr(session, "regions_of_focus", broken)
    with pytest.raises(gr.Error, match="Internal error") as raised:
        region(a, "CA1 mean", 0.5)
    assert "shape mismatch" not in str(raised.value)


# ---------------------------------------------------------------------------------------------------------------
# token patching into the class stage, the long runs' progress and Stop, the controls of another model


def tokens(handlers, a, **named) -> dict:
    ask = dict(choice=a.choice, analysis=a, mx_class=None, mx_source=SOURCES[0], mx_corruption="contrast")
    ask |= dict(mx_severity=5, mx_example=None, mx_upload=None, mx_region=1)
    return handlers.tabs.mechanisms.runs.tokens(**(ask | named))


def spearman(u: np.ndarray, v: np.ndarray) -> float:
    """Spearman's rho by hand: Pearson's over the ranks, ties given their mean rank."""

    def ranks(x):
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for value in np.unique(x):
            r[x == value] = r[x == value].mean()
        return r

    return float(np.corrcoef(ranks(u.ravel()), ranks(v.ravel()))[0, 1])


def hooked_class_stage(model, clean, corrupted, patch_from_clean: np.ndarray) -> torch.Tensor:
    """The full model on the corrupted image with the patch tokens at `patch_from_clean` (bool [N]) taken from
    the clean run at the class stage's input, by forward pre-hooks on the CA blocks: an independent run."""
    with torch.no_grad():
        clean_tokens = model.forward_self_attention(clean)
    where = torch.from_numpy(patch_from_clean)

    def swap(module, args):
        tokens, cls = args
        return (torch.where(where[None, :, None], clean_tokens, tokens), cls)

    handles = [blk.register_forward_pre_hook(swap) for blk in model.blocks_token_only]  # each CA block reads them
    try:
        with torch.no_grad():
            return model(corrupted)[0]
    finally:
        for handle in handles:
            handle.remove()


def test_the_token_map_drawn_is_an_independent_hooked_run_beside_the_class_attention(setup):
    handlers, loaded, a, _ = setup
    p, model, cfg = handlers.p, loaded.model, loaded.model.cfg
    region, g = 2, cfg.grid_size
    out = tokens(handlers, a, mx_region=region)
    broken = corrupt(view_pixels(a.view)[None], "contrast", 5, generator=torch.Generator().manual_seed(0))
    corrupted = normalise(broken, cfg)
    with torch.no_grad():
        clean_logit, corrupted_logit = (float(model(x)[0, a.top_class]) for x in (a.x, corrupted))
    per_side = -(-g // region)
    restored = np.zeros((per_side, per_side))
    rows = np.arange(g)[:, None] // region * per_side + np.arange(g)[None, :] // region  # each patch's region
    for r in range(per_side * per_side):
        restored.flat[r] = float(hooked_class_stage(model, a.x, corrupted, (rows == r).ravel())[a.top_class])
    restored -= corrupted_logit
    gap = clean_logit - corrupted_logit
    figure = out[p.mx_tokens]
    attention_z, restored_z = np.array(figure.data[0].z), np.array(figure.data[1].z)
    shown = restored / gap if abs(gap) >= 1 else restored  # shares, or Δlogits when the gap is too small
    np.testing.assert_allclose(restored_z, shown.ravel()[rows], atol=1e-4)
    # the class attention per region: the analysis' maps (the model's own softmax), summed region by region
    attention = np.zeros((per_side, per_side))
    np.add.at(attention.ravel(), rows.ravel(), a.ca_maps.mean((0, 1)).ravel())
    np.testing.assert_allclose(attention_z, attention.ravel()[rows], atol=1e-5)
    if abs(gap) >= 1:  # the correlations are withheld with the shares (test_correlations_are_withheld_...)
        assert f"{spearman(attention, restored):+.2f} (restored)" in figure.layout.title.text
    assert Image.open(out[p.mx_second]).size == a.view.size and out[
        p.mx_msg
    ] == handlers.tabs.mechanisms.runs.small_gap_note(gap)
    # both signed panels by the one colour convention, on one scale
    bound = max(np.abs(restored_z).max(), np.abs(np.array(figure.data[2].z)).max())
    assert all(signed_by_the_convention(trace, bound) for trace in figure.data[1:])


def test_an_internal_error_inside_analyze_is_one_internal_error_line_with_the_traceback_logged(
    setup, monkeypatch, caplog
):
    """A bug inside an explanation /analyze calls (a RuntimeError injected into the logit lens) answers one line
    saying an internal error happened, never the bug's text nor a caller's-mistake line, with its traceback in
    the server's log."""
    import logging

    from app.shared import INTERNAL_ERROR

    handlers, loaded, _, examples = setup

    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch in a bug")

    monkeypatch.setattr(explain, "logit_lens", broken)
    caplog.set_level(logging.INFO, logger="cait.app")
    with pytest.raises(gr.Error) as raised:
        Analyze(handlers.cache, loaded.choice).analyze({"path": examples[0]}, logit_lens=True)
    said = raised.value.message
    assert said == INTERNAL_ERROR.replace("**", "") and "\n" not in said and "shape mismatch" not in said
    (logged,) = [r for r in caplog.records if r.exc_info]
    assert logged.levelno == logging.ERROR and isinstance(logged.exc_info[1], RuntimeError)
    assert "refused" not in caplog.text  # not logged as a caller's mistake


def test_analyze_answers_token_patching_by_keyword_as_the_library_computes_it(setup):
    handlers, loaded, a, examples = setup
    model, cfg = loaded.model, loaded.model.cfg
    analyze = Analyze(handlers.cache, loaded.choice).analyze
    out = analyze({"path": examples[0]}, token_patching="gaussian_noise:5", token_region=3.0)["token_patching"]
    broken = corrupt(view_pixels(a.view)[None], "gaussian_noise", 5, generator=torch.Generator().manual_seed(0))
    want = explain.token_patching(model, a.x, normalise(broken, cfg), torch.tensor([a.top_class]), region=3)
    np.testing.assert_allclose(out["restored"], want.restored[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(out["broken"], want.broken[0].numpy(), atol=1e-5)
    assert out["gap"] == pytest.approx(float(want.gap[0]), abs=1e-5) and out["region"] == 3
    assert (out["corruption"], out["severity"], out["target"]) == ("gaussian_noise", 5, a.top_class)
    attention = np.zeros(want.restored.shape[1:])
    rows = np.arange(cfg.grid_size)[:, None] // 3 * attention.shape[0] + np.arange(cfg.grid_size)[None, :] // 3
    np.add.at(attention.ravel(), rows.ravel(), a.ca_maps.mean((0, 1)).ravel())
    np.testing.assert_allclose(out["attention"], attention, atol=1e-5)
    rho = spearman(attention, want.restored[0].numpy()) if abs(float(want.gap[0])) >= 1 else None  # withheld
    assert out["rank_correlation"]["restored"] == (None if rho is None else pytest.approx(rho))
    fraction = out["restored_fraction"]
    assert (fraction is None) == (abs(out["gap"]) < 1) and "layout" in out
    assert "token_patching" not in analyze({"path": examples[0]})  # opt-in


@pytest.mark.parametrize("region", [0, 99, 1.5, "two", True])
def test_a_bad_token_region_is_refused_in_one_line_before_any_work(setup, region, monkeypatch):
    handlers, loaded, _, examples = setup
    monkeypatch.setattr(session, "analyse", lambda *a, **k: pytest.fail("analysed before the region was checked"))
    with pytest.raises(gr.Error) as refused:
        Analyze(handlers.cache, loaded.choice).analyze(
            {"path": examples[0]}, token_patching="contrast:5", token_region=region
        )
    high = loaded.cfg.grid_size  # the page slider's maximum for this model
    assert (
        str(refused.value.message) == f"token_region must be a whole number of patches from 1 to {high}, got {region!r}"
    )
    slider = handlers.tabs.mechanisms.opened(loaded.choice, None, None)[handlers.p.mx_region]
    assert (slider.minimum, slider.maximum) == (1, high)


def test_the_stated_token_cost_counts_token_patching_as_a_flop_counter_does(setup):
    """The cost said before a token map: token patching's own work (both runs, then the class token's path per
    region and direction) over a forward's, both counted by torch's FLOP counter (an independent count)."""
    from torch.utils.flop_counter import FlopCounterMode

    handlers, loaded, a, _ = setup
    model, cfg = loaded.model, loaded.model.cfg

    def counted(fn) -> int:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            fn()
        return counter.get_total_flops()

    target = torch.tensor([a.top_class])
    patching = counted(lambda: explain.token_patching(model, a.x, a.x.flip(-1), target, region=2))
    whole = counted(lambda: model(a.x))
    regions = (-(-cfg.grid_size // 2)) ** 2
    line = handlers.tabs.mechanisms.token_cost(a.choice, a, 2)[handlers.p.mx_token_cost]
    forwards = patching / whole
    assert f"at least {forwards:.1f} forward passes" in line and f"{regions} regions" in line
    # it runs in fp32: a bf16 session's forward is turned into fp32's time by the start-up probe's ratio
    probed = PrecisionChoice(torch.bfloat16, "measured now", "why", bf16_speedup=0.8)
    bf16 = dataclasses.replace(loaded, dtype=torch.bfloat16, precision=probed)
    said = mechanisms_view.token_cost(bf16, 2, 0.5)
    assert f"at least {forwards * 0.5 * 0.8:.1f} s" in said and "fp32 ran 1.25x faster than bf16" in said


def test_the_long_runs_progress_ends_at_its_total_and_a_stop_ends_them_clearing_old_results(setup):
    handlers, loaded, a, _ = setup
    p, tab = handlers.p, handlers.tabs.mechanisms
    seen: list[tuple[int, int]] = []
    progress = lambda done_total, **kw: seen.append(done_total)  # noqa: E731
    patch(handlers, a, progress=progress)
    assert seen[-1] == (mechanisms_view.patching_runs(loaded.cfg),) * 2 and len(seen) == seen[-1][0]
    seen.clear()
    region = 2
    drawn = tokens(handlers, a, mx_region=region, progress=progress)
    total = mechanisms_view.token_runs(loaded.cfg, region)
    assert seen[-1] == (total, total) and p.mx_tokens in drawn
    # a Stop pressed while the run waits (asked: its button) stops it when it starts; the earlier map and bars
    # are emptied
    tab.runs.token_stops.arm(None)
    tab.runs.token_stops.press(None)
    stopped = tokens(handlers, a, mx_region=region, progress=progress)
    assert stopped[p.mx_msg].startswith("**Stopped:**") and stopped[p.mx_tokens] is None
    tab.runs.patch_stops.arm(None)
    tab.runs.patch_stops.press(None)
    stopped = patch(handlers, a, progress=progress)
    assert stopped[p.mx_msg].startswith("**Stopped:**") and stopped[p.mx_patch] is None
    assert not tab.runs.patch_stops.running(None) and not tab.runs.token_stops.running(None)  # each ended
    tab.runs.token_stops.arm(None)  # asked after the Stop: it runs
    assert p.mx_tokens in tokens(handlers, a, mx_region=region, progress=progress)


def test_a_view_beside_a_token_patching_run_whose_stop_was_pressed_answers(setup, monkeypatch):
    """The run's Stop and progress hook the shared model (`counted_runs`): another page's view of it, served on
    the quick lane while the run is held inside its hooks with its Stop pressed, answers as it does alone
    (neither the Stop's exception nor the run's progress count reaches it), and the run ends Stopped."""
    import threading
    from types import SimpleNamespace

    from app import torch_thread

    handlers, loaded, a, examples = setup
    tab, p = handlers.tabs.mechanisms, handlers.p
    alone = torch_thread.call(session.analyse, loaded, examples[1]).probs
    inside, release, seen = threading.Event(), threading.Event(), []
    real = mechanisms_view.token_numbers

    def held(*args, **kw):  # the run, inside its hooks, waits for the test's gate
        inside.set()
        assert release.wait(60)
        return real(*args, **kw)

    monkeypatch.setattr(mechanisms_view, "token_numbers", held)
    request, answer = SimpleNamespace(session_hash="running-page"), {}
    tab.runs.token_stops.arm(request)
    progress = lambda done_total, **kw: seen.append(done_total)  # noqa: E731
    run = lambda: answer.update(out=tokens(handlers, a, request=request, progress=progress))  # noqa: E731
    runner = threading.Thread(target=run)
    runner.start()
    try:
        assert inside.wait(60)
        tab.runs.token_stops.press(request)
        beside = torch_thread.call(session.analyse, loaded, examples[1])  # another page's view, same model
    finally:
        release.set()
        runner.join(60)
    np.testing.assert_array_equal(beside.probs, alone)
    assert seen == [] and answer["out"][p.mx_msg].startswith("**Stopped:**")


def test_opening_the_tab_for_another_model_gives_its_controls_values_it_takes(setup):
    """N34: the page's example menu, heads and region slider hold values of the model they were built for; the
    tab, opened for another model, sets values that model's choices hold (the next event's input check passes)."""
    handlers, loaded, _, _ = setup
    p, tab = handlers.p, handlers.tabs.mechanisms
    other = handlers.cache.get(ModelChoice(name="cait_nano_28", checkpoint=None))  # a 7 x 7 grid, pico's is 4 x 4
    heads = other.cfg.depth_token_only * other.cfg.num_heads
    out = tab.opened(loaded.choice, None, None, other.examples[1][0], other.cfg.grid_size, [0, heads - 1])
    paths = [path for path, _ in loaded.examples]
    assert out[p.mx_example].value == paths[0] and [c for _, c in out[p.mx_example].choices] == paths
    assert (out[p.mx_region].maximum, out[p.mx_region].value) == (loaded.cfg.grid_size,) * 2
    assert out[p.mx_heads].value == [0] and heads - 1 >= loaded.cfg.depth_token_only * loaded.cfg.num_heads
    # the same model: the page's values stay
    kept = tab.opened(loaded.choice, None, None, paths[2], 2, [1])
    assert (kept[p.mx_example].value, kept[p.mx_region].value, kept[p.mx_heads].value) == (paths[2], 2, [1])


def test_correlations_are_withheld_with_the_shares_when_the_gap_is_too_small(setup):
    """Item 59.20: a corrupted run the model scores as the clean one (gap 0): no shares, and no rank correlation
    in the numbers or the title (there it read "+0.45" on random weights)."""
    _, loaded, a, _ = setup
    numbers = mechanisms_view.token_numbers(loaded.model, a.x, a.x.clone(), a.top_class, region=2)
    assert numbers["gap"] == pytest.approx(0, abs=1e-4) and numbers["restored_fraction"] is None
    assert numbers["rank_correlation"] == {"restored": None, "broken": None} and numbers["agreement"] is None
    title = mechanisms_view.token_map_figure(numbers, a.view, label="x").layout.title.text
    assert "no rank correlation" in title and "n/a" not in title and "rank correlation with" not in title
    # polish of 59: the signed maps read over a red garment, and their colour bar says what it measures
    figure = mechanisms_view.token_map_figure(numbers, a.view, label="x")
    assert figure.data[1].opacity >= 0.85 and figure.data[2].colorbar.title.text == "restored or broken (Δlogit)"


def test_the_token_map_says_how_much_restoration_the_top_attention_regions_hold(setup):
    """Item 59.19: with a gap large enough for shares, the token map's numbers and title give the share of the
    restoration inside the top-attention regions and the top regions' overlap (`cait.explain.agreement`, tested
    against hand counts there), beside the rank correlation over all regions."""
    from dataclasses import asdict

    from cait.explain.agreement import map_agreement

    _, loaded, a, _ = setup
    black = torch.zeros_like(a.x)
    numbers = mechanisms_view.token_numbers(loaded.model, a.x, black, a.top_class, region=2)
    numbers["gap"] = max(numbers["gap"], 2.0)  # shares, whatever this random model's gap
    for name in ("restored", "broken"):
        numbers[f"{name}_fraction"] = (np.array(numbers[name]) / numbers["gap"]).tolist()
    numbers["agreement"] = asdict(map_agreement(numbers["attention"], numbers["restored"]))
    numbers["rank_correlation"] = {"restored": 0.25, "broken": -0.5}
    title = mechanisms_view.token_map_figure(numbers, a.view, label="x").layout.title.text
    got = numbers["agreement"]
    held = "nothing restored" if got["share_in_top"] is None else f"holds {got['share_in_top']:.0%} of the restoration"
    assert f"the top {got['top']} of {got['regions']} regions by attention {held}" in title
    assert f"(chance {got['top'] / got['regions']:.0%})" in title and "+0.25 (restored)" in title


def test_shares_are_withheld_when_the_gap_is_too_small():
    """Below a gap of one logit the patching figures give Δlogits and say why; above it, shares."""
    from cait.figures.mechanisms import heads_plotly, patching_plotly

    branches, heads = np.array([[0.2, -0.1], [0.3, 0.05]]), np.array([[0.1, -0.2]])
    for gap, said in ((0.4, "gap too small for a share"), (2.0, "10% of the gap")):
        bars = patching_plotly(branches, gap, class_token=np.zeros(0), depth=1, ca_depth=1, title="t").data
        assert said in bars[0].hovertext[0]
        grid = heads_plotly(heads, gap, title="t").data[0]
        assert grid.text[0][0] == ("+0.10" if gap < 1 else "5%")
    # a tiny negative share is "0%", not "-0%" (polish of 59)
    tiny = heads_plotly(np.array([[-0.001, 0.3]]), 2.0, title="t", ci95=np.array([[[-0.004, 0.002], [0.1, 0.2]]]))
    assert tiny.data[0].text[0][0] == "0%<br>[0%, 0%]"


# ---------------------------------------------------------------------------------------------------------------
# /analyze's sections of many passes on the long lane; the download holds token patching


def test_analyze_computes_the_causal_view_and_both_patchings_on_the_long_lane_to_the_tabs_numbers(setup):
    """/analyze's causal numbers, activation and token patching run every block on the long lane (as the tabs
    compute them: never on the quick lane that draws the pages' views), the rest of the answer on the quick
    lane; its causal numbers are the Causal tab's, and the library's."""
    from app import api

    handlers, loaded, _, examples = setup
    model, a = loaded.model, session.analyse(loaded, examples[1])
    sections = dict(causal=True, patching="contrast:5", token_patching="contrast:5", token_region=2)
    with Blocks(model) as ran:
        out = Analyze(handlers.cache, loaded.choice).analyze({"path": examples[1]}, **sections)
    # the blocks each part runs, counted on this thread
    plain = dict(method="", target=-1, logit_lens=False, seed=0, **explain.MethodOptions().as_dict())
    with Blocks(model) as quick:
        api.answer_now(loaded, examples[1], api.checked_call(loaded, causal=False, patching="", **plain))
    with Blocks(model) as long:
        api.answer(loaded, examples[1], **plain, **sections)
    assert len(long.ran) > 2 * len(quick.ran)  # the sections are the long part
    on_long = [n for n in ran.ran if n.startswith("cait-long")]
    on_quick = [n for n in ran.ran if n.startswith("cait-torch")]
    assert len(on_long) == len(long.ran) - len(quick.ran) and len(on_quick) == len(quick.ran)
    assert len(ran.ran) == len(long.ran)  # no block anywhere else
    # the Causal tab's numbers (its view on the long lane too), and the library's
    handlers.tabs.causal.kept = causal_view.Kept()
    handlers.tabs.causal.opened(a.choice, a, None)
    assert out["causal"] == a.causal
    t = torch.tensor([a.top_class])
    dla = explain.direct_logit_attribution(model, a.x, t)
    np.testing.assert_allclose(out["causal"]["heads"], dla.heads[0].numpy(), atol=1e-5)
    knockout = explain.knockout_profile(model, a.x, t, shared_prefix=False)[0].numpy()
    np.testing.assert_allclose([b["knockout_delta_logit"] for b in out["causal"]["blocks"]], knockout, atol=1e-5)
    assert list(out)[-3:] == ["causal", "patching", "token_patching"]  # the sections in the answer's order


def test_the_download_holds_the_tabs_token_patching_as_analyze_gives_it(setup):
    """The token map drawn is kept for the JSON download, in /analyze's layout (the same numbers for the same
    image, class, corruption and region), and stays when the tab's other runs rewrite the file."""
    handlers, loaded, _, examples = setup
    p, a = handlers.p, session.analyse(loaded, examples[2])
    read = lambda out: json.loads(Path(out[p.json_file]).read_text())  # noqa: E731
    target = int(np.argsort(a.probs)[-2])
    drawn = read(tokens(handlers, a, mx_class=target, mx_corruption="contrast", mx_severity=4, mx_region=2))
    asked = Analyze(handlers.cache, loaded.choice).analyze(
        {"path": examples[2]}, target=target, token_patching="contrast:4", token_region=2
    )
    assert drawn["token_patching"] == asked["token_patching"] and "token_patching" not in drawn["not_computed"]
    patched = read(patch(handlers, a, mx_class=target))  # another run of the tab rewrites the file
    assert patched["token_patching"] == asked["token_patching"] and "patching" in patched
    fresh = json.loads(Path(session.numbers_file(loaded, session.analyse(loaded, examples[2]))).read_text())
    assert "Mechanisms tab" in fresh["not_computed"]["token_patching"]  # not run: how to get it
