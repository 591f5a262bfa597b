"""`python -m cait.compare` end to end on a random cait_pico_32 (32 px, grid 4, RGB) against the shipped
cait_nano_28 (28 px, grid 7, grey): the files written and read back, a model against itself (CKA's diagonal 1,
each head its own partner), two torchrun processes against one, a killed run resumed, and the refusals, each one
line with exit code 2 and nothing written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
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
    page = (setup["reference"] / "compare.html").read_text()
    for text in ("Linear CKA between every block", "Head similarity", "Matched heads: B minus A", "B right, A wrong"):
        assert text in page
    assert "cait_nano_28" in page and page.count("<img src='data:image/jpeg;base64,") >= 2


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
    kept = conftest.killed_after_first_shard(command, out, cwd=REPO, env=ENV)
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


def test_the_merge_phase_has_a_named_progress_bar(setup, tmp_path, capsys):
    """The last phase, merging the shards into the run's files, says what it is on stderr, not a bare time: a
    finished run run again goes straight to it."""
    again = tmp_path / "again"
    shutil.copytree(setup["reference"], again)
    capsys.readouterr()
    assert main([*setup["pair"], "--out", str(again)]) == 0
    err = capsys.readouterr().err.replace("\r", "\n")
    assert re.search(r"^compare: merging the shards into its files: 100%.* 2/2 ", err, re.M), err


def test_the_library_run_reports_progress_and_stops_when_asked(setup):
    """run_compare's progress callback counts the images, and a Stop between batches keeps the shards written:
    the same options continue to the same files as one uninterrupted run."""
    from cait.compare import CompareOptions, Side, run_compare
    from cait.compare.run import CompareStopped

    checkpoint, scenes = str(setup["checkpoint"]), Path(setup["data"][1])
    options = CompareOptions(
        Side(checkpoint=checkpoint),
        Side(model="cait_nano_28"),
        data=str(scenes),
        boxes=str(scenes / "boxes.json"),
        limit=16,
        sample="first",
        batch_size=4,
        shard_size=8,
        workers=0,
        exemplars=1,
        out=setup["root"] / "library",
    )
    seen: list[tuple[int, int]] = []
    with pytest.raises(CompareStopped):
        run_compare(
            options, progress=lambda done, total: seen.append((done, total)), should_stop=lambda: len(seen) == 3
        )
    assert seen == [(4, 16), (8, 16), (12, 16)]
    assert [p.name for p in (options.out / "shards").glob("*.npz")] == ["shard-0000000-0000008.npz"]
    seen.clear()
    run_compare(options, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(4, 8), (8, 8)]
    assert_same_files(options.out, setup["reference"])


def test_the_analysis_reads_a_run_and_computes_its_verdict(setup, tmp_path):
    import compare_models

    assert compare_models.main(["--run", str(setup["reference"]), "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "compare_models.json").read_text())
    run = read_run(setup["reference"])
    partners = [s for *_, s in run.matching if s >= compare_models.HEAD_BAR]
    assert len(result["heads"]["partners"]) == len(partners)
    assert result["verdict"][1].startswith(f"Heads: {len(partners)} of {len(run.matching)} matched pairs")
    alike = int((np.nanmax(run.cka, axis=1) >= compare_models.CKA_BAR).sum())
    assert result["verdict"][0].startswith(f"Blocks: {alike} of {len(run.blocks_a)} blocks of A")
    assert (tmp_path / "compare_models.png").stat().st_size > 0


@pytest.fixture(scope="module")
def atlases(setup) -> dict[str, Path]:
    """Atlases of pico and of nano over the reference run's 16 images, and of nano over the first 12 of them."""
    from cait.atlas.__main__ import main as atlas_main

    scenes = setup["data"][1]
    data = ["--data", scenes, "--boxes", f"{scenes}/boxes.json", "--sample", "first", "--batch-size", "4"]
    data += ["--workers", "0", "--exemplars", "1"]
    models = {"pico": ["--checkpoint", str(setup["checkpoint"])], "nano": ["--model", "cait_nano_28"]}
    made = {}
    for name, model, limit in (
        ("pico", models["pico"], 16),
        ("nano", models["nano"], 16),
        ("nano12", models["nano"], 12),
    ):
        made[name] = setup["root"] / f"atlas-{name}"
        assert atlas_main([*model, *data, "--limit", str(limit), "--out", str(made[name])]) == 0
    return made


def test_two_atlases_give_the_answers_of_the_models(setup, atlases):
    """The same models over the same images: the answers' files equal the run's from the models; the heads are
    paired by place, with no similarity and no CKA."""
    out = setup["root"] / "from-atlases"
    assert main(["--atlas-a", str(atlases["pico"]), "--atlas-b", str(atlases["nano"]), "--out", str(out)]) == 0
    for name in ("classes.csv", "disagreements.csv"):
        assert (out / name).read_bytes() == (setup["reference"] / name).read_bytes(), name
    run = read_run(out)
    assert [(a, b) for a, b, _ in run.matching] == [
        ((1, 1), (1, 1)),
        ((1, 2), (1, 2)),
        ((2, 1), (2, 1)),
        ((2, 2), (2, 2)),
    ]
    assert np.isnan(run.cka).all() and np.isnan([s for *_, s in run.matching]).all()
    # each head's numbers are its atlas's: the means over the images equal the atlas's own summary
    atlas = json.loads((atlases["pico"] / "summary.json").read_text())
    dla = {f"ca{h['layer']}_head{h['head']}": h["dla_mean"] for h in atlas["heads"]}
    rows = csv_rows(out / "heads.csv")
    assert len(rows) == 4 and all(float(r["dla_a"]) == pytest.approx(dla[r["head_a"]], abs=1e-6) for r in rows)


def test_atlases_of_other_images_are_refused(setup, atlases, capsys):
    out = setup["root"] / "other-images"
    assert main(["--atlas-a", str(atlases["pico"]), "--atlas-b", str(atlases["nano12"]), "--out", str(out)]) == 2
    line = conftest.one_error_line(capsys.readouterr().err, progress="compare:")
    assert "the two atlases are of other images" in line and not out.exists()


def csv_rows(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_second_run_into_a_locked_out_is_refused(setup, capsys):
    from filelock import FileLock

    from cait.atlas.outdir import LOCK_FILE

    out = setup["root"] / "locked"
    out.mkdir()
    with FileLock(out / LOCK_FILE):  # a first run at work
        assert main([*setup["pair"], "--out", str(out)]) == 2
        line = conftest.one_error_line(capsys.readouterr().err, progress="compare:")
        assert f"another comparison run is writing to {out}" in line
    assert not list(out.glob("shards/*.npz")) and not (out / "summary.json").exists()


def test_a_rerun_with_other_options_is_refused_as_a_comparison(setup, tmp_path, capsys):
    import shutil

    out = tmp_path / "rerun"
    shutil.copytree(setup["reference"], out)
    assert main([*setup["pair"], "--limit", "12", "--out", str(out)]) == 2
    line = conftest.one_error_line(capsys.readouterr().err, progress="compare:")
    assert f"{out} holds a comparison made with other arguments (--limit 16 there, 12 here" in line
