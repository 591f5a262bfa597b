"""The app's Dataset tab without a server: an atlas made here by `cait.atlas` on a tiny random model is opened
by the tab's handlers, which must show the atlas's own numbers (summary.json, heads.csv) and images (the
reader's), open an exemplar in the single-image tabs with its head enlarged, build an atlas equal to the
command line's, and answer bad folders with one message."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import randomise_
from PIL import Image

import cait
from app import dataset_view as dv
from app import torch_thread
from app.loading import load_page_model
from app.models import ModelCache, ModelChoice
from app.shared import CLASS_ATTENTION_TAB
from app.tabs.class_attention import GalleryProps
from app.tabs.dataset import AtlasPlaces, DatasetTab
from cait.atlas.__main__ import main as atlas_main
from cait.data import build_dataset, read_images
from cait.data.export import export_scenes

CPU = torch.device("cpu")
SHOWN = tuple(GalleryProps(False, None, f"CA layer {i + 1}") for i in range(4))  # the galleries before an image
LOOK = dict(cmap="inferno", alpha=0.5, scale="per tile", view="smooth", keep=1.0, th_layer=1)


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A random cait_pico_32 checkpoint, 40 exported scenes with their boxes, its atlas (by the command line),
    and the tab's handlers on a page whose model is that checkpoint."""
    from app_tabs import page_under_test

    root = tmp_path_factory.mktemp("dataset_tab")
    weights = root / "pico.safetensors"
    cait.save_weights(randomise_(cait.load_model("cait_pico_32", weights=False).model, seed=5), weights)
    scenes = root / "scenes"
    export_scenes(scenes, n=40, split="val")
    flags = ["--checkpoint", str(weights), "--data", str(scenes), "--boxes", str(scenes / "boxes.json")]
    flags += ["--exemplars", "3", "--workers", "0", "--device", "cpu"]
    atlases = root / "atlases"
    assert atlas_main([*flags, "--out", str(atlases / "pico")]) == 0
    cache = ModelCache(load_page_model, max_bytes=2**30, device=CPU)
    choice = ModelChoice(None, str(weights))
    app = page_under_test(cache, choice, AtlasPlaces.of(str(atlases / "pico"), None))
    return SimpleNamespace(
        root=root, weights=weights, scenes=scenes, atlas=atlases / "pico", dh=app.tabs.dataset, choice=choice, app=app
    )


def click_exemplar(world, atlas, k, index, choice=None) -> dict:
    """A click on exemplar `index` of head k, the page's other inputs by name as the page passes them."""
    asked = dict(choice=choice or world.choice, ca_props=SHOWN, atlas=atlas, head=k, **LOOK)
    return world.dh.open_exemplar(SimpleNamespace(index=index), **asked)


def test_the_tab_shows_the_atlas_files_numbers(world):
    dh, t = world.dh, world.dh.parts
    summary = json.loads((world.atlas / "summary.json").read_text())
    heads = rows(world.atlas / "heads.csv")
    out = dh.start(world.choice)  # a new page opens --atlas
    atlas = out[t.atlas]
    assert out[t.msg] == "" and atlas.folder == world.atlas  # the page's model made it: nothing to say
    assert [label for label, _ in out[t.head].choices] == [f"CA{l} head {h}" for l in (1, 2) for h in (1, 2)]
    overview = out[t.overview]
    assert summary["model"] in overview and summary["data"] in overview and "40 images" in overview
    assert f"{summary['top1']:.1%}" in overview and "atlas.html" in overview
    for k in (0, 3):  # CA1 head 1 and CA2 head 2
        shown = dh.show_head(atlas, k, world.choice)
        entry = summary["heads"][k]
        table = {r[0]: r[1:] for r in shown[t.numbers]}  # shown to 4 decimals
        near = lambda *v: pytest.approx(list(v), abs=5e-5)
        assert table["map entropy (nats)"] == near(entry["entropy_mean"], *entry["entropy_ci95"])
        assert table["direct logit attribution"] == near(entry["dla_mean"], *entry["dla_ci95"])
        assert table["pointing game (hit rate)"] == near(entry["pointing_mean"], *entry["pointing_ci95"])
        assert table["attention mass in the box"] == near(entry["mass_in_box_mean"], *entry["mass_in_box_ci95"])
        per_class = dict(shown[t.per_class])
        expected = {c[len("dla_mean_") :]: float(v) for c, v in heads[k].items() if c.startswith("dla_mean_") and v}
        assert per_class == pytest.approx(expected, abs=5e-5) and len(expected) >= 2
        assert list(per_class.values()) == sorted(per_class.values(), reverse=True)  # largest first
        captions = [caption for _, caption in shown[t.exemplars]["value"]]
        assert len(captions) == 6 and captions[0].startswith("most concentrated: ")
        named = [e["path"] for e in entry["exemplars"]["concentrated"] + entry["exemplars"]["writes"]]
        assert [c.split(": ")[1].split(" · ")[0] for c in captions] == [Path(p).name for p in named]
    z = np.array(out[t.heatmap].data[0].z, dtype=float)
    columns = list(out[t.heatmap].data[0].x)
    classes = [c.rsplit(" (n=", 1)[0] for c in columns]  # each column with its images, as its title promises
    assert z.shape == (4, len(classes))
    np.testing.assert_allclose(z[3], [float(heads[3][f"dla_mean_{c}"]) for c in classes])
    predicted = [r["prediction"] for r in rows(world.atlas / "images.csv")]
    assert columns == [f"{c} (n={predicted.count(c)})" for c in classes] and sum(map(predicted.count, classes)) == 40


