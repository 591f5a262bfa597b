"""Table 1 of the paper in miniature: does training deeper stay stable, per residual-branch weighting?

Four weightings of the residual branches: the plain residual, one scalar alpha = eps per branch, ReZero
(alpha = 0, no pre-norm) and LayerScale (a per-channel gamma = eps), eps by the paper's rule (0.1 up to
depth 18, 1e-5 at 24, 1e-6 deeper). The paper's effect is about optimisation at depth, so the sweep
looks where depth hurts, in three phases of a 32 px miniature (patch 8, dim 96, 2 heads, 2 CA blocks)
trained from scratch on Fashion-MNIST without warmup:

  lr    peak lr 3e-4, 1e-3, 3e-3, 1e-2 x depth 12, 24, 36 x the four weightings (3 epochs of 4000 images):
        the lrs each trains at per depth, the miniature's analogue of the paper's dagger
  eps   LayerScale at depth 36, lr 1e-3, eps 0.1, 1e-3, 1e-5, 1e-6, same budget: does the paper's eps rule
        (made for 300 ImageNet epochs) transfer to a short run? gamma per epoch from each run's metrics.jsonl
  main  each weighting at its best lr of the lr phase, depths 12 and 36, seeds 0 and 1, a larger budget
        (4 epochs of 10000 images); LayerScale also at the eps phase's best eps when that is not the rule

A run that hits a non-finite loss is a result, diverged (cait.train.Diverged, typed); one that finishes
below 20% top-1 (chance 10%) did not learn. The figures and depth_stability_summary.md say, computed
from the results, whether the paper's ordering comes out. This is a MINIATURE: the paper's numbers
(DeiT-S on ImageNet, 300 epochs) are quoted beside it, never mixed with it.

Runs go to OUT/runs/<name> (each with its train.log and metrics.jsonl), one training at a time (a
second sweep into the same OUT is refused). Rerunning reuses every finished run and continues one that
was stopped (Ctrl-C or kill: from where it stopped; kill -9: from its last finished epoch), so the sweep
can run in the background and span sessions, a part at a time:

    python analysis/depth_stability.py --measure-speed            # img/s here, and each phase's estimated time
    nohup nice -n 10 python analysis/depth_stability.py > depth_stability.log 2>&1 &    # everything, in order
    python analysis/depth_stability.py --phase lr --hours 1.5     # a part: no run starts after 1.5 h; again: goes on
    python analysis/depth_stability.py --phase none               # the figures from the runs finished so far
    python analysis/depth_stability.py --quick                    # every phase on a tiny model, seconds (tests)
    python analysis/depth_stability.py --replot --out analysis/data/depth_stability   # figures from the numbers

Writes depth_stability.csv/.json (every run: phase, setting, result; the paper's numbers in their own
columns), depth_stability_summary.md, and PNG + HTML: depth_stability (main comparison),
depth_stability_lr (accuracy against lr per depth) and depth_stability_eps (LayerScale's eps).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import (
    RECIPE,
    SweepRun,
    add_budget_flags,
    budget,
    fail,
    finished_runs,
    miniature,
    miniature_name,
    out_dir,
    parser,
    read_saved,
    sweep_lock,
    train_runs,
    write_csv,
    write_json,
)
from _table1 import METHODS, Summary, best_eps, best_lr, in_phase, num, paper_eps, paper_values, summarize

from cait.data import data_name
from cait.explain.layerscale import layerscale_stats_from_metrics
from cait.runs import RunError

PHASES = ("lr", "eps", "main")


@dataclass(frozen=True)
class Budget:
    epochs: int  # passes over the subset
    subset: int  # the first N training images

    @property
    def images(self) -> int:
        return self.epochs * self.subset


@dataclass(frozen=True)
class Setting:
    """One run of the design: everything that differs between runs."""

    method: str  # a METHODS key
    depth: int  # SA blocks
    lr: float  # peak learning rate
    eps: float | None  # init of LayerScale's gamma / the scalar alpha (None: the method has none)
    seed: int
    budget: Budget

    @property
    def name(self) -> str:
        eps = f"-eps{num(self.eps)}" if self.eps is not None else ""
        budget = f"{self.budget.epochs}x{self.budget.subset}"
        return f"d{self.depth}-{self.method}-lr{num(self.lr)}{eps}-{budget}-s{self.seed}"

    def flags(self, common: dict[str, Any]) -> dict[str, Any]:
        """The cait.train flags of this run (by name), on top of the sweep's common ones."""
        eps = {} if self.eps is None else {"init_values": self.eps}
        return {
            **common,
            "depth": self.depth,
            "residual_scale": METHODS[self.method].residual_scale,
            "lr": self.lr,
            "seed": self.seed,
            "epochs": self.budget.epochs,
            "subset": self.budget.subset,
            **eps,
        }


