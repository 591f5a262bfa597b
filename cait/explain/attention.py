"""What CaiT's own attention says: class-attention maps, their class-specific (gradient-weighted)
version, attention rollout adapted to the SA + CA split, and the talking-heads inspector.

Token order everywhere: the class-attention rows from `forward_insights` are [class token, patch 0,
..., patch N-1] with patches in row-major grid order, so `row[1:].reshape(g, g)` is the image layout.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from ._checks import ExplainInputError, check_class_stage, check_input, check_target
from ._stage import grid
from .hooks import on_inputs, recorded


@dataclass
class ClassAttention:
    """Class-token attention of every CA layer, split into the patch maps and the self share."""

    logits: torch.Tensor  # [B, K]
    maps: torch.Tensor  # [B, L, heads, g, g]: class token -> patch attention of each CA layer
    self_share: torch.Tensor  # [B, L, heads]: attention the class token gives itself (maps + self = 1)

    @property
    def mean(self) -> torch.Tensor:
        """Head mean [B, L, g, g]."""
        return self.maps.mean(dim=2)

    @classmethod
    def from_insights(cls, ins) -> "ClassAttention":
        """Split the class-attention rows of `CaiT.forward_insights` ([B, heads, 1+N] per CA layer) into
        the patch maps on the grid and the class token's share for itself."""
        rows = torch.stack(ins.class_attention, dim=1).float()  # [B, L, heads, 1+N]; fp32 also after autocast
        return cls(logits=ins.logits.detach().float(), maps=grid(rows[..., 1:]), self_share=rows[..., 0])


@torch.no_grad()
def class_attention(model: nn.Module, x: torch.Tensor) -> ClassAttention:
    """Class-attention maps of each CA layer, straight from the model's softmax (no gradients).

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).

    Returns:
        `ClassAttention`: .maps [B, CA layers, heads, g, g], .mean, .self_share, .logits.
    """
    check_input(model, x)
    return ClassAttention.from_insights(model.forward_insights(x))


@contextmanager
def input_gradients(model: nn.Module) -> Iterator[None]:
    """Gradients on, also inside a caller's no_grad / inference_mode, with the parameters frozen:
    explanations need d(output)/d(input) only, and without weight gradients autograd saves fewer
    activations and does half the backward work. Clone inputs made under inference_mode inside it."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        for p in params:
            p.requires_grad_(True)


def class_specific_attention(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Class attention weighted by the gradient of the target logit, Grad-CAM style: for each CA layer
    l and head h, E_h[A_lh * relu(dy_target / dA_lh)] over patches, summed over the CA layers [B, g, g].

    Only the CA stage needs a graph: the patch tokens entering it become a fresh leaf, so the backward
    pass never enters the SA stage. dy/dA is exact without touching the model code: the CA output of
    head h is o_h = sum_j A_hj v_hj, hence dy/dA_hj = <dy/do_h, v_hj>; o (the input of attn.proj) and v
    (the output of attn.v) are read with hooks.

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        target: the class explained per image, LongTensor [B] (or one int for all).

    Returns:
        The heat map [B, g, g].
    """
    check_input(model, x)
    check_class_stage(model)
    target = check_target(model, target, x.shape[0], x.device)
    ca_blocks = model.blocks_token_only
    heads = ca_blocks[0].attn.num_heads

    def leaf_patches(module, args):  # patch tokens entering the CA stage: cut the SA graph here
        return (args[0].detach().requires_grad_(True), *args[1:])

    points = _attention_points(model, sa=False)
    with on_inputs(ca_blocks[0], leaf_patches), input_gradients(model), recorded(points) as seen:
        ins = model.forward_insights(x.clone())
        score = ins.logits.gather(1, target.view(-1, 1).to(ins.logits.device).clone()).sum()
        grads = torch.autograd.grad(score, [seen["ca", i, "o"] for i in range(len(ca_blocks))])
    maps = []
    for i, (attn, grad_o) in enumerate(zip(ins.class_attention, grads)):
        grad_attn = _attention_gradient(grad_o, seen["ca", i, "v"].detach(), heads)[:, :, 0]  # [B, h, 1+N]
        maps.append((attn * grad_attn.clamp_min(0)).mean(dim=1)[:, 1:])  # [B, N]
    return grid(torch.stack(maps).sum(dim=0))


def _attention_points(model: nn.Module, *, sa: bool = True) -> dict:
    """Hook points (see `hooks.recorded`) of every attention layer's values and head outputs (the input of
    attn.proj), under (stage, layer, "v" / "o"); an SA layer's values are read from its qkv output."""
    points = {("ca", i, "o"): (blk.attn.proj, True) for i, blk in enumerate(model.blocks_token_only)}
    points.update({("ca", i, "v"): (blk.attn.v, False) for i, blk in enumerate(model.blocks_token_only)})
    for k, blk in enumerate(model.blocks if sa else ()):
        points.update({("sa", k, "o"): (blk.attn.proj, True), ("sa", k, "v"): (blk.attn.qkv, False)})
    return points


