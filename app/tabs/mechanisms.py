"""The Mechanisms tab: how the answer forms along depth. The logit lens when the tab is opened (or a new image
comes while it is open, or another class is chosen), activation patching against a second run, and the ablation
of the ticked heads. `app.mechanisms_view` does the numbers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

import cait
from app import causal_view, mechanisms_view, session, torch_thread
from app.choices import causal_heads, class_choices
from app.models import LoadedModel, ModelCache, ModelChoice
from app.shared import MODEL_EVENTS, Shared, answering, named
from app.texts import NO_IMAGE, cost_in_passes
from cait.errors import InputError
from cait.figures.mechanisms import heads_plotly, lens_plotly, patching_plotly


class NoSecondRun(InputError):
    """The corrupted run's image is not chosen (an example, a file)."""


@dataclass
class MechanismsParts:
    mechanisms_tab: gr.Tab
    mx_class: gr.Dropdown
    mx_lens: gr.Plot
    mx_source: gr.Radio
    mx_corruption: gr.Dropdown
    mx_severity: gr.Slider
    mx_example: gr.Dropdown
    mx_upload: gr.Image
    mx_patch_run: gr.Button
    mx_cost: gr.Markdown
    mx_msg: gr.Markdown
    mx_second: gr.Image
    mx_patch: gr.Plot
    mx_patch_heads: gr.Plot
    mx_heads: gr.CheckboxGroup
    mx_mode: gr.Radio
    mx_ablate: gr.Button
    mx_ablation: gr.HTML

    @property
    def opened(self) -> list:
        """What opening the tab writes (but the download, which the page owns)."""
        return [self.mx_class, self.mx_heads, self.mx_example, self.mx_msg, self.mx_lens, self.mx_cost]

    @property
    def results(self) -> list:
        """What a new image (or a new model) empties here."""
        shown = [self.mx_lens, self.mx_cost, self.mx_msg, self.mx_second, self.mx_patch, self.mx_patch_heads]
        return [self.mx_class, *shown, self.mx_ablation]


@dataclass(frozen=True)
class PatchAsk:
    """What the Patch button sends, each field named as its component (`app.shared.named`)."""

    choice: ModelChoice
    analysis: session.Analysis | None
    mx_class: int | None  # None: the top prediction
    mx_source: str  # one of mechanisms_view.SOURCES
    mx_corruption: str
    mx_severity: int
    mx_example: str | None  # an example's path
    mx_upload: str | None  # an uploaded file's path


@dataclass(frozen=True)
class AblateAsk:
    """What the Ablate button sends (by name)."""

    choice: ModelChoice
    analysis: session.Analysis | None
    mx_class: int | None
    mx_heads: list[int]
    mx_mode: str


def without_class_stage(cfg: cait.CaiTConfig) -> bool:
    """A model whose class token joins the SA stage (ViT-style) has no class-attention stage to read through."""
    return cfg.class_token_at is not None or cfg.depth_token_only == 0


def build(first: LoadedModel, tab: gr.Tab) -> MechanismsParts:
    """The tab's components (inside `tab`)."""
    from cait.corruptions import CORRUPTIONS  # torchvision: only once the page is built

    gr.Markdown(
        "How the answer forms along depth. **Logit lens:** the model's own class-attention stage and head read "
        "the patch tokens after each SA block: the chosen class's probability and the top-1 there. "
        "**Activation patching:** a second, corrupted run; each component's clean output patched into it alone, "
        "and how much of the clean-corrupted gap of the class's logit that restores. **Ablation:** remove several "
        "class-attention heads together."
    )
    parts: dict[str, Any] = {"mechanisms_tab": tab}
    parts["mx_class"] = gr.Dropdown(label="Class", choices=[], elem_id="mx_class")
    parts["mx_lens"] = gr.Plot(label="Logit lens", elem_id="mx_lens")
    with gr.Row():
        sources = mechanisms_view.SOURCES
        parts["mx_source"] = gr.Radio(list(sources), value=sources[0], label="Corrupted run", elem_id="mx_source")
        parts["mx_corruption"] = gr.Dropdown(
            list(CORRUPTIONS), value="gaussian_noise", label="Corruption", elem_id="mx_corruption"
        )
        parts["mx_severity"] = gr.Slider(1, 5, value=3, step=1, label="Severity", elem_id="mx_severity")
        parts["mx_example"] = gr.Dropdown(
            [(c, path) for path, c in first.examples], label="Example", visible=False, elem_id="mx_example"
        )
        parts["mx_upload"] = gr.Image(
            type="filepath", label="Second image", sources=["upload"], height=160, visible=False, elem_id="mx_upload"
        )
    with gr.Row():
        parts["mx_patch_run"] = gr.Button("Patch", variant="primary", scale=1, elem_id="mx_patch_run")
        parts["mx_cost"] = gr.Markdown(elem_id="mx_cost")
    parts["mx_msg"] = gr.Markdown(elem_id="mx_msg")
    with gr.Row():
        parts["mx_second"] = gr.Image(
            label="Corrupted run's input", type="pil", interactive=False, height=220, scale=1, elem_id="mx_second"
        )
        with gr.Column(scale=4):
            parts["mx_patch"] = gr.Plot(label="Patching over depth", elem_id="mx_patch")
    parts["mx_patch_heads"] = gr.Plot(label="Patching per class-attention head", elem_id="mx_patch_heads")
    with gr.Row():
        parts["mx_heads"] = gr.CheckboxGroup(
            causal_heads(first.cfg), value=[], label="Heads to ablate together", elem_id="mx_heads", scale=3
        )
        parts["mx_mode"] = gr.Radio(
            list(causal_view.ABLATIONS), value=causal_view.ABLATIONS[0], label="Remove by", elem_id="mx_mode"
        )
        parts["mx_ablate"] = gr.Button("Ablate", scale=1, elem_id="mx_ablate")
    parts["mx_ablation"] = gr.HTML(elem_id="mx_ablation")
    return MechanismsParts(**parts)