@dataclass(frozen=True)
class Design:
    depths: tuple[int, ...]  # lr phase
    lrs: tuple[float, ...]  # lr phase
    eps_depth: int  # eps phase: LayerScale at this depth ...
    eps_lr: float  # ... and this lr ...
    eps_values: tuple[float, ...]  # ... with these init eps
    main_depths: tuple[int, ...]  # main phase (each must be in `depths`: it takes the best lr found there)
    seeds: tuple[int, ...]  # main phase (the other phases: seed 0)
    sweep: Budget  # lr and eps phases
    main: Budget  # main phase

    def setting(
        self,
        method: str,
        depth: int,
        lr: float,
        *,
        seed: int = 0,
        budget: Budget | None = None,
        eps: float | None = None,
    ) -> Setting:
        if eps is None and METHODS[method].has_eps:
            eps = paper_eps(depth)
        return Setting(method, depth, lr, eps, seed, budget or self.sweep)

    def lr_phase(self) -> list[Setting]:
        return [self.setting(m, d, lr) for d in self.depths for m in METHODS for lr in self.lrs]

    def eps_phase(self) -> list[Setting]:
        return [self.setting("layerscale", self.eps_depth, self.eps_lr, eps=e) for e in self.eps_values]

    def main_phase(self, rows: list[dict]) -> list[Setting] | None:
        """Each method at its best lr of the lr phase (`rows`) per main depth, every seed; LayerScale also at
        the eps phase's best eps when the eps phase is complete and its pick is not the paper's rule. None
        while the lr phase lacks a run the choice needs."""
        swept = in_phase(rows, "lr")
        have = Counter((r["method"], r["depth"]) for r in swept)
        if any(have[m, d] < len(self.lrs) for m in METHODS for d in self.main_depths):
            return None
        settings = [
            self.setting(m, d, best_lr(swept, m, d), seed=s, budget=self.main)
            for d in self.main_depths
            for m in METHODS
            for s in self.seeds
        ]
        eps = best_eps(rows) if len(in_phase(rows, "eps")) == len(self.eps_values) else None
        if eps is not None and self.eps_depth in self.main_depths and eps != paper_eps(self.eps_depth):
            settings += [
                self.setting("layerscale", self.eps_depth, self.eps_lr, seed=s, budget=self.main, eps=eps)
                for s in self.seeds
            ]
        return settings

    def phase(self, name: str, rows: list[dict]) -> list[Setting] | None:
        return {"lr": self.lr_phase, "eps": self.eps_phase}[name]() if name != "main" else self.main_phase(rows)


QUICK_DESIGN = Design(
    depths=(2, 3),
    lrs=(1e-3, 1e9),
    eps_depth=3,
    eps_lr=1e-3,
    eps_values=(0.1, 1e-6),
    main_depths=(2, 3),
    seeds=(0, 1),
    sweep=Budget(2, 64),
    main=Budget(2, 64),
)


# ----------------------------------------------------------------------------------------------------
# results


def common_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The cait.train flags every run shares: the miniature, the light recipe, the budget's data part."""
    base = miniature(args.quick)
    shared = {k: v for k, v in budget(args).items() if k not in ("epochs", "subset")}
    return {**base, **RECIPE, "warmup_epochs": args.warmup, **shared}


