"""What the page says about the model and a result, in words (markdown); no Gradio, no computing."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

from app.models import LoadedModel
from cait.data import SCENE_SIDE
from cait.robustness import headline

if TYPE_CHECKING:
    from cait.hub import WeightsStatus

NO_IMAGE = "**Analyse an image first** (pick an example or upload one)."  # a tab's run asked without an image

DATA_NAMES = {
    "fashion-mnist-scenes": f"Fashion-MNIST scenes ({SCENE_SIDE} px canvases of garments pasted on clutter)",
    "fashion-mnist": "Fashion-MNIST (grey 28x28 garments)",
}


def precision_name(loaded: LoadedModel) -> str:
    return "bf16 autocast" if loaded.dtype is not None else "fp32"


def precision_decided(loaded: LoadedModel) -> str:
    """The precision with how it was decided, for the header ("bf16 autocast, measured now"); before the server
    decided it (bf16 timed at start-up), what holds until then, which a page opened meanwhile keeps saying."""
    if loaded.precision is None:
        return "fp32 while bf16 is timed at start-up: reload the page in a minute for the precision chosen"
    return f"{precision_name(loaded)}, {loaded.precision.decided}"


def card_link(loaded: LoadedModel) -> str:
    return "model card in the Model tab" if loaded.card else ""


def card_markdown(loaded: LoadedModel) -> str:
    """The shipped model card, as markdown for the page to render ("" when the model has none)."""
    if loaded.card is None:
        return ""
    try:
        return loaded.card.card.read_text(encoding="utf-8")
    except OSError:
        return ""


def model_summary(loaded: LoadedModel) -> str:
    """One sentence on what the model is and how good it is, from its shipped card when it has one."""
    cfg = loaded.cfg
    if loaded.notice:
        return f"**⚠ {loaded.notice.split(':')[0]}**: random weights, the predictions mean nothing."
    if loaded.card is None:
        kind = "ImageNet-1k" if cfg.is_imagenet else f"{cfg.num_classes}-class"
        return f"A {cfg.img_size} px {kind} CaiT ({loaded.source})."
    card = loaded.card
    data = DATA_NAMES.get(card.data, card.data)
    return (
        f"A {cfg.img_size} px, {cfg.num_classes}-class miniature CaiT trained by this project on {data}, not the "
        f"paper's ImageNet model: **{card.test_top1:.1%} top-1** on {card.test_images:,} test images "
        f"({card_link(loaded)})."
    )


def garment_warning(loaded: LoadedModel) -> str:
    """What to say when a user's own picture goes to a model that knows only garments ("" otherwise)."""
    if loaded.cfg.is_imagenet or loaded.card is None or "fashion" not in loaded.card.data:
        return ""
    return (
        f"This model knows only {loaded.cfg.num_classes} garment classes: whatever your picture shows, "
        f"it answers with one of them."
    )


def cached_offer(cached: Sequence[str], current: str) -> str:
    """The first screen's offer of official weights already on this machine ("" when there are none)."""
    others = [name for name in cached if name != current]
    if not others:
        return ""
    return (
        f"\n\nThe paper's official ImageNet weights are in your local Hugging Face cache: "
        f"**{', '.join(others)}**. Load one in the Model tab to look at real photos (no download)."
    )


def header_markdown(loaded: LoadedModel, cached: Sequence[str] = ()) -> str:
    """The first screen: which model this page shows, how good it is, and the cached official weights."""
    return (
        f"# CaiT: class attention & LayerScale\nModel **{loaded.name}** on **{loaded.device}** "
        f"({precision_decided(loaded)}). {model_summary(loaded)} Upload an image or pick an example."
        f"{cached_offer(cached, loaded.name)}"
    )


def weights_table(statuses: Sequence[WeightsStatus]) -> str:
    """Every paper variant with its size and where its weights would come from (cait.hub, no request)."""

    def where(s: WeightsStatus) -> str:
        if s.where == "needs file":
            return "needs a file (" + ("offline and not cached)" if s.repo_id else "never released)")
        return {"cached": "in the local cache", "download": "download (tick the box)", "shipped": "shipped"}[s.where]

    rows = "\n".join(f"| {s.name} | {s.size_mb:.0f} | {where(s)} | {s.repo_id or '-'} |" for s in statuses)
    return f"| variant | MB | weights | Hub repo |\n|---|---|---|---|\n{rows}"


def model_markdown(loaded: LoadedModel) -> str:
    cfg = loaded.cfg
    classes = "ImageNet-1k" if cfg.is_imagenet else ", ".join(loaded.labels)
    rows = [
        ("variant", loaded.name),
        ("weights", loaded.source),
        ("weights identity", loaded.sourced.weights_id),
        ("device", f"{loaded.device}, {precision_name(loaded)} for forward-only passes"),
        *([("precision", f"{loaded.precision.decided}: {loaded.precision.reason}")] if loaded.precision else []),
        ("parameters", f"{loaded.model.num_params() / 1e6:.2f} M"),
        ("FLOPs (multiply-accumulates)", f"{loaded.model.flops() / 1e9:.3f} G"),
        (
            "input",
            f"{cfg.img_size}x{cfg.img_size}, {cfg.in_chans} channel(s), patch {cfg.patch_size} "
            f"-> {cfg.grid_size}x{cfg.grid_size} patches",
        ),
        ("blocks", f"{cfg.depth} SA + {cfg.depth_token_only} CA, width {cfg.embed_dim}, {cfg.num_heads} heads"),
        ("LayerScale init eps", f"{cfg.init_values:g}"),
        ("talking heads", str(cfg.talking_heads)),
        ("classes", f"{cfg.num_classes} ({classes})"),
    ]
    if loaded.card is not None:
        rows.append(
            ("test top-1", f"{loaded.card.test_top1:.2%} on {loaded.card.test_images:,} images (model card below)")
        )
    if loaded.card is not None and loaded.card.robustness is not None:
        rows.append(("robustness (corrupted test images)", f"{headline(loaded.card.robustness)} (model card)"))
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    warn = f"\n\n**⚠ {loaded.notice}**" if loaded.notice else ""
    return f"| model | |\n|---|---|\n{table}{warn}"


