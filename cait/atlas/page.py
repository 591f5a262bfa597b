"""atlas.html: one self-contained page (plotly.js and the exemplar JPEGs inline) over the atlas's numbers:
what the localisation is over and its chance level, per head its means with intervals (over right and wrong
predictions apart), which classes fail (per-class top-1, the confusion matrix), per head its distributions, a
heads x classes heatmap of mean DLA with counts and intervals, per head its exemplars (the whole image, the
head's map, the box, the true and predicted class), the SA heads' attention distance by depth, and with
knockouts the knockout profile against |gamma|."""

from __future__ import annotations

import base64
import html
import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from .. import explain
from ..explain.maps import overlay
from ..figures import distance_plot, head_name, to_plotly
from ..figures.causal import knockout_plotly
from ..figures.colours import signed_heatmap
from ..figures.mechanisms import gap_too_small, heads_plotly, patching_plotly
from ..preprocess import normalise
from ..runtime import autocast
from .report import Tally, box_line

THUMB = 112  # pixels of an exemplar's height on the page
TITLES = {"entropy": "map entropy (nats)", "dla": "direct logit attribution", "mass_in_box": "mass in box"}


def _figure_id(index: int, fig) -> str:
    """The figure's div id from its place on the page and its title: plotly's default is a random uuid,
    which made two runs of the same command write different pages."""
    slug = re.sub(r"[^a-z0-9]+", "-", (fig.layout.title.text or "").lower()).strip("-")[:48].rstrip("-")
    return f"figure-{index}-{slug}" if slug else f"figure-{index}"


def figure_html(index: int, fig) -> str:
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
        titles = [head_name(l, k) for l in range(layers) for k in range(heads)]
        fig = make_subplots(rows=layers, cols=heads, subplot_titles=titles, shared_xaxes=True)
        bins = np.stack([edges[:-1], edges[1:]], 1)
        hover = f"{TITLES[number]} %{{customdata[0]:.3g}} to %{{customdata[1]:.3g}}: %{{y}} images<extra></extra>"
        for l in range(layers):
            for k in range(heads):
                fig.add_bar(
                    x=centres,
                    y=h["counts"][l][k],
                    width=edges[1] - edges[0],
                    customdata=bins,
                    hovertemplate=hover,
                    row=l + 1,
                    col=k + 1,
                )
        fig.update_layout(
            title=f"Per head: {TITLES[number]}", showlegend=False, template="plotly_white", height=200 + 160 * layers
        )
        figs.append(fig)
    return figs


def dla_heatmap(tally: Tally, names: list[str]):
    """Heads x predicted classes: the mean direct logit attribution of each head to the class it predicted,
    each column with its image count and each cell with its 95% interval."""
    seen = [c for c in range(tally.classes) if tally.class_count[c]]
    mean, half = tally.class_dla_interval()
    rows = [head_name(l, h) for l in range(tally.layers) for h in range(tally.heads)]
    flat = lambda a: a[seen].reshape(len(seen), -1).T  # [heads, classes]
    counts = [int(tally.class_count[c]) for c in seen]
    return class_dla_figure(flat(mean), rows, [names[c] for c in seen], counts=counts, half=flat(half))


def class_dla_figure(z: np.ndarray, rows: list[str], classes: list[str], *, counts: list[int] | None = None, half=None):
    """The heatmap of `dla_heatmap` from its numbers: z [heads, classes], one row per head (named `rows`), one
    column per predicted class; also drawn by the app's Dataset tab from heads.csv. counts: images per column
    (in its label); half [heads, classes]: the half width of each cell's 95% interval (in its hover)."""
    import plotly.graph_objects as go

    x = classes if counts is None else [f"{c} (n={n})" for c, n in zip(classes, counts)]
    cell = dict(hovertemplate="%{y}, predicted %{x}: mean DLA %{z:.3f}<extra></extra>")
    if half is not None:
        cell = dict(
            customdata=half,
            hovertemplate="%{y}, predicted %{x}: mean DLA %{z:.3f} ± %{customdata:.3f} (95%)<extra></extra>",
        )
    bound = np.nanmax(np.abs(z)) if np.isfinite(z).any() else 1.0
    fig = go.Figure(go.Heatmap(z=z, x=x, y=rows, colorbar=dict(title="mean DLA"), **signed_heatmap(bound), **cell))
    fig.update_layout(
        title="Mean direct logit attribution of each head, by predicted class (n: images per column)",
        template="plotly_white",
        height=max(360, 200 + 28 * len(rows)),
        yaxis=dict(autorange="reversed", title="head"),
        xaxis=dict(title="predicted class"),
    )
    return fig


