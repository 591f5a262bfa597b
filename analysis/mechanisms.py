"""Where along depth the answer forms, and what carries it: CaiT's logit lens (its own class-attention
stage reading the patch tokens after each SA block) and activation patching between each test scene and the
same scene under an ImageNet-C corruption (`cait.corruptions`), for the clean run's predicted class.

    python analysis/mechanisms.py [--scenes 200] [--corruption gaussian_noise] [--severity 3] [--out DIR]
    python analysis/mechanisms.py --model cait_s24_224 --pretrained --images photo.jpg   # photos

The verdict is computed from the numbers: the SA depth from which the lens's top-1 agrees with the final
prediction for most images, and the components whose clean output, patched alone into the corrupted run,
restores most of the clean-corrupted gap (the mean restored logit over the mean gap). Intervals are 95%
percentile bootstraps over images.

Writes mechanisms.json/.png/.html. Always fp32 (patching subtracts logits): --precision is not used.
"""

from __future__ import annotations

import argparse
import textwrap

import numpy as np
import torch
from _common import calm, default_images, fail, load_examples, out_dir, parser, save_html, save_png, write_json
from torch.utils.data import default_collate
from tqdm import tqdm

from cait import explain
from cait.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from cait.figures import LinePlot, Series, to_matplotlib, to_plotly
from cait.flags import load_from_flags
from cait.preprocess import normalise, view_pixels

BATCH = 25
QUICK_IMAGES = 8
MOST = 0.5  # "most images": the lens's top-1 agrees with the final prediction for more than this share


def views(model, args: argparse.Namespace) -> tuple[torch.Tensor, str]:
    """The clean model views [N, C, H, W] in [0, 1] and what they are: test scenes, or photos."""
    if model.cfg.is_imagenet or args.images:
        examples = load_examples(args.images or default_images(model.cfg), model.cfg, limit=2 if args.quick else None)
        if not examples:
            fail("no images: give --images")
        return torch.stack([view_pixels(e.image) for e in examples]), f"{len(examples)} photos"
    from cait.data import read_images

    n = QUICK_IMAGES if args.quick else args.scenes
    data = read_images("fashion-mnist-scenes", model.cfg, limit=n, normalise=False)
    return default_collate([data[i] for i in range(len(data))])[0], f"the first {n} test scenes"