def percent(p: float) -> str:
    """A probability as a percentage with one decimal (0.4%, not 0%); below 0.05% it says so."""
    return f"{p:.1%}" if p >= 0.0005 else "< 0.1%"


def top5_html(predictions: list[dict]) -> str:
    """The top predictions as rows of label, bar and percentage (one decimal, so small ones are not 0%)."""
    import html

    rows = "".join(
        f"<div class='top5-row'><span class='top5-label'>{html.escape(q['label'])}</span>"
        f"<span class='top5-track'><span class='top5-bar' style='width:{100 * q['probability']:.1f}%'></span></span>"
        f"<span class='top5-value'>{percent(q['probability'])}</span></div>"
        for q in predictions
    )
    return f"<div class='top5'><div class='top5-title'>Top-5 predictions</div>{rows}</div>"


def status_markdown(loaded: LoadedModel, top: dict, notes: list[str], *, uploaded: bool) -> str:
    lines = [f"Top-1: **{top['label']}** ({percent(top['probability'])})"]
    if notes:
        lines.append("Input notes: " + " ".join(notes))
    if uploaded and garment_warning(loaded):
        lines.append(f"⚠ {garment_warning(loaded)}")
    if loaded.notice:
        lines.append("⚠ untrained model: the prediction means nothing.")
    return "  \n".join(lines)


def cost_in_passes(
    what: str, passes: float, forward_seconds: float, *, loaded: LoadedModel, at_least: bool = False
) -> str:
    """What `what` costs, said before it runs: `passes` fp32 forward passes of `loaded`'s model, and at least
    their time, from the model's fastest measured forward pass (`LoadedModel.timed_forward`). A floor, not an
    estimate: drawing the figures and writing the numbers add a fixed time that outweighs a small model's few
    passes (benchmarks/README.md). A forward
    measured in bf16 is turned into fp32's time by the ratio the start-up precision probe timed on this CPU
    (`PrecisionChoice.bf16_speedup`): bf16 is the faster one on some CPUs and the slower on others (AVX512-BF16
    without AMX); without a timing, the line says that it assumes fp32 as fast. `at_least`: `passes` is a floor
    counted by multiply-accumulates (fractional), not a count of whole passes."""
    count = f"at least {passes:.1f}" if at_least else f"{passes:.0f}"
    head = f"{what} takes {count} forward passes of the model"
    if not math.isfinite(forward_seconds):  # not measured
        return f"{head}, and the figures on top."
    took = f"this model's fastest forward pass so far took {forward_seconds:.2f} s"
    if loaded.dtype is None:
        return (
            f"{head}: at least {passes * forward_seconds:.1f} s at a forward pass of {forward_seconds:.2f} s in fp32, "
            "this model's fastest so far; the figures come on top."
        )
    speedup = loaded.precision.bf16_speedup if loaded.precision is not None else None
    if speedup is None:
        return (
            f"{head}: at least {passes * forward_seconds:.1f} s if fp32 runs as fast as bf16, which this device has "
            f"not timed; {took} in bf16, and the figures come on top."
        )
    pace = f"{speedup:.2f}x slower" if speedup >= 1 else f"{1 / speedup:.2f}x faster"
    return (
        f"{head}: at least {passes * forward_seconds * speedup:.1f} s, as {took} in bf16 and fp32 ran {pace} than "
        "bf16 in the start-up timing on this CPU; the figures come on top."
    )


def waiting_words(ahead: int) -> str:
    """What a long computation's progress line says while it waits (`torch_thread.call_long`'s on_wait): how many
    long computations of other pages, or of this one, run or wait before it; or, told 0, that it gives way to
    views."""
    if ahead == 0:
        return "gives way to the views pages ask for meanwhile (at most twice its own time)"
    others = "1 long computation" if ahead == 1 else f"{ahead} long computations"
    return f"waits: {others} (of this or other pages) first; Stop ends it now"


class ProgressLine:
    """A long computation's progress line (its event's gr.Progress, called as it is), which says a wait beside the
    step said last rather than instead of it. Gradio's status shows a description only beside a step's bar: a wait
    said alone blanked the line (the step and its words gone) until the next step, which never came while the work
    was held where no step follows (reading an atlas's scenes, a page's view served meanwhile)."""

    def __init__(self, progress: Callable[..., Any]) -> None:
        self._progress = progress
        self._said: tuple[Any, str | None, str] = (0.0, None, "steps")  # nothing done yet: a bar at 0

    def __call__(self, step: Any, desc: str | None = None, *, unit: str = "steps") -> None:
        """Say `step` (a fraction, or (done, total)) with `desc` in `unit`, as gr.Progress does."""
        self._said = (step, desc, unit)
        self._progress(step, desc=desc, unit=unit)

    def waiting(self, ahead: int) -> None:
        """`torch_thread.call_long`'s on_wait: `waiting_words(ahead)` after the step said last."""
        step, desc, unit = self._said
        words = waiting_words(ahead)
        self._progress(step, desc=f"{desc}; {words}" if desc else words, unit=unit)
