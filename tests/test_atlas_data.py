"""The head atlas and evaluate on data the project never made: wide images whose boxes the centre crop cuts off,
bad COCO boxes, a COCO file without image sizes and a broken boxed image, a folder of only unreadable files;
and what the page says of the data (chance level, per-class failures, counts, exemplar context), each against
numbers computed here from the COCO file, images.csv or the model."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import randomise_
from PIL import Image

import cait
from cait.atlas import report
from cait.atlas.__main__ import main as atlas
from cait.checkpoint import save_weights
from cait.evaluate.__main__ import main as evaluate

SQUARE = {"Bag": 5, "Coat": 4, "Sneaker": 3}  # 32x32 images per class folder: pico_32's view is the image itself


def _noise(path: Path, size: tuple[int, int], seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def _coco(path: Path, boxes: dict[str, list[float]], sizes: dict[str, tuple[int, int]] | None) -> Path:
    images = [
        {"id": k, "file_name": name} | ({} if sizes is None else dict(zip(("width", "height"), sizes[name])))
        for k, name in enumerate(boxes)
    ]
    annotations = [{"image_id": k, "bbox": box} for k, box in enumerate(boxes.values())]
    path.write_text(json.dumps({"images": images, "annotations": annotations}))
    return path


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A random pico_32, 12 square noise images in 3 class folders with boxes in view, 2 wide ones (64x16) whose
    boxes the crop cuts off wholly and in part, a bad box, a box of a file that is not there; one atlas."""
    root = tmp_path_factory.mktemp("atlas_data")
    model = cait.load_model("cait_pico_32", weights=False).model
    save_weights(randomise_(model, seed=5).eval(), root / "pico.safetensors")
    data, boxes, sizes = root / "data", {}, {}
    for c, (cls, n) in enumerate(SQUARE.items()):
        for k in range(n):
            name = f"{cls}/{k}.png"
            _noise(data / name, (32, 32), 10 * c + k)
            boxes[name], sizes[name] = [2 + 3 * k, 4, 10 + 2 * c, 12 + k], (32, 32)
    for k, box in enumerate(([0, 0, 8, 16], [20, 0, 8, 8])):  # seen: x * 2 - 48: [-48, -32] and [-8, 8] -> [0, 8]
        name = f"Bag/wide{k}.png"
        _noise(data / name, (64, 16), 100 + k)
        boxes[name], sizes[name] = box, (64, 16)
    boxes["Coat/0.png"] = [5, 5, -2, 4]  # a negative width: refused
    boxes["Coat/gone.png"], sizes["Coat/gone.png"] = [1, 1, 5, 5], (32, 32)
    coco = _coco(root / "boxes.json", boxes, sizes)
    args = ["--checkpoint", str(root / "pico.safetensors"), "--data", str(data), "--boxes", str(coco)]
    args += ["--workers", "0", "--exemplars", "20"]
    with pytest.warns(UserWarning, match="left out"):
        assert atlas([*args, "--out", str(root / "atlas")]) == 0
    return dict(root=root, data=data, boxes=boxes, args=args, out=root / "atlas")


def test_boxes_out_of_view_are_not_scored_and_are_counted(world, capsys):
    """The wide image whose box is cut off has no localisation score (not a miss); the other keeps its visible
    part; the bad box and the absent file are counted; every head's mean is over the images with a box in view."""
    rows = {r["path"]: r for r in _rows(world["out"] / "images.csv")}
    assert rows["Bag/wide0.png"]["ca1_head1_pointing"] == "" and rows["Bag/wide0.png"]["ca1_head1_mass_in_box"] == ""
    assert rows["Coat/0.png"]["ca1_head1_pointing"] == ""  # its only box was refused
    assert rows["Bag/wide1.png"]["ca1_head1_pointing"] != ""
    summary = json.loads((world["out"] / "summary.json").read_text())
    boxes = summary["boxes"]
    assert boxes["images_with_box"] == 12  # 11 square with a good box, one wide with a visible part
    assert boxes["left_out"] == {"out_of_view": 1, "bad_size": 1, "not_in_folder": 1}
    scored = [r for r in rows.values() if r["ca1_head2_pointing"] != ""]
    assert len(scored) == 12
    mean = sum(float(r["ca1_head2_pointing"]) for r in scored) / 12
    assert summary["heads"][1]["pointing_mean"] == pytest.approx(mean)
    page = (world["out"] / "atlas.html").read_text()
    assert "12 image(s) with a box in the model&#x27;s view are scored; 3 box(es) left out" in page