@torch.no_grad()
def measure(model, x: torch.Tensor, args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """Per image: the lens's logits [n, D + 1, K], the final prediction, and the patching (of the predicted
    class's logit): streams [n, blocks], branches [n, blocks, 2], CA heads [n, L, H], the gap [n]."""
    generator = torch.Generator().manual_seed(args.seed)
    out: dict[str, list[torch.Tensor]] = {k: [] for k in ("lens", "target", "blocks", "branches", "heads", "gap")}
    for batch in tqdm(x.split(BATCH), desc="lens and patching", unit="batch"):
        broken = corrupt(batch, args.corruption, args.severity, generator=generator)
        clean, corrupted = normalise(batch, model.cfg), normalise(broken, model.cfg)
        lens = explain.logit_lens(model, clean)
        target = lens[:, -1].argmax(-1)
        by_block = explain.activation_patching(model, clean, corrupted, target)
        by_head = explain.activation_patching(model, clean, corrupted, target, granularity="head")
        for key, value in (
            ("lens", lens),
            ("target", target),
            ("blocks", by_block.blocks),
            ("branches", by_block.branches),
            ("heads", by_head.heads),
            ("gap", by_block.gap),
        ):
            out[key].append(value)
    return {k: torch.cat(v) for k, v in out.items()}


def bootstrap(values: np.ndarray, statistic, *, resamples: int, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of `statistic` (a function of rows) over images resampled with replacement."""
    rng = np.random.default_rng(seed)
    stats = [statistic(values[rng.integers(0, len(values), len(values))]) for _ in range(resamples)]
    low, high = np.nanpercentile(stats, [2.5, 97.5])
    return float(low), float(high)


def lens_rows(lens: torch.Tensor, target: torch.Tensor, resamples: int) -> list[dict]:
    """Per SA depth: the share of images whose lens top-1 is the final prediction, and the mean lens
    probability of that class, each with its interval."""
    agree = (lens.argmax(-1) == target[:, None]).float().numpy()  # [n, D + 1]
    prob = lens.softmax(-1).gather(2, target[:, None, None].expand(-1, lens.shape[1], 1))[..., 0].numpy()
    return [
        {
            "sa_depth": k,
            "top1_agreement": float(agree[:, k].mean()),
            "top1_agreement_ci95": bootstrap(agree[:, k], np.mean, resamples=resamples),
            "probability": float(prob[:, k].mean()),
            "probability_ci95": bootstrap(prob[:, k], np.mean, resamples=resamples),
        }
        for k in range(lens.shape[1])
    ]


def restored(values: torch.Tensor, gap: torch.Tensor, resamples: int) -> dict:
    """A component's patching [n] as the share of the gap it restores: mean over mean gap, with interval."""
    pairs = torch.stack((values, gap), dim=1).double().numpy()
    share = lambda rows: rows[:, 0].mean() / rows[:, 1].mean() if rows[:, 1].mean() != 0 else np.nan
    return {
        "delta_logit_mean": float(values.mean()),
        "restored": float(share(pairs)),
        "restored_ci95": bootstrap(pairs, share, resamples=resamples),
    }


def forms_at(rows: list[dict]) -> int | None:
    """The first SA depth from which the lens's top-1 agrees with the final prediction for most images."""
    return explain.answer_forms_at([r["top1_agreement"] for r in rows], most=MOST)


def carriers(blocks: list[dict], heads: list[dict], *, top: int = 3) -> list[tuple[str, float]]:
    """The `top` branches and CA heads that restore the largest share of the gap alone, largest first."""
    parts = [(f"{b['name']} {kind}", b[kind]["restored"]) for b in blocks for kind in ("attention", "MLP")]
    parts += [(f"CA{h['layer']} head {h['head']}", h["restored"]) for h in heads]
    return sorted(((n, s) for n, s in parts if np.isfinite(s)), key=lambda p: -p[1])[:top]


def verdict(data: dict) -> str:
    """Two sentences from the numbers: where the answer forms, and what restores it under the corruption."""
    depth, k = len(data["lens"]) - 1, data["forms_at"]
    lens = data["lens"]
    if k is None:
        first = f"the lens's top-1 never settles on the final prediction for most of {data['images']}"
    else:
        first = (
            f"the answer forms at SA depth {k} of {depth}: from there on the lens's top-1 is the final prediction "
            f"for most of {data['images']} ({lens[k]['top1_agreement']:.0%} at depth {k}, "
            f"{lens[0]['top1_agreement']:.0%} on the patch embedding)"
        )
    corruption = f"{data['corruption']} at severity {data['severity']}"
    gap = data["gap"]
    if gap["ci95"][0] <= 0:
        second = f"Under {corruption} the predicted class's logit does not drop clearly (mean gap {gap['mean']:.2f})"
        return f"{first[0].upper()}{first[1:]}. {second}, so patching has little to restore."
    named = ", ".join(f"{n} ({s:.0%})" for n, s in data["carriers"])
    return (
        f"{first[0].upper()}{first[1:]}. Under {corruption} (mean gap {gap['mean']:.2f} logits), the clean "
        f"outputs that alone restore most of it: {named}."
    )


def summarise(model, m: dict[str, torch.Tensor], args: argparse.Namespace, made_from: str, what: str) -> dict:
    cfg, n = model.cfg, args.bootstrap
    names = [f"SA{k + 1}" for k in range(cfg.depth)] + [f"CA{c + 1}" for c in range(cfg.depth_token_only)]
    blocks = [
        {
            "name": name,
            "stream": restored(m["blocks"][:, i], m["gap"], n),
            "attention": restored(m["branches"][:, i, 0], m["gap"], n),
            "MLP": restored(m["branches"][:, i, 1], m["gap"], n),
        }
        for i, name in enumerate(names)
    ]
    L, H = m["heads"].shape[1:]
    heads = [
        {"layer": c + 1, "head": h + 1, **restored(m["heads"][:, c, h], m["gap"], n)}
        for c in range(L)
        for h in range(H)
    ]
    lens = lens_rows(m["lens"], m["target"], n)
    gap = m["gap"].double().numpy()
    data = {
        "made_from": made_from,
        "images": what,
        "target": "the clean run's predicted class",
        "corruption": args.corruption,
        "severity": args.severity,
        "seed": args.seed,
        "lens": lens,
        "forms_at": forms_at(lens),
        "gap": {"mean": float(gap.mean()), "ci95": bootstrap(gap, np.mean, resamples=n)},
        "blocks": blocks,
        "heads": heads,
        "carriers": carriers(blocks, heads),
        "note": "an SA block's stream is every patch token, so patching it restores the whole gap by definition",
    }
    data["verdict"] = verdict(data)
    return data


def figure(data: dict, *, newline: str = "\n") -> LinePlot:
    """Panel 1: the lens along SA depth; panel 2: the share of the gap each block's branch or stream restores.
    The title is the verdict, broken into lines by `newline` ("<br>" for plotly)."""
    depth = len(data["lens"]) - 1
    x_lens = [r["sa_depth"] for r in data["lens"]]
    band = lambda rows, key: ([r[key][0] for r in rows], [r[key][1] for r in rows])
    series = [
        Series(
            "lens top-1 = final prediction",
            x_lens,
            [r["top1_agreement"] for r in data["lens"]],
            0,
            "#1f77b4",
            band=band(data["lens"], "top1_agreement_ci95"),
        ),
        Series(
            "lens probability of the final class",
            x_lens,
            [r["probability"] for r in data["lens"]],
            0,
            "#ff7f0e",
            dash="dash",
            band=band(data["lens"], "probability_ci95"),
        ),
    ]
    x_blocks = list(range(1, len(data["blocks"]) + 1))
    for kind, colour, dash in (
        ("attention", "#2ca02c", "solid"),
        ("MLP", "#d62728", "solid"),
        ("stream", "#7f7f7f", "dot"),
    ):
        rows = [b[kind] for b in data["blocks"]]
        series.append(
            Series(
                f"{kind} patched",
                x_blocks,
                [r["restored"] for r in rows],
                1,
                colour,
                dash,
                band=band(rows, "restored_ci95"),
                hover=[b["name"] for b in data["blocks"]],
            )
        )
    return LinePlot(
        title=newline.join(textwrap.wrap(data["verdict"], 130)),
        panels=["logit lens (x: SA blocks the CA stage reads after)", "patching (x: block; CA after the line)"],
        x_label="SA depth / block",
        y_label="share",
        series=series,
        vlines=[(depth + 0.5, "CA stage")],
        hlines=[(MOST, "most images"), (1.0, "whole gap")],
        height=480,
    )


@calm
def main(argv: list[str] | None = None) -> int:
    p = parser("mechanisms", __doc__, images=True)
    p.add_argument("--scenes", type=int, default=200, help="test scenes (models trained on scenes); default 200")
    p.add_argument("--corruption", default="gaussian_noise", choices=list(CORRUPTIONS), help="the corrupted run's")
    p.add_argument("--severity", type=int, default=3, choices=list(SEVERITIES), help="the corruption's, 1-5")
    p.add_argument("--seed", type=int, default=0, help="seed of the corruption's random draws")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of the images (default 1000)")
    args = p.parse_args(argv)
    if args.scenes <= 0 or args.bootstrap <= 0:
        fail("--scenes and --bootstrap must be positive")
    if args.quick:
        args.bootstrap = 100
    loaded = load_from_flags(args)
    model = loaded.model.eval()
    x, what = views(model, args)
    measured = measure(model, x, args)  # a model without a class-attention stage: an InputError (calm)
    data = summarise(model, measured, args, loaded.made_from, what)
    out = out_dir(args.out)
    write_json(out / "mechanisms.json", data)
    plot = figure(data)
    save_png(to_matplotlib(plot, width=13, height=4.8), out / "mechanisms.png", loaded.made_from, dpi=80)
    save_html(to_plotly(figure(data, newline="<br>")), out / "mechanisms.html", loaded.made_from)
    print(f"{loaded.made_from}\n{data['verdict']}")
    for r in data["lens"]:
        print(f"SA depth {r['sa_depth']:>2}: lens top-1 = final {r['top1_agreement']:.0%}, p {r['probability']:.3f}")
    for b in data["blocks"]:
        parts = "  ".join(f"{k} {b[k]['restored']:+.2f}" for k in ("stream", "attention", "MLP"))
        print(f"{b['name']:<5} restored share of the gap: {parts}")
    print(f"wrote mechanisms.json/.png/.html to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
