"""Where along depth the answer forms, what carries it, and where over the image it enters the class token:
CaiT's logit lens (its own class-attention stage reading the patch tokens after each SA block), activation
patching between each test scene and the same scene under an ImageNet-C corruption (`cait.corruptions`), and
token patching into the class stage (the clean patch tokens of one region at a time put into the corrupted
run where the CA stage reads them), for the clean run's predicted class.

    python analysis/mechanisms.py [--scenes 200] [--corruption gaussian_noise] [--severity 3] [--out DIR]
    python analysis/mechanisms.py --data DIR --scenes 300 --region 1      # scenes of python -m cait.data.export
    python analysis/mechanisms.py --model cait_s24_224 --pretrained --images photo.jpg   # photos

The verdict is computed from the numbers: the SA depth from which the lens's top-1 agrees with the final
prediction for most images; the components whose clean output, patched alone into the corrupted run,
restores most of the clean-corrupted gap (the mean restored logit over the mean gap); and whether the CA
attention map predicts where token patching restores the answer (the rank correlation, per image, between
the clean run's class attention per region and the logit each region restores, averaged over the images).
The whole stream (after any SA block, or the last CA block's class token) restores the gap by construction:
it is the orientation line, not a result. Intervals are 95% percentile bootstraps over images.

Writes mechanisms.json/.png/.html and token_patching.png. Always fp32 (patching subtracts logits): --precision
is not used.
"""

from __future__ import annotations

import argparse
import textwrap

import numpy as np
import torch
from _common import calm, default_images, fail, load_examples, out_dir, parser, save_html, save_png, write_json
from scipy.stats import spearmanr
from torch.utils.data import default_collate
from tqdm import tqdm

from cait import explain
from cait.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from cait.explain.agreement import map_agreement
from cait.explain.mechanisms import answer_forms_at
from cait.explain.token_patching import region_sums
from cait.factory import load_from_flags
from cait.figures import LinePlot, Series, to_matplotlib, to_plotly
from cait.flags import add_data_flags
from cait.preprocess import normalise, view_pixels

BATCH = 25
QUICK_IMAGES = 8
MOST = 0.5  # "most images": the lens's top-1 agrees with the final prediction for more than this share
SCENES = "fashion-mnist-scenes"
SHOWN = 4  # images in token_patching.png
STRENGTH = ((0.3, "weakly"), (0.5, "moderately"), (float("inf"), "strongly"))  # |rank correlation| below: word


def views(model, args: argparse.Namespace) -> tuple[torch.Tensor, str]:
    """The clean model views [N, C, H, W] in [0, 1] and what they are: the images of --data (the reader's name
    of them, with how many unreadable ones were left out), or photos."""
    if model.cfg.is_imagenet or args.images:
        examples = load_examples(args.images or default_images(model.cfg), model.cfg, limit=2 if args.quick else None)
        if not examples:
            fail("no images: give --images")
        return torch.stack([view_pixels(e.image) for e in examples]), f"{len(examples)} photos"
    from cait.data import DataError, read_from_flags

    n = QUICK_IMAGES if args.quick else args.scenes
    try:
        data = read_from_flags(args, model.cfg, limit=n, normalise=False)
    except DataError as e:
        fail(str(e).splitlines()[0])
    readable = [data[i] for i in range(len(data))]
    readable = [item for item in readable if item[4]]  # a folder's unreadable files are left out
    left_out = len(data) - len(readable)
    return default_collate(readable)[0], data.name + (f" ({left_out} unreadable left out)" if left_out else "")