def test_chance_level_is_the_mean_box_share_of_the_boxes_in_view(world):
    """Chance of the pointing game and the mass in the box, from the COCO file by hand: each square box's area
    over 32 x 32, the wide one's visible 8 x 16."""
    shares = [
        w * h / 1024
        for name, (_, _, w, h) in world["boxes"].items()
        if "wide" not in name and name not in ("Coat/0.png", "Coat/gone.png")
    ] + [8 * 16 / 1024]
    summary = json.loads((world["out"] / "summary.json").read_text())
    assert summary["boxes"]["box_share_mean"] == pytest.approx(np.mean(shares), abs=1e-6)
    low, high = summary["boxes"]["box_share_ci95"]
    half = 1.959963984540054 * np.std(shares, ddof=1) / np.sqrt(len(shares))
    assert (low, high) == pytest.approx((np.mean(shares) - half, np.mean(shares) + half), abs=1e-6)
    assert f"{np.mean(shares):.3f} ± {half:.3f}" in (world["out"] / "atlas.html").read_text()


def test_per_class_failures_right_wrong_split_and_class_names(world):
    """images.csv names classes; per-class top-1, the confusion matrix and each head's mean over the right and
    the wrong predictions apart equal what images.csv gives when counted here."""
    rows = _rows(world["out"] / "images.csv")
    assert {r["label"] for r in rows} == set(SQUARE)
    classes = cait.load_model("cait_pico_32", weights=False).model.cfg.labels
    assert {r["prediction"] for r in rows} <= set(classes)
    summary = json.loads((world["out"] / "summary.json").read_text())
    for cls in SQUARE:
        mine = [r for r in rows if r["label"] == cls]
        entry = summary["per_class"][cls]
        assert entry["images"] == len(mine)
        assert entry["top1"] == pytest.approx(sum(r["prediction"] == cls for r in mine) / len(mine))
        wrong = Counter(r["prediction"] for r in mine if r["prediction"] != cls)
        if wrong:
            assert (entry["mistaken_for"], entry["mistaken_images"]) == wrong.most_common(1)[0]
    confusion = summary["confusion"]
    pairs = Counter((r["label"], r["prediction"]) for r in rows)
    for i, true in enumerate(confusion["classes"]):
        for j, predicted in enumerate(confusion["classes"]):
            assert confusion["counts"][i][j] == pairs[true, predicted]
    heads = {r["head"]: r for r in _rows(world["out"] / "heads.csv")}
    entry = summary["heads"][2]
    for outcome, flag in (("correct", "True"), ("wrong", "False")):
        values = [float(r["ca2_head1_dla"]) for r in rows if r["correct"] == flag]
        assert int(heads["ca2_head1"][f"dla_{outcome}_images"]) == len(values)
        if values:
            assert float(heads["ca2_head1"][f"dla_{outcome}_mean"]) == pytest.approx(np.mean(values), abs=1e-6)
            assert entry[f"dla_{outcome}_mean"] == pytest.approx(np.mean(values), abs=1e-6)
    page = (world["out"] / "atlas.html").read_text()
    assert "Which classes fail" in page and "Confusion matrix of the labelled images" in page


def test_page_counts_and_exemplar_context(world):
    """The heatmap's columns say their image counts; exemplars are whole images (a wide image's tile is wide),
    with the box drawn and the true and predicted class and probability in the caption."""
    rows = {r["path"]: r for r in _rows(world["out"] / "images.csv")}
    page = (world["out"] / "atlas.html").read_text()
    for predicted, n in Counter(r["prediction"] for r in rows.values()).items():
        assert f"{predicted} (n={n})" in page
    r = rows["Bag/wide1.png"]
    assert f"true Bag, predicted {r['prediction']} ({float(r['probability']):.2f})" in page
    tiles = {
        alt: Image.open(io.BytesIO(base64.b64decode(src)))
        for src, alt in re.findall(r'<img src="data:image/jpeg;base64,([^"]+)" alt="([^"]+)"', page)
    }
    assert len(tiles) == len(rows)  # 20 exemplars per head and kind: every image is one
    assert {t.size for t in tiles.values()} == {(112, 112), (448, 112)}  # the 64x16 images whole, not cropped
    for path, tile in tiles.items():
        a = np.asarray(tile).astype(int)
        green = int(((a[..., 1] > 180) & (a[..., 0] < 90) & (a[..., 2] < 90)).sum())
        boxed = rows[path]["ca1_head1_pointing"] != ""
        assert (green > 20) == boxed, (path, green)  # the box in view drawn, none where there is none


