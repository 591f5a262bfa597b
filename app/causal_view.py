"""The Causal tab's numbers and figures as plain functions (no Gradio): for one image and one class, each
class-attention head's direct logit attribution (and per patch, beside the head's attention), the
knockout profile over depth with |gamma| per block, and what removing one head does to the top-5.

All of it runs in fp32 whatever the session's precision: it subtracts logits, which bf16 blurs."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image

from app.choices import top_classes
from app.figures import image_under
from app.models import LoadedModel
from cait import explain
from cait.data.image_file import read_image
from cait.explain import hooks
from cait.explain.causal import BRANCH_GAMMAS, block_gamma_mean_abs
from cait.figures import head_name
from cait.figures.causal import head_attribution_plotly, knockout_plotly
from cait.figures.colours import signed_heatmap
from cait.preprocess import model_view, view_tensor

ABLATIONS = ("zero", "mean over the example images")
KNOCKOUTS = {"whole block": "both", "attention branch": "attn", "MLP branch": "mlp"}  # what a knockout removes


@dataclass
class CausalView:
    """One image's causal numbers for class `target` (arrays from 0; the page numbers from 1)."""

    target: int
    logit: float  # the target logit
    heads: np.ndarray  # [L, heads] direct logit attribution of each CA head
    patches: np.ndarray  # [L, heads, g, g] each head's attribution split over the patches it read
    self_read: np.ndarray  # [L, heads] the part a head wrote from the class token's own value
    mlp: np.ndarray  # [L] each CA block's MLP write
    removal: np.ndarray  # [L, heads] the target logit's change when the head is zero-ablated (its total effect)
    removal_top1: np.ndarray  # [L, heads] the top-1 class with the head zero-ablated
    parts: dict[str, float]  # the logit's parts in the order the class token receives them (heads, MLPs, ...)
    knockout: np.ndarray  # [SA depth + CA depth] target-logit change with the block's gammas zeroed
    gamma: dict[str, np.ndarray]  # branch (BRANCH_GAMMAS) -> [SA depth + CA depth] mean |gamma| of what it zeroes


@dataclass
class Partial:
    """What the computation of one image's view for one class has done so far: kept when it stops, so that it
    resumes from there (the attribution, the head ablations, each block's knockout) rather than from zero."""

    target: int
    attribution: Any = None  # explain.LogitAttribution, once computed
    ablated: torch.Tensor | None = None  # [L, heads, K] logits with each CA head removed, once computed
    knocked: list[torch.Tensor] = field(default_factory=list)  # each block's knocked-out logits [1, K] so far
    view: CausalView | None = None  # once finished


class Kept:
    """The views computed or begun, per model, image and class: a view asked again (the tab opened again after
    a Stop, the same image picked again) resumes or is answered at once. At most `size`, the oldest dropped;
    thread-safe."""

    def __init__(self, size: int = 8) -> None:
        self.size, self._kept, self._lock = size, OrderedDict(), threading.Lock()

    def of(self, choice: Any, x: torch.Tensor, target: int) -> Partial:
        """The view of image x [1, C, H, W] for `target` by the model of `choice`, as far as it is done."""
        key = (choice, hashlib.sha1(x.detach().cpu().float().numpy().tobytes()).hexdigest(), int(target))
        with self._lock:
            partial = self._kept.setdefault(key, Partial(int(target)))
            self._kept.move_to_end(key)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return partial


def compute(
    model: torch.nn.Module,
    x: torch.Tensor,
    target: int,
    *,
    on_block: Callable[[int, int], None] | None = None,
    on_first_phase: Callable[[int, int], None] | None = None,
    partial: Partial | None = None,
) -> CausalView:
    """Direct logit attribution and knockout profile of one image x [1, C, H, W] for class `target`, in two
    phases: the attribution and the head ablations (on_first_phase(SA block runs done, of how many) as they
    run), then each block's knockout (on_block(done, total) after each, `explain.knockout_profile`).
    `partial` (of this x and target) keeps what is done as it is done, and what it holds is not done again."""
    partial = Partial(int(target)) if partial is None else partial
    if partial.view is not None:
        return partial.view
    t = torch.tensor([int(target)], device=x.device)
    sa_inputs = _first_phase(model, x, t, partial, on_first_phase)
    if on_block is not None:  # the second phase begins: where its knockouts stand
        on_block(len(partial.knocked), len(model.blocks) + len(model.blocks_token_only))
    knockout = explain.knockout_profile(model, x, t, on_block=on_block, sa_inputs=sa_inputs, knocked=partial.knocked)
    dla, ablated = partial.attribution, partial.ablated
    numpy = lambda v: v[0].float().cpu().numpy()  # noqa: E731
    partial.view = CausalView(
        target=int(target),
        logit=float(dla.logits[0, int(target)]),
        heads=numpy(dla.heads),
        patches=numpy(dla.patch_maps),
        self_read=numpy(dla.self_read),
        mlp=numpy(dla.mlp),
        removal=(ablated[..., int(target)] - dla.logits[0, int(target)].float()).cpu().numpy(),
        removal_top1=ablated.argmax(-1).cpu().numpy(),
        parts={name: float(value[0]) for name, value in dla.parts().items()},
        knockout=numpy(knockout),
        gamma={b: block_gamma_mean_abs(model, branch=b).numpy() for b in BRANCH_GAMMAS},
    )
    return partial.view


