"""The app's layers without a server: the command line, the shared model cache, the analysis session, the
page's texts and the handlers' answers (called directly, as plain functions)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import randomise_
from PIL import Image

import cait
from app import figures, session, texts
from app import main as cli
from app.loading import load_page_model
from app.models import LoadedModel, ModelCache, ModelChoice
from app.shared import Look
from app.tabs.class_attention import GalleryProps
from app.tabs.dataset import AtlasPlaces
from app.workdir import WorkDir
from cait import explain, hub
from cait.checkpoint import WEIGHTS_DIR
from cait.explain.head_stats import attention_entropy, mean_attention_distances
from cait.explain.maps import regions_of_focus

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
SCENE = sorted((ROOT / "cait" / "examples").glob("scene_*.png"))[0]


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


# ------------------------------------------------------------------------------ command line


def test_help_answers_before_torch_and_gradio_are_imported():
    done = python(
        "import sys\nfrom app import main\ntry:\n    main.parse_args(['--help'])\nexcept SystemExit:\n"
        "    pass\nprint('torch' in sys.modules, 'gradio' in sys.modules)"
    )
    assert done.returncode == 0, done.stderr
    assert "cait_m48_448" in done.stdout and "--precision" in done.stdout and "port to serve on" in done.stdout
    assert done.stdout.strip().endswith("False False")
    script = subprocess.run(
        [sys.executable, str(ROOT / "app" / "main.py"), "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert script.returncode == 0 and "usage: python app/main.py" in script.stdout


def test_importing_the_app_has_no_side_effects():
    # the temporary folder is one of its own, empty: other tests and servers running beside it (pytest -n) make
    # cait-app-* folders in the shared one
    done = python(
        "import os, shutil, sys, tempfile\npath = list(sys.path)\ntempfile.tempdir = tempfile.mkdtemp()\n"
        "import app.main, app.ui, app.tabs.dataset, app.tabs.causal\nfrom app.workdir import WORK\n"
        "new = [d for d in os.listdir(tempfile.gettempdir()) if d.startswith('cait-app-')]\n"
        "shutil.rmtree(tempfile.gettempdir())\nprint(sys.path == path, WORK._path, new)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "True None []"


def test_a_port_in_use_is_one_line_naming_the_flag(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert cli.main(["--port", str(s.getsockname()[1])]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "in use" in err and "--port" in err


def test_work_dir_is_made_lazily_and_removed():
    work = WorkDir(prefix="cait-test-")
    assert work._path is None
    folder = work.request_dir()
    assert folder.is_dir() and folder.parent.parent == work.path
    root = work.path
    work.cleanup()
    assert not root.exists() and work._path is None


# ------------------------------------------------------------------------------ the model cache


class Fake(SimpleNamespace):
    nbytes = 100


def test_cache_evicts_the_least_recently_used_by_bytes():
    loads = []
    cache = ModelCache(lambda c: loads.append(c) or Fake(choice=c), max_bytes=250)
    a, b, c, d = (ModelChoice(n) for n in "abcd")
    for choice in (a, b, c):
        cache.get(choice)
    assert cache.cached == [b, c]  # 300 bytes > 250: a, the least recently used, went
    cache.get(b)  # a hit: b becomes the most recent, nothing loads
    cache.get(d)
    assert cache.cached == [b, d] and loads == [a, b, c, d] and cache.nbytes == 200
    big = ModelChoice("big")
    cache._loader = lambda ch: Fake(choice=ch, nbytes=1000)
    cache.get(big)
    assert cache.cached == [big]  # alone above the ceiling: kept, everything else dropped


def test_cache_loads_each_model_once_and_others_meanwhile():
    loads, release = [], threading.Event()

    def loader(choice):
        loads.append(choice)
        if choice.name == "slow":  # waits until another model was loaded meanwhile
            assert release.wait(30), "a second model could not load while the first was loading"
        else:
            release.set()
        return Fake(choice=choice)

    cache = ModelCache(loader, max_bytes=10_000)
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(cache.get(ModelChoice("slow")))) for _ in range(6)]
    threads.append(threading.Thread(target=lambda: cache.get(ModelChoice("quick"))))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert loads.count(ModelChoice("slow")) == 1 and len(got) == 6 and all(g is got[0] for g in got)


def test_an_evicted_model_is_freed():
    cache = ModelCache(lambda c: load_page_model(c, CPU), max_bytes=1)
    first = weakref.ref(cache.get(ModelChoice("cait_pico_32", random_init=True)).model)
    cache.get(ModelChoice("cait_nano_64", random_init=True))
    assert first() is None and cache.cached == [ModelChoice("cait_nano_64", random_init=True)]


# ------------------------------------------------------------------------------ the analysis session


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> LoadedModel:
    path = tmp_path_factory.mktemp("ckpt") / "nano.safetensors"
    cait.save_weights(randomise_(cait.load_model("cait_nano_64", weights=False).model), path)
    return load_page_model(ModelChoice(name=None, checkpoint=str(path)), CPU)


def test_analysis_is_the_models_own_numbers(loaded):
    a = session.analyse(loaded, str(SCENE), sa_layer=2)
    x = cait.preprocess.to_batch([Image.open(SCENE)], loaded.cfg)
    ca = explain.class_attention(loaded.model, x)
    np.testing.assert_allclose(a.ca_maps, ca.maps[0].numpy(), atol=1e-6)
    np.testing.assert_allclose(a.ca_maps.sum((-1, -2)) + a.self_share, 1.0, atol=1e-5)
    np.testing.assert_allclose(a.probs, ca.logits[0].softmax(-1).numpy(), atol=1e-6)
    th = explain.talking_heads(loaded.model, x, 2)
    assert a.stages.layer == 2
    for stage in ("raw", "after_proj_l", "after_proj_w"):
        np.testing.assert_allclose(getattr(a.stages, stage), getattr(th, stage)[0].numpy(), atol=1e-6)
    a = session.with_sa_layer(loaded, a, 4)
    np.testing.assert_allclose(
        a.stages.after_proj_w, explain.talking_heads(loaded.model, x, 4).after_proj_w[0].numpy(), atol=1e-6
    )
    data = json.loads(json.dumps(session.numbers(loaded, a)))  # JSON-able
    assert data["predictions"][0]["index"] == a.top_class and len(data["class_attention"]["maps"]) == 2
    # the per-head statistics: the same numbers as cait.explain on the model's own maps
    np.testing.assert_allclose(data["class_attention"]["entropy"], attention_entropy(ca.maps[0]), rtol=1e-4)
    distance = np.array(data["self_attention"]["mean_distance"])
    assert distance.shape == (loaded.cfg.depth, loaded.cfg.num_heads)
    with torch.inference_mode():
        np.testing.assert_allclose(distance, mean_attention_distances(loaded.model, x)[0], rtol=1e-4)
    # on the softmax after proj_l, the ViT paper's definition as it stands: sum_k p(q, k) |q - k| averaged over q
    g, size = loaded.cfg.grid_size, loaded.cfg.patch_size
    centres = np.stack(np.meshgrid(np.arange(g), np.arange(g), indexing="ij"), -1).reshape(-1, 2) * size
    pixels = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    softmax = explain.talking_heads(loaded.model, x, 3).after_proj_l[0].numpy()  # [heads, N, N], rows sum to 1
    by_hand = (softmax * pixels).sum(-1).mean(-1)
    np.testing.assert_allclose(data["self_attention"]["mean_distance_after_proj_l"][3], by_hand, rtol=1e-4)
    assert data["self_attention"]["uniform_distance"] == pytest.approx(pixels.mean())


def test_saliency_rows_score_each_map_and_time_the_wait(loaded):
    a = session.analyse(loaded, str(SCENE))
    rows = list(
        session.saliency_rows(
            loaded,
            a,
            target=3,
            methods=["rollout_after_proj_l", "integrated_gradients"],
            options=explain.MethodOptions(ig_steps=4),
        )
    )
    assert [r.method for r in rows] == ["rollout_after_proj_l", "integrated_gradients"]
    expected = explain.attribution(loaded.model, a.x, torch.tensor([3]), "integrated_gradients", n_steps=4).patch[0]
    torch.testing.assert_close(rows[1].heat, expected)
    torch.testing.assert_close(rows[0].heat, explain.rollout(loaded.model, a.x, stage="after_proj_l")[0])
    scores = explain.deletion_insertion(loaded.model, a.x, torch.tensor([3]), rows[1].heat[None])
    assert rows[1].deletion_auc == pytest.approx(float(scores["deletion_auc"][0]), abs=1e-6)
    assert all(0 <= r.insertion_auc <= 1 and r.seconds > 0 for r in rows)
    with pytest.raises(ValueError, match="target must be in 0..9"):
        session.attribution_for_api(loaded, a, method="saliency", target=10, options=explain.MethodOptions())
    with pytest.raises(ValueError, match="unknown method"):
        session.attribution_for_api(loaded, a, method="telepathy", target=1, options=explain.MethodOptions())


def test_the_distance_plot_names_both_stages_and_draws_the_uniform_level(loaded):
    a = session.analyse(loaded, str(SCENE))
    distances = session.sa_distance(loaded, a)
    figure = figures.head_stats_figure(
        session.ca_entropy(a), distances, patches=16, uniform_distance=session.uniform_distance(loaded)
    )
    names = {trace.name for trace in figure.data}
    assert {"head mean, softmax after proj_l", "head mean, |w| after proj_w"} <= names
    means = {t.name: list(t.y) for t in figure.data if t.name.startswith("head mean")}
    assert means["head mean, softmax after proj_l"] == pytest.approx(distances["after_proj_l"].mean(1).tolist())
    (uniform,) = [shape for shape in figure.layout.shapes if shape.xref == "x domain"]  # the distance panel's line
    level = explain.head_stats.patch_distances(loaded.cfg.grid_size, loaded.cfg.patch_size).mean().item()
    assert uniform.y0 == uniform.y1 == pytest.approx(level)
    assert any("uniform attention" in note.text for note in figure.layout.annotations)


def test_each_saliency_method_is_charged_its_own_time(loaded):
    a = session.analyse(loaded, str(SCENE))
    methods = ["ca1_mean", "rollout_raw", "rollout_after_proj_l", "integrated_gradients"]
    options = explain.MethodOptions(ig_steps=64)
    start = time.perf_counter()
    rows = session.unscored_rows(loaded, a, target=3, methods=methods, options=options)
    total = time.perf_counter() - start
    seconds = {r.method: r.seconds for r in rows}
    # the CA mean is read from the analysis: next to nothing; the 64-step attribution: most of the wait
    assert seconds["ca1_mean"] < 0.1 * seconds["integrated_gradients"]
    assert seconds["integrated_gradients"] > 0.5 * total and sum(seconds.values()) <= total
    # the two rollouts come from one forward pass, which they share
    assert seconds["rollout_raw"] == seconds["rollout_after_proj_l"] > 0


# ------------------------------------------------------------------------------ what the page says


def test_the_default_model_is_described_from_its_shipped_files():
    loaded = load_page_model(ModelChoice(cait.DEFAULT_MODEL), CPU)
    top1 = json.loads((WEIGHTS_DIR / f"{cait.DEFAULT_MODEL}.eval.json").read_text())["top1"]
    header = texts.header_markdown(loaded)
    assert f"{top1:.1%}" in header and "model card in the Model tab" in header
    card = (WEIGHTS_DIR / f"{cait.DEFAULT_MODEL}.md").read_text()
    assert texts.card_markdown(loaded) == card  # rendered by the page's Markdown, not served as a raw file
    assert f"{loaded.cfg.img_size} px, 10-class miniature" in header and "Fashion-MNIST scenes" in header
    top = {"label": "Bag", "probability": 0.0004}
    assert "garment classes" in texts.status_markdown(loaded, top, [], uploaded=True)
    assert "garment" not in texts.status_markdown(loaded, top, [], uploaded=False)
    assert "(< 0.1%)" in texts.status_markdown(loaded, top, [], uploaded=False)
    top5 = texts.top5_html([{"label": "Bag", "probability": 0.9951}, {"label": "Coat <b>", "probability": 0.0042}])
    assert "99.5%" in top5 and "0.4%" in top5 and "Coat &lt;b&gt;" in top5  # small values keep a decimal
    untrained = load_page_model(ModelChoice("cait_pico_32", random_init=True), CPU)
    assert "Untrained" in texts.header_markdown(untrained) and "mean nothing" in texts.header_markdown(untrained)
    assert "Hugging Face cache" not in header  # nothing cached: no offer


def test_the_model_tab_says_the_default_models_robustness_from_its_shipped_record():
    from cait.robustness import headline

    loaded = load_page_model(ModelChoice(cait.DEFAULT_MODEL), CPU)
    record = json.loads((WEIGHTS_DIR / f"{cait.DEFAULT_MODEL}.robustness.json").read_text())
    tab = texts.model_markdown(loaded)
    assert f"| robustness (corrupted test images) | {headline(record)}" in tab
    identity = loaded.sourced.weights_id
    assert f"| weights identity | {identity} |" in tab and identity.startswith("sha256")
    assert f"{record['mean_top1_by_severity']['3']:.1%} mean over 9 corruptions at severity 3" in tab
    assert "robustness" not in texts.model_markdown(
        load_page_model(ModelChoice("cait_pico_32", random_init=True), CPU)
    )  # no record


def test_the_first_screen_offers_cached_official_weights_and_the_model_tab_lists_every_variant():
    loaded = load_page_model(ModelChoice(cait.DEFAULT_MODEL), CPU)
    header = texts.header_markdown(loaded, ["cait_xxs24_224", "cait_s24_384"])
    assert "local Hugging Face cache: **cait_xxs24_224, cait_s24_384**" in header and "Model tab" in header
    assert texts.cached_offer(["cait_xxs24_224"], "cait_xxs24_224") == ""  # the page already shows it
    table = texts.weights_table(hub.list_weights())
    rows = [line for line in table.splitlines()[2:]]
    assert len(rows) == len([n for n in cait.list_models() if cait.config.is_paper_variant(n)])
    # the suite runs with HF_HUB_OFFLINE=1 and an empty cache (conftest.py)
    assert "| cait_s24_224 | 188 | needs a file (offline and not cached) | timm/cait_s24_224.fb_dist_in1k |" in table
    assert "| cait_s36_224 | 273 | needs a file (never released) | - |" in table


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda tmp: tmp, "is a directory"),
        (
            lambda tmp: (tmp / "notes.pth").write_text("my training notes\nepoch 1\n") and tmp / "notes.pth",
            "is a text file, not a checkpoint",
        ),
        (lambda tmp: tmp / "missing.pth", "not found"),
    ],
)
def test_checkpoints_that_cannot_be_say_what_they_are(tmp_path, make, message):
    with pytest.raises(cait.CheckpointError, match=message) as info:
        load_page_model(ModelChoice("cait_pico_32", str(make(tmp_path))), CPU)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------ the handlers' answers

SHOWN = tuple(GalleryProps(False, None, f"CA layer {i + 1}") for i in range(4))  # a new page's CA galleries
SHOWN_ANALYSED = tuple(GalleryProps(i < 2, 5, f"CA layer {i + 1}") for i in range(4))


@pytest.fixture(scope="module")
def handlers():
    from app_tabs import page_under_test

    cache = ModelCache(load_page_model, max_bytes=2**30, device=CPU)
    return page_under_test(cache, ModelChoice("cait_pico_32", random_init=True))  # components only: no server


def saliency_steps(handlers, a: session.Analysis, methods: list[str], *, files=None, **named) -> list[dict]:
    """Every step of a saliency run of `methods` on `a`, the other inputs by name, as the page passes them;
    unless named: class 2 and the look these tests draw with. files: a list given gets, per step that shows the
    gallery, each tile's (file, inode) as the step was taken."""
    named = dict(choice=a.choice, analysis=a, sal_methods=methods, sal_class=2, cmap="inferno", alpha=0.5) | named
    steps = []
    for step in handlers.tabs.saliency.run(**{"view": "smooth", **named}):
        gallery = step.get(handlers.p.sal_gallery)
        if files is not None and gallery is not None:
            paths = [t["image"]["path"] for t in gallery.value or []]
            files.append([(path, Path(path).stat().st_ino) for path in paths])
        steps.append(step)
    return steps


