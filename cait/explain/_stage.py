"""The stage plumbing every causal explanation shares: eval mode without autograd, the tokens entering each SA
block, the class-attention stage's class tokens (so a knockout, an ablation or a patch re-runs only a suffix),
patch scores on the grid, and the difference two runs make to the target logit."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout, no stochastic depth) and no autograd, the model's mode restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def target_difference(first: torch.Tensor, second: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """first - second [B] at each image's target class: logits [B, K] of two runs, target [B] class indices."""
    index = target.to(first.device).long().view(-1, 1)
    return (first.gather(1, index) - second.gather(1, index))[:, 0]


def grid(rows: torch.Tensor) -> torch.Tensor:
    """[..., N] patch scores in row-major order -> [..., g, g]."""
    g = int(round(rows.shape[-1] ** 0.5))
    if g * g != rows.shape[-1]:
        raise ValueError(f"{rows.shape[-1]} patches do not form a square grid")
    return rows.reshape(*rows.shape[:-1], g, g)


@dataclass
class ClassStage:
    """The class stage's residual states of one forward pass, for re-running only a suffix of it."""

    tokens: torch.Tensor  # [B, N, d] the patch tokens after the SA stage, which every CA block reads
    cls_inputs: list[torch.Tensor]  # depth_token_only + 1: class token entering CA block c; the last: final
    logits: torch.Tensor  # [B, K]


def class_stage(model: nn.Module, tokens: torch.Tensor) -> ClassStage:
    """The CA stage on `tokens`, keeping the class token entering every block (same kernels as `model`)."""
    cls = [model.cls_token.expand(tokens.shape[0], -1, -1)]
    for blk in model.blocks_token_only:
        cls.append(blk(tokens, cls[-1]))
    logits = model.forward_head(model.forward_class_attention(tokens, start=len(cls) - 1, cls=cls[-1]))
    return ClassStage(tokens, cls, logits)


def sa_states(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The tokens entering every SA block, and last the tokens leaving the stage (one forward's work)."""
    states = [model.patch_embed(x) + model.pos_embed]
    for k in range(len(model.blocks)):
        states.append(model.forward_sa_blocks(states[-1], start=k, stop=k + 1))
    return states