def test_a_coco_file_without_sizes_and_a_broken_boxed_image(world, tmp_path, capsys):
    """Issue 47: the COCO file may leave out width and height; an unreadable boxed image is then skipped and
    named, by the atlas and by evaluate alike, not a traceback."""
    data = tmp_path / "data"
    for k in range(3):
        _noise(data / "Bag" / f"{k}.png", (32, 32), k)
    (data / "Bag" / "broken.png").write_text("not an image")
    boxes = {f"Bag/{k}.png": [2, 2, 20, 20] for k in range(3)} | {"Bag/broken.png": [2, 2, 20, 20]}
    coco = _coco(tmp_path / "boxes.json", boxes, sizes=None)
    model = ["--checkpoint", str(world["root"] / "pico.safetensors")]
    given = [*model, "--data", str(data), "--boxes", str(coco), "--workers", "0"]
    with pytest.warns(UserWarning, match="1 of an image that cannot be read"):
        assert atlas([*given, "--exemplars", "1", "--out", str(tmp_path / "atlas")]) == 0
    line = "3 image(s) with a box in the model's view are scored; 1 box(es) left out: 1 of an image that cannot be read"
    assert line in capsys.readouterr().err  # the log says it too
    summary = json.loads((tmp_path / "atlas" / "summary.json").read_text())
    assert summary["skipped"] == ["Bag/broken.png"] and summary["boxes"]["images_with_box"] == 3
    skipped = _rows(tmp_path / "atlas" / "skipped.csv")
    assert skipped == [{"path": "Bag/broken.png", "reason": "not an image PIL can read"}]
    with pytest.warns(UserWarning, match="1 of an image that cannot be read"):
        assert evaluate([*given, "--methods", "ca1_mean", "--json", str(tmp_path / "e.json")]) == 0
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["skipped"] == ["Bag/broken.png"] and result["images"] == 3
    assert {r["method"]: r["images"] for r in result["localization"]}["ca1_mean"] == 3


