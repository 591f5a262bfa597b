"""The Compare tab's handlers on the page (components only, no server), the shipped 28-px model (A) against the
136-px one (B): what it shows is each model's own numbers (`cait.explain` on that model alone), a model against
itself differs nowhere, a compare run's files are what its figures show, its images open as the page's image,
and what cannot be compared is one calm line."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import numpy as np
import pytest
import torch

import cait
import cait.compare
from app import session
from app.loading import load_page_model
from app.models import ModelCache, ModelChoice
from app.tabs.class_attention import GalleryProps
from cait import explain
from cait.explain.layerscale import layerscale_stats

A, B = "cait_nano_28", "cait_micro_136"
SHOWN = tuple(GalleryProps(False, None, f"CA layer {i + 1}") for i in range(4))  # the galleries before an image
LOOK = dict(cmap="inferno", alpha=0.5, scale="per tile", view="smooth", keep=1.0, th_layer=1)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from app_tabs import page_under_test

    cache = ModelCache(load_page_model, max_bytes=2**30, device=torch.device("cpu"))
    app = page_under_test(cache, ModelChoice(A))
    loaded = cache.get(app.default)
    a = session.analyse(loaded, loaded.examples[0][0])
    run = tmp_path_factory.mktemp("compare") / "run"
    options = cait.compare.CompareOptions(
        a=cait.compare.Side(model=A), b=cait.compare.Side(model=B), data="fashion-mnist-scenes", out=run, limit=8,
        batch_size=4, shard_size=4, device="cpu",
    )  # fmt: skip
    cait.compare.run_compare(options)
    return SimpleNamespace(app=app, tab=app.tabs.compare, p=app.p, loaded=loaded, a=a, run=run)


def choose(world, variant=None, checkpoint=None) -> dict:
    world.tab.pages.of(None).run = None
    return world.tab.choose(
        choice=world.loaded.choice, analysis=world.a, cmp_variant=variant, cmp_checkpoint=checkpoint
    )


def test_model_b_beside_the_pages_model_shows_each_models_own_numbers(world):
    p, a = world.p, world.a
    out = choose(world, B)
    assert f"Model B: **{B}**" in out[p.cmp_msg] and "heads paired by layer and head" in out[p.cmp_msg]
    assert f"A: {A}" in out[p.cmp_top5] and f"B: {B}" in out[p.cmp_top5]
    models = (world.loaded.model, world.app.cache.get(ModelChoice(B)).model)
    xs = (a.x, session.model_input(world.loaded.examples[0][0], models[1].cfg)[2])
    heads = [min(m.cfg.num_heads for m in models)] * 2  # 3 heads of 4: paired by layer and head
    assert [c for _, c in out[p.cmp_heads]][:3] == ["A CA1 head 1", "B CA1 head 1", "grids differ: no difference map"]
    assert len(out[p.cmp_heads]) == 3 * sum(heads)
    bars = {bar.name: bar.y for bar in out[p.cmp_dla].data}
    for side, model, x in zip("AB", models, xs):
        dla = explain.direct_logit_attribution(model, x, a.top_class).heads[0]
        np.testing.assert_allclose(bars[side], dla[:, :3].reshape(-1).numpy(), rtol=1e-4, atol=1e-5)
        rows = layerscale_stats(model)
        gamma = [r["mean"] for r in rows if r["gamma"] == "gamma_1"]  # SA then CA, in depth order
        line = next(t for t in out[p.cmp_depth].data if t.name == f"{side} attention" and t.xaxis == "x")
        np.testing.assert_allclose(line.y, gamma, rtol=1e-6)


def test_a_model_against_itself_differs_nowhere(world):
    out = choose(world, A)
    differences = [caption for _, caption in out[world.p.cmp_heads]][2::3]
    assert differences and all(c.startswith("B − A") and "0.00 at most" in c for c in differences)
    bars = {bar.name: bar.y for bar in out[world.p.cmp_dla].data}
    np.testing.assert_array_equal(bars["A"], bars["B"])


def test_what_cannot_be_compared_is_one_calm_line(world, tmp_path):
    p = world.p
    missing = choose(world, None, str(tmp_path / "nothing.safetensors"))[p.cmp_msg]
    assert missing.startswith("**Could not load model B:**") and "\n" not in missing
    five = cait.load_model("cait_pico_32", weights=False, num_classes=5).model
    cait.save_weights(five, tmp_path / "five.safetensors")
    other = choose(world, None, str(tmp_path / "five.safetensors"))
    assert "**Cannot compare:** the two models answer different classes" in other[p.cmp_msg]
    assert other[p.cmp_top5] is None  # nothing of the last comparison stays
    folder = world.tab.open_run(str(tmp_path), world.loaded.choice, world.a)[p.cmp_run_msg]
    assert folder.startswith("**Not a compare run:**") and "\n" not in folder


def test_an_open_run_shows_its_files_pairs_the_heads_and_opens_its_images(world):
    p, tab = world.p, world.tab
    choose(world, B)
    out = tab.open_run(str(world.run), world.loaded.choice, world.a)
    run = cait.compare.read_run(world.run)
    np.testing.assert_allclose(np.asarray(out[p.cmp_cka].data[0].z, dtype=float), run.cka)
    assert f"{len(run.disagreements):,} images answered differently" in out[p.cmp_run_msg]
    assert "paired by the open run's matching" in out[p.cmp_msg]
    (la, ha), (lb, hb), _ = run.matching[0]
    assert [c for _, c in out[p.cmp_heads]][:2] == [f"A CA{la} head {ha}", f"B CA{lb} head {hb}"]
    tiles = out[p.cmp_disagree]
    assert len(tiles) == min(len(run.disagreements), 12) and Path(tiles[0][0]).is_file()
    d = run.disagreements[0]
    assert tiles[0][1] == f"{d.label}: A {d.pred_a}, B {d.pred_b}"
    opened = tab.pick(
        SimpleNamespace(value={"image": {"path": tiles[0][0]}}), choice=world.loaded.choice, ca_props=SHOWN, **LOOK
    )
    assert opened[world.p.image_in] == tiles[0][0] and "%" in opened[world.p.top5]
    assert opened[p.cmp_top5] is None  # the first view empties the last comparison; the follow-up draws it
    follow = world.app.tabs.image.follow_up(world.loaded.choice, opened[world.p.analysis], "Compare")
    assert f"B: {B}" in follow[p.cmp_top5]


def test_a_run_whose_stop_was_pressed_before_it_started_stops_in_one_line(world):
    tab = world.tab
    choose(world, B)
    tab.stops.arm(None)
    tab.stops.press(None)
    out = tab.build_run(world.loaded.choice, 8, world.a, None, lambda *a, **k: None)
    assert out[world.p.cmp_run_msg].startswith("**Stopped**")


def test_the_compare_endpoint_answers_by_name_and_refuses_in_one_line(world, monkeypatch):
    from app.api import CompareImage

    endpoint = CompareImage(world.app.cache, world.app.default)
    path = world.loaded.examples[0][0]
    out = endpoint.compare({"path": path}, model_b=B, target=2)
    assert json.loads(json.dumps(out)) == out and out["target"]["index"] == 2
    other = world.app.cache.get(ModelChoice(B)).model
    x_a, x_b = world.a.x, session.model_input(path, other.cfg)[2]
    np.testing.assert_allclose(out["maps_a"], explain.class_attention(world.loaded.model, x_a).maps[0], atol=1e-6)
    np.testing.assert_allclose(out["dla_b"], explain.direct_logit_attribution(other, x_b, 2).heads[0], atol=1e-5)
    assert out["differences"] == [None] * 6 and out["pairs"][0] == [[1, 1], [1, 1]]
    with pytest.raises(gr.Error, match="target must be a class in 0..9, got 10"):
        endpoint.compare({"path": path}, model_b=B, target=10)

    def no_work(*args, **kwargs):
        raise AssertionError("the image was read before model_b was checked")

    monkeypatch.setattr(session, "model_input", no_work)
    with pytest.raises(gr.Error, match="unknown model_b 'nope'; choose from "):
        endpoint.compare({"path": path}, model_b="nope")


def test_the_view_reuses_the_pages_analysis_and_runs_each_model_once(world):
    """Model A's answer, maps and ratios are the analysis' (no pass of its own for them); its heads' writes and
    all of model B's numbers come from one pass each."""
    choose(world, B)
    models = {"A": world.loaded.model, "B": world.app.cache.get(ModelChoice(B)).model}
    passes = {side: 0 for side in models}
    hooks = [
        model.patch_embed.register_forward_hook(lambda *_, side=side: passes.__setitem__(side, passes[side] + 1))
        for side, model in models.items()
    ]
    try:
        out = world.tab.view(world.loaded.choice, world.a)
    finally:
        for hook in hooks:
            hook.remove()
    assert passes == {"A": 1, "B": 1} and len(out[world.p.cmp_heads]) == 3 * 6


def test_a_build_runs_on_the_caches_models_not_copies_of_its_own(world, monkeypatch):
    """The tab hands the run the models its cache holds (one copy of each in memory): loading a side is never
    asked for, and the run is built and opened."""
    import cait.compare.run

    def no_second_copy(*args, **kwargs):
        raise AssertionError("the build loaded a model of its own")

    monkeypatch.setattr(cait.compare.run, "load_side", no_second_copy)
    choose(world, B)
    out = world.tab.build_run(world.loaded.choice, 4, world.a, None, lambda *a, **k: None)
    assert "images answered differently" in out[world.p.cmp_run_msg]
