"""Table 1 of the paper in miniature: does training deeper stay stable, per residual-branch weighting?

For each depth (12, 24, 36 SA blocks, small width) four runs that differ only in how the residual branches
are weighted: the plain residual (baseline), one scalar alpha = eps per branch, ReZero (alpha = 0, no
pre-norm) and LayerScale (a per-channel gamma = eps). eps follows the paper's rule: 0.1 up to depth 18,
1e-5 at 24, 1e-6 deeper. Every run has the same budget (data, epochs, batch, lr, seed). A run that hits a
non-finite loss is reported as diverged (the paper's dagger). This is a MINIATURE on Fashion-MNIST (or,
with --data fashion-mnist-scenes, the scenes): the paper's numbers (DeiT-S on ImageNet, 300 epochs) are
quoted beside it, never mixed with it.

    python analysis/depth_stability.py                         # the full grid (an hour or so on 2 cores)
    python analysis/depth_stability.py --depths 12 24 --threads 2  # fewer depths, 2 threads per run
    python analysis/depth_stability.py --quick                 # tiny model, seconds per run (tests)

Runs go to OUT/runs/<name> (each with its train.log and metrics.jsonl); rerunning reuses finished runs.
Writes depth_stability.csv/.json/.png/.html.
"""
from __future__ import annotations

from pathlib import Path

from _common import (MINIATURE, QUICK_MINIATURE, RECIPE, SweepRun, add_budget_flags, budget, budget_note,
                     matplotlib_pyplot, out_dir, parser, save_html, save_png, train_runs, write_csv, write_json)

from cait.paper import TABLE1

# method -> (label, --residual-scale, column of the paper's Table 1)
METHODS = {
    "baseline": ("baseline (plain residual)", "none", "baseline"),
    "scalar": ("scalar alpha = eps", "scalar", "scalar_alpha"),
    "rezero": ("ReZero (alpha = 0)", "rezero", "rezero"),
    "layerscale": ("LayerScale (gamma = eps)", "layerscale", "layerscale"),
}
COLOURS = {"baseline": "#7f7f7f", "scalar": "#2ca02c", "rezero": "#d62728", "layerscale": "#1f77b4"}


def paper_eps(depth: int) -> float:
    """LayerScale / alpha init by depth, the paper's rule (sec. 2)."""
    return 0.1 if depth <= 18 else 1e-5 if depth <= 24 else 1e-6


def plan(depths: list[int], base: dict, common: dict) -> dict[str, dict]:
    """name -> cait.train flags of every run of the grid."""
    return {f"depth{d}-{m}": {**base, **RECIPE, **common, "depth": d, "residual_scale": kind,
                              "init_values": paper_eps(d)}
            for d in depths for m, (_, kind, _) in METHODS.items()}