def _target(a: session.Analysis, asked: int | None, classes: int) -> int:
    return a.top_class if asked is None or not 0 <= int(asked) < classes else int(asked)


def _second_run(loaded: LoadedModel, a: session.Analysis, ask: PatchAsk):
    """(shown image, input [1, C, H, W], where it came from as `mechanisms_view.patching_numbers` keywords) of the
    corrupted run; NoSecondRun or ImageInputError (both input errors) saying what is missing."""
    if ask.mx_source == mechanisms_view.SOURCES[0]:
        corruption = (ask.mx_corruption, int(ask.mx_severity))
        return (*mechanisms_view.corrupted_input(a.view, loaded.cfg, *corruption), {"corruption": corruption})
    example = ask.mx_source == mechanisms_view.SOURCES[1]
    path = ask.mx_example if example else ask.mx_upload
    if not path:
        raise NoSecondRun(f"choose {'an example' if example else 'a file'} for the corrupted run")
    _, view, x = session.model_input(path, loaded.cfg)
    return view, x, {"second_image": Path(path).name}


class MechanismsTab:
    """The tab's events and what it draws."""

    def __init__(self, parts: MechanismsParts, shared: Shared, cache: ModelCache):
        self.parts, self.shared, self.cache = parts, shared, cache

    def lens(self, loaded: LoadedModel, a: session.Analysis, target: int) -> dict:
        """The lens figure of class `target`, the cost line of patching, and the JSON download rewritten with
        the lens."""
        p, x = self.parts, a.x.to(loaded.device)
        numbers = a.logit_lens = mechanisms_view.lens(loaded.model, x, target, loaded.labels)
        figure = lens_plotly(
            numbers["probability"],
            numbers["top1_label"],
            numbers["top1_probability"],
            target=loaded.labels[target],
            forms_at=numbers["forms_at"],
        )
        passes = mechanisms_view.patching_forwards(loaded.cfg)
        return {
            p.mx_lens: figure,
            p.mx_cost: cost_in_passes(
                "Patching", passes, a.forward_seconds, reduced_precision=loaded.dtype is not None
            ),
            self.shared.json_file: session.numbers_file(loaded, a),
        }

    def opened(self, choice, a, target) -> dict:
        """The tab opened (or a new image shown while it is open): the class menu, the heads to tick, the
        examples, and the lens of the chosen class (the top prediction unless another is chosen)."""
        p = self.parts
        if a is None or a.choice != choice:
            return {p.mx_msg: NO_IMAGE}
        loaded = self.cache.get(choice)
        if without_class_stage(loaded.cfg):
            return {p.mx_msg: "**No lens for this model:** it has no class-attention stage to read through."}
        target = _target(a, target, loaded.cfg.num_classes)
        out = {
            p.mx_class: gr.Dropdown(choices=class_choices(loaded.labels), value=target),
            p.mx_heads: gr.CheckboxGroup(choices=causal_heads(loaded.cfg)),
            p.mx_example: gr.Dropdown(choices=[(c, path) for path, c in loaded.examples]),
            p.mx_msg: "",
        }
        return out | self.lens(loaded, a, target)

    def choose_class(self, choice, a, target) -> dict:
        """Another class chosen: its lens."""
        if a is None or a.choice != choice or target is None:
            return {}
        return self.lens(self.cache.get(choice), a, int(target))

    @staticmethod
    def source(source: str) -> list:
        """Only the controls of the chosen source of the corrupted run are shown."""
        corrupted, example, upload = (source == s for s in mechanisms_view.SOURCES)
        return [
            gr.update(visible=corrupted),
            gr.update(visible=corrupted),
            gr.update(visible=example),
            gr.update(visible=upload),
        ]

    def patch(self, **asked: Any) -> dict:
        """Activation patching of the chosen class's logit from this image into the second run: bars over depth
        and the CA heads' grid, in Δlogit, each with the share of the gap it restores.
        asked: the fields of `PatchAsk`, by name."""
        p, ask = self.parts, PatchAsk(**asked)
        a = ask.analysis
        if a is None or a.choice != ask.choice:
            return {p.mx_msg: NO_IMAGE}
        loaded = self.cache.get(ask.choice)
        if without_class_stage(loaded.cfg):
            return {p.mx_msg: "**Cannot patch:** this model has no class-attention stage."}
        target = _target(a, ask.mx_class, loaded.cfg.num_classes)
        try:
            shown, corrupted, origin = _second_run(loaded, a, ask)
        except InputError as e:
            return {p.mx_msg: f"**Cannot patch:** {e}"}
        x, corrupted = a.x.to(loaded.device), corrupted.to(loaded.device)
        n = a.patching = mechanisms_view.patching_numbers(loaded.model, x, corrupted, target, **origin)
        label, cfg = loaded.labels[target], loaded.cfg
        broken = loaded.labels[n["corrupted_top1"]]
        title = (
            f"Patching '{label}': clean logit {n['clean_logit']:.2f}, corrupted {n['corrupted_logit']:.2f} "
            f"(top-1 '{broken}'), gap {n['gap']:.2f}"
        )
        branches, class_token = np.array(n["branches"]), np.array(n["class_token"])
        heads_title = "Each CA head's clean output patched in alone"
        return {
            p.mx_msg: "",
            self.shared.json_file: session.numbers_file(loaded, a),
            p.mx_second: shown,
            p.mx_patch: patching_plotly(
                branches,
                n["gap"],
                class_token=class_token,
                depth=cfg.depth,
                ca_depth=cfg.depth_token_only,
                title=title,
            ),
            p.mx_patch_heads: heads_plotly(np.array(n["heads"]), n["gap"], title=heads_title),
        }

    def ablate(self, **asked: Any) -> dict:
        """The ticked heads removed together: Δlogit of the chosen class and the new top-5. asked: `AblateAsk`'s
        fields, by name."""
        p, ask = self.parts, AblateAsk(**asked)
        a = ask.analysis
        if a is None or a.choice != ask.choice:
            return {p.mx_ablation: NO_IMAGE}
        if not ask.mx_heads:
            return {p.mx_ablation: "<p><b>Tick at least one head.</b></p>"}
        loaded = self.cache.get(ask.choice)
        result = mechanisms_view.set_ablation(
            loaded.model,
            a.x.to(loaded.device),
            heads=mechanisms_view.head_pairs(ask.mx_heads, loaded.cfg.num_heads),
            target=_target(a, ask.mx_class, loaded.cfg.num_classes),
            labels=loaded.labels,
            reference=causal_view.ablation_reference(loaded, ask.mx_mode),
        )
        return {p.mx_ablation: mechanisms_view.ablation_html(result, ask.mx_mode)}

    def cleared(self) -> dict:
        return dict.fromkeys(self.parts.results)

    def wire(self) -> None:
        p, shared, on_torch = self.parts, self.shared, torch_thread.handler
        said = lambda line: {p.mx_msg: line}  # noqa: E731
        opened = on_torch(answering(self.opened, said=said))
        p.mechanisms_tab.select(
            opened, [shared.choice, shared.analysis, p.mx_class], [*p.opened, shared.json_file], **MODEL_EVENTS
        )
        p.mx_class.input(
            on_torch(answering(self.choose_class, said=said)),
            [shared.choice, shared.analysis, p.mx_class],
            [p.mx_lens, p.mx_cost, shared.json_file, p.mx_msg],
            **MODEL_EVENTS,
        )
        p.mx_source.change(
            self.source,
            p.mx_source,
            [p.mx_corruption, p.mx_severity, p.mx_example, p.mx_upload],
            queue=False,
            api_visibility="private",
        )
        p.mx_patch_run.click(
            on_torch(answering(self.patch, said=said)),
            inputs_kwargs=named(p, PatchAsk, choice=shared.choice, analysis=shared.analysis),
            outputs=[p.mx_msg, shared.json_file, p.mx_second, p.mx_patch, p.mx_patch_heads],
            show_progress_on=[p.mx_patch],
            **MODEL_EVENTS,
        )
        p.mx_ablate.click(
            on_torch(answering(self.ablate, said=lambda line: {p.mx_ablation: line})),
            inputs_kwargs=named(p, AblateAsk, choice=shared.choice, analysis=shared.analysis),
            outputs=p.mx_ablation,
            **MODEL_EVENTS,
        )
