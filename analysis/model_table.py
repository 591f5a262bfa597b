"""The paper's table of CaiT models, recomputed from our architecture beside the paper's numbers.

    python analysis/model_table.py [--out DIR]

Parameters (at 224 px) and FLOPs (multiply-accumulates, fvcore's convention, at 224 and 384 px; 448 px
for M-48) are computed from our CaiT built on the meta device (no weights, no memory), and printed
next to the paper's values with the difference. The ImageNet top-1 columns are QUOTED from the paper,
not measured. Writes model_table.csv/.json/.png/.html.
"""

from __future__ import annotations

import torch
from _common import matplotlib_pyplot, out_dir, parser, save_html, save_png, write_csv, write_json
from _paper import MAIN_TABLE, PaperModel

from cait.config import get_config
from cait.model import CaiT

MADE_FROM = "architecture only (our CaiT built on the meta device, no weights); top-1 quoted from the paper"
TOP1_KEYS = ("224", "384", "224_dist", "384_dist", "448_dist")


def computed_row(row: PaperModel) -> dict:
    """Our parameter and FLOP counts for one paper row, with the paper's values and the differences."""
    with torch.device("meta"):  # shapes only: even M-48 costs nothing
        model = CaiT(get_config(row.variants[0], img_size=224))
    params = model.num_params() / 1e6
    out = {
        "model": row.label,
        "depth": row.depth,
        "ca_depth": row.depth_token_only,
        "dim": row.embed_dim,
        "heads": model.cfg.num_heads,
        "params_m": round(params, 2),
        "paper_params_m": row.params_m,
        "params_diff_m": round(params - row.params_m, 2),
    }
    for res in (224, 384, 448):
        paper = row.flops_g.get(res)
        if paper is None and res == 448:
            continue  # only M-48 has a 448 column in the paper
        ours = model.flops(res) / 1e9
        out[f"gflops_{res}"] = round(ours, 2)
        out[f"paper_gflops_{res}"] = paper
        out[f"gflops_{res}_diff"] = None if paper is None else round(ours - paper, 2)
    for key in TOP1_KEYS:
        out[f"top1_{key}_quoted"] = row.top1.get(key)
    return out


def _fmt(v, *, signed: bool = False) -> str:
    return "-" if v is None else (f"{v:+.2f}" if signed else str(v))


def _display_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = [
        "model",
        "depth",
        "dim",
        "params M\nours",
        "paper",
        "diff",
        "GFLOPs 224\nours",
        "paper",
        "diff",
        "GFLOPs 384\nours",
        "paper",
        "diff",
        "top-1 224\n(quoted)",
        "top-1 384\n(quoted)",
        "top-1 384 dist\n(quoted)",
    ]
    body = []
    for r in rows:
        # M-48 appears in the paper at 448 only: show its 448 FLOPs / top-1 in the 384 columns, labelled
        g384 = (
            ("gflops_384", "paper_gflops_384", "gflops_384_diff")
            if "gflops_448" not in r
            else ("gflops_448", "paper_gflops_448", "gflops_448_diff")
        )
        body.append(
            [
                r["model"] + (" (448)" if "gflops_448" in r else ""),
                str(r["depth"]),
                str(r["dim"]),
                str(r["params_m"]),
                str(r["paper_params_m"]),
                _fmt(r["params_diff_m"], signed=True),
                _fmt(r["gflops_224"]),
                _fmt(r["paper_gflops_224"]),
                _fmt(r["gflops_224_diff"], signed=True),
                _fmt(r[g384[0]]),
                _fmt(r[g384[1]]),
                _fmt(r[g384[2]], signed=True),
                _fmt(r["top1_224_quoted"]),
                _fmt(r["top1_384_quoted"]),
                _fmt(r["top1_384_dist_quoted"] if r["top1_448_dist_quoted"] is None else r["top1_448_dist_quoted"]),
            ]
        )
    return head, body