def test_exemplar_tiles_are_the_atlas_images(world):
    """Each tile's pixels are the image the reader reads for the exemplar's path."""
    dh, t = world.dh, world.dh.parts
    atlas = dv.read_atlas(world.atlas)
    data = read_images(str(world.scenes), cait.get_config("cait_pico_32"), normalise=False)
    tiles = dh.show_head(atlas, 3, world.choice)[t.exemplars]["value"]
    for (file, _), exemplar in zip(tiles, atlas.exemplars(3)):
        with Image.open(file) as shown, Image.open(world.scenes / exemplar.path) as original:
            assert shown.tobytes() == original.convert("RGB").tobytes()
        assert exemplar.path in data.paths


def test_a_click_on_an_exemplar_opens_it_with_the_head_enlarged(world):
    p = world.app.p
    atlas = dv.read_atlas(world.atlas)
    k, index = 3, 4  # CA2 head 2, its second "writes most" exemplar
    exemplar = atlas.exemplars(k)[index]
    out = click_exemplar(world, atlas, k, index)
    with Image.open(out[p.image_in]) as opened, Image.open(world.scenes / exemplar.path) as original:
        assert opened.tobytes() == original.convert("RGB").tobytes()
    assert out[p.selected] == (1, 2) and out[p.ca_big].label.startswith("CA2 head 2")
    assert out[p.open_tab] == CLASS_ATTENTION_TAB and out[p.tabs].selected == "ca"
    assert f"exemplar of CA2 head 2, {exemplar.path}" in out[p.status]
    # the single-image analysis predicts what the atlas recorded for this image, with its probability
    row = next(r for r in rows(world.atlas / "images.csv") if r["path"] == exemplar.path)
    a = out[p.analysis]
    names = world.app.cache.get(world.choice).cfg.labels  # images.csv names the classes
    assert names[a.top_class] == row["prediction"]
    assert a.probs.max() == pytest.approx(float(row["probability"]), abs=1e-4)


def test_the_mechanisms_tab_opened_after_an_exemplar_follows_its_top_class(world):
    """An exemplar opened while the Mechanisms tab is closed empties the tab's class menu with the image's other
    results, so that the tab, opened next, shows the exemplar's top class, not the class chosen before."""
    p = world.app.p
    out = click_exemplar(world, dv.read_atlas(world.atlas), 3, 0)
    a = out[p.analysis]
    chosen = (a.top_class + 1) % len(a.probs)  # the class the menu held for the image before
    menu = out.get(p.mx_class, chosen)  # the page keeps what an event does not write
    opened = world.app.tabs.mechanisms.opened(world.choice, a, menu)
    assert opened[p.mx_class].value == a.top_class
    label = world.app.cache.get(world.choice).labels[a.top_class]
    assert opened[p.mx_lens].data[1].name == f"probability of '{label}'"  # the lens drawn is of that class