@torch.no_grad()
def measure(model, x: torch.Tensor, args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """Per image: the lens's logits [n, D + 1, K], the final prediction, the patching (of the predicted class's
    logit): CA class tokens [n, L - 1], branches [n, blocks, 2], CA heads [n, L, H], the gap [n]; the token
    patching maps [n, R, R] (restored into the corrupted run, lost from the clean run) with the clean run's
    class attention per region (mean over CA layers and heads) [n, R, R]; and the corrupted views."""
    generator = torch.Generator().manual_seed(args.seed)
    keys = ("lens", "target", "class_token", "branches", "heads", "gap", "restored", "broken", "attention", "views")
    out: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    for batch in tqdm(x.split(BATCH), desc="lens and patching", unit="batch"):
        broken = corrupt(batch, args.corruption, args.severity, generator=generator)
        clean, corrupted = normalise(batch, model.cfg), normalise(broken, model.cfg)
        lens = explain.logit_lens(model, clean)
        target = lens[:, -1].argmax(-1)
        by_block = explain.activation_patching(model, clean, corrupted, target)
        by_head = explain.activation_patching(model, clean, corrupted, target, granularity="head")
        tokens = explain.token_patching(model, clean, corrupted, target, region=args.region)
        attention = region_sums(explain.class_attention(model, clean).maps.mean((1, 2)), args.region)
        for key, value in (
            ("lens", lens),
            ("target", target),
            ("class_token", by_block.class_token),
            ("branches", by_block.branches),
            ("heads", by_head.heads),
            ("gap", by_block.gap),
            ("restored", tokens.restored),
            ("broken", tokens.broken),
            ("attention", attention),
            ("views", broken),
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
    return answer_forms_at([r["top1_agreement"] for r in rows], most=MOST)


def carriers(blocks: list[dict], heads: list[dict], *, top: int = 3) -> list[tuple[str, float]]:
    """The `top` branches and CA heads that restore the largest share of the gap alone, largest first."""
    parts = [(f"{b['name']} {kind}", b[kind]["restored"]) for b in blocks for kind in ("attention", "MLP")]
    parts += [(f"CA{h['layer']} head {h['head']}", h["restored"]) for h in heads]
    return sorted(((n, s) for n, s in parts if np.isfinite(s)), key=lambda p: -p[1])[:top]


def rank_correlations(first: torch.Tensor, second: torch.Tensor) -> np.ndarray:
    """Spearman's rank correlation per image between two maps [n, R, R] over their regions (NaN where either is
    flat)."""
    a, b = first.flatten(1).double().numpy(), second.flatten(1).double().numpy()
    flat = (a.std(1) == 0) | (b.std(1) == 0)
    return np.array([np.nan if f else spearmanr(u, v).statistic for u, v, f in zip(a, b, flat)])


def token_summary(m: dict[str, torch.Tensor], args: argparse.Namespace) -> dict:
    """The token patching over the images: the mean rank correlation of the CA attention map with the restored
    map (and with the lost one), with intervals, and the share of the gap the best region restores alone."""
    rho, rho_broken = rank_correlations(m["attention"], m["restored"]), rank_correlations(m["attention"], m["broken"])
    valid = rho[np.isfinite(rho)]
    best = m["restored"].flatten(1).max(1).values
    side = m["restored"].shape[-1]
    return {
        "region_patches": args.region,
        "regions": side * side,
        "attention": "the clean run's class attention per region: mean over CA layers and heads, summed per region",
        "rank_correlation": {
            "mean": float(valid.mean()) if len(valid) else None,
            "ci95": bootstrap(valid, np.mean, resamples=args.bootstrap) if len(valid) else None,
            "images": int(len(valid)),
        },
        "rank_correlation_lost": {
            "mean": float(np.nanmean(rho_broken)) if np.isfinite(rho_broken).any() else None,
            "images": int(np.isfinite(rho_broken).sum()),
        },
        "best_region": restored(best, m["gap"], args.bootstrap),
        "top_attention": top_attention_summary(m, args),
        "per_image_rank_correlation": [None if not np.isfinite(r) else float(r) for r in rho],
    }


def top_attention_summary(m: dict[str, torch.Tensor], args: argparse.Namespace) -> dict:
    """Does attention find the few regions that restore? Per image (`cait.explain.agreement.map_agreement`): the
    share of the positive restoration inside the top 10% of regions by attention, and how many of the top
    restoring regions are among them; means over the images with intervals, beside chance."""
    found = [map_agreement(a.numpy(), r.numpy()) for a, r in zip(m["attention"], m["restored"])]
    held = np.array([f.share_in_top for f in found if f.share_in_top is not None])
    overlap = np.array([f.overlap for f in found])
    return {
        "top_regions": found[0].top,
        "chance": found[0].chance,
        "share_in_top": (
            {"mean": float(held.mean()), "ci95": bootstrap(held, np.mean, resamples=args.bootstrap)}
            if len(held)
            else None
        ),  # None: no image had a region restore anything
        "overlap": {"mean": float(overlap.mean()), "ci95": bootstrap(overlap, np.mean, resamples=args.bootstrap)},
        "images": len(found),
    }


def token_verdict(tokens: dict) -> str:
    """One sentence: does the CA attention map predict where token patching restores the answer?"""
    rho = tokens["rank_correlation"]
    if rho["mean"] is None:
        return "Token patching: no image had both maps vary, so there is no rank correlation to report."
    low, high = rho["ci95"]
    said = f"mean rank correlation {rho['mean']:.2f} [{low:.2f}, {high:.2f}] over {rho['images']} images"
    where = "where patching the clean tokens back restores the answer"
    strength = next(word for bound, word in STRENGTH if abs(rho["mean"]) < bound)
    if low > 0:
        answer = f"{strength} predicts {where}"
    elif high < 0:
        answer = f"{strength} points away from {where}"
    else:
        answer = f"does not predict {where}"
    best = tokens["best_region"]["restored"]
    top = tokens["top_attention"]
    held, overlap, k = top["share_in_top"], top["overlap"], top["top_regions"]
    holds = (
        ""
        if held is None
        else f"hold {held['mean']:.0%} [{held['ci95'][0]:.0%}, {held['ci95'][1]:.0%}] of the restoration and "
    )
    return (
        f"The CA attention map {answer} ({said}); the best region alone restores {best:.0%} of the gap. Its top {k} "
        f"regions {holds}include {overlap['mean']:.0%} of the top {k} restoring regions (chance {top['chance']:.0%})."
    )


def verdict(data: dict) -> str:
    """Three sentences from the numbers: where the answer forms, what restores it under the corruption, and
    whether the CA attention map predicts where it enters the class token."""
    depth, k = len(data["lens"]) - 1, data["forms_at"]
    lens = data["lens"]
    if k is None:
        first = f"the lens's top-1 never settles on the final prediction for most of the {data['image_count']} images"
    else:
        first = (
            f"the answer forms at SA depth {k} of {depth}: from there on the lens's top-1 is the final prediction "
            f"for most of the {data['image_count']} images ({lens[k]['top1_agreement']:.0%} at depth {k}, "
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
        f"outputs that alone restore most of it: {named}. {token_verdict(data['tokens'])}"
    )


def summarise(model, m: dict[str, torch.Tensor], args: argparse.Namespace, made_from: str, what: str) -> dict:
    cfg, n = model.cfg, args.bootstrap
    names = [f"SA{k + 1}" for k in range(cfg.depth)] + [f"CA{c + 1}" for c in range(cfg.depth_token_only)]
    blocks = [
        {
            "name": name,
            "attention": restored(m["branches"][:, i, 0], m["gap"], n),
            "MLP": restored(m["branches"][:, i, 1], m["gap"], n),
        }
        for i, name in enumerate(names)
    ]
    for c in range(m["class_token"].shape[1]):  # each CA block but the last: its class token patched alone
        blocks[cfg.depth + c]["class_token"] = restored(m["class_token"][:, c], m["gap"], n)
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
        "image_count": int(m["target"].numel()),
        "target": "the clean run's predicted class",
        "corruption": args.corruption,
        "severity": args.severity,
        "seed": args.seed,
        "lens": lens,
        "forms_at": forms_at(lens),
        "gap": {"mean": float(gap.mean()), "ci95": bootstrap(gap, np.mean, resamples=n)},
        "whole_stream": "orientation, not a result: the whole stream after any SA block, or the class token after "
        "the last CA block, patched into the corrupted run is the clean run, so it restores the whole gap",
        "blocks": blocks,
        "heads": heads,
        "carriers": carriers(blocks, heads),
        "tokens": token_summary(m, args),
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
    for kind, colour, dash in (
        ("attention", "#2ca02c", "solid"),
        ("MLP", "#d62728", "solid"),
        ("class_token", "#7f7f7f", "dot"),
    ):
        at = [(i + 1, b) for i, b in enumerate(data["blocks"]) if kind in b]
        rows = [b[kind] for _, b in at]
        series.append(
            Series(
                f"{kind.replace('_', ' ')} patched",
                [i for i, _ in at],
                [r["restored"] for r in rows],
                1,
                colour,
                dash,
                band=band(rows, "restored_ci95"),
                hover=[b["name"] for _, b in at],
            )
        )
    return LinePlot(
        title=newline.join(textwrap.wrap(data["verdict"], 130)),
        panels=["logit lens (x: SA blocks the CA stage reads after)", "patching (x: block; CA after the line)"],
        x_label="SA depth / block",
        y_label="share",
        series=series,
        vlines=[(depth + 0.5, "CA stage")],
        hlines=[(MOST, "most images"), (1.0, "whole stream patched: the clean run (orientation)")],
        height=480,
    )


def token_figure(x: torch.Tensor, m: dict[str, torch.Tensor], data: dict, *, shown: int = SHOWN):
    """Per image (the first `shown`): the clean and corrupted views, the share of the gap each region's clean
    tokens restore in the corrupted run, and the clean run's class attention per region, with their rank
    correlation; a matplotlib figure."""
    import matplotlib.pyplot as plt

    n, gap = min(shown, len(x)), m["gap"]
    fig, axes = plt.subplots(n, 4, figsize=(9.6, 2.5 * n + 0.6), squeeze=False)
    rho = data["tokens"]["per_image_rank_correlation"]
    for i in range(n):
        share = (m["restored"][i] / gap[i]).numpy() if gap[i] != 0 else np.full(m["restored"][i].shape, np.nan)
        panels = [
            (x[i], "clean", None),
            (m["views"][i].clamp(0, 1), "corrupted", None),
            (share, "share of the gap restored", "RdBu_r"),
            (m["attention"][i].numpy(), "CA attention", "inferno"),
        ]
        for ax, (image, title, cmap) in zip(axes[i], panels):
            if cmap is None:
                ax.imshow(image.permute(1, 2, 0).squeeze().numpy(), cmap="gray" if image.shape[0] == 1 else None)
            else:
                bound = float(np.nanmax(np.abs(image))) if cmap == "RdBu_r" and np.isfinite(image).any() else None
                shown_map = ax.imshow(image, cmap=cmap, vmin=-bound if bound else None, vmax=bound)
                fig.colorbar(shown_map, ax=ax, fraction=0.046, pad=0.04)
            with_rho = title == "CA attention" and rho[i] is not None
            ax.set_title(f"{title} (ρ {rho[i]:.2f})" if with_rho else title, fontsize=9)
            ax.set_xticks([]), ax.set_yticks([])
    tokens = data["tokens"]
    fig.suptitle(
        "\n".join(textwrap.wrap(token_verdict(tokens), 110))
        + f"\nregions of {tokens['region_patches']} x {tokens['region_patches']} patches, "
        f"{data['corruption']} at severity {data['severity']}",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


@calm
def main(argv: list[str] | None = None) -> int:
    p = parser("mechanisms", __doc__, images=True)
    add_data_flags(
        p,
        default=SCENES,
        help=f"{SCENES} (default) or a folder of images (python -m cait.data.export)",
        boxes=None,
        limit=None,
        sample=None,
    )
    p.add_argument("--scenes", type=int, default=200, help="images of --data (default 200)")
    p.add_argument("--corruption", default="gaussian_noise", choices=list(CORRUPTIONS), help="the corrupted run's")
    p.add_argument("--severity", type=int, default=3, choices=list(SEVERITIES), help="the corruption's, 1-5")
    p.add_argument("--seed", type=int, default=0, help="seed of the corruption's random draws")
    p.add_argument("--region", type=int, default=1, help="token patching: a region's side in patches (default 1)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of the images (default 1000)")
    args = p.parse_args(argv)
    if args.scenes <= 0 or args.bootstrap <= 0:
        fail("--scenes and --bootstrap must be positive")
    if args.quick:
        args.bootstrap = 100
    loaded = load_from_flags(args)
    model = loaded.model.eval()
    x, what = views(model, args)
    measured = measure(model, x, args)  # no class-attention stage, a region too large: InputError (calm)
    data = summarise(model, measured, args, loaded.made_from, what)
    out = out_dir(args.out)
    write_json(out / "mechanisms.json", data)
    plot = figure(data)
    save_png(to_matplotlib(plot, width=13, height=4.8), out / "mechanisms.png", loaded.made_from, dpi=80)
    save_html(to_plotly(figure(data, newline="<br>")), out / "mechanisms.html", loaded.made_from)
    save_png(token_figure(x, measured, data), out / "token_patching.png", loaded.made_from, dpi=80)
    print(f"{loaded.made_from}\n{data['verdict']}")
    for r in data["lens"]:
        print(f"SA depth {r['sa_depth']:>2}: lens top-1 = final {r['top1_agreement']:.0%}, p {r['probability']:.3f}")
    for b in data["blocks"]:
        parts = "  ".join(f"{k} {b[k]['restored']:+.2f}" for k in ("attention", "MLP", "class_token") if k in b)
        print(f"{b['name']:<5} restored share of the gap: {parts}")
    print(f"wrote mechanisms.json/.png/.html and token_patching.png to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
