"""atlas.html: one self-contained page (plotly.js and the exemplar JPEGs inline) over the atlas's numbers:
per head its distributions, a heads x classes heatmap of mean DLA, per head its exemplars with the head's map
overlaid, the SA heads' attention distance by depth, and with knockouts the knockout profile against |gamma|."""

from __future__ import annotations

import base64
import html
import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from .. import explain
from ..explain.metrics import head_row
from ..figures import distance_plot, to_plotly
from ..figures.causal import knockout_plotly
from ..figures.mechanisms import heads_plotly, patching_plotly
from ..preprocess import normalise
from ..runtime import autocast
from .report import Tally

THUMB = 112  # pixels of an exemplar's side on the page
TITLES = {"entropy": "map entropy (nats)", "dla": "direct logit attribution", "mass_in_box": "mass in box"}


def _figure_id(index: int, fig) -> str:
    """The figure's div id from its place on the page and its title: plotly's default is a random uuid,
    which made two runs of the same command write different pages."""
    slug = re.sub(r"[^a-z0-9]+", "-", (fig.layout.title.text or "").lower()).strip("-")[:48].rstrip("-")
    return f"figure-{index}-{slug}" if slug else f"figure-{index}"


def _figure_html(index: int, fig) -> str:
    return fig.to_html(
        full_html=False, include_plotlyjs=False, config={"displaylogo": False}, div_id=_figure_id(index, fig)
    )


def distributions(hist: dict[str, dict[str, Any]], layers: int, heads: int) -> list:
    """Per number one figure: a histogram per head (rows: CA layers, columns: heads), bins shared by all heads."""
    from plotly.subplots import make_subplots

    figs = []
    for number, h in hist.items():
        edges = np.asarray(h["edges"])
        centres = (edges[:-1] + edges[1:]) / 2
        titles = [head_row(l, k) for l in range(layers) for k in range(heads)]
        fig = make_subplots(rows=layers, cols=heads, subplot_titles=titles, shared_xaxes=True)
        for l in range(layers):
            for k in range(heads):
                fig.add_bar(x=centres, y=h["counts"][l][k], width=edges[1] - edges[0], row=l + 1, col=k + 1)
        fig.update_layout(
            title=f"Per head: {TITLES[number]}", showlegend=False, template="plotly_white", height=200 + 160 * layers
        )
        figs.append(fig)
    return figs


def dla_heatmap(tally: Tally, names: list[str]):
    """Heads x predicted classes: the mean direct logit attribution of each head to the class it predicted."""
    seen = [c for c in range(tally.classes) if tally.class_count[c]]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = tally.class_dla[seen] / tally.class_count[seen, None, None]  # [classes, L, H]
    rows = [head_row(l, h) for l in range(tally.layers) for h in range(tally.heads)]
    return class_dla_figure(mean.reshape(len(seen), -1).T, rows, [names[c] for c in seen])


def class_dla_figure(z: np.ndarray, rows: list[str], classes: list[str]):
    """The heatmap of `dla_heatmap` from its numbers: z [heads, classes], one row per head (named `rows`), one
    column per predicted class; also drawn by the app's Dataset tab from heads.csv."""
    import plotly.graph_objects as go

    fig = go.Figure(go.Heatmap(z=z, x=classes, y=rows, colorscale="RdBu", zmid=0))
    fig.update_layout(
        title="Mean direct logit attribution of each head, by predicted class",
        template="plotly_white",
        height=200 + 28 * len(rows),
        yaxis=dict(autorange="reversed"),
    )
    return fig