def gamma_trajectory(run: SweepRun, eps: float) -> list[dict]:
    """Mean |gamma| of the SA blocks per epoch (0 = the init), with its smallest and largest block."""
    points = [{"epoch": 0, "mean": eps, "min": eps, "max": eps}]
    try:
        stats = layerscale_stats_from_metrics(run.run)
    except (RunError, FileNotFoundError):
        return points
    for epoch in sorted({r["epoch"] for r in stats}):
        per_block = [r["mean"] for r in stats if r["epoch"] == epoch and r["stage"] == "sa"]
        points.append(
            {"epoch": epoch, "mean": sum(per_block) / len(per_block), "min": min(per_block), "max": max(per_block)}
        )
    return points


def result_row(phase: str, s: Setting, run: SweepRun, gamma: list[dict] | None) -> dict[str, Any]:
    """One run in one phase (the rows _table1 reads); the paper's numbers in their own columns, and only
    where the setting is the paper's (main phase, eps by its rule, a depth of its Table 1)."""
    theirs = phase == "main" and s.eps in (None, paper_eps(s.depth))
    quoted = (paper_values(s.depth) or {}).get(s.method) if theirs else None
    return {
        "phase": phase,
        "method": s.method,
        "label": METHODS[s.method].label,
        "depth": s.depth,
        "lr": s.lr,
        "eps": s.eps,
        "seed": s.seed,
        "epochs": s.budget.epochs,
        "subset": s.budget.subset,
        "images": s.budget.images,
        "diverged": run.diverged,
        "diverged_at_step": (run.divergence or {}).get("step"),
        "epochs_done": len(run.val_top1),
        "final_top1": run.final_top1,
        "best_top1": max(run.val_top1) if run.val_top1 else None,
        "gamma_final": gamma[-1]["mean"] if gamma and len(gamma) > 1 else None,
        "params": run.params,
        "run": run.name,
        "paper_top1_quoted": quoted and quoted.top1_percent,
        "paper_diverged_quoted": quoted and quoted.diverged,
    }


@dataclass
class Results:
    rows: list[dict]  # one per run and phase
    runs: dict[str, SweepRun]  # run name -> the finished run
    gamma: dict[str, list[dict]]  # run name -> gamma trajectory (methods with an eps)
    planned: dict[str, int]  # phase -> runs planned (0: not plannable yet)


def collect(design: Design, common: dict[str, Any], out: Path) -> Results:
    """Every finished run of every phase (nothing is trained); the main phase is planned from the others."""
    results = Results([], {}, {}, {})
    for phase in PHASES:
        settings = design.phase(phase, results.rows) or []
        results.planned[phase] = len(settings)
        done = finished_runs({s.name: s.flags(common) for s in settings}, out)
        for s in settings:
            if s.name not in done:
                continue
            run = results.runs[s.name] = done[s.name]
            if METHODS[s.method].has_eps:
                results.gamma[s.name] = gamma_trajectory(run, s.eps)
            results.rows.append(result_row(phase, s, run, results.gamma.get(s.name)))
    return results


def residual_ratio_pair(rows: list[dict]) -> dict[str, str] | None:
    """The Fig. 4 pair: LayerScale and the plain residual at the lr phase's deepest depth, same lr (the
    largest at which both finished, not above LayerScale's best), seed 0, the same budget."""
    swept = in_phase(rows, "lr")
    if not swept:
        return None
    depth = max(r["depth"] for r in swept)
    top = best_lr(swept, "layerscale", depth)
    ls, plain = (
        {r["lr"]: r for r in swept if r["method"] == method and r["depth"] == depth and r["epochs_done"]}
        for method in ("layerscale", "baseline")
    )
    shared = [lr for lr in ls if lr in plain and (top is None or lr <= top)]
    if not shared:
        return None
    lr = max(shared)
    return {"layerscale": ls[lr]["run"], "none": plain[lr]["run"], "depth": depth, "lr": lr}


# ----------------------------------------------------------------------------------------------------
# training the phases, measuring their cost


