"""The Causal tab's plain functions (app.causal_view), without a server: its numbers are cait.explain's,
its figures show them, and a head's ablation moves the top-5 as the model with that head zeroed does."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace

import gradio as gr
import numpy as np
import pytest
import torch
from conftest import randomise_
from PIL import Image

import cait
from app import causal_view, choices
from app.shared import CAUSAL_TAB, CLASS_ATTENTION_TAB, Look
from app.tabs.dataset import AtlasPlaces
from cait import explain
from cait.data import read_examples
from cait.explain.maps import DEFAULT_SHARE
from cait.preprocess import class_names
from cait.runtime import PrecisionChoice


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = randomise_(cait.load_model("cait_pico_32", weights=False, depth=3).model).eval()
    paths = [str(e.path) for e in read_examples()[:4]]
    batch = causal_view.reference_batch(paths, model.cfg)
    return model, batch[:1], batch


def test_view_adds_up_and_matches_the_model(setup):
    model, x, _ = setup
    logits = model(x)[0]
    target = int(logits.argmin())  # any class, not only the top one
    view = causal_view.compute(model, x, target)
    cfg = model.cfg
    assert view.heads.shape == (cfg.depth_token_only, cfg.num_heads)
    assert view.patches.shape == (cfg.depth_token_only, cfg.num_heads, cfg.grid_size, cfg.grid_size)
    assert view.logit == pytest.approx(logits[target].item(), abs=1e-5)
    assert sum(view.parts.values()) == pytest.approx(view.logit, abs=1e-4)
    assert len(view.knockout) == len(view.gamma["both"]) == cfg.depth + cfg.depth_token_only
    bars = causal_view.head_figure(view, "x")
    for layer in range(cfg.depth_token_only):  # per layer: the direct write, then the effect of removal beside it
        direct, removed = bars.data[2 * layer : 2 * layer + 2]
        assert list(direct.y) == pytest.approx(view.heads[layer].tolist())
        assert direct.name == f"CA{layer + 1} direct write"
        assert removed.name == f"CA{layer + 1} effect of removal (zero ablation)"
        after = explain.all_head_ablations(model, x)[0, layer, :, target] - logits[target]
        assert list(removed.y) == pytest.approx(after.tolist(), abs=1e-5)
    waterfall = bars.data[-1]  # the logit built from its parts: the last bar is their total, the logit
    assert waterfall.x[-1] == "logit" and waterfall.y[-1] == pytest.approx(view.logit, abs=1e-4)
    assert sum(waterfall.y[:-1]) == pytest.approx(view.logit, abs=1e-4)
    assert list(waterfall.x[:-1]) == list(view.parts)
    assert waterfall.x[1] == "CA1 heads" and waterfall.y[1] == pytest.approx(float(view.heads[0].sum()))
    ko = causal_view.knockout_figure(view, cfg)
    assert [*ko.data[0].y, *ko.data[1].y] == pytest.approx(view.knockout.tolist())  # SA bars, then CA bars
    # the legend's mark of each stage is its bars' colour
    assert [d.marker.color for d in ko.data[:2]] == ["#1f77b4", "#d62728"] and "CA" in ko.data[1].name
    # the |gamma| line follows what is knocked out: both gammas, gamma_1 (attention) or gamma_2 (MLP)
    blocks = [*model.blocks, *model.blocks_token_only]
    for knockout, names in (("whole block", ("gamma_1", "gamma_2")), ("MLP branch", ("gamma_2",))):
        want = [torch.cat([getattr(b, n).detach().abs() for n in names]).mean().item() for b in blocks]
        line = causal_view.knockout_figure(view, cfg, view.knockout, knockout).data[2]
        assert list(line.y) == pytest.approx(want) and line.yaxis == "y2"
        assert line.name == f"mean |{', '.join(names)}| (right axis)"
    attention = causal_view.knockout_figure(view, cfg, view.knockout, "attention branch").data[2]
    assert list(attention.y) == pytest.approx([b.gamma_1.detach().abs().mean().item() for b in blocks])
    maps = causal_view.maps_figure(view, torch.rand(cfg.grid_size, cfg.grid_size).numpy(), 1, 0)
    assert (maps.data[1].z == view.patches[1, 0]).all()
    # over the image, hovers numbered from 1 as the rest of the app ("row 14, column 12")
    image = Image.new("RGB", (cfg.img_size, cfg.img_size), "gray")
    maps = causal_view.maps_figure(view, torch.rand(cfg.grid_size, cfg.grid_size).numpy(), 1, 0, image)
    assert len(maps.layout.images) == 2 and all(list(d.x) == list(range(1, cfg.grid_size + 1)) for d in maps.data)
    assert all(d.hovertemplate.startswith("row %{y}, column %{x}") for d in maps.data)
    # the waterfall's colours say what the maps' do: red for the class, blue against it
    assert waterfall.increasing.marker.color == "#d6604d" and waterfall.decreasing.marker.color == "#4393c3"
    # an untrained model's tiny negative writes read 0.00, not -0.00
    tiny = dataclasses.replace(view, logit=-1e-4, heads=np.full_like(view.heads, -1e-5))
    assert "(0.00; the heads directly: 0.00)" in causal_view.head_figure(tiny, "x").layout.title.text


def test_numbers_are_json_and_hold_every_heads_ablation(setup):
    model, x, _ = setup
    view = causal_view.compute(model, x, 3)
    data = json.loads(json.dumps(causal_view.numbers(model, x, view)))
    assert [(b["stage"], b["index"]) for b in data["blocks"]][-1] == ("ca", model.cfg.depth_token_only)
    width = model.cfg.embed_dim // model.cfg.num_heads
    twin = cait.load_model("cait_pico_32", weights=False, depth=3).model
    twin.load_state_dict(model.state_dict())
    twin.eval()

    def zero_head(module, args):  # CA2 head 1's slice of attn.proj's input
        o = args[0].clone()
        o[..., :width] = 0
        return (o,)

    twin.blocks_token_only[1].attn.proj.register_forward_pre_hook(zero_head)
    after = twin(x)[0]
    assert data["head_ablation_zero"]["delta_logit"][1][0] == pytest.approx(
        (after[3] - model(x)[0, 3]).item(), abs=1e-5
    )
    assert data["head_ablation_zero"]["top1"][1][0] == int(after.argmax())


def test_ablation_top5_before_and_after(setup):
    model, x, reference = setup
    labels = tuple(class_names(model.cfg))
    zero = causal_view.ablation(model, x, layer=0, head=1, labels=labels)
    probs = model(x)[0].softmax(-1)
    assert [p["index"] for p in zero["before"]] == probs.topk(5).indices.tolist()
    assert len(zero["after"]) == 5 and zero["after"] != zero["before"]
    mean = causal_view.ablation(model, x, layer=0, head=1, labels=labels, reference=reference)
    assert mean["before"] == zero["before"] and mean["after"] != zero["after"]
    page = choices.top5_html(zero, "without CA1 head 2 <&>")
    assert "without CA1 head 2 &lt;&amp;&gt;" in page and page.count("<tr>") == 6


def test_a_mean_ablation_averages_over_the_models_examples_and_a_zero_one_over_nothing(setup):
    model = setup[0]
    examples = [(str(e.path), f"caption {i}") for i, e in enumerate(read_examples()[:3])]
    loaded = SimpleNamespace(examples=examples, cfg=model.cfg, device=torch.device("cpu"))
    assert causal_view.ablation_reference(loaded, causal_view.ABLATIONS[0]) is None
    mean = causal_view.ablation_reference(loaded, causal_view.ABLATIONS[1])
    assert torch.equal(mean, causal_view.reference_batch([path for path, _ in examples], model.cfg))
    assert causal_view.ablation_reference(SimpleNamespace(examples=[]), causal_view.ABLATIONS[1]) is None


# ------------------------------------------------------------------------------ wired into the page


@pytest.fixture(scope="module")
def handlers():
    from app_tabs import page_under_test

    from app.loading import load_page_model
    from app.models import ModelCache, ModelChoice

    cache = ModelCache(load_page_model, max_bytes=2**30, device=torch.device("cpu"))
    return page_under_test(cache, ModelChoice("cait_pico_32", random_init=True))  # components only: no server


def test_the_download_keeps_the_saliency_maps_when_the_causal_tab_adds_its_numbers(handlers):
    from app import session

    p, loaded = handlers.p, handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(read_examples()[0].path))
    look = dict(cmap="inferno", alpha=0.5, view="smooth", sal_score=False)
    steps = list(
        handlers.tabs.saliency.run(choice=loaded.choice, analysis=a, sal_class=2, sal_methods=["saliency"], **look)
    )
    assert list(json.loads(open(steps[-1][p.json_file]).read())["saliency"][0]["methods"]) == ["saliency"]
    opened = handlers.tabs.causal.opened(loaded.choice, a, None)  # rewrites the download with the causal numbers
    data = json.loads(open(opened[p.json_file]).read())
    assert data["causal"]["target"] == a.top_class and list(data["saliency"][0]["methods"]) == ["saliency"]
    assert list(data["not_computed"]) == ["logit_lens", "patching", "token_patching"]  # the Mechanisms tab's


def test_the_tab_follows_the_image_the_class_and_the_head(handlers):
    from app import session
    from app.choices import region_choices

    p, loaded = handlers.p, handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(read_examples()[0].path))
    region_of = region_choices(loaded.cfg)[0]
    look = dict(cmap="inferno", alpha=0.5, scale="per tile", view="smooth", keep=1.0, th_layer=1, th_row=2, th_col=2)
    details = lambda a: handlers.tabs.image.details(choice=loaded.choice, analysis=a, region_of=region_of, **look)
    # the follow-up leaves the Causal tab (and its numbers in the JSON) to the tab, and another tab open leaves it
    # until it is opened
    out = details(a)
    assert not set(out) & set(handlers.page.causal.computed) and a.causal is None
    assert not set(handlers.tabs.image.follow_up(loaded.choice, a, CLASS_ATTENTION_TAB)) & set(
        handlers.page.causal.computed
    )
    assert a.causal is None
    # the region of focus holds its own share of the mass (half), not the tiles' "keep all"
    assert out[p.sal_region].label.endswith(f"{DEFAULT_SHARE:.0%} of its attention mass") and look["keep"] == 1
    data = json.loads(open(out[p.json_file]).read())
    assert "causal" not in data and "Causal tab" in data["not_computed"]["causal"]
    opened = handlers.tabs.causal.opened(loaded.choice, a, None)
    assert opened[p.cz_state].target == a.top_class and "causal" in json.loads(open(opened[p.json_file]).read())
    assert isinstance(handlers.tabs.causal.opened(loaded.choice, a, opened[p.cz_state]), type(gr.skip()))  # on show
    # the Causal tab open: the open tab's follow-up computes it, after the details
    a = session.analyse(loaded, str(read_examples()[0].path))
    assert details(a)[p.cz_head] == 0
    out = handlers.tabs.image.follow_up(loaded.choice, a, CAUSAL_TAB)
    view = out[p.cz_state]
    assert view.target == a.top_class
    data = json.loads(open(out[p.json_file]).read())["causal"]
    assert data["target"] == a.top_class and np.allclose(data["heads"], view.heads)
    assert all(out[c] is not None for c in (p.cz_heads_plot, p.cz_maps, p.cz_top5, p.cz_knockout))
    other = handlers.tabs.causal.choose_class(
        choice=loaded.choice, analysis=a, cz_class=(a.top_class + 1) % 10, cz_head=3, cz_mode=causal_view.ABLATIONS[0]
    )
    assert other[p.cz_state].target == (a.top_class + 1) % 10
    heads = loaded.cfg.num_heads
    picked = handlers.tabs.causal.figures.head(  # CA2 head 2
        choice=loaded.choice, analysis=a, cz_state=view, cz_head=heads + 1, cz_mode=causal_view.ABLATIONS[1]
    )
    assert "without CA2 head 2" in picked[p.cz_top5] and set(picked) == {p.cz_maps, p.cz_top5}
    assert out[p.cz_knockout_of] == "whole block"  # a new view starts with whole blocks knocked out
    mlp = handlers.tabs.causal.knockout(choice=loaded.choice, analysis=a, cz_state=view, cz_knockout_of="MLP branch")[
        p.cz_knockout
    ]
    expected = explain.knockout_profile(loaded.model, a.x, torch.tensor([view.target]), branch="mlp")[0]
    bars = lambda figure: np.concatenate([figure.data[0].y, figure.data[1].y])  # SA, then CA
    assert np.allclose(bars(mlp), expected.numpy(), atol=1e-5) and "gamma_2 is zeroed" in mlp.layout.title.text
    assert mlp.data[2].name.startswith("mean |gamma_2|")
    whole = handlers.tabs.causal.knockout(
        choice=loaded.choice, analysis=a, cz_state=view, cz_knockout_of="whole block"
    )[p.cz_knockout]
    assert np.allclose(bars(whole), view.knockout) and not np.allclose(view.knockout, expected.numpy())
    with pytest.raises(ValueError, match="knockout must be one of"):
        causal_view.branch_knockout(loaded.model, a.x, view, "the head")
    cleared = handlers.tabs.image.cleared(tuple(handlers.p.ca_props.value))
    assert all(cleared[c] is None for c in handlers.page.causal.computed)


def test_one_predicted_class_everywhere_also_under_ties(handlers):
    """Tied probabilities (bf16, an untrained model): the status, top-5, class pickers, saliency default and the
    causal target name the same class, the tied one with the lowest index."""
    import re

    from app import session
    from app.choices import region_choices

    p, loaded = handlers.p, handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(read_examples()[0].path))
    tied = np.array([1, 0, 0, 0, 0, 2, 2, 2, 1, 2], np.float32)  # np.argsort(-tied)[0] is 6, not 5
    a.probs = tied / tied.sum()
    first = 5
    look = ("inferno", 0.5, "per tile", "smooth", 1.0)
    shown = tuple(handlers.p.ca_props.value)
    out = handlers.tabs.image.first_view(loaded, a, Look(*look), shown, uploaded=False)
    assert f"**{loaded.labels[first]}**" in out[p.status]
    assert re.findall(r"top5-label'>([^<]*)<", out[p.top5])[0] == loaded.labels[first]
    details = handlers.tabs.image.details(
        choice=loaded.choice,
        analysis=a,
        region_of=region_choices(loaded.cfg)[0],
        **dict(zip(("cmap", "alpha", "scale", "view", "keep"), look)),
        th_layer=1,
        th_row=2,
        th_col=2,
    )
    assert details[p.sal_class].value == details[p.cz_class].value == first
    causal = handlers.tabs.image.follow_up(loaded.choice, a, CAUSAL_TAB)
    assert causal[p.cz_state].target == first
    assert json.loads(open(causal[p.json_file]).read())["causal"]["target"] == first
    run = list(
        handlers.tabs.saliency.run(
            choice=loaded.choice,
            analysis=a,
            sal_class=None,
            sal_methods=["ca1_mean"],
            cmap="inferno",
            alpha=0.5,
            view="smooth",
            sal_score=False,
            sal_topk=2,
        )
    )
    assert [c["target"] for c in a.saliency] == [5, 6]
    assert json.loads(open(run[-1][p.json_file]).read())["saliency"][0]["target"] == first


def test_a_stated_cost_is_from_the_models_fastest_forward_so_far(handlers, monkeypatch):
    """The forward the tabs' stated costs multiply is the fastest analysis pass of the model so far: one pass
    slowed by a busy moment would overstate a floor."""
    from app import session

    loaded = handlers.cache.get(handlers.default)
    path = str(read_examples()[0].path)
    first = session.analyse(loaded, path).forward_seconds
    plain = loaded.model.forward_insights

    def slowed(*args, **kwargs):
        time.sleep(0.2 + 2 * first)
        return plain(*args, **kwargs)

    monkeypatch.setattr(loaded.model, "forward_insights", slowed)
    assert session.analyse(loaded, path).forward_seconds <= first == loaded.fastest_forward


def test_the_tab_says_its_cost_before_it_is_computed(handlers):
    from app import session, texts

    p, loaded = handlers.p, handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(read_examples()[0].path))
    assert a.forward_seconds > 0
    shown = tuple(p.ca_props.value)
    out = handlers.tabs.image.first_view(
        loaded, a, Look("inferno", 0.5, "per tile", "smooth", 1.0), shown, uploaded=False
    )
    # the passes said are the SA block runs the computation makes, counted, over the SA depth
    runs = []
    counting = [b.register_forward_hook(lambda *_: runs.append(1)) for b in loaded.model.blocks]
    try:
        causal_view.compute(loaded.model, a.x, a.top_class)
    finally:
        for handle in counting:
            handle.remove()
    passes = len(runs) / loaded.cfg.depth
    assert passes == causal_view.forward_passes(loaded.cfg)
    assert f"takes {passes:.0f} forward passes" in out[p.cz_cost] and "(" not in out[p.cz_cost]  # one hedge, no nesting
    assert f"at least {passes * a.forward_seconds:.1f} s" in out[p.cz_cost]  # the figures come on top
    assert all(out[c] is None for c in handlers.page.causal.computed)  # said, not computed
    assert handlers.tabs.image.cleared(shown)[p.cz_cost] == ""
    # a bf16 session's forward becomes the tab's fp32 passes by the start-up probe's ratio, whichever is faster
    for speedup, pace in ((2.5, "fp32 ran 2.50x slower than bf16"), (0.8, "fp32 ran 1.25x faster than bf16")):
        probed = PrecisionChoice(torch.bfloat16, "measured now", "why", bf16_speedup=speedup)
        bf16 = dataclasses.replace(loaded, dtype=torch.bfloat16, precision=probed)
        said = texts.cost_in_passes("Computing this tab", passes, 0.5, loaded=bf16)
        assert f"at least {passes * 0.5 * speedup:.1f} s" in said and "0.50 s in bf16" in said and pace in said
        assert "(" not in said
    unprobed = dataclasses.replace(loaded, dtype=torch.bfloat16, precision=PrecisionChoice(torch.bfloat16, "x", "y"))
    said = texts.cost_in_passes("Computing this tab", passes, 0.5, loaded=unprobed)
    assert f"at least {passes * 0.5:.1f} s if fp32 runs as fast as bf16, which this device has not timed" in said


def test_the_tab_tells_its_progress_by_phase_block_by_block_stops_and_goes_on_from_there(handlers):
    from app import session

    p, loaded, causal = handlers.p, handlers.cache.get(handlers.default), handlers.tabs.causal
    causal.kept = causal_view.Kept()  # nothing computed before
    blocks = loaded.cfg.depth + loaded.cfg.depth_token_only
    first_phase = causal_view.FIRST_PHASE_PASSES * loaded.cfg.depth  # SA block runs before the first knockout
    page = SimpleNamespace(session_hash="page-1")
    told = []
    a = session.analyse(loaded, str(read_examples()[0].path))
    out = causal.opened(loaded.choice, a, None, page, lambda done, **kw: told.append((*done, kw["desc"][:5])))
    phase_1 = [(k, first_phase, "attri") for k in range(first_phase + 1)]  # told before the first knockout
    assert told == phase_1 + [(k, blocks, "knock") for k in range(blocks + 1)] and out[p.cz_state] is not None
    assert out[p.cz_stop].interactive is False  # nothing runs any more
    whole = out[p.cz_state]

    def stop_after_two(done, **kw):  # the Stop button pressed once the second block is knocked out
        told.append((*done, kw["desc"][:5]))
        if told[-1] == (2, blocks, "knock"):
            causal.stops.press(page)

    # the Stop is heard before the next block the model runs, not after the pass under way
    causal.kept = causal_view.Kept()
    a = session.analyse(loaded, str(read_examples()[0].path))
    after_stop = []
    model_blocks = [*loaded.model.blocks, *loaded.model.blocks_token_only]
    told.clear()
    ran = [
        b.register_forward_hook(lambda *_: after_stop.append(told[-1] == (2, blocks, "knock"))) for b in model_blocks
    ]
    try:
        out = causal.opened(loaded.choice, a, None, page, stop_after_two)
    finally:
        for handle in ran:
            handle.remove()
    assert told[-3:] == [(k, blocks, "knock") for k in range(3)] and set(out) == {p.cz_cost, p.cz_stop}
    assert out[p.cz_cost].startswith("**Stopped** after 2 of") and a.causal is None
    assert after_stop and not any(after_stop)  # blocks ran before the Stop, none after it
    # opened again, it goes on from the third knockout (the first phase is not run again) to the whole view
    told.clear()
    out = causal.opened(loaded.choice, a, None, page, lambda done, **kw: told.append(done))
    assert told == [(k, blocks) for k in range(2, blocks + 1)]
    for field in ("heads", "patches", "removal", "knockout"):
        np.testing.assert_allclose(getattr(out[p.cz_state], field), getattr(whole, field), atol=1e-5)
    other = SimpleNamespace(session_hash="page-2")  # another page's Stop does not stop this one
    causal.stops.press(other)
    causal.kept = causal_view.Kept()
    assert causal.opened(loaded.choice, a, None, page, lambda done, **kw: None)[p.cz_state] is not None


@contextmanager
def lane_held_by_another_page():
    """Inside, the long lane runs another page's work until the release it yields is set (at the latest when the
    block ends)."""
    from app import torch_thread

    held, release = threading.Event(), threading.Event()

    def other_work() -> None:
        held.set()
        assert release.wait(60)

    holder = threading.Thread(target=torch_thread.call_long, args=(other_work,))
    holder.start()
    assert held.wait(60)
    try:
        yield release
    finally:
        release.set()
        holder.join(60)


def test_a_stop_pressed_while_the_tab_waits_for_the_long_lane_stops_it_when_it_starts(handlers):
    """The long lane held by another page's long work, the tab asked for (armed at once, off the queue, as
    opening it does), Stop pressed while the computation waits, the lane released: it stops before its first
    block. The page's next request computes."""
    import time

    from app import session

    p, loaded, causal = handlers.p, handlers.cache.get(handlers.default), handlers.tabs.causal
    causal.kept = causal_view.Kept()
    a = session.analyse(loaded, str(read_examples()[0].path))
    page = SimpleNamespace(session_hash="waiting")
    with lane_held_by_another_page() as release:
        causal.stops.will_compute(loaded.choice, a, None, page)  # the tab opened
        answer = {}
        waiting = threading.Thread(
            target=lambda: answer.update(out=causal.opened(loaded.choice, a, None, page, lambda *_, **__: None))
        )
        waiting.start()
        time.sleep(0.2)  # the computation waits for the lane
        assert "out" not in answer
        causal.stops.press(page)
        release.set()
        waiting.join(120)
    blocks = loaded.cfg.depth + loaded.cfg.depth_token_only
    said = f"**Stopped** after 0 of {blocks} knockouts; open the tab again to go on from there."
    assert answer["out"][p.cz_cost] == said and a.causal is None
    causal.stops.will_compute(loaded.choice, a, None, page)  # opened again
    assert causal.opened(loaded.choice, a, None, page, lambda *_, **__: None)[p.cz_state] is not None


