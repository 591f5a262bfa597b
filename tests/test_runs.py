"""cait.runs: the one reader and writer of a training run's directory."""

import json

import pytest
import torch

import cait
from cait.checkpoint import file_metadata
from cait.runs import RunDir, RunError, continued, read_jsonl, read_metrics


def test_args_record_keeps_every_command(tmp_path):
    run = RunDir(tmp_path / "run")
    assert run.read_record() == {"args": {}, "commands": []} and not run.is_resumable()
    run.record_command({"model": "cait_pico_32", "epochs": 2}, "python -m cait.train --epochs 2")
    run.record_command({"model": "cait_pico_32", "epochs": 4}, "python -m cait.train --resume run --epochs 4")
    saved = json.loads((tmp_path / "run" / "args.json").read_text())
    assert saved == {
        "args": {"model": "cait_pico_32", "epochs": 4},
        "commands": ["python -m cait.train --epochs 2", "python -m cait.train --resume run --epochs 4"],
    }
    assert run.read_args() == saved["args"]
    (tmp_path / "run" / "args.json").write_text("{not json")
    with pytest.raises(RunError, match="args.json: not valid JSON"):
        run.read_args()


def test_append_metrics_replaces_lines_past_the_state(tmp_path):
    run = RunDir(tmp_path)
    assert run.read_metrics() == []
    for epoch in (1, 2, 3):
        run.append_metrics({"epoch": epoch, "step": 10 * epoch})
    run.append_metrics({"epoch": 2, "step": 99})  # resumed after a crash that left epochs 2-3 past the state
    assert run.read_metrics() == [{"epoch": 1, "step": 10}, {"epoch": 2, "step": 99}]
    assert read_metrics(tmp_path / "metrics.jsonl") == run.read_metrics()  # a file or its directory
    assert not list(tmp_path.glob("*.tmp"))


def test_jsonl_reading_says_which_line_is_bad(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1}\n\n{"epoch": 2}\n{"epoch": 3, "lo')  # a torn last line is dropped
    assert [r["epoch"] for r in read_jsonl(path)] == [1, 2]
    path.write_text('{"epoch": 1}\nnot json\n{"epoch": 3}\n')
    with pytest.raises(RunError, match="metrics.jsonl:2: not valid JSON"):
        read_jsonl(path)
    path.write_text('{"epoch": 1}\n[1, 2]\n')
    with pytest.raises(RunError, match="metrics.jsonl:2: not a JSON object"):
        read_jsonl(path)
    path.write_text('{"step": 1}\n')
    with pytest.raises(RunError, match="entry 1 has no integer 'epoch'"):
        read_metrics(path)
    with pytest.raises(FileNotFoundError, match="no metrics file"):
        read_metrics(tmp_path / "elsewhere")


def test_metrics_in_percent_are_refused_with_one_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1, "val_top1": 0.5}\n{"epoch": 2, "train_top1": 0.6, "val_top1": 61.5}\n')
    with pytest.raises(RunError, match=r"^metrics.jsonl: entry 2 has val_top1 61.5, a percentage; top-1 is a fraction"):
        read_metrics(path)
    path.write_text('{"epoch": 1, "val_top1": 1.0, "val_top1_ema": null}\n')  # every image right is no percentage
    assert read_metrics(path)[0]["val_top1"] == 1.0


def test_continued_runs_count_epochs_and_steps_on():
    first = [{"epoch": 1, "step": 5, "val_top1": 0.1}, {"epoch": 2, "step": 10, "val_top1": 0.2}]
    second = [{"epoch": 1, "step": 5, "val_top1": 0.3}]
    assert continued([first, second]) == [*first, {"epoch": 3, "step": 15, "val_top1": 0.3}]
    assert continued([]) == []


def test_checkpoints_carry_their_config_and_what_they_are(tmp_path):
    run = RunDir(tmp_path)
    assert run.config() is None and run.checkpoint_metadata("last") == {}
    model = cait.load_model("cait_pico_32", weights=False, depth=1).model
    run.save_checkpoint("best", model, epochs_completed=3, step=30, data="fashion-mnist", val_top1=None)
    meta = file_metadata(tmp_path / "best.safetensors")
    assert {k: meta[k] for k in ("epochs_completed", "step", "data", "val_top1")} == {
        "epochs_completed": "3",
        "step": "30",
        "data": "fashion-mnist",
        "val_top1": "None",
    }
    assert run.config() == model.cfg  # last is missing: best's config
    assert cait.load_model(None, checkpoint=run.checkpoint("best")).model.cfg.depth == 1
    (tmp_path / "timm.pth").write_bytes(b"not safetensors")
    assert file_metadata(tmp_path / "timm.pth") == {}


def test_state_round_trips_with_weights_only(tmp_path):
    run = RunDir(tmp_path)
    run.save_state({"epoch": 2, "weights": torch.arange(3.0), "rng": [1, [2, 3], None]})
    loaded = run.load_state()
    assert (
        loaded["epoch"] == 2
        and torch.equal(loaded["weights"], torch.arange(3.0))
        and loaded["rng"] == [1, [2, 3], None]
    )
    torch.save({"evil": RunDir(tmp_path)}, tmp_path / "state.pt")  # an object, not tensors: refused, never built
    with pytest.raises(Exception, match="Weights only load failed"):
        run.load_state()
