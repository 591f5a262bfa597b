"""The figures of the Table 1 miniature (depth_stability.py), PNG (matplotlib) + HTML (plotly), each from
the result rows of _table1 and carrying its made-from line:

  depth_stability_lr   final top-1 against peak lr, one panel per depth, a line per method, x = diverged
  depth_stability_eps  LayerScale's final top-1 against init eps, and mean |gamma| per epoch per eps
  depth_stability      the main comparison: each arm's mean over seeds with the seeds' range as error bars,
                       and the paper's Table 1 numbers (quoted) in a panel of their own, never on our axes
Our top-1 (fractions in the rows) is drawn in percent, the unit of the paper's numbers.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from _common import matplotlib_pyplot, save_html, save_png
from _table1 import CHANCE, LEARNED, METHODS, Summary, arms, in_phase, num, paper_eps, paper_values

from cait.metrics import percent

COLOURS = {"baseline": "#7f7f7f", "scalar": "#2ca02c", "rezero": "#d62728", "layerscale": "#1f77b4"}
TUNED_COLOUR = "#17becf"  # LayerScale at the eps phase's best eps
EPS_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")  # one per eps


def _wrap(text: str, width: int = 150) -> str:
    return "\n".join(textwrap.wrap(text, width))


def _figure(
    title: str,
    notes: list[str],
    ncols: int,
    *,
    width: float,
    width_ratios: list[float] | None = None,
    sharey: bool = False,
):
    """A row of `ncols` plot panels under `title`, and below them the findings `notes` (one paragraph each)."""
    plt = matplotlib_pyplot()
    text = "\n".join(_wrap(f"- {n}", int(width * 15)) for n in notes)
    lines = text.count("\n") + 1
    fig = plt.figure(figsize=(width, 4.6 + 0.16 * lines))
    grid = fig.add_gridspec(2, ncols, height_ratios=[4.6, 0.16 * lines + 0.5], width_ratios=width_ratios)
    axes = [fig.add_subplot(grid[0, 0])]
    axes += [fig.add_subplot(grid[0, i], sharey=axes[0] if sharey else None) for i in range(1, ncols)]
    notes_ax = fig.add_subplot(grid[1, :])
    notes_ax.axis("off")
    notes_ax.text(0, 0.9, text, va="top", ha="left", fontsize=8, transform=notes_ax.transAxes)
    fig.suptitle(title, fontsize=10)
    return fig, axes


def _series(rows: list[dict], method: str, depth: int) -> list[dict]:
    return sorted((r for r in rows if r["method"] == method and r["depth"] == depth), key=lambda r: r["lr"])


def _top1(r: dict) -> float | None:
    """A row's final top-1 in percent, for drawing; None when it diverged."""
    return None if r["diverged"] or r["final_top1"] is None else percent(r["final_top1"])


def plot_all(rows: list[dict], gamma: dict[str, list[dict]], summary: Summary, made_from: str, out: Path) -> list[Path]:
    """Every figure whose phase has finished runs; the figures of a phase without any are removed (never
    leave a previous sweep's figure beside this one's numbers). Returns the files written."""
    written = []
    for phase, stem, draw in (
        ("lr", "depth_stability_lr", _lr),
        ("eps", "depth_stability_eps", _eps),
        ("main", "depth_stability", _main),
    ):
        paths = [out / f"{stem}.png", out / f"{stem}.html"]
        selected = in_phase(rows, phase)
        if not selected:
            for path in paths:
                path.unlink(missing_ok=True)
            continue
        draw(selected, gamma, summary, made_from, paths)
        written += paths
    return written


# ----------------------------------------------------------------------------------------------------
# accuracy against learning rate


def _lr(rows, gamma, summary: Summary, made_from: str, paths: list[Path]) -> None:
    depths = sorted({r["depth"] for r in rows})
    lrs = sorted({r["lr"] for r in rows})
    _lr_png(rows, depths, lrs, summary, made_from, paths[0])
    _lr_html(rows, depths, lrs, summary, made_from, paths[1])


