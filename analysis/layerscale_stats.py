"""LayerScale weights per depth: the distribution of |gamma_1| (attention branch) and |gamma_2| (FFN
branch) of every SA and CA block, on a log axis with the init eps marked; optionally their evolution
across the epochs of a training run (darker = later).

    python analysis/layerscale_stats.py [--checkpoint FILE] [--metrics runs/x/metrics.jsonl] [--out DIR]
    python analysis/layerscale_stats.py --model cait_s36_384 --pretrained   # the official weights' gammas

Writes layerscale_stats.csv/.json/.png/.html and, with --metrics, layerscale_epochs.csv/.png/.html.
"""
from __future__ import annotations

from pathlib import Path

from _common import (load_model, matplotlib_pyplot, out_dir, parser, save_html, save_png, write_csv, write_json,
                     fail)
from cait.explain import layerscale_stats, layerscale_stats_from_metrics
from cait.runs import RunDir

BRANCH = {"gamma_1": "gamma_1 (attention branch)", "gamma_2": "gamma_2 (FFN branch)"}


def _position(row: dict, depth: int) -> int:
    """x position: SA blocks 0..depth-1, then CA blocks after a gap of one."""
    return row["layer"] if row["stage"] == "sa" else depth + 1 + row["layer"]


def _ticks(depth: int, ca_depth: int) -> tuple[list[int], list[str]]:
    pos = list(range(depth)) + [depth + 1 + i for i in range(ca_depth)]
    return pos, [f"SA{i + 1}" for i in range(depth)] + [f"CA{i + 1}" for i in range(ca_depth)]


def plot_model(rows: list[dict], depth: int, ca_depth: int, eps: float, made_from: str, out: Path) -> None:
    plt = matplotlib_pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    pos, labels = _ticks(depth, ca_depth)
    for ax, gamma in zip(axes, BRANCH):
        for stage, colour in (("sa", "tab:blue"), ("ca", "tab:red")):
            sel = [r for r in rows if r["gamma"] == gamma and r["stage"] == stage]
            x = [_position(r, depth) for r in sel]
            ax.fill_between(x, [r["p10"] for r in sel], [r["p90"] for r in sel], color=colour, alpha=0.2,
                            step=None, label=f"{stage.upper()} p10-p90")
            ax.plot(x, [r["median"] for r in sel], "o-", color=colour, label=f"{stage.upper()} median")
            ax.plot(x, [r["mean"] for r in sel], "x", color=colour, label=f"{stage.upper()} mean")
        ax.axhline(eps, color="k", ls="--", lw=1, label=f"init eps = {eps:g}")
        ax.set_yscale("log")
        ax.set_xticks(pos, labels, rotation=90 if len(pos) > 20 else 0, fontsize=7 if len(pos) > 20 else 9)
        ax.set_title(BRANCH[gamma])
        ax.set_xlabel("block (depth)")
    axes[0].set_ylabel("|gamma| over channels")
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle("LayerScale weights per depth")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save_png(fig, out / "layerscale_stats.png", made_from)

    from plotly.subplots import make_subplots
    figp = make_subplots(1, 2, shared_yaxes=True, subplot_titles=list(BRANCH.values()))
    for col, gamma in enumerate(BRANCH, start=1):
        for stage, colour in (("sa", "royalblue"), ("ca", "crimson")):
            sel = [r for r in rows if r["gamma"] == gamma and r["stage"] == stage]
            x = [labels[pos.index(_position(r, depth))] for r in sel]
            figp.add_scatter(x=x, y=[r["median"] for r in sel], mode="lines+markers", name=f"{stage} median",
                             line=dict(color=colour), legendgroup=stage, showlegend=col == 1, row=1, col=col,
                             error_y=dict(type="data", symmetric=False,
                                          array=[r["p90"] - r["median"] for r in sel],
                                          arrayminus=[r["median"] - r["p10"] for r in sel]),
                             customdata=[[r["mean"], r["p10"], r["p90"]] for r in sel],
                             hovertemplate="%{x}: median %{y:.3g}, mean %{customdata[0]:.3g}, "
                                           "p10 %{customdata[1]:.3g}, p90 %{customdata[2]:.3g}")
        figp.add_hline(y=eps, line_dash="dash", annotation_text=f"init eps {eps:g}", row=1, col=col)
    figp.update_yaxes(type="log", title="|gamma| (median, bars p10-p90)", col=1)
    figp.update_layout(title="LayerScale weights per depth", height=520)
    save_html(figp, out / "layerscale_stats.html", made_from)