def _first_phase(
    model: torch.nn.Module, x: torch.Tensor, t: torch.Tensor, partial: Partial, told: Callable | None
) -> list[torch.Tensor] | None:
    """The attribution and the head ablations into `partial` (what it lacks), told in SA block runs; returns the
    attribution pass's SA states when it ran now (the knockouts then need no pass of their own), else None."""
    if partial.attribution is not None and partial.ablated is not None:
        return None  # done before: nothing to tell
    runs, total = [0], FIRST_PHASE_PASSES * len(model.blocks)

    def ran() -> None:
        runs[0] += 1
        if told is not None:
            told(runs[0] - 1, total)  # before the block: what is done

    sa_inputs = None
    with hooks.before_each(model.blocks, ran):
        if partial.attribution is None:
            with explain.causal.recorded_sa_inputs(model) as sa_inputs:
                partial.attribution = explain.direct_logit_attribution(model, x, t)
        else:
            runs[0] = len(model.blocks)
        if partial.ablated is None:
            partial.ablated = explain.all_head_ablations(model, x)[0].float()  # [L, heads, K]
    if told is not None:
        told(total, total)
    return sa_inputs


FIRST_PHASE_PASSES = 2  # the attribution's pass and the head ablations' SA stage


def forward_passes(cfg) -> float:
    """About how many forward passes of the whole model `compute` takes, counted in SA block runs: the
    attribution's pass (whose SA states the knockouts reuse), the head ablations' SA stage, and the SA
    knockouts, each re-running only the blocks after the one knocked out ((depth - 1) / 2 passes in all); the
    class stage's re-runs are small beside them."""
    return FIRST_PHASE_PASSES + (cfg.depth - 1) / 2


def head_figure(view: CausalView, label: str):
    """Per-head bars, one colour per CA layer, of the direct write to the logit beside the effect of removing
    the head (its zero ablation's change of the logit: what flows on through later layers too), beside the
    logit built up from its parts (the heads, the MLPs, the initial class token and the biases)."""
    return head_attribution_plotly(
        view.heads,
        list(view.parts.items()),
        removal=view.removal,
        title=f"What writes the logit of '{label}' ({_two(view.logit)}; the heads directly: {_two(view.heads.sum())})",
    )


