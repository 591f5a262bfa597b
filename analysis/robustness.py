"""When a corruption breaks the prediction, does class attention still point at the object?

Top-1 and CA-1 pointing (the head-mean map's top patch inside the garment's box) against severity, per
ImageNet-C corruption (cait.corruptions), on test scenes for the shipped model; each split by whether the
prediction stayed right. Without labels and boxes (--pretrained: an ImageNet model on the photos), the
prediction is judged by agreement with the clean one, and the map by the share of its mass that stays in the
clean map's region of focus (paper Fig. 7's smallest set of patches holding 50% of the mass; cait.explain).
That share is reported on scenes too: 1.0 would be a map that did not move, the region's own share of the
image is where a map that moved at random would land.

    python analysis/robustness.py                                   # cait_micro_136 on 300 test scenes
    python analysis/robustness.py --model cait_s24_224 --pretrained # official weights on the photos
    python analysis/robustness.py --limit 1000 --corruptions gaussian_noise contrast --severities 1 3 5
    python analysis/robustness.py --data DIR [--boxes boxes.json]   # your images: top-1 where the folders name
                                                                    # classes, pointing where every image has a box

Writes robustness.json/.png/.html. The numbers of `cait.evaluate --corruption` come from the same corrupted
images (the same seed and batches); this script adds the per-image split.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from _common import (
    add_data_flags,
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
from torchvision.transforms.v2.functional import normalize

from cait import explain
from cait.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from cait.explain.maps import regions_of_focus
from cait.factory import load_from_flags
from cait.figures import LinePlot, Series, to_matplotlib, to_plotly
from cait.preprocess import view_pixels

DEFAULT_IMAGES = 300  # without --limit: the first 300 images of the data


def inputs(args: argparse.Namespace, model) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, str]:
    """The clean model views [N, C, H, W] in [0, 1], their labels and boxes (None for photos, for images without
    labels, and unless every image has a box), and what they are."""
    if args.data is None and (model.cfg.is_imagenet or args.images):  # photos, or images given: no labels
        examples = load_examples(args.images or default_images(model.cfg), model.cfg, limit=2 if args.quick else None)
        if not examples:
            fail("no images to corrupt: give --images")
        return torch.stack([view_pixels(e.image) for e in examples]), None, None, f"{len(examples)} photos"
    args.data = args.data or "fashion-mnist-scenes"
    data = read_data(args, model.cfg, limit=8 if args.quick else DEFAULT_IMAGES, normalise=False)
    batches = list(readable_batches(data, len(data), args.skipped))
    if not batches:
        fail(f"no readable image in {data.name}")
    x, labels, boxes = batches[0]
    labels = None if (labels < 0).any() else labels
    boxes = None if boxes.isnan().any() else boxes
    return x, labels, boxes, data.name


def attend(model, x: torch.Tensor, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted class [B] and CA layer 1's head-mean map [B, g, g] (fp32) of views x in [0, 1]."""
    with forward_only(args):
        ca = explain.class_attention(model, normalize(x, model.cfg.mean, model.cfg.std))
    return ca.logits.argmax(-1), ca.mean[:, 0].float()


def per_image(model, x: torch.Tensor, args: argparse.Namespace, name: str | None, severity: int) -> dict:
    """Predictions and CA-1 maps of every image, clean (name None) or corrupted, batch by batch."""
    generator = torch.Generator().manual_seed(args.seed)
    predicted, heat = [], []
    for batch in x.split(args.batch_size):
        if name is not None:
            batch = corrupt(batch, name, severity, generator=generator)
        p, h = attend(model, batch, args)
        predicted.append(p)
        heat.append(h)
    return {"predicted": torch.cat(predicted), "heat": torch.cat(heat)}


def share(values: torch.Tensor, where: torch.Tensor) -> float | None:
    """Mean of `values` over the images `where` is True (None when there are none)."""
    return values[where].float().mean().item() if where.any() else None


def score(run: dict, clean: dict, labels, boxes, img_size: int) -> dict:
    """One corruption and severity: top-1 (labels) or agreement with the clean prediction, CA-1 pointing (boxes)
    and the map's mass kept in the clean region of focus, each split by whether the prediction stayed right."""
    agree = run["predicted"] == clean["predicted"]
    right = agree if labels is None else run["predicted"] == labels
    was_right = torch.ones_like(right) if labels is None else clean["predicted"] == labels
    mask, _ = regions_of_focus(clean["heat"], img_size=img_size)
    mass = run["heat"].clamp_min(0)
    kept = (mass * mask).flatten(1).sum(1) / mass.flatten(1).sum(1).clamp_min(1e-12)
    row = {
        "images": len(agree),
        "agreement": agree.float().mean().item(),
        "stayed_right": (right & was_right).sum().item(),
        "broke": (was_right & ~right).sum().item(),
        "focus_kept": kept.mean().item(),
        "focus_kept_stayed_right": share(kept, right & was_right),
        "focus_kept_broke": share(kept, was_right & ~right),
    }
    if labels is not None:
        row["top1"] = right.float().mean().item()
    if boxes is not None:
        hit = explain.pointing_game(run["heat"], boxes, img_size)
        row.update(
            ca1_pointing=hit.float().mean().item(),
            ca1_pointing_stayed_right=share(hit, right & was_right),
            ca1_pointing_broke=share(hit, was_right & ~right),
        )
    return row


