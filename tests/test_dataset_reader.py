"""The dataset reader (`cait.data.read_images`) and the scene export (`cait.data.export`): exported scenes read
back as the scenes themselves, boxes through the model's preprocessing against drawn pixels, ImageNet synsets,
unreadable files, and the one-line errors."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from cait.config import get_config
from cait.data import DataError, DataWarning, FashionMNIST, FashionMNISTScenes, read_images, split_name
from cait.data.export import main as export_main
from cait.data.image_file import read_image
from cait.data.reader import limit_subset
from cait.preprocess import model_view
from cait.runtime import CACHE_ENV

N = 40
PICO = get_config("cait_pico_32")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "scenes"
    assert export_main([str(out), "--n", str(N)]) == 0
    return out


def _save(path, image=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    (image or Image.new("RGB", (12, 9), (90, 140, 30))).save(path)


@pytest.mark.parametrize("variant", ["cait_pico_32", "cait_micro_136"])  # the view down- and upsamples
def test_exported_scenes_read_back_as_the_scenes(exported, variant):
    cfg = get_config(variant)
    folder = read_images(str(exported), cfg, boxes=exported / "boxes.json")
    scenes = read_images("fashion-mnist-scenes", cfg, limit=N)
    raw = FashionMNISTScenes("val", subset=N)
    assert len(folder) == len(scenes) == N and folder.classes == scenes.classes
    assert "boxes: boxes.json" in folder.name and "40 images, 10 classes" in folder.name
    for k, path in enumerate(folder.paths):
        i = int(path.rsplit("/", 1)[1].removesuffix(".png"))  # the scene's index in the split
        x, label, box, index, ok = folder[k]
        x_scene, label_scene, box_scene, _, _ = scenes[i]
        assert ok and index == k and label == label_scene == int(raw.labels[i])
        assert torch.equal(x, x_scene)  # lossless PNG: the same pixels, so the same model view
        expected = torch.as_tensor(raw.boxes[i]) * cfg.img_size / raw.canvas  # square canvas, crop_pct 1
        torch.testing.assert_close(box, expected, atol=1e-4, rtol=0)
        torch.testing.assert_close(box_scene, expected, atol=1e-4, rtol=0)
    assert torch.equal(folder.labels, torch.tensor([int(raw.labels[int(p[-9:-4])]) for p in folder.paths]))


def test_a_split_of_the_built_in_data_has_one_name_wherever_it_is_shown(tmp_path, monkeypatch, capsys):
    """`split_name` names a split; the reader's name, the dataset's and the scene cache's log begin with it."""
    scenes = split_name("fashion-mnist-scenes", "val")
    assert scenes == "Fashion-MNIST scenes, val split (test garments)"
    assert split_name("fashion-mnist", "train") == "Fashion-MNIST, train split (training garments)"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # an empty cache: the scenes are rendered, and say so
    read = read_images("fashion-mnist-scenes", PICO, limit=3)
    assert read.name == f"{scenes}: 3 scenes, seed 0, style default"
    assert f"rendering {scenes} into {tmp_path}" in capsys.readouterr().err
    assert FashionMNISTScenes("val", subset=3).name == scenes
    train = split_name("fashion-mnist", "train")
    assert read_images("fashion-mnist", PICO, split="train", limit=2).name == f"{train}: 2 images"
    assert FashionMNIST("train", subset=2).name == train
    for data, split in (("out/scenes", "val"), ("fashion-mnist", "test")):
        with pytest.raises(DataError, match=f"{data}|{split}"):
            split_name(data, split)


