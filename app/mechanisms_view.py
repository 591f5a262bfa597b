"""The Mechanisms tab's numbers as plain functions (no Gradio): for one image and one class, the logit lens
along SA depth, activation patching between this image and a second one (another image, or this one under an
ImageNet-C corruption), token patching into the class stage (per region of the image) beside the class
attention, and the ablation of a set of class-attention heads. The numbers are `cait.explain`'s; this module
picks the inputs, turns tensors into JSON-able numbers, draws the token map, says the cost in forward passes,
and counts a long run's progress.

All of it runs in fp32 whatever the session's precision: it subtracts logits, which bf16 blurs."""

from __future__ import annotations

import html
import math
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, Callable, Iterator

import numpy as np
import torch
from PIL import Image

from app.choices import top5_html, top_classes
from app.figures import image_under
from app.models import LoadedModel
from app.texts import cost_in_passes
from cait import explain
from cait.corruptions import corrupt
from cait.explain import hooks
from cait.explain.agreement import map_agreement, spearman
from cait.explain.mechanisms import answer_forms_at
from cait.explain.token_patching import region_sums, token_patching, token_patching_forwards
from cait.figures import head_name
from cait.figures.colours import signed_heatmap
from cait.figures.mechanisms import gap_too_small
from cait.preprocess import normalise, view_pixels

SOURCES = ("this image, corrupted", "an example", "an upload")  # where the corrupted run's image comes from
DEFAULT_REGION = 1  # token patching's region side in patches, on the page and in /analyze: the finest map
CORRUPTION_SEED = 0  # the corruption's random draws: the same image and choice give the same numbers
TOP = 5


def lens(model: torch.nn.Module, x: torch.Tensor, target: int, labels: tuple[str, ...]) -> dict[str, Any]:
    """The logit lens of one image x [1, C, H, W] for class `target`: per SA depth (0: the patch embedding) the
    class's probability and the lens's top-1 with its probability, and where the answer forms (the first
    depth from which the top-1 is the model's final prediction)."""
    probs = explain.logit_lens(model, x)[0].float().softmax(-1)  # [D + 1, K]
    top_p, top = probs.max(-1)
    final = int(top[-1])
    return {
        "layout": "per SA depth k = 0..depth: the CA stage reads the patch tokens after SA block k (0: the patch "
        "embedding); the last entry is the model's own output",
        "target": int(target),
        "probability": probs[:, int(target)].tolist(),
        "top1": top.tolist(),
        "top1_label": [labels[int(i)] for i in top],
        "top1_probability": top_p.tolist(),
        "forms_at": answer_forms_at([float(int(t) == final) for t in top]),
    }