def _attention_gradient(grad_o: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """dy/dA [B, heads, Q, T] for attention weights A whose head outputs are o_hq = sum_j A_hqj v_hj, from
    dy/do [B, Q, C] (C = heads x head width) and the values v [B, T, C]: dy/dA_hqj = <dy/do_hq, v_hj>."""
    B, Q, C = grad_o.shape
    per_head = lambda t: t.reshape(B, t.shape[1], heads, C // heads)
    return torch.einsum("bqhc,bjhc->bhqj", per_head(grad_o), per_head(v))


def _normalise_rows(a: torch.Tensor) -> torch.Tensor:
    return a / a.sum(dim=-1, keepdim=True).clamp_min(1e-12)


# The SA attention at each point of the talking-heads computation, named by what has been applied.
ROLLOUT_STAGES = ("raw", "after_proj_l", "after_proj_w")


def rollout_stage(stage: str) -> str:
    """`stage` if it is one of ROLLOUT_STAGES; ExplainInputError naming them otherwise."""
    if stage not in ROLLOUT_STAGES:
        raise ExplainInputError(f"stage must be one of {', '.join(ROLLOUT_STAGES)}, got {stage!r}")
    return stage


HEAD_FUSIONS = ("mean", "max", "min")  # how rollout merges the heads of a layer (Abnar & Zuidema: mean)


def _fuse(attn: torch.Tensor, fusion: str) -> torch.Tensor:
    """The heads (dim 1) of attn [B, heads, ...] merged by `fusion`."""
    if fusion == "mean":
        return attn.mean(dim=1)
    return attn.amax(dim=1) if fusion == "max" else attn.amin(dim=1)


def _discard_lowest(a: torch.Tensor, ratio: float) -> torch.Tensor:
    """a [B, N, N] with the lowest `ratio` share of each sample's weights set to 0 (rollout's discard ratio:
    the faint attention spread everywhere no longer blurs the product)."""
    drop = int(ratio * a[0].numel())
    if drop <= 0:
        return a
    flat = a.flatten(1).clone()
    flat.scatter_(1, flat.topk(drop, dim=1, largest=False).indices, 0.0)
    return flat.view_as(a)


def _head_mean_attention(ins, layer: int, stage: str, fusion: str = "mean") -> torch.Tensor:
    """[B, N, N] row-stochastic SA attention of one layer at `stage`, heads merged by `fusion` (see
    `rollout`)."""
    if stage == "raw":
        return _normalise_rows(_fuse(ins.raw_self_attention[layer], fusion))
    after_proj_l, after_proj_w = ins.self_attention[layer]
    if stage == "after_proj_l":
        return _normalise_rows(_fuse(after_proj_l, fusion))
    return _normalise_rows(_fuse(after_proj_w.clamp_min(0), fusion))


def rollout(
    model: nn.Module,
    x: torch.Tensor,
    *,
    stage: str = "after_proj_l",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020) adapted to CaiT, class token -> patch relevance [B, g, g].

    SA stage: per layer the head-mean attention A, the residual folded in as (A + I) / 2 with rows
    renormalised, multiplied through the depth: R_SA = Â_D ... Â_1 (rows: output patch, cols: input).
    Which A (`stage`):
      "raw": softmax(q k^T) of each head, unmixed: a counterfactual the model does not compute (its
        softmax acts on logits already mixed across heads by proj_l). Row-stochastic.
      "after_proj_l": softmax(proj_l(q k^T)), the softmax the model computes. Row-stochastic.
      "after_proj_w": proj_w(softmax(...)), the weights that really multiply the values; they can be
        negative and rows need not sum to 1, so each head is clamped at 0 (a negative weight subtracts a
        value, it does not route relevance) before the head mean and rows are renormalised.
    CA stage: tokens [cls, patches]. Patches are never updated there, so their rows are [0 | R_SA]; the
    class token starts as a learned constant (row e_0) and each CA layer l replaces its row by
    (e_0 + a_l) / 2 applied to the current rows, a_l being the head-mean class-attention row over
    [cls, patches]. After the two layers, the class-token row over the patch columns is the map; its
    column 0 (relevance left on the learned class-token constant) is dropped, so a map sums to < 1.
    Options of the attention-rollout demos: `head_fusion` merges a layer's heads by their mean (the paper),
    max or min, rows renormalised; `discard_ratio` zeroes the lowest share of each SA layer's merged weights
    before the residual is added.

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        stage, head_fusion, discard_ratio: as above.

    Returns:
        The heat map [B, g, g].
    """
    stage = rollout_stage(stage)
    return rollouts(model, x, stages=(stage,), head_fusion=head_fusion, discard_ratio=discard_ratio)[stage]


def rollouts(
    model: nn.Module,
    x: torch.Tensor,
    *,
    stages: tuple[str, ...] = ROLLOUT_STAGES,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
) -> dict[str, torch.Tensor]:
    """`rollout` at each of `stages` (current or earlier names) from one forward pass: {stage: [B, g, g]}.

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        stages: the SA stages wanted (ROLLOUT_STAGES).
        head_fusion, discard_ratio: as `rollout`'s.

    Returns:
        stage -> heat map [B, g, g].
    """
    stages = tuple(dict.fromkeys(rollout_stage(s) for s in stages))
    if head_fusion not in HEAD_FUSIONS:
        raise ExplainInputError(f"head_fusion must be one of {', '.join(HEAD_FUSIONS)}, got {head_fusion!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ExplainInputError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    check_input(model, x)
    depth = model.cfg.depth
    with torch.no_grad():
        ins = model.forward_insights(x, sa_layers=tuple(range(depth)), raw_attention="raw" in stages)
        ca = torch.stack([_fuse(attn, head_fusion) for attn in ins.class_attention], dim=1).float()  # [B, L, 1+N]
        ca = ca if head_fusion == "mean" else _normalise_rows(ca)
        return {stage: _rollout_from(ins, ca, stage, head_fusion, discard_ratio) for stage in stages}


def _rollout_from(ins, ca: torch.Tensor, stage: str, fusion: str = "mean", discard: float = 0.0) -> torch.Tensor:
    """`rollout`'s map at `stage` from a forward pass's insights and its head-mean CA rows ca [B, L, 1+N]."""
    # Only class-token rows are ever needed, so push the CA rows' patch parts back through the SA
    # stage, a R_SA = ((a Â_D) Â_D-1) ... Â_1: vector-matrix products, O(D N^2) not O(D N^3).
    through_sa = ca[..., 1:]
    eye = torch.eye(through_sa.shape[-1], device=ca.device, dtype=through_sa.dtype)
    for layer in reversed(range(len(ins.self_attention))):
        a = _discard_lowest(_head_mean_attention(ins, layer, stage, fusion).float(), discard)
        through_sa = through_sa @ _normalise_rows(a + eye)  # (A + I) / 2 once rows are renormalised
    # Class-token row over [cls source, input patches]; patch rows are [0 | R_SA].
    cls_row = torch.zeros_like(ca[:, 0])
    cls_row[:, 0] = 1.0
    for l in range(ca.shape[1]):
        mixed = ca[:, l, :1] * cls_row
        mixed[:, 1:] += through_sa[:, l]
        cls_row = (cls_row + mixed) / 2
    return grid(cls_row[:, 1:])


def gradient_rollout(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Gradient-weighted rollout (Chefer, Gur & Wolf, ICCV 2021, "Generic Attention-model Explainability
    ..."), class token -> patch relevance [B, g, g] for the classes `target` [B].

    The published rule: per attention layer Ā = E_h[(∇A ⊙ A)⁺], ∇A the gradient of the target's logit,
    and R ← R + Ā R from R = I through the layers; the map is the class token's row of R over the patches.
    Adapted to CaiT as `rollout` is. SA stage: A is the softmax the model computes, softmax(proj_l(q kᵀ))
    (rollout's default stage); its gradient passes through proj_w, so the head mixing after the softmax
    is inside ∇A (without talking heads: the published rule). CA stage: A is the class token's attention
    row over [cls, patches]; the patches' rows of Ā are 0 (CA never updates them), so each CA layer adds
    Ā R to the class token's row only, and its patch columns reach the input patches through R_SA.
    ViT-style models (`class_token_at` = t) take the rule as published over [cls, patches] from block t
    on, with R = I over the patches before the class token joins. Cost: one forward and one backward.

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        target: the class explained per image, LongTensor [B] (or one int for all).

    Returns:
        The heat map [B, g, g].
    """
    check_input(model, x)
    target = check_target(model, target, x.shape[0], x.device)
    if model.cfg.global_pool != "token":
        raise ExplainInputError(
            "gradient_rollout reads the class token's row, but this model's head reads the mean patch"
        )
    sa, ca = _gradient_weighted_attention(model, x, target)
    joins = model.cfg.class_token_at
    if joins is None:  # class row [s | p R_SA]: R's patch rows are [0 | R_SA], s scales with (1 + ā_0)
        row = torch.zeros_like(ca[0][:, 1:]) if ca else x.new_zeros(x.shape[0], model.cfg.num_patches)
        for a in ca:
            row = row * (1 + a[:, :1]) + a[:, 1:]
        joins = len(sa)
    else:  # the class token's row of R over [cls, patches] after the last SA block
        row = torch.zeros(x.shape[0], model.cfg.num_patches + 1, device=x.device)
        row[:, 0] = 1.0
    # Only the class row is needed: push it back through the SA layers, r (I + Ā_D) ... (I + Ā_1).
    for k in reversed(range(len(sa))):
        if k == joins - 1 and row.shape[-1] > model.cfg.num_patches:
            row = row[:, 1:]  # before block `joins` there is no class token: its column keeps its share
        row = row + (row[:, None] @ sa[k])[:, 0]
    if row.shape[-1] > model.cfg.num_patches:
        row = row[:, 1:]
    return grid(row)


def _gradient_weighted_attention(
    model: nn.Module, x: torch.Tensor, target: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per SA layer Ā [B, T, T] and per CA layer ā [B, 1+N] (see `gradient_rollout`), from one forward
    and one backward pass."""
    depth, heads = model.cfg.depth, model.cfg.num_heads
    with input_gradients(model), recorded(_attention_points(model)) as seen:
        ins = model.forward_insights(x.clone().requires_grad_(True), sa_layers=tuple(range(depth)))
        score = ins.logits.gather(1, target.view(-1, 1).to(ins.logits.device).clone()).sum()
        keys = [("sa", k) for k in range(depth)] + [("ca", c) for c in range(len(ins.class_attention))]
        grads = torch.autograd.grad(score, [seen[key + ("o",)] for key in keys], allow_unused=True)
    grads = dict(zip(keys, grads))
    sa = []
    for k in range(depth):
        softmax = ins.self_attention[k][0]  # softmax(proj_l(q k^T)) [B, h, T, T]
        C = seen["sa", k, "o"].shape[-1]
        grad = _attention_gradient(
            _or_zero(grads["sa", k], seen["sa", k, "o"]), seen["sa", k, "v"][..., 2 * C :].detach(), heads
        )
        grad = torch.einsum("gh,bgij->bhij", model.blocks[k].attn.mixing_matrices()[1], grad)  # through proj_w
        sa.append((grad * softmax).clamp_min(0).mean(dim=1).float())
    ca = []
    for c, attn in enumerate(ins.class_attention):  # [B, h, 1+N]
        grad = _attention_gradient(_or_zero(grads["ca", c], seen["ca", c, "o"]), seen["ca", c, "v"].detach(), heads)[
            :, :, 0
        ]
        ca.append((grad * attn).clamp_min(0).mean(dim=1).float())
    return sa, ca


def _or_zero(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """An unused tensor's gradient (None from autograd) as the zeros it is."""
    return torch.zeros_like(like) if grad is None else grad


@dataclass
class TalkingHeads:
    """One SA layer's attention at each stage of the talking-heads computation, and the mixing matrices."""

    raw: torch.Tensor  # [B, h, N, N] softmax(q k^T) per head: the counterfactual without mixing
    after_proj_l: torch.Tensor  # [B, h, N, N] softmax(proj_l(q k^T)): logits mixed, then softmax; rows sum to 1
    after_proj_w: torch.Tensor  # [B, h, N, N] proj_w(after_proj_l): what multiplies the values (the model's)
    proj_l: torch.Tensor  # [h, h] mixes the logits before the softmax (out head x in head)
    proj_w: torch.Tensor  # [h, h] mixes the weights after it


def mixing_matrices(model: nn.Module, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(proj_l, proj_w) of SA layer `layer` (0-based), each [heads, heads] (output head x input head);
    identity matrices for a model built with talking_heads=False."""
    depth = model.cfg.depth
    if not 0 <= layer < depth:
        raise ExplainInputError(f"SA layer must be in 0..{depth - 1}, got {layer}")
    return model.blocks[layer].attn.mixing_matrices()


@torch.no_grad()
def talking_heads(model: nn.Module, x: torch.Tensor, layer: int) -> TalkingHeads:
    """Attention of SA layer `layer` (0-based) at every stage of the head mixing, with the mixing weights.

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        layer: the SA layer, from 0.

    Returns:
        `TalkingHeads`: the layer's attention at each stage and its mixing matrices.
    """
    check_input(model, x)
    proj_l, proj_w = mixing_matrices(model, layer)
    ins = model.forward_insights(x, sa_layers=(layer,), raw_attention=True)
    after_proj_l, after_proj_w = ins.self_attention[layer]
    return TalkingHeads(
        raw=ins.raw_self_attention[layer],
        after_proj_l=after_proj_l,
        after_proj_w=after_proj_w,
        proj_l=proj_l,
        proj_w=proj_w,
    )