def test_export_refuses_a_foreign_directory_and_replaces_its_own(tmp_path, capsys):
    out = tmp_path / "out"
    assert export_main([str(out), "--n", "12", "--style", "varied", "--seed", "3"]) == 0
    coco = json.loads((out / "boxes.json").read_text())
    assert [c["name"] for c in coco["categories"]] == list(FashionMNISTScenes.classes)
    assert len(coco["images"]) == len(coco["annotations"]) == 12
    varied = FashionMNISTScenes("val", subset=12, style="varied", seed=3)
    first = out / coco["images"][0]["file_name"]
    assert np.array_equal(np.asarray(Image.open(first)), varied.render(0)) and first.name == "00000.png"
    assert export_main([str(out), "--n", "5"]) == 0  # a previous export: replaced, no file of it left
    assert len(list(out.rglob("*.png"))) == 5
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    capsys.readouterr()
    assert export_main([str(tmp_path / "mine"), "--n", "5"]) == 2
    err = capsys.readouterr().err
    assert "not a previous export" in err and err.count("\n") == 1
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def _white_extent(view: Image.Image) -> list[float]:
    """(x0, y0, x1, y1) of the pixels brighter than mid-grey, as pixel edges."""
    ys, xs = np.nonzero(np.asarray(view.convert("L")) > 127)
    return [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]


@pytest.mark.parametrize("crop_pct", [1.0, 0.875])
@pytest.mark.parametrize("size", [(40, 20), (30, 70)])  # wide and tall
def test_box_to_input_follows_the_models_view_of_a_non_square_image(size, crop_pct):
    cfg = PICO.replace(crop_pct=crop_pct)
    width, height = size
    # boxes on whole pixels: one inside the crop, one across its edge (clipped)
    for box in ([width * 0.4, height * 0.4, width * 0.6, height * 0.55], [0, 0, width * 0.3, height * 0.5]):
        box = [float(round(v)) for v in box]
        canvas = np.zeros((height, width), np.uint8)
        canvas[int(box[1]) : int(box[3]), int(box[0]) : int(box[2])] = 255
        drawn = _white_extent(model_view(Image.fromarray(canvas), cfg))
        mapped = cfg.box_to_input(torch.tensor(box), (width, height))
        assert torch.allclose(mapped, torch.tensor(drawn, dtype=torch.float32), atol=1.0), (box, drawn, mapped)


def test_box_to_input_of_a_square_canvas_scales_and_keeps_nan():
    boxes = torch.tensor([[3.0, 5.0, 40.0, 60.0], [float("nan")] * 4])
    mapped = PICO.box_to_input(boxes, 64)
    torch.testing.assert_close(mapped[0], boxes[0] * 0.5)
    assert mapped[1].isnan().all()
    torch.testing.assert_close(PICO.box_to_input(boxes, (64, 64)), mapped, equal_nan=True)


def test_imagenet_synset_folders_map_to_imagenet_indices(tmp_path):
    cfg = get_config("cait_xxs24_224")  # its config only: no weights
    # tench, goldfish, toilet tissue: the first, second and last ImageNet-1k classes
    for synset in ("n01440764", "n01443537", "n15075141"):
        _save(tmp_path / "val" / synset / "a.jpg")
    _save(tmp_path / "val" / "not-a-class" / "b.png")
    _save(tmp_path / "val" / "crane" / "c.png")  # two ImageNet classes (134 and 517) have this name: neither
    _save(tmp_path / "val" / "Goldfish, Carassius auratus" / "d.png")  # a class's name: its index
    with pytest.warns(DataWarning, match="2 class folder.*'crane', 'not-a-class'"):
        images = read_images(str(tmp_path), cfg)
    assert images.paths[:3] == ["Goldfish, Carassius auratus/d.png", "crane/c.png", "n01440764/a.jpg"]
    assert images.labels.tolist() == [1, -1, 0, 1, 999, -1]
    x, label, box, _, ok = images[4]
    assert ok and label == 999 and x.shape == (3, 224, 224) and box.isnan().all() and images.boxes is None


def test_class_folders_match_names_ignoring_case_spaces_and_underscores(tmp_path):
    for folder in ("t-shirt_top", "ANKLE BOOT", "Bag"):
        _save(tmp_path / folder / "deep" / "x.png")  # images are found recursively within a class folder
    (tmp_path / "Bag" / "readme.txt").write_text("not an image")
    _save(tmp_path / "0_unknown" / "x.png")
    with pytest.warns(DataWarning, match="1 class folder.*'0_unknown'"):
        images = read_images(str(tmp_path), PICO, limit=2)  # the first folder maps to nothing: no error
    assert images.paths == ["0_unknown/x.png", "ANKLE BOOT/deep/x.png"] and images.labels.tolist() == [-1, 9]
    (tmp_path / "0_unknown" / "x.png").unlink()
    assert read_images(str(tmp_path), PICO).labels.tolist() == [9, 8, 0]
    _save(tmp_path / "loose.png")
    with pytest.warns(DataWarning, match="1 image.* outside any class folder"):
        assert "loose.png" not in read_images(str(tmp_path), PICO).paths


