"""scripts/ship_model.py: a run continued from an earlier run's weights ships with the whole history."""
import json
from pathlib import Path

from scripts import ship_model


def _run(path: Path, commands: list[str], amp: str, epochs: int, steps_per_epoch: int) -> Path:
    path.mkdir()
    (path / "args.json").write_text(json.dumps({"args": {"amp": amp}, "commands": commands}))
    lines = [{"epoch": e, "step": e * steps_per_epoch, "val_top1": 50.0 + e, "epoch_seconds": 60.0}
             for e in range(1, epochs + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_history_counts_epochs_and_steps_on_across_runs(tmp_path):
    first = _run(tmp_path / "first", ["python -m cait.train --epochs 3", "python -m cait.train --resume first"],
                 "bf16", 3, 100)
    second = _run(tmp_path / "second", ["python -m cait.train --init first/ema.safetensors"], "auto", 2, 100)
    epochs, commands, amps = ship_model.history([first, second])
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4, 5]
    assert [e["step"] for e in epochs] == [100, 200, 300, 400, 500]
    assert [e["val_top1"] for e in epochs] == [51.0, 52.0, 53.0, 51.0, 52.0]  # the second run's own numbers
    assert commands[-1].endswith("--init first/ema.safetensors") and len(commands) == 3
    assert amps == ["bf16", "auto"]


def test_teacher_row_names_the_teacher_its_number_and_how_it_taught(tmp_path):
    assert ship_model.teacher_row({"teacher": None}, None) == ""
    teacher = _run(tmp_path / "teacher", ["python -m cait.train --model timm:resnet10t --epochs 4"], "auto", 4, 10)
    args = {"teacher": "t.safetensors", "distill_type": "soft", "distill_alpha": 0.5, "distill_tau": 3.0}
    row = ship_model.teacher_row(args, ship_model.history([teacher]))
    assert row.startswith("| teacher | `t.safetensors`: 54.00% test top-1 after 4 epochs")
    assert "--model timm:resnet10t" in row and "soft distillation through the class token, alpha 0.5, tau 3.0" in row
