"""Class-attention maps (the paper's Figure 6): for each image, one row per class-attention layer and
one column per head plus the head mean, overlaid on the image, with the prediction in the title.

    python analysis/attention_maps.py [--checkpoint FILE] [--images a.png b.png ...] [--out DIR]
    python analysis/attention_maps.py --model cait_s24_224 --pretrained     # the official ImageNet weights

Default images: the example scenes shipped in cait/examples; for an ImageNet model, real photos
(cait.data.photos: scikit-image's and gradio's sample photos, licences listed there). Writes
attention_<image>.png per image,
attention_maps.html (all images, pick one from the menu; hover shows the attention values) and
attention_maps.json (the maps, the class token's attention to itself, the prediction).
"""

from __future__ import annotations

import numpy as np
import torch
from _common import (
    Example,
    batch_of,
    calm,
    default_images,
    forward_only,
    load_examples,
    out_dir,
    parser,
    save_html,
    save_image,
    write_json,
)

from cait.explain import class_attention
from cait.factory import load_from_flags
from cait.figures import attention_tiles, colour_bar, grid_columns, head_name, tile_sheet
from cait.preprocess import class_names


def panel_titles(layers: int, heads: int) -> list[list[str]]:
    """Per CA layer, the name of every head, then the mean (the order of the JSON's maps)."""
    return [[head_name(l, h) for h in range(heads)] + [head_name(l, None)] for l in range(layers)]


def figure_png(ex: Example, maps: torch.Tensor, self_share: torch.Tensor, caption: str, made_from: str, path) -> None:
    """The app's class-attention grid for one image: maps [L, heads, g, g]; self_share [L, heads]."""
    layers = attention_tiles(ex.image, maps.numpy(), self_share.numpy())
    sheet = tile_sheet(
        layers, title=f"{ex.name}: {caption}", footer=colour_bar("inferno", "each tile's min", "each tile's max")
    )
    save_image(sheet, path, made_from)


def _image_with_heat(image, heat: np.ndarray, step: float, *, visible: bool) -> list:
    """The image and its attention map over it (hover gives the value), as two plotly traces."""
    import plotly.graph_objects as go

    return [
        go.Image(z=np.asarray(image), visible=visible, hoverinfo="skip"),
        go.Heatmap(
            z=heat,
            x0=step / 2,
            dx=step,
            y0=step / 2,
            dy=step,
            colorscale="Inferno",
            opacity=0.55,
            showscale=False,
            visible=visible,
            hovertemplate="attention %{z:.4f}<extra></extra>",
        ),
    ]


def figure_html(examples: list[Example], maps: torch.Tensor, captions: list[str], made_from: str, path) -> None:
    """The same grid, interactive: one subplot per (layer, mean|head) in the tiles' order, hover shows the
    attention; the menu switches images. maps [B, L, heads, g, g]."""
    from plotly.subplots import make_subplots

    B, layers, heads, g, _ = maps.shape
    order = [(l, h) for l in range(layers) for h in (None, *range(heads))]
    columns = grid_columns(heads + 1)
    rows = layers * -(-(heads + 1) // columns)
    fig = make_subplots(
        rows,
        columns,
        subplot_titles=[head_name(l, h) for l, h in order],
        horizontal_spacing=0.02,
        vertical_spacing=0.08,
    )
    step = examples[0].image.width / g
    for b, ex in enumerate(examples):
        for i, (l, h) in enumerate(order):
            heat = (maps[b, l].mean(0) if h is None else maps[b, l, h]).numpy()
            where = dict(
                row=l * (rows // layers) + (i % (heads + 1)) // columns + 1, col=(i % (heads + 1)) % columns + 1
            )
            for trace in _image_with_heat(ex.image, heat, step, visible=b == 0):
                fig.add_trace(trace, **where)
    per_image = 2 * len(order)
    buttons = [
        dict(
            label=ex.name,
            method="update",
            args=[
                {"visible": [b == k // per_image for k in range(B * per_image)]},
                {"title.text": f"{ex.name}: {captions[b]}<br><sup>made from: {made_from}</sup>"},
            ],
        )
        for b, ex in enumerate(examples)
    ]
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    fig.update_layout(
        title=f"{examples[0].name}: {captions[0]}",
        updatemenus=[dict(buttons=buttons, x=1.0, y=1.12)],
        height=260 * rows + 120,
        width=210 * columns + 80,
    )
    save_html(fig, path, made_from)


@calm
def main(argv: list[str] | None = None) -> int:
    p = parser("attention_maps", __doc__, images=True)
    args = p.parse_args(argv)
    loaded = load_from_flags(args)
    model, cfg = loaded.model, loaded.model.cfg
    examples = load_examples(args.images or default_images(cfg), cfg, limit=2 if args.quick else None)
    out = out_dir(args.out)
    with forward_only(args):
        ca = class_attention(model, batch_of(examples, cfg))
    probs = ca.logits.softmax(-1)
    names = class_names(cfg)
    records, captions = [], []
    for b, ex in enumerate(examples):
        k = int(probs[b].argmax())
        truth = f" (true: {names[ex.label]})" if ex.label is not None else ""
        captions.append(f"predicted {names[k]} {100 * probs[b, k]:.1f}%{truth}")
        figure_png(ex, ca.maps[b], ca.self_share[b], captions[-1], loaded.made_from, out / f"attention_{ex.name}.png")
        records.append(
            {
                "image": ex.name,
                "predicted": names[k],
                "probability": probs[b, k].item(),
                "label": ex.label,
                "maps": ca.maps[b].tolist(),
                "self_share": ca.self_share[b].tolist(),
            }
        )
        print(f"{ex.name}: {captions[-1]}")
    figure_html(examples, ca.maps, captions, loaded.made_from, out / "attention_maps.html")
    layers, heads = ca.maps.shape[1:3]
    write_json(
        out / "attention_maps.json",
        {
            "made_from": loaded.made_from,
            "layers": layers,
            "heads": heads,
            "panels": panel_titles(layers, heads),
            "images": records,
        },
    )
    print(
        f"{loaded.made_from}\nwrote {len(examples)} attention_*.png, attention_maps.html/.json "
        f"({layers} CA layers x ({heads} heads + mean)) to {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