def test_the_tab_opened_before_a_new_images_chain_arms_keeps_its_view_and_stop_the_pick_cancels_the_last_one(
    handlers,
):
    """A user picks an image and opens the Causal tab before that image's event chain reaches its arming step
    (`new_image`, after the analysis and its details; under load the browser sends it late, with the open tab it
    knew then): that step neither cancels the view the tab asked for nor disables its Stop. The last image's view
    is cancelled by the pick itself (`moved_on`, at once, off the queues), and its answer then disables the Stop,
    as nothing of the page runs."""
    import time

    from app import session

    p, loaded, causal = handlers.p, handlers.cache.get(handlers.default), handlers.tabs.causal
    causal.kept = causal_view.Kept()
    a = session.analyse(loaded, str(read_examples()[0].path))
    page = SimpleNamespace(session_hash="picked-then-opened")

    def view_waiting_for_the_lane(release, before_release) -> dict:
        answer = {}
        waiting = threading.Thread(
            target=lambda: answer.update(out=causal.opened(loaded.choice, a, None, page, lambda *_, **__: None))
        )
        waiting.start()
        time.sleep(0.2)  # the computation waits for the lane
        done = before_release()
        release.set()
        waiting.join(120)
        return answer["out"], done

    with lane_held_by_another_page() as release:
        assert causal.stops.will_compute(loaded.choice, a, None, page)[p.cz_stop].interactive  # the tab opened
        out, late = view_waiting_for_the_lane(release, lambda: causal.stops.new_image(CLASS_ATTENTION_TAB, a, page))
    assert late.get(p.cz_stop, gr.Button(interactive=True)).interactive  # the Stop left enabled
    assert out[p.cz_state] is not None and out[p.cz_stop].interactive is False  # computed, then nothing runs
    # the page's next pick while its view waits: cancelled, nothing shown, the Stop disabled
    causal.kept = causal_view.Kept()
    with lane_held_by_another_page() as release:
        causal.stops.will_compute(loaded.choice, a, None, page)
        out, _ = view_waiting_for_the_lane(release, lambda: causal.stops.moved_on(page))
    assert set(out) == {p.cz_stop} and out[p.cz_stop].interactive is False


