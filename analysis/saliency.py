"""Regions of focus (the paper's Figure 7) and, where boxes exist, the localization of every explanation.

    python analysis/saliency.py [--checkpoint FILE] [--images a.png ...] [--out DIR]
    python analysis/saliency.py --model cait_s24_224 --pretrained    # official weights, on real photos
    python analysis/saliency.py --data DIR --boxes boxes.json [--limit N]   # localization over your images

Regions of focus: the smallest set of patches holding half of the first class-attention layer's mass
(head mean, `cait.explain.maps.regions_of_focus`), shown bright with its bounding box, captioned with the
predicted class and its probability. On images with a known garment box (the shipped example scenes
list theirs in cait/examples/examples.json) the same run scores every method of cait.explain.METHODS
with `cait.evaluate.evaluate` (pointing game and mass in box, true class as target) and writes the table.
Few images means a noisy table: for a real measurement run `python -m cait.evaluate` on the test split.

With --data (cait.data.read_images) the regions are drawn for its first 12 images and the localization is
scored over all of its images with a box (--boxes; the scenes have theirs), the figures naming the data.

Writes regions_of_focus.png/.html/.json and, with boxes, localization.csv/.json/.png/.html.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from _common import (
    Example,
    add_data_flags,
    batch_of,
    calm,
    default_images,
    fail,
    forward_only,
    inference_dtype_of,
    load_examples,
    made_from_data,
    matplotlib_pyplot,
    out_dir,
    parser,
    read_data,
    save_html,
    save_png,
    write_csv,
    write_json,
)
from PIL import Image

from cait import explain
from cait.data import ImagesWithBoxes
from cait.evaluate import CHEAP_METHODS, evaluate
from cait.explain.maps import DEFAULT_SHARE, regions_of_focus
from cait.factory import load_from_flags
from cait.preprocess import class_names

BATCH = 64  # images per batch of the localization run
REGIONS = 12  # images in the regions-of-focus figure when the images come from --data


def boxed_examples(examples: list[Example], cfg) -> ImagesWithBoxes:
    """The examples with a box and a label as a dataset with boxes for cait.evaluate; the images are
    already the model's view, so the boxes are in model-input pixels (canvas = img_size)."""
    kept = [e for e in examples if e.box is not None and e.label is not None]
    boxes = np.stack([e.box.numpy() for e in kept]) if kept else np.zeros((0, 4))
    return ImagesWithBoxes(
        [e.image for e in kept], [e.label for e in kept], boxes, canvas=cfg.img_size, classes=class_names(cfg)
    )