def run_phases(design: Design, common: dict[str, Any], args: argparse.Namespace, out: Path) -> None:
    """Train the phases --phase asks for, in order, each run once; with --hours, no run starts after that."""
    deadline = time.time() + 3600 * args.hours if args.hours else None
    phases = PHASES if args.phase == "all" else (args.phase,) if args.phase in PHASES else ()
    for phase in phases:
        settings = design.phase(phase, collect(design, common, out).rows if phase == "main" else [])
        if settings is None:
            why = "the main phase takes each method's best lr from the lr phase, which has runs to go: run --phase lr"
            if args.phase == "main":
                fail(why)
            print(f"main phase not started: {why}", file=sys.stderr)
            return
        print(f"== phase {phase}: {len(settings)} runs", file=sys.stderr)
        train_runs({s.name: s.flags(common) for s in settings}, out, args, deadline=deadline)
    if deadline is not None and time.time() >= deadline:
        print(
            f"--hours {args.hours:g} used up: runs not started are left for the next invocation (the same command "
            f"continues)",
            file=sys.stderr,
        )


def measure_speed(design: Design, common: dict[str, Any], args: argparse.Namespace, out: Path) -> int:
    """--measure-speed STEPS: train STEPS steps of each depth x method the design uses, here and now (with
    --threads, under whatever else runs), and estimate each phase's wall time from it."""
    import os

    from cait.runtime import autocast_dtype, resolve_device

    probes = _speed_probes(design, common, args.measure_speed)
    load = os.getloadavg()[0]
    amp = autocast_dtype("auto", resolve_device("auto"))
    speeds = _train_probes(probes, out)
    estimate = {phase: _phase_seconds(design, phase, speeds) / 3600 for phase in PHASES}
    write_json(
        out / "speed.json",
        {
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average_1min_before": load,
            "amp": str(amp),
            "threads": args.threads,
            "steps": args.measure_speed,
            "speeds": speeds,
            "estimated_hours": estimate,
        },
    )
    print(
        f"training speed here ({args.measure_speed} steps of batch {common['batch_size']}, --threads {args.threads}, "
        f"load average {load:.1f} on {os.cpu_count()} cores before; amp auto = {amp or 'fp32'}):"
    )
    for name, s in speeds.items():
        print(
            f"  {name:<14} {s['images_per_s']:6.0f} img/s, {s['epoch_overhead_s']:5.1f} s per epoch to evaluate "
            f"and save"
        )
    print(
        "estimated wall time: "
        + ", ".join(f"{p} {h:.2f} h" for p, h in estimate.items())
        + f"; total {sum(estimate.values()):.2f} h (main: with the tuned-LayerScale arm, its upper bound)"
    )
    print(f"wrote {out / 'speed.json'}")
    return 0


def _speed_probes(design: Design, common: dict[str, Any], steps: int) -> dict[str, dict[str, Any]]:
    """One single-epoch run of `steps` batches per depth x method the design uses, named d<depth>-<method>."""
    depths = sorted({*design.depths, *design.main_depths, design.eps_depth})
    return {
        f"d{d}-{m}": {
            **design.setting(m, d, design.eps_lr).flags(common),
            "epochs": 1,
            "subset": steps * common["batch_size"],
        }
        for d in depths
        for m in METHODS
    }


def _train_probes(probes: dict[str, dict[str, Any]], out: Path) -> dict[str, dict]:
    """Train the probes in a scratch directory and return each one's images/s and per-epoch overhead (seconds
    beyond the training steps: evaluating and saving)."""
    import tempfile

    from cait.runs import RunDir

    # not beside this sweep training (it would slow it, and measure a machine busier than the sweep will find it)
    with sweep_lock(out), tempfile.TemporaryDirectory() as tmp:
        train_runs(probes, Path(tmp), argparse.Namespace(fresh=True))
        speeds = {}
        for name, flags in probes.items():
            line = RunDir(Path(tmp) / "runs" / name).read_metrics()[-1]
            train_seconds = flags["subset"] / line["images_per_s"]
            speeds[name] = {
                "images_per_s": line["images_per_s"],
                "epoch_overhead_s": line["epoch_seconds"] - train_seconds,
            }
    return speeds