def test_a_folder_of_only_unreadable_files_is_an_error_naming_each(world, tmp_path, capsys):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "a.png").write_text("not an image")
    (folder / "b.jpg").write_bytes(b"")
    model = ["--checkpoint", str(world["root"] / "pico.safetensors")]
    out = tmp_path / "out"
    assert atlas([*model, "--data", str(folder), "--workers", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line]  # the rest: the progress bar
    assert len(lines) == 1 and "Traceback" not in err
    assert "none of the 2 images could be read (a.png: not an image PIL can read; b.jpg: " in lines[0]
    assert [r["path"] for r in _rows(out / "skipped.csv")] == ["a.png", "b.jpg"]
    assert not (out / "atlas.html").exists() and not (out / "summary.json").exists()


def test_limit_takes_every_class_and_a_16_bit_png_is_not_white(world, tmp_path):
    """--limit 6 of the 14 images: every class folder is in it (the first 6 would be Bag only); a 16-bit
    PNG gets the prediction of its 8-bit twin."""
    out = tmp_path / "limited"
    assert atlas([*world["args"], "--limit", "6", "--out", str(out)]) == 0
    assert {r["label"] for r in _rows(out / "images.csv")} == set(SQUARE)
    deep, flat = tmp_path / "deep", tmp_path / "flat"
    values = np.linspace(1028, 49858, 32 * 32).reshape(32, 32).astype(np.uint16)
    twin = np.floor(values / 65535 * 255 + 0.5).astype(np.uint8)  # the decoder rounds 16 bits to 8
    for folder, image in ((deep, Image.fromarray(values)), (flat, Image.fromarray(twin))):
        folder.mkdir()
        image.save(folder / "x.png")
        model = ["--checkpoint", str(world["root"] / "pico.safetensors")]
        assert atlas([*model, "--data", str(folder), "--workers", "0", "--out", str(folder / "atlas")]) == 0
    got = [_rows(f / "atlas" / "images.csv")[0] for f in (deep, flat)]
    assert got[0]["prediction"] == got[1]["prediction"]
    assert float(got[0]["probability"]) == pytest.approx(float(got[1]["probability"]), abs=1e-6)


def test_boxes_none_in_view_finish_the_atlas_without_the_box_numbers(world, tmp_path, capsys):
    """Issue 59: boxes given but none in the model's view (here every box's width and height misread as a
    corner: negative sizes) finish the atlas with every number that needs no box; the box columns are empty
    and summary.json and the page say why."""
    data = tmp_path / "data"
    for k in range(3):
        _noise(data / "Bag" / f"{k}.png", (32, 32), k)
    coco = _coco(tmp_path / "boxes.json", {f"Bag/{k}.png": [20, 20, 4 - 20, 4 - 20 - k] for k in range(3)}, None)
    model = ["--checkpoint", str(world["root"] / "pico.safetensors")]
    out = tmp_path / "atlas"
    with pytest.warns(UserWarning, match="left out"):
        assert atlas([*model, "--data", str(data), "--boxes", str(coco), "--workers", "0", "--out", str(out)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    rows = _rows(out / "images.csv")
    assert len(rows) == 3 and all(r["ca1_head1_entropy"] != "" and r["ca1_head1_pointing"] == "" for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["boxes"]["images_with_box"] == 0 and summary["heads"][0]["pointing_mean"] is None
    assert summary["heads"][0]["entropy_mean"] is not None
    heads = _rows(out / "heads.csv")
    assert heads[0]["pointing_images"] == "0" and heads[0]["mass_in_box_mean"] == ""
    page = (out / "atlas.html").read_text()
    assert "no image has a box in the model&#x27;s view" in page


def test_the_heads_table_says_each_columns_own_image_count(world):
    """Issue 59: the table's header counted all / right / wrong images over every number, while pointing and
    mass in the box are over the images with a box in view. Each column says its own n, counted here from
    images.csv."""
    rows = _rows(world["out"] / "images.csv")
    boxed = [r for r in rows if r["ca1_head1_pointing"] != ""]
    page = (world["out"] / "atlas.html").read_text()
    header = re.search(r"<tr><th rowspan='2'>head</th>.*?</tr><tr>(.*?)</tr>", page).group(1)
    cells = re.findall(r"<th>(\w+) \((\d+)\)</th>", header)
    expected = []
    for of in (rows, rows, boxed, boxed):  # entropy, DLA, pointing, mass in box
        right = sum(r["correct"] == "True" for r in of)
        expected += [("all", str(len(of))), ("right", str(right)), ("wrong", str(len(of) - right))]
    assert cells == expected


def test_a_box_of_an_unreadable_image_counts_the_same_with_or_without_sizes(world, tmp_path, capsys):
    """Issue 59: the box of an unreadable image was scored-and-then-not when the COCO file gave width and height
    ("4 scored" early, 2 scored at the end), left out when it did not. Now both files give one count, in the
    reader's warning, summary.json and the closing line: a file PIL cannot open and truncated ones (a PNG and a
    JPEG whose headers read) are each a box left out as unreadable. The reader's warning, made from the files'
    headers before any pixel is decoded, counts the truncated ones as boxed and says they are scored only if
    they decode: it never says more images "are scored" than the closing line."""
    data = tmp_path / "data"
    for k in range(2):
        _noise(data / "Bag" / f"{k}.png", (32, 32), k)
    (data / "Bag" / "broken.png").write_text("not an image")
    whole = io.BytesIO()
    Image.new("RGB", (32, 32), "red").save(whole, format="PNG")
    (data / "Bag" / "cut.png").write_bytes(whole.getvalue()[:60])  # the header, not the pixels
    whole = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), np.uint8)).save(whole, format="JPEG")
    (data / "Bag" / "cut.jpg").write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    names = ["Bag/0.png", "Bag/1.png", "Bag/broken.png", "Bag/cut.png", "Bag/cut.jpg"]
    model = ["--checkpoint", str(world["root"] / "pico.safetensors"), "--data", str(data), "--workers", "0"]
    said, closed = {}, {}
    for sizes in (None, {n: (32, 32) for n in names}):
        coco = _coco(tmp_path / f"boxes{sizes is None}.json", {n: [2, 2, 20, 20] for n in names}, sizes)
        out = tmp_path / f"atlas{sizes is None}"
        with pytest.warns(UserWarning) as warned:
            assert atlas([*model, "--boxes", str(coco), "--exemplars", "1", "--out", str(out)]) == 0
        boxes = json.loads((out / "summary.json").read_text())["boxes"]
        assert boxes["images_with_box"] == 2 and boxes["left_out"] == {"unreadable": 3}, boxes
        closing = [line for line in capsys.readouterr().err.splitlines() if "are scored" in line]
        said[sizes is None] = [str(w.message).split(": ", 1)[1] for w in warned if "scored" in str(w.message)]
        closed[sizes is None] = closing
        assert closing == [report.box_line(boxes)] and closing[0].startswith("2 image(s)")
    early = "4 image(s) with a box in the model's view by their headers, scored if their pixels decode (the closing "
    early += "line counts them); 1 box(es) left out: 1 of an image that cannot be read"
    assert said[True] == said[False] == [early]
    assert closed[True] == closed[False]