def test_an_atlas_of_another_model_says_so_and_selects_no_head(world):
    dh, p, t = world.dh, world.app.p, world.dh.parts
    other = ModelChoice("cait_pico_32", random_init=True)
    out = dh.open(str(world.atlas), other)
    assert "another model" in out[t.msg]
    clicked = click_exemplar(world, out[t.atlas], 0, 0, other)
    assert clicked[p.selected] is None and "another model" in clicked[t.msg]


def test_an_atlas_matches_the_page_by_its_weights_not_by_how_the_server_was_started(world):
    """Issue 49 N37: a page whose choice differs from the atlas's arguments only in --random-init (which does not
    change weights read from a file) has the atlas's model: no "another model" note, and an exemplar's head is
    enlarged."""
    from dataclasses import replace

    started_random = replace(world.choice, random_init=True)
    out = world.dh.open(str(world.atlas), started_random)
    assert out[world.dh.parts.msg] == ""
    clicked = click_exemplar(world, out[world.dh.parts.atlas], 3, 0, started_random)
    assert clicked[world.app.p.selected] == (1, 2)  # CA2 head 2 enlarged


def test_bad_folders_and_missing_images_are_one_calm_message(world, tmp_path):
    dh, t = world.dh, world.dh.parts
    (tmp_path / "empty").mkdir()
    broken = tmp_path / "broken"
    shutil.copytree(world.atlas, broken)
    (broken / "summary.json").write_text('{"data": "x", "heads": [')
    cases = {
        str(tmp_path / "nowhere"): "is not a folder",
        str(tmp_path / "empty"): "holds no summary.json",
        str(broken): "summary.json is unreadable",
    }
    for folder, said in cases.items():
        out = dh.open(folder, world.choice)
        assert out[t.msg].startswith("**Cannot open this atlas:**") and said in out[t.msg], out[t.msg]
        assert "\n" not in out[t.msg] and out[t.atlas] is None
    gone = tmp_path / "gone"
    shutil.copytree(world.atlas, gone)
    atlas = dv.read_atlas(gone)
    data = tmp_path / "scenes"
    shutil.copytree(world.scenes, data)
    atlas.args["data"] = str(data)
    first = atlas.exemplars(0)[0]
    (data / first.path).write_bytes(b"")  # an exemplar's file emptied after the atlas was made
    shown = dh.show_head(atlas, 0, world.choice)
    assert len(shown[t.exemplars]["value"]) == 5 and first.path in shown[t.msg] and "unreadable" in shown[t.msg]
    clicked = click_exemplar(world, atlas, 0, 0)
    assert list(clicked) == [t.msg] and clicked[t.msg].startswith("**Cannot open this exemplar:**")


def test_the_tab_offers_the_atlases_of_a_folder(world, tmp_path):
    shutil.copytree(world.atlas, tmp_path / "a")
    (tmp_path / "not_an_atlas").mkdir()
    assert dv.find_atlases(tmp_path) == [tmp_path / "a"]
    t = world.dh
    dh = DatasetTab(t.parts, t.shared, t.cache, AtlasPlaces.of(None, str(tmp_path)), analyse=t.analyse)
    out = dh.start(world.choice)
    assert (("a", str(tmp_path / "a"))) in out[dh.parts.pick].choices


def test_an_atlas_built_in_the_tab_equals_the_command_lines(world, tmp_path):
    dh, t = world.dh, world.dh.parts
    assert "Choose 1 to 2,000 scenes" in dh.builder.build_atlas(world.choice, 2001)[t.msg]
    out = dh.builder.build_atlas(world.choice, 24)
    built = out[t.atlas].folder
    flags = ["--checkpoint", str(world.weights), "--data", "fashion-mnist-scenes", "--limit", "24"]
    assert command_line_atlas(flags, tmp_path / "cli") == 0
    mine, theirs = (json.loads((d / "summary.json").read_text()) for d in (built, tmp_path / "cli"))
    assert mine == theirs and mine["images"] == 24
    # an exemplar of the built-in scenes is rendered through the reader: the scene itself
    exemplar = out[t.atlas].exemplars(0)[0]
    clicked = click_exemplar(world, out[t.atlas], 0, 0)
    scene = build_dataset("fashion-mnist-scenes", "val", subset=24, cache=True)[int(exemplar.path.rsplit("/")[-1])][0]
    with Image.open(clicked[world.app.p.image_in]) as opened:
        assert opened.tobytes() == scene.convert("RGB").tobytes()