def test_a_pages_stop_is_dropped_when_the_page_closes_and_the_pages_kept_are_bounded(handlers):
    from app.stops import MAX_PAGES, PageStops
    from app.ui import compose, wire

    stops = PageStops()
    page = SimpleNamespace(session_hash="closing")
    stops.arm(page)
    stops.press(page)
    with stops.holding(page) as held:
        assert len(stops) == 1 and held.pressed()
    stops.drop(page)
    assert len(stops) == 0
    for k in range(MAX_PAGES + 5):
        stops.arm(SimpleNamespace(session_hash=f"page-{k}"))
    assert len(stops) == MAX_PAGES
    # the wired page drops a page's Stop when the page closes (Gradio's unload)
    demo, page_parts, tabs = compose(handlers.cache.get(handlers.default), handlers.cache, AtlasPlaces.of(None, None))
    wire(demo, page_parts, tabs, cache=handlers.cache, default=handlers.default)
    unloads = [fn for fn in demo.fns.values() if any(t[1] == "unload" for t in fn.targets)]
    dropped = [fn.fn for fn in unloads]
    assert tabs.causal.stops.drop in dropped and tabs.dataset.stops.drop in dropped  # every tab's Stops


def test_a_stop_stops_every_computation_of_its_page_asked_before_it_and_none_asked_after():
    """The one Stop convention (app.stops): nothing is consumed, so two computations of a page, running or
    waiting, both hear one Stop; a request asked after it, or another page's, does not; the Stop is needed while
    one of the page's computations runs. An ask fired twice for one choice and taken once leaves nothing going;
    a Stop pressed after an ask, before its handler started, stops it."""
    from contextlib import ExitStack

    from app.stops import PageStops

    stops, page, other = PageStops(), SimpleNamespace(session_hash="a"), SimpleNamespace(session_hash="b")

    def asked(where):  # a control asks (armed at once), then its handler starts (and holds until closed)
        stops.arm(where)
        stack = ExitStack()
        return stack, stack.enter_context(stops.holding(where))

    (s1, first), (s2, second), (s3, elsewhere) = asked(page), asked(page), asked(other)
    stops.press(page)
    s4, later = asked(page)
    assert first.pressed() and second.pressed() and not later.pressed() and not elsewhere.pressed()
    s1.close()
    assert first.still_needed  # the page's others run
    s2.close(), s4.close()
    assert not later.still_needed and not stops.running(page) and stops.running(other)
    stops.arm(page)  # a dropdown's input fired twice for one choice, its handler run once
    s5, twice = asked(page)
    stops.press(page)
    assert twice.pressed()
    s5.close()
    assert not stops.running(page)
    stops.arm(page)
    stops.press(page)  # pressed between the ask and its handler's start
    with stops.holding(page) as in_between:
        assert in_between.pressed()
    with stops.holding(page) as unasked:  # not asked by the page's controls: asked when it starts
        assert not unasked.pressed()
    s3.close()