def _lr_png(rows, depths: list[int], lrs: list[float], summary: Summary, made_from: str, path: Path) -> None:
    """The lr figure as a PNG, its findings under the panels."""
    fig, axes = _figure(
        "Final accuracy against learning rate per depth - MINIATURE retraining (paper: Table 1)",
        summary.findings["lr"],
        len(depths),
        width=4.6 * len(depths) + 0.5,
        sharey=True,
    )
    for ax, depth in zip(axes, depths):
        for method, m in METHODS.items():
            series = _series(rows, method, depth)
            ax.plot(
                [r["lr"] for r in series],
                [_top1(r) if _top1(r) is not None else float("nan") for r in series],
                "o-",
                color=COLOURS[method],
                label=m.label,
            )
            bad = [r["lr"] for r in series if r["diverged"]]
            ax.plot(bad, [0] * len(bad), "x", ms=10, mew=2, color=COLOURS[method])
        ax.axhline(percent(CHANCE), ls="--", lw=0.8, color="#999")
        ax.axhline(percent(LEARNED), ls=":", lw=0.8, color="#999")
        ax.set_xscale("log")
        ax.set_xticks(lrs, [num(lr) for lr in lrs])
        ax.minorticks_off()
        ax.set_xlabel("peak learning rate (no warmup)")
        ax.set_title(f"depth {depth}")
    axes[0].set_ylabel(f"final val top-1 (%)\nx: diverged; dashed: chance; dotted: {percent(LEARNED):g}%", fontsize=8)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, made_from)


def _lr_html(rows, depths: list[int], lrs: list[float], summary: Summary, made_from: str, path: Path) -> None:
    """The lr figure in plotly, the diverged runs' steps in their markers' hover text."""
    from plotly.subplots import make_subplots

    figp = make_subplots(1, len(depths), shared_yaxes=True, subplot_titles=[f"depth {d}" for d in depths])
    for col, depth in enumerate(depths, start=1):
        for method, m in METHODS.items():
            series = _series(rows, method, depth)
            figp.add_scatter(
                x=[r["lr"] for r in series],
                y=[_top1(r) for r in series],
                mode="lines+markers",
                name=m.label,
                legendgroup=method,
                showlegend=col == 1,
                line=dict(color=COLOURS[method]),
                row=1,
                col=col,
            )
            bad = [r for r in series if r["diverged"]]
            if bad:
                figp.add_scatter(
                    x=[r["lr"] for r in bad],
                    y=[0] * len(bad),
                    mode="markers",
                    legendgroup=method,
                    name=f"{m.label}: diverged",
                    showlegend=False,
                    marker=dict(symbol="x", size=12, color=COLOURS[method]),
                    hovertext=[f"diverged at step {r['diverged_at_step']}" for r in bad],
                    row=1,
                    col=col,
                )
        figp.add_hline(y=percent(CHANCE), line_dash="dash", line_color="#999", row=1, col=col)
    figp.update_xaxes(type="log", title="peak learning rate (no warmup)", tickvals=lrs, ticktext=[num(x) for x in lrs])
    figp.update_yaxes(title="final val top-1 (%), x = diverged", col=1)
    figp.update_layout(
        title=f"Final accuracy against learning rate per depth - miniature (paper: Table 1)<br>"
        f"<sup>{'<br>'.join(textwrap.wrap(' '.join(summary.findings['lr'][:2]), 180))}</sup>",
        height=580,
    )
    save_html(figp, path, made_from)


# ----------------------------------------------------------------------------------------------------
# LayerScale's init eps


def _eps(rows, gamma, summary: Summary, made_from: str, paths: list[Path]) -> None:
    runs = sorted(rows, key=lambda r: -r["eps"])
    depth = runs[0]["depth"]
    rule = paper_eps(depth)
    title = "LayerScale's init eps on a short run - MINIATURE retraining (paper: sec. 2's eps rule)"
    fig, (left, right) = _figure(title, summary.findings["eps"], 2, width=12)
    left.plot(
        [r["eps"] for r in runs],
        [_top1(r) if _top1(r) is not None else float("nan") for r in runs],
        "o-",
        color=COLOURS["layerscale"],
    )
    for r in runs:
        if r["diverged"]:
            left.plot([r["eps"]], [0], "x", ms=10, mew=2, color=COLOURS["layerscale"])
    left.axvline(rule, ls=":", color="#555")
    left.annotate(f"paper's rule at depth {depth}", (rule, percent(CHANCE)), fontsize=7, rotation=90, va="bottom")
    left.axhline(percent(CHANCE), ls="--", lw=0.8, color="#999")
    left.set_xscale("log")
    left.set_xlabel("LayerScale init eps")
    left.set_ylabel("final val top-1 (%)")
    left.set_title(f"LayerScale at depth {depth}, lr {num(runs[0]['lr'])}, {runs[0]['images']} images")
    for colour, r in zip(EPS_COLOURS, runs):
        points = gamma.get(r["run"], [])
        epochs = [p["epoch"] for p in points]
        right.plot(epochs, [p["mean"] for p in points], "o-", color=colour, label=f"eps {num(r['eps'])}")
        right.fill_between(epochs, [p["min"] for p in points], [p["max"] for p in points], color=colour, alpha=0.15)
    right.set_yscale("log")
    right.xaxis.get_major_locator().set_params(integer=True)
    right.set_xlabel("epoch (0 = init)")
    right.set_ylabel("mean |gamma| of the SA blocks\n(band: smallest to largest block)", fontsize=8)
    right.set_title("gamma during training")
    right.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, paths[0], made_from)
    _eps_html(runs, gamma, summary, made_from, paths[1])


