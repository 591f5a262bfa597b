"""The SA heads' mean attention distance by depth (the ViT paper's Fig. 7 right, for CaiT), drawn by the
analysis script and the head atlas alike."""

from __future__ import annotations

import torch

from .lines import LinePlot, Series


def distance_plot(per_head: torch.Tensor, uniform: float, *, images: int) -> LinePlot:
    """per_head [SA layers, heads] (mean over images): the head mean, the band min .. max over heads, and the
    level uniform attention gives (`cait.explain.head_stats.uniform_attention_distance`)."""
    layers = list(range(1, per_head.shape[0] + 1))
    hover = [", ".join(f"h{h + 1} {v:.1f}" for h, v in enumerate(row.tolist())) for row in per_head]
    return LinePlot(
        title=f"Mean attention distance per SA layer, after proj_w ({images} images)",
        panels=[""],
        x_label="SA layer (depth)",
        y_label="mean attention distance (pixels)",
        series=[
            Series(
                "head mean, band: nearest- to farthest-looking head",
                layers,
                per_head.mean(1).tolist(),
                band=(per_head.min(1).values.tolist(), per_head.max(1).values.tolist()),
                hover=hover,
                colour="#1f77b4",
            )
        ],
        hlines=[(uniform, f"uniform attention: {uniform:.1f} px")],
        height=420,
    )
