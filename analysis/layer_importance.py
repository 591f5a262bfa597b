"""What matters for the prediction, and whether LayerScale says so: per block the mean |gamma| and the
mean change of the predicted class's logit when the block is knocked out (gamma_1 = gamma_2 = 0), and
per class-attention head its direct logit attribution against its pointing score on the garment boxes,
and what writes the logit: its mean parts (initial class token, each CA layer's heads and MLP, biases).

    python analysis/layer_importance.py [--limit 500] [--out DIR]         # shipped model, test scenes
    python analysis/layer_importance.py --data DIR [--boxes boxes.json]   # your images (and COCO boxes)
    python analysis/layer_importance.py --model cait_s24_224 --pretrained  # official weights, real photos

The verdict is computed from the numbers: Spearman's rank correlation between the blocks' mean |gamma|
and the size of their mean knockout change (over all blocks, and over the SA blocks alone), with a 95%
bootstrap interval over images. Photos have no boxes, so their heads get no pointing score (nor do
images of --data without --boxes).

Writes layer_importance.json/.png/.html, layer_importance_heads.html and layer_importance_parts.html.
Always fp32 (the knockouts subtract logits), so it takes no --precision.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from _common import (
    add_data_flags,
    batch_of,
    calm,
    default_images,
    fail,
    load_examples,
    made_from_data,
    matplotlib_pyplot,
    out_dir,
    parser,
    read_data,
    readable_batches,
    save_html,
    save_png,
    write_json,
)
from scipy.stats import spearmanr

from cait import explain
from cait.explain.causal import block_gamma_mean_abs
from cait.explain.metrics import head_localization
from cait.factory import load_from_flags
from cait.figures.causal import knockout_matplotlib, knockout_plotly, logit_parts_matplotlib, logit_parts_plotly

BATCH = 50
QUICK_IMAGES = 8
DEFAULT_IMAGES = 500  # without --limit: the first 500 images of the data


def image_batches(model, args, skipped: list[str]) -> tuple[Iterator[tuple[torch.Tensor, torch.Tensor | None]], str]:
    """(normalised batch, boxes in input pixels or None) batches and the data's name: --data through
    `cait.data.read_images` (default: the test scenes; real photos for an ImageNet model). Unreadable images
    are added to `skipped`."""
    cfg = model.cfg
    if cfg.is_imagenet and args.data is None:
        examples = load_examples(default_images(cfg), cfg, limit=QUICK_IMAGES if args.quick else None)
        return iter([(batch_of(examples, cfg), None)]), f"{len(examples)} photos (cait.data.photos)"
    args.data = args.data or "fashion-mnist-scenes"
    data = read_data(args, cfg, limit=QUICK_IMAGES if args.quick else DEFAULT_IMAGES)
    boxed = data.boxes is not None
    return ((x, b if boxed else None) for x, _, b in readable_batches(data, BATCH, skipped)), data.name


@torch.no_grad()
def measure(model, batches) -> dict[str, torch.Tensor]:
    """Per image: knockout deltas [n, blocks], head attributions [n, L, H], head pointing hits [n, L, H]
    (NaN without a box) and the logit's parts [n, parts], for the predicted class (plus `part_names`)."""
    out: dict[str, list[torch.Tensor]] = {"delta": [], "heads": [], "pointing": [], "parts": []}
    cfg = model.cfg
    part_names: list[str] = []
    for x, boxes in batches:
        target = model.eval()(x).argmax(1)
        dla = explain.direct_logit_attribution(model, x, target)
        out["delta"].append(explain.knockout_profile(model, x, target))
        out["heads"].append(dla.heads)
        parts = dla.parts()
        part_names = list(parts)
        out["parts"].append(torch.stack(list(parts.values()), dim=1))
        maps = explain.class_attention(model, x).maps  # [B, L, H, g, g]
        hits = torch.full(dla.heads.shape, float("nan"))
        if boxes is not None:  # the atlas's per-head pointing, from its one owner
            hits = head_localization(maps, boxes, cfg.img_size)[0]
        out["pointing"].append(hits)
    return {**{k: torch.cat(v) for k, v in out.items()}, "part_names": part_names}


