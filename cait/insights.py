"""What `CaiT.forward_insights` observes of a forward pass: class attention, residual-branch ratios and the
self-attention around the talking-heads mixing, read with forward hooks on the model's own modules, so that
`CaiT.forward` stays as plain as timm's (no argument threaded through the blocks) and one pass gives both the
logits and what the paper analyses.

The hooks listen only to the thread that opened them: a model shared by several threads (the app's server)
answers the others' plain forwards unobserved."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

# What `forward_insights` keeps of an SA layer instead of its maps: f(softmax after proj_l, weights after proj_w)
SAReduce = Callable[[torch.Tensor, torch.Tensor], Any]


@dataclass
class Insights:
    """What `CaiT.forward_insights` returns; every tensor is detached except `logits`."""

    logits: torch.Tensor  # [B, classes]
    class_attention: tuple[torch.Tensor, ...]  # per CA layer [B, heads, 1+N]; index 0 = class token itself
    residual_ratios: dict[str, torch.Tensor]  # "sa", "ffn": [B, depth]; "ca", "ca_ffn": [B, depth_token_only]
    layerscale: dict[str, torch.Tensor]  # "sa_gamma_1", "sa_gamma_2": [depth, d]; "ca_gamma_1/2": [2, d]
    self_attention: dict[int, Any] = field(default_factory=dict)
    # SA layer -> (softmax(proj_l(q k^T)), then proj_w(that): the weights that multiply the values), each
    # [B, heads, N, N]; only for the layers asked for; with `sa_reduce`, what it made of the two.
    raw_self_attention: dict[int, torch.Tensor] = field(default_factory=dict)
    # SA layer -> softmax(q k^T) per head [B, heads, N, N], without any head mixing: a counterfactual the
    # model never computes (it mixes the logits first), for comparison; only with raw_attention=True.


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, T, C] -> [B, heads, T, C / heads]."""
    B, T, C = t.shape
    return t.reshape(B, T, heads, C // heads).transpose(1, 2)


class _Ratios:
    """One stage's residual ratios as its pass runs: per block the per-token squared norms of the attention and
    MLP branches and of the streams they are added to, written into one buffer [branch or residual, attention
    or MLP, blocks, B, tokens] allocated before the pass. (Small tensors kept alive through a pass fragment the
    allocator's heap, and the pass's own buffers then come back as fresh pages: page faults worth 10-25% of a
    forward at batch 16 on cait_xxs24_224.)"""

    def __init__(self, blocks: int, batch: int, tokens: int, device: torch.device):
        self.squared = torch.zeros(2, 2, blocks, batch, tokens, device=device)
        self.written = [[0, 0], [0, 0]]  # [branch, residual][attention, MLP]: blocks written so far
        self.widths: list[int] = []  # tokens of each block's stream

    def keep(self, residual: bool, mlp: bool, t: torch.Tensor) -> None:
        """Write the per-token squared norms of t [B, T, C], the next block's branch or residual. Not
        `norm(dim=-1)`: the SA stream keeps the patch embedding's channels-first layout, across which torch's
        norm kernel reduces 5-8x slower than a square and a sum."""
        block, width = self.written[residual][mlp], t.shape[1]
        self.written[residual][mlp] = block + 1
        if residual and not mlp:
            self.widths.append(width)
        out = self.squared[int(residual), int(mlp), block, :, :width]
        torch.sum(t.detach().square(), dim=-1, dtype=torch.float32, out=out)

    def branch(self, t: torch.Tensor) -> None:
        """A block's gamma-scaled branch: the attention's first (it catches up with its residual), then the MLP's."""
        self.keep(False, self.written[0][0] == self.written[1][0], t)

    def ratios(self) -> torch.Tensor:
        """[attention or MLP, B, blocks]: each branch's norm over its stream's, per token, averaged over tokens."""
        squared = self.squared[:, :, : len(self.widths)]
        ratio = squared[0].sqrt() / squared[1].sqrt().clamp_min(1e-12)  # [2, blocks, B, tokens]
        width = torch.tensor(self.widths, device=ratio.device)
        valid = torch.arange(ratio.shape[-1], device=ratio.device) < width[:, None, None]  # [blocks, 1, tokens]
        return (torch.where(valid, ratio, 0).sum(-1) / width[:, None]).transpose(1, 2)


class _Observer:
    """The hooks of one `forward_insights` call and what they keep."""

    def __init__(self, sa_layers: tuple[int, ...], raw_attention: bool, sa_reduce: SAReduce | None):
        self.sa_layers, self.raw_attention, self.sa_reduce = set(sa_layers), raw_attention, sa_reduce
        self.thread = threading.get_ident()
        self.class_attention: list[torch.Tensor] = []
        self.self_attention: dict[int, Any] = {}
        self.raw_self_attention: dict[int, torch.Tensor] = {}
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def on(self, module: nn.Module, fn: Callable[..., None], *, pre: bool = False) -> None:
        """Call fn(args, output) (pre=True: fn(args)) on every forward of `module` in this thread."""

        def hook(_module: nn.Module, args: tuple, *output: Any) -> None:
            if threading.get_ident() == self.thread:
                fn(args, *output)

        register = module.register_forward_pre_hook if pre else module.register_forward_hook
        self.handles.append(register(hook))

    def residual(self, block: nn.Module, ratios: _Ratios, *, input_index: int) -> None:
        """The ratios ||gamma-scaled branch output|| / ||residual input||, per token then averaged, of the
        block's attention and MLP branches, read where the block adds them: its drop_path receives each
        gamma-scaled branch in turn (input_index: which of the block's inputs is its residual)."""
        self.on(block, lambda args: ratios.keep(True, False, args[input_index]), pre=True)
        self.on(block.norm2, lambda args: ratios.keep(True, True, args[0]), pre=True)
        self.on(block.drop_path, lambda args: ratios.branch(args[0]), pre=True)

    def self_attention_of(self, layer: int, attn: nn.Module) -> None:
        """Keep SA layer `layer`'s two maps (or what sa_reduce makes of them: a deep model's maps of every layer
        do not fit in memory at once, M48 at 448 px: 3.8 GB an image; their statistics do)."""
        before: dict[str, torch.Tensor] = {}

        def mixed(args: tuple, after: torch.Tensor) -> None:
            pair = before.pop("softmax"), after.detach()
            self.self_attention[layer] = pair if self.sa_reduce is None else self.sa_reduce(*pair)

        self.on(attn.attn_softmax, lambda args, out: before.__setitem__("softmax", out.detach()))
        self.on(attn.attn_mixed, mixed)
        if self.raw_attention:
            self.on(attn.qkv, lambda args, out: self._raw(layer, attn, out))

    def _raw(self, layer: int, attn: nn.Module, qkv: torch.Tensor) -> None:
        q, k, _ = _heads(qkv.detach(), 3 * attn.num_heads).chunk(3, dim=1)
        self.raw_self_attention[layer] = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)

    def class_attention_of(self, attn: nn.Module) -> None:
        """The class token's attention row [B, heads, 1+N] of a CA layer, from its q and k (the model's own
        pass runs the fused kernel, which never forms it)."""
        query: dict[str, torch.Tensor] = {}

        def keys(args: tuple, k: torch.Tensor) -> None:
            q = _heads(query.pop("q").detach(), attn.num_heads)
            row = ((q * attn.scale) @ _heads(k.detach(), attn.num_heads).transpose(-2, -1)).softmax(dim=-1)
            self.class_attention.append(row[:, :, 0])

        self.on(attn.q, lambda args, out: query.__setitem__("q", out))
        self.on(attn.k, keys)