def load(handlers, choice, shown, variant, checkpoint, download=False, **more) -> dict:
    """The Model tab's Load button, its inputs by name as the page passes them."""
    asked = dict(choice=choice, ca_props=shown, variant=variant, checkpoint=checkpoint, download=download)
    return handlers.tabs.model.load(**asked, **more)


def test_every_event_of_the_wired_page_with_more_than_three_inputs_passes_them_by_name(handlers):
    """The page as Gradio serves it (`demo.fns`, after `app.ui.wire`): no event takes more than three inputs by
    position, and every input passed by name is the page's component of that name. /analyze, the public API, is
    the one exception: its parameters are its published signature (test_app.py checks it)."""
    from app.ui import compose, wire

    demo, page, tabs = compose(handlers.cache.get(handlers.default), handlers.cache, AtlasPlaces.of(None, None))
    wire(demo, page, tabs, cache=handlers.cache, default=handlers.default)
    from app_tabs import PageUnderTest

    components = vars(PageUnderTest(page, tabs, handlers.cache, handlers.default).p)
    by_name = 0
    for fn in demo.fns.values():
        if fn.api_name == "analyze":
            continue
        positional = len(fn.inputs) - len(fn.input_keyword_names)
        assert positional <= 3, f"{fn.name} takes {positional} inputs by position"
        keyword_inputs = fn.inputs[positional:]
        for name, component in zip(fn.input_keyword_names, keyword_inputs):
            assert components[name] is component, f"{fn.name}: {name} is not the page's {name}"
        by_name += bool(fn.input_keyword_names)
    assert by_name >= 20  # the page's events with four or more inputs, all of them
    with pytest.raises(TypeError, match="sal_clas"):
        list(handlers.tabs.saliency.run(choice=None, analysis=None, sal_clas=2))  # a misspelt input: no default