def confusion_figure(confusion: dict[str, Any], most: int = 40):
    """The confusion matrix of the labelled images (rows: true class, columns: predicted), counts written in
    the cells; of many classes the `most` with the most images."""
    import plotly.graph_objects as go

    counts, classes = np.asarray(confusion["counts"]), confusion["classes"]
    keep = np.sort(np.argsort(-(counts.sum(0) + counts.sum(1)), kind="stable")[:most])
    counts, classes = counts[np.ix_(keep, keep)], [classes[k] for k in keep]
    fig = go.Figure(
        go.Heatmap(
            z=counts,
            x=classes,
            y=classes,
            colorscale="Blues",
            text=counts,
            texttemplate="%{text}",
            hovertemplate="true %{y}, predicted %{x}: %{z} images<extra></extra>",
        )
    )
    shown = "" if len(keep) == len(confusion["classes"]) else f" (the {len(keep)} classes with most images)"
    fig.update_layout(
        title=f"Confusion matrix of the labelled images{shown}: rows true class, columns predicted",
        template="plotly_white",
        height=240 + 24 * len(classes),
        yaxis=dict(autorange="reversed", title="true"),
        xaxis=dict(title="predicted"),
    )
    return fig


def jpeg_data_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def whole_tile(image: Image.Image, heat: torch.Tensor, box: torch.Tensor, cfg) -> Image.Image:
    """The whole image (not only the model's square view), THUMB pixels high: the head's map over the part the
    model sees, the rest dimmed and the view outlined when the crop cut something off, and the box (in input
    pixels; a NaN box is not drawn) in green."""
    (width, height), (left, top) = cfg.view_geometry(*image.size)
    scaled = image.convert("RGB").resize((width, height), Image.Resampling.BICUBIC)
    view = (left, top, left + cfg.img_size, top + cfg.img_size)
    tile = Image.blend(scaled, Image.new("RGB", scaled.size, "white"), 0.6)
    tile.paste(overlay(scaled.crop(view), heat), view[:2])
    f = THUMB / height
    tile = tile.resize((max(1, round(width * f)), THUMB), Image.Resampling.BILINEAR)
    draw = ImageDraw.Draw(tile)
    if (width, height) != (cfg.img_size, cfg.img_size):
        draw.rectangle([round(v * f) for v in view], outline=(255, 255, 255), width=1)
    if not box.isnan().any():
        x0, y0, x1, y1 = ((box + torch.tensor([left, top, left, top])) * f).tolist()
        draw.rectangle([x0, y0, x1, y1], outline=(0, 230, 0), width=2)
    return tile


@torch.no_grad()
def exemplar_tiles(tally: Tally, model, data, dtype) -> dict[tuple[int, int], dict[str, list[tuple[int, str]]]]:
    """Per head (l, h) and kind, its exemplars as (image index, JPEG data URL of `whole_tile`): the maps are
    recomputed here for the few exemplar images only."""
    device = next(model.parameters()).device
    wanted = sorted({i for top in (*tally.concentrated, *tally.writing) for i, _ in top.best()})
    if not wanted:
        return {}
    items = [data[i] for i in wanted]
    pixels = torch.stack([item[0] for item in items])
    maps = []
    for chunk in pixels.split(32):
        with autocast(dtype, device):
            maps.append(explain.class_attention(model, normalise(chunk.to(device), model.cfg)).maps.cpu())
    maps, where = torch.cat(maps), {i: j for j, i in enumerate(wanted)}
    images = {i: data.image(i) for i in wanted}
    tiles = {}
    for l in range(tally.layers):
        for h in range(tally.heads):
            k = l * tally.heads + h
            kinds = {"concentrated": tally.concentrated[k], "writes": tally.writing[k]}
            tiles[l, h] = {
                kind: [
                    (i, jpeg_data_uri(whole_tile(images[i], maps[where[i], l, h], items[where[i]][2], model.cfg)))
                    for i, _ in top.best()
                ]
                for kind, top in kinds.items()
            }
    return tiles


