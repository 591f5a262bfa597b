"""Residual-branch ratios per layer (the paper's Figure 4 analysis), with LayerScale and without it.

For each layer, ||gamma * branch(x)|| / ||x|| for the SA and FFN branches (gamma = 1 without
LayerScale), measured by training on a fixed validation batch at the end of every epoch and stored in
the run's metrics.jsonl; one line per epoch, darker = later. Always a MINIATURE (our small models on
Fashion-MNIST or its scenes), never the paper's ImageNet runs; the figure says which runs it shows.

    python analysis/residual_ratio.py                                   # the shipped miniature pair
    python analysis/residual_ratio.py --sweep out/depth_stability [--ship]   # the pair of the Table 1 sweep
    python analysis/residual_ratio.py --with runs/ls --without runs/plain
    python analysis/residual_ratio.py --retrain [--depth 12 --epochs 3 --subset 6000] [--ship]
    python analysis/residual_ratio.py --retrain --quick                 # seconds, for tests

--sweep takes the pair that depth_stability.py picked from its runs (its JSON's residual_ratio_pair):
LayerScale and the plain residual at the lr phase's deepest depth (36, as the paper's Fig. 4), same lr,
seed and budget. --retrain trains a pair itself (cait.train, the miniature and recipe of
depth_stability.py, only --residual-scale differs) into OUT/runs/{layerscale,none}. --ship copies the
pair's metrics.jsonl + args.json into analysis/data/residual_ratio/, the data this script shows by default.
Writes residual_ratio.csv/.json/.png/.html.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from _common import (
    RECIPE,
    REPO,
    add_budget_flags,
    budget,
    fail,
    matplotlib_pyplot,
    miniature,
    out_dir,
    parser,
    save_html,
    save_png,
    train_runs,
    write_csv,
    write_json,
)

from cait.runs import ARGS_FILE, METRICS_FILE, RunDir, RunError, read_metrics

SHIPPED = REPO / "analysis" / "data" / "residual_ratio"
KINDS = {"layerscale": "with LayerScale", "none": "without (plain residual)"}
BRANCHES = {"sa": "SA branch", "ffn": "FFN branch"}


def read_run(run: Path) -> dict:
    """{'epochs': [...], 'sa': [[per layer] per epoch], 'ffn': ..., 'description': str} from a run dir."""
    run = run if run.is_dir() else run.parent
    try:
        lines = [line for line in read_metrics(run) if line.get("residual_ratios")]
    except FileNotFoundError:
        fail(f"no metrics.jsonl in {run} (a run directory of `python -m cait.train`)")
    except RunError as e:
        fail(f"{run}: {e}")
    if not lines:
        fail(f"{run / 'metrics.jsonl'} has no 'residual_ratios' lines (written by cait.train at the end of each epoch)")
    out = {
        "epochs": [line["epoch"] for line in lines],
        **{k: [line["residual_ratios"].get(k, []) for line in lines] for k in ("sa", "ffn", "ca", "ca_ffn")},
    }
    cfg, recorded = RunDir(run).config(), RunDir(run).read_args()
    kind = (cfg.residual_scale if cfg else recorded.get("residual_scale")) or "layerscale"
    shape = f"{cfg.img_size}px dim {cfg.embed_dim} depth {cfg.depth}" if cfg else f"depth {len(out['sa'][0])}"
    subset = recorded.get("subset")
    out["residual_scale"] = kind
    out["description"] = (
        f"{recorded.get('model', '?')} ({shape}), residual {kind}, {recorded.get('data', '?')}"
        f"{f' first {subset} train images' if subset else ''}, {len(out['epochs'])} epochs"
    )
    return out


def sweep_pair(sweep: Path) -> dict[str, Path]:
    """{kind: run directory} of the pair depth_stability.py picked from its runs in `sweep` (its output)."""
    try:
        pair = json.loads((sweep / "depth_stability.json").read_text()).get("residual_ratio_pair")
    except (OSError, ValueError):
        fail(f"no readable depth_stability.json in {sweep} (the --out of analysis/depth_stability.py)")
    if not pair:
        fail(
            f"{sweep / 'depth_stability.json'} names no pair yet: its lr phase has no finished LayerScale and "
            f"plain-residual runs at one lr (python analysis/depth_stability.py --phase lr --out {sweep})"
        )
    runs = {kind: sweep / "runs" / pair[kind] for kind in KINDS}
    missing = [str(run) for run in runs.values() if not (run / METRICS_FILE).is_file()]
    if missing:
        fail(f"the sweep's pair is not there: {', '.join(missing)}")
    return runs


def retrain(args, out: Path) -> dict[str, Path]:
    """Train the pair, identical except for --residual-scale; returns {kind: run dir}."""
    base = miniature(args.quick)
    common = {**base, **RECIPE, **budget(args, quick_epochs=2), "depth": 2 if args.quick else args.depth}
    results = train_runs({kind: {**common, "residual_scale": kind} for kind in KINDS}, out, args)
    return {kind: r.run for kind, r in results.items()}


def plot(data: dict[str, dict], made_from: str, out: Path) -> None:
    plt = matplotlib_pyplot()
    cmap = {"layerscale": plt.get_cmap("Blues"), "none": plt.get_cmap("Oranges")}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, (branch, title) in zip(axes, BRANCHES.items()):
        for kind, run in data.items():
            n = len(run["epochs"])
            for i, (epoch, values) in enumerate(zip(run["epochs"], run[branch])):
                last = i == n - 1
                ax.plot(
                    range(1, len(values) + 1),
                    values,
                    "o-" if last else "-",
                    ms=3,
                    lw=1.8 if last else 1,
                    color=cmap[kind](0.3 + 0.7 * (i + 1) / n),
                    label=f"{KINDS[kind]}, epoch {epoch}" if i in (0, n - 1) else None,
                )
        ax.set_yscale("log")
        ax.set_xticks(range(1, 1 + max(len(v) for d in data.values() for v in d[branch])))
        ax.set_xlabel("SA layer")
        ax.set_title(f"{title}: ||gamma * branch|| / ||residual||")
    axes[0].set_ylabel("ratio (log)")
    axes[1].legend(fontsize=8)
    fig.suptitle("Residual-branch ratio per layer across training (darker = later) - miniature retraining")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save_png(fig, out / "residual_ratio.png", made_from)

    from plotly.subplots import make_subplots

    figp = make_subplots(1, 2, shared_yaxes=True, subplot_titles=list(BRANCHES.values()))
    colours = {"layerscale": (31, 119, 180), "none": (255, 127, 14)}
    for col, branch in enumerate(BRANCHES, start=1):
        for kind, run in data.items():
            n = len(run["epochs"])
            for i, (epoch, values) in enumerate(zip(run["epochs"], run[branch])):
                shade = 0.25 + 0.75 * (i + 1) / n  # opacity: darker = later
                r, g, b = colours[kind]
                figp.add_scatter(
                    x=list(range(1, len(values) + 1)),
                    y=values,
                    mode="lines+markers",
                    name=f"{KINDS[kind]}, epoch {epoch}",
                    legendgroup=f"{kind}{epoch}",
                    showlegend=col == 1,
                    line=dict(color=f"rgba({r},{g},{b},{shade:.2f})"),
                    row=1,
                    col=col,
                )
    figp.update_yaxes(type="log", title="||gamma * branch|| / ||residual||", col=1)
    figp.update_xaxes(title="SA layer")
    figp.update_layout(title="Residual-branch ratio per layer across training (miniature retraining)", height=540)
    save_html(figp, out / "residual_ratio.html", made_from)


def pick_runs(args, out: Path) -> dict[str, Path]:
    """{kind: run directory} of the pair the flags ask for: retrained, the sweep's, given, or else the shipped one."""
    if args.retrain:
        return retrain(args, out)
    if args.sweep is not None:
        return sweep_pair(args.sweep)
    if args.with_run is not None:
        return {"layerscale": args.with_run, "none": args.without_run}
    runs = {kind: SHIPPED / kind for kind in KINDS}
    if not all((r / METRICS_FILE).is_file() for r in runs.values()):
        fail(f"no shipped run pair in {SHIPPED}; pass --with/--without run directories, or --retrain")
    return runs