def test_a_failed_load_changes_one_message_only(handlers, tmp_path):
    bad = tmp_path / "weights.pth"
    bad.write_text("not weights\n")
    out = load(handlers, ModelChoice("cait_pico_32", random_init=True), SHOWN, "cait_nano_28", str(bad))
    # the message, and the Variant box back at the page's model, which stays
    assert list(out) == [handlers.p.load_msg, handlers.p.variant] and "text file" in out[handlers.p.load_msg]
    assert out[handlers.p.variant] == "cait_pico_32"
    assert handlers.tabs.model.weights_status("cait_xxs24_224", str(bad)).startswith(
        "Weights from the checkpoint file given"
    )


def test_without_random_init_a_variant_without_weights_is_the_loaders_one_line(handlers):
    from dataclasses import replace

    from app.tabs.model import ModelTab

    t = handlers.tabs.model
    strict = ModelTab(
        t.parts,
        t.shared,
        t.cache,
        default=replace(handlers.default, random_init=False),
        statuses=t.statuses,
        ca_layers=t.ca_layers,
        page_for=t.page_for,
        image_emptied=t.image_emptied,
    )
    out = strict.load(choice=handlers.default, ca_props=SHOWN, variant="cait_nano_64", checkpoint="", download=False)
    said = hub.missing_weights(hub.weights_status("cait_nano_64"))
    assert out[handlers.p.load_msg] == f"**Could not load the model:** {said}"
    assert out[handlers.p.variant] == handlers.default.name  # the page's model stays


