"""What matters for a prediction, not only where CaiT looks: direct logit attribution of every
class-attention head (and of each patch it read), knockouts of whole blocks, and ablations of one head.

CaiT makes this clean: the class token meets the image only in the class-attention (CA) blocks, so the
final class token is its initial state plus a short sum of writes (each CA head through its share of the
output projection, each CA MLP, biases). With the final LayerNorm linearised at the actual input (its
mean and scale taken from the real class token) the target logit is exactly the sum of those writes.
Layers and heads are indexed from 0 here, as in every array.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Literal, Sequence

import torch
from torch import nn

from ._checks import ExplainInputError, check_class_stage, check_input, check_target
from ._stage import ClassStage, class_stage, evaluating, grid, sa_states, target_difference
from .hooks import on_inputs, recorded, silenced

Branch = Literal["both", "attn", "mlp"]
BRANCH_GAMMAS = {"both": ("gamma_1", "gamma_2"), "attn": ("gamma_1",), "mlp": ("gamma_2",)}


# ----------------------------------------------------------------------------------------------------
# direct logit attribution


@dataclass
class LogitAttribution:
    """The target logit split into additive writes to the final class token (all [B, ...])."""

    logits: torch.Tensor  # [B, K] the model's logits
    target: torch.Tensor  # [B] the attributed class
    heads: torch.Tensor  # [B, L, heads]: each CA head's write through its gamma_1-scaled share of attn.proj
    patches: torch.Tensor  # [B, L, heads, N]: a head's write split over the patch values it mixed
    self_read: torch.Tensor  # [B, L, heads]: the part of a head's write from the class token's own value
    mlp: torch.Tensor  # [B, L]: each CA block's MLP write (gamma_2-scaled)
    class_token: torch.Tensor  # [B]: the learned initial class token's share (the same vector for every image)
    biases: torch.Tensor  # [B]: the CA blocks' attn.proj biases, the final norm's shift and the head's bias

    @property
    def rest(self) -> torch.Tensor:
        """Everything but the heads [B]: the initial class token, the MLP writes and the biases."""
        return self.class_token + self.mlp.sum(1) + self.biases

    def parts(self) -> dict[str, torch.Tensor]:
        """The logit's parts [B] each, in the order the class token receives them (they add up to the logit):
        the initial class token, then per CA layer its heads' and its MLP's writes, then the biases."""
        out = {"class token": self.class_token}
        for layer in range(self.heads.shape[1]):
            out[f"CA{layer + 1} heads"] = self.heads[:, layer].sum(-1)
            out[f"CA{layer + 1} MLP"] = self.mlp[:, layer]
        return {**out, "biases": self.biases}

    @property
    def patch_maps(self) -> torch.Tensor:
        """`patches` on the patch grid [B, L, heads, g, g] (what a head contributed, where it read it)."""
        return grid(self.patches)

    @property
    def total(self) -> torch.Tensor:
        """Sum of the parts [B]: the target logit up to float error."""
        return self.heads.sum((1, 2)) + self.rest


def _readout(model: nn.Module, z: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(r [B, d], c [B]) with logit = r . z + c for the pre-norm class token z [B, d] and every vector
    summing to z: the final LayerNorm with its mean removal (linear) kept and its scale frozen at z's."""
    norm, head = model.norm, model.head
    sigma = (z.var(dim=-1, unbiased=False) + norm.eps).sqrt()
    u = head.weight[target] * norm.weight
    r = (u - u.mean(dim=-1, keepdim=True)) / sigma[:, None]
    return r, (head.weight[target] * norm.bias).sum(-1) + head.bias[target]


def _record_class_stage(
    model: nn.Module, x: torch.Tensor, sa_layers: tuple[int, ...] = (), sa_reduce=None
) -> tuple[object, dict]:
    """forward_insights (with the SA attention of `sa_layers`, or what `sa_reduce` keeps of it) with hooks
    reading, per CA block, the values (attn.v), the concatenated head outputs (attn.proj's input) and the MLP
    output, and the class token entering the final norm."""
    points: dict[object, tuple[nn.Module, bool]] = {"z": (model.norm, True)}
    for i, blk in enumerate(model.blocks_token_only):
        points.update({("v", i): (blk.attn.v, False), ("o", i): (blk.attn.proj, True), ("mlp", i): (blk.mlp, False)})
    with recorded(points) as seen:
        ins = model.forward_insights(x, sa_layers=sa_layers, sa_reduce=sa_reduce)
    return ins, seen


