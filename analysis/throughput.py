"""Inference throughput: our CaiT against timm's Cait on the same weights in the same run, and the
paper's number-of-heads table measured on this machine.

    python analysis/throughput.py                                   # cait_xxs24_224 and cait_nano_64
    python analysis/throughput.py --models cait_s24_224 --batch-sizes 1 16 --repeats 9
    python analysis/throughput.py --heads                           # 12 layers, dim 384, heads 1..24

Timing (cait/timing.py, as in the benchmarks): every function is warmed up, then the functions being compared
run in interleaved rounds (the order rotates each round) so that load from other processes hits them
alike; a function's figure is its median round. Writes <name>.csv, .json, .html (plotly) and .png to --out.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
from pathlib import Path

import timm
import torch
from _paper import HEADS_DEPTH, HEADS_DIM, HEADS_TABLE
from tqdm import tqdm

import cait
from cait.flags import add_threads_flag
from cait.reference import timm_cait
from cait.timing import time_interleaved


def _sig(value: float) -> float:
    """Four significant digits: throughput on a busy CPU can be well below 1 image/s."""
    return float(f"{value:.4g}")


def compare(names: list[str], batch_sizes: list[int], *, repeats: int, warmup: int, min_seconds: float) -> list[dict]:
    """Ours vs timm (plain forward) and forward_insights vs plain forward, per model and batch size."""
    rows = []
    for name in names:
        torch.manual_seed(0)
        ours = cait.load_model(name, weights=False).model
        theirs = timm_cait(ours.cfg, ours.state_dict())
        for batch in batch_sizes:
            cfg = ours.cfg
            x = torch.randn(batch, cfg.in_chans, cfg.img_size, cfg.img_size)
            with torch.inference_mode():
                torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)  # same weights, same maths
                sec = time_interleaved(
                    {
                        "timm": lambda: theirs(x),
                        "ours": lambda: ours(x),
                        "ours_insights": lambda: ours.forward_insights(x),
                    },
                    repeats=repeats,
                    warmup=warmup,
                    min_seconds=min_seconds,
                    desc=f"{name} batch {batch}",
                )
            rows.append(
                dict(
                    model=name,
                    batch=batch,
                    gflops_per_image=round(ours.flops() / 1e9, 3),
                    timm_img_s=_sig(batch / sec["timm"]),
                    ours_img_s=_sig(batch / sec["ours"]),
                    insights_img_s=_sig(batch / sec["ours_insights"]),
                    speed_ratio_ours_over_timm=round(sec["timm"] / sec["ours"], 3),
                    insights_cost_over_forward=round(sec["ours_insights"] / sec["ours"], 3),
                )
            )
    return rows


def heads_table(heads: list[int], batch: int, *, repeats: int, warmup: int, min_seconds: float) -> list[dict]:
    """The paper's number-of-heads table at DeiT-S shape (12 layers, dim 384, 224 px): our throughput and
    FLOPs with plain multi-head attention (as in the paper's table) and with talking heads (as in CaiT).
    DeiT-S layout: class token from the first layer, no class-attention stage. Top-1 and the GPU throughput
    are quoted from the paper, not measured."""
    quoted = {row["heads"]: row for row in HEADS_TABLE}
    rows = []
    for h in tqdm(heads, desc="heads"):
        shape = dict(
            img_size=224, embed_dim=HEADS_DIM, depth=HEADS_DEPTH, num_heads=h, depth_token_only=0, class_token_at=0
        )
        plain = cait.load_model("cait_s24_224", weights=False, talking_heads=False, **shape).model
        talking = cait.load_model("cait_s24_224", weights=False, talking_heads=True, **shape).model
        x = torch.randn(batch, 3, 224, 224)
        with torch.inference_mode():
            sec = time_interleaved(
                {"plain": lambda: plain(x), "talking": lambda: talking(x)},
                repeats=repeats,
                warmup=warmup,
                min_seconds=min_seconds,
                desc=f"{h} heads",
            )
        paper = quoted.get(h, {})
        rows.append(
            dict(
                heads=h,
                head_dim=HEADS_DIM // h,
                batch=batch,
                img_s=_sig(batch / sec["plain"]),
                gflops=round(plain.flops() / 1e9, 3),
                talking_heads_img_s=_sig(batch / sec["talking"]),
                talking_heads_gflops=round(talking.flops() / 1e9, 3),
                paper_top1_quoted=paper.get("top1"),
                paper_img_s_gpu_quoted=paper.get("throughput_gpu"),
                paper_gflops_quoted=paper.get("flops_g"),
            )
        )
    return rows


def figure(rows: list[dict], heads: bool):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if heads:
        fig = make_subplots(specs=[[{"secondary_y": True}]])
        hs = [r["heads"] for r in rows]
        fig.add_bar(x=hs, y=[r["img_s"] for r in rows], name="ours, plain MHSA (measured)")
        fig.add_bar(x=hs, y=[r["talking_heads_img_s"] for r in rows], name="ours, talking heads (measured)")
        fig.add_scatter(
            x=hs,
            y=[r["paper_top1_quoted"] for r in rows],
            name="top-1 (quoted from the paper)",
            mode="lines+markers",
            line=dict(dash="dash"),
            secondary_y=True,
        )
        fig.update_xaxes(title="heads (12 layers, dim 384)", type="category")
        fig.update_yaxes(title=f"images/s on this CPU, batch {rows[0]['batch']}", secondary_y=False)
        fig.update_yaxes(title="ImageNet top-1 % (paper, quoted)", tickformat=".1f", secondary_y=True)
        fig.update_layout(title="Number of heads: our throughput vs the paper's accuracy", barmode="group")
    else:
        labels = [f"{r['model']}<br>batch {r['batch']}" for r in rows]
        fig = go.Figure()
        for key, label in (
            ("timm_img_s", "timm forward"),
            ("ours_img_s", "ours forward"),
            ("insights_img_s", "ours forward_insights"),
        ):
            fig.add_bar(
                x=labels,
                y=[r[key] for r in rows],
                name=label,
                text=[f"{r[key]:.3g}" for r in rows],
                textposition="outside",
            )
        fig.update_yaxes(title="images/s on this CPU (median round)", type="log")
        fig.update_layout(title="Inference throughput, same weights, same run", barmode="group")
    return fig


def save_png(fig, rows: list[dict], heads: bool, path: Path) -> str:
    """PNG via kaleido; if static export is unavailable, a matplotlib rendering of the same data."""
    try:
        fig.write_image(str(path), width=1000, height=550, scale=1)
        return "plotly/kaleido"
    except Exception as e:  # kaleido needs a headless Chrome; fall back rather than lose the figure
        print(
            f"plotly PNG export failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"using matplotlib"
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_m, ax = plt.subplots(figsize=(10, 5.5))
    if heads:
        keys = (("img_s", "plain MHSA"), ("talking_heads_img_s", "talking heads"))
        labels = [str(r["heads"]) for r in rows]
    else:
        keys = (
            ("timm_img_s", "timm forward"),
            ("ours_img_s", "ours forward"),
            ("insights_img_s", "ours forward_insights"),
        )
        labels = [f"{r['model']}\nbatch {r['batch']}" for r in rows]
    width = 0.8 / len(keys)
    for i, (key, label) in enumerate(keys):
        ax.bar([j + i * width for j in range(len(rows))], [r[key] for r in rows], width, label=label)
    ax.set_xticks([j + width * (len(keys) - 1) / 2 for j in range(len(rows))], labels)
    ax.set_ylabel("images/s on this CPU")
    if heads:
        ax2 = ax.twinx()
        ax2.plot(range(len(rows)), [r["paper_top1_quoted"] for r in rows], "k--o", label="top-1 (paper, quoted)")
        ax2.set_ylabel("ImageNet top-1 % (paper, quoted)")
        ax2.legend(loc="lower right")
    else:
        ax.set_yscale("log")
    ax.legend(loc="upper right")
    fig_m.tight_layout()
    fig_m.savefig(path, dpi=100)
    plt.close(fig_m)
    return "matplotlib"


def print_table(rows: list[dict]) -> None:
    cols = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths)))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument(
        "--models",
        nargs="+",
        default=["cait_xxs24_224", "cait_nano_64"],
        help="variants from cait.list_models() (random weights; speed does not depend on them)",
    )
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16])
    p.add_argument("--heads", action="store_true", help="measure the paper's number-of-heads table instead")
    p.add_argument("--heads-list", nargs="+", type=int, default=[row["heads"] for row in HEADS_TABLE])
    p.add_argument("--heads-batch", type=int, default=8, help="batch size for --heads")
    p.add_argument("--repeats", type=int, default=7, help="interleaved timing rounds (median is reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per function before timing")
    p.add_argument("--min-seconds", type=float, default=0.2, help="shortest duration of one timing round")
    add_threads_flag(p)
    p.add_argument("--out", type=Path, default=Path("runs/throughput"), help="output directory")
    args = p.parse_args()

    unknown = [m for m in args.models if m not in cait.list_models()]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(cait.list_models())}")
    bad_heads = [h for h in args.heads_list if h < 1 or HEADS_DIM % h]
    if bad_heads:
        p.error(f"--heads-list: {bad_heads} do not divide the width {HEADS_DIM}")
    if min(args.batch_sizes + [args.heads_batch, args.repeats]) < 1:
        p.error("batch sizes and --repeats must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    timing = dict(repeats=args.repeats, warmup=args.warmup, min_seconds=args.min_seconds)

    if args.heads:
        stem, rows = "heads", heads_table(args.heads_list, args.heads_batch, **timing)
    else:
        stem, rows = "throughput", compare(args.models, args.batch_sizes, **timing)
    print_table(rows)

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    env = dict(
        torch=torch.__version__,
        timm=timm.__version__,
        threads=torch.get_num_threads(),
        cpu=platform.processor() or platform.machine(),
        load_average=os.getloadavg(),
        **timing,
    )
    (args.out / f"{stem}.json").write_text(json.dumps(dict(rows=rows, environment=env), indent=2))
    fig = figure(rows, args.heads)
    fig.write_html(args.out / f"{stem}.html", include_plotlyjs=True)
    how = save_png(fig, rows, args.heads, args.out / f"{stem}.png")
    print(f"wrote {stem}.csv/.json/.html/.png ({how}) to {args.out}; load average {env['load_average']}")


if __name__ == "__main__":
    main()