def _eps_html(runs: list[dict], gamma: dict[str, list[dict]], summary: Summary, made_from: str, path: Path) -> None:
    from plotly.subplots import make_subplots

    figp = make_subplots(1, 2, subplot_titles=["final val top-1 against init eps", "mean |gamma| of the SA blocks"])
    figp.add_scatter(
        x=[r["eps"] for r in runs],
        y=[_top1(r) for r in runs],
        mode="lines+markers",
        name="final top-1",
        hovertext=["diverged" if r["diverged"] else f"{_top1(r):.1f}%" for r in runs],
        line=dict(color=COLOURS["layerscale"]),
        row=1,
        col=1,
    )
    rule = paper_eps(runs[0]["depth"])
    figp.add_vline(x=rule, line_dash="dot", annotation_text="paper's rule", row=1, col=1)
    for colour, r in zip(EPS_COLOURS, runs):
        points = gamma.get(r["run"], [])
        figp.add_scatter(
            x=[p["epoch"] for p in points],
            y=[p["mean"] for p in points],
            mode="lines+markers",
            name=f"eps {num(r['eps'])}",
            line=dict(color=colour),
            error_y=dict(
                type="data",
                symmetric=False,
                array=[p["max"] - p["mean"] for p in points],
                arrayminus=[p["mean"] - p["min"] for p in points],
            ),
            row=1,
            col=2,
        )
    figp.update_xaxes(type="log", title="init eps", row=1, col=1)
    figp.update_xaxes(title="epoch (0 = init)", dtick=1, row=1, col=2)
    figp.update_yaxes(title="final val top-1 (%)", row=1, col=1)
    figp.update_yaxes(type="log", title="mean |gamma| (bars: smallest to largest block)", row=1, col=2)
    figp.update_layout(
        title="LayerScale's init eps on a short run - miniature<br><sup>"
        + "<br>".join(textwrap.wrap(" ".join(summary.findings["eps"][1:3]), 180))
        + "</sup>",
        height=560,
    )
    save_html(figp, path, made_from)


# ----------------------------------------------------------------------------------------------------
# the main comparison


def _arm_colour(arm) -> str:
    return TUNED_COLOUR if arm.tuned else COLOURS[arm.method]


def _main(rows, gamma, summary: Summary, made_from: str, paths: list[Path]) -> None:
    depths = sorted({r["depth"] for r in rows})
    title = summary.headline + " - MINIATURE retraining (paper: Table 1)"
    fig, (ours, paper) = _figure(title, summary.findings["main"], 2, width=13, width_ratios=[3, 2])
    width = 0.8 / (len(METHODS) + 1)
    for g, depth in enumerate(depths):
        for i, arm in enumerate(arms(rows, depth)):
            x = g + (i - len(METHODS) / 2) * width
            if arm.diverged and not arm.top1:
                ours.plot([x], [0], "x", ms=10, mew=2, color=_arm_colour(arm))
                continue
            seeds, mean = [percent(v) for v in arm.top1], percent(arm.mean)
            low, high = mean - min(seeds), max(seeds) - mean
            ours.bar(
                x,
                mean,
                width,
                color=_arm_colour(arm),
                label=arm.label if g == 0 or arm.tuned else None,
                yerr=[[low], [high]],
                capsize=3,
            )
            ours.plot([x] * len(seeds), seeds, ".", color="black", ms=4)
            ours.text(
                x,
                max(seeds) + 1,
                f"{mean:.1f}" + ("*" if arm.diverged else ""),
                fontsize=6,
                ha="center",
                va="bottom",
            )
    ours.set_xticks(range(len(depths)), [f"depth {d}" for d in depths])
    ours.axhline(percent(CHANCE), ls="--", lw=0.8, color="#999")
    ours.set_ylabel("final val top-1 (%)\nbar: mean; whiskers: range over seeds; dots: seeds", fontsize=8)
    ours.set_title(f"ours: miniature, Fashion-MNIST, {rows[0]['images']} images, each at its best lr", fontsize=9)
    ours.legend(fontsize=7, loc="lower left")
    _paper_panel(paper, depths)
    fig.tight_layout()
    save_png(fig, paths[0], made_from)
    _main_html(rows, depths, summary, made_from, paths[1])