def direct_logit_attribution(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> LogitAttribution:
    """Split each image's target logit into the writes of every CA head (and per patch), the MLPs and the
    rest, the final norm linearised at the actual input so that `heads.sum((1, 2)) + rest` is the logit.

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        target: the class explained per image, LongTensor [B] (or one int for all).

    Returns:
        `LogitAttribution`: .heads [B, L, heads], .patches, .mlp, .rest, .parts(), .total.
    """
    check_input(model, x)
    check_class_stage(model)
    target = check_target(model, target, x.shape[0], x.device)
    with evaluating(model):
        ins, seen = _record_class_stage(model, x)
        return _attribute(model, ins, seen, target)


def predicted_attribution(
    model: nn.Module,
    x: torch.Tensor,
    *,
    sa_layers: tuple[int, ...] = (),
    sa_reduce=None,
    target: torch.Tensor | Sequence[int] | int | None = None,
) -> tuple[object, LogitAttribution]:
    """One forward pass: its `Insights` (class-attention maps, residual-branch ratios, the SA attention of
    `sa_layers` or what `sa_reduce` keeps of it, see `CaiT.forward_insights`) and the direct logit attribution
    to each image's predicted class (or to `target`, as `direct_logit_attribution` takes it), for views that
    need both and can afford only one pass."""
    check_input(model, x)
    check_class_stage(model)
    if target is not None:
        target = check_target(model, target, x.shape[0], x.device)
    with evaluating(model):
        ins, seen = _record_class_stage(model, x, sa_layers, sa_reduce)
        return ins, _attribute(model, ins, seen, ins.logits.argmax(-1) if target is None else target)


def _attribute(model: nn.Module, ins, seen: dict, target: torch.Tensor) -> LogitAttribution:
    """`direct_logit_attribution` from a recorded pass (`_record_class_stage`)."""
    r, const = _readout(model, seen["z"][:, 0], target)
    B, heads = target.shape[0], model.cfg.num_heads
    class_token = (model.cls_token[0, 0] * r).sum(-1)
    per_head, per_patch, self_read, mlp, biases = [], [], [], [], const
    for i, blk in enumerate(model.blocks_token_only):
        q = blk.gamma_1 * r  # [B, d]: what the class token's change must align with
        direction = (q @ blk.attn.proj.weight).view(B, heads, -1)  # [B, heads, dh]: per head, proj^T q
        o = seen["o", i][:, 0].view(B, heads, -1)
        per_head.append((direction * o).sum(-1))
        v = seen["v", i].view(B, -1, heads, direction.shape[-1])  # [B, 1+N, heads, dh]
        token = ins.class_attention[i] * torch.einsum("bjhc,bhc->bhj", v, direction)  # [B, heads, 1+N]
        self_read.append(token[..., 0])
        per_patch.append(token[..., 1:])
        mlp.append(((blk.gamma_2 * seen["mlp", i][:, 0]) * r).sum(-1))
        biases = biases + (q * blk.attn.proj.bias).sum(-1)
    return LogitAttribution(
        logits=ins.logits.detach(),
        target=target,
        heads=torch.stack(per_head, dim=1),
        patches=torch.stack(per_patch, dim=1),
        self_read=torch.stack(self_read, dim=1),
        mlp=torch.stack(mlp, dim=1),
        class_token=class_token,
        biases=biases,
    )


# ----------------------------------------------------------------------------------------------------
# cached states, knockouts of whole blocks


@contextmanager
def _knocked_out(block: nn.Module, branch: Branch) -> Iterator[None]:
    """While open, `block`'s `branch` (attention, MLP or both) writes nothing, as with its gammas set to 0
    (gamma * 0 == 0 * branch == 0): its module answers zeros, on this thread's passes only (`hooks`), so that
    the model stays as it is for any other thread (the parameters a functional_call swaps are everyone's)."""
    parts = {"attn": (block.attn,), "mlp": (block.mlp,), "both": (block.attn, block.mlp)}[branch]
    with ExitStack() as stack:
        for part in parts:
            stack.enter_context(silenced(part))
        yield


def _knock(block: nn.Module, branch: Branch, *args: torch.Tensor) -> torch.Tensor:
    """The block's output with `branch` removed; gamma = 0 makes a whole block the identity (x + 0 * branch
    == x exactly), so then it need not run at all."""
    if branch == "both":
        return args[-1]
    with _knocked_out(block, branch):
        return block(*args)


@contextmanager
def recorded_sa_inputs(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """While open, the forward pass of `model` that runs inside keeps the tokens entering every SA block and,
    last, the tokens leaving the SA stage; the yielded list holds them once closed. They are what
    `knockout_profile` takes as `sa_inputs`, so a caller that makes a pass anyway spares the knockouts theirs."""
    check_class_stage(model)
    points = {k: (blk, True) for k, blk in enumerate(model.blocks)}
    points[len(model.blocks)] = (model.blocks_token_only[0], True)  # its first input: the SA stage's output
    inputs: list[torch.Tensor] = []
    with recorded(points) as seen:
        yield inputs
    if len(seen) != len(points):
        raise ExplainInputError("recorded_sa_inputs: no forward pass of the model ran while it was open")
    inputs[:] = [seen[k] for k in range(len(points))]


def block_names(model: nn.Module) -> list[str]:
    """Parameter prefixes of every block in model order, SA first ("blocks.0", ..., "blocks_token_only.1")."""
    return [f"blocks.{k}" for k in range(len(model.blocks))] + [
        f"blocks_token_only.{c}" for c in range(len(model.blocks_token_only))
    ]


def _checked_sa_inputs(model: nn.Module, x: torch.Tensor, sa_inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`sa_inputs` as a list, refused unless it has one state per SA block and the stage's output, each for
    every image of x."""
    expected = len(model.blocks) + 1
    if len(sa_inputs) != expected or any(s.shape[0] != x.shape[0] for s in sa_inputs):
        shapes = [tuple(s.shape) for s in sa_inputs]
        raise ExplainInputError(f"sa_inputs must be {expected} states of {x.shape[0]} images each, got {shapes}")
    return list(sa_inputs)


def _sa_knockout_logits(model: nn.Module, inputs: list[torch.Tensor], k: int, branch: Branch) -> torch.Tensor:
    """Logits with SA block k knocked out: from its cached input, only the blocks after it run."""
    x = _knock(model.blocks[k], branch, inputs[k])
    return model.forward_head(model.forward_class_attention(model.forward_sa_blocks(x, start=k + 1)))


def _ca_knockout_logits(model: nn.Module, states: ClassStage, c: int, branch: Branch) -> torch.Tensor:
    blk, cls = model.blocks_token_only[c], states.cls_inputs[c]
    cls = _knock(blk, branch, states.tokens, cls)
    return model.forward_head(model.forward_class_attention(states.tokens, start=c + 1, cls=cls))


def knockout_profile(
    model: nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    *,
    branch: Branch = "both",
    shared_prefix: bool = True,
    on_block: Callable[[int, int], None] | None = None,
    sa_inputs: Sequence[torch.Tensor] | None = None,
    knocked: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Change of the target logit [B, SA depth + CA depth] when block k's residual branches are removed
    (gamma_1 = gamma_2 = 0; branch="attn" / "mlp": only one of them), blocks in model order, SA first.

    Each prefix runs once: one forward caches every block's input, then knocking out block k re-runs only
    the blocks after it (a CA knockout only the rest of the class stage); shared_prefix=False runs the
    whole model once per block instead (the reference). sa_inputs, the SA states of a pass already made on
    x (`recorded_sa_inputs`), replaces that first forward. on_block(done, total) is called after each
    block's knockout (progress; an exception it raises stops the work). knocked, a list, receives each block's
    knocked-out logits [B, K] as they are done; blocks it holds already (from a call on the same x that was
    stopped) are not run again, so a stopped profile resumes where it stopped.

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        target: the class explained per image, LongTensor [B] (or one int for all).
        branch: which branches a knockout removes: both, attn or mlp.
        shared_prefix, on_block, sa_inputs, knocked: as above.

    Returns:
        The target logit's change [B, SA depth + CA depth], blocks in model order.
    """
    check_input(model, x)
    check_class_stage(model)
    target = check_target(model, target, x.shape[0], x.device).view(-1, 1)
    if branch not in BRANCH_GAMMAS:
        raise ExplainInputError(f"branch must be one of {', '.join(BRANCH_GAMMAS)}, got {branch!r}")
    if sa_inputs is not None and not shared_prefix:
        raise ExplainInputError("sa_inputs replaces the shared prefix's forward; shared_prefix=False runs none")
    total = len(model.blocks) + len(model.blocks_token_only)

    def done(out: torch.Tensor, knocked: list[torch.Tensor]) -> None:
        knocked.append(out)
        if on_block is not None:
            on_block(len(knocked), total)

    knocked = [] if knocked is None else knocked
    if len(knocked) > total or any(out.shape[0] != x.shape[0] for out in knocked):
        raise ExplainInputError(f"knocked holds {len(knocked)} results, of a batch other than x's or too many")
    depth = len(model.blocks)
    with evaluating(model):
        if shared_prefix:
            inputs = sa_states(model, x) if sa_inputs is None else _checked_sa_inputs(model, x, sa_inputs)
            for k in range(len(knocked), depth):
                done(_sa_knockout_logits(model, inputs, k, branch), knocked)
            states = class_stage(model, inputs[-1])
            base = states.logits
            for c in range(len(knocked) - depth, len(model.blocks_token_only)):
                done(_ca_knockout_logits(model, states, c, branch), knocked)
        else:
            base = model(x)
            for name in block_names(model)[len(knocked) :]:
                with _knocked_out(model.get_submodule(name), branch):
                    done(model(x), knocked)
        return torch.stack([(out - base).gather(1, target)[:, 0] for out in knocked], dim=1)


# ----------------------------------------------------------------------------------------------------
# head ablation


HeadSet = tuple[tuple[int, int], ...]  # CA heads as (layer, head), both 0-based


@dataclass
class HeadAblation:
    """Logits before and after a set of CA heads' outputs are replaced (by zero or by their reference mean)."""

    heads: HeadSet  # the ablated (layer, head) pairs, sorted
    before: torch.Tensor  # [B, K]
    after: torch.Tensor  # [B, K]

    def delta(self, target: torch.Tensor) -> torch.Tensor:
        """Change of the target logit [B] (target: LongTensor [B]) the ablation causes."""
        return target_difference(self.after, self.before, target)

    def top(self, k: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
        """(probabilities, classes) [B, k] of the k most probable classes after the ablation."""
        return self.after.float().softmax(-1).topk(min(k, self.after.shape[-1]), dim=-1)


def mean_head_outputs(model: nn.Module, reference: torch.Tensor) -> torch.Tensor:
    """Mean over the reference images of every CA head's output, the input of attn.proj [L, d] (heads
    concatenated): what a mean ablation puts in place of a head."""
    check_input(model, reference, name="reference")
    check_class_stage(model)
    with evaluating(model):
        _, seen = _record_class_stage(model, reference)
        return torch.stack([seen["o", i][:, 0].mean(0) for i in range(len(model.blocks_token_only))])


@contextmanager
def _without_heads(blk: nn.Module, heads: list[int], fills: torch.Tensor | None) -> Iterator[None]:
    """While open, the outputs of `heads` in CA block `blk` are replaced where attn.proj receives them (heads
    concatenated) by fills [heads, dh] of the layer (None: zero), so the block runs unchanged otherwise; on this
    thread's passes only (`hooks`)."""
    width = blk.attn.proj.in_features // blk.attn.num_heads

    def replaced(module: nn.Module, args: tuple) -> tuple:
        o = args[0].clone()
        for head in heads:
            o[..., head * width : (head + 1) * width] = 0 if fills is None else fills[head]
        return (o, *args[1:])

    with on_inputs(blk.attn.proj, replaced):
        yield


def _fills(model: nn.Module, reference: torch.Tensor | None) -> torch.Tensor | None:
    """Per CA layer and head the replacement of its output [L, heads, dh] (None: zero ablation)."""
    if reference is None:
        return None
    return mean_head_outputs(model, reference).view(len(model.blocks_token_only), model.cfg.num_heads, -1)


def _ablated_logits(model: nn.Module, states: ClassStage, heads: HeadSet, fills: torch.Tensor | None):
    """Logits with every (layer, head) of `heads` removed, the CA stage re-run from the first such layer."""
    layers = sorted({layer for layer, _ in heads})
    cls = states.cls_inputs[layers[0]]
    for c in range(layers[0], len(model.blocks_token_only)):
        blk = model.blocks_token_only[c]
        removed = [h for layer, h in heads if layer == c]
        if removed:
            with _without_heads(blk, removed, None if fills is None else fills[c]):
                cls = blk(states.tokens, cls)
        else:
            cls = blk(states.tokens, cls)
    return model.forward_head(model.forward_class_attention(states.tokens, start=len(model.blocks_token_only), cls=cls))


def _head_set(model: nn.Module, heads, layer: int | None, head: int | None) -> HeadSet:
    """The checked, sorted set of CA heads from `heads` or from the single `layer`, `head`."""
    if heads is None and layer is not None and head is not None:
        heads = [(layer, head)]
    elif heads is None or layer is not None or head is not None:
        raise ExplainInputError("give the CA heads to ablate as heads=[(layer, head), ...] (or one as layer=, head=)")
    depth, width = len(model.blocks_token_only), model.cfg.num_heads
    pairs = tuple(sorted({(int(c), int(h)) for c, h in heads}))
    bad = [p for p in pairs if not (0 <= p[0] < depth and 0 <= p[1] < width)]
    if bad or not pairs:
        raise ExplainInputError(
            f"heads: no CA head {bad[0] if bad else '(none given)'}: {depth} layers of {width} heads"
        )
    return pairs


def head_ablation(
    model: nn.Module,
    x: torch.Tensor,
    *,
    heads: Iterable[tuple[int, int]] | None = None,
    layer: int | None = None,
    head: int | None = None,
    reference: torch.Tensor | None = None,
) -> HeadAblation:
    """Logits with the CA heads `heads` ([(layer, head), ...], 0-based) removed together: their outputs
    set to zero, or with a reference batch of images to each head's mean output over them (mean
    ablation). `layer=, head=` names a single head. The SA stage runs once.

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        heads: the CA heads [(layer, head), ...], from 0; or layer= and head= for one.
        reference: images whose mean head outputs replace the heads (None: zero).

    Returns:
        `HeadAblation`: .before, .after logits [B, K], .delta(target), .top(k).
    """
    check_input(model, x)
    check_class_stage(model)
    pairs = _head_set(model, heads, layer, head)
    fills = _fills(model, reference)
    with evaluating(model):
        states = class_stage(model, model.forward_self_attention(x))
        after = _ablated_logits(model, states, pairs, fills)
    return HeadAblation(heads=pairs, before=states.logits, after=after)


def all_head_ablations(model: nn.Module, x: torch.Tensor, *, reference: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [B, L, heads, K] with each CA head removed in turn (as `head_ablation`), the SA stage run once.

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).
        reference: as `head_ablation`'s.

    Returns:
        Logits [B, CA layers, heads, K], one head removed at a time.
    """
    check_input(model, x)
    check_class_stage(model)
    fills = _fills(model, reference)
    with evaluating(model):
        states = class_stage(model, model.forward_self_attention(x))
        rows = [
            torch.stack([_ablated_logits(model, states, ((i, h),), fills) for h in range(model.cfg.num_heads)], dim=1)
            for i in range(len(model.blocks_token_only))
        ]
    return torch.stack(rows, dim=1)


def block_gamma_mean_abs(model: nn.Module, *, branch: Branch = "both") -> torch.Tensor:
    """Mean |gamma| of every block [SA depth + CA depth] in model order, over the entries of the gammas a
    knockout of `branch` zeroes (`BRANCH_GAMMAS`: both, gamma_1 for attention, gamma_2 for the MLP):
    LayerScale's own say on how much a block's branches write."""
    if branch not in BRANCH_GAMMAS:
        raise ExplainInputError(f"branch must be one of {', '.join(BRANCH_GAMMAS)}, got {branch!r}")
    ls = model.layerscale()
    return torch.cat(
        [torch.cat([ls[f"{s}_{g}"] for g in BRANCH_GAMMAS[branch]], dim=1).abs().mean(dim=1) for s in ("sa", "ca")]
    )