def rank_correlation(gamma: np.ndarray, delta: np.ndarray, *, resamples: int, seed: int = 0) -> dict[str, float | None]:
    """Spearman rho between mean |gamma| and |mean knockout delta| over blocks, and its 95% bootstrap
    interval from resampling the images (delta: [images, blocks]); None when the gammas are all equal."""
    if np.ptp(gamma) == 0:
        return {"rho": None, "low": None, "high": None}
    rho = float(spearmanr(gamma, np.abs(delta.mean(0))).statistic)
    rng = np.random.default_rng(seed)
    boot = [
        spearmanr(gamma, np.abs(delta[rng.integers(0, len(delta), len(delta))].mean(0))).statistic
        for _ in range(resamples)
    ]
    lo, hi = np.nanpercentile(boot, [2.5, 97.5])
    return {"rho": rho, "low": float(lo), "high": float(hi)}


def verdict(overall: dict[str, float | None], sa: dict[str, float | None], images: int) -> str:
    """One sentence, from the numbers: does LayerScale's magnitude rank the blocks by importance?"""

    if overall["rho"] is None:
        return f"Every block has the same mean |gamma| (as at init): LayerScale cannot rank them ({images} images)."

    def says(c: dict[str, float | None]) -> str:
        if c["rho"] is None:
            return "cannot rank them (its blocks' mean |gamma| are all equal)"
        if c["low"] > 0.7:
            return "ranks them well"
        if c["low"] > 0:
            return "ranks them only loosely"
        return "does not rank them"

    def span(c: dict[str, float | None]) -> str:
        return "" if c["rho"] is None else f" (rho {c['rho']:.2f}, 95% interval {c['low']:.2f} to {c['high']:.2f})"

    return (
        f"Over {images} images, LayerScale's mean |gamma| {says(overall)} by the logit change a knockout causes, "
        f"all blocks{span(overall)}; within the SA stage it {says(sa)}{span(sa)}."
    )


def heads_spearman(rows: list[dict]) -> float | None:
    """Spearman rho over CA heads of mean attribution against pointing score (None without boxes or when
    either is constant)."""
    if any(r["pointing"] is None for r in rows):
        return None
    rho = spearmanr([r["attribution_mean"] for r in rows], [r["pointing"] for r in rows]).statistic
    return float(rho) if np.isfinite(rho) else None


def heads_verdict(rho: float | None, heads: int) -> str | None:
    """Do the heads that write the answer look at the garment? One sentence from `heads_spearman`."""
    if rho is None:
        return None
    link = "go together" if rho > 0.5 else "are unrelated" if rho > -0.5 else "go opposite ways"
    return (
        f"Over the {heads} CA heads, what a head writes to the logit and how often it points into the garment's "
        f"box {link} (Spearman rho {rho:.2f})."
    )


def head_rows(heads: torch.Tensor, pointing: torch.Tensor) -> list[dict]:
    L, H = heads.shape[1:]
    rows = []
    for layer in range(L):
        for head in range(H):
            hits = pointing[:, layer, head]
            rows.append(
                {
                    "layer": layer + 1,
                    "head": head + 1,
                    "attribution_mean": heads[:, layer, head].mean().item(),
                    "pointing": None if hits.isnan().all() else hits.nanmean().item(),
                }
            )
    return rows


def logit_parts(parts: torch.Tensor, names: list[str]) -> dict[str, dict[str, float]]:
    """Per part of the logit (class token, each CA layer's heads and MLP, biases): its mean over images and
    that mean's share of the mean logit (parts [n, P] add up to each image's logit)."""
    means = parts.mean(0)
    return {
        name: {"mean": means[k].item(), "share_of_mean_logit": (means[k] / means.sum()).item()}
        for k, name in enumerate(names)
    }


