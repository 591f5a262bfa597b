"""What the head atlas (`python -m cait.atlas`) costs, against issue 38's goals:

- per batch, without knockouts, as a multiple of one plain forward of the same images (goal <= 1.5x), with
  --knockouts as forwards per image (goal <= SA depth / 2 + 3; beside it the knockouts with a forward of their
  own for the SA states, which the atlas's pass already has) and with --patching (issue 41), timed together
  (cait/timing.py);
- peak RSS of the whole command on --rss-from and --rss-to scenes (goal: it grows by <= 200 MB);
- one process against two (torchrun, gloo): the same outputs, and the throughput ratio.

    python benchmarks/atlas_cost.py                                   # the shipped cait_micro_136
    python benchmarks/atlas_cost.py --rss-model cait_pico_32 --rss-from 1000 --rss-to 10000 --ranks-images 512

Images are the test scenes (fashion-mnist-scenes val). Run it with one torch thread on a shared machine
(OMP_NUM_THREADS=1, nice); the subprocesses inherit it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from cait import explain
from cait.atlas.compute import batch_numbers, corrupted_views
from cait.data import read_images
from cait.factory import load_from_flags
from cait.flags import add_model_flags, add_threads_flag
from cait.preprocess import normalise
from cait.timing import time_interleaved

REPO = Path(__file__).resolve().parent.parent
SCENES = "fashion-mnist-scenes"
PATCHING = ("gaussian_noise", 3)  # the corruption of the --patching timing
THREADS: list[str] = []  # --threads N for the atlas processes, when given


def per_batch(args: argparse.Namespace) -> dict[str, float]:
    """Seconds per call of a plain forward, the atlas's numbers, and those with knockouts, on one batch."""
    loaded = load_from_flags(args)
    model = loaded.model.eval()
    data = read_images(SCENES, model.cfg, limit=args.batch_size, normalise=False)
    pixels, _, boxes, index, _ = next(iter(torch.utils.data.DataLoader(data, batch_size=args.batch_size)))
    x = normalise(pixels, model.cfg)
    corrupted = normalise(corrupted_views(pixels, index, PATCHING), model.cfg)

    def forward():
        with torch.inference_mode():
            model(x)

    def own_pass_knockouts():  # the knockouts as knockout_profile alone makes them: its own forward for the SA states
        out = batch_numbers(model, x, boxes, knockouts=False, dtype=None)
        with torch.no_grad():  # as batch_numbers runs it
            explain.knockout_profile(model, x, torch.from_numpy(out["prediction"]))

    seconds = time_interleaved(
        {
            "forward": forward,
            "atlas": lambda: batch_numbers(model, x, boxes, knockouts=False, dtype=None),
            "atlas --knockouts": lambda: batch_numbers(model, x, boxes, knockouts=True, dtype=None),
            "atlas, knockouts by their own pass": own_pass_knockouts,
            "atlas --patching": lambda: batch_numbers(
                model, x, boxes, knockouts=False, dtype=None, corrupted=corrupted
            ),
        },
        repeats=args.repeats,
        desc="per batch",
    )
    depth = model.cfg.depth
    print(f"{loaded.source}, batch {args.batch_size}: forward {seconds['forward'] * 1e3:.0f} ms")
    print(f"  atlas without knockouts: {seconds['atlas'] / seconds['forward']:.2f}x a forward (goal <= 1.5x)")
    ratio = seconds["atlas --knockouts"] / seconds["forward"]
    print(f"  atlas with knockouts: {ratio:.2f} forwards per image (goal <= SA depth / 2 + 3 = {depth / 2 + 3:g})")
    own = seconds["atlas, knockouts by their own pass"] / seconds["forward"]
    print(f"    the same with knockout_profile's own pass for the SA states (not the atlas pass's): {own:.2f}")
    ratio = seconds["atlas --patching"] / seconds["forward"]
    print(
        f"  atlas with --patching {PATCHING[0]}:{PATCHING[1]}: {ratio:.2f} forwards per image (patching per block and"
    )
    print(f"    per CA head: about SA depth + 5 = {depth + 5}, benchmarks/README.md)")
    return seconds


