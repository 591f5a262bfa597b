"""Class-attention maps (the paper's Figure 6): for each image, one row per class-attention layer and
one column per head plus the head mean, overlaid on the image, with the prediction in the title.

    python analysis/attention_maps.py [--checkpoint FILE] [--images a.png b.png ...] [--out DIR]
    python analysis/attention_maps.py --model cait_s24_224 --pretrained     # the official ImageNet weights

Default images: the example scenes shipped in cait/examples; for an ImageNet model, real photos
(cait.photos: scikit-image's and gradio's sample photos, licences listed there). Writes attention_<image>.png per image,
attention_maps.html (all images, pick one from the menu; hover shows the attention values) and
attention_maps.json (the maps, the class token's attention to itself, the prediction).
"""
from __future__ import annotations

import numpy as np
import torch

from _common import (Example, batch_of, default_images, load_examples, load_model, matplotlib_pyplot, out_dir, parser,
                     save_html, save_png, write_json)
from cait.explain import class_attention, overlay
from cait.preprocess import class_names


def panel_titles(layers: int, heads: int) -> list[list[str]]:
    return [[f"CA{l + 1} head {h}" for h in range(heads)] + [f"CA{l + 1} mean"] for l in range(layers)]


def figure_png(ex: Example, maps: torch.Tensor, self_share: torch.Tensor, caption: str, made_from: str, path) -> None:
    """maps [L, heads, g, g]; self_share [L, heads]."""
    plt = matplotlib_pyplot()
    layers, heads = maps.shape[:2]
    titles = panel_titles(layers, heads)
    fig, axes = plt.subplots(layers, heads + 1, figsize=(2.1 * (heads + 1), 2.3 * layers + 0.9), squeeze=False)
    for l in range(layers):
        for c in range(heads + 1):
            heat = maps[l, c] if c < heads else maps[l].mean(0)
            share = self_share[l, c] if c < heads else self_share[l].mean()
            ax = axes[l, c]
            ax.imshow(overlay(ex.image, heat))
            ax.set_title(f"{titles[l][c]}\ncls->cls {share:.2f}", fontsize=8)
            ax.axis("off")
    fig.suptitle(f"{ex.name}: {caption}", fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save_png(fig, path, made_from)


def figure_html(examples: list[Example], maps: torch.Tensor, captions: list[str], made_from: str, path) -> None:
    """One subplot per (layer, head|mean); the menu switches images. maps [B, L, heads, g, g]."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    B, layers, heads, g, _ = maps.shape
    titles = [t for row in panel_titles(layers, heads) for t in row]
    fig = make_subplots(layers, heads + 1, subplot_titles=titles, horizontal_spacing=0.02, vertical_spacing=0.08)
    side = examples[0].image.width
    step = side / g
    per_image = []
    for b, ex in enumerate(examples):
        traces = 0
        for l in range(layers):
            for c in range(heads + 1):
                heat = (maps[b, l, c] if c < heads else maps[b, l].mean(0)).numpy()
                fig.add_trace(go.Image(z=np.asarray(ex.image), visible=b == 0, hoverinfo="skip"), row=l + 1, col=c + 1)
                fig.add_trace(go.Heatmap(z=heat, x0=step / 2, dx=step, y0=step / 2, dy=step, colorscale="Inferno",
                                         opacity=0.55, showscale=False, visible=b == 0,
                                         hovertemplate="attention %{z:.4f}<extra></extra>"), row=l + 1, col=c + 1)
                traces += 2
        per_image.append(traces)
    total = sum(per_image)
    buttons = []
    for b, ex in enumerate(examples):
        visible = [False] * total
        start = sum(per_image[:b])
        visible[start:start + per_image[b]] = [True] * per_image[b]
        buttons.append(dict(label=ex.name, method="update",
                            args=[{"visible": visible}, {"title.text": f"{ex.name}: {captions[b]}<br><sup>made from: "
                                                                       f"{made_from}</sup>"}]))
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    fig.update_layout(title=f"{examples[0].name}: {captions[0]}", updatemenus=[dict(buttons=buttons, x=1.0, y=1.12)],
                      height=260 * layers + 120, width=210 * (heads + 1) + 80)
    save_html(fig, path, made_from)


def main(argv: list[str] | None = None) -> int:
    p = parser("attention_maps", __doc__)
    p.add_argument("--images", nargs="+", default=None, help="image files (default: the shipped example scenes; "
                   "for an ImageNet model real photos, see cait.photos)")
    args = p.parse_args(argv)
    loaded = load_model(args)
    model, cfg = loaded.model, loaded.model.cfg
    examples = load_examples(args.images or default_images(cfg), cfg, limit=2 if args.quick else None)
    out = out_dir(args.out)
    ca = class_attention(model, batch_of(examples, cfg))
    probs = ca.logits.softmax(-1)
    names = class_names(cfg)
    records, captions = [], []
    for b, ex in enumerate(examples):
        k = int(probs[b].argmax())
        truth = f" (true: {names[ex.label]})" if ex.label is not None else ""
        captions.append(f"predicted {names[k]} {100 * probs[b, k]:.1f}%{truth}")
        figure_png(ex, ca.maps[b], ca.self_share[b], captions[-1], loaded.made_from, out / f"attention_{ex.name}.png")
        records.append({"image": ex.name, "predicted": names[k], "probability": probs[b, k].item(),
                        "label": ex.label, "maps": ca.maps[b].tolist(), "self_share": ca.self_share[b].tolist()})
        print(f"{ex.name}: {captions[-1]}")
    figure_html(examples, ca.maps, captions, loaded.made_from, out / "attention_maps.html")
    layers, heads = ca.maps.shape[1:3]
    write_json(out / "attention_maps.json", {"made_from": loaded.made_from, "layers": layers, "heads": heads,
                                             "panels": panel_titles(layers, heads), "images": records})
    print(f"{loaded.made_from}\nwrote {len(examples)} attention_*.png, attention_maps.html/.json "
          f"({layers} CA layers x ({heads} heads + mean)) to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