def test_a_loaded_model_updates_every_control_that_depends_on_it(handlers):
    p = handlers.p
    out = load(handlers, ModelChoice("cait_pico_32", random_init=True), SHOWN_ANALYSED, "cait_nano_28", "")
    cfg = cait.get_config("cait_nano_28")
    assert out[p.choice] == ModelChoice("cait_nano_28", random_init=True)  # the server's --random-init holds
    assert out[p.th_layer].maximum == cfg.depth and out[p.th_row].maximum == out[p.th_col].maximum == cfg.grid_size
    assert "cait_nano_28" in out[p.header] and "cait_nano_28" in out[p.model_md] and out[p.variant] == "cait_nano_28"
    assert out[p.examples].value and out[p.image_in] is None and out[p.analysis] is None
    assert out[p.ls_plot] is not None and out[p.sal_class].choices == []
    assert out[p.url_model] == "cait_nano_28" and out[p.region_of].choices[0] == ("CA1 mean", "CA1 mean")
    assert all(out[g]["visible"] is False for g in p.ca_galleries[:2])  # hidden until an image is analysed
    assert not any(props.visible for props in out[p.ca_props])


def test_an_unknown_model_in_the_address_is_said_where_the_page_opens_and_leaves_the_address(handlers):
    p, choice = handlers.p, handlers.default
    request = SimpleNamespace(query_params={"model": "cait_bogus"})
    with pytest.warns(UserWarning, match="unknown model"):
        out = handlers.tabs.model.from_address(choice, tuple(p.ca_props.value), request)
    assert "unknown model** `cait_bogus`" in out[p.status] and out[p.status] == out[p.load_msg]
    assert out[p.url_model] == choice.name  # the address names the model shown


def test_sixteen_heads_wrap_into_equal_rows(handlers, tmp_path):
    from cait.figures import grid_columns

    assert [grid_columns(h + 1) for h in (3, 4, 8, 12, 16)] == [4, 5, 9, 7, 9]
    path = tmp_path / "wide.safetensors"
    cait.save_weights(randomise_(cait.load_model("cait_pico_32", weights=False, num_heads=16).model), path)
    choice = ModelChoice(None, str(path))
    loaded = handlers.cache.get(choice)
    a = session.analyse(loaded, str(SCENE))
    out = handlers.tabs.ca.outputs(a, Look("inferno", 0.5, "shared per layer", "patch grid", 0.5), (1, 16), SHOWN)
    galleries = [out[g] for g in handlers.p.ca_galleries]
    assert [g["visible"] for g in galleries] == [True, True, False, False] and galleries[0]["columns"] == 9
    assert [len(g["value"]) for g in galleries[:2]] == [17, 17]
    assert out[handlers.p.ca_big].label.startswith("CA2 head 16")
    captions = [caption for _, caption in galleries[0]["value"]]  # half the mass: a patch count per tile
    assert all(caption.endswith(" patches") for caption in captions), captions
    with Image.open(out[handlers.p.grid_file]) as sheet:
        assert sheet.width == 9 * 224  # the PNG wraps like the page


def test_gallery_props_are_sent_only_when_they_change_and_tiles_keep_their_pixels(handlers):
    from cait.figures import attention_tiles

    p, loaded = handlers.p, handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(SCENE))
    look = ("viridis", 0.4, "per tile", "smooth", 1.0)
    first = handlers.tabs.ca.outputs(a, Look(*look), None, SHOWN)
    assert first[p.ca_props][:2] == (GalleryProps(True, 3, "CA layer 1"), GalleryProps(True, 3, "CA layer 2"))
    assert first[p.ca_galleries[0]]["visible"] and first[p.ca_galleries[0]]["__type__"] == "update"
    again = handlers.tabs.ca.outputs(a, Look(*look), None, first[p.ca_props])
    assert [type(again[g]) for g in p.ca_galleries] == [list, list, type(None), type(None)]  # values only
    assert again[p.ca_props] == first[p.ca_props]
    drawn = attention_tiles(a.view, a.ca_maps, a.self_share, cmap="viridis", alpha=0.4)
    for (path, caption), tile in zip(again[p.ca_galleries[1]], drawn[1]):
        with Image.open(path) as served:  # smooth maps: JPEG, a few levels off on average
            error = np.abs(np.asarray(served.convert("RGB"), dtype=float) - np.asarray(tile.image, dtype=float))
            assert served.format == "JPEG" and error.mean() < 4 and caption == tile.short_caption
    grid = handlers.tabs.ca.outputs(a, Look(*look[:3], "patch grid", *look[4:]), None, again[p.ca_props])
    blocks = attention_tiles(a.view, a.ca_maps, a.self_share, cmap="viridis", alpha=0.4, smooth=False)
    for (path, _), tile in zip(grid[p.ca_galleries[0]], blocks[0]):
        with Image.open(path) as served:  # the patch grid is lossless: the browser gets exactly the drawn pixels
            assert served.convert("RGB").tobytes() == tile.image.tobytes()
    shared = handlers.tabs.ca.outputs(a, Look(*look[:2], "shared per layer", *look[3:]), None, again[p.ca_props])
    assert shared[p.ca_galleries[0]]["label"].startswith("CA layer 1, colour 0 .. ")
    cleared = handlers.tabs.image.cleared(shared[p.ca_props])
    assert cleared[p.ca_galleries[0]]["visible"] is False and cleared[p.ca_props][0].visible is False
    assert list(cleared) == handlers.tabs.image.results()  # every result of an image, as `results` lists them