def _interval(delta: torch.Tensor) -> list[float]:
    """Half-width of the normal 95% interval of each block's mean delta over images."""
    return (
        (1.96 * delta.std(0) / len(delta) ** 0.5).nan_to_num(0).tolist() if len(delta) > 1 else [0.0] * delta.shape[1]
    )


def figure_png(data: dict, model, made_from: str, path) -> None:
    """Knockout profile with |gamma| on a twin axis; beside it, each CA head's attribution vs pointing, and
    the logit's mean parts as a waterfall."""
    plt = matplotlib_pyplot()
    cfg = model.cfg
    fig, (ax, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 3.8), gridspec_kw=dict(width_ratios=[2.2, 1, 1]))
    blocks = data["blocks"]
    knockout_matplotlib(
        ax,
        [b["knockout_delta_logit_mean"] for b in blocks],
        [b["gamma_mean_abs"] for b in blocks],
        depth=cfg.depth,
        ca_depth=cfg.depth_token_only,
        error=[b["knockout_delta_logit_ci95"] for b in blocks],
    )
    ax.set_title("Predicted class's logit change per knocked-out block (bars) and mean |gamma|", fontsize=9)
    for row in data["heads"]:
        x = row["pointing"] if row["pointing"] is not None else row["head"]
        ax2.scatter(x, row["attribution_mean"], color="C0" if row["layer"] == 1 else "C3")
        ax2.annotate(f"CA{row['layer']} h{row['head']}", (x, row["attribution_mean"]), fontsize=7)
    ax2.set_xlabel("pointing game (share of images)" if data["heads"][0]["pointing"] is not None else "head")
    ax2.set_ylabel("mean direct logit attribution")
    rho = data["heads_spearman"]
    rho_text = "" if rho is None else f", rho {rho:.2f}"
    ax2.set_title(f"CA heads: what they write vs where they look{rho_text}", fontsize=9)
    logit_parts_matplotlib(ax3, [(name, v["mean"]) for name, v in data["logit_parts"].items()])
    ax3.set_title("What writes the logit (mean over images)", fontsize=9)
    fig.suptitle(data["verdict"], fontsize=8, wrap=True)
    fig.tight_layout()
    save_png(fig, path, made_from, dpi=80)


def figure_html(data: dict, model, made_from: str, path) -> None:
    cfg = model.cfg
    blocks = data["blocks"]
    fig = knockout_plotly(
        [b["knockout_delta_logit_mean"] for b in blocks],
        [b["gamma_mean_abs"] for b in blocks],
        depth=cfg.depth,
        ca_depth=cfg.depth_token_only,
        error=[b["knockout_delta_logit_ci95"] for b in blocks],
        title=f"Knockout profile and mean |gamma|<br><sup>{data['verdict']}</sup>",
    )
    fig.update_layout(height=460)
    save_html(fig, path, made_from)


def parts_html(data: dict, made_from: str, path) -> None:
    """The predicted class's logit built from its mean parts."""
    parts = [(name, v["mean"]) for name, v in data["logit_parts"].items()]
    fig = logit_parts_plotly(
        parts, title=f"What writes the predicted class's logit (mean over {data['images']} images)"
    )
    save_html(fig, path, made_from)