def _view(pixels: torch.Tensor) -> Image.Image:
    """Unnormalised pixels [C, H, W] in [0, 1] as an RGB image."""
    array = (pixels.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    return Image.fromarray(array[..., 0] if array.shape[2] == 1 else array).convert("RGB")


def _jpeg(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.resize((THUMB, THUMB), Image.Resampling.BILINEAR).save(buffer, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


@torch.no_grad()
def exemplar_tiles(tally: Tally, model, data, dtype) -> dict[tuple[int, int], dict[str, list[tuple[int, str]]]]:
    """Per head (l, h) and kind, its exemplars as (image index, JPEG data URL with the head's map overlaid):
    the maps are recomputed here for the few exemplar images only."""
    device = next(model.parameters()).device
    wanted = sorted({i for top in (*tally.concentrated, *tally.writing) for i, _ in top.best()})
    if not wanted:
        return {}
    pixels = torch.stack([data[i][0] for i in wanted])
    maps = []
    for chunk in pixels.split(32):
        with autocast(dtype, device):
            maps.append(explain.class_attention(model, normalise(chunk.to(device), model.cfg)).maps.cpu())
    maps, where = torch.cat(maps), {i: j for j, i in enumerate(wanted)}
    tiles = {}
    for l in range(tally.layers):
        for h in range(tally.heads):
            k = l * tally.heads + h
            kinds = {"concentrated": tally.concentrated[k], "writes": tally.writing[k]}
            tiles[l, h] = {
                kind: [
                    (i, _jpeg(explain.overlay(_view(pixels[where[i]]), maps[where[i], l, h]))) for i, _ in top.best()
                ]
                for kind, top in kinds.items()
            }
    return tiles


def _exemplar_html(summary: dict, tiles: dict, paths: list[str]) -> str:
    parts = []
    for entry in summary["heads"]:
        l, h = entry["layer"] - 1, entry["head"] - 1
        rows = []
        for kind, label, key in (
            ("concentrated", "most concentrated (lowest entropy)", "entropy"),
            ("writes", "writes most to the logit (highest DLA)", "dla"),
        ):
            values = {e["path"]: e[key] for e in entry["exemplars"][kind]}
            cells = "".join(
                f'<figure><img src="{url}" alt="{html.escape(paths[i])}"><figcaption>{html.escape(Path(paths[i]).name)}'
                f"<br>{key} {values[paths[i]]:.3g}</figcaption></figure>"
                for i, url in tiles.get((l, h), {}).get(kind, [])
            )
            rows.append(f"<div class='row'><span class='kind'>{label}</span>{cells}</div>")
        parts.append(f"<h3>{head_row(l, h)}</h3>{''.join(rows)}")
    return "".join(parts)


def _heads_table(summary: dict) -> str:
    cols = ("entropy_mean", "dla_mean", "pointing", "mass_in_box")
    head = "".join(f"<th>{c}</th>" for c in ("head", *cols))
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    body = "".join(
        f"<tr><td>{head_row(e['layer'] - 1, e['head'] - 1)}</td>{''.join(f'<td>{fmt(e[c])}</td>' for c in cols)}</tr>"
        for e in summary["heads"]
    )
    return f"<table><tr>{head}</tr>{body}</table>"


STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:1300px} table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right} figure{display:inline-block;margin:2px;font-size:11px;
text-align:center;width:118px;overflow-wrap:anywhere} .row{margin:4px 0} .kind{display:inline-block;width:150px;
vertical-align:top;font-size:13px} .made{color:#555}"""


def _figures(summary: dict, tally: Tally, hist: dict, model, names: list[str]) -> list[str]:
    cfg = model.cfg
    figs = [*distributions(hist, tally.layers, tally.heads), dla_heatmap(tally, names)]
    distance = summary["sa_attention_distance"]
    if distance is not None:
        per_head = torch.tensor(distance["per_head_px"])
        figs.append(to_plotly(distance_plot(per_head, distance["uniform_px"], images=summary["images"])))
    if summary.get("blocks"):
        blocks = summary["blocks"]
        delta = [b["logit_change_mean"] for b in blocks]
        error = [(b["logit_change_ci95"][1] - b["logit_change_ci95"][0]) / 2 for b in blocks]
        gamma = [b["gamma_mean_abs"] for b in blocks]
        title = f"Knockout profile over {summary['images']} images (bars: mean logit change, 95% interval)"
        figs.append(
            knockout_plotly(delta, gamma, depth=cfg.depth, ca_depth=cfg.depth_token_only, error=error, title=title)
        )
    if summary.get("patching"):
        figs += patching_figures(summary["patching"], cfg, summary["images"])
    return [_figure_html(i, f) for i, f in enumerate(figs)]


def patching_figures(patching: dict, cfg, images: int) -> list:
    """The patching profile over blocks (mean Δlogit with 95% intervals; hover: the share of the mean gap), the
    CA heads' grid, and the token patching into the class stage, over the images."""
    blocks = patching["blocks"]
    parts = ("attention", "MLP")
    mean = np.array([[b[k]["delta_logit_mean"] for k in parts] for b in blocks], dtype=float)
    low = np.array([[b[k]["delta_logit_ci95"][0] for k in parts] for b in blocks], dtype=float)
    tokens = [b["class_token"] for b in blocks if "class_token" in b]
    token_mean = np.array([t["delta_logit_mean"] for t in tokens], dtype=float)
    token_low = np.array([t["delta_logit_ci95"][0] for t in tokens], dtype=float)
    gap, what = patching["gap"]["mean"], f"{patching['corruption']} at severity {patching['severity']}"
    title = f"Activation patching under {what} over {images} images (mean Δlogit, 95% interval; gap {gap:.2f})"
    heads = np.array(
        [
            [h["delta_logit_mean"] for h in patching["heads"] if h["layer"] == l + 1]
            for l in range(cfg.depth_token_only)
        ],
        dtype=float,
    )
    profile = patching_plotly(
        mean,
        gap,
        class_token=token_mean,
        depth=cfg.depth,
        ca_depth=cfg.depth_token_only,
        title=title,
        errors=mean - low,
        class_token_errors=token_mean - token_low,
    )
    return [
        profile,
        heads_plotly(heads, gap, title=f"Each CA head patched alone under {what}: mean Δlogit (share of the mean gap)"),
        token_patching_plotly(patching["tokens"], what),
    ]


def token_patching_plotly(tokens: dict, what: str):
    """Bars: the share of the mean gap that the best patch of each image restores alone, and its `top` best
    together, each with its 95% interval; the title gives how much of the best patch lies in the object's box."""
    import plotly.graph_objects as go

    rows = [("the best patch alone", tokens["best"]), (f"the {tokens['top']} best together", tokens["top_together"])]
    share = [r["restored"] for _, r in rows]
    half = [None if r["restored"] is None else (r["restored_ci95"][1] - r["restored_ci95"][0]) / 2 for _, r in rows]
    box = tokens["best_in_box"]
    inside = "" if box["mean"] is None else f"; the best patch lies {box['mean']:.0%} inside the object's box"
    fig = go.Figure(go.Bar(x=[n for n, _ in rows], y=share, error_y=dict(type="data", array=half)))
    fig.update_yaxes(title_text="share of the mean gap restored")
    fig.update_layout(
        title=f"Token patching into the class stage under {what}: clean patch tokens into the corrupted run{inside}",
        template="plotly_white",
        height=340,
    )
    return fig


def write_page(path: Path, summary: dict, tally: Tally, hist: dict, *, model, data, names: list[str], dtype) -> Path:
    """atlas.html from the summary, the tally's per-class sums and exemplars, and the histograms."""
    from plotly.offline import get_plotlyjs

    if not summary["images"]:
        body = "<p>No readable image: nothing to show.</p>"
    else:
        tiles = exemplar_tiles(tally, model, data, dtype)
        body = _heads_table(summary) + "".join(_figures(summary, tally, hist, model, names))
        body += f"<h2>Exemplars</h2>{_exemplar_html(summary, tiles, data.paths)}"
    top1 = "" if summary["top1"] is None else f", top-1 {summary['top1']:.1%} over {summary['labelled']} labelled"
    skipped = summary["skipped"]
    skip = f"<p>Skipped {len(skipped)} unreadable: {html.escape(', '.join(skipped[:20]))}</p>" if skipped else ""
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Head atlas: {html.escape(summary['data'])}</title>"
        f"<style>{STYLE}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        f"<h1>Head atlas</h1><p class='made'>data: {html.escape(summary['data'])}<br>model: "
        f"{html.escape(summary['model'])}</p><p>{summary['images']} images{top1}; heads and layers numbered from 1; "
        f"DLA: each CA head's direct write to the predicted class's logit.</p>{skip}{body}</body></html>"
    )
    path.write_text(page)
    return path
