"""How a CaiT prediction forms along depth: a logit lens through the model's own class-attention stage,
and activation patching between a clean and a corrupted image (per patch region: `token_patching`).

CaiT's split gives both an exact form. The class-attention (CA) stage reads the patch tokens the
self-attention (SA) stage leaves, so it can read them after any SA block instead: the lens needs no
trained probe and no guess of an unembedding. And the CA stage writes only the class token, so patching
its stream means patching the class token alone while the patch tokens it reads stay the corrupted ones.
Layers, heads and blocks are indexed from 0, blocks in model order (SA first), as everywhere in arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch
from torch import nn

from ._checks import ExplainInputError, check_class_stage, check_input, check_target
from ._stage import ClassStage, class_stage, evaluating, sa_states, target_difference
from .hooks import recorded, substituted

Granularity = Literal["block", "head"]
GRANULARITIES = ("block", "head")


def logit_lens(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Logits [B, SA depth + 1, classes]: entry k is what the model would answer if its CA stage, final norm
    and head read the patch tokens after SA block k - 1 (k = 0: the patch embedding with the position
    embedding, the SA stage's input), so the last entry is the model's own logits.

    The SA stage runs once (its stream kept after every block); the CA stage then runs on all depths at
    once, as one batch of (SA depth + 1) x B token sets. ViT-style models (`class_token_at` set) have no
    CA stage to read through and are refused.

    Args:
        model: a CaiT from `cait.load_model`.
        x: a normalised batch [B, C, H, W] (`cait.preprocess.normalise`).

    Returns:
        Logits [B, SA depth + 1, classes].
    """
    check_input(model, x)
    check_class_stage(model)
    with evaluating(model):
        states = sa_states(model, x)
        logits = model.forward_head(model.forward_class_attention(torch.cat(states)))
    return logits.view(len(states), x.shape[0], -1).transpose(0, 1)


def answer_forms_at(agreement: Sequence[float], *, most: float = 0.5) -> int | None:
    """Where the answer forms along the lens: the first entry k from which the lens's top-1 agrees with the
    final prediction (agreement [SA depth + 1]: 0/1 for one image, or the share of images) above `most` at
    every later entry too; None if even the last does not (a share of images at most `most`)."""
    for k in range(len(agreement)):
        if all(a > most for a in agreement[k:]):
            return k
    return None


# ----------------------------------------------------------------------------------------------------
# activation patching


@dataclass
class Patching:
    """Activation patching: each entry is the corrupted run's target logit with one component's output
    replaced by the clean run's, minus the corrupted run's target logit (what the component restores).
    No entry is true by construction: the whole stream after an SA block, or the class token after the last
    CA block, restores the whole gap by definition, so it is not an entry (`gap` is that orientation)."""

    target: torch.Tensor  # [B] the class whose logit is measured
    clean: torch.Tensor  # [B, K] the clean run's logits
    corrupted: torch.Tensor  # [B, K] the corrupted run's logits
    class_token: torch.Tensor | None  # [B, CA depth - 1] the class token after each CA block but the last ("block")
    branches: torch.Tensor | None  # [B, SA + CA depth, 2] each block's attention, MLP branch ("block")
    heads: torch.Tensor | None  # [B, CA depth, heads] each CA head's output before attn.proj ("head")

    @property
    def gap(self) -> torch.Tensor:
        """Clean minus corrupted target logit [B]: what patching the whole stream restores, by construction."""
        return target_difference(self.clean, self.corrupted, self.target)


@dataclass
class _Run:
    """One forward pass's states: the SA stream before every block (and last after the stage), the CA
    stage's class tokens, and every block's branch outputs and CA head outputs under (stage, i, name)."""

    sa: list[torch.Tensor]
    ca: ClassStage
    seen: dict


def _run(model: nn.Module, x: torch.Tensor) -> _Run:
    points: dict[object, tuple[nn.Module, bool]] = {}
    for stage, blocks in (("sa", model.blocks), ("ca", model.blocks_token_only)):
        for i, blk in enumerate(blocks):
            points.update({(stage, i, "attn"): (blk.attn, False), (stage, i, "mlp"): (blk.mlp, False)})
    for c, blk in enumerate(model.blocks_token_only):
        points["ca", c, "heads"] = (blk.attn.proj, True)
    with recorded(points) as seen:
        sa = sa_states(model, x)
        ca = class_stage(model, sa[-1])
    return _Run(sa, ca, dict(seen))


def _from_ca(model: nn.Module, tokens: torch.Tensor, cls: torch.Tensor, start: int) -> torch.Tensor:
    """Logits from the class token `cls` entering CA block `start`, reading the patch tokens `tokens`."""
    return model.forward_head(model.forward_class_attention(tokens, start=start, cls=cls))


