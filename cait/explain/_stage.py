"""The stage plumbing every causal explanation shares: eval mode without autograd, the tokens entering each SA
block, the class-attention stage's class tokens (so a knockout, an ablation or a patch re-runs only a suffix),
the class stage's keys and values of one run's patch tokens (so a re-run of the class stage recomputes only the
class token's own path), patch scores on the grid, and the difference two runs make to the target logit."""

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


# ----------------------------------------------------------------------------------------------------
# the class token's own path on a run's cached keys and values


@dataclass
class ClassStageKeys:
    """Each CA block's keys and values of one run's patch tokens, [B, heads, N, d / heads] per block. The class
    stage never changes the patch tokens, and LayerNorm and the projections act per token, so these are fixed
    per run: re-running the class stage for another class token, or with some patches taken from another run,
    only recomputes the class token's own path (one query, its own key and value, one attention row, the
    projection and the MLP of one token)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, T, d] -> [B, heads, T, d / heads]."""
    B, T, d = t.shape
    return t.view(B, T, heads, d // heads).transpose(1, 2)


def class_stage_keys(model: nn.Module, tokens: torch.Tensor) -> ClassStageKeys:
    """Every CA block's keys and values of the patch tokens [B, N, d] the class stage reads (one run's)."""
    keys, values = [], []
    for blk in model.blocks_token_only:
        x = blk.norm1(tokens)
        keys.append(_heads(blk.attn.k(x), blk.attn.num_heads))
        values.append(_heads(blk.attn.v(x), blk.attn.num_heads))
    return ClassStageKeys(keys, values)


def _by_token(t: torch.Tensor) -> torch.Tensor:
    """[B, h, T, e] -> [B, T, h, e], a view: index it by (image, token) to read or write every head."""
    return t.permute(0, 2, 1, 3)


def _by_entry(t: torch.Tensor) -> torch.Tensor:
    """Attention scores [B, h, M, N] -> [B, M, N, h], a view: index it by (image, row, patch)."""
    return t.permute(0, 2, 3, 1)


@dataclass
class _Swap:
    """The entries (image, row, patch) of a batch of mixed runs whose patch is read from the source run."""

    image: torch.Tensor  # [nnz] long
    row: torch.Tensor  # [nnz] long
    patch: torch.Tensor  # [nnz] long
    rows: int  # mixed runs per image
    disjoint: bool  # no patch of an image swapped in two of its rows


def _class_attention(blk: nn.Module, cls: torch.Tensor, base: tuple, source: tuple | None, swap: _Swap | None):
    """Block `blk`'s attention output for class tokens cls [B, M, d], reading the base run's keys and values
    (`base`: (keys, values)) except at `swap`'s entries, read from `source`. With one class token shared by
    every row of `swap` (M = 1) and no patch in two rows, only the swapped entries are computed per row
    (`_shared_class_attention`); otherwise the softmax is written out so that the source entries are gathered,
    not the whole rows."""
    attn = blk.attn
    u = blk.norm1(cls)
    q = _heads(attn.q(u), attn.num_heads) * attn.scale  # [B, h, M, e]
    k_own, v_own = _heads(attn.k(u), attn.num_heads), _heads(attn.v(u), attn.num_heads)
    own = (q * k_own).sum(-1, keepdim=True)  # [B, h, M, 1]: the class token's attention to itself
    if swap is not None and q.shape[2] == 1 and swap.rows > 1 and swap.disjoint:
        out = _shared_class_attention(q, own, v_own, base, source, swap)
        if out is not None:
            return attn.proj(out.flatten(2))
    scores = q @ base[0].transpose(-2, -1)  # [B, h, M, N]
    if swap is not None:
        if q.shape[2] != swap.rows:  # one class token for every row: its scores once, spread to the rows
            scores = scores.expand(-1, -1, swap.rows, -1).clone()
        q_rows = swap.row if q.shape[2] == swap.rows else torch.zeros_like(swap.row)
        k_src = _by_token(source[0])[swap.image, swap.patch]  # [nnz, h, e]
        _by_entry(scores)[swap.image, swap.row, swap.patch] = (_by_token(q)[swap.image, q_rows] * k_src).sum(-1)
    top = torch.maximum(scores.amax(-1, keepdim=True), own)
    weights, own = scores.sub_(top).exp_(), (own - top).exp()  # in place: no second [B, h, M, N] buffer
    total = weights.sum(-1, keepdim=True) + own
    out = own * v_own
    if swap is not None:
        from_source = _by_entry(weights)[swap.image, swap.row, swap.patch]  # [nnz, h]
        _by_entry(weights)[swap.image, swap.row, swap.patch] = 0
        out = out + weights @ base[1]
        v_src = _by_token(source[1])[swap.image, swap.patch]  # [nnz, h, e]
        _by_token(out).index_put_((swap.image, swap.row), from_source[..., None] * v_src, accumulate=True)
    else:
        out = out + weights @ base[1]
    out = (out / total).transpose(1, 2)
    return attn.proj(out.reshape(*out.shape[:2], -1))


def _shared_class_attention(q, own, v_own, base: tuple, source: tuple, swap: _Swap) -> torch.Tensor | None:
    """The attention rows [B, rows, h, e] of one class token (q [B, h, 1, e] scaled, `own` its score against
    its own key, `v_own` its value) over the base run's keys and values with `swap`'s entries read from
    `source`, where no patch is swapped in two rows: the sums over the patches no row swaps once, then per row
    the other rows' swapped patches (sums before and after it) and its own entries from the source. Every sum
    adds weights, none takes one out, so a patch holding nearly all of the attention leaves the rest exact.
    In float64, each row scaled to its own top score; None if a row's weights still all underflow (its
    swapped-out patch 700 logits above the rest), for the caller's row-by-row softmax."""
    B, rows = q.shape[0], swap.rows
    scores = (q @ base[0].transpose(-2, -1))[:, :, 0]  # [B, h, N]
    own = own[:, :, 0, 0]  # [B, h]
    from_source = (_by_token(q)[swap.image, 0] * _by_token(source[0])[swap.image, swap.patch]).sum(-1)  # [nnz, h]
    at = (swap.image, swap.row)

    def per_row(entries: torch.Tensor) -> torch.Tensor:  # [nnz, ...] -> [B, rows, ...]: each row's sum
        return entries.new_zeros(B, rows, *entries.shape[1:]).index_put_(at, entries, accumulate=True)

    top = torch.maximum(scores.amax(-1), own)  # [B, h]: the base run's top score
    row_at = (swap.image * rows + swap.row)[:, None].expand_as(from_source)
    row_top = top.repeat_interleave(rows, 0).scatter_reduce_(0, row_at, from_source, "amax").view(B, rows, -1)
    weights, own = (scores - top[..., None]).double().exp(), (own - top).double().exp()
    swapped = torch.zeros(B, 1, scores.shape[-1], dtype=torch.bool, device=q.device)
    swapped[swap.image, 0, swap.patch] = True
    kept = weights.masked_fill(swapped, 0)  # the patches every row reads from the base run
    kept_total = kept.sum(-1) + own  # [B, h]
    kept_summed = (kept[:, :, None] @ base[1].double())[:, :, 0] + own[..., None] * v_own[:, :, 0].double()  # [B,h,e]
    taken = weights.transpose(1, 2)[swap.image, swap.patch]  # [nnz, h]: the base entries the swaps replace
    put = (from_source - row_top[at]).double().exp()  # [nnz, h], scaled to the row's top
    v_base, v_src = _by_token(base[1])[swap.image, swap.patch], _by_token(source[1])[swap.image, swap.patch]
    scale = (top[:, None] - row_top).double().exp()  # [B, rows, h]: the base run's part rescaled to each row's top
    total = scale * (kept_total[:, None] + _other_rows(per_row(taken))) + per_row(put)  # [B, rows, h]
    if not bool((total > 0).all()):
        return None
    from_base = kept_summed[:, None] + _other_rows(per_row(taken[..., None] * v_base.double()))
    summed = scale[..., None] * from_base + per_row(put[..., None] * v_src.double())
    return (summed / total[..., None]).to(q.dtype)


def _other_rows(t: torch.Tensor) -> torch.Tensor:
    """For each row of t [B, rows, ...] the sum of all the other rows, as the rows before plus the rows after
    (no row subtracted from the whole)."""
    zero = torch.zeros_like(t[:, :1])
    before = torch.cat((zero, t.cumsum(1)[:, :-1]), dim=1)
    after = torch.cat((t.flip(1).cumsum(1).flip(1)[:, 1:], zero), dim=1)
    return before + after


def class_token_logits(
    model: nn.Module,
    base: ClassStageKeys,
    *,
    cls: torch.Tensor | None = None,
    start: int = 0,
    source: ClassStageKeys | None = None,
    swapped: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits [B, M, K] of the class stage from CA block `start` on, final norm and head, on a run's cached
    keys and values (`class_stage_keys`): the model's own class stage, to float precision.

    Args:
        model: a CaiT with a class-attention stage.
        base: the keys and values of the patch tokens read.
        cls: class tokens entering block `start` [B, M, d] (default: the model's, M = 1).
        start: the first CA block run.
        source: another run's keys and values, read at the patches `swapped` marks.
        swapped: bool [B or 1, M', N]: row m reads patch n from `source` where True (M' mixed runs per image;
            with M = 1 the class token is shared by them).

    Returns:
        Logits [B, M or M', K].
    """
    B = base.keys[0].shape[0]
    cls = model.cls_token.expand(B, 1, -1) if cls is None else cls
    swap = None
    if swapped is not None:
        image, row, patch = swapped.expand(B, -1, -1).nonzero(as_tuple=True)
        swap = _Swap(image, row, patch, swapped.shape[-2], bool((swapped.sum(-2) <= 1).all()))
    for c in range(start, len(model.blocks_token_only)):
        blk = model.blocks_token_only[c]
        src = None if source is None else (source.keys[c], source.values[c])
        cls = cls + blk.drop_path(blk.gamma_1 * _class_attention(blk, cls, (base.keys[c], base.values[c]), src, swap))
        cls = cls + blk.drop_path(blk.gamma_2 * blk.mlp(blk.norm2(cls)))
    logits = model.forward_head(model.norm(cls).flatten(0, 1)[:, None])
    return logits.view(B, -1, logits.shape[-1])
