"""The Mechanisms tab's events (`app.mechanisms_view` does the numbers): the logit lens when the tab is opened
(or a new image comes while it is open, or another class is chosen), activation patching against a second run,
and the ablation of the ticked heads. A mix-in of `app.handlers.Handlers`: it reads `self.page` and
`self.cache` as the other handlers do."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from app import causal_view, mechanisms_view, session
from app.images import ImageInputError
from app.layout import causal_heads, class_choices
from app.models import LoadedModel, ModelChoice
from app.texts import NO_IMAGE, cost_in_passes
from cait.figures.mechanisms import heads_plotly, lens_plotly, patching_plotly


@dataclass(frozen=True)
class PatchAsk:
    """What the Patch button sends, each field named as its component in `Page` (`Page.named`)."""

    choice: ModelChoice
    analysis: session.Analysis | None
    mx_class: int | None  # None: the top prediction
    mx_source: str  # one of mechanisms_view.SOURCES
    mx_corruption: str
    mx_severity: int
    mx_example: str | None  # an example's path
    mx_upload: str | None  # an uploaded file's path


class MechanismsEvents:
    """The Mechanisms tab's handlers (mixed into `Handlers`, whose `_numbers_file` writes the JSON download)."""

    def _target(self, a: session.Analysis, asked: int | None, classes: int) -> int:
        return a.top_class if asked is None or not 0 <= int(asked) < classes else int(asked)

    def mechanisms_lens(self, loaded: LoadedModel, a: session.Analysis, target: int) -> dict:
        """The lens figure of class `target`, the cost line of patching, and the JSON download rewritten with
        the lens."""
        p, x = self.page, a.x.to(loaded.device)
        numbers = a.logit_lens = mechanisms_view.lens(loaded.model, x, target, loaded.labels)
        figure = lens_plotly(
            numbers["probability"],
            numbers["top1_label"],
            numbers["top1_probability"],
            target=loaded.labels[target],
            forms_at=numbers["forms_at"],
        )
        return {
            p.mx_lens: figure,
            p.mx_cost: cost_in_passes(
                "Patching",
                mechanisms_view.patching_forwards(loaded.cfg),
                a.forward_seconds,
                reduced_precision=loaded.dtype is not None,
            ),
            p.json_file: self._numbers_file(loaded, a),
        }

    def mechanisms_opened(self, choice, a, target) -> dict:
        """The tab opened (or a new image shown while it is open): the class menu, the heads to tick, the
        examples, and the lens of the chosen class (the top prediction unless another is chosen)."""
        if a is None or a.choice != choice:
            return {self.page.mx_msg: NO_IMAGE}
        p, loaded = self.page, self.cache.get(choice)
        target = self._target(a, target, loaded.cfg.num_classes)
        try:
            lens = self.mechanisms_lens(loaded, a, target)
        except ValueError as e:  # a model without CaiT's class-attention stage: explain says so in one line
            return {p.mx_msg: f"**No lens for this model:** {e}"}
        out = {
            p.mx_class: gr.Dropdown(choices=class_choices(loaded.labels), value=target),
            p.mx_heads: gr.CheckboxGroup(choices=causal_heads(loaded.cfg)),
            p.mx_example: gr.Dropdown(choices=[(c, path) for path, c in loaded.examples]),
            p.mx_msg: "",
        }
        return out | lens

    def mechanisms_class(self, choice, a, target) -> dict:
        """Another class chosen: its lens."""
        if a is None or a.choice != choice or target is None:
            return {}
        return self.mechanisms_lens(self.cache.get(choice), a, int(target))

    @staticmethod
    def mechanisms_source(source: str) -> list:
        """Only the controls of the chosen source of the corrupted run are shown."""
        corrupted, example, upload = (source == s for s in mechanisms_view.SOURCES)
        return [
            gr.update(visible=corrupted),
            gr.update(visible=corrupted),
            gr.update(visible=example),
            gr.update(visible=upload),
        ]

    def _second_run(self, loaded: LoadedModel, a: session.Analysis, ask: PatchAsk):
        """(shown image, input [1, C, H, W], where it came from as `mechanisms_view.patching_numbers` keywords)
        of the corrupted run; ValueError/ImageInputError saying what is missing."""
        if ask.mx_source == mechanisms_view.SOURCES[0]:
            corruption = (ask.mx_corruption, int(ask.mx_severity))
            return (*mechanisms_view.corrupted_input(a.view, loaded.cfg, *corruption), {"corruption": corruption})
        path = ask.mx_example if ask.mx_source == mechanisms_view.SOURCES[1] else ask.mx_upload
        if not path:
            raise ValueError(
                f"choose {'an example' if ask.mx_source == mechanisms_view.SOURCES[1] else 'a file'} "
                "for the corrupted run"
            )
        _, view, x = session.model_input(path, loaded.cfg)
        return view, x, {"second_image": Path(path).name}

    def mechanisms_patch(self, **asked: Any) -> dict:
        """Activation patching of the chosen class's logit from this image into the second run: bars over depth
        and the CA heads' grid, in Δlogit, each with the share of the gap it restores.
        asked: the fields of `PatchAsk`, by name."""
        p, ask = self.page, PatchAsk(**asked)
        a = ask.analysis
        if a is None or a.choice != ask.choice:
            return {p.mx_msg: NO_IMAGE}
        loaded = self.cache.get(ask.choice)
        target = self._target(a, ask.mx_class, loaded.cfg.num_classes)
        try:
            shown, corrupted, origin = self._second_run(loaded, a, ask)
        except (ValueError, ImageInputError) as e:
            return {p.mx_msg: f"**Cannot patch:** {e}"}
        x, corrupted = a.x.to(loaded.device), corrupted.to(loaded.device)
        try:
            n = a.patching = mechanisms_view.patching_numbers(loaded.model, x, corrupted, target, **origin)
        except ValueError as e:  # a model without CaiT's class-attention stage
            return {p.mx_msg: f"**Cannot patch:** {e}"}
        label, cfg = loaded.labels[target], loaded.cfg
        broken = loaded.labels[n["corrupted_top1"]]
        title = (
            f"Patching '{label}': clean logit {n['clean_logit']:.2f}, corrupted {n['corrupted_logit']:.2f} "
            f"(top-1 '{broken}'), gap {n['gap']:.2f}"
        )
        return {
            p.mx_msg: "",
            p.json_file: self._numbers_file(loaded, a),
            p.mx_second: shown,
            p.mx_patch: patching_plotly(
                np.array(n["branches"]),
                n["gap"],
                class_token=np.array(n["class_token"]),
                depth=cfg.depth,
                ca_depth=cfg.depth_token_only,
                title=title,
            ),
            p.mx_patch_heads: heads_plotly(
                np.array(n["heads"]), n["gap"], title="Each CA head's clean output patched in alone"
            ),
        }

    def mechanisms_ablate(self, choice, a, target, ticked, mode) -> dict:
        """The ticked heads removed together: Δlogit of the chosen class and the new top-5."""
        p = self.page
        if a is None or a.choice != choice:
            return {p.mx_ablation: NO_IMAGE}
        if not ticked:
            return {p.mx_ablation: "<p><b>Tick at least one head.</b></p>"}
        loaded = self.cache.get(choice)
        reference = causal_view.ablation_reference(loaded, mode)
        result = mechanisms_view.set_ablation(
            loaded.model,
            a.x.to(loaded.device),
            heads=mechanisms_view.head_pairs(ticked, loaded.cfg.num_heads),
            target=self._target(a, target, loaded.cfg.num_classes),
            labels=loaded.labels,
            reference=reference,
        )
        return {p.mx_ablation: mechanisms_view.ablation_html(result, mode)}
