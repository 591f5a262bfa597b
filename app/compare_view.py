"""The Compare tab's numbers and figures (no Gradio): one image through the page's model (A) and a second one (B)
(`cait.compare.image`), and a compare run's CKA heatmap, head matrix with its matching, and the images the two
answer differently."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch
from PIL import Image

from app import figures, session, texts
from app.models import LoadedModel
from cait.atlas.shards import ARGS_FILE
from cait.compare import CompareRun
from cait.compare.image import ImageComparison, Seen, compare_image
from cait.data import read_images
from cait.figures import compare as compare_figures
from cait.figures import to_plotly
from cait.figures.attention import TILE
from cait.figures.colours import MODEL_A, MODEL_B, legend_below
from cait.figures.layerscale import block_position
from cait.figures.lines import LinePlot, Series

DISAGREEMENTS_SHOWN = 12  # disagreement images opened in the tab at most (the run's page lists them all)


def compared(a_model: LoadedModel, x_a: torch.Tensor, image: Image.Image, b_model: LoadedModel,
             run: CompareRun | None, *, target: int | None = None,
             seen_a: Seen | None = None) -> tuple[ImageComparison, Image.Image]:  # fmt: skip
    """The decoded `image` (`x_a`: as model A sees it) through both models: (the comparison, B's view of it). B
    reads the image through its own preprocessing; heads paired by `run`'s matching when one is open; target:
    the class of the heads' direct logit attribution (None: A's top); seen_a: A's answer, maps and ratios when
    a pass already gave them (the page's analysis: `seen_of`). Raises cait.InputError (one line) for what
    cannot be compared."""
    view_b, x_b = session.model_input_of(image.convert(b_model.cfg.image_mode), b_model.cfg)
    with torch.no_grad():
        seen = compare_image(
            a_model.model, x_a.to(a_model.device), b_model.model, x_b.to(b_model.device),
            matching=None if run is None else run.matching, target=target, seen_a=seen_a,
        )  # fmt: skip
    return seen, view_b


def seen_of(a: session.Analysis) -> Seen:
    """What the page's analysis already holds of model A's pass: its answer, maps and residual ratios."""
    return Seen(a.probs, a.ca_maps, a.ratios)


def top5_html(seen: ImageComparison, labels: tuple[str, ...], names: tuple[str, str]) -> str:
    """Both top-5 side by side, each under its model's name."""
    sides = []
    for name, top in zip(names, (seen.top_a, seen.top_b)):
        rows = [{"label": labels[c], "probability": p} for c, p in top]
        sides.append(f"<div style='flex:1'><b>{name}</b>{texts.top5_html(rows)}</div>")
    return f"<div style='display:flex;gap:2em'>{''.join(sides)}</div>"


def head_tiles(seen: ImageComparison, view_a, view_b, folder: Path, *, cmap: str, alpha: float) -> list[tuple]:
    """Per pair of heads: A's map, B's map (each over what its model sees, its own min .. max) and B - A in the
    signed scale where the grids match; (file in `folder`, caption) each, three to a row. Files, not images:
    Gradio saves an image under its content's hash, rewriting in place a tile that a page is fetching."""
    tiles = []
    for ((la, ha), (lb, hb)), diff in zip(seen.pairs, seen.differences):
        map_a, map_b = seen.maps_a[la - 1, ha - 1], seen.maps_b[lb - 1, hb - 1]
        tiles.append(
            (figures.saliency_tile(view_a, torch.from_numpy(map_a), cmap=cmap, alpha=alpha), f"A CA{la} head {ha}")
        )
        tiles.append(
            (figures.saliency_tile(view_b, torch.from_numpy(map_b), cmap=cmap, alpha=alpha), f"B CA{lb} head {hb}")
        )
        if diff is None:
            tiles.append((Image.new("RGB", (TILE, TILE), "white"), "grids differ: no difference map"))
        else:
            signed = figures.saliency_tile(view_a, torch.from_numpy(diff), cmap=cmap, alpha=alpha, signed=True)
            tiles.append((signed, f"B − A (red: B attends more, {np.abs(diff).max():.2f} at most)"))
    files = figures.save_tiles([image for image, _ in tiles], folder, "heads")
    return [(file, caption) for file, (_, caption) in zip(files, tiles)]  # fmt: skip


def dla_figure(seen: ImageComparison, target: str) -> go.Figure:
    """Each paired head's direct write to the target's logit, A's bar beside B's."""
    pairs = [f"A {la}.{ha} · B {lb}.{hb}" for (la, ha), (lb, hb) in seen.pairs]
    a = [float(seen.dla_a[la - 1, ha - 1]) for (la, ha), _ in seen.pairs]
    b = [float(seen.dla_b[lb - 1, hb - 1]) for _, (lb, hb) in seen.pairs]
    fig = go.Figure(
        [go.Bar(name="A", x=pairs, y=a, marker_color=MODEL_A), go.Bar(name="B", x=pairs, y=b, marker_color=MODEL_B)]
    )
    title = f"Each CA head's direct write to the logit of {target} (layer.head, paired)"
    return fig.update_layout(title=title, barmode="group", yaxis_title="logit", **legend_below(420))  # fmt: skip


def depth_figure(seen: ImageComparison) -> go.Figure:
    """|gamma| per depth (left) and the image's residual-branch ratios (right) of both models, each model's
    blocks at its own depth (SA blocks, a gap, CA blocks)."""
    series = []
    for side, colour, gammas, ratios in (
        ("A", MODEL_A, seen.gamma_a, seen.ratios_a),
        ("B", MODEL_B, seen.gamma_b, seen.ratios_b),
    ):
        depth = len(ratios["sa"])
        for branch, dash, sa, ca in (("attention", "solid", "sa", "ca"), ("FFN", "dot", "ffn", "ca_ffn")):
            g = f"gamma_{1 if branch == 'attention' else 2}"
            x = [block_position("sa", i, depth) for i in range(depth)] + [
                block_position("ca", i, depth) for i in range(len(ratios["ca"]))
            ]
            series.append(
                Series(f"{side} {branch}", x, gammas[f"sa {g}"] + gammas[f"ca {g}"], colour=colour, dash=dash)
            )
            series.append(
                Series(f"{side} {branch}", x, ratios[sa] + ratios[ca], panel=1, colour=colour, dash=dash, legend=False)
            )
    plot = LinePlot(
        title="LayerScale and the residual stream, A against B (SA blocks, then CA blocks after a gap)",
        panels=["mean |gamma| per block", "this image's ||branch|| / ||residual input||"],
        x_label="block", y_label="value", series=series, log_y=True, height=420,
    )  # fmt: skip
    return to_plotly(plot)


def run_figures(run: CompareRun) -> tuple[go.Figure, go.Figure]:
    """The run's CKA heatmap and its head-similarity matrix with the matching (`cait.figures.compare`)."""
    names = (run.model_a, run.model_b)
    cka = compare_figures.cka_plotly(run.cka, run.blocks_a, run.blocks_b, names=names)
    return cka, compare_figures.head_similarity_plotly(run.head_similarity, run.heads_a, run.heads_b, run.matching)


def disagreement_tiles(run: CompareRun, cfg, folder: Path) -> tuple[list[tuple[str, str]], str]:
    """The run's first disagreement images as PNG files in `folder` with their captions, and a line on them.
    The images are read again from the data the run names (its arguments file)."""
    shown = run.disagreements[:DISAGREEMENTS_SHOWN]
    said = f"{len(run.disagreements):,} images answered differently"
    args_file = run.folder / ARGS_FILE
    if not shown or not args_file.is_file():
        return [], said + ("" if not shown else " (the run does not say where its images are)")
    args = json.loads(args_file.read_text())
    images = read_images(
        args["data"], cfg, limit=args.get("limit"), sample=args.get("sample", "stratified"), normalise=False
    )
    index = {p: i for i, p in enumerate(images.paths)}
    tiles = []
    for k, d in enumerate(x for x in shown if x.path in index):
        path = folder / f"disagreement_{k}.png"
        images.image(index[d.path]).save(path)
        tiles.append((str(path), f"{d.label or '?'}: A {d.pred_a}, B {d.pred_b}"))
    return tiles, said + f"; the first {len(tiles)} below (click one to open it)"  # fmt: skip


def numbers(seen: ImageComparison, a_model: LoadedModel, b_model: LoadedModel) -> dict:
    """The comparison as JSON (the /compare answer): arrays indexed from 0, heads named from 1."""
    top = lambda pairs: [{"index": c, "label": a_model.labels[c], "probability": p} for c, p in pairs]  # noqa: E731
    return {
        "model_a": {"name": a_model.name, "source": a_model.source},
        "model_b": {"name": b_model.name, "source": b_model.source},
        "target": {"index": seen.target, "label": a_model.labels[seen.target]},
        "predictions_a": top(seen.top_a),
        "predictions_b": top(seen.top_b),
        "layout": "pairs[i]: [[ca_layer, head] of A, [ca_layer, head] of B], numbered from 1; maps_a/maps_b"
        "[ca_layer][head][row][col]; differences[i]: B's map minus A's for pair i (null where the grids differ); "
        "dla_a/dla_b[ca_layer][head]: each head's direct write to the target's logit; gamma_*: mean |gamma| per "
        "block by stage and gamma; residual_ratios_*: the image's per block, by branch",
        "pairs": [[list(ha), list(hb)] for ha, hb in seen.pairs],
        "maps_a": seen.maps_a.tolist(),
        "maps_b": seen.maps_b.tolist(),
        "differences": [None if d is None else d.tolist() for d in seen.differences],
        "dla_a": seen.dla_a.tolist(),
        "dla_b": seen.dla_b.tolist(),
        "gamma_a": seen.gamma_a,
        "gamma_b": seen.gamma_b,
        "residual_ratios_a": seen.ratios_a,
        "residual_ratios_b": seen.ratios_b,
    }
