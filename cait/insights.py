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


class _Observer:
    """The hooks of one `forward_insights` call and what they keep."""

    def __init__(self, sa_layers: tuple[int, ...], raw_attention: bool, sa_reduce: SAReduce | None):
        self.sa_layers, self.raw_attention, self.sa_reduce = set(sa_layers), raw_attention, sa_reduce
        self.thread = threading.get_ident()
        self.ratios: dict[str, list[torch.Tensor]] = {"sa": [], "ffn": [], "ca": [], "ca_ffn": []}
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

    def residual(self, block: nn.Module, kinds: tuple[str, str], *, input_index: int) -> None:
        """The ratios ||gamma-scaled branch output|| / ||residual input||, per token then averaged, of the
        block's attention and MLP branches, read where the block adds them: its drop_path receives each
        gamma-scaled branch in turn (input_index: which of the block's inputs is its residual)."""
        stream: list[torch.Tensor] = []

        def branch(args: tuple) -> None:
            residual = stream[-1].detach()
            r = args[0].detach().norm(dim=-1) / residual.norm(dim=-1).clamp_min(1e-12)
            self.ratios[kinds[len(stream) - 1]].append(r.mean(dim=1))

        self.on(block, lambda args: stream.__setitem__(slice(None), [args[input_index]]), pre=True)
        self.on(block.norm2, lambda args: stream.append(args[0]), pre=True)
        self.on(block.drop_path, branch, pre=True)

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
    for i, blk in enumerate(model.blocks):
        seen.residual(blk, ("sa", "ffn"), input_index=0)
        if i in seen.sa_layers:
            seen.self_attention_of(i, blk.attn)
    for blk in model.blocks_token_only:
        seen.residual(blk, ("ca", "ca_ffn"), input_index=1)
        seen.class_attention_of(blk.attn)
    try:
        logits = model(x)
    finally:
        for handle in seen.handles:
            handle.remove()
    ratios = {k: torch.stack(v, dim=1) if v else x.new_zeros(x.shape[0], 0) for k, v in seen.ratios.items()}
    return Insights(
        logits=logits,
        class_attention=tuple(seen.class_attention),
        residual_ratios=ratios,
        layerscale=model.layerscale(),
        self_attention=seen.self_attention,
        raw_self_attention=seen.raw_self_attention,
    )
