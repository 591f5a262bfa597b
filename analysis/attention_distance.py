"""Mean attention distance against depth (the ViT paper's Fig. 7 right, for CaiT): for each self-attention
layer, how far in input pixels each head looks, from the weights after talking heads' proj_w (what multiplies
the values), averaged over many images; the head mean with the band from the nearest- to the farthest-looking
head, and the distance uniform attention would give.

    python analysis/attention_distance.py [--checkpoint FILE] [--images a.png b.png ...] [--out DIR]
    python analysis/attention_distance.py --model cait_s24_224 --pretrained     # the official ImageNet weights
    python analysis/attention_distance.py --data DIR [--limit N]                # over a folder of your images

Default images: the example scenes shipped in cait/examples; for an ImageNet model, real photos (cait.data.photos).
Writes attention_distance.png/.html (the same figure) and attention_distance.json (per layer and head, the
mean over images and its spread).
"""

from __future__ import annotations

from typing import Iterator

import torch
from _common import (
    add_data_flags,
    batch_of,
    calm,
    default_images,
    fail,
    forward_only,
    load_examples,
    made_from_data,
    out_dir,
    parser,
    read_data,
    readable_batches,
    save_html,
    save_png,
    write_json,
)

from cait.explain.head_stats import mean_attention_distances, uniform_attention_distance
from cait.factory import load_from_flags
from cait.figures import distance_plot, to_matplotlib, to_plotly

BATCH = 8  # images per forward pass: the per-layer maps of a batch are what takes memory


def distances(model, batches, args) -> torch.Tensor:
    """[images, SA layers, heads] mean attention distance in pixels of normalised batches (the atlas's per-head
    number, `cait.explain.head_stats.mean_attention_distances`)."""
    out = []
    for x in batches:
        with forward_only(args):
            out.append(mean_attention_distances(model, x).float())
    return torch.cat(out) if out else torch.empty(0)


def image_batches(model, args, skipped: list[str]) -> tuple[Iterator[torch.Tensor], list[str] | str]:
    """Batches of BATCH normalised images and what they are: the images of --data (`cait.data.read_images`,
    its name; unreadable ones added to `skipped`), else --images or the default examples (their names)."""
    cfg = model.cfg
    if args.data is not None:
        data = read_data(args, cfg, limit=2 if args.quick else None)
        return (x for x, _, _ in readable_batches(data, BATCH, skipped)), data.name
    examples = load_examples(args.images or default_images(cfg), cfg, limit=2 if args.quick else None)
    batches = (batch_of(examples[i : i + BATCH], cfg) for i in range(0, len(examples), BATCH))
    return batches, [e.name for e in examples]


@calm
def main(argv: list[str] | None = None) -> int:
    p = parser("attention_distance", __doc__, images=True)
    add_data_flags(p, default="--images, or the shipped example scenes (real photos for an ImageNet model)")
    args = p.parse_args(argv)
    if args.data is not None and args.images:
        fail("give --data or --images, not both")
    loaded = load_from_flags(args)
    model, cfg = loaded.model, loaded.model.cfg
    out = out_dir(args.out)
    skipped: list[str] = []
    batches, images = image_batches(model, args, skipped)
    each = distances(model, batches, args)  # [images, layers, heads]
    if not len(each):
        fail("no readable image to measure")
    per_head = each.mean(0)
    uniform = uniform_attention_distance(cfg.grid_size, cfg.patch_size)
    made_from = loaded.made_from if isinstance(images, list) else made_from_data(loaded.made_from, images)
    figure = distance_plot(per_head, uniform, images=len(each))
    save_png(to_matplotlib(figure), out / "attention_distance.png", made_from)
    save_html(to_plotly(figure), out / "attention_distance.html", made_from)
    write_json(
        out / "attention_distance.json",
        {
            "made_from": made_from,
            "data": None if isinstance(images, list) else images,
            "images": images if isinstance(images, list) else len(each),
            "skipped": skipped,
            "precision": args.precision,
            "patch_size": cfg.patch_size,
            "grid_size": cfg.grid_size,
            "uniform_attention_px": uniform,
            "layout": "[sa_layer][head], 0-based; pixels of the model input; weights after proj_w in absolute "
            "value, renormalised per query patch (cait.explain.head_stats.mean_attention_distance)",
            "mean_distance": per_head.tolist(),
            "std_over_images": each.std(0, unbiased=False).tolist(),
        },
    )
    print(f"{made_from}\n{'SA layer':<10}{'head mean':>10}{'nearest':>10}{'farthest':>10}  (pixels)")
    for layer, row in enumerate(per_head):
        print(f"{layer + 1:<10}{row.mean():>10.1f}{row.min():>10.1f}{row.max():>10.1f}")
    print(f"uniform attention: {uniform:.1f} px\nwrote attention_distance.png/.html/.json to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