def _caption(path: str, context: tuple[int, int, float] | None, names: list[str]) -> str:
    """An exemplar's path, its true class (when labelled) and the predicted one with its probability."""
    text = html.escape(path)
    if context is None:
        return text
    label, prediction, probability = context
    said = f"predicted {html.escape(names[prediction])} ({probability:.2f})"
    if label < 0:
        return f"{text}<br>{said}"
    mark = "right" if label == prediction else "wrong"
    return f"{text}<br><span class='{mark}'>true {html.escape(names[label])}, {said}</span>"


def _exemplar_html(summary: dict, tiles: dict, paths: list[str], tally: Tally, names: list[str]) -> str:
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
                f'<figure><img src="{url}" alt="{html.escape(paths[i])}"><figcaption>'
                f"{_caption(paths[i], tally.context.get(i), names)}<br>{key} {values[paths[i]]:.3g}</figcaption>"
                "</figure>"
                for i, url in tiles.get((l, h), {}).get(kind, [])
            )
            rows.append(f"<div class='row'><span class='kind'>{label}</span>{cells}</div>")
        parts.append(f"<h3>{head_name(l, h)}</h3>{''.join(rows)}")
    return "".join(parts)


NUMBER_NAMES = {"entropy": "entropy", "dla": "DLA", "pointing": "pointing", "mass_in_box": "mass in box"}


def _mean_pm(mean: float | None, ci: list | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.3f}" if not ci or ci[1] is None else f"{mean:.3f} ± {(ci[1] - ci[0]) / 2:.3f}"


def _heads_table(summary: dict) -> str:
    """Per head each number's mean ± the half width of its 95% interval, over all images and, on labelled
    data, over the right and the wrong predictions apart (each column's image count in its header: the
    localisation numbers are over the images with a box in view)."""
    first = summary["heads"][0]
    numbers = [m for m in NUMBER_NAMES if first[f"{m}_mean"] is not None]
    outcomes = [o for o in ("correct", "wrong") if f"{numbers[0]}_{o}_mean" in first]
    groups = [("all", "")] + [(o if o == "wrong" else "right", f"_{o}") for o in outcomes]
    top = "".join(f"<th colspan='{len(groups)}'>{NUMBER_NAMES[m]}</th>" for m in numbers)
    sub = "".join(f"<th>{g} ({first[f'{m}{s}_images']})</th>" for m in numbers for g, s in groups)
    body = "".join(
        f"<tr><td>{head_name(e['layer'] - 1, e['head'] - 1)}</td>"
        + "".join(f"<td>{_mean_pm(e[f'{m}{s}_mean'], e[f'{m}{s}_ci95'])}</td>" for m in numbers for _, s in groups)
        + "</tr>"
        for e in summary["heads"]
    )
    return f"<table><tr><th rowspan='2'>head</th>{top}</tr><tr>{sub}</tr>{body}</table>"


def _class_table(summary: dict) -> str:
    """Per true class: its images, top-1 and the class it is most often mistaken for."""
    rows = "".join(
        f"<tr><td style='text-align:left'>{html.escape(name)}</td><td>{c['images']}</td><td>{c['top1']:.1%}</td>"
        f"<td style='text-align:left'>"
        + ("-" if c["mistaken_for"] is None else f"{html.escape(c['mistaken_for'])} ({c['mistaken_images']})")
        + "</td></tr>"
        for name, c in sorted(summary["per_class"].items(), key=lambda kv: kv[1]["top1"])
    )
    head = "<tr><th>true class</th><th>images</th><th>top-1</th><th>most often predicted instead (images)</th></tr>"
    return f"<h2>Which classes fail</h2><table>{head}{rows}</table>"


def _boxes_html(summary: dict) -> str:
    """What the localisation scores are over: the images with a box in view, what was left out and why, and the
    chance level both scores are to be read against."""
    b = summary["boxes"]
    line = box_line(b)
    chance = (
        ""
        if b["box_share_mean"] is None
        else (
            f" Chance level of the pointing game and of the mass in the box (the box's mean share of the image): "
            f"<b>{_mean_pm(b['box_share_mean'], b['box_share_ci95'])}</b>."
        )
    )
    return f"<p>Localisation: {html.escape(line)}.{chance}</p>"


STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:1300px} table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;font-size:13px}
figure{display:inline-block;margin:2px;font-size:11px;
text-align:center;max-width:460px;overflow-wrap:anywhere;vertical-align:top} .row{margin:4px 0}
.kind{display:inline-block;width:150px;vertical-align:top;font-size:13px} .made{color:#555} .wrong{color:#b00}"""


def _figures(summary: dict, tally: Tally, hist: dict, model, names: list[str]) -> list[str]:
    cfg = model.cfg
    figs = [*distributions(hist, tally.layers, tally.heads), dla_heatmap(tally, names)]
    if summary["confusion"]["classes"]:
        figs.append(confusion_figure(summary["confusion"]))
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
    return [figure_html(i, f) for i, f in enumerate(figs)]


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
    by_layer = [[h for h in patching["heads"] if h["layer"] == l + 1] for l in range(cfg.depth_token_only)]
    heads = np.array([[h["delta_logit_mean"] for h in layer] for layer in by_layer], dtype=float)
    ci95 = np.array([[h["restored_ci95"] for h in layer] for layer in by_layer], dtype=float)
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
        heads_plotly(
            heads,
            gap,
            title=f"Each CA head patched alone under {what}: mean Δlogit " + _heads_unit(gap),
            ci95=ci95,
        ),
        token_patching_plotly(patching["tokens"], what),
    ]


def _heads_unit(gap: float) -> str:
    """What the heads' grid writes in each cell besides the mean Δlogit: shares only of a gap large enough."""
    if gap_too_small(gap):
        return f"(no shares: the mean gap, {gap:.2f} logits, is too small for them)"
    return "(share of the mean gap, 95% interval)"


def token_patching_plotly(tokens: dict, what: str):
    """Bars: the share of the mean gap that the best patch of each image restores alone, and its `top` best
    together, each with its 95% interval; the title gives how much of the best patch lies in the object's box."""
    import plotly.graph_objects as go

    rows = [("the best patch alone", tokens["best"]), (f"the {tokens['top']} best together", tokens["top_together"])]
    share = [r["restored"] for _, r in rows]
    half = [None if r["restored"] is None else (r["restored_ci95"][1] - r["restored_ci95"][0]) / 2 for _, r in rows]
    box = tokens["best_in_box"]
    inside = "" if box["mean"] is None else f"; the best patch lies {box['mean']:.0%} inside the object's box"
    fig = go.Figure(
        go.Bar(
            x=[n for n, _ in rows],
            y=share,
            error_y=dict(type="data", array=half),
            hovertemplate="%{x}: %{y:.1%} of the mean gap<extra></extra>",
        )
    )
    fig.update_yaxes(title_text="share of the mean gap restored")
    fig.update_layout(
        title=f"Token patching into the class stage under {what}: clean patch tokens into the corrupted run{inside}",
        template="plotly_white",
        height=340,
    )
    return fig


def write_page(
    path: Path,
    summary: dict,
    tally: Tally,
    hist: dict,
    *,
    model,
    data,
    names: list[str],
    dtype,
    skipped: list[tuple[str, str]] = (),
) -> Path:
    """atlas.html from the summary, the tally's per-class sums and exemplars, and the histograms (of an atlas
    with at least one readable image: `merge` refuses one without); skipped: each unreadable image and why."""
    from plotly.offline import get_plotlyjs

    tiles = exemplar_tiles(tally, model, data, dtype)
    body = _boxes_html(summary) if summary["boxes"] else ""
    body += _heads_table(summary) + (_class_table(summary) if summary["per_class"] else "")
    body += "".join(_figures(summary, tally, hist, model, names))
    body += f"<h2>Exemplars</h2>{_exemplar_html(summary, tiles, data.paths, tally, names)}"
    top1 = "" if summary["top1"] is None else f", top-1 {summary['top1']:.1%} over {summary['labelled']} labelled"
    skipped = [f"{p} ({why})" for p, why in skipped]
    shown = ", ".join(skipped[:20]) + (f" and {len(skipped) - 20} more (skipped.csv)" if len(skipped) > 20 else "")
    skip = f"<p>Skipped {len(skipped)} unreadable: {html.escape(shown)}</p>" if skipped else ""
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Head atlas: {html.escape(summary['data'])}</title>"
        f"<style>{STYLE}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        f"<h1>Head atlas</h1><p class='made'>data: {html.escape(summary['data'])}<br>model: "
        f"{html.escape(summary['model'])}</p><p>{summary['images']} images{top1}; heads and layers numbered from 1 "
        "(CA1 head 2 is ca1_head2 in the CSV files); "
        f"DLA: each CA head's direct write to the predicted class's logit.</p>{skip}{body}</body></html>"
    )
    path.write_text(page)
    return path