def test_a_flat_folder_is_unlabelled_and_broken_files_are_skipped(tmp_path):
    for name in ("a.png", "c.jpg"):
        _save(tmp_path / name)
    (tmp_path / "b_text.png").write_text("this is not a picture")
    (tmp_path / "d_empty.png").write_bytes(b"")
    good = tmp_path / "e.png"
    _save(good, Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)))
    (tmp_path / "f_truncated.png").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    images = read_images(str(tmp_path), PICO, normalise=False)
    assert images.labels is None and images.boxes is None and "no labels" in images.name
    x, y, box, index, ok = next(iter(DataLoader(images, batch_size=len(images))))
    assert [p for p, good in zip(images.paths, ok) if not good] == ["b_text.png", "d_empty.png", "f_truncated.png"]
    assert x.shape == (6, 3, 32, 32) and (y == -1).all() and box.isnan().all() and index.tolist() == list(range(6))
    assert (x[~ok] == 0).all() and x[ok].amax() > 0 and x[ok].amax() <= 1  # normalise=False: pixels in [0, 1]


def test_boxes_of_several_annotations_take_the_largest_and_match_by_base_name(tmp_path):
    _save(tmp_path / "cat" / "a.png", Image.new("RGB", (64, 32)))
    _save(tmp_path / "cat" / "b.png", Image.new("RGB", (64, 32)))
    coco = {
        "images": [{"id": 7, "file_name": "elsewhere/a.png", "width": 64, "height": 32}],
        "annotations": [{"image_id": 7, "bbox": [40, 4, 8, 8]}, {"image_id": 7, "bbox": [20, 2, 20, 20]}],
    }
    (tmp_path / "boxes.json").write_text(json.dumps(coco))
    cfg = PICO.replace(img_size=224, labels=("dog", "cat"), num_classes=2)
    images = read_images(str(tmp_path), cfg, boxes=tmp_path / "boxes.json")
    # 64x32 -> 448x224, crop x from 112: [20, 2, 40, 22] * 7 - [112, 0]
    torch.testing.assert_close(images.boxes[0], torch.tensor([28.0, 14.0, 168.0, 154.0]))
    assert images.boxes[1].isnan().all() and images.labels.tolist() == [1, 1]


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_bad_input_gets_one_clear_line(tmp_path):
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(DataError, match="holds no images") as e:
        read_images(str(tmp_path / "empty"), PICO)
    _one_line(e)
    for folder in ("cats", "dogs"):
        _save(tmp_path / "pets" / folder / "1.png")
    with pytest.raises(DataError, match="none of the class folders") as e:
        read_images(str(tmp_path / "pets"), PICO)
    assert "'cats'" in _one_line(e) and "'Trouser'" in _one_line(e)
    _save(tmp_path / "flat" / "1.png")
    (tmp_path / "other.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "zzz.png"}], "annotations": []}))
    with pytest.raises(DataError, match="boxes none of the 1 images") as e:
        read_images(str(tmp_path / "flat"), PICO, boxes=tmp_path / "other.json")
    assert "zzz.png" in _one_line(e)
    (tmp_path / "bad.json").write_text("{images: [")
    with pytest.raises(DataError, match="not JSON") as e:
        read_images(str(tmp_path / "flat"), PICO, boxes=tmp_path / "bad.json")
    _one_line(e)
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(DataError, match="not a COCO boxes file"):
        read_images(str(tmp_path / "flat"), PICO, boxes=tmp_path / "list.json")
    with pytest.raises(DataError, match="unknown data"):
        read_images(str(tmp_path / "nowhere"), PICO)
    with pytest.raises(DataError, match="directory of images"):
        read_images("fashion-mnist-scenes", PICO, boxes=tmp_path / "bad.json")


def _coco(path, images, annotations):
    path.write_text(json.dumps({"images": images, "annotations": annotations}))
    return path


def test_boxes_out_of_view_or_bad_are_left_out_and_counted(tmp_path):
    """A 64x16 image seen as its central 32x32 of a 128x32 resize: a box in the cut-off left quarter is not
    scored (NaN, counted), a box half in view keeps its visible part; bad boxes and boxes of files the folder
    does not hold are counted by reason and warned in one line."""
    for name in ("a", "b", "c", "d", "e"):
        _save(tmp_path / f"{name}.png", Image.new("RGB", (64, 16)))
    entries = [{"id": k, "file_name": f"{n}.png"} for k, n in enumerate(["a", "b", "c", "d", "e", "gone"])]
    boxes = [[0, 0, 8, 16], [20, 0, 8, 8], [20, 2, -4, 8], [70, 0, 5, 5], [40, 0, 10, 10], [0, 0, 5, 5]]
    anns = [{"image_id": k, "bbox": b} for k, b in enumerate(boxes)]
    with pytest.warns(DataWarning, match="1 image.* in the model.s view.*5 box.*left out") as caught:
        images = read_images(str(tmp_path), PICO, boxes=_coco(tmp_path / "boxes.json", entries, anns))
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    # x: * 2 - 48 (resize 64 -> 128, crop from 48); y: * 2
    assert images.boxes[0].isnan().all()  # [0, 16] -> [-48, -16]: cut off
    torch.testing.assert_close(images.boxes[1], torch.tensor([0.0, 0.0, 8.0, 16.0]))  # x [-8, 8] -> [0, 8]
    assert images.boxes[2:].isnan().all()  # c: negative width; d: right of the image; e: right of the view
    assert images.box_count.boxed == 1
    assert images.box_count.left_out == {"out_of_view": 2, "bad_size": 1, "outside_image": 1, "not_in_folder": 1}


RED = (4, 9, 16, 19)  # the stored pixels (x0, y0, x1, y1) of the red patch in `_tagged`'s 40x30 JPEG


def _tagged(path, orientation: int) -> None:
    """A 40x30 JPEG, black with a red patch at `RED` in its stored pixels, tagged with EXIF `orientation`."""
    a = np.zeros((30, 40, 3), np.uint8)
    a[RED[1] : RED[3], RED[0] : RED[2]] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(a).save(path, quality=95, exif=exif.tobytes())


def _red_box(x: torch.Tensor) -> torch.Tensor:
    """The red patch's (x0, y0, x1, y1) in a model view [3, H, W] with values in [0, 1]."""
    ys, xs = torch.nonzero((x[0] > 0.5) & (x[1] < 0.35) & (x[2] < 0.35), as_tuple=True)
    return torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float32)