def _progress_that_stops(causal, page, when):
    """A progress callback that presses the page's Stop once `when(done, total, desc)` holds; it records the
    (done, total) it saw."""
    seen = []

    def progress(done_total, **kw):
        seen.append(done_total)
        if when(*done_total, kw["desc"]):
            causal.stops.press(page)
            progress.pressed = True

    progress.seen, progress.pressed = seen, False
    return progress


def test_another_class_and_another_knockout_stop_with_the_tabs_stop_and_the_class_goes_on_from_there(handlers):
    """The class menu and the knockout radio compute on the long lane with the Causal view's Stop: armed at
    once (the Stop enabled), heard before the next block, the line saying how far it got, the Stop disabled
    once nothing of the page runs; another class, chosen again, goes on from its knockouts done."""
    from app import session

    p, loaded, causal = handlers.p, handlers.cache.get(handlers.default), handlers.tabs.causal
    causal.kept = causal_view.Kept()
    a = session.analyse(loaded, str(read_examples()[1].path))
    page = SimpleNamespace(session_hash="class-page")
    view = causal.opened(loaded.choice, a, None, page, lambda *_, **__: None)[p.cz_state]
    blocks = loaded.cfg.depth + loaded.cfg.depth_token_only
    other = (a.top_class + 1) % loaded.cfg.num_classes
    asked = dict(choice=loaded.choice, analysis=a, cz_class=other, cz_head=1, cz_mode=causal_view.ABLATIONS[0])
    armed = causal.stops.armed(loaded.choice, a, page)
    assert armed[p.cz_stop].interactive is True
    ran_after = []
    model_blocks = [*loaded.model.blocks, *loaded.model.blocks_token_only]
    progress = _progress_that_stops(causal, page, lambda done, _, desc: done == 2 and desc.startswith("knocking"))
    hooks = [b.register_forward_hook(lambda *_: ran_after.append(progress.pressed)) for b in model_blocks]
    try:
        out = causal.choose_class(page, progress, **asked)
    finally:
        for handle in hooks:
            handle.remove()
    said = f"**Stopped** after 2 of {blocks} knockouts; choose the class again to go on from there."
    assert out[p.cz_cost] == said and p.cz_state not in out and out[p.cz_stop].interactive is False
    assert ran_after and not any(ran_after)  # no block after the Stop
    # chosen again: from the third knockout to the whole view of that class
    seen = []
    causal.stops.armed(loaded.choice, a, page)
    out = causal.choose_class(page, lambda done, **kw: seen.append(done), **asked)
    assert out[p.cz_state].target == other and seen[0] == (2, blocks) and out[p.cz_stop].interactive is False
    np.testing.assert_allclose(
        out[p.cz_state].knockout, causal_view.compute(loaded.model, a.x, other).knockout, atol=1e-5
    )
    # the knockout profile of a branch: stopped at its first block
    causal.stops.armed(loaded.choice, a, page)
    progress = _progress_that_stops(causal, page, lambda done, *_: done == 1)
    asked = dict(choice=loaded.choice, analysis=a, cz_state=view, cz_knockout_of="MLP branch")
    out = causal.knockout(page, progress, **asked)
    said = "**Stopped:** the knockout profile of the MLP branch did not finish; choose it again to compute it."
    assert out[p.cz_cost] == said and p.cz_knockout not in out and progress.seen == [(1, blocks)]
    assert out[p.cz_stop].interactive is False and not causal.stops.running(page)


