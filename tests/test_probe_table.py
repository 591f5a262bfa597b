"""scripts/probe_table.py: one row per probe run, naming only the flags in which the probes differ."""

import csv
from pathlib import Path

import pytest

from cait.runs import RunDir
from scripts import probe_table


def _probe(path: Path, args: dict, top1: list[float]) -> Path:
    run = RunDir(path)
    run.record_command({**args, "output": str(path)}, f"python -m cait.train --model {args['model']}")
    for epoch, value in enumerate(top1, start=1):
        run.append_metrics(
            {
                "epoch": epoch,
                "train_loss": 2.0 - epoch / 10,
                "val_top1": value,
                "images_per_s": 100.0 * epoch,
                "epoch_seconds": 90.0,
            }
        )
    return path


def test_table_names_the_differing_flags_and_every_epoch(tmp_path):
    shared = {"lr": 1e-3, "epochs": 2}
    a = _probe(tmp_path / "small", {**shared, "model": "cait_nano_64", "embed_dim": None}, [20.0, 30.5])
    b = _probe(tmp_path / "wide", {**shared, "model": "cait_nano_64", "embed_dim": 192}, [25.0, 41.25])
    probe_table.main([str(a), str(b), "--out", str(tmp_path / "out")])

    table = (tmp_path / "out" / "probes.md").read_text()
    assert "| small | --embed-dim None |" in table and "| wide | --embed-dim 192 |" in table
    assert "--lr" not in table.split("Commands:")[0]  # shared by both: part of the recipe, not of a row
    assert "20.0 / 30.5" in table and "25.0 / 41.2" in table
    rows = list(csv.DictReader(open(tmp_path / "out" / "probes.csv")))
    assert [r["final_test_top1"] for r in rows] == ["30.5", "41.25"]
    assert [r["img_per_s"] for r in rows] == ["150", "150"]
    assert [r["minutes"] for r in rows] == ["3", "3"]  # the wall-clock the probes are compared at


def test_named_table(tmp_path):
    a = _probe(tmp_path / "stage", {"model": "cait_nano_64", "img_size": 80}, [70.0])
    probe_table.main([str(a), "--out", str(tmp_path), "--name", "stage_probes"])
    assert "| stage |" in (tmp_path / "stage_probes.md").read_text() and (tmp_path / "stage_probes.csv").exists()


def test_a_run_without_epochs_is_refused(tmp_path):
    empty = tmp_path / "empty"
    RunDir(empty).record_command({"model": "cait_nano_64"}, "python -m cait.train")
    with pytest.raises(SystemExit, match="no completed epoch"):
        probe_table.main([str(empty), "--out", str(tmp_path / "out")])