def test_an_upload_empties_the_class_menus_and_unhighlights_the_example(handlers, tmp_path):
    """A new image's first view empties the class menus, which `details` fills for an image that was analysed:
    one that failed keeps no class of the image before. No example is the image shown after an upload."""
    p = handlers.p
    bad = tmp_path / "holiday.png"
    bad.write_text("not really a picture\n" * 20)
    look = dict(cmap="inferno", alpha=0.5, scale="per tile", view="smooth", keep=1.0, th_layer=1)
    for path, said in ((bad, "Could not analyse this file"), (SCENE, "Top-1")):
        out = handlers.tabs.image.upload(
            choice=handlers.default, ca_props=SHOWN_ANALYSED, image_in={"path": str(path)}, **look
        )
        assert said in out[p.status]
        assert out[p.sal_class] is None and out[p.cz_class] is None and out[p.mx_class] is None
        assert out[p.examples].constructor_args == {"selected_index": None}  # the examples themselves stay


def test_saliency_shows_the_maps_first_then_scores_each(handlers):
    p = handlers.p
    loaded = handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(SCENE))
    files = []
    steps = saliency_steps(handlers, a, ["saliency", "ca1_mean"], files=files)
    shown = [s for s in steps if p.sal_gallery in s]
    name = loaded.labels[2]
    assert [s[p.sal_gallery].label for s in shown] == [
        f"Maps for class '{name}'; computing the maps (0 of 2 done)",
        f"Maps for class '{name}'; scoring ca1_mean (1 of 2)",  # both maps are shown before any scoring
        f"Maps for class '{name}'; scoring saliency (2 of 2)",
        f"Maps for class '{name}'",
    ]
    assert [len(s[p.sal_gallery].value or []) for s in shown] == [0, 2, 2, 2]
    assert [sum(row[1] is None for row in s[p.sal_table] or []) for s in shown] == [0, 2, 1, 0]  # AUCs to come
    assert ["AUC" in tile["caption"] for tile in shown[1][p.sal_gallery].value] == [False, False]
    assert ["AUC" in tile["caption"] for tile in shown[-1][p.sal_gallery].value] == [True, True]
    # every update sends the same copies of the app's own tile files: Gradio writes a file's copy once (by a
    # rename), where it re-encodes an image into the same file on every update, truncating it under a page that
    # is still fetching the last update's tiles
    assert files[1] == files[2] == files[3], files
    assert [Path(path).name for path, _ in files[1]] == ["map_0_0.jpg", "map_1_0.jpg"]
    assert [row[0] for row in shown[-1][p.sal_table]] == ["ca1_mean", "saliency"]  # the menu's order
    rows = list(
        session.saliency_rows(loaded, a, target=2, methods=["ca1_mean", "saliency"], options=explain.MethodOptions())
    )
    assert [row[1] for row in shown[-1][p.sal_table]] == [round(r.deletion_auc, 4) for r in rows]
    assert p.status not in steps[0] and steps[0][p.sal_msg] == ""  # the top-1 line stays; an old message goes
    stale = saliency_steps(handlers, a, ["saliency"], choice=ModelChoice("cait_nano_28"))
    assert list(stale[0]) == [p.sal_msg] and "Analyse an image first" in stale[0][p.sal_msg]  # in the tab
    none = saliency_steps(handlers, a, [])
    assert list(none[0]) == [p.sal_msg] and "Tick at least one" in none[0][p.sal_msg]


def test_the_region_of_focus_follows_the_chosen_map_and_share(handlers):
    p = handlers.p
    loaded = handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(SCENE))
    sizes = {}
    for source, share in (("CA1 mean", 0.5), ("CA1 mean", 0.9), ("CA2 head 1", 0.5)):
        shown = handlers.tabs.saliency.region(a, source, share)[p.sal_region]
        assert shown.label == f"Regions of focus: {source}, {share:.0%} of its attention mass"
        layer, head = (0, None) if source == "CA1 mean" else (1, 0)
        mask, _ = session.regions_of_focus(a, layer=layer, head=head, share=share, img_size=loaded.cfg.img_size)
        want, _ = regions_of_focus(
            torch.from_numpy(a.ca_maps[layer].mean(0) if head is None else a.ca_maps[layer, head])[None],
            share,
            img_size=loaded.cfg.img_size,
        )
        assert torch.equal(mask, want[0])
        sizes[(source, share)] = int(mask.sum())
    assert sizes[("CA1 mean", 0.5)] <= sizes[("CA1 mean", 0.9)]
    assert handlers.tabs.saliency.region(None, "CA1 mean", 0.5) == {p.sal_region: None}


def test_the_model_tab_downloads_official_weights_with_progress(handlers, hf_env, twins, monkeypatch):
    from safetensors.torch import save
    from stand_in_hub import StandInHub

    from cait import hub

    name = "cait_xxs24_224"
    _, theirs = twins(name, seed=7)
    served = {
        f"{hub.hub_repo(name)}/{hub.HUB_FILENAME}": save({k: v.contiguous() for k, v in theirs.state_dict().items()})
    }
    with StandInHub(served) as stand_in:
        hf_env(stand_in.url)
        assert handlers.tabs.model.weights_status(name).startswith(f"Weights of {name}: download")
        # no download: random weights, as the fixture's server was started with --random-init
        failed = load(handlers, ModelChoice("cait_pico_32", random_init=True), SHOWN, name, "", False)
        assert "Untrained" in failed[handlers.p.load_msg] and stand_in.methods() == []
        seen, asked = [], []
        counted, real_status = lambda n: asked.append(n) or real_status(n), hub.weights_status  # noqa: E731
        monkeypatch.setattr(hub, "weights_status", counted)
        out = load(
            handlers,
            ModelChoice("cait_pico_32", random_init=True),
            SHOWN,
            name,
            "",
            True,
            progress=lambda fraction, **kw: seen.append((fraction, kw.get("desc"))),
        )
        assert stand_in.methods() == ["HEAD", "GET"] and seen and seen[-1][1] == f"downloading {name}"
        assert asked == [name]  # the download path asks where the weights stand once, not again for every variant
        row = next(line for line in out[handlers.p.weights_table].splitlines() if line.startswith(f"| {name} |"))
        assert "in the local cache" in row  # the download changed its row of the table
        done, total = seen[-1][0]
        assert done == total == len(next(iter(served.values())))
        assert "official weights" in out[handlers.p.load_msg]
        assert "local Hugging Face cache" in out[handlers.p.weights_md]
        loaded = handlers.cache.get(out[handlers.p.choice])
        torch.testing.assert_close(loaded.model.head.weight, theirs.head.weight)