def test_a_stop_pressed_while_the_tabs_computations_wait_behind_other_long_work_stops_each_of_them(handlers):
    """The view, another class and another knockout, each asked (armed) while the long lane holds another
    page's work, then one Stop: each stops when it starts (none is lost to another that heard it first), and
    one asked after the Stop runs."""
    import time

    from app import session

    p, loaded, causal = handlers.p, handlers.cache.get(handlers.default), handlers.tabs.causal
    causal.kept = causal_view.Kept()
    a = session.analyse(loaded, str(read_examples()[2].path))
    page = SimpleNamespace(session_hash="queued-page")
    view = causal_view.compute(loaded.model, a.x, a.top_class)
    quiet = lambda *_, **__: None  # noqa: E731
    other = (a.top_class + 1) % loaded.cfg.num_classes
    asks = {
        "view": lambda: causal.opened(loaded.choice, a, None, page, quiet),
        "class": lambda: causal.choose_class(
            page, quiet, choice=loaded.choice, analysis=a, cz_class=other, cz_head=0,
            cz_mode=causal_view.ABLATIONS[0],
        ),
        "knockout": lambda: causal.knockout(
            page, quiet, choice=loaded.choice, analysis=a, cz_state=view, cz_knockout_of="attention branch"
        ),
    }  # fmt: skip
    answers, threads = {}, []
    with lane_held_by_another_page() as release:
        for name, ask in asks.items():
            causal.stops.armed(loaded.choice, a, page)  # asked (the tab opened, the menu, the radio)
            threads.append(threading.Thread(target=lambda n=name, f=ask: answers.update({n: f()})))
            threads[-1].start()
        time.sleep(0.5)  # each waits for the lane
        assert not answers
        causal.stops.press(page)
        release.set()
        for thread in threads:
            thread.join(120)
    blocks = loaded.cfg.depth + loaded.cfg.depth_token_only
    assert answers["view"][p.cz_cost].startswith(f"**Stopped** after 0 of {blocks} knockouts; open the tab")
    assert answers["class"][p.cz_cost].startswith(f"**Stopped** after 0 of {blocks} knockouts; choose the class")
    assert answers["knockout"][p.cz_cost].startswith("**Stopped:** the knockout profile of the attention branch")
    assert not any(c in out for out in answers.values() for c in (p.cz_state, p.cz_knockout))
    assert not causal.stops.running(page)
    # only the last one to end writes the Stop (disabled): the others' answers may reach the page after it
    written = [out[p.cz_stop] for out in answers.values() if p.cz_stop in out]
    assert len(written) == 1 and written[0].interactive is False
    causal.stops.armed(loaded.choice, a, page)  # asked after the Stop: it runs
    assert p.cz_state in asks["class"]() and a.causal is None