def figure(result: dict) -> LinePlot:
    """Panel 1: top-1 (or agreement) per corruption; panel 2: CA-1 pointing (or focus kept) per corruption;
    panel 3: the same map score averaged over corruptions, where the prediction stayed right vs where it broke."""
    rows, clean = result["rows"], result["clean"]
    pred_key = "top1" if "top1" in clean else "agreement"
    map_key = "ca1_pointing" if "ca1_pointing" in clean else "focus_kept"
    series = []
    for name in dict.fromkeys(r["corruption"] for r in rows):
        mine = [r for r in rows if r["corruption"] == name]
        x = [0] + [r["severity"] for r in mine]
        for panel, key in ((0, pred_key), (1, map_key)):
            series.append(Series(name, x, [clean[key]] + [r[key] for r in mine], panel=panel, legend=panel == 0))
    by_severity: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for split in ("stayed_right", "broke"):
            if r[f"{map_key}_{split}"] is not None:
                by_severity[r["severity"]][split].append(r[f"{map_key}_{split}"])
    for split, colour, dash in (("stayed_right", "#2a7", "solid"), ("broke", "#c33", "dash")):
        xs = [s for s in sorted(by_severity) if by_severity[s][split]]
        ys = [sum(by_severity[s][split]) / len(by_severity[s][split]) for s in xs]
        series.append(Series(f"prediction {split.replace('_', ' ')}", xs, ys, panel=2, colour=colour, dash=dash))
    pred_label = "top-1" if pred_key == "top1" else "agreement with the clean prediction"
    map_label = "CA-1 pointing" if map_key == "ca1_pointing" else "CA-1 mass in the clean region of focus"
    return LinePlot(
        title=f"Under corruption ({result['images']}): {pred_label} and where class attention points",
        panels=[pred_label, map_label, f"{map_label}, mean over corruptions"],
        x_label="severity (0 = clean)",
        y_label="share of images",
        series=series,
        x_ticks=([0, *SEVERITIES], ["clean", *map(str, SEVERITIES)]),
    )


@calm
def main(argv: list[str] | None = None) -> int:
    p = parser("robustness", __doc__, images=True)
    add_data_flags(
        p, default=f"fashion-mnist-scenes (the first {DEFAULT_IMAGES}), real photos for an ImageNet model or --images"
    )
    p.add_argument("--corruptions", nargs="+", default=list(CORRUPTIONS), choices=list(CORRUPTIONS))
    p.add_argument("--severities", nargs="+", type=int, default=list(SEVERITIES), choices=list(SEVERITIES))
    p.add_argument("--seed", type=int, default=0, help="seed of the corruptions' random draws")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--replot", action="store_true", help="redraw the figures from --out's robustness.json")
    args = p.parse_args(argv)
    if args.batch_size <= 0:
        fail("--batch-size must be positive")
    if args.data is not None and args.images:
        fail("give --data or --images, not both")
    if args.replot:
        try:
            result = json.loads((args.out / "robustness.json").read_text())
        except (OSError, ValueError) as e:
            fail(f"nothing to redraw in {args.out}: {e}")
        draw(result, args.out)
        return 0
    loaded = load_from_flags(args)
    model = loaded.model.eval()
    names, severities = args.corruptions, args.severities
    if args.quick:
        names, severities = names[:2], [1, 5]
    args.skipped = []
    x, labels, boxes, what = inputs(args, model)
    img_size = model.cfg.img_size
    clean = per_image(model, x, args, None, 0)
    rows = []
    for name in names:
        for severity in severities:
            run = per_image(model, x, args, name, severity)
            rows.append({"corruption": name, "severity": severity, **score(run, clean, labels, boxes, img_size)})
            print(name, severity, {k: round(v, 3) for k, v in rows[-1].items() if isinstance(v, float)})
    result = {
        "made_from": loaded.made_from if args.data is None else made_from_data(loaded.made_from, what),
        "images": what if args.data is None else f"{len(x)} images of {what}",
        "data": what if args.data is not None else None,
        "skipped": args.skipped,
        "seed": args.seed,
        "precision": args.precision,
        "clean": score(clean, clean, labels, boxes, img_size),
        "rows": rows,
    }
    out = out_dir(args.out)
    write_json(out / "robustness.json", result)
    draw(result, out)
    return 0


def draw(result: dict, out: Path) -> None:
    """robustness.png (small enough to keep beside its JSON) and the interactive robustness.html."""
    plot = figure(result)
    save_png(to_matplotlib(plot, width=15, height=4.6), out / "robustness.png", result["made_from"], dpi=75)
    save_html(to_plotly(plot), out / "robustness.html", result["made_from"])
    print(f"wrote robustness.json/.png/.html to {out}")


if __name__ == "__main__":
    raise SystemExit(main())
