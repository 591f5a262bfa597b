"""Token patching and `forward_insights` of this tree against another git revision's, in forward passes, in one run.

Issue 58's goals: a whole token-patching map (both directions) at region 1 in at most 2.5 forward passes of
the model, and `CaiT.forward_insights` within 1.05x of a plain forward at batch 1 and 16 on cait_xxs24_224.
The revision's `cait/explain/token_patching.py` (with its `_stage.py`) and `cait/insights.py` (default: main)
are read with `git show` and loaded beside this tree's under other module names, so that both run on the same
model, weights and input, in the same process. Every round times the plain forward, this tree's function and
the revision's, each first in turn (`cait.timing.time_interleaved`, one round per call); each function's figure
is the median over rounds of its time over the same round's forward (the median of pair ratios).

    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/against_revision.py --threads 1
    python benchmarks/against_revision.py --only insights --insights-models cait_xxs24_224:1 --rounds 15

Random weights (speed does not depend on them; cait_micro_136 is the shipped model's architecture).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch
from tqdm import tqdm

import cait
from cait import explain
from cait.explain.token_patching import token_patching_forwards
from cait.flags import add_threads_flag
from cait.timing import time_interleaved

REPO = Path(__file__).resolve().parents[1]
PATCHING_GOAL, INSIGHTS_GOAL = 2.5, 1.05


def load_revision(rev: str, path: str, name: str, where: Path, *, siblings: dict[str, str] | None = None) -> ModuleType:
    """The module at `path` ("cait/insights.py") as of git revision `rev`, imported as `name` (a sibling
    of the file's own module, so that its relative imports resolve to this tree's package), except that a
    relative import of a module in `siblings` (its name -> the revision's copy loaded under another name)
    reads the revision's copy: the revision's code path whole, not half of it this tree's."""
    text = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for own, copy in (siblings or {}).items():
        text = text.replace(f"from .{own} import", f"from .{copy} import")
    file = where / f"{name.rpartition('.')[2]}.py"
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def pair_ratios(fns: dict[str, Callable[[], object]], rounds: int, desc: str) -> dict[str, float]:
    """Median over interleaved rounds of each function's time over the same round's "forward"."""
    first = time_interleaved(fns, repeats=1, warmup=1)  # warm-up, then one round to set the calls per round
    calls = {name: max(1, math.ceil(0.2 / sec)) for name, sec in first.items()}
    per_call = max(calls.values())  # the same calls for all: every round is one time_interleaved call
    ratios: dict[str, list[float]] = {name: [] for name in fns if name != "forward"}
    for r in tqdm(range(rounds), desc=desc, leave=False):
        sec = time_interleaved(fns, repeats=1, warmup=0, calls=min(per_call, 8), first_round=r)  # first in turn
        for name in ratios:
            ratios[name].append(sec[name] / sec["forward"])
    return {name: statistics.median(r) for name, r in ratios.items()}


def patching_rows(name: str, revision: ModuleType, rounds: int) -> list[str]:
    """Token patching of one image at region 1, both directions: this tree's and the revision's, in forwards."""
    torch.manual_seed(0)
    model = cait.load_model(name, weights=False).model.eval()
    cfg = model.cfg
    x = torch.randn(1, cfg.in_chans, cfg.img_size, cfg.img_size)
    corrupted, target = x + torch.randn(x.shape), torch.zeros(1, dtype=torch.long)
    ours = explain.token_patching(model, x, corrupted, target)
    theirs = revision.token_patching(model, x, corrupted, target)
    gap = max((ours.restored - theirs.restored).abs().max().item(), (ours.broken - theirs.broken).abs().max().item())

    def forward():
        with torch.no_grad():
            model(x)

    fns = {
        "forward": forward,
        "this tree": lambda: explain.token_patching(model, x, corrupted, target),
        "revision": lambda: revision.token_patching(model, x, corrupted, target),
    }
    got = pair_ratios(fns, rounds, f"{name} token patching")
    stated = {"this tree": token_patching_forwards(model), "revision": revision.token_patching_forwards(model)}
    return [
        f"{name:<16} token patching, {cfg.num_patches} regions x 2 directions, {who:<9}: "
        f"{got[who]:6.2f} forwards (stated floor {stated[who]:5.2f}; goal <= {PATCHING_GOAL})"
        for who in ("revision", "this tree")
    ] + [f"{name:<16} largest difference between the two trees' maps: {gap:.2e} logits"]


def insights_rows(spec: str, revision: ModuleType, rounds: int) -> list[str]:
    """`forward_insights` (this tree's observer and the revision's, same model) over a plain forward."""
    name, _, batch = spec.partition(":")
    torch.manual_seed(0)
    model = cait.load_model(name, weights=False).model.eval()
    cfg = model.cfg
    x = torch.randn(int(batch), cfg.in_chans, cfg.img_size, cfg.img_size)
    kw = dict(sa_layers=(), raw_attention=False, sa_reduce=None)

    def forward():
        with torch.no_grad():
            model(x)

    def ours():
        with torch.no_grad():
            model.forward_insights(x)

    def theirs():
        with torch.no_grad():
            revision.observe(model, x, **kw)

    got = pair_ratios({"forward": forward, "this tree": ours, "revision": theirs}, rounds, f"{spec} insights")
    return [
        f"{name:<16} B={batch:<3} forward_insights over a plain forward, {who:<9}: {got[who]:5.3f}x "
        f"(goal <= {INSIGHTS_GOAL})"
        for who in ("revision", "this tree")
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", default="main", help="the git revision to compare against (default: %(default)s)")
    p.add_argument("--patching-models", nargs="+", default=["cait_micro_136", "cait_xxs24_224"])
    p.add_argument("--insights-models", nargs="+", default=["cait_xxs24_224:1", "cait_xxs24_224:16"])
    p.add_argument("--only", choices=("patching", "insights"), default=None, help="one of the two goals")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median of pair ratios)")
    add_threads_flag(p)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lines = []
    with tempfile.TemporaryDirectory() as where:
        if args.only in (None, "patching"):
            load_revision(args.rev, "cait/explain/_stage.py", "cait.explain._rev_stage", Path(where))
            siblings = {"_stage": "_rev_stage"}
            revision = load_revision(
                args.rev, "cait/explain/token_patching.py", "cait.explain._rev_tp", Path(where), siblings=siblings
            )
            for name in args.patching_models:
                lines += patching_rows(name, revision, args.rounds)
                tqdm.write("\n".join(lines[-3:]))
        if args.only in (None, "insights"):
            revision = load_revision(args.rev, "cait/insights.py", "cait._rev_insights", Path(where))
            for spec in args.insights_models:
                lines += insights_rows(spec, revision, args.rounds)
                tqdm.write("\n".join(lines[-2:]))
    rev = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=REPO, capture_output=True, text=True)
    threads = torch.get_num_threads()
    print(f"\ntorch {torch.__version__}, {threads} threads, CPU; revision {args.rev} = {rev.stdout.strip()}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
