"""The product-style evaluation set (cait.data.products): test-split garments only, dark on a light background and
inside their boxes, pinned bit for bit, and scored through `python -m cait.evaluate --data DIR --boxes`."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from cait.data.fashion_mnist import load_fashion_mnist
from cait.data.products import ProductPhotos, main


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


def test_photos_are_test_garments_drawn_dark_on_light_inside_their_boxes():
    photos = ProductPhotos(40)
    garments, labels = load_fashion_mnist("val")  # the test split, never the training one
    np.testing.assert_array_equal(photos.garments, garments[:40])
    np.testing.assert_array_equal(photos.labels, labels[:40])
    centred = 0
    for i in range(40):
        image = photos.render(i).astype(float).sum(-1) / 3
        x0, y0, x1, y1 = photos.boxes[i]
        inside = np.zeros(image.shape, bool)
        inside[int(np.floor(y0)) : int(np.ceil(y1)), int(np.floor(x0)) : int(np.ceil(x1))] = True
        darkest = np.argsort(image.ravel())[:100]
        assert inside.ravel()[darkest].all(), i  # the garment is the dark thing, and its box holds it
        background = np.median(image[~inside])
        assert background > 0.75 * 255, i  # white to light grey
        assert image.ravel()[darkest].mean() < background - 40, i  # the garment darker than its background
        centre = ((x0 + x1) / 2, (y0 + y1) / 2)
        centred += max(abs(c - 32) for c in centre) < 4
    assert 5 < centred < 35  # centred and off-centre photos both


# sha256 (first 16 hex digits) of photos 0, 7 and 39 and of the 40 boxes, seed 0, as first generated
PINNED = ("1309e9b6898d8d4d", "8fb24e6cffdcb2dd", "2ee411b490a4a523", "6b853f952cf58bff")


def test_photos_are_pinned_and_a_shorter_set_is_a_prefix():
    photos = ProductPhotos(40)
    digests = (*(_digest(photos.render(i)) for i in (0, 7, 39)), _digest(photos.boxes))
    assert digests == PINNED
    first = ProductPhotos(8)
    np.testing.assert_array_equal(first.boxes, photos.boxes[:8])
    assert _digest(first.render(7)) == PINNED[1]
    assert _digest(ProductPhotos(8, seed=1).render(7)) != PINNED[1]


def test_evaluate_scores_an_export_as_the_model_scores_the_photos(tmp_path, capsys):
    from PIL import Image

    import cait
    from cait.evaluate.__main__ import main as evaluate_main
    from cait.preprocess import eval_transform

    out, n = tmp_path / "products", 8
    assert main([str(out), "--n", str(n)]) == 0
    coco = json.loads((out / "boxes.json").read_text())
    assert [a["category_id"] - 1 for a in coco["annotations"]] == load_fashion_mnist("val")[1][:n].tolist()
    args = ["--model", "cait_micro_136", "--data", str(out), "--boxes", str(out / "boxes.json")]
    assert evaluate_main([*args, "--methods", "ca1_mean", "--workers", "0", "--json", str(tmp_path / "e.json")]) == 0
    result = json.loads((tmp_path / "e.json").read_text())
    # the same photos straight through the model, without the exported files and the dataset reader
    model = cait.load_model("cait_micro_136", pretrained=True).model.eval()
    photos, transform = ProductPhotos(n), eval_transform(model.cfg)
    x = torch.stack([transform(Image.fromarray(photos.render(i))) for i in range(n)])
    with torch.no_grad():
        top1 = (model(x).argmax(-1).numpy() == photos.labels).mean()
    assert result["top1"] == pytest.approx(top1)
    # a second export replaces the first; a directory that is not one is refused in one line
    assert main([str(out), "--n", "3"]) == 0
    assert len(list(out.rglob("*.png"))) == 3
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("mine")
    assert main([str(tmp_path / "other"), "--n", "3"]) == 2
    assert main([str(tmp_path / "bad"), "--n", "0"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "not empty" in errors[0] and "--n" in errors[1], errors