def test_an_atlas_built_in_the_tab_takes_the_caches_model_within_a_ceiling_of_one_copy(world, monkeypatch):
    """The app's model memory holds one copy of the page's model: building an atlas takes that model from the
    cache (nothing loaded from disk a second time: no `cait.load_model` call), and the ceiling holds."""
    from app_tabs import page_under_test

    from cait import factory

    loads = []
    counted = lambda choice, **options: loads.append(choice) or load_page_model(choice, **options)  # noqa: E731
    one_copy = world.app.cache.get(world.choice).nbytes
    cache = ModelCache(counted, max_bytes=one_copy, device=CPU)
    app = page_under_test(cache, world.choice)
    from_disk, real = [], factory.load_model
    monkeypatch.setattr(factory, "load_model", lambda *a, **k: from_disk.append(a) or real(*a, **k))
    out = app.tabs.dataset.builder.build_atlas(world.choice, 8)
    assert out[app.p.msg] == "" and out[app.p.atlas].summary["images"] == 8
    assert loads == [world.choice] and from_disk == []
    assert cache.cached == [world.choice] and cache.nbytes == one_copy <= cache.max_bytes


def test_the_command_line_names_the_atlas_and_its_folder():
    from app.main import parse_args

    args = parse_args(["--atlas", "runs/atlas/pico"])
    assert AtlasPlaces.of(args.atlas, args.atlas_dir) == AtlasPlaces("runs/atlas/pico", "runs/atlas")
    args = parse_args(["--atlas-dir", "elsewhere"])
    assert AtlasPlaces.of(args.atlas, args.atlas_dir) == AtlasPlaces(None, "elsewhere")
    assert AtlasPlaces.of(None, None).folder == "out"


def test_exemplar_captions_carry_their_classes_and_filter_by_class_and_outcome(world):
    """Issue 49 N46: each caption says the true and predicted class (images.csv's); the filters choose among the
    images of that class or of right or wrong predictions by the atlas's own rule (checked here against the
    atlas's exemplars, which `cait.atlas` chose over all images)."""
    dh, t = world.dh, world.dh.parts
    atlas = dv.read_atlas(world.atlas)
    csv_rows = {r["path"]: r for r in rows(world.atlas / "images.csv")}
    for k in range(len(atlas.heads)):
        mine = atlas.exemplars(k, None, "all")
        assert [e.path for e in mine] == [e.path for e in atlas.exemplars(k)]
        chosen = atlas.table.chosen(None, "right")  # the same rule over a filter that keeps every right one
        key = f"ca{atlas.heads[k]['layer']}_head{atlas.heads[k]['head']}_entropy"
        right = sorted(
            (p for p, r in csv_rows.items() if r["correct"] == "True"), key=lambda p: (float(csv_rows[p][key]), p)
        )
        assert len(chosen) == len(right)
    shown = dh.show_head(atlas, 3, world.choice, None, "wrong")
    captions = [c for _, c in shown[t.exemplars]["value"]]
    assert captions and all(" · wrong: true " in c for c in captions)
    for e in atlas.exemplars(3, None, "wrong"):
        r = csv_rows[e.path]
        assert r["correct"] == "False" and e.caption.endswith(
            f"wrong: true {r['label']}, predicted {r['prediction']} ({float(r['probability']):.2f})"
        )
    cls = atlas.filter_classes()[0]
    picked = atlas.exemplars(3, cls, "all")
    assert picked and all((csv_rows[e.path]["label"] or csv_rows[e.path]["prediction"]) == cls for e in picked)
    expected = sorted(
        (p for p, r in csv_rows.items() if r["label"] == cls and r["ca2_head2_dla"] != ""),
        key=lambda p: (-float(csv_rows[p]["ca2_head2_dla"]), list(csv_rows).index(p)),
    )[: len(atlas.heads[3]["exemplars"]["writes"])]
    assert [e.path for e in picked if e.number == "dla"] == expected


