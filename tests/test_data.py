"""Datasets: real Fashion-MNIST files, deterministic scenes with honest boxes, ImageFolder errors."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cait.data import DataError, FashionMNISTScenes, build_dataset, load_fashion_mnist
from cait.data.products import ProductPhotos


def test_fashion_mnist_is_the_real_dataset():
    images, labels = load_fashion_mnist("train")
    assert images.shape == (60000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [6000] * 10  # Fashion-MNIST's balanced train split
    test_images, test_labels = load_fashion_mnist("val")
    assert test_images.shape == (10000, 28, 28) and np.bincount(test_labels).tolist() == [1000] * 10
    image, label = build_dataset("fashion-mnist", "val", subset=3)[0]
    assert image.mode == "L" and image.size == (28, 28) and label == int(test_labels[0])


def test_scenes_are_deterministic_and_split_honestly():
    a, b = FashionMNISTScenes("val", subset=20), FashionMNISTScenes("val", subset=20)
    assert np.array_equal(a.render(7), b.render(7))
    assert not np.array_equal(a.render(7), a.render(8))
    # the train split draws its garments only from the 60k train images, the test split from the 10k test ones
    assert a.garments.shape[0] == 10000 and FashionMNISTScenes("train", subset=5).garments.shape[0] == 60000
    assert list(a.labels) == list(load_fashion_mnist("val")[1][:20])
    image, label = a[0]
    assert image.size == (64, 64) and image.mode == "RGB"


def test_scene_boxes_hold_the_garment_and_vary():
    scenes = FashionMNISTScenes("val", subset=400)
    boxes = scenes.boxes
    assert (
        (boxes[:, 0] >= 0).all()
        and (boxes[:, 1] >= 0).all()
        and (boxes[:, 2] <= 64).all()
        and (boxes[:, 3] <= 64).all()
    )
    assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
    frame = scenes.sides / 64
    assert frame.min() >= 0.29 and frame.max() <= 0.66  # garment frame: 30-65% of the canvas side
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    assert centres.std(axis=0).min() > 8  # positions are spread over the canvas, not centred
    # The garment is what changes inside its box: re-rendering sample 0 without it differs only there.
    i = 0
    with_garment = scenes.render(i).astype(int)
    saved = scenes.garments
    scenes.garments = saved.copy()
    scenes.garments[i] = 0
    without = scenes.render(i).astype(int)
    scenes.garments = saved
    changed = np.abs(with_garment - without).sum(-1) > 30
    x0, y0, x1, y1 = boxes[i]
    ys, xs = np.nonzero(changed)
    assert len(ys) > 20
    assert (
        xs.min() >= np.floor(x0) - 1
        and xs.max() <= np.ceil(x1)
        and ys.min() >= np.floor(y0) - 1
        and ys.max() <= np.ceil(y1)
    )


def test_shipped_examples_match_the_dataset():
    root = Path(__import__("cait").__file__).parent / "examples"
    meta = json.loads((root / "examples.json").read_text())
    sources = {"scenes": FashionMNISTScenes("val"), "products": ProductPhotos(100)}
    by_source = [entry.get("source", "scenes") for entry in meta["examples"]]
    assert by_source.count("scenes") >= 12 and by_source.count("products") == 2
    for entry, source in zip(meta["examples"], by_source):
        images, i = sources[source], entry["test_index"]
        shipped = np.asarray(Image.open(root / entry["file"]).convert("RGB"))
        assert np.array_equal(shipped, images.render(i)), entry["file"]
        assert entry["label"] == int(images.labels[i])
        assert np.allclose(entry["box_xyxy"], images.boxes[i], atol=0.01)


def test_image_folder_and_clear_errors(tmp_path):
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            d = tmp_path / split / cls
            d.mkdir(parents=True)
            Image.new("RGB", (20, 10), (200, 0, 0)).save(d / "a.png")
    ds = build_dataset(str(tmp_path), "train")
    assert ds.classes == ("cat", "dog") and len(ds) == 2 and ds[1][1] == 1
    no_splits = tmp_path / "no_splits"
    no_splits.mkdir()
    with pytest.raises(DataError, match="does not exist"):
        build_dataset(str(no_splits), "train")
    empty = tmp_path / "empty"
    (empty / "train" / "cls").mkdir(parents=True)
    with pytest.raises(DataError, match="no usable images"):
        build_dataset(str(empty), "train")
    with pytest.raises(DataError, match="unknown dataset"):
        build_dataset("imagenet-please", "train")
    with pytest.raises(DataError, match="positive"):
        build_dataset("fashion-mnist", "train", subset=0)


def test_missing_debian_files_say_how_to_install(tmp_path):
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist.__wrapped__("train", tmp_path)
