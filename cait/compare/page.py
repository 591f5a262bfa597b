"""compare.html: one self-contained page (plotly.js and the images inline) of a comparison: the two models and
their answers, CKA between the blocks, the head-similarity matrix with the matching, the matched heads'
differences, the per-class table, the confusions that changed, and the images where one is right and the other
wrong, each with both models' maps (the last CA layer's mean over heads)."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import torch

from .. import explain
from ..atlas.page import STYLE, figure_html, jpeg_data_uri, whole_tile
from ..figures.compare import cka_plotly, head_differences_plotly, head_similarity_plotly
from ..preprocess import normalise
from .report import HEAD_NUMBERS

TITLES = {
    "entropy_share": "entropy / ln N",
    "dla": "direct logit attribution",
    "pointing": "pointing game",
    "mass_in_box": "mass in box",
}


def _table(rows: list[dict], columns: list[str]) -> str:
    def cell(v) -> str:
        return f"{v:.3g}" if isinstance(v, float) else html.escape(str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c, ''))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


@torch.no_grad()
def _tiles(loaded, data, index: int) -> str:
    """Image `index` as each model sees it, with that model's last-CA-layer mean map and the box."""
    figures = []
    for side, images, name in zip(loaded, data, "AB"):
        pixels, _, box, _, ok = images[index]
        if not ok:
            continue
        x = normalise(pixels[None], side.model.cfg).to(next(side.model.parameters()).device)
        heat = explain.class_attention(side.model, x).maps[0, -1].mean(0).cpu()
        tile = whole_tile(images.image(index), heat, box, side.model.cfg)
        figures.append(f"<img src='{jpeg_data_uri(tile)}' title='model {name}'>")
    return "".join(figures)


def _disagreements(rows: list[dict], loaded, data, exemplars: int) -> str:
    """Both directions of disagreement, the first `exemplars` images of each, each with both models' maps."""
    index = {p: i for i, p in enumerate(data[0].paths)}
    out = []
    for title, right in (("A right, B wrong", "a"), ("B right, A wrong", "b")):
        chosen = [r for r in rows if r["label"] and r[f"pred_{right}"] == r["label"]][:exemplars]
        figures = [
            f"<figure>{_tiles(loaded, data, index[r['path']])}<figcaption>{html.escape(r['path'])}: true "
            f"{html.escape(r['label'])}, A {html.escape(r['pred_a'])}, B {html.escape(r['pred_b'])}</figcaption>"
            "</figure>"
            for r in chosen
        ]
        out.append(f"<h3>{title}</h3>" + ("".join(figures) or "<p>none</p>"))
    return "<h2>Where they disagree (left A, right B)</h2>" + "".join(out)


def write_page(path: Path, summary: dict, rows: dict[str, list[dict]], loaded, data, *, exemplars: int) -> Path:
    """compare.html from the summary, the rows of heads.csv, classes.csv and disagreements.csv (`rows` by file
    stem), the two models and their views of the images."""
    from plotly.offline import get_plotlyjs

    a, b = summary["a"], summary["b"]
    names = (a["model"], b["model"])
    matching = [(m["head_a"], m["head_b"], m["similarity"]) for m in summary["matching"]]
    figures = [
        cka_plotly(np.array(summary["cka"]["matrix"], float), a["blocks"], b["blocks"], names=names),
        head_similarity_plotly(np.array(summary["head_similarity"], float), a["heads"], b["heads"], matching),
    ]
    if rows["heads"]:
        figures.append(head_differences_plotly(rows["heads"], HEAD_NUMBERS, TITLES))
    body = "".join(figure_html(i, f) for i, f in enumerate(figures))
    classes = ["class", "images", "top1_a", "top1_b", "difference", "a_only", "b_only", "mcnemar_p"]
    body += "<h2>Per class</h2>" + _table(rows["classes"], classes)
    body += "<h2>Confusions that changed</h2>" + _table(summary["confusions_changed"], ["true", "predicted", "a", "b"])
    body += _disagreements(rows["disagreements"], loaded, data, exemplars)
    top1 = lambda v: "n/a" if v is None else f"{v:.1%}"  # noqa: E731
    m = summary["mcnemar"]
    chance = ", ".join(f"{k.upper()} {s['chance']:.3f}" for k, s in (("a", a), ("b", b)) if s["chance"] is not None)
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Comparison: {html.escape(summary['data'])}</title>"
        f"<style>{STYLE}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        f"<h1>Two models compared</h1><p class='made'>data: {html.escape(summary['data'])}<br>"
        f"A: {html.escape(names[0])}<br>B: {html.escape(names[1])}</p>"
        f"<p>{summary['images']} images; top-1 A {top1(summary['top1_a'])}, B {top1(summary['top1_b'])} over "
        f"{summary['labelled']} labelled; the two agree on {summary['agreement']:.1%}; only A right on {m['a_only']}, "
        f"only B on {m['b_only']} (McNemar's exact p = {m['p']:.3g}). CKA over {summary['cka']['minibatches']} "
        f"minibatches of up to {summary['cka']['batch_size']} images. Heads and layers numbered from 1."
        + (f" Chance level of the pointing game and mass in box (the box's share): {chance}." if chance else "")
        + f"</p>{body}</body></html>"
    )
    path.write_text(page)
    return path
