"""The table of short training probes that chose a recipe: one row per run directory, the same columns
for every run, written as Markdown (for people and model cards) and CSV (for plots).

    python scripts/probe_table.py runs/p_nano64 runs/p_d192_L8 --out analysis/data/scenes_probes

Each row reads only what `python -m cait.train` wrote (args.json, metrics.jsonl, the weights' metadata),
so a table cannot disagree with its runs. A probe still running shows its completed epochs.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

from cait.model import CaiT
from cait.runs import RunDir


def probe_row(run: RunDir) -> dict[str, object]:
    """One probe's row: its flags, size, per-epoch test top-1 and speed."""
    metrics = run.read_metrics()
    if not metrics:
        raise SystemExit(f"error: {run} has no completed epoch (metrics.jsonl is missing or empty)")
    last = metrics[-1]
    commands = run.read_record()["commands"]
    return {
        "run": run.path.name,
        "args": run.read_args(),
        "params_M": _params_millions(run),
        "epochs_done": last["epoch"],
        "test_top1_by_epoch": " / ".join(f"{m['val_top1']:.1f}" for m in metrics if m.get("val_top1") is not None),
        "final_test_top1": last.get("val_top1"),
        "final_train_loss": round(last["train_loss"], 3),
        "img_per_s": round(sum(m["images_per_s"] for m in metrics) / len(metrics)),
        "minutes": round(sum(m.get("epoch_seconds", 0.0) for m in metrics) / 60),
        "command": commands[0] if commands else "",
    }


def differing_flags(rows: list[dict[str, object]]) -> None:
    """Give each row a "flags" column with only the flags whose values differ between the rows (where
    the output goes aside): what one probe changes; the rest is the shared recipe, in the commands."""
    names = sorted({k for row in rows for k in row["args"]} - {"output", "resume"})
    differ = [k for k in names if len({repr(row["args"].get(k)) for row in rows}) > 1]
    for row in rows:
        row["flags"] = " ".join(f"--{k.replace('_', '-')} {row['args'].get(k)}" for k in differ)


def _params_millions(run: RunDir) -> str:
    """The CaiT's parameter count from the config saved with its weights ("" for other models)."""
    cfg = run.config()
    if cfg is None:
        return ""
    with torch.device("meta"):  # shapes only
        return f"{CaiT(cfg).num_params() / 1e6:.2f}"


def to_markdown(rows: list[dict[str, object]]) -> str:
    columns = [
        "run",
        "flags",
        "params_M",
        "epochs_done",
        "test_top1_by_epoch",
        "final_train_loss",
        "img_per_s",
        "minutes",
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]
    lines += ["", "Commands:", ""] + [f"    {row['command']}" for row in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/probe_table.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories written by python -m cait.train")
    p.add_argument("--out", type=Path, required=True, help="folder for NAME.md and NAME.csv")
    p.add_argument("--name", default="probes", help="file name of the table (default: probes)")
    args = p.parse_args(argv)
    rows = [probe_row(RunDir(path)) for path in args.runs]
    differing_flags(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text(to_markdown(rows))
    with open(args.out / f"{args.name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "args"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    sys.stdout.write(to_markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