def _phase_seconds(design: Design, phase: str, speeds: dict[str, dict]) -> float:
    """Seconds of a phase's runs at the measured speeds, each run counted once (the eps phase shares a run
    with the lr phase). The main phase's lrs are not known before the lr phase: its runs are counted at
    any lr, with the tuned-LayerScale arm."""
    if phase == "main":
        settings = [
            design.setting(m, d, design.eps_lr, seed=s, budget=design.main)
            for d in design.main_depths
            for m in METHODS
            for s in design.seeds
        ]
        if design.eps_depth in design.main_depths:
            settings += [
                design.setting("layerscale", design.eps_depth, design.eps_lr, seed=s, budget=design.main)
                for s in design.seeds
            ]  # costs what the arm at the paper's eps costs
    else:
        earlier = {s.name for s in design.lr_phase()} if phase == "eps" else set()
        settings = [s for s in design.phase(phase, []) if s.name not in earlier]
    total = 0.0
    for s in settings:
        speed = speeds[f"d{s.depth}-{s.method}"]
        total += s.budget.epochs * (s.budget.subset / speed["images_per_s"] + speed["epoch_overhead_s"])
    return total


# ----------------------------------------------------------------------------------------------------
# outputs


def made_from(design: Design, args: argparse.Namespace, results: Results) -> str:
    model = miniature_name(args.quick) + ("" if args.quick else ", 2 CA")
    done = {p: sum(r["phase"] == p for r in results.rows) for p in PHASES}
    progress = ", ".join(
        f"{p} {done[p]}/{results.planned[p]}" if results.planned[p] else f"{p} not planned yet" for p in PHASES
    )
    return (
        f"miniature retraining: {model} from scratch on {data_name(args.data)}, AdamW, no mixup/RandAugment, "
        f"{'no' if not args.warmup else f'{args.warmup:g} epoch(s) of'} warmup, cosine, batch {args.batch_size}, "
        f"amp auto, val on {args.val_subset} images; lr and eps phases {design.sweep.epochs} epoch(s) x first "
        f"{design.sweep.subset} images, seed 0; main {design.main.epochs} epoch(s) x first {design.main.subset} "
        f"images, seeds {', '.join(map(str, design.seeds))}; runs finished: {progress}"
    )


def paper_quoted() -> dict[str, Any]:
    from _paper import TABLE1

    return {
        "source": "Touvron et al. 2021, Table 1: DeiT-S stabilised, ImageNet top-1 after 300 epochs (quoted)",
        "rows": [
            {
                "depth": r["depth"],
                **{m: r[METHODS[m].paper_column] for m in METHODS},
                "baseline_diverged": r["baseline_diverged"],
            }
            for r in TABLE1
        ],
    }


def write_outputs(design: Design, args: argparse.Namespace, results: Results, out: Path):
    from _table1_plots import plot_all

    summary = summarize(results.rows)
    made = made_from(design, args, results)
    write_csv(out / "depth_stability.csv", results.rows)
    write_json(
        out / "depth_stability.json",
        {
            "made_from": made,
            "scale": "miniature",
            "design": asdict(design),
            "planned": results.planned,
            "summary": {"headline": summary.headline, **summary.findings},
            "rows": results.rows,
            "curves": {name: run.val_top1 for name, run in results.runs.items()},
            "gamma": results.gamma,
            "residual_ratio_pair": residual_ratio_pair(results.rows),
            "paper_table1_quoted": paper_quoted(),
        },
    )
    write_summary(summary, made, out)
    plot_all(results.rows, results.gamma, summary, made, out)
    return summary


def write_summary(summary: Summary, made: str, out: Path) -> Path:
    """depth_stability_summary.md: the verdict in words, computed from the rows."""
    path = out / "depth_stability_summary.md"
    path.write_text(
        f"# Table 1 in miniature: what the sweep shows\n\n{summary.text()}\nMade from: {made}.\n\n"
        f"The paper's numbers (ImageNet, DeiT-S, 300 epochs) are quoted in depth_stability.json, never mixed with "
        f"ours.\n"
    )
    return path


