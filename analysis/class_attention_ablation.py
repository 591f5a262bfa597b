"""Table 2 of the paper in miniature: where should the class token enter?

Four runs of the same width, total depth and budget that differ only in how the image is summarised:
  - class token from the start (ViT/DeiT): it goes through every SA block;
  - class token inserted late, before the second-to-last SA block;
  - average pooling of the patch tokens, no class token;
  - CaiT: SA blocks on patches only, then the 2-layer class-attention stage (same total depth).
This is a MINIATURE on Fashion-MNIST (or, with --data fashion-mnist-scenes, the scenes), with LayerScale and
talking heads in every run; the paper's numbers (DeiT-S on ImageNet) are quoted beside it, never mixed with it.

    python analysis/class_attention_ablation.py                 # 4 runs (about 15 min on 2 cores)
    python analysis/class_attention_ablation.py --depth 8       # another total depth
    python analysis/class_attention_ablation.py --quick         # tiny model, seconds per run (tests)
    python analysis/class_attention_ablation.py --replot --out analysis/data/class_attention_ablation

Runs go to OUT/runs/<name> (each with its train.log and metrics.jsonl); rerunning reuses finished runs.
Writes class_attention_ablation.csv/.json/.png/.html.
"""

from __future__ import annotations

from pathlib import Path

from _common import (
    RECIPE,
    SweepRun,
    add_budget_flags,
    budget,
    budget_note,
    matplotlib_pyplot,
    miniature,
    miniature_name,
    out_dir,
    parser,
    read_saved,
    save_html,
    save_png,
    train_runs,
    write_csv,
    write_json,
)
from _paper import TABLE2

from cait.metrics import percent
from cait.train.args import to_argv

COLOURS = ["#7f7f7f", "#bcbd22", "#17becf", "#1f77b4"]  # one per setting, in the order of settings()


def settings(depth: int) -> dict[str, tuple[str, dict, dict]]:
    """name -> (label, cait.train flags by name, the paper's Table 2 row it mirrors) at total depth `depth`."""
    late, ca = depth - 2, 2
    paper = lambda setting, **k: next(
        r for r in TABLE2 if r["setting"] == setting and all(r[a] == b for a, b in k.items())
    )
    return {
        "token_at_0": (
            "class token from the start (ViT/DeiT)",
            {"depth": depth, "depth_token_only": 0, "class_token_at": 0},
            paper("DeiT-S baseline"),
        ),
        "token_late": (
            f"class token inserted at layer {late}",
            {"depth": depth, "depth_token_only": 0, "class_token_at": late},
            paper("late insertion", insert_layer=10),
        ),
        "avg_pool": (
            "average pooling, no class token",
            {"depth": depth, "depth_token_only": 0, "global_pool": "avg"},
            paper("average pooling"),
        ),
        "class_attention": (
            f"CaiT: {depth - ca} SA + {ca} CA",
            {"depth": depth - ca, "depth_token_only": ca},
            paper("class attention", sa=10, ca=2),
        ),
    }


def plot(rows: list[dict], curves: dict[str, list[float]], made_from: str, out: Path) -> None:
    """Our top-1 (fractions in the rows and curves) drawn in percent, beside the paper's quoted percentages."""
    labels = [r["label"] for r in rows]
    values = [percent(r["final_top1"] or 0) for r in rows]
    curves = {name: [percent(v) for v in curve] for name, curve in curves.items()}
    _plot_png(rows, labels, values, curves, made_from, out / "class_attention_ablation.png")
    _plot_html(rows, labels, values, curves, made_from, out / "class_attention_ablation.html")


def _plot_png(
    rows: list[dict], labels: list[str], values: list[float], curves: dict[str, list[float]], made_from: str, path: Path
) -> None:
    """Final top-1 bars annotated with size and the paper's number, beside the training curves (percent)."""
    plt = matplotlib_pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    bars = left.barh(labels, values, color=COLOURS[: len(rows)])
    for bar, r in zip(bars, rows):
        text = (
            "diverged"
            if r["diverged"]
            else f"{percent(r['final_top1']):.1f}%  ({r['params'] / 1e6:.2f}M, {r['macs'] / 1e6:.0f}M MACs)"
        )
        text += f"\n paper, ImageNet (quoted): {r['paper_top1_quoted']}%"
        left.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + text, va="center", fontsize=7)
    left.invert_yaxis()
    left.set_xlim(0, max(values + [1]) * 1.9)
    left.set_xlabel("final val top-1 (%)")
    left.set_title("final accuracy, same budget")
    for r, colour in zip(rows, COLOURS):
        curve = curves[r["name"]]
        right.plot(range(1, len(curve) + 1), curve, "o-", color=colour, label=r["label"])
    right.xaxis.get_major_locator().set_params(integer=True)
    right.set_xlabel("epoch")
    right.set_ylabel("val top-1 (%)")
    right.set_title("training curves")
    right.legend(fontsize=8)
    fig.suptitle("Where the class token enters - MINIATURE retraining (paper: Table 2)")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save_png(fig, path, made_from)