def test_an_opened_atlas_is_offered_as_a_zip(world):
    import zipfile

    out = world.dh.open(str(world.atlas), world.choice)
    value = out[world.dh.parts.download].value
    with zipfile.ZipFile(value["path"] if isinstance(value, dict) else value) as z:
        names = set(z.namelist())
    assert {f"pico/{n}" for n in ("summary.json", "heads.csv", "images.csv", "atlas.html")} <= names
    assert not any("shards" in n for n in names)


def test_a_stopped_build_keeps_its_shards_and_the_next_build_continues_them(world, tmp_path, monkeypatch):
    """Issue 49 N42: the page's Stop ends a build after the shards written (none lost but the one under way),
    the atlas is kept in the user cache, and building it again computes only the rest, to the command line's
    numbers."""
    from cait.atlas import shards

    dh, t = world.dh, world.dh.parts
    page = SimpleNamespace(session_hash="page-1")
    written, real = [], shards.write_shard

    def write_then_stop(path, *args, **kwargs):
        real(path, *args, **kwargs)
        written.append(path.name)
        if len(written) == 1:
            dh.stops.press(page)  # the Stop, pressed while the second shard is computed

    monkeypatch.setattr(shards, "write_shard", write_then_stop)
    n = 2 * dv.BUILT_SHARD + 8
    out = dh.builder.build_atlas(world.choice, n, request=page)
    assert out[t.msg].startswith("**Stopped** with 64 of 136 scenes done") and len(written) == 1
    loaded = world.app.cache.get(world.choice)
    folder = dv.built_folder(dh_kept(), loaded.name, loaded.sourced.made_from, n)
    assert str(folder) in out[t.msg] and not (folder / "summary.json").exists()
    out = dh.builder.build_atlas(world.choice, n, request=page)
    assert out[t.atlas].folder == folder and written[1:] == written[1:3] and len(written) == 3  # the rest only
    flags = ["--checkpoint", str(world.weights), "--data", "fashion-mnist-scenes", "--limit", str(n)]
    flags += ["--shard-size", str(dv.BUILT_SHARD)]  # float64 sums taken shard by shard: the same shards
    assert command_line_atlas(flags, tmp_path / "cli") == 0
    mine, theirs = (json.loads((d / "summary.json").read_text()) for d in (folder, tmp_path / "cli"))
    assert mine == theirs


def command_line_atlas(flags: list[str], out: Path) -> int:
    """`python -m cait.atlas FLAGS` in this process, with the threads of the app's long lane, where the tab
    builds (one image's pass's threads): float sums follow the thread count."""
    threads = torch.get_num_threads()
    try:
        argv = [*flags, "--threads", str(torch_thread.interactive_threads()), "--workers", "0", "--device", "cpu"]
        return atlas_main([*argv, "--out", str(out)])
    finally:
        torch.set_num_threads(threads)


def dh_kept() -> Path:
    from app.tabs.dataset import BUILT
    from app.workdir import kept

    return kept(BUILT)


def test_a_stop_pressed_while_a_build_reads_its_scenes_ends_it_then(world, monkeypatch):
    """Issue 49's last loose end: the Stop acted only at the model's first block, after every scene was read. The
    reading (held here until the test releases it) goes on unseen; the build answers Stopped at once, and the
    page's Stop is no longer needed."""
    import threading

    import cait.atlas.run as atlas_run

    dh, t = world.dh, world.dh.parts
    reading, release, real = threading.Event(), threading.Event(), atlas_run.read_data

    def slow_read(args, cfg):
        reading.set()
        assert release.wait(120)
        return real(args, cfg)

    monkeypatch.setattr(atlas_run, "read_data", slow_read)
    page = SimpleNamespace(session_hash="reading-page")
    dh.stops.asked(page)  # the Build button
    answer = {}
    n = 44  # a count no other test builds: the user cache keeps atlases, and one finished would need no reading
    builder = threading.Thread(target=lambda: answer.update(out=dh.builder.build_atlas(world.choice, n, page)))
    builder.start()
    try:
        assert reading.wait(60)
        dh.stops.press(page)
        builder.join(30)
        assert "out" in answer and not release.is_set()  # answered while the reading still went on
    finally:
        release.set()
        builder.join(120)
    assert answer["out"][t.msg].startswith(f"**Stopped** with 0 of {n} scenes done")
    assert dh.stops.ended(page)[t.stop].interactive is False  # nothing of the page runs: disabled