def corrupted_input(view: Image.Image, cfg, name: str, severity: int) -> tuple[Image.Image, torch.Tensor]:
    """This image's model view under corruption `name` at `severity` (`cait.corruptions`, seeded draws): the
    corrupted view as an image, and the normalised input [1, C, H, W]."""
    pixels = corrupt(
        view_pixels(view)[None], name, int(severity), generator=torch.Generator().manual_seed(CORRUPTION_SEED)
    )
    array = (pixels[0].clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    shown = Image.fromarray(array[..., 0] if array.shape[2] == 1 else array)
    return shown, normalise(pixels, cfg)


def patching_forwards(cfg) -> int:
    """About how many forward passes `patching` costs: per block and per CA head together SA depth + 4 to + 6
    measured (benchmarks/README.md: per block 25.5 for 24 SA blocks, 11.3 for 8; per head 2.1-2.4)."""
    return cfg.depth + 5


def patching(model: torch.nn.Module, clean: torch.Tensor, corrupted: torch.Tensor, target: int) -> dict[str, Any]:
    """Activation patching of class `target`'s logit from the clean run into the corrupted one, per block
    (branches, and the class token after each CA block but the last) and per CA head, with each component's
    share of the gap, JSON-able."""
    t = torch.tensor([int(target)], device=clean.device)
    by_block = explain.activation_patching(model, clean, corrupted, t)
    by_head = explain.activation_patching(model, clean, corrupted, t, granularity="head")
    gap = float(by_block.gap[0])
    as_list = lambda v: v[0].float().cpu().numpy()  # noqa: E731
    class_token, branches, heads = as_list(by_block.class_token), as_list(by_block.branches), as_list(by_head.heads)
    share = lambda v: (np.asarray(v) / gap).tolist() if gap else None  # noqa: E731
    return {
        "layout": "blocks in model order (SA then CA), 0-based; branches [block][attention, MLP]; class_token [CA "
        "block but the last]; heads [CA layer][head]; each value: the corrupted run's target logit with that "
        "component's clean output patched in, minus the corrupted run's; restored: that over the gap (clean minus "
        "corrupted target logit, what the whole stream restores by construction)",
        "target": int(target),
        "clean_logit": float(by_block.clean[0, int(target)]),
        "corrupted_logit": float(by_block.corrupted[0, int(target)]),
        "corrupted_top1": int(by_block.corrupted[0].argmax()),
        "gap": gap,
        "class_token": class_token.tolist(),
        "branches": branches.tolist(),
        "heads": heads.tolist(),
        "restored": {"class_token": share(class_token), "branches": share(branches), "heads": share(heads)},
    }


def patching_numbers(
    model: torch.nn.Module,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    target: int,
    *,
    corruption: tuple[str, int] | None = None,
    second_image: str | None = None,
) -> dict[str, Any]:
    """`patching`'s numbers headed by where the corrupted run came from: "corruption" and "severity" when it is
    this image under that ImageNet-C corruption, else "second_image", the other image's file name. The layout
    of /analyze's "patching" answer and of the JSON download's."""
    return {**_origin(corruption, second_image), **patching(model, clean, corrupted, target)}


def _origin(corruption: tuple[str, int] | None, second_image: str | None) -> dict[str, Any]:
    return {"corruption": corruption[0], "severity": corruption[1]} if corruption else {"second_image": second_image}


def token_numbers(
    model: torch.nn.Module,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    target: int,
    *,
    region: int,
    corruption: tuple[str, int] | None = None,
    second_image: str | None = None,
) -> dict[str, Any]:
    """Token patching of class `target`'s logit into the class stage (`explain.token_patching`, both
    directions, regions of `region` x `region` patches) beside the clean run's class attention per region,
    with their rank correlations, JSON-able and headed by where the corrupted run came from (as
    `patching_numbers`). The layout of /analyze's "token_patching" answer."""
    t = torch.tensor([int(target)], device=clean.device)
    out = token_patching(model, clean, corrupted, t, region=region)
    attention = region_sums(explain.class_attention(model, clean).maps.mean((1, 2)).float(), region)[0]
    gap = float(out.gap[0])
    maps = {name: getattr(out, name)[0].float().cpu().numpy() for name in ("restored", "broken")}
    as_share = lambda m: None if gap_too_small(gap) else (m / gap).tolist()  # noqa: E731
    attention = attention.cpu().numpy()
    return {
        **_origin(corruption, second_image),
        "layout": "maps [region row][region column], regions of `region` x `region` patches in row-major order "
        "(the last row and column smaller when region does not divide the grid); restored: the corrupted run's "
        "target logit with that region's clean patch tokens at the class stage's input, minus the corrupted "
        "run's; broken: the clean run's target logit minus that with the region's tokens taken from the "
        "corrupted run; *_fraction: over the gap (null when the gap is too small for shares, see "
        "`gap_too_small`); attention: the clean run's class attention per region (mean over CA layers and heads, "
        "summed over the region); rank_correlation: Spearman's, over the regions, of attention with each map (null "
        "when the gap is too small for shares, or a map is flat); agreement: how well attention finds the regions "
        "that restore (cait.explain.agreement.MapAgreement: the share of the positive restoration inside the top "
        "10% of regions by attention, the overlap of both maps' top regions; null when the gap is too small)",
        "target": int(target),
        "region": int(region),
        "grid": int(out.grid),
        "clean_logit": float(out.clean[0, int(target)]),
        "corrupted_logit": float(out.corrupted[0, int(target)]),
        "corrupted_top1": int(out.corrupted[0].argmax()),
        "gap": gap,
        "restored": maps["restored"].tolist(),
        "broken": maps["broken"].tolist(),
        "restored_fraction": as_share(maps["restored"]),
        "broken_fraction": as_share(maps["broken"]),
        "attention": attention.tolist(),
        # withheld as the shares are: on a gap too small, the maps are noise and their ranks mean nothing
        "rank_correlation": {name: None if gap_too_small(gap) else spearman(attention, m) for name, m in maps.items()},
        "agreement": None if gap_too_small(gap) else asdict(map_agreement(attention, maps["restored"])),
    }


def on_patches(regions: np.ndarray, grid: int, region: int) -> np.ndarray:
    """A region map [R, R] on the patch grid [g, g], each patch holding its region's value."""
    cell = np.arange(grid) // region
    return np.asarray(regions)[cell][:, cell]


def _rho(value: float | None) -> str:
    return "n/a (a flat map)" if value is None else f"{value:+.2f}"


# the maps over the model's view: the signed ones nearly opaque, as their red (for the class) and blue must read over
# a red garment; the attention's Viridis lets the image show a little more
SIGNED_OPACITY, ATTENTION_OPACITY = 0.9, 0.8


def token_map_figure(numbers: dict[str, Any], image: Image.Image, *, label: str):
    """The clean run's class attention per region beside where patching restores the answer (the clean
    region into the corrupted run) and where it breaks it (the corrupted region into the clean run), each
    over the model's view `image`: shares of the gap, red for the class, or Δlogit when the gap is too small
    for shares; the rank correlations in the title."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    g, region, gap = numbers["grid"], numbers["region"], numbers["gap"]
    shares = numbers["restored_fraction"] is not None
    unit = "share of the gap" if shares else "Δlogit"
    restored = numbers["restored_fraction"] if shares else numbers["restored"]
    broken = numbers["broken_fraction"] if shares else numbers["broken"]
    panels = [
        ("class attention (CA mean), per region", numbers["attention"], "class attention per region"),
        (f"restored: clean region patched in ({unit})", restored, f"restored or broken ({unit})"),
        (f"broken: region corrupted ({unit})", broken, f"restored or broken ({unit})"),
    ]
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[0] for p in panels], horizontal_spacing=0.08)
    cells = list(range(1, g + 1))
    bound = max(float(np.abs(np.asarray(restored)).max()), float(np.abs(np.asarray(broken)).max())) or 1.0
    number = ".0%" if shares else ".3f"  # no sign: plotly.js refuses "+.3f" (its hover then shows the raw number)
    for col, (_, values, name) in enumerate(panels, start=1):
        signed = col > 1
        colours = signed_heatmap(bound) if signed else dict(colorscale="Viridis")  # red: for the class
        fig.add_trace(
            go.Heatmap(
                z=on_patches(values, g, region),
                x=cells,
                y=cells,
                opacity=SIGNED_OPACITY if signed else ATTENTION_OPACITY,
                **colours,
                showscale=col != 2,  # the two signed panels share one scale
                colorbar=dict(x=0.285 if col == 1 else 1.0, len=0.9, title=dict(text=name, side="right")),
                hovertemplate=f"patch row %{{y}}, column %{{x}}: %{{z:{number if signed else '.4f'}}}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        image_under(fig, image, g, axis="" if col == 1 else str(col))
    rho = numbers["rank_correlation"]
    title = f"Where '{label}' enters the class token (regions of {region}x{region} patches)"
    if shares:
        title += f"<br>{agreement_words(numbers['agreement'])}; rank correlation over all regions " + (
            f"{_rho(rho['restored'])} (restored), {_rho(rho['broken'])} (broken)"
        )
    else:
        title += f"<br>{small_gap_words(gap)}; no rank correlation either"
    fig.update_yaxes(range=[g + 0.5, 0.5], scaleanchor="x", showticklabels=False, showgrid=False)
    fig.update_xaxes(range=[0.5, g + 0.5], showticklabels=False, showgrid=False)
    fig.update_layout(title=dict(text=title, font=dict(size=14)), template="plotly_white", height=400)
    fig.update_layout(margin=dict(l=20, r=20, t=90, b=20))
    return fig


def agreement_words(agreement: dict[str, Any]) -> str:
    """What the title says of how well attention finds the regions that restore (`MapAgreement`, as a dict)."""
    top, n = agreement["top"], agreement["regions"]
    held = agreement["share_in_top"]
    held = "nothing restored" if held is None else f"holds {held:.0%} of the restoration"
    return (
        f"the top {top} of {n} regions by attention {held} (chance {top / n:.0%}), "
        f"{round(agreement['overlap'] * top)} of the top {top} restoring ones"
    )


def small_gap_words(gap: float) -> str:
    """What to say instead of shares when the gap is too small for them (`gap_too_small`)."""
    return f"gap {gap:+.2f}: too small for shares of it to mean anything, so Δlogits are shown"


def token_region_count(grid: int, region: int) -> int:
    """Regions of `region` x `region` patches on a patch grid of side `grid`."""
    return math.ceil(grid / region) ** 2


def token_cost(loaded: LoadedModel, region: int, forward_seconds: float) -> str:
    """What token patching (both directions, regions of `region` patches) costs, said before it runs: at least
    `token_patching_forwards` forward passes (its count by multiply-accumulates, the two runs included) in fp32,
    in seconds from this image's measured forward pass (`texts.cost_in_passes`)."""
    forwards = token_patching_forwards(loaded.model, region=region)
    regions = token_region_count(loaded.cfg.grid_size, region)
    what = f"Token patching ({regions} regions, both directions)"
    return cost_in_passes(what, forwards, forward_seconds, loaded=loaded, at_least=True)


def patching_runs(cfg) -> int:
    """How many times `patching` reads the class token through the head: each granularity's two runs, one read
    per class token patched (each CA block but the last) and per branch (two per block), one per CA head. Its
    progress's total."""
    blocks = cfg.depth + cfg.depth_token_only
    return 2 + (cfg.depth_token_only - 1) + 2 * blocks + 2 + cfg.depth_token_only * cfg.num_heads


def token_runs(cfg, region: int) -> int:
    """How many images `token_numbers` reads through the head: the two runs, one per region and direction,
    and the class attention's own pass. Its progress's total."""
    return 2 + 2 * token_region_count(cfg.grid_size, region) + 1


@contextmanager
def counted_runs(
    model: torch.nn.Module, total: int, *, report: Callable[[int, int], None], check: Callable[[], None]
) -> Iterator[None]:
    """While open, check() runs before every block and every read of the head (an exception it raises ends the
    pass there: a Stop heard within one block's time), and report(done, total) before each read of the head,
    done counting the images read so far (a batched run of m token sets counts m)."""
    done = [0]

    def on_head(module: torch.nn.Module, args: tuple) -> None:
        check()
        done[0] += int(args[0].shape[0])
        report(min(done[0], total), total)

    with hooks.on_inputs(model.head, on_head), hooks.before_each([*model.blocks, *model.blocks_token_only], check):
        yield


def head_pairs(indices: list[int], heads: int) -> list[tuple[int, int]]:
    """The ticked heads (layer * heads + head, as `choices.causal_heads` numbers them) as (layer, head) pairs."""
    return [divmod(int(i), heads) for i in indices]


def set_ablation(
    model: torch.nn.Module,
    x: torch.Tensor,
    *,
    heads: list[tuple[int, int]],
    target: int,
    labels: tuple[str, ...],
    reference: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The top-5 before and after removing the CA heads `heads` together (zero, or each its mean over
    `reference`), and the change of class `target`'s logit."""
    out = explain.head_ablation(model, x, heads=heads, reference=reference)
    t = torch.tensor([int(target)], device=x.device)
    return {
        "heads": [list(pair) for pair in out.heads],
        "target": int(target),
        "target_label": labels[int(target)],
        "delta_logit": float(out.delta(t)[0]),
        "before": top_classes(out.before, labels, TOP),
        "after": top_classes(out.after, labels, TOP),
    }


def ablation_html(result: dict[str, Any], mode: str) -> str:
    """The Δlogit line and the top-5 before and after, side by side."""
    named = ", ".join(head_name(layer, head) for layer, head in result["heads"])
    label = result["target_label"]
    return (
        f"<p>Without {html.escape(named)} ({html.escape(mode)}): Δlogit of '{html.escape(label)}' "
        f"<b>{result['delta_logit']:+.3f}</b></p>{top5_html(result, 'without the ticked heads')}"
    )