def test_saliency_without_scoring_leaves_the_aucs_out(handlers):
    p = handlers.p
    loaded = handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(SCENE))
    steps = saliency_steps(handlers, a, ["saliency"], sal_score=False)
    (shown,) = steps[-2][p.sal_gallery].value
    assert shown["caption"] == f"saliency for '{loaded.labels[2]}'"  # no AUC, no settings in it
    assert steps[-2][p.sal_table] == [["saliency", None, None, steps[-2][p.sal_table][0][3]]]
    # the maps go into the JSON download too
    (saved,) = json.loads(Path(steps[-1][p.json_file]).read_text())["saliency"]  # one class
    assert saved["target"] == 2 and list(saved["methods"]) == ["saliency"]
    assert saved["methods"]["saliency"]["deletion_auc"] is None
    heat = explain.saliency_map(loaded.model, a.x, torch.tensor([2]), "saliency")[0]
    np.testing.assert_allclose(saved["methods"]["saliency"]["map"], heat, rtol=1e-4, atol=1e-7)


def test_the_saliency_tabs_method_options_reach_the_maps(handlers):
    p = handlers.p
    loaded = handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(SCENE))
    look = dict(cmap="gray", alpha=1.0, view="patch grid", sal_score=False)
    run = lambda **options: (
        saliency_steps(handlers, a, ["rollout_after_proj_l"], **look, **options)[-2][p.sal_gallery].value
    )
    x = a.x.to(loaded.device)
    want = explain.rollout(loaded.model, x, stage="after_proj_l", head_fusion="max", discard_ratio=0.5)
    default = explain.rollout(loaded.model, x, stage="after_proj_l")
    assert not torch.allclose(want, default)
    drawn = [
        np.asarray(figures.saliency_tile(a.view, h[0], cmap="gray", alpha=1.0, smooth=False), dtype=float)
        for h in (default, want)
    ]
    chosen = dict(smoothgrad_samples=16, smoothgrad_stdev=0.15, rollout_head_fusion="max", rollout_discard_ratio=0.5)
    for options, mine, other in (({}, *drawn), (chosen, *drawn[::-1])):
        (shown,) = run(**options)  # the gallery's value, as Gradio encoded it (a file)
        image = np.asarray(Image.open(shown["image"]["path"]).convert("RGB"), dtype=float)
        assert np.abs(image - mine).mean() < 2 < np.abs(image - other).mean()  # the map these options give


def test_saliency_runs_record_their_options_and_smoothgrad_its_seed(handlers):
    p = handlers.p
    loaded = handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(SCENE))
    methods = ["rollout_raw", "smoothgrad", "integrated_gradients"]
    chosen = dict(smoothgrad_samples=6, smoothgrad_stdev=0.3, rollout_head_fusion="max", rollout_discard_ratio=0.2)
    chosen |= dict(ig_steps=8, ig_baseline="black")
    run = lambda seed: saliency_steps(handlers, a, methods, sal_score=False, signed=True, sg_seed=seed, **chosen)
    first, again, other = run(7), run(7), run(8)
    captions = [s["caption"] for s in first[-2][p.sal_gallery].value]
    name = loaded.labels[2]
    assert captions == [
        f"rollout_raw for '{name}' (max fusion, discard 0.2)",
        f"integrated_gradients for '{name}' (8 steps from the black baseline, signed)",
        f"smoothgrad for '{name}' (6 samples, noise 0.3, seed 7, signed)",
    ]  # in the menu's order
    saved = [json.loads(Path(steps[-1][p.json_file]).read_text())["saliency"][0] for steps in (first, again, other)]
    assert saved[0]["options"] == {
        "ig_steps": 8,
        "ig_baseline": "black",
        "signed": True,
        "smoothgrad_samples": 6,
        "smoothgrad_stdev": 0.3,
        "rollout_head_fusion": "max",
        "rollout_discard_ratio": 0.2,
        "seed": 7,
    }
    smooth = [np.array(s["methods"]["smoothgrad"]["map"]) for s in saved]
    np.testing.assert_array_equal(smooth[0], smooth[1])  # the same seed: the same map
    assert not np.allclose(smooth[0], smooth[2])  # another seed: other noise


def test_a_map_drawn_signed_says_so_in_its_caption_occlusion_included(handlers):
    """Issue 49 N48: occlusion's settings never name the sign (its map is signed whatever the option), yet drawn
    signed its caption, on the tile and on the enlarged map, says "signed" as the other captum maps' do; drawn
    as |attribution| neither says it."""
    p = handlers.p
    loaded = handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(SCENE))
    name = loaded.labels[2]
    for signed, said in ((True, " (signed)"), (False, "")):
        steps = saliency_steps(handlers, a, ["occlusion", "saliency"], sal_score=False, signed=signed)
        captions = sorted(s["caption"] for s in steps[-2][p.sal_gallery].value)
        assert captions == [f"occlusion for '{name}'{said}", f"saliency for '{name}'{said}"]
        maps = steps[-1][p.sal_maps]
        for i, (_, caption, drawn_signed, _) in enumerate(maps):
            assert drawn_signed == signed
            asked = dict(analysis=a, sal_maps=maps, cmap="gray", alpha=1.0, view="patch grid")
            big = handlers.tabs.saliency.enlarge(SimpleNamespace(index=i), **asked)
            assert big[p.sal_big].layout.title.text == caption  # the enlarged map's title is the tile's caption


