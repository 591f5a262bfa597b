"""The Mechanisms tab's numbers as plain functions (no Gradio): for one image and one class, the logit lens
along SA depth, activation patching between this image and a second one (another image, or this one under an
ImageNet-C corruption), and the ablation of a set of class-attention heads. The numbers are `cait.explain`'s;
this module picks the inputs, turns tensors into JSON-able numbers, and says the cost in forward passes.

All of it runs in fp32 whatever the session's precision: it subtracts logits, which bf16 blurs."""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import torch
from PIL import Image

from app.choices import top5_html, top_classes
from cait import explain
from cait.corruptions import corrupt
from cait.figures import head_name
from cait.preprocess import normalise, view_pixels

SOURCES = ("this image, corrupted", "an example", "an upload")  # where the corrupted run's image comes from
CORRUPTION_SEED = 0  # the corruption's random draws: the same image and choice give the same numbers
TOP = 5


def lens(model: torch.nn.Module, x: torch.Tensor, target: int, labels: tuple[str, ...]) -> dict[str, Any]:
    """The logit lens of one image x [1, C, H, W] for class `target`: per SA depth (0: the patch embedding) the
    class's probability and the lens's top-1 with its probability, and where the answer forms (the first
    depth from which the top-1 is the model's final prediction)."""
    probs = explain.logit_lens(model, x)[0].float().softmax(-1)  # [D + 1, K]
    top_p, top = probs.max(-1)
    final = int(top[-1])
    return {
        "layout": "per SA depth k = 0..depth: the CA stage reads the patch tokens after SA block k (0: the patch "
        "embedding); the last entry is the model's own output",
        "target": int(target),
        "probability": probs[:, int(target)].tolist(),
        "top1": top.tolist(),
        "top1_label": [labels[int(i)] for i in top],
        "top1_probability": top_p.tolist(),
        "forms_at": explain.answer_forms_at([float(int(t) == final) for t in top]),
    }


def corrupted_input(view: Image.Image, cfg, name: str, severity: int) -> tuple[Image.Image, torch.Tensor]:
    """This image's model view under corruption `name` at `severity` (`cait.corruptions`, seeded draws): the
    corrupted view as an image, and the normalised input [1, C, H, W]."""
    pixels = corrupt(
        view_pixels(view)[None], name, int(severity), generator=torch.Generator().manual_seed(CORRUPTION_SEED)
    )
    array = (pixels[0].clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    shown = Image.fromarray(array[..., 0] if array.shape[2] == 1 else array)
    return shown, normalise(pixels, cfg)


def patching_forwards(cfg) -> int:
    """About how many forward passes `patching` costs: per block and per CA head together SA depth + 4 to + 6
    measured (benchmarks/README.md: per block 25.5 for 24 SA blocks, 11.3 for 8; per head 2.1-2.4)."""
    return cfg.depth + 5


def patching(model: torch.nn.Module, clean: torch.Tensor, corrupted: torch.Tensor, target: int) -> dict[str, Any]:
    """Activation patching of class `target`'s logit from the clean run into the corrupted one, per block
    (branches, and the class token after each CA block but the last) and per CA head, with each component's
    share of the gap, JSON-able."""
    t = torch.tensor([int(target)], device=clean.device)
    by_block = explain.activation_patching(model, clean, corrupted, t)
    by_head = explain.activation_patching(model, clean, corrupted, t, granularity="head")
    gap = float(by_block.gap[0])
    as_list = lambda v: v[0].float().cpu().numpy()  # noqa: E731
    class_token, branches, heads = as_list(by_block.class_token), as_list(by_block.branches), as_list(by_head.heads)
    share = lambda v: (np.asarray(v) / gap).tolist() if gap else None  # noqa: E731
    return {
        "layout": "blocks in model order (SA then CA), 0-based; branches [block][attention, MLP]; class_token [CA "
        "block but the last]; heads [CA layer][head]; each value: the corrupted run's target logit with that "
        "component's clean output patched in, minus the corrupted run's; restored: that over the gap (clean minus "
        "corrupted target logit, what the whole stream restores by construction)",
        "target": int(target),
        "clean_logit": float(by_block.clean[0, int(target)]),
        "corrupted_logit": float(by_block.corrupted[0, int(target)]),
        "corrupted_top1": int(by_block.corrupted[0].argmax()),
        "gap": gap,
        "class_token": class_token.tolist(),
        "branches": branches.tolist(),
        "heads": heads.tolist(),
        "restored": {"class_token": share(class_token), "branches": share(branches), "heads": share(heads)},
    }


def patching_numbers(
    model: torch.nn.Module,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    target: int,
    *,
    corruption: tuple[str, int] | None = None,
    second_image: str | None = None,
) -> dict[str, Any]:
    """`patching`'s numbers headed by where the corrupted run came from: "corruption" and "severity" when it is
    this image under that ImageNet-C corruption, else "second_image", the other image's file name. The layout
    of /analyze's "patching" answer and of the JSON download's."""
    origin = {"corruption": corruption[0], "severity": corruption[1]} if corruption else {"second_image": second_image}
    return {**origin, **patching(model, clean, corrupted, target)}


def head_pairs(indices: list[int], heads: int) -> list[tuple[int, int]]:
    """The ticked heads (layer * heads + head, as `choices.causal_heads` numbers them) as (layer, head) pairs."""
    return [divmod(int(i), heads) for i in indices]


def set_ablation(
    model: torch.nn.Module,
    x: torch.Tensor,
    *,
    heads: list[tuple[int, int]],
    target: int,
    labels: tuple[str, ...],
    reference: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The top-5 before and after removing the CA heads `heads` together (zero, or each its mean over
    `reference`), and the change of class `target`'s logit."""
    out = explain.head_ablation(model, x, heads=heads, reference=reference)
    t = torch.tensor([int(target)], device=x.device)
    return {
        "heads": [list(pair) for pair in out.heads],
        "target": int(target),
        "target_label": labels[int(target)],
        "delta_logit": float(out.delta(t)[0]),
        "before": top_classes(out.before, labels, TOP),
        "after": top_classes(out.after, labels, TOP),
    }


def ablation_html(result: dict[str, Any], mode: str) -> str:
    """The Δlogit line and the top-5 before and after, side by side."""
    named = ", ".join(head_name(layer, head) for layer, head in result["heads"])
    label = result["target_label"]
    return (
        f"<p>Without {html.escape(named)} ({html.escape(mode)}): Δlogit of '{html.escape(label)}' "
        f"<b>{result['delta_logit']:+.3f}</b></p>{top5_html(result, 'without the ticked heads')}"
    )