def replot(out: Path) -> int:
    """The figures and depth_stability_summary.md made again from what write_outputs saved in
    out/depth_stability.json alone."""
    from _table1_plots import plot_all

    rows, gamma, made = read_saved(out / "depth_stability.json", "rows", "gamma", "made_from")
    summary = summarize(rows)
    written = [write_summary(summary, made, out), *plot_all(rows, gamma, summary, made, out)]
    print(f"wrote {', '.join(p.name for p in written)} from {out / 'depth_stability.json'}")
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser("depth_stability", __doc__, model=False)
    g = p.add_argument_group("the design (defaults: the full sweep)")
    g.add_argument("--depths", type=int, nargs="+", default=[12, 24, 36], help="lr phase: SA depths")
    g.add_argument("--lrs", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3, 1e-2], help="lr phase: peak lrs")
    g.add_argument(
        "--eps",
        dest="eps_values",
        type=float,
        nargs="+",
        default=[0.1, 1e-3, 1e-5, 1e-6],
        help="eps phase: LayerScale init eps",
    )
    g.add_argument("--eps-depth", type=int, default=36, help="eps phase: depth (default 36)")
    g.add_argument("--eps-lr", type=float, default=1e-3, help="eps phase: peak lr (default 1e-3)")
    g.add_argument(
        "--main-depths",
        type=int,
        nargs="+",
        default=[12, 36],
        help="main phase: depths, each one of --depths (it takes the best lr found there)",
    )
    g.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="main phase: seeds (default 0 1)")
    g.add_argument("--main-epochs", type=int, default=4, help="main phase: epochs per run (default 4)")
    g.add_argument("--main-subset", type=int, default=10000, help="main phase: training images (default 10000)")
    g.add_argument("--warmup", type=float, default=0.0, help="linear warmup in epochs, every run (default 0: none)")
    add_budget_flags(p, epochs=3, subset=4000, lr=False, runs="every run; --epochs, --subset: of the lr and eps phases")
    g = p.add_argument_group("running it: a part at a time, in the background")
    g.add_argument(
        "--phase",
        choices=("all", *PHASES, "none"),
        default="all",
        help="train only this phase (main needs lr done); none: train nothing, draw the finished runs",
    )
    g.add_argument(
        "--hours",
        type=float,
        default=None,
        help="start no run after this many hours (the run under way finishes); the same command later continues",
    )
    g.add_argument(
        "--measure-speed",
        type=int,
        nargs="?",
        const=30,
        default=None,
        metavar="STEPS",
        help="only measure: STEPS (default 30) training steps per depth x method, then each phase's "
        "estimated hours; trains nothing of the sweep",
    )
    g.add_argument(
        "--replot",
        action="store_true",
        help="only draw: the figures and depth_stability_summary.md again from OUT/depth_stability.json (e.g. "
        "the committed results, without their runs)",
    )
    args = p.parse_args(argv)
    positive = {
        "--depths": args.depths,
        "--lrs": args.lrs,
        "--eps": args.eps_values,
        "--main-depths": args.main_depths,
        "--eps-depth": [args.eps_depth],
        "--eps-lr": [args.eps_lr],
        "--main-epochs": [args.main_epochs],
        "--main-subset": [args.main_subset],
        "--hours": [args.hours or 1],
        "--epochs": [args.epochs],
        "--subset": [args.subset],
        "--measure-speed": [args.measure_speed or 1],
    }
    for flag, values in positive.items():
        if any(v <= 0 for v in values):
            p.error(f"{flag} must be positive")
    if not set(args.main_depths) <= set(args.depths):
        p.error("--main-depths must be among --depths (the main phase takes each method's best lr found there)")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    return args


def design_from(args: argparse.Namespace) -> Design:
    if args.quick:
        return QUICK_DESIGN
    return Design(
        depths=tuple(sorted(set(args.depths))),
        lrs=tuple(sorted(set(args.lrs))),
        eps_depth=args.eps_depth,
        eps_lr=args.eps_lr,
        eps_values=tuple(sorted(set(args.eps_values), reverse=True)),
        main_depths=tuple(sorted(set(args.main_depths))),
        seeds=tuple(dict.fromkeys(args.seeds)),
        sweep=Budget(args.epochs, args.subset),
        main=Budget(args.main_epochs, args.main_subset),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    design, common = design_from(args), common_flags(args)
    out = out_dir(args.out)
    if args.measure_speed is not None:
        return measure_speed(design, common, args, out)
    if args.replot:
        return replot(out)
    run_phases(design, common, args, out)
    results = collect(design, common, out)
    summary = write_outputs(design, args, results, out)
    print(made_from(design, args, results))
    print(summary.text())
    print(f"wrote depth_stability.csv/.json, depth_stability_summary.md and the figures to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