def regions_png(examples, masks, boxes, captions, made_from, path) -> None:
    plt = matplotlib_pyplot()
    from matplotlib.patches import Rectangle

    cols = min(6, len(examples))
    rows = -(-len(examples) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.3 * cols, 2.6 * rows + 0.8), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, ex, mask, box, caption in zip(axes.flat, examples, masks, boxes, captions):
        ax.imshow(_dim_outside(ex.image, mask))
        x0, y0, x1, y1 = box.tolist()
        ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False, ec="yellow", lw=1.5))
        if ex.box is not None:
            gx0, gy0, gx1, gy1 = ex.box.tolist()
            ax.add_patch(Rectangle((gx0 - 0.5, gy0 - 0.5), gx1 - gx0, gy1 - gy0, fill=False, ec="cyan", lw=1, ls="--"))
        ax.set_title(caption, fontsize=8)
    fig.suptitle(
        f"Regions of focus of CA layer 1 (head mean, {int(100 * DEFAULT_SHARE)}% of the mass; "
        f"yellow: its box, cyan dashed: garment box)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save_png(fig, path, made_from)


def _dim_outside(image, mask: torch.Tensor) -> np.ndarray:
    """The image with the patches outside the region darkened to a third."""
    arr = np.asarray(image, dtype=np.float32) / 255
    # nearest, not explain.maps.upsample: a region is a set of whole patches, not a smooth map
    keep = F.interpolate(mask.float()[None, None], size=arr.shape[:2], mode="nearest")[0, 0].numpy() > 0.5
    return np.where(keep[..., None], arr, arr / 3)


def regions_html(examples, masks, boxes, captions, made_from, path) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    cols = min(6, len(examples))
    rows = -(-len(examples) // cols)
    fig = make_subplots(rows, cols, subplot_titles=captions, horizontal_spacing=0.01, vertical_spacing=0.06)
    for i, (ex, mask, box) in enumerate(zip(examples, masks, boxes)):
        r, c = i // cols + 1, i % cols + 1
        fig.add_trace(go.Image(z=(_dim_outside(ex.image, mask) * 255).astype(np.uint8), name=ex.name), row=r, col=c)
        x0, y0, x1, y1 = box.tolist()
        fig.add_shape(
            type="rect", x0=x0 - 0.5, y0=y0 - 0.5, x1=x1 - 0.5, y1=y1 - 0.5, line=dict(color="yellow"), row=r, col=c
        )
        if ex.box is not None:
            gx0, gy0, gx1, gy1 = ex.box.tolist()
            fig.add_shape(
                type="rect",
                x0=gx0 - 0.5,
                y0=gy0 - 0.5,
                x1=gx1 - 0.5,
                y1=gy1 - 0.5,
                line=dict(color="cyan", dash="dash"),
                row=r,
                col=c,
            )
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False)
    fig.update_annotations(font_size=10)
    fig.update_layout(
        title="Regions of focus, CA layer 1 (yellow: region box, cyan dashed: garment box)",
        height=260 * rows + 140,
        width=220 * cols + 60,
    )
    save_html(fig, path, made_from)


def localization_figures(table: list[dict], made_from: str, out) -> None:
    rows = sorted(table, key=lambda r: -r["pointing_game"])
    names = [f"{r['method']} (n={r['images']})" for r in rows]
    plt = matplotlib_pyplot()
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(rows) + 1.8))
    y = np.arange(len(rows))
    ax.barh(y - 0.2, [100 * r["pointing_game"] for r in rows], 0.4, label="pointing game %")
    ax.barh(y + 0.2, [100 * r["mass_in_box"] for r in rows], 0.4, label="mass in box %")
    ax.set_yticks(y, names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("% of images (pointing game) / % of map mass (in the garment box)")
    ax.set_title("Localization of each explanation against the garment box (true class)")
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save_png(fig, out / "localization.png", made_from)

    import plotly.graph_objects as go

    figp = go.Figure()
    figp.add_bar(y=names, x=[100 * r["pointing_game"] for r in rows], orientation="h", name="pointing game %")
    figp.add_bar(y=names, x=[100 * r["mass_in_box"] for r in rows], orientation="h", name="mass in box %")
    figp.update_yaxes(autorange="reversed")
    figp.update_layout(
        title="Localization of each explanation against the garment box", barmode="group", height=22 * len(rows) + 220
    )
    save_html(figp, out / "localization.html", made_from)


def write_regions(loaded, examples: list[Example], args, out, *, made_from: str) -> None:
    """The paper's Fig. 7 regions (first CA layer, head mean) as PNG, HTML and JSON."""
    model, cfg = loaded.model, loaded.model.cfg
    with forward_only(args):
        ca = explain.class_attention(model, batch_of(examples, cfg))
    masks, boxes = regions_of_focus(ca.mean[:, 0], img_size=cfg.img_size)
    probs = ca.logits.softmax(-1)
    names = class_names(cfg)
    top = probs.argmax(-1)
    captions = [f"{names[k]} {100 * probs[b, k]:.0f}%" for b, k in enumerate(top.tolist())]
    regions_png(examples, masks, boxes, captions, made_from, out / "regions_of_focus.png")
    regions_html(examples, masks, boxes, captions, made_from, out / "regions_of_focus.html")
    images = [
        {
            "image": e.name,
            "predicted": names[k],
            "probability": probs[b, k].item(),
            "patches": int(masks[b].sum()),
            "region_box": boxes[b].tolist(),
            "mask": masks[b].tolist(),
        }
        for b, (e, k) in enumerate(zip(examples, top.tolist()))
    ]
    write_json(
        out / "regions_of_focus.json",
        {"made_from": made_from, "share": DEFAULT_SHARE, "images": images},
    )
    for e, caption, m in zip(examples, captions, masks):
        print(f"{e.name}: {caption}, region of {int(m.sum())}/{m.numel()} patches")


def write_localization(loaded, boxed, args, out, *, made_from: str) -> None:
    """Pointing game and mass in box of every method on the images with boxes of `boxed` (an ImageSet or a
    dataset with boxes; `made_from` says which, and which model), as CSV, JSON and figures."""
    methods = tuple(args.methods) if args.methods else (CHEAP_METHODS if args.quick else None)
    result = evaluate(
        loaded.model,
        boxed,
        batch_size=BATCH,
        workers=0,
        methods=methods,
        attribution_subset=len(boxed),
        dtype=inference_dtype_of(args),
    )
    write_csv(out / "localization.csv", result["localization"])
    write_json(out / "localization.json", {"made_from": made_from, **result})
    localization_figures(result["localization"], made_from, out)
    top1 = "-" if result["top1"] is None else f"{100 * result['top1']:.0f}%"
    print(f"localization on {result['images']} images (top-1 {top1}):")
    for r in sorted(result["localization"], key=lambda r: -r["pointing_game"]):
        print(
            f"  {r['method']:<26}pointing {100 * r['pointing_game']:5.1f}%  mass in box {100 * r['mass_in_box']:5.1f}%"
        )


def data_examples(data, n: int) -> list[Example]:
    """The first `n` readable images of an ImageSet read in pixels (`normalise=False`), as the regions figure's
    examples: the model's view, the label (None when unknown) and the box (None without one)."""
    examples = []
    for i in range(len(data)):
        x, label, box, _, ok = data[i]
        if ok:
            pixels = (x * 255).round().byte().permute(1, 2, 0).numpy()
            image = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).convert("RGB")
            name = data.paths[i].rsplit(".", 1)[0].replace("/", "_")
            examples.append(Example(name, image, label if label >= 0 else None, None if box.isnan().any() else box))
        if len(examples) == n:
            break
    return examples