def test_boxes_of_an_exif_rotated_jpeg_follow_the_rotation_the_decoder_applies(tmp_path):
    """A box in the stored pixels of a JPEG tagged with each EXIF orientation (the COCO file giving the stored
    width and height, or none) lands on the patch it boxes in the model's view, which is of the picture turned
    upright by the decoder; a COCO file giving the upright size has its box drawn on the upright picture."""
    for k in range(1, 9):
        _tagged(tmp_path / f"{k}.jpg", k)
    x, y, right, bottom = RED
    stored = [x, y, right - x, bottom - y]
    entries = [{"id": k, "file_name": f"{k}.jpg"} | ({"width": 40, "height": 30} if k % 2 else {}) for k in range(1, 9)]
    anns = [{"image_id": k, "bbox": stored} for k in range(1, 9)]
    images = read_images(str(tmp_path), PICO, boxes=_coco(tmp_path / "stored.json", entries, anns), normalise=False)
    assert images.box_count.boxed == 8 and not images.box_count.left_out
    for k in range(8):
        view, _, box, _, ok = images[k]
        assert ok and images.paths[k] == f"{k + 1}.jpg"
        torch.testing.assert_close(box, _red_box(view), atol=1.5, rtol=0, msg=f"orientation {k + 1}")
    # orientation 6 (turned 90 degrees clockwise to stand up): the upright picture is 30x40, its patch at
    # x 30 - 19 .. 30 - 9, y 4 .. 16; a COCO file of that size boxes it there
    upright = [{"id": 1, "file_name": "6.jpg", "width": 30, "height": 40}]
    turned = [{"image_id": 1, "bbox": [30 - bottom, x, bottom - y, right - x]}]
    boxes = _coco(tmp_path / "upright.json", upright, turned)
    images = read_images(str(tmp_path), PICO, boxes=boxes, normalise=False)
    view, _, box, _, _ = images[images.paths.index("6.jpg")]
    torch.testing.assert_close(box, _red_box(view), atol=1.5, rtol=0)