def signed_by_the_convention(trace, bound: float) -> bool:
    """Whether a heatmap trace draws its signed values by the one colour convention (`cait.figures.colours`):
    its diverging scale (red for the class), white at 0, symmetric about it."""
    import plotly.graph_objects as go

    from cait.figures.colours import signed_heatmap

    want = go.Heatmap(**signed_heatmap(bound))
    return (
        trace.colorscale == want.colorscale
        and not trace.reversescale
        and (trace.zmin, trace.zmid, trace.zmax) == (want.zmin, want.zmid, want.zmax)
    )


def test_the_per_patch_write_is_drawn_by_the_one_colour_convention(setup):
    model, x, _ = setup
    view = causal_view.compute(model, x, 1)
    g = model.cfg.grid_size
    maps = causal_view.maps_figure(view, np.ones((g, g)) / g**2, 1, 0)
    assert signed_by_the_convention(maps.data[1], float(np.abs(view.patches[1, 0]).max()))
    assert maps.data[0].colorscale != maps.data[1].colorscale  # attention (unsigned) keeps its own scale


def test_the_stop_keeps_its_label_whatever_the_arming_steps_answer(handlers):
    """Item 59.12: an event whose one output is the Stop answers it with a button or a skip, never an empty dict
    (Gradio takes a lone output's answer as its value: the Stop read "{}" after a new image while another tab
    was open). Checked through Gradio's own postprocessing of the wired page's arming step."""
    import asyncio

    from app import session
    from app.ui import compose, wire

    demo, page, tabs = compose(handlers.cache.get(handlers.default), handlers.cache, AtlasPlaces.of(None, None))
    wire(demo, page, tabs, cache=handlers.cache, default=handlers.default)
    loaded = handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(read_examples()[0].path))
    arming = [fn for fn in demo.fns.values() if fn.outputs == [page.causal.cz_stop] and fn.name == "new_image"]
    assert arming
    for open_tab in (CLASS_ATTENTION_TAB, CAUSAL_TAB):
        answer = tabs.causal.stops.new_image(open_tab, a, SimpleNamespace(session_hash="label"))
        sent = asyncio.run(demo.postprocess_data(arming[0], answer, None))[0]
        assert not (isinstance(sent, dict) and sent.get("value") not in (None, "Stop")), sent
        assert sent not in ("{}", {}), sent


