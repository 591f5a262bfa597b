"""What the page's menus offer and how classes rank, for every tab alike: the class menus, the class-attention
heads and maps, and the top-k of a prediction (ties to the lower index, so that every tab names the same class);
and the colour-scale strip shown under a tab's maps."""

from __future__ import annotations

import html
from typing import Any

import gradio as gr
import numpy as np
import torch

import cait
from cait.figures.attention import head_name


def class_choices(labels: tuple[str, ...]) -> list[tuple[str, int]]:
    """A class menu's choices: (index: name, index), the Saliency, Causal and Mechanisms tabs' alike."""
    return [(f"{i}: {name}", i) for i, name in enumerate(labels)]


def colour_scale_image(label: str, *, elem_id: str) -> gr.Image:
    """The strip of a tab's colour scale under its maps: an image without frame, label or buttons."""
    return gr.Image(
        label=label,
        type="pil",
        interactive=False,
        height=60,
        show_label=False,
        container=False,
        elem_id=elem_id,
        buttons=[],
    )


def causal_heads(cfg: cait.CaiTConfig) -> list[tuple[str, int]]:
    """The class-attention heads to pick or tick: (label numbered from 1, index layer * heads + head)."""
    return [
        (f"CA{layer + 1} head {head + 1}", layer * cfg.num_heads + head)
        for layer in range(cfg.depth_token_only)
        for head in range(cfg.num_heads)
    ]


def region_choices(cfg: cait.CaiTConfig) -> list[str]:
    """The class-attention maps a region of focus can be drawn from: each CA layer's mean, then its heads."""
    return map_names(cfg.depth_token_only, cfg.num_heads)


def map_names(layers: int, heads: int) -> list[str]:
    """The names of the class-attention maps of `layers` CA layers of `heads` heads: each layer's mean, then its
    heads ("CA1 mean", "CA1 head 1", ...)."""
    return [head_name(layer, head) for layer in range(layers) for head in (None, *range(heads))]


def ranked_classes(probs: np.ndarray, k: int) -> list[int]:
    """The k most probable classes, most probable first, ties to the lower index: the one ranking the status,
    top-5, class pickers, saliency and causal targets all use, so that they name the same class even when
    probabilities tie (bf16, an untrained model)."""
    return [int(i) for i in np.argsort(-np.asarray(probs), kind="stable")[:k]]


def top_predictions(probs: np.ndarray, labels: tuple[str, ...], k: int = 5) -> list[dict[str, Any]]:
    """The top k of probabilities [K] as {"index", "label", "probability"}, in `ranked_classes` order."""
    order = ranked_classes(probs, k)
    return [{"index": int(i), "label": labels[i], "probability": float(probs[i])} for i in order]


def top_classes(logits: torch.Tensor, labels: tuple[str, ...], k: int = 5) -> list[dict[str, Any]]:
    """The top-k of one image's logits [1, K] as the page's top-5 lists them (`top_predictions`)."""
    return top_predictions(logits[0].float().softmax(-1).cpu().numpy(), labels, k)


def top5_html(result: dict[str, list[dict[str, Any]]], without: str) -> str:
    """The top-5 before and after an ablation (`result`'s "before" and "after"), side by side as a small table;
    `without` heads the second column ("without CA1 head 2")."""
    cell = lambda p: f"<td>{html.escape(p['label'])}</td><td>{p['probability']:.3f}</td>"  # noqa: E731
    rows = "".join(f"<tr>{cell(b)}{cell(a)}</tr>" for b, a in zip(result["before"], result["after"]))
    return (
        f"<table class='causal-top5'><tr><th colspan=2>top-5</th><th colspan=2>{html.escape(without)}</th></tr>"
        f"{rows}</table>"
    )