@calm
def main(argv: list[str] | None = None) -> int:
    p = parser("saliency", __doc__, images=True)
    p.add_argument(
        "--methods",
        nargs="*",
        default=None,
        help=f"explanations to score (default: all; --quick: {', '.join(CHEAP_METHODS)})",
    )
    add_data_flags(p, default="--images, or the shipped example scenes (real photos for an ImageNet model)")
    args = p.parse_args(argv)
    unknown = {m for m in args.methods or () if m not in explain.METHODS}
    if unknown:
        p.error(f"unknown method(s) {sorted(unknown)}; choose from {', '.join(explain.METHODS)}")
    if args.data is not None and args.images:
        p.error("give --data or --images, not both")
    loaded = load_from_flags(args)
    cfg = loaded.model.cfg
    out = out_dir(args.out)
    if args.data is not None:
        data = read_data(args, cfg, limit=8 if args.quick else None, normalise=False)
        examples, boxed, made_from = data_examples(data, REGIONS), data, made_from_data(loaded.made_from, data.name)
        if not examples:
            fail(f"no readable image in {data.name}")
    else:
        examples = load_examples(args.images or default_images(cfg), cfg, limit=4 if args.quick else None)
        boxed = boxed_examples(examples, cfg)
        made_from = f"{loaded.made_from}; {len(boxed)} example images with boxes"
    write_regions(loaded, examples, args, out, made_from=made_from if args.data else loaded.made_from)
    written = "regions_of_focus.png/.html/.json"
    if len(boxed) and getattr(boxed, "boxes", None) is not None:
        write_localization(loaded, boxed, args, out, made_from=made_from)
        written += ", localization.csv/.json/.png/.html"
    print(f"{loaded.made_from}\nwrote {written} to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