def ship(runs: dict[str, Path]) -> None:
    """Copy the pair's metrics.jsonl + args.json into SHIPPED, the data this script shows by default."""
    for kind, run in runs.items():
        (SHIPPED / kind).mkdir(parents=True, exist_ok=True)
        for name in (METRICS_FILE, ARGS_FILE):
            shutil.copy(run / name, SHIPPED / kind / name)
    print(f"shipped the pair's metrics to {SHIPPED}")


def print_last_epoch(data: dict[str, dict]) -> None:
    """Each run's last-epoch ratios per branch: their mean, and each layer's."""
    for kind, d in data.items():
        for branch in BRANCHES:
            last = d[branch][-1]
            print(
                f"{KINDS[kind]:<26}{branch:<4} epoch {d['epochs'][-1]}: mean ratio {sum(last) / len(last):.3g} "
                f"(layers {', '.join(f'{v:.2g}' for v in last)})"
            )


def main(argv: list[str] | None = None) -> int:
    p = parser("residual_ratio", __doc__, model=False)
    p.add_argument("--with", dest="with_run", type=Path, default=None, help="run directory trained with LayerScale")
    p.add_argument(
        "--without",
        dest="without_run",
        type=Path,
        default=None,
        help="run directory trained with --residual-scale none",
    )
    p.add_argument(
        "--sweep",
        type=Path,
        default=None,
        metavar="DIR",
        help="the pair depth_stability.py picked from its runs in DIR (its --out)",
    )
    p.add_argument("--retrain", action="store_true", help="train the pair first (python -m cait.train)")
    p.add_argument("--ship", action="store_true", help="store the pair's metrics as the shipped data")
    p.add_argument("--depth", type=int, default=12, help="--retrain: SA depth of both runs (default 12)")
    add_budget_flags(p, epochs=3, subset=6000)
    args = p.parse_args(argv)
    if (args.with_run is None) != (args.without_run is None):
        p.error("give both --with and --without (or neither)")
    if sum((args.retrain, args.with_run is not None, args.sweep is not None)) > 1:
        p.error("give one of --sweep, --with/--without and --retrain")
    if args.ship and not (args.retrain or args.with_run or args.sweep):
        p.error("--ship stores a new pair: give --sweep, --retrain or --with/--without")
    out = out_dir(args.out)

    runs = pick_runs(args, out)
    data = {kind: read_run(run) for kind, run in runs.items()}
    if args.ship:
        ship(runs)

    made_from = "miniature retraining: " + " | ".join(f"{KINDS[k]}: {d['description']}" for k, d in data.items())
    rows = [
        {"residual_scale": kind, "epoch": epoch, "branch": branch, "layer": layer, "ratio": value}
        for kind, d in data.items()
        for i, epoch in enumerate(d["epochs"])
        for branch in ("sa", "ffn", "ca", "ca_ffn")
        for layer, value in enumerate(d[branch][i])
    ]
    write_csv(out / "residual_ratio.csv", rows)
    write_json(
        out / "residual_ratio.json",
        {"made_from": made_from, "runs": {k: str(v) for k, v in runs.items()}, "data": data},
    )
    plot(data, made_from, out)
    print(made_from)
    print_last_epoch(data)
    print(f"wrote residual_ratio.csv/.json/.png/.html to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
