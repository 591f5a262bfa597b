"""A training run's directory: what `python -m cait.train` writes there, and how everything else reads it.

    runs/x/
      args.json                  {"args": {flag: value}, "commands": [every command that started or continued it]}
      metrics.jsonl              one JSON object per completed epoch, its "epoch" counted from 1, top-1 in [0, 1]
      last|best|ema.safetensors  weights + config + what they are (epochs_completed, data, step, val_top1)
      state.pt                   everything --resume needs (cait.train.TrainState), read with weights_only=True

Every write goes to a temporary name that is then renamed, so a kill at any moment leaves the previous
version of each file readable.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import CONFIG_KEY, atomic_write, file_metadata, save_weights
from .config import CaiTConfig
from .errors import InputError

ARGS_FILE = "args.json"
METRICS_FILE = "metrics.jsonl"
STATE_FILE = "state.pt"


class RunError(InputError):
    """A run file that cannot be read as cait.train writes it; the message names the file and line."""


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file, blank lines skipped. A torn last line (a writer killed mid-line)
    is dropped; any other bad line is a RunError."""
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):
                break
            raise RunError(f"{path.name}:{number}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise RunError(f"{path.name}:{number}: not a JSON object")
        records.append(record)
    return records


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The epochs of a metrics.jsonl, or of <path>/metrics.jsonl for a run directory (any file name is
    fine, e.g. the shipped cait/weights/<model>.metrics.jsonl). FileNotFoundError when there is none; a
    RunError for a file whose top-1 is in percent (written before top-1 became a fraction in [0, 1])."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    lines = read_jsonl(path)
    for number, line in enumerate(lines, start=1):
        if not isinstance(line.get("epoch"), int):
            raise RunError(f"{path.name}: entry {number} has no integer 'epoch' (not written by cait.train?)")
        percent = next((k for k, v in line.items() if "top1" in k and isinstance(v, float | int) and v > 1), None)
        if percent is not None:
            raise RunError(
                f"{path.name}: entry {number} has {percent} {line[percent]}, a percentage; top-1 is a fraction in "
                f"[0, 1] (rewrite the file with its top-1 values divided by 100)"
            )
    return lines


def continued(histories: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The metrics of runs that continue one another (`cait.train --init`), oldest first, as one training:
    each run's epochs and steps are counted on from the end of the runs before it."""
    out: list[dict[str, Any]] = []
    for lines in histories:
        epoch, step = (out[-1]["epoch"], out[-1]["step"]) if out else (0, 0)
        out += [{**line, "epoch": line["epoch"] + epoch, "step": line["step"] + step} for line in lines]
    return out


@dataclass(frozen=True)
class RunDir:
    """One run's directory; nothing is read or written until a method asks."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    def __str__(self) -> str:
        return str(self.path)

    def checkpoint(self, name: str) -> Path:
        """The weights file `name` ("last", "best" or "ema")."""
        return self.path / f"{name}.safetensors"

    def is_resumable(self) -> bool:
        return (self.path / STATE_FILE).is_file() and (self.path / ARGS_FILE).is_file()

    # args.json ------------------------------------------------------------------------------------------

    def read_record(self) -> dict[str, Any]:
        """args.json as written: {"args": {...}, "commands": [...]}; {"args": {}, "commands": []} if absent."""
        path = self.path / ARGS_FILE
        if not path.is_file():
            return {"args": {}, "commands": []}
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise RunError(f"{path}: not valid JSON ({e.msg})") from None

    def read_args(self) -> dict[str, Any]:
        """The flags the run was last started with, by name ({} when there is no args.json)."""
        return self.read_record()["args"]

    def record_command(self, args: dict[str, Any], command: str) -> None:
        """Write the run's flags and add `command` to the commands that started or continued it."""
        self.path.mkdir(parents=True, exist_ok=True)
        commands = self.read_record()["commands"]
        write_text(self.path / ARGS_FILE, json.dumps({"args": args, "commands": commands + [command]}, indent=1))

    # metrics.jsonl --------------------------------------------------------------------------------------

    def read_metrics(self) -> list[dict[str, Any]]:
        """One line per completed epoch; [] before the first."""
        return read_metrics(self.path) if (self.path / METRICS_FILE).is_file() else []

    def append_metrics(self, line: dict[str, Any]) -> None:
        """Add an epoch's line, dropping any line of that epoch or later (a crash between writing the
        metrics and the state leaves one past the state, which the resumed run trains again)."""
        kept = [old for old in self.read_metrics() if old["epoch"] < line["epoch"]]
        write_jsonl(self.path / METRICS_FILE, [*kept, line])

    # weights and state ----------------------------------------------------------------------------------

    def save_checkpoint(
        self, name: str, model: nn.Module, *, epochs_completed: int, step: int, data: str, **extra: Any
    ) -> None:
        """<name>.safetensors: the weights with their config and what they are, all as strings."""
        info = {"epochs_completed": epochs_completed, "data": data, "step": step, **extra}
        save_weights(model, self.checkpoint(name), {k: str(v) for k, v in info.items()})

    def checkpoint_metadata(self, name: str) -> dict[str, str]:
        return file_metadata(self.checkpoint(name))

    def config(self) -> CaiTConfig | None:
        """The model config saved with the run's weights (last, else best), if any."""
        for name in ("last", "best"):
            meta = self.checkpoint_metadata(name)
            if CONFIG_KEY in meta:
                return CaiTConfig.from_dict(json.loads(meta[CONFIG_KEY]))
        return None

    def save_state(self, state: dict[str, Any]) -> None:
        atomic_write(self.path / STATE_FILE, lambda f: torch.save(state, f))

    def load_state(self) -> dict[str, Any]:
        """state.pt: tensors and plain containers only (weights_only=True refuses anything else)."""
        return torch.load(self.path / STATE_FILE, map_location="cpu", weights_only=True)