def atlas_command(model: list[str], images: int, out: Path, *, ranks: int = 1) -> list[str]:
    launch = [sys.executable]
    if ranks > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    flags = [*model, *THREADS, "--data", SCENES, "--limit", str(images), "--out", str(out)]
    return [*launch, "-m", "cait.atlas", *flags]


def peak_rss_mb(model: list[str], images: int) -> float:
    """Peak RSS (MB) of one atlas command on `images` scenes, in-process data loading (--workers 0)."""
    code = (
        "import resource, sys; from cait.atlas.__main__ import main; code = main(sys.argv[1:]); "
        "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(code)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        command = atlas_command(model, images, Path(tmp) / "atlas")[3:] + ["--workers", "0"]
        proc = subprocess.run([sys.executable, "-c", code, *command], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return int(proc.stdout.split("peak_rss_kb")[-1]) / 1024


def rss_growth(args: argparse.Namespace) -> None:
    model = ["--model", args.rss_model]
    low, high = peak_rss_mb(model, args.rss_from), peak_rss_mb(model, args.rss_to)
    print(
        f"peak RSS, {args.rss_model}: {low:.0f} MB on {args.rss_from} scenes, {high:.0f} MB on {args.rss_to}: "
        f"+{high - low:.0f} MB (goal <= 200 MB)"
    )


def _numbers(path: Path) -> list[float]:
    """Every cell after the first column of a CSV's rows, as floats (NaN for empty and non-numbers)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    return [_float(v) for r in rows for v in r[1:]]


def _float(v: str) -> float:
    try:
        return float(v)
    except ValueError:
        return math.nan


def max_difference(a: Path, b: Path) -> float:
    """Largest absolute difference between the numbers of two atlases' images.csv and heads.csv."""
    worst = 0.0
    for name in ("images.csv", "heads.csv"):
        pairs = zip(_numbers(a / name), _numbers(b / name), strict=True)
        worst = max([worst, *(abs(x - y) for x, y in pairs if not (math.isnan(x) and math.isnan(y)))])
    same = (
        json.loads((a / "summary.json").read_text())["images"] == json.loads((b / "summary.json").read_text())["images"]
    )
    return worst if same else math.inf


def processes(args: argparse.Namespace) -> None:
    """One process against two on the same scenes: each run into a fresh directory, timed by cait.timing."""
    model = [
        *(["--model", args.model] if args.model else []),
        *(["--checkpoint", args.checkpoint] if args.checkpoint else []),
    ]
    runs: dict[str, Path] = {}
    tmp = Path(tempfile.mkdtemp(prefix="atlas-ranks-"))

    def run(ranks: int):
        out = tmp / f"{ranks}-{len(list(tmp.iterdir()))}"
        subprocess.run(
            atlas_command(model, args.ranks_images, out, ranks=ranks), cwd=REPO, check=True, capture_output=True
        )
        runs[str(ranks)] = out

    seconds = time_interleaved({"1": lambda: run(1), "2": lambda: run(2)}, repeats=1, warmup=0, calls=1)
    diff = max_difference(runs["1"], runs["2"])
    print(
        f"{args.ranks_images} scenes: 1 process {seconds['1']:.1f} s, 2 processes {seconds['2']:.1f} s: throughput "
        f"{seconds['1'] / seconds['2']:.2f}x; outputs differ by at most {diff:.2g}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(p)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rss-model", default="cait_pico_32", help="the model of the RSS runs (default cait_pico_32)")
    p.add_argument("--rss-from", type=int, default=1000)
    p.add_argument("--rss-to", type=int, default=10000)
    p.add_argument("--ranks-images", type=int, default=256, help="scenes of the one- against two-process runs")
    p.add_argument("--skip", nargs="*", default=[], choices=["batch", "rss", "ranks"])
    add_threads_flag(p, help="torch threads here and in each atlas process (default: torch's choice)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    THREADS[:] = ["--threads", str(args.threads)] if args.threads else []
    if "batch" not in args.skip:
        per_batch(args)
    if "rss" not in args.skip:
        rss_growth(args)
    if "ranks" not in args.skip:
        processes(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
