"""Mean attention distance against depth (the ViT paper's Fig. 7 right, for CaiT): for each self-attention
layer, how far in input pixels each head looks, from the weights after talking heads' proj_w (what multiplies
the values), averaged over many images; the head mean with the band from the nearest- to the farthest-looking
head, and the distance uniform attention would give.

    python analysis/attention_distance.py [--checkpoint FILE] [--images a.png b.png ...] [--out DIR]
    python analysis/attention_distance.py --model cait_s24_224 --pretrained     # the official ImageNet weights

Default images: the example scenes shipped in cait/examples; for an ImageNet model, real photos (cait.data.photos).
Writes attention_distance.png/.html (the same figure) and attention_distance.json (per layer and head, the
mean over images and its spread).
"""

from __future__ import annotations

import torch
from _common import (
    batch_of,
    default_images,
    forward_only,
    load_examples,
    load_model,
    out_dir,
    parser,
    save_html,
    save_png,
    write_json,
)

from cait.explain import mean_attention_distances, uniform_attention_distance
from cait.figures import distance_plot, to_matplotlib, to_plotly

BATCH = 8  # images per forward pass: the per-layer maps of a batch are what takes memory


def distances(model, examples, args) -> torch.Tensor:
    """[images, SA layers, heads] mean attention distance in pixels, in batches of BATCH images."""
    out = []
    for start in range(0, len(examples), BATCH):
        x = batch_of(examples[start : start + BATCH], model.cfg)
        with forward_only(args):
            out.append(mean_attention_distances(model, x).float())
    return torch.cat(out)


def main(argv: list[str] | None = None) -> int:
    p = parser("attention_distance", __doc__, images=True)
    args = p.parse_args(argv)
    loaded = load_model(args)
    model, cfg = loaded.model, loaded.model.cfg
    examples = load_examples(args.images or default_images(cfg), cfg, limit=2 if args.quick else None)
    out = out_dir(args.out)
    each = distances(model, examples, args)  # [images, layers, heads]
    per_head = each.mean(0)
    uniform = uniform_attention_distance(cfg.grid_size, cfg.patch_size)
    figure = distance_plot(per_head, uniform, images=len(examples))
    save_png(to_matplotlib(figure), out / "attention_distance.png", loaded.made_from)
    save_html(to_plotly(figure), out / "attention_distance.html", loaded.made_from)
    write_json(
        out / "attention_distance.json",
        {
            "made_from": loaded.made_from,
            "images": [e.name for e in examples],
            "precision": args.precision,
            "patch_size": cfg.patch_size,
            "grid_size": cfg.grid_size,
            "uniform_attention_px": uniform,
            "layout": "[sa_layer][head], 0-based; pixels of the model input; weights after proj_w in absolute "
            "value, renormalised per query patch (cait.explain.mean_attention_distance)",
            "mean_distance": per_head.tolist(),
            "std_over_images": each.std(0, unbiased=False).tolist(),
        },
    )
    print(f"{loaded.made_from}\n{'SA layer':<10}{'head mean':>10}{'nearest':>10}{'farthest':>10}  (pixels)")
    for layer, row in enumerate(per_head):
        print(f"{layer + 1:<10}{row.mean():>10.1f}{row.min():>10.1f}{row.max():>10.1f}")
    print(f"uniform attention: {uniform:.1f} px\nwrote attention_distance.png/.html/.json to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
