"""analysis/mechanisms.py and the helpers the analysis scripts share, against the library's one owner of each:
the class attention per token-patching region (`cait.explain.token_patching.region_sums`), the images' name
(the reader's), the built-in data's name (`cait.data.data_name`) and a saved result read again for --replot."""

from __future__ import annotations

import argparse
import json

import mechanisms
import pytest
import torch
from _common import budget_note, read_saved
from conftest import randomise_
from PIL import Image

import cait
from cait import explain
from cait.data import data_name, read_images, split_name
from cait.explain.token_patching import region_sums
from cait.preprocess import normalise


@pytest.fixture(scope="module")
def pico():
    return randomise_(cait.load_model("cait_pico_32", weights=False).model, seed=1).eval()


def test_attention_per_region_is_the_librarys_region_sums(pico, monkeypatch):
    """The script sums the class attention over the regions through the library's `region_sums` (no copy of
    its own), and the sums equal each region's patches added up here by reshaping the map."""
    called, real = [], region_sums
    monkeypatch.setattr(mechanisms, "region_sums", lambda maps, region: called.append(region) or real(maps, region))
    torch.manual_seed(0)
    cfg = pico.cfg
    x = torch.rand(3, cfg.in_chans, cfg.img_size, cfg.img_size)
    args = argparse.Namespace(seed=0, corruption="gaussian_noise", severity=3, region=2)
    measured = mechanisms.measure(pico, x, args)
    assert called == [2]
    maps = explain.class_attention(pico, normalise(x, cfg)).maps.mean((1, 2))  # [3, g, g]
    g = cfg.grid_size
    by_hand = maps.view(3, g // 2, 2, g // 2, 2).sum((2, 4))  # each 2 x 2 block of patches, row-major
    torch.testing.assert_close(measured["attention"], by_hand)


def test_the_images_are_named_as_the_reader_names_them(pico, tmp_path):
    """Built-in scenes: the reader's name (which begins with the split's); a folder: its name, and how many
    unreadable files were left out."""
    args = argparse.Namespace(images=None, quick=True, data="fashion-mnist-scenes", scenes=200)
    x, what = mechanisms.views(pico, args)
    assert len(x) == mechanisms.QUICK_IMAGES
    assert what == read_images("fashion-mnist-scenes", pico.cfg, limit=mechanisms.QUICK_IMAGES).name
    assert what.startswith(split_name("fashion-mnist-scenes", "val"))
    (tmp_path / "Bag").mkdir()
    for i in range(2):
        Image.new("RGB", (32, 32), (40 * i, 90, 30)).save(tmp_path / "Bag" / f"{i}.png")
    (tmp_path / "Bag" / "broken.png").write_text("not an image")
    folder = argparse.Namespace(images=None, quick=True, data=str(tmp_path), scenes=200)
    x, what = mechanisms.views(pico, folder)
    assert len(x) == 2
    assert what == f"{read_images(str(tmp_path), pico.cfg).name} (1 unreadable left out)"


def test_the_budget_names_the_data_as_the_library_does():
    args = argparse.Namespace(data="fashion-mnist-scenes", subset=64, epochs=1, batch_size=32, lr=1e-3, val_subset=32)
    assert budget_note(args).startswith(f"{data_name('fashion-mnist-scenes')}, first 64 training images")
    assert data_name("fashion-mnist-scenes") == "Fashion-MNIST scenes" and data_name("out/x") == "out/x"


def test_a_saved_result_is_read_again_or_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"rows": [1], "made_from": "m"}))
    assert read_saved(path, "rows", "made_from") == ([1], "m")
    for keys in (("rows", "curves"), ("rows",)):
        target = path if keys != ("rows",) else tmp_path / "missing.json"
        with pytest.raises(SystemExit) as exit_:
            read_saved(target, *keys)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: cannot replot from {target}") and err.count("\n") == 1