def observe(
    model: nn.Module, x: torch.Tensor, *, sa_layers: tuple[int, ...], raw_attention: bool, sa_reduce: SAReduce | None
) -> Insights:
    """One plain forward of `model` on x with the hooks of `forward_insights` open (see there)."""
    seen = _Observer(sa_layers, raw_attention, sa_reduce)
    patches = (x.shape[-2] // model.cfg.patch_size) * (x.shape[-1] // model.cfg.patch_size)
    sa_tokens = patches + 1  # room for a ViT-style class token (ablations); the CA stage's stream is one token
    stages = (
        _Ratios(len(model.blocks), x.shape[0], sa_tokens, x.device),
        _Ratios(len(model.blocks_token_only), x.shape[0], 1, x.device),
    )
    for i, blk in enumerate(model.blocks):
        seen.residual(blk, stages[0], input_index=0)
        if i in seen.sa_layers:
            seen.self_attention_of(i, blk.attn)
    for blk in model.blocks_token_only:
        seen.residual(blk, stages[1], input_index=1)
        seen.class_attention_of(blk.attn)
    try:
        logits = model(x)
    finally:
        for handle in seen.handles:
            handle.remove()
    (sa, ffn), (ca, ca_ffn) = (stage.ratios() for stage in stages)
    ratios = {"sa": sa, "ffn": ffn, "ca": ca, "ca_ffn": ca_ffn}
    return Insights(
        logits=logits,
        class_attention=tuple(seen.class_attention),
        residual_ratios=ratios,
        layerscale=model.layerscale(),
        self_attention=seen.self_attention,
        raw_self_attention=seen.raw_self_attention,
    )