def heads_html(data: dict, made_from: str, path) -> None:
    """Each CA head's mean attribution against its pointing score (or its number, for photos)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for layer in sorted({r["layer"] for r in data["heads"]}):
        rows = [r for r in data["heads"] if r["layer"] == layer]
        fig.add_scatter(
            x=[r["pointing"] if r["pointing"] is not None else r["head"] for r in rows],
            y=[r["attribution_mean"] for r in rows],
            mode="markers+text",
            text=[f"h{r['head']}" for r in rows],
            textposition="top center",
            name=f"CA{layer}",
        )
    pointing = data["heads"][0]["pointing"] is not None
    fig.update_layout(
        title="CA heads: mean direct logit attribution against pointing game",
        xaxis_title="pointing game (share of images)" if pointing else "head",
        yaxis_title="mean direct logit attribution",
        template="plotly_white",
    )
    save_html(fig, path, made_from)


def results(model, m: dict[str, torch.Tensor], made_from: str, data_name: str, skipped: list[str], args) -> dict:
    """The JSON of the script: per block |gamma| and knockout, the rank correlations and verdicts, per head."""
    gamma = block_gamma_mean_abs(model).numpy()
    delta = m["delta"].numpy()
    sa = model.cfg.depth
    overall = rank_correlation(gamma, delta, resamples=args.bootstrap)
    sa_only = rank_correlation(gamma[:sa], delta[:, :sa], resamples=args.bootstrap)
    ci = _interval(m["delta"])
    blocks = [
        {
            "stage": "sa" if k < sa else "ca",
            "index": k + 1 if k < sa else k - sa + 1,
            "gamma_mean_abs": float(gamma[k]),
            "knockout_delta_logit_mean": float(delta[:, k].mean()),
            "knockout_delta_logit_ci95": ci[k],
        }
        for k in range(len(gamma))
    ]
    data = {
        "made_from": made_from,
        "data": data_name,
        "skipped": skipped,
        "target": "predicted class",
        "images": len(delta),
        "blocks": blocks,
        "spearman": {"all_blocks": overall, "sa_blocks": sa_only},
        "verdict": verdict(overall, sa_only, len(delta)),
        "heads": head_rows(m["heads"], m["pointing"]),
    }
    data["heads_spearman"] = heads_spearman(data["heads"])
    data["heads_verdict"] = heads_verdict(data["heads_spearman"], len(data["heads"]))
    data["logit_parts"] = logit_parts(m["parts"], m["part_names"])
    return data


@calm
def main(argv: list[str] | None = None) -> int:
    p = parser("layer_importance", __doc__, precision=False)
    add_data_flags(
        p,
        default=f"fashion-mnist-scenes (the first {DEFAULT_IMAGES}; --quick: {QUICK_IMAGES}), real photos for an "
        "ImageNet model",
    )
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of the images (default 1000)")
    args = p.parse_args(argv)
    if args.quick:
        args.bootstrap = 100
    loaded = load_from_flags(args)
    model = loaded.model.eval()
    out = out_dir(args.out)
    skipped: list[str] = []
    batches, data_name = image_batches(model, args, skipped)
    m = measure(model, batches)
    if not len(m["delta"]):
        fail(f"no readable image in {data_name}")
    made_from = made_from_data(loaded.made_from, data_name)
    data = results(model, m, made_from, data_name, skipped, args)
    write_json(out / "layer_importance.json", data)
    figure_png(data, model, made_from, out / "layer_importance.png")
    figure_html(data, model, made_from, out / "layer_importance.html")
    heads_html(data, made_from, out / "layer_importance_heads.html")
    parts_html(data, made_from, out / "layer_importance_parts.html")
    print(f"{made_from}\n{data['verdict']}\n{data['heads_verdict'] or ''}")
    for b in data["blocks"]:
        print(
            f"{b['stage'].upper()}{b['index']:<4} |gamma| {b['gamma_mean_abs']:.4f}  "
            f"knockout {b['knockout_delta_logit_mean']:+.3f} +- {b['knockout_delta_logit_ci95']:.3f}"
        )
    parts = ", ".join(f"{name} {v['mean']:+.2f}" for name, v in data["logit_parts"].items())
    print(f"the predicted class's logit, mean of its parts: {parts}")
    print(f"wrote layer_importance.json/.png/.html, layer_importance_heads.html, layer_importance_parts.html to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