def test_an_example_or_an_upload_after_an_exemplar_leaves_no_exemplar_highlighted(world):
    """One selection frame on the page, on the image shown: an exemplar opened frames itself (and no example);
    an example clicked, or a file uploaded, after it unframes the exemplar (its tiles stay)."""
    p = world.app.p
    atlas = dv.read_atlas(world.atlas)
    opened = click_exemplar(world, atlas, 0, 1)
    assert opened[p.examples].constructor_args == {"selected_index": None} and p.exemplars not in opened
    path = world.app.cache.get(world.choice).examples[0][0]
    clicked = SimpleNamespace(value={"image": {"path": path}}, index=0)
    example = world.app.tabs.image.example(clicked, choice=world.choice, ca_props=SHOWN, **LOOK)
    assert example[p.exemplars].constructor_args == {"selected_index": None} and example[p.image_in] == path
    upload = world.app.tabs.image.upload(choice=world.choice, ca_props=SHOWN, image_in={"path": path}, **LOOK)
    assert all(upload[g].constructor_args == {"selected_index": None} for g in (p.exemplars, p.examples))


def test_a_file_trained_again_at_the_atlass_path_is_another_model_to_the_tab_and_the_command_line(
    world, tmp_path, capsys
):
    """The weights' identity in the atlas's record: the page of the file's new weights finds the atlas of the
    old ones made by another model (its built atlases go to another folder), and the command line refuses to
    continue it, though every flag, the checkpoint's path too, is the same."""
    import shutil

    weights = tmp_path / "pico.safetensors"
    shutil.copy(world.weights, weights)
    flags = ["--checkpoint", str(weights), "--data", str(world.scenes), "--limit", "4"]
    assert command_line_atlas(flags, tmp_path / "atlas") == 0
    atlas, choice = dv.read_atlas(tmp_path / "atlas"), ModelChoice(None, str(weights))
    before = load_page_model(choice, CPU).sourced
    cait.save_weights(randomise_(cait.load_model("cait_pico_32", weights=False).model, seed=9), weights)
    after = load_page_model(choice, CPU).sourced
    assert atlas.made_by(before.made_from) and not atlas.made_by(after.made_from)
    folders = {dv.built_folder(tmp_path, "pico", made.made_from, 8) for made in (before, after)}
    assert len(folders) == 2
    capsys.readouterr()
    assert command_line_atlas(flags, tmp_path / "atlas") == 2
    assert f"weights id {before.weights_id} there, {after.weights_id} here" in capsys.readouterr().err


def test_a_table_across_heads_gives_the_right_and_wrong_split_and_a_row_opens_its_head(world):
    """Item 59.22: every head's numbers over the right and the wrong predictions apart, as the atlas wrote them
    (summary.json's `<number>_correct_mean` and `_wrong_mean`, heads.csv's), with wrong minus right; clicking a
    row opens that head."""
    dh, t = world.dh, world.dh.parts
    summary = json.loads((world.atlas / "summary.json").read_text())
    out = dh.open(str(world.atlas), world.choice)
    table = out[t.heads_split]
    headers, body = table.headers, table.value["data"]
    assert headers[:4] == ["head", "entropy right", "entropy wrong", "entropy wrong − right"]
    assert "mass in box wrong" in headers and len(body) == len(summary["heads"]) == 4
    for row, entry in zip(body, summary["heads"]):
        cells = dict(zip(headers, row))
        assert cells["head"] == f"CA{entry['layer']} head {entry['head']}"
        for number, name in (("entropy", "entropy"), ("dla", "DLA"), ("pointing", "pointing")):
            right, wrong = entry[f"{number}_correct_mean"], entry[f"{number}_wrong_mean"]
            assert cells[f"{name} right"] == pytest.approx(right, abs=5e-5)
            assert cells[f"{name} wrong"] == pytest.approx(wrong, abs=5e-5)
            assert cells[f"{name} wrong − right"] == pytest.approx(wrong - right, abs=1e-4)
    atlas = out[t.atlas]
    opened = dh.head_of_row(SimpleNamespace(index=[2, 1]), atlas=atlas, choice=world.choice, of_class=None)
    assert opened[t.head] == 2 and opened[t.numbers] == dh.show_head(atlas, 2, world.choice)[t.numbers]
