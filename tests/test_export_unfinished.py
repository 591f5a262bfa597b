"""An interrupted export never reads as a complete dataset: `cait.data.export` writes boxes.json last (the boxes
wait in a marker file meanwhile), the reader warns about an unfinished export and about boxes naming files that
are not there, and the next export into the folder replaces the interrupted one."""

from __future__ import annotations

import errno
import json
import os
import warnings

import pytest
from PIL import Image

from cait.config import get_config
from cait.data import DataWarning, read_images
from cait.data.export import BOXES_FILE
from cait.data.export import main as export_main
from cait.data.names import UNFINISHED_EXPORT

PICO = get_config("cait_pico_32")


def test_an_interrupted_export_has_no_boxes_and_is_said_to_be_unfinished(tmp_path, capsys, monkeypatch):
    out = tmp_path / "scenes"
    real_save, saved = Image.Image.save, []

    def disk_full_at_the_fifth(image, *args, **kwargs):
        saved.append(1)
        if len(saved) == 5:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[0]))
        return real_save(image, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", disk_full_at_the_fifth)
    capsys.readouterr()
    assert export_main([str(out), "--n", "12"]) == 2
    err = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.startswith("error")]
    assert len(err) == 1 and "No space left on device" in err[0]
    monkeypatch.undo()
    assert not (out / BOXES_FILE).exists() and len(list(out.rglob("*.png"))) == 4
    with pytest.warns(DataWarning, match="unfinished export"):
        assert len(read_images(str(out), PICO)) == 4
    assert export_main([str(out), "--n", "12"]) == 0  # the interrupted export is replaced
    assert not (out / UNFINISHED_EXPORT).exists() and len(list(out.rglob("*.png"))) == 12
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        data = read_images(str(out), PICO, boxes=out / BOXES_FILE)
    assert len(data) == 12 and not data.boxes.isnan().any()


def test_boxes_naming_missing_files_are_warned_about(tmp_path):
    out = tmp_path / "scenes"
    assert export_main([str(out), "--n", "12"]) == 0
    with warnings.catch_warnings():  # a limit leaves files out that are there: no warning
        warnings.simplefilter("error", DataWarning)
        assert len(read_images(str(out), PICO, boxes=out / BOXES_FILE, limit=2)) == 2
    coco = json.loads((out / BOXES_FILE).read_text())
    gone = [out / image["file_name"] for image in coco["images"][-3:]]
    for path in gone:
        path.unlink()
    with pytest.warns(DataWarning, match=rf"boxes 3 image\(s\) missing from {out}.*{gone[0].name}"):
        assert len(read_images(str(out), PICO, boxes=out / BOXES_FILE)) == 9