def test_saliency_for_the_top_k_classes_side_by_side(handlers):
    p = handlers.p
    loaded = handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(SCENE))
    steps = saliency_steps(handlers, a, ["saliency", "ca1_mean"], sal_class=None, sal_score=False, sal_topk=3)
    top = [loaded.labels[i] for i in np.argsort(-a.probs)[:3]]
    assert (
        steps[0][p.sal_gallery].label == f"Maps for the top 3 classes; computing the maps for {top[0]!r} (0 of 6 done)"
    )
    gallery, table = steps[-2][p.sal_gallery], steps[-2][p.sal_table]
    assert [s["caption"] for s in gallery.value] == [f"{m} for '{n}'" for n in top for m in ("ca1_mean", "saliency")]
    assert [row[0] for row in table] == [f"{m} ({n})" for n in top for m in ("ca1_mean", "saliency")]
    saved = json.loads(Path(steps[-1][p.json_file]).read_text())["saliency"]
    assert [c["class"] for c in saved] == top and all(list(c["methods"]) == ["ca1_mean", "saliency"] for c in saved)


def test_signed_attributions_are_drawn_diverging_around_zero(handlers):
    p = handlers.p
    loaded = handlers.cache.get(handlers.default)
    a = session.analyse(loaded, str(SCENE))
    look = dict(cmap="gray", alpha=1.0, view="patch grid", sal_score=False)
    steps = saliency_steps(handlers, a, ["saliency"], **look, signed=True)
    heat = explain.saliency_map(loaded.model, a.x, torch.tensor([2]), "saliency", explain.MethodOptions(signed=True))[0]
    assert (heat < 0).any() and (heat > 0).any()
    drawn = np.asarray(figures.saliency_tile(a.view, heat, cmap="gray", alpha=1.0, smooth=False, signed=True), float)
    (shown,) = steps[-2][p.sal_gallery].value
    image = np.asarray(Image.open(shown["image"]["path"]).convert("RGB"), dtype=float)
    assert np.abs(image - drawn).mean() < 2  # the signed map, in the diverging colours
    assert Image.open(steps[0][p.sal_bar]).height > figures.saliency_bars("gray", signed=False).height  # both scales
    # a click on the map: enlarged beside its patch grid, whose hover reads the map's values
    asked = dict(analysis=a, sal_maps=steps[-1][p.sal_maps], cmap="gray", alpha=1.0, view="patch grid")
    big = handlers.tabs.saliency.enlarge(SimpleNamespace(index=0), **asked)
    figure = big[p.sal_big]
    np.testing.assert_allclose(np.array(figure.data[1].z), heat.numpy(), rtol=1e-5, atol=1e-8)
    assert figure.layout.title.text == f"saliency for '{loaded.labels[2]}' (signed)"
    # centred on 0 as the tile and the gallery's bar are (white is 0), the bar named for the method
    grid = figure.data[1]
    top = float(heat.abs().max())
    assert grid.zmid == 0 and grid.zmin == pytest.approx(-top) and grid.zmax == pytest.approx(top)
    assert grid.colorbar.title.text == "saliency"


def test_the_page_shows_every_class_attention_layer_of_its_model_or_refuses_it_with_a_reason(handlers, tmp_path):
    """No silent limit on CA layers: a page whose model has six shows six galleries and draws six layers in the PNG
    grid; a page that shows four refuses a six-layer model at load, saying why."""
    from app_tabs import page_under_test

    path = tmp_path / "six.safetensors"
    cait.save_weights(randomise_(cait.load_model("cait_pico_32", weights=False, depth_token_only=6).model), path)
    six = ModelChoice(None, str(path))
    app = page_under_test(handlers.cache, six)
    assert len(app.p.ca_galleries) == 6
    a = session.analyse(handlers.cache.get(six), str(SCENE))
    shown = tuple(app.p.ca_props.value)
    out = app.tabs.ca.outputs(a, Look("inferno", 0.5, "per tile", "smooth", 1.0), None, shown)
    assert [out[g]["visible"] for g in app.p.ca_galleries] == [True] * 6
    with Image.open(out[app.p.grid_file]) as sheet:
        assert sheet.height > 6 * 224  # six rows of tiles, under the title
    refused = load(handlers, handlers.default, SHOWN, None, str(path))
    assert list(refused) == [handlers.p.load_msg, handlers.p.variant]
    assert "has 6 class-attention layers and this page shows 4" in refused[handlers.p.load_msg]


def test_the_saliency_tabs_sliders_span_the_bounds_analyze_accepts(handlers):
    """One definition of the method options' bounds (`cait.explain.attribution.OPTION_BOUNDS`) for the page's
    sliders and /analyze."""
    from cait.explain.attribution import OPTION_BOUNDS

    p = handlers.p
    sliders = dict(ig_steps=p.ig_steps, smoothgrad_samples=p.smoothgrad_samples, smoothgrad_stdev=p.smoothgrad_stdev)
    sliders["rollout_discard_ratio"] = p.rollout_discard_ratio
    assert {name: (s.minimum, s.maximum) for name, s in sliders.items()} == OPTION_BOUNDS