def _plot_html(
    rows: list[dict], labels: list[str], values: list[float], curves: dict[str, list[float]], made_from: str, path: Path
) -> None:
    """The same two panels in plotly, size and the paper's number in the bars' hover text."""
    from plotly.subplots import make_subplots

    figp = make_subplots(1, 2, subplot_titles=["final val top-1, same budget", "val top-1 per epoch"])
    figp.add_bar(
        y=labels,
        x=values,
        orientation="h",
        showlegend=False,
        row=1,
        col=1,
        marker_color=COLOURS[: len(rows)],
        text=["diverged" if r["diverged"] else f"{percent(r['final_top1']):.1f}%" for r in rows],
        customdata=[[r["params"], r["macs"], r["paper_top1_quoted"]] for r in rows],
        hovertemplate="%{y}: %{x:.2f}%<br>params %{customdata[0]:,}<br>MACs %{customdata[1]:,}"
        "<br>paper (ImageNet, quoted): %{customdata[2]}%<extra></extra>",
    )
    for r, colour in zip(rows, COLOURS):
        curve = curves[r["name"]]
        figp.add_scatter(
            x=list(range(1, len(curve) + 1)),
            y=curve,
            mode="lines+markers",
            name=r["label"],
            line=dict(color=colour),
            row=1,
            col=2,
        )
    figp.update_yaxes(autorange="reversed", row=1, col=1)
    figp.update_xaxes(title="val top-1 (%)", row=1, col=1)
    figp.update_xaxes(title="epoch", row=1, col=2)
    figp.update_layout(title="Where the class token enters - miniature (paper: Table 2)", height=520)
    save_html(figp, path, made_from)


def result_rows(plan: dict[str, tuple[str, dict, dict]], results: dict[str, SweepRun]) -> list[dict]:
    """One row per setting: its run's result beside the paper's Table 2 row it mirrors."""
    return [
        {
            "name": name,
            "label": label,
            "flags": " ".join(to_argv(flags)),
            "diverged": results[name].diverged,
            "final_top1": results[name].final_top1,
            "params": results[name].params,
            "macs": results[name].macs,
            "paper_setting_quoted": f"{quoted['sa']}+{quoted['ca']}, {quoted['setting']}"
            + (f" at {quoted['insert_layer']}" if quoted["insert_layer"] is not None else ""),
            "paper_top1_quoted": quoted["top1"],
        }
        for name, (label, flags, quoted) in plan.items()
    ]


def summary(rows: list[dict], made_from: str) -> list[str]:
    """What the script prints: where it was made from, then one line per setting beside the paper's number."""
    lines = [made_from]
    for r in rows:
        acc = "diverged" if r["diverged"] else f"{percent(r['final_top1']):.1f}%"
        lines.append(
            f"{r['label']:<40} {acc:>9}  {r['params'] / 1e6:5.2f}M params  "
            f"(paper, ImageNet, quoted: {r['paper_top1_quoted']}%)"
        )
    return lines


def replot(out: Path) -> int:
    """The figures and the printed summary made again from OUT/class_attention_ablation.json alone."""
    rows, curves, made_from = read_saved(out / "class_attention_ablation.json", "rows", "curves", "made_from")
    plot(rows, curves, made_from, out)
    print("\n".join(summary(rows, made_from)))
    print(f"wrote class_attention_ablation.png/.html to {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = parser("class_attention_ablation", __doc__, model=False)
    p.add_argument("--depth", type=int, default=12, help="total depth SA + CA of every run (default 12)")
    p.add_argument(
        "--replot",
        action="store_true",
        help="only draw: the figures and the summary again from OUT/class_attention_ablation.json (e.g. the "
        "committed results, without their runs)",
    )
    add_budget_flags(p, epochs=3, subset=6000)
    args = p.parse_args(argv)
    depth = 3 if args.quick else args.depth
    if depth < 3:
        p.error("--depth must be at least 3 (the CaiT run needs 1 SA + 2 CA)")
    out = out_dir(args.out)
    if args.replot:
        return replot(out)
    base = miniature(args.quick)
    plan = settings(depth)
    results = train_runs(
        {name: {**base, **RECIPE, **budget(args), **flags} for name, (_, flags, _) in plan.items()}, out, args
    )

    made_from = (
        f"miniature retraining: {miniature_name(args.quick)}"
        f", total depth {depth}; {budget_note(args)}; one seed per setting"
    )
    rows = result_rows(plan, results)
    curves = {name: run.val_top1 for name, run in results.items()}
    write_csv(out / "class_attention_ablation.csv", rows)
    write_json(
        out / "class_attention_ablation.json",
        {"made_from": made_from, "scale": "miniature", "rows": rows, "curves": curves},
    )
    plot(rows, curves, made_from, out)
    print("\n".join(summary(rows, made_from)))
    print(f"wrote class_attention_ablation.csv/.json/.png/.html to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