def test_a_view_whose_page_moved_on_after_its_last_block_draws_nothing(handlers, monkeypatch):
    """Item 59.14: the page picks its next image while its Causal view draws its figures (past the last block,
    where the lane checks for a cancel): the view's answer is only the Stop, never the last image's figures
    drawn over the next image."""
    from app import session

    p, loaded, causal = handlers.p, handlers.cache.get(handlers.default), handlers.tabs.causal
    causal.kept = causal_view.Kept()
    a = session.analyse(loaded, str(read_examples()[0].path))
    session.sa_distance(loaded, a)  # its one pass done: writing the download runs no block of the model
    page = SimpleNamespace(session_hash="moved-on-while-drawing")
    written = session.numbers_file

    def picked_meanwhile(*args, **kwargs):
        causal.stops.moved_on(page)  # the pick arrives while the download is written, after every pass of the model
        return written(*args, **kwargs)

    monkeypatch.setattr(session, "numbers_file", picked_meanwhile)
    causal.stops.will_compute(loaded.choice, a, None, page)
    out = causal.opened(loaded.choice, a, None, page, lambda *_, **__: None)
    assert set(out) == {p.cz_stop} and out[p.cz_stop].interactive is False


def test_a_view_waiting_behind_another_pages_work_says_so_and_its_stop_is_heard_while_it_waits(handlers):
    """Item 59.17: the long lane held by another page's work (until the test releases it), the tab's view waits:
    its progress line says it waits behind other long work, and a Stop pressed then ends it at once, while the
    other page's work still runs; the lane goes on with that work."""
    import time

    from app import session

    p, loaded, causal = handlers.p, handlers.cache.get(handlers.default), handlers.tabs.causal
    causal.kept = causal_view.Kept()
    a = session.analyse(loaded, str(read_examples()[0].path))
    page = SimpleNamespace(session_hash="waiting-told")
    told: list[str] = []
    with lane_held_by_another_page() as release:
        causal.stops.will_compute(loaded.choice, a, None, page)  # the tab opened
        answer = {}
        progress = lambda *_, desc="", **__: told.append(desc)  # noqa: E731
        waiting = threading.Thread(
            target=lambda: answer.update(out=causal.opened(loaded.choice, a, None, page, progress))
        )
        waiting.start()
        for _ in range(600):
            if told:
                break
            time.sleep(0.05)
        assert told and told[0].startswith("waits: 1 long computation"), told
        causal.stops.press(page)
        waiting.join(30)
        assert not waiting.is_alive() and not release.is_set()  # ended while the other work still held the lane
    assert answer["out"][p.cz_cost].startswith("**Stopped**") and a.causal is None