def png(rows: list[dict], path) -> None:
    plt = matplotlib_pyplot()
    head, body = _display_rows(rows)
    fig, (ax_t, ax_b) = plt.subplots(2, 1, figsize=(14, 9), gridspec_kw=dict(height_ratios=[1.1, 1]))
    ax_t.axis("off")
    table = ax_t.table(cellText=body, colLabels=head, loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 1.6)
    ax_t.set_title("CaiT models: our architecture's counts vs the paper (top-1 quoted from the paper, ImageNet-1k)")
    labels = [r["model"] for r in rows]
    x = range(len(rows))
    ax_b.bar([i - 0.2 for i in x], [r["params_m"] for r in rows], 0.4, label="params M (ours, computed)")
    ax_b.plot(list(x), [r["paper_params_m"] for r in rows], "k_", markersize=22, mew=2, label="params M (paper)")
    ax_b.bar([i + 0.2 for i in x], [r.get("gflops_224") for r in rows], 0.4, label="GFLOPs at 224 (ours, computed)")
    ax_b.plot(
        [i + 0.2 for i in x],
        [r.get("paper_gflops_224") or float("nan") for r in rows],
        "r_",
        markersize=22,
        mew=2,
        label="GFLOPs at 224 (paper)",
    )
    ax_b.set_yscale("log")
    ax_b.set_xticks(list(x), labels)
    ax_b.legend(fontsize=8)
    ax_b.set_ylabel("millions / billions (log)")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    save_png(fig, path, MADE_FROM)


def html(rows: list[dict], path) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    head, body = _display_rows(rows)
    fig = make_subplots(rows=2, cols=1, specs=[[{"type": "table"}], [{"type": "xy"}]], row_heights=[0.55, 0.45])
    fig.add_trace(
        go.Table(
            header=dict(values=[h.replace("\n", "<br>") for h in head]), cells=dict(values=list(map(list, zip(*body))))
        ),
        row=1,
        col=1,
    )
    labels = [r["model"] for r in rows]
    fig.add_bar(x=labels, y=[r["params_m"] for r in rows], name="params M (ours)", row=2, col=1)
    fig.add_scatter(
        x=labels,
        y=[r["paper_params_m"] for r in rows],
        name="params M (paper)",
        mode="markers",
        marker=dict(symbol="line-ew-open", size=24, color="black"),
        row=2,
        col=1,
    )
    fig.add_bar(x=labels, y=[r.get("gflops_224") for r in rows], name="GFLOPs 224 (ours)", row=2, col=1)
    fig.add_scatter(
        x=labels,
        y=[r.get("paper_gflops_224") for r in rows],
        name="GFLOPs 224 (paper)",
        mode="markers",
        marker=dict(symbol="line-ew-open", size=24, color="red"),
        row=2,
        col=1,
    )
    fig.update_yaxes(type="log", row=2, col=1)
    fig.update_layout(title="CaiT models: our architecture vs the paper (top-1 quoted)", height=900, barmode="group")
    save_html(fig, path, MADE_FROM)


def main(argv: list[str] | None = None) -> int:
    args = parser("model_table", __doc__, model=False).parse_args(argv)
    out = out_dir(args.out)
    rows = [computed_row(r) for r in MAIN_TABLE]  # cheap at any size: --quick changes nothing
    write_csv(out / "model_table.csv", rows)
    write_json(out / "model_table.json", {"made_from": MADE_FROM, "rows": rows})
    png(rows, out / "model_table.png")
    html(rows, out / "model_table.html")
    head, body = _display_rows(rows)
    print("  ".join(h.replace("\n", " ") for h in head[:12]))
    for b in body:
        print("  ".join(f"{c:>7}" for c in b[:12]))
    worst = max(rows, key=lambda r: abs(r["params_diff_m"]))
    print(
        f"largest parameter difference: {worst['model']} {worst['params_diff_m']:+.2f}M; "
        f"wrote model_table.csv/.json/.png/.html to {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