def _patched_branch(model: nn.Module, clean: _Run, corrupted: _Run, stage: str, i: int, part: str) -> torch.Tensor:
    """Logits of the corrupted run with block i's `part` ("attn", "mlp") output taken from the clean run:
    from the block's cached corrupted input, only the block and what follows it run."""
    blk = (model.blocks if stage == "sa" else model.blocks_token_only)[i]
    with substituted(getattr(blk, part), clean.seen[stage, i, part]):
        if stage == "sa":
            out = blk(corrupted.sa[i])
        else:
            out = blk(corrupted.ca.tokens, corrupted.ca.cls_inputs[i])
    if stage == "sa":
        return model.forward_head(model.forward_class_attention(model.forward_sa_blocks(out, start=i + 1)))
    return _from_ca(model, corrupted.ca.tokens, out, i + 1)


def _patched_head(model: nn.Module, clean: _Run, corrupted: _Run, c: int, head: int) -> torch.Tensor:
    """Logits of the corrupted run with CA head (c, head)'s output (its slice of attn.proj's input) clean."""
    blk, width = model.blocks_token_only[c], model.cfg.embed_dim // model.cfg.num_heads
    cols = slice(head * width, (head + 1) * width)
    o = corrupted.seen["ca", c, "heads"].clone()
    o[..., cols] = clean.seen["ca", c, "heads"][..., cols]
    with substituted(blk.attn.proj, o, pre=True):
        cls = blk(corrupted.ca.tokens, corrupted.ca.cls_inputs[c])
    return _from_ca(model, corrupted.ca.tokens, cls, c + 1)


def _block_profiles(model: nn.Module, clean: _Run, corrupted: _Run) -> tuple[list, list]:
    """(class token, branches) logits: after each CA block but the last, and per block in model order (see
    `activation_patching`)."""
    sa, ca = len(model.blocks), len(model.blocks_token_only)
    streams = [_from_ca(model, corrupted.ca.tokens, clean.ca.cls_inputs[c + 1], c + 1) for c in range(ca - 1)]
    parts = [("sa", k) for k in range(sa)] + [("ca", c) for c in range(ca)]
    branches = [[_patched_branch(model, clean, corrupted, s, i, p) for p in ("attn", "mlp")] for s, i in parts]
    return streams, branches


def activation_patching(
    model: nn.Module,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    target: torch.Tensor,
    *,
    granularity: Granularity = "block",
) -> Patching:
    """What each component of the clean run restores in the corrupted one: the corrupted run's target
    logit with that component's output replaced by the clean run's, minus the corrupted run's (`Patching`).

    granularity="block" gives `.branches`, each block's attention and MLP branch output alone (LayerScale's
    gamma applies to the patched output as in both runs), and `.class_token`, the stream after each CA block
    but the last: the class token only, while the patch tokens the later CA blocks read stay the corrupted
    run's (the CA stage never changes them). The whole stream after an SA block (every patch token) or after
    the last CA block restores the whole gap by construction, so it is no entry; where along the image the
    patch tokens carry the answer is `token_patching`'s question.
    granularity="head" gives `.heads`, each CA head's output (its slice of attn.proj's input).

    Both runs' states are cached once; a patch re-runs only what follows the patched component (an SA
    branch: the rest of its block and the blocks after it; a CA component: the rest of the class stage)."""
    if granularity not in GRANULARITIES:
        raise ExplainInputError(f"granularity must be one of {', '.join(GRANULARITIES)}, got {granularity!r}")
    check_input(model, clean, name="clean")
    check_input(model, corrupted, name="corrupted")
    check_class_stage(model)
    if clean.shape[0] != corrupted.shape[0]:
        raise ExplainInputError(
            f"corrupted: need one corrupted image per clean one, got {corrupted.shape[0]} for {clean.shape[0]}"
        )
    target = check_target(model, target, clean.shape[0], clean.device)
    with evaluating(model):
        runs = _run(model, clean), _run(model, corrupted)
        base = runs[1].ca.logits.gather(1, target.view(-1, 1))

        def restored(logits: list[torch.Tensor]) -> torch.Tensor:
            return torch.stack([out.gather(1, target.view(-1, 1))[:, 0] for out in logits], dim=1) - base

        class_token = branches = heads = None
        if granularity == "block":
            streams, parts = _block_profiles(model, *runs)
            class_token = restored(streams) if streams else base.new_zeros(len(target), 0)
            branches = torch.stack([restored(p) for p in parts], dim=1)
        else:
            heads = torch.stack(
                [
                    restored([_patched_head(model, *runs, c, h) for h in range(model.cfg.num_heads)])
                    for c in range(len(model.blocks_token_only))
                ],
                dim=1,
            )
    return Patching(target, runs[0].ca.logits, runs[1].ca.logits, class_token, branches, heads)