def test_the_talking_heads_query_sent_for_the_last_model_is_clamped_to_the_pages_at_the_door(handlers):
    """After a model swap, a page could send the query's sliders as they were for the last model (a larger patch
    grid, more layers) before the swap's new bounds reached it: Gradio refused them before any handler ran
    ("Value 9 is greater than maximum value 7"). Every event that reads them (an example, an upload, an exemplar,
    the follow-up, the sliders, the patch grid) takes them without Gradio's check; its handler clamps them to the
    page's model and sets each slider it clamped to what it drew, within that model's bounds."""
    from app.ui import compose, wire

    p = handlers.p
    demo, page, tabs = compose(handlers.cache.get(handlers.default), handlers.cache, AtlasPlaces.of(None, None))
    wire(demo, page, tabs, cache=handlers.cache, default=handlers.default)
    query = {page.talking.th_layer._id, page.talking.th_row._id, page.talking.th_col._id}
    reading = [fn for fn in demo.fns.values() if query & {block._id for block in fn.inputs}]
    assert len(reading) >= 6 and not any(fn.preprocess for fn in reading)  # no bounds check before the handler
    choice = load(handlers, handlers.default, SHOWN, "cait_nano_28", "")[p.choice]  # the swap
    nano = handlers.cache.get(choice)
    g, depth = nano.cfg.grid_size, nano.cfg.depth  # 7 and 6
    stale = dict(th_layer=depth + 3, th_row=g + 2, th_col=3)  # sent for the larger model the page had
    a = session.analyse(nano, str(SCENE), sa_layer=stale["th_layer"] - 1)  # an example's first view
    look = dict(cmap="inferno", alpha=0.5, scale="per tile", view="smooth", keep=1.0, region_of="CA1 mean")
    out = handlers.tabs.image.details(choice=choice, analysis=a, **look, **stale)
    for slider, value, high in ((p.th_layer, depth, depth), (p.th_row, g, g)):
        assert (out[slider].value, out[slider].maximum, out[slider].minimum) == (value, high, 1)
    assert p.th_col not in out  # sent within the bounds: left as it is
    drawn = handlers.tabs.talking.outputs(nano, a, g, 3)
    assert np.array_equal(
        np.asarray(Image.open(out[p.th_pick])), np.asarray(Image.open(drawn[p.th_pick]))
    )  # the patch drawn: (7, 3)
    assert set(drawn) == {p.th_gallery, p.th_plot, p.th_pick}  # nothing clamped: no slider set
    stale_map = look | dict(region_of=f"CA1 head {nano.cfg.num_heads + 1}")  # a map the last model had
    assert handlers.tabs.image.details(choice=choice, analysis=a, **stale_map, **stale)[p.sal_region] is None
    query = handlers.tabs.talking.query(choice=choice, analysis=a, th_layer=99, th_row=0, th_col="x")
    assert query[p.analysis].stages.layer == depth - 1 and query[p.th_layer].value == depth
    assert query[p.th_row].value == 1 and query[p.th_col].value == g // 2 + 1  # the lowest; not a number


def test_an_example_clicked_before_the_address_swap_landed_is_analysed_by_the_swapped_model(handlers):
    """Item 59.11: a page opened with ?model= sends an example's click with the model its state still names; the
    wired handler waits for the page's swap (Gradio may run the click first) and analyses with the swapped
    model; another page's click, or one after the swap, is not held."""
    import gradio as gr
    from gradio.helpers import special_args

    from app.ui import compose, wire

    demo, page, tabs = compose(handlers.cache.get(handlers.default), handlers.cache, AtlasPlaces.of(None, None))
    wire(demo, page, tabs, cache=handlers.cache, default=handlers.default)
    (example,) = [fn.fn for fn in demo.fns.values() if fn.name == "example"]
    shown = tuple(page.ca.ca_props.value)
    asked = {name: c.value for name, c in page.look().items()} | dict(ca_props=shown, th_layer=1)
    path = str(SCENE)
    evt = gr.SelectData(None, {"index": 0, "value": {"image": {"path": path}}})
    request = SimpleNamespace(query_params={"model": "cait_nano_28"}, session_hash="swapping")

    def click(choice, req) -> dict:  # the handler called as Gradio calls it: its special arguments found by Gradio
        args, *_ = special_args(example, inputs=[evt], request=req)  # the event data as the page sends it
        return example(*args, choice=choice, **asked)

    answer = {}
    clicked = threading.Thread(target=lambda: answer.update(out=click(handlers.default, request)))
    clicked.start()  # the click reaches the server before the swap
    for _ in range(1200):  # and waits for it
        if tabs.model.swaps.pages.of("swapping").awaited:
            break
        time.sleep(0.1)
    swapped = tabs.model.from_address(handlers.default, shown, request)
    clicked.join(120)
    assert swapped[page.shared.choice].name == "cait_nano_28"
    assert answer["out"][page.shared.analysis].choice == swapped[page.shared.choice]
    # the swap's answer may reach the page after the click's: it leaves the image and its results to the click's
    image = {page.shared.image_in, *tabs.image.results()}
    assert not image & set(swapped) and {page.shared.header, page.shared.examples} <= set(swapped)
    # the page's next click, with its state caught up, and another page's, go through as sent
    other = SimpleNamespace(query_params={}, session_hash="plain")
    for choice, req in ((swapped[page.shared.choice], request), (handlers.default, other)):
        assert click(choice, req)[page.shared.analysis].choice == choice


def test_a_known_model_in_the_address_without_weights_here_is_said_as_an_unknown_one(handlers):
    """Item 59.18: ?model= naming a variant the server cannot load (no weights, no --random-init): a toast, the
    status line where the page opens and the Load button's line say so with the loader's reason, and the address
    names the model shown, as for an unknown name; the page keeps its model."""
    from dataclasses import replace

    from app.tabs.model import ModelTab

    t, p = handlers.tabs.model, handlers.p
    strict = ModelTab(
        t.parts, t.shared, t.cache, default=replace(handlers.default, random_init=False), statuses=t.statuses,
        ca_layers=t.ca_layers, page_for=t.page_for, image_emptied=t.image_emptied,
    )  # fmt: skip
    request = SimpleNamespace(query_params={"model": "cait_nano_64"}, session_hash="no-weights")
    with pytest.warns(UserWarning, match="cait_nano_64"):
        out = strict.from_address(handlers.default, SHOWN, request)
    said = hub.missing_weights(hub.weights_status("cait_nano_64")).splitlines()[0]
    assert said in out[p.status] and out[p.status] == out[p.load_msg] and "cait_nano_64" in out[p.status]
    assert out[p.url_model] == handlers.default.name and p.choice not in out


def test_the_header_before_the_precision_is_decided_says_so_and_what_to_do(loaded):
    """Polish of 59: a page opened while the server times bf16 keeps its header; it says fp32 holds until then
    and to reload, not a bare "fp32" that is stale once bf16 is chosen; decided, it says the choice."""
    import dataclasses

    from cait.runtime import PrecisionChoice

    before = texts.header_markdown(dataclasses.replace(loaded, precision=None, dtype=None))
    assert "fp32 while bf16 is timed" in before and "reload" in before
    decided = dataclasses.replace(loaded, precision=PrecisionChoice(None, "measured now", "why"), dtype=None)
    assert "(fp32, measured now)" in texts.header_markdown(decided)
