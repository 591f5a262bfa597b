"""python -m cait.evaluate over a user's folder (exported scenes with COCO boxes and one broken file): the same
top-1 and per-head pointing as the atlas on the same images, a flat folder without labels, and two torchrun
processes against one."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PICO_SCENES

from cait.atlas.__main__ import main as atlas_main
from cait.evaluate.__main__ import main as evaluate_main

REPO = Path(__file__).resolve().parent.parent
SCENES = PICO_SCENES
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, pico_scenes):
    """The shared random cait_pico_32 checkpoint and exported scenes (one broken file), and one evaluate run's JSON."""
    root = tmp_path_factory.mktemp("evaluate_data")
    checkpoint, scenes = pico_scenes
    (root / "pico.safetensors").symlink_to(checkpoint)
    model = ["--checkpoint", str(root / "pico.safetensors")]
    data = ["--data", str(scenes), "--boxes", str(scenes / "boxes.json")]
    args = [*model, *data, "--batch-size", "16", "--workers", "0", "--precision", "fp32"]
    # a costly method on the first 20 images: a batch and a part of the next, so on both ranks under torchrun
    costly = ["--methods", "ca1_mean", "saliency", "--attribution-subset", "20"]
    assert evaluate_main([*args, *costly, "--json", str(root / "one.json")]) == 0
    one = json.loads((root / "one.json").read_text())
    return dict(root=root, scenes=scenes, model=model, args=args, costly=costly, one=one)


def test_top1_and_per_head_pointing_equal_the_atlas(setup):
    out = setup["root"] / "atlas"
    atlas = [*setup["model"], "--data", str(setup["scenes"]), "--boxes", str(setup["scenes"] / "boxes.json")]
    assert atlas_main([*atlas, "--batch-size", "16", "--workers", "0", "--exemplars", "1", "--out", str(out)]) == 0
    summary, result = json.loads((out / "summary.json").read_text()), setup["one"]
    assert result["images"] == summary["images"] == SCENES and result["labelled"] == SCENES
    assert result["skipped"] == summary["skipped"] == ["Bag/broken.png"]
    assert result["top1"] == pytest.approx(summary["top1"], abs=1e-12)
    rows = {r["method"]: r for r in result["localization"]}
    for head in summary["heads"]:
        row = rows[f"ca{head['layer']}_head{head['head']}"]
        assert row["images"] == SCENES
        assert row["pointing_game"] == pytest.approx(head["pointing_mean"], abs=1e-9)
        assert row["mass_in_box"] == pytest.approx(head["mass_in_box_mean"], abs=1e-6)


def test_the_table_names_the_data_and_the_skipped_file(setup, capsys):
    files = sorted(p.relative_to(setup["scenes"]).as_posix() for p in setup["scenes"].glob("*/*.png"))
    assert files.index("Bag/broken.png") >= 20  # not among the costly method's first 20 images
    limit = files.index("Bag/broken.png") + 2  # the first files in the reader's order, the broken one among them
    assert evaluate_main([*setup["args"], "--methods", "ca1_mean", "--limit", str(limit), "--sample", "first"]) == 0
    out = capsys.readouterr().out
    assert "skipped 1 unreadable image(s): Bag/broken.png" in out and f"on {limit - 1} images" in out
    assert f"data: ImageFolder {setup['scenes']}/" in out and "boxes: boxes.json" in out


def test_a_flat_folder_has_no_top1_but_its_boxes_are_scored(setup, capsys):
    flat = setup["root"] / "flat"
    flat.mkdir()
    files = sorted(setup["scenes"].glob("*/*.png"))[:12]
    for f in files:
        shutil.copy(f, flat / f.name)
    json_path = setup["root"] / "flat.json"
    args = [*setup["model"], "--data", str(flat), "--boxes", str(setup["scenes"] / "boxes.json"), "--workers", "0"]
    assert evaluate_main([*args, "--methods", "ca1_mean", "--json", str(json_path)]) == 0
    result = json.loads(json_path.read_text())
    unreadable = sum(f.name == "broken.png" for f in files)
    assert result["top1"] is None and result["labelled"] == 0 and result["images"] == 12 - unreadable
    assert "no labels" in capsys.readouterr().out
    rows = {r["method"]: r for r in result["localization"]}
    assert rows["ca1_head1"]["images"] == rows["ca1_mean"]["images"] == 12 - unreadable


def test_bad_data_is_one_line(setup, capsys):
    assert evaluate_main([*setup["model"], "--data", str(setup["root"] / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown data") and len(err.strip().splitlines()) == 1


def test_two_torchrun_processes_equal_one(setup):
    out = setup["root"] / "two.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "cait.evaluate", *setup["args"], *setup["costly"], "--json", str(out)]
    proc = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("top-1 accuracy") == 1  # rank 0 reports
    two, one = json.loads(out.read_text()), setup["one"]
    assert two.pop("processes") == 2 and one.pop("processes") == 1
    assert {r["method"]: r["images"] for r in two["localization"]}["saliency"] == 20  # on the first 20, both ranks
    assert _same(two, one, 1e-4)


def _same(x, y, tol: float) -> bool:
    """JSON values equal: strings, counts and keys exactly, floats to `tol`; rows of a list in any order."""
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k], tol) for k in x)
    if isinstance(x, list):
        if x and isinstance(x[0], dict) and "method" in x[0]:
            x, y = sorted(x, key=lambda r: r["method"]), sorted(y, key=lambda r: r["method"])
        return len(x) == len(y) and all(_same(u, v, tol) for u, v in zip(x, y))
    if isinstance(x, float):
        return math.isclose(x, y, rel_tol=tol, abs_tol=tol)
    return x == y