def test_a_sixteen_bit_png_is_scaled_to_eight_bits(tmp_path):
    values = np.linspace(1028, 49858, 32 * 32).reshape(32, 32).astype(np.uint16)
    Image.fromarray(values).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode == "I;16"
    x, _, _, _, ok = read_images(str(tmp_path), PICO, normalise=False)[0]
    assert ok
    expected = torch.from_numpy(np.floor(values / 65535 * 255 + 0.5).astype(np.float32) / 255)  # rounded
    torch.testing.assert_close(x[0], expected)  # not 255 everywhere, as PIL's convert("RGB") makes it
    assert (x[0] == x[1]).all() and (x[1] == x[2]).all()
    eight = Image.fromarray(np.arange(256, dtype=np.int32).reshape(16, 16))  # mode I holding 8-bit values: kept
    eight.save(tmp_path / "eight.tif")
    assert eight.mode == "I" and np.array_equal(np.asarray(read_image(tmp_path / "eight.tif", mode="L")), eight)


def test_an_unreadable_boxed_image_without_a_size_is_skipped_with_its_reason(tmp_path):
    _save(tmp_path / "good.png", Image.new("RGB", (32, 32)))
    (tmp_path / "broken.png").write_text("not an image")
    entries = [{"id": 1, "file_name": "good.png"}, {"id": 2, "file_name": "broken.png"}]  # no width, height
    anns = [{"image_id": 1, "bbox": [4, 4, 10, 10]}, {"image_id": 2, "bbox": [4, 4, 10, 10]}]
    with pytest.warns(DataWarning, match="1 of an image that cannot be read"):
        images = read_images(str(tmp_path), PICO, boxes=_coco(tmp_path / "boxes.json", entries, anns))
    assert images.paths == ["broken.png", "good.png"] and images.boxes[0].isnan().all()
    assert not images[0][4] and images.skip_reason(0) == "not an image PIL can read"
    assert images.skip_reason(1) is None


def test_limit_takes_a_seeded_stratified_subset(tmp_path):
    """40 Bag and 24 Coat images, --limit 16: 10 and 6, spread over each folder, the same every time; "first"
    keeps the folder order (the first 16 are all Bag)."""
    for cls, n in (("Bag", 40), ("Coat", 24)):
        for k in range(n):
            _save(tmp_path / cls / f"{k:02d}.png")
    subset = read_images(str(tmp_path), PICO, limit=16)
    assert Counter(p.split("/")[0] for p in subset.paths) == {"Bag": 10, "Coat": 6}
    assert subset.paths == sorted(subset.paths) and subset.paths != [f"Bag/{k:02d}.png" for k in range(10)]
    assert read_images(str(tmp_path), PICO, limit=16).paths == subset.paths
    assert subset.labels.tolist() == [8] * 10 + [4] * 6  # labels follow their images
    first = read_images(str(tmp_path), PICO, limit=16, sample="first")
    assert first.paths == [f"Bag/{k:02d}.png" for k in range(16)]
    groups = ["a"] * 5 + ["b"] * 3 + ["c"] * 2  # shares 2.5, 1.5, 1: the one left over goes to a (tie: first)
    assert Counter(groups[i] for i in limit_subset(groups, 5)) == {"a": 3, "b": 1, "c": 1}
