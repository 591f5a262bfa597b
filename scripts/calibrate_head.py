"""Choose a trained CaiT's head bias for the weakest class on held-out scenes (`cait.train.calibration`), check it on
other scenes, and write the calibrated weights with a JSON report of every number.

    python scripts/calibrate_head.py runs/s14_micro128c/last.safetensors \\
        --img-size 136 --fit-seed 1 --check-seeds 0 2 --out calibrated.safetensors --json calibration.json

--fit-seed draws the held-out scenes the bias is chosen on (the test garments on other canvases); each
--check-seeds draw is scored before and after (0 = the test scenes every reported number uses).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import cait
from cait.checkpoint import save_weights
from cait.data import build_dataset
from cait.metrics import as_dict, lowest_class, per_class_top1, top1
from cait.train.calibration import apply_class_bias, collect_logits, fit_weakest_class_bias, shifted


def scores(logits: torch.Tensor, labels: torch.Tensor, names: tuple[str, ...]) -> dict:
    predicted = logits.argmax(1)
    per_class = per_class_top1(predicted, labels, len(names))
    return {
        "top1": top1(predicted, labels),
        "per_class_top1": as_dict(per_class, list(names)),
        "lowest": lowest_class(per_class)[1],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="our safetensors file of a CaiT")
    p.add_argument("--img-size", type=int, default=None, help="input size it is scored and shipped at")
    p.add_argument("--data", default="fashion-mnist-scenes")
    p.add_argument("--fit-seed", type=int, default=1, help="scene seed of the held-out scenes the bias is fitted on")
    p.add_argument("--fit-subset", type=int, default=5000, help="how many of them")
    p.add_argument("--check-seeds", type=int, nargs="*", default=[0], help="scene seeds scored before and after")
    p.add_argument("--check-subset", type=int, default=None, help="images per check (default: all 10k)")
    p.add_argument("--out", type=Path, required=True, help="where the calibrated weights go (safetensors)")
    p.add_argument("--json", type=Path, required=True, help="where the report goes")
    args = p.parse_args()
    torch.manual_seed(0)
    try:
        loaded = cait.load_model(checkpoint=args.checkpoint, **({"img_size": args.img_size} if args.img_size else {}))
    except cait.InputError as e:  # a file that cannot work: one line, exit 2
        p.error(str(e))
    model = loaded.model
    names = model.cfg.labels
    held_out = build_dataset(args.data, "val", seed=args.fit_seed, subset=args.fit_subset, cache=True)
    choice = fit_weakest_class_bias(*collect_logits(model, held_out))
    report = {
        "checkpoint": args.checkpoint,
        "img_size": model.cfg.img_size,
        "class": names[choice.index],
        "fit": {"scene_seed": args.fit_seed, **choice.to_dict()},
        "checks": [],
    }
    print(
        f"{names[choice.index]} + {choice.bias:g} on {choice.images} scenes of seed {args.fit_seed}: "
        f"lowest class {100 * lowest_class(choice.per_class_before)[1]:.1f} -> "
        f"{100 * lowest_class(choice.per_class_after)[1]:.1f}%, "
        f"top-1 {100 * choice.top1_before:.2f} -> {100 * choice.top1_after:.2f}%"
    )
    for seed in args.check_seeds:
        logits, labels = collect_logits(
            model, build_dataset(args.data, "val", seed=seed, subset=args.check_subset, cache=True)
        )
        before, after = scores(logits, labels, names), scores(shifted(logits, choice.index, choice.bias), labels, names)
        report["checks"].append({"scene_seed": seed, "images": len(labels), "before": before, "after": after})
        print(
            f"check, scene seed {seed} ({len(labels)} scenes): top-1 {100 * before['top1']:.2f} -> "
            f"{100 * after['top1']:.2f}%, lowest class {100 * before['lowest']:.1f} -> {100 * after['lowest']:.1f}%"
        )
    apply_class_bias(model, choice)
    save_weights(model, args.out)
    args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