def plot(results: dict[str, SweepRun], depths: list[int], made_from: str, out: Path) -> None:
    plt = matplotlib_pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for m, (label, _, _) in METHODS.items():
        runs = [results[f"depth{d}-{m}"] for d in depths]
        left.plot(depths, [r.final_top1 if not r.diverged else float("nan") for r in runs], "o-", color=COLOURS[m],
                  label=label)
        for d, r in zip(depths, runs):
            if r.diverged:
                left.plot([d], [0], "x", ms=10, mew=2, color=COLOURS[m])
                left.annotate("diverged", (d, 0), textcoords="offset points", xytext=(4, 4), fontsize=7, color=COLOURS[m])
        deepest = results[f"depth{depths[-1]}-{m}"]
        right.plot(range(1, len(deepest.val_top1) + 1), deepest.val_top1, "o-", color=COLOURS[m], label=label)
    left.set_xticks(depths)
    left.set_xlabel("SA depth")
    left.set_ylabel("final val top-1 (%)")
    diverged = sum(r.diverged for r in results.values())
    left.set_title(f"final accuracy per depth ({f'x = diverged: {diverged} run(s)' if diverged else 'no run diverged'})")
    left.legend(fontsize=8)
    right.xaxis.get_major_locator().set_params(integer=True)
    right.set_xlabel("epoch")
    right.set_ylabel("val top-1 (%)")
    right.set_title(f"training curves at depth {depths[-1]}")
    fig.suptitle("Depth stability by residual weighting - MINIATURE retraining (paper: Table 1)")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save_png(fig, out / "depth_stability.png", made_from)

    from plotly.subplots import make_subplots
    figp = make_subplots(1, 2, subplot_titles=["final val top-1 per depth (x = diverged)",
                                               f"val top-1 per epoch at depth {depths[-1]}"])
    for m, (label, _, _) in METHODS.items():
        runs = [results[f"depth{d}-{m}"] for d in depths]
        figp.add_scatter(x=depths, y=[None if r.diverged else r.final_top1 for r in runs], mode="lines+markers",
                         name=label, legendgroup=m, line=dict(color=COLOURS[m]), row=1, col=1)
        bad = [d for d, r in zip(depths, runs) if r.diverged]
        if bad:
            figp.add_scatter(x=bad, y=[0] * len(bad), mode="markers", marker=dict(symbol="x", size=12, color=COLOURS[m]),
                             name=f"{label}: diverged", legendgroup=m, row=1, col=1)
        deepest = results[f"depth{depths[-1]}-{m}"]
        figp.add_scatter(x=list(range(1, len(deepest.val_top1) + 1)), y=deepest.val_top1, mode="lines+markers",
                         name=label, legendgroup=m, showlegend=False, line=dict(color=COLOURS[m]), row=1, col=2)
    figp.update_xaxes(title="SA depth", tickvals=depths, row=1, col=1)
    figp.update_xaxes(title="epoch", row=1, col=2)
    figp.update_yaxes(title="val top-1 (%)")
    figp.update_layout(title="Depth stability by residual weighting - miniature (paper: Table 1)", height=540)
    save_html(figp, out / "depth_stability.html", made_from)


def main(argv: list[str] | None = None) -> int:
    p = parser("depth_stability", __doc__, model=False)
    p.add_argument("--depths", type=int, nargs="+", default=[12, 24, 36], help="SA depths (default 12 24 36)")
    add_budget_flags(p, epochs=3, subset=4000)
    args = p.parse_args(argv)
    if any(d <= 0 for d in args.depths):
        p.error("--depths must be positive")
    depths = sorted(set(args.depths)) if not args.quick else [2, 3]
    out = out_dir(args.out)
    base = QUICK_MINIATURE if args.quick else MINIATURE
    results = train_runs(plan(depths, base, budget(args)), out, args)

    made_from = (f"miniature retraining: {'cait_pico_32' if args.quick else 'CaiT 32px, patch 8, dim 96, 2 heads, 2 CA'}"
                 f" at depths {', '.join(map(str, depths))}; {budget_note(args)}; one seed per run")
    paper = {row["depth"]: row for row in TABLE1}
    rows = []
    for d in depths:
        for m, (label, kind, column) in METHODS.items():
            r = results[f"depth{d}-{m}"]
            quoted = paper.get(d, {})
            rows.append({"depth": d, "method": m, "residual_scale": kind, "eps": paper_eps(d) if m in ("scalar", "layerscale") else None,
                         "diverged": r.diverged, "epochs_done": len(r.val_top1), "final_top1": r.final_top1,
                         "best_top1": max(r.val_top1) if r.val_top1 else None, "params": r.params,
                         "paper_top1_quoted": quoted.get(column),
                         "paper_diverged_quoted": quoted.get("baseline_diverged") if m == "baseline" and quoted else None,
                         "run": str(r.run)})
    write_csv(out / "depth_stability.csv", rows)
    write_json(out / "depth_stability.json", {"made_from": made_from, "scale": "miniature", "rows": rows,
                                               "curves": {n: r.val_top1 for n, r in results.items()}})
    plot(results, depths, made_from, out)

    print(made_from)
    print(f"{'depth':>5}  " + "".join(f"{m:>13}" for m in METHODS) + "   (final val top-1 %, miniature)")
    for d in depths:
        cells = [results[f"depth{d}-{m}"] for m in METHODS]
        print(f"{d:>5}  " + "".join(f"{'diverged' if r.diverged else f'{r.final_top1:.1f}':>13}" for r in cells))
    print(f"wrote depth_stability.csv/.json/.png/.html to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