def _paper_panel(ax, depths: list[int]) -> None:
    """The paper's Table 1 (quoted) at our depths, on an axis of its own."""
    width = 0.8 / (len(METHODS) + 1)
    for g, depth in enumerate(depths):
        values = paper_values(depth)
        for i, (method, m) in enumerate(METHODS.items()):
            if values is None:
                continue
            x = g + (i - len(METHODS) / 2) * width
            quoted = values[method]
            ax.bar(
                x,
                quoted.top1_percent,
                width,
                color=COLOURS[method],
                alpha=0.5,
                hatch="//",
                label=m.label if g == 0 else None,
            )
            ax.text(
                x,
                quoted.top1_percent,
                f"{quoted.top1_percent:g}" + ("†" if quoted.diverged else ""),
                fontsize=6,
                ha="center",
                va="bottom",
            )
    if all(paper_values(d) is None for d in depths):
        ax.text(0.5, 0.5, "the paper's Table 1 has none of these depths", transform=ax.transAxes, ha="center")
    ax.set_xticks(range(len(depths)), [f"depth {d}" for d in depths])
    ax.set_ylim(70, 85)
    ax.set_ylabel("ImageNet top-1 (%)")
    ax.set_title("paper, Table 1 (DeiT-S, ImageNet, 300 epochs; quoted; † diverged)", fontsize=9)


def _main_html(rows: list[dict], depths: list[int], summary: Summary, made_from: str, path: Path) -> None:
    from plotly.subplots import make_subplots

    figp = make_subplots(
        1,
        2,
        column_widths=[0.6, 0.4],
        subplot_titles=[
            "ours: miniature, each at its best lr (bars: range over seeds)",
            "paper, Table 1 (ImageNet; quoted)",
        ],
    )
    for depth in depths:
        for arm in arms(rows, depth):
            seeds = [percent(v) for v in arm.top1]
            mean = percent(arm.mean) if seeds else 0
            figp.add_bar(
                x=[f"depth {depth}"],
                y=[mean],
                name=arm.label,
                legendgroup=arm.label,
                offsetgroup=arm.label,
                marker_color=_arm_colour(arm),
                showlegend=depth == depths[0] or arm.tuned,
                hovertext=arm.text(),
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=[max(seeds) - mean if seeds else 0],
                    arrayminus=[mean - min(seeds) if seeds else 0],
                ),
                row=1,
                col=1,
            )
        values = paper_values(depth) or {}
        for method, m in METHODS.items():
            if method in values:
                figp.add_bar(
                    x=[f"depth {depth}"],
                    y=[values[method].top1_percent],
                    name=f"paper: {m.label}",
                    offsetgroup=method,
                    marker_color=COLOURS[method],
                    opacity=0.5,
                    showlegend=False,
                    hovertext=f"{m.label}: {values[method].text()}",
                    row=1,
                    col=2,
                )
    figp.update_yaxes(title="final val top-1 (%)", row=1, col=1)
    figp.update_yaxes(title="ImageNet top-1 (%)", range=[70, 85], row=1, col=2)
    figp.update_layout(
        barmode="group",
        height=600,
        title=summary.headline
        + "<br><sup>"
        + "<br>".join(textwrap.wrap(" ".join(summary.findings["main"]), 200))
        + "</sup>",
    )
    save_html(figp, path, made_from)