def plot_epochs(rows: list[dict], depth: int, ca_depth: int, eps: float | None, made_from: str, out: Path) -> None:
    """Median |gamma| per depth, one line per epoch, darker = later."""
    plt = matplotlib_pyplot()
    epochs = sorted({r["epoch"] for r in rows})
    shade = lambda i: 0.25 + 0.75 * (i + 1) / len(epochs)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    pos, labels = _ticks(depth, ca_depth)
    cmap = plt.get_cmap("Blues")
    for ax, gamma in zip(axes, BRANCH):
        for i, epoch in enumerate(epochs):
            sel = sorted((r for r in rows if r["gamma"] == gamma and r["epoch"] == epoch),
                         key=lambda r: _position(r, depth))
            ax.plot([_position(r, depth) for r in sel], [r["median"] for r in sel], "o-", ms=3,
                    color=cmap(shade(i)), label=f"epoch {epoch}" if i in (0, len(epochs) - 1) else None)
        if eps is not None:
            ax.axhline(eps, color="k", ls="--", lw=1, label=f"init eps = {eps:g}")
        ax.set_yscale("log")
        ax.set_xticks(pos, labels, fontsize=8)
        ax.set_title(f"{BRANCH[gamma]}: median over channels")
    axes[0].set_ylabel("median |gamma|")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"LayerScale across training, epochs {epochs[0]}-{epochs[-1]} (darker = later)")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save_png(fig, out / "layerscale_epochs.png", made_from)

    from plotly.subplots import make_subplots
    figp = make_subplots(1, 2, shared_yaxes=True, subplot_titles=list(BRANCH.values()))
    for col, gamma in enumerate(BRANCH, start=1):
        for i, epoch in enumerate(epochs):
            sel = sorted((r for r in rows if r["gamma"] == gamma and r["epoch"] == epoch),
                         key=lambda r: _position(r, depth))
            r, g, b, _ = (int(255 * c) for c in cmap(shade(i)))
            figp.add_scatter(x=[labels[pos.index(_position(s, depth))] for s in sel], y=[s["median"] for s in sel],
                             mode="lines+markers", name=f"epoch {epoch}", line=dict(color=f"rgb({r},{g},{b})"),
                             legendgroup=str(epoch), showlegend=col == 1, row=1, col=col)
    figp.update_yaxes(type="log", title="median |gamma|", col=1)
    figp.update_layout(title="LayerScale across training (darker = later)", height=520)
    save_html(figp, out / "layerscale_epochs.html", made_from)


def main(argv: list[str] | None = None) -> int:
    p = parser("layerscale_stats", __doc__)
    p.add_argument("--metrics", type=Path, default=None, help="a training run's metrics.jsonl (or its directory) "
                   "for the evolution across epochs")
    args = p.parse_args(argv)
    loaded = load_model(args)
    cfg = loaded.model.cfg
    out = out_dir(args.out)
    rows = layerscale_stats(loaded.model)
    write_csv(out / "layerscale_stats.csv", rows)
    write_json(out / "layerscale_stats.json", {"made_from": loaded.made_from, "init_eps": cfg.init_values,
                                               "residual_scale": cfg.residual_scale, "rows": rows})
    plot_model(rows, cfg.depth, cfg.depth_token_only, cfg.init_values, loaded.made_from, out)
    print(f"{loaded.made_from}\n{'block':<8}{'gamma':<9}{'median':>10}{'p10':>10}{'p90':>10}")
    for r in rows:
        print(f"{r['stage'].upper()}{r['layer'] + 1:<6}{r['gamma']:<9}{r['median']:>10.4g}{r['p10']:>10.4g}{r['p90']:>10.4g}")
    written = "layerscale_stats.csv/.json/.png/.html"
    if args.metrics is not None:
        try:
            epoch_rows = layerscale_stats_from_metrics(args.metrics)
        except (OSError, ValueError) as e:
            fail(str(e))
        run = args.metrics if args.metrics.is_dir() else args.metrics.parent
        run_cfg = RunDir(run).config()
        depth = 1 + max(r["layer"] for r in epoch_rows if r["stage"] == "sa")
        ca_depth = 1 + max((r["layer"] for r in epoch_rows if r["stage"] == "ca"), default=-1)
        epochs = sorted({r["epoch"] for r in epoch_rows})
        made = (f"training run {run} (metrics.jsonl, {len(epochs)} epochs"
                + (f"; {run_cfg.img_size}px dim {run_cfg.embed_dim} depth {run_cfg.depth}" if run_cfg else "") + ")")
        write_csv(out / "layerscale_epochs.csv", epoch_rows)
        plot_epochs(epoch_rows, depth, ca_depth, run_cfg.init_values if run_cfg else None, made, out)
        written += ", layerscale_epochs.csv/.png/.html"
    print(f"wrote {written} to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
