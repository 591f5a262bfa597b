"""LayerScale weights per depth: the distribution of |gamma_1| (attention branch) and |gamma_2| (FFN
branch) of every SA and CA block, on a log axis with the init eps marked; optionally their evolution
across the epochs of a training run (darker = later).

    python analysis/layerscale_stats.py [--checkpoint FILE] [--metrics runs/x/metrics.jsonl] [--out DIR]
    python analysis/layerscale_stats.py --model cait_s36_384 --pretrained   # the official weights' gammas

Writes layerscale_stats.csv/.json/.png/.html and, with --metrics, layerscale_epochs.csv/.png/.html.
"""

from __future__ import annotations

from pathlib import Path

from _common import calm, fail, out_dir, parser, save_html, save_png, write_csv, write_json

from cait.explain.layerscale import layerscale_stats, layerscale_stats_from_metrics
from cait.factory import load_from_flags
from cait.figures import LinePlot, layerscale_epochs_plot, layerscale_plot, to_matplotlib, to_plotly
from cait.runs import RunDir


def plot(figure: LinePlot, made_from: str, out: Path, stem: str) -> None:
    """The figure as PNG and self-contained HTML, both drawn from the same description."""
    save_png(to_matplotlib(figure), out / f"{stem}.png", made_from)
    save_html(to_plotly(figure), out / f"{stem}.html", made_from)


@calm
def main(argv: list[str] | None = None) -> int:
    p = parser("layerscale_stats", __doc__, precision=False)  # reads weights, runs no forward
    p.add_argument(
        "--metrics",
        type=Path,
        default=None,
        help="a training run's metrics.jsonl (or its directory) for the evolution across epochs",
    )
    args = p.parse_args(argv)
    loaded = load_from_flags(args)
    cfg = loaded.model.cfg
    out = out_dir(args.out)
    rows = layerscale_stats(loaded.model)
    write_csv(out / "layerscale_stats.csv", rows)
    write_json(
        out / "layerscale_stats.json",
        {
            "made_from": loaded.made_from,
            "init_eps": cfg.init_values,
            "residual_scale": cfg.residual_scale,
            "rows": rows,
        },
    )
    plot(layerscale_plot(rows, init_values=cfg.init_values), loaded.made_from, out, "layerscale_stats")
    print(f"{loaded.made_from}\n{'block':<8}{'gamma':<9}{'median':>10}{'p10':>10}{'p90':>10}")
    for r in rows:
        print(
            f"{r['stage'].upper()}{r['layer'] + 1:<6}{r['gamma']:<9}"
            f"{r['median']:>10.4g}{r['p10']:>10.4g}{r['p90']:>10.4g}"
        )
    written = "layerscale_stats.csv/.json/.png/.html"
    if args.metrics is not None:
        try:
            epoch_rows = layerscale_stats_from_metrics(args.metrics)
        except (OSError, ValueError) as e:
            fail(str(e))
        run = args.metrics if args.metrics.is_dir() else args.metrics.parent
        run_cfg = RunDir(run).config()
        epochs = sorted({r["epoch"] for r in epoch_rows})
        made = (
            f"training run {run} (metrics.jsonl, {len(epochs)} epochs"
            + (f"; {run_cfg.img_size}px dim {run_cfg.embed_dim} depth {run_cfg.depth}" if run_cfg else "")
            + ")"
        )
        write_csv(out / "layerscale_epochs.csv", epoch_rows)
        plot(
            layerscale_epochs_plot(epoch_rows, init_values=run_cfg.init_values if run_cfg else None),
            made,
            out,
            "layerscale_epochs",
        )
        written += ", layerscale_epochs.csv/.png/.html"
    print(f"wrote {written} to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