def branch_knockout(
    model: torch.nn.Module,
    x: torch.Tensor,
    view: CausalView,
    knockout: str,
    *,
    on_block: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """The knockout profile of `view`'s class with one of KNOCKOUTS removed from each block in turn (the whole
    block's is the view's own), on_block(done, total) after each block (`explain.knockout_profile`)."""
    if knockout not in KNOCKOUTS:
        raise ValueError(f"knockout must be one of {', '.join(KNOCKOUTS)}, got {knockout!r}")
    if KNOCKOUTS[knockout] == "both":
        return view.knockout
    t = torch.tensor([view.target], device=x.device)
    profile = explain.knockout_profile(model, x, t, branch=KNOCKOUTS[knockout], on_block=on_block)
    return profile[0].float().cpu().numpy()


def knockout_figure(view: CausalView, cfg, profile: np.ndarray | None = None, knockout: str = "whole block"):
    """The knockout profile over depth (the view's, or `profile` of the `knockout` named) with the mean |gamma|
    of the gammas it zeroes per block on a second axis."""
    branch = KNOCKOUTS[knockout]
    gammas = BRANCH_GAMMAS[branch]  # which of the block's gammas the knockout zeroes
    name = f"mean |{', '.join(gammas)}|"
    return knockout_plotly(
        view.knockout if profile is None else profile,
        view.gamma[branch],
        depth=cfg.depth,
        ca_depth=cfg.depth_token_only,
        gamma_name=name,
        title=f"Logit change when a block's {' and '.join(gammas)} {'are' if len(gammas) > 1 else 'is'} zeroed "
        f"(bars), and its {name} (line)",
    )


def _two(value: float) -> str:
    """`value` to two decimals, without the "-0.00" of a tiny negative number (an untrained model's)."""
    return f"{round(float(value), 2) + 0.0:.2f}"


def maps_figure(view: CausalView, attention: np.ndarray, layer: int, head: int, image: Image.Image | None = None):
    """One head's attention map [g, g] (where it reads) beside its per-patch attribution (what it wrote
    from each patch, zero-centred: red for the class, blue against it), each over the model's view `image`
    when given, hovers numbered from 1 as the rest of the app."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    contrib = view.patches[layer, head]
    g = contrib.shape[-1]
    cells = list(range(1, g + 1))
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(f"{head_name(layer, head)}: attention", "its write to the logit, per patch"),
        horizontal_spacing=0.12,
    )
    hover = "row %{y}, column %{x}: %{z:.4f}<extra></extra>"
    common = dict(x=cells, y=cells, opacity=0.65 if image is not None else 1.0, hovertemplate=hover)
    fig.add_trace(go.Heatmap(z=attention, colorscale="Viridis", colorbar=dict(x=0.44), **common), row=1, col=1)
    signed = signed_heatmap(float(np.abs(contrib).max()))  # the one colour convention: red for the class
    fig.add_trace(go.Heatmap(z=contrib, colorbar=dict(x=1.0), **signed, **common), row=1, col=2)
    if image is not None:
        for axis in ("", "2"):
            image_under(fig, image, g, axis=axis)
    fig.update_yaxes(range=[g + 0.5, 0.5], scaleanchor="x", showticklabels=False, showgrid=False)
    fig.update_xaxes(range=[0.5, g + 0.5], showticklabels=False, showgrid=False)
    fig.update_layout(template="plotly_white", height=380, margin=dict(l=20, r=20, t=60, b=20))
    return fig


def reference_batch(paths: list[str], cfg) -> torch.Tensor:
    """The example images as a batch: what a mean ablation averages a head's output over."""
    views = []
    for path in paths:
        views.append(view_tensor(model_view(read_image(path, mode=cfg.image_mode), cfg), cfg))
    return torch.stack(views)


def ablation_reference(loaded: LoadedModel, mode: str) -> torch.Tensor | None:
    """What a head ablation of `mode` (one of ABLATIONS) replaces a head's output by the mean over: the model's
    example images on its device; None for a zero ablation, and for a model without examples (zero then too)."""
    if mode == ABLATIONS[0] or not loaded.examples:
        return None
    return reference_batch([path for path, _ in loaded.examples], loaded.cfg).to(loaded.device)


def ablation(
    model: torch.nn.Module,
    x: torch.Tensor,
    *,
    layer: int,
    head: int,
    labels: tuple[str, ...],
    reference: torch.Tensor | None = None,
    k: int = 5,
) -> dict[str, list[dict[str, Any]]]:
    """Top-k before and after removing CA layer `layer`'s head `head` (zero, or its mean over `reference`)."""
    out = explain.head_ablation(model, x, layer=layer, head=head, reference=reference)
    return {"before": top_classes(out.before, labels, k), "after": top_classes(out.after, labels, k)}


def numbers(model: torch.nn.Module, x: torch.Tensor, view: CausalView) -> dict[str, Any]:
    """The tab's numbers, JSON-able (the download and the /analyze answer), with every head's zero
    ablation: the change of the target logit and the new top-1."""
    cfg = model.cfg
    return {
        "layout": "0-based arrays (CA layer, head, patch row, col); blocks in model order, SA first",
        "target": view.target,
        "target_logit": view.logit,
        "heads": view.heads.tolist(),
        "patches": view.patches.tolist(),
        "self_read": view.self_read.tolist(),
        "mlp": view.mlp.tolist(),
        "parts": view.parts,
        "blocks": [
            {
                "stage": "sa" if i < cfg.depth else "ca",
                "index": i + 1 if i < cfg.depth else i - cfg.depth + 1,
                "gamma_mean_abs": float(view.gamma["both"][i]),
                "knockout_delta_logit": float(view.knockout[i]),
            }
            for i in range(len(view.knockout))
        ],
        "head_ablation_zero": {
            "delta_logit": view.removal.tolist(),
            "top1": view.removal_top1.tolist(),
        },
    }
