"""`python -m cait.compare` end to end on a random cait_pico_32 (32 px, grid 4, RGB) against the shipped
cait_nano_28 (28 px, grid 7, grey): the files written and read back, a model against itself (CKA's diagonal 1,
each head its own partner), two torchrun processes against one, a killed run resumed, and the refusals, each one
line with exit code 2 and nothing written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import conftest
import numpy as np
import pytest

import cait
from cait.checkpoint import save_weights
from cait.compare import CompareRunError, read_run
from cait.compare.__main__ import main
from cait.compare.files import FILES

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
WRITTEN = (*FILES, "compare.html")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, pico_scenes):
    """The data flags (the first 16 of the exported scenes, with boxes), and a reference run of pico against nano
    in one process."""
    root = tmp_path_factory.mktemp("compare")
    checkpoint, scenes = pico_scenes
    data = ["--data", str(scenes), "--boxes", str(scenes / "boxes.json"), "--limit", "16", "--sample", "first"]
    data += ["--batch-size", "4", "--shard-size", "8", "--workers", "0", "--exemplars", "1"]
    pair = ["--checkpoint-a", str(checkpoint), "--model-b", "cait_nano_28", *data]
    assert main([*pair, "--out", str(root / "reference")]) == 0
    return dict(root=root, checkpoint=checkpoint, data=data, pair=pair, reference=root / "reference")


def assert_same_files(out: Path, reference: Path) -> None:
    for name in FILES:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


def test_files_are_written_and_read_back(setup):
    run = read_run(setup["reference"])
    assert all((setup["reference"] / name).is_file() for name in WRITTEN)
    assert run.blocks_a == ["blocks.0", "blocks.1", "blocks_token_only.0", "blocks_token_only.1"]
    assert len(run.blocks_b) == 8 and run.cka.shape == (4, 8) and np.isfinite(run.cka).all()
    assert run.heads_a == [(1, 1), (1, 2), (2, 1), (2, 2)] and len(run.heads_b) == 6
    assert run.head_similarity.shape == (4, 6)
    assert len(run.matching) == 4 and len({b for _, b, _ in run.matching}) == 4
    assert "cait_nano_28" in run.model_b
    summary = run.summary
    assert summary["images"] == 16 and summary["skipped"] == []
    assert sum(row["images"] for row in run.classes) == summary["labelled"] == 16
    # the disagreements are exactly the images answered differently: agreement says how many
    assert len(run.disagreements) == round((1 - summary["agreement"]) * summary["images"])
    assert all(d.pred_a != d.pred_b for d in run.disagreements)
    pair = summary["matching"][0]["numbers"]
    assert 0 <= pair["pointing_a"] <= 1 and pair["mass_in_box_ci_low"] <= pair["mass_in_box_difference"]
    assert summary["a"]["chance"] is not None and 0 < summary["a"]["chance"] < 1


def test_a_model_against_itself_is_one_on_the_diagonal(setup):
    out = setup["root"] / "itself"
    checkpoint = str(setup["checkpoint"])
    assert main(["--checkpoint-a", checkpoint, "--checkpoint-b", checkpoint, *setup["data"], "--out", str(out)]) == 0
    run = read_run(out)
    assert np.allclose(np.diag(run.cka), 1, atol=1e-4)
    assert np.allclose(np.diag(run.head_similarity), 1, atol=1e-6)
    assert {(a, b) for a, b, _ in run.matching} == {(h, h) for h in run.heads_a}
    assert run.summary["agreement"] == 1.0 and not run.disagreements
    assert all(row["difference"] == 0 and row["mcnemar_p"] == 1 for row in run.classes)


def test_two_torchrun_processes_equal_one(setup):
    out = setup["root"] / "ranks"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "cait.compare", *setup["pair"], "--out", str(out)]
    proc = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "16 images to do over 2 processes" in proc.stderr
    assert_same_files(out, setup["reference"])


def test_a_killed_run_resumes(setup):
    out = setup["root"] / "killed"
    command = [sys.executable, "-m", "cait.compare", *setup["pair"], "--shard-size", "4", "--out", str(out)]
    proc = subprocess.Popen(command, cwd=REPO, env=ENV, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not list((out / "shards").glob("*.npz")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "shards").glob("*.npz")}
    assert 1 <= len(kept) < 4 and not (out / "summary.json").exists()
    assert main([*setup["pair"], "--shard-size", "4", "--out", str(out)]) == 0
    # the shards done before the kill are kept (the broken file's shard is retried), the files as one run's
    redone = {p.name for p in (out / "shards").glob("*.npz") if kept.get(p.name) != p.stat().st_mtime_ns}
    assert len(redone) < 4
    reference = setup["root"] / "reference4"
    assert main([*setup["pair"], "--shard-size", "4", "--out", str(reference)]) == 0
    assert_same_files(out, reference)


@pytest.fixture(scope="module")
def three_classes(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("three") / "three.safetensors"
    save_weights(cait.load_model("cait_pico_32", weights=False, num_classes=3).model, path)
    return path


@pytest.mark.parametrize("case", ["classes", "missing side", "bad checkpoint"])
def test_refusals_are_one_line_and_write_nothing(setup, three_classes, case, capsys):
    bad = setup["root"] / "not_a_checkpoint.safetensors"
    bad.write_text("not weights")
    b = {
        "classes": ["--checkpoint-b", str(three_classes)],
        "missing side": [],
        "bad checkpoint": ["--checkpoint-b", str(bad)],
    }[case]
    out = setup["root"] / f"refused-{case.replace(' ', '-')}"
    assert main(["--checkpoint-a", str(setup["checkpoint"]), *b, *setup["data"], "--out", str(out)]) == 2
    line = conftest.one_error_line(capsys.readouterr().err, progress="compare:")
    assert line.startswith("python -m cait.compare: error: ")
    assert {"classes": "different classes", "missing side": "model B is missing", "bad checkpoint": "not_a_checkpoint"}[
        case
    ] in line
    assert not out.exists()


def test_a_folder_without_a_finished_run_is_one_line(tmp_path):
    with pytest.raises(CompareRunError, match="holds no finished comparison run"):
        read_run(tmp_path)
