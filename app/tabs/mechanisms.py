"""The Mechanisms tab: how the answer forms along depth and where it enters the class token. The logit lens when
the tab is opened (or a new image comes while it is open, or another class is chosen); against a second run,
activation patching over depth and token patching into the class stage (each a long run, with its cost said
before, its progress and a Stop); the ablation of the ticked heads. `app.mechanisms_view` does the numbers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gradio as gr
import numpy as np

import cait
from app import causal_view, figures, mechanisms_view, session, torch_thread
from app.choices import causal_heads, class_choices
from app.long_work import Ended, LongWork, did_not_finish
from app.mechanisms_view import DEFAULT_REGION
from app.models import LoadedModel, ModelCache, ModelChoice
from app.page_tab import PageTab
from app.shared import MODEL_EVENTS, Shared, answering, named
from app.texts import NO_IMAGE, ProgressLine, cost_in_passes
from cait.errors import InputError
from cait.explain.token_patching import checked_region, region_bounds
from cait.figures.mechanisms import gap_too_small, heads_plotly, lens_plotly, patching_plotly

log = logging.getLogger("cait.app")
# the corrupted run by default: it must leave a gap large enough for shares (`gap_too_small`). On the shipped
# model's 14 examples gaussian_noise:3 left less than one logit on 6 (-0.05 on the first); contrast at severity 5
# left at least 1.65 on every one (docs/app_api.md: the measurement)
DEFAULT_CORRUPTION = ("contrast", 5)


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
    mx_upload: gr.File
    mx_patch_run: gr.Button
    mx_patch_stop: gr.Button
    mx_cost: gr.Markdown
    mx_msg: gr.Markdown
    mx_second: gr.Image
    mx_patch: gr.Plot
    mx_patch_heads: gr.Plot
    mx_region: gr.Slider
    mx_token_run: gr.Button
    mx_token_stop: gr.Button
    mx_token_cost: gr.Markdown
    mx_tokens: gr.Plot
    mx_heads: gr.CheckboxGroup
    mx_mode: gr.Radio
    mx_ablate: gr.Button
    mx_ablation: gr.HTML

    @property
    def controls(self) -> list:
        """The controls whose choices depend on the page's model (its heads, examples, patch grid)."""
        return [self.mx_heads, self.mx_example, self.mx_region]

    @property
    def opened(self) -> list:
        """What opening the tab writes (but the download, which the page owns)."""
        return [self.mx_class, *self.controls, self.mx_msg, self.mx_lens, self.mx_cost, self.mx_token_cost]

    @property
    def patched(self) -> list:
        """What a patching run shows (emptied when it fails or stops)."""
        return [self.mx_second, self.mx_patch, self.mx_patch_heads]

    @property
    def results(self) -> list:
        """What a new image (or a new model) empties here."""
        shown = [self.mx_lens, self.mx_cost, self.mx_token_cost, self.mx_msg, *self.patched, self.mx_tokens]
        return [self.mx_class, *shown, self.mx_ablation]


@dataclass(frozen=True)
class OpenAsk:
    """What opening the tab sends, each field named as its component (`app.shared.named`)."""

    choice: ModelChoice
    analysis: session.Analysis | None
    mx_class: int | None  # None: the top prediction
    mx_example: str | None  # the controls' values as the page has them
    mx_region: float | None
    mx_heads: list[str] | None


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
class TokenAsk(PatchAsk):
    """What the token-patching button sends (by name): the second run as for patching, and the region size."""

    mx_region: float = DEFAULT_REGION  # a region's side in patches (the slider's number)


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


def _second_run_controls(first: LoadedModel) -> dict[str, Any]:
    """Where the corrupted run comes from: the source on the left, its own controls (only the chosen
    source's shown) on the right."""
    from cait.corruptions import CORRUPTIONS  # torchvision: only once the page is built

    parts: dict[str, Any] = {}
    sources = mechanisms_view.SOURCES
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=480):  # the three sources on one line
            parts["mx_source"] = gr.Radio(list(sources), value=sources[0], label="Corrupted run", elem_id="mx_source")
        with gr.Column(scale=1, min_width=320):
            with gr.Row():
                parts["mx_corruption"] = gr.Dropdown(
                    list(CORRUPTIONS), value=DEFAULT_CORRUPTION[0], label="Corruption", elem_id="mx_corruption"
                )
                parts["mx_severity"] = gr.Slider(
                    1, 5, value=DEFAULT_CORRUPTION[1], step=1, label="Severity", elem_id="mx_severity"
                )
            paths = [path for path, _ in first.examples]
            parts["mx_example"] = gr.Dropdown(
                [(c, path) for path, c in first.examples],
                value=paths[0] if paths else None,
                label="Example",
                visible=False,
                elem_id="mx_example",
            )
            # a file, not an image box: any file reaches the handler, which says what is wrong with it
            parts["mx_upload"] = gr.File(
                label="Second image (an image file)", type="filepath", height=140, visible=False, elem_id="mx_upload"
            )
    return parts


def _stop_button(elem_id: str) -> gr.Button:
    """A long run's Stop: enabled only while its run is asked for or runs."""
    return gr.Button("Stop", size="sm", scale=0, min_width=80, interactive=False, elem_id=elem_id)


def build(first: LoadedModel, tab: gr.Tab) -> MechanismsParts:
    """The tab's components (inside `tab`)."""
    gr.Markdown(
        "How the answer forms along depth, and where over the image it enters the class token. **Logit lens:** "
        "the model's own class-attention stage and head read the patch tokens after each SA block: the chosen "
        "class's probability and the top-1 there. **Activation patching:** a second, corrupted run; each "
        "component's clean output patched into it alone, and how much of the clean-corrupted gap of the class's "
        "logit that restores. **Token patching:** one region of the clean patch tokens at a time patched into "
        "the corrupted run's class stage (and the reverse), beside the class attention. **Ablation:** remove "
        "several class-attention heads together."
    )
    parts: dict[str, Any] = {"mechanisms_tab": tab}
    parts["mx_class"] = gr.Dropdown(label="Class", choices=[], elem_id="mx_class")
    parts["mx_lens"] = gr.Plot(label="Logit lens", elem_id="mx_lens")
    parts |= _second_run_controls(first)
    with gr.Row(equal_height=True):
        parts["mx_patch_run"] = gr.Button("Patch", variant="primary", scale=0, min_width=160, elem_id="mx_patch_run")
        parts["mx_patch_stop"] = _stop_button("mx_patch_stop")
        parts["mx_cost"] = gr.Markdown(elem_id="mx_cost")
    parts["mx_msg"] = gr.Markdown(elem_id="mx_msg")
    with gr.Row():
        parts["mx_second"] = gr.Image(
            label="Corrupted run's input", type="pil", interactive=False, height=220, scale=1, elem_id="mx_second"
        )
        with gr.Column(scale=4):
            parts["mx_patch"] = gr.Plot(label="Patching over depth", elem_id="mx_patch")
    parts["mx_patch_heads"] = gr.Plot(label="Patching per class-attention head", elem_id="mx_patch_heads")
    low, high = region_bounds(first.cfg.grid_size)
    with gr.Row(equal_height=True):
        parts["mx_region"] = gr.Slider(
            low, high, value=DEFAULT_REGION, step=1, label="Region side (patches)", scale=2, elem_id="mx_region"
        )
        parts["mx_token_run"] = gr.Button("Map where the answer enters", scale=0, min_width=220, elem_id="mx_token_run")
        parts["mx_token_stop"] = _stop_button("mx_token_stop")
        parts["mx_token_cost"] = gr.Markdown(elem_id="mx_token_cost")
    parts["mx_tokens"] = gr.Plot(label="Token patching into the class stage", elem_id="mx_tokens")
    with gr.Row():
        parts["mx_heads"] = gr.CheckboxGroup(
            causal_heads(first.cfg), value=[], label="Heads to ablate together", elem_id="mx_heads", scale=3
        )
        parts["mx_mode"] = gr.Radio(
            list(causal_view.ABLATIONS),
            value=causal_view.ABLATIONS[0],
            label="Remove by",
            scale=2,
            min_width=300,
            elem_id="mx_mode",
        )
        parts["mx_ablate"] = gr.Button("Ablate", scale=0, min_width=120, elem_id="mx_ablate")
    parts["mx_ablation"] = gr.HTML(elem_id="mx_ablation")
    return MechanismsParts(**parts)


def _target(a: session.Analysis, asked: int | None, classes: int) -> int:
    return a.top_class if asked is None or not 0 <= int(asked) < classes else int(asked)


def _region_kept(region: float | None, grid: int) -> int:
    """The region side the slider keeps for a model of patch grid side `grid` (the page's, when it fits)."""
    return min(int(region or DEFAULT_REGION), region_bounds(grid)[1])


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


class MechanismsTab(PageTab):
    """The tab's events and what it draws."""

    def __init__(self, parts: MechanismsParts, shared: Shared, cache: ModelCache):
        self.parts, self.shared, self.cache = parts, shared, cache
        self.runs = PatchingRuns(parts, shared, cache)

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
            p.mx_cost: cost_in_passes("Patching", passes, a.forward_seconds, loaded=loaded),
            self.shared.json_file: session.numbers_file(loaded, a),
        }

    def controls(self, loaded: LoadedModel, example: str | None, region: float | None, heads: list | None) -> dict:
        """The controls that depend on the page's model, for `loaded`: each keeps the page's value when the model
        takes it (`example`, `region`, `heads` as the page has them; None: not known), else its default. A value
        the choices lack would fail the next event's input check before any handler runs."""
        p, paths = self.parts, [path for path, _ in loaded.examples]
        low, high = region_bounds(loaded.cfg.grid_size)
        choices = causal_heads(loaded.cfg)
        kept = [h for h in heads or [] if h in {i for _, i in choices}]
        return {
            p.mx_heads: gr.CheckboxGroup(choices=choices, value=kept),
            p.mx_example: gr.Dropdown(
                choices=[(c, path) for path, c in loaded.examples],
                value=example if example in paths else (paths[0] if paths else None),
            ),
            p.mx_region: gr.Slider(minimum=low, maximum=high, value=_region_kept(region, high), step=1),
        }

    def token_cost(self, choice: ModelChoice, a: session.Analysis | None, region: float | None) -> dict:
        """The cost line of token patching at region side `region` (nothing when no image is shown, or the
        model is not loaded: this runs off the torch thread, and never loads one)."""
        if a is None or a.choice != choice or choice not in self.cache.cached or region is None:
            return {self.parts.mx_token_cost: ""}
        loaded = self.cache.get(choice)
        if without_class_stage(loaded.cfg):
            return {self.parts.mx_token_cost: ""}
        region = min(int(region), loaded.cfg.grid_size)
        return {self.parts.mx_token_cost: mechanisms_view.token_cost(loaded, region, a.forward_seconds)}

    def open_asked(self, **asked: Any) -> dict:
        """The tab selected: `opened` with the page's values. asked: `OpenAsk`'s fields, by name."""
        ask = OpenAsk(**asked)
        return self.opened(ask.choice, ask.analysis, ask.mx_class, ask.mx_example, ask.mx_region, ask.mx_heads)

    def opened(self, choice, a, target, example=None, region=None, heads=None) -> dict:
        """The tab opened (or a new image shown while it is open): the controls of the page's model, the class
        menu, and the lens of the chosen class (the top prediction unless another is chosen) with the cost
        lines. example, region, heads: the controls' values as the page has them (None from a new image)."""
        p, loaded = self.parts, self.cache.get(choice)
        out = self.controls(loaded, example, region, heads)
        if a is None or a.choice != choice:
            return out | {p.mx_msg: NO_IMAGE}
        if without_class_stage(loaded.cfg):
            return out | {p.mx_msg: "**No lens for this model:** it has no class-attention stage to read through."}
        target = _target(a, target, loaded.cfg.num_classes)
        out |= {p.mx_class: gr.Dropdown(choices=class_choices(loaded.labels), value=target), p.mx_msg: ""}
        out |= self.token_cost(choice, a, _region_kept(region, loaded.cfg.grid_size))
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

    def followed(self) -> list:
        return self.parts.opened

    def follow_up(self, choice, a, request, progress) -> dict:
        return torch_thread.handler(self.opened)(choice, a, None)

    def wire(self, demo: gr.Blocks, page: Any) -> None:
        p, shared, on_torch = self.parts, self.shared, torch_thread.handler
        said = lambda line: {p.mx_msg: line}  # noqa: E731
        p.mechanisms_tab.select(
            on_torch(answering(self.open_asked, said=said)),
            inputs_kwargs=named(p, OpenAsk, choice=shared.choice, analysis=shared.analysis),
            outputs=[*p.opened, shared.json_file],
            **MODEL_EVENTS,
        )
        p.mx_class.input(
            on_torch(answering(self.choose_class, said=said)),
            [shared.choice, shared.analysis, p.mx_class],
            [p.mx_lens, p.mx_cost, shared.json_file, p.mx_msg],
            **MODEL_EVENTS,
        )
        # off the model queue and the torch thread: the line is arithmetic on the loaded model's config
        p.mx_region.change(
            answering(self.token_cost),
            [shared.choice, shared.analysis, p.mx_region],
            p.mx_token_cost,
            queue=False,
            api_visibility="private",
        )
        p.mx_source.change(
            self.source,
            p.mx_source,
            [p.mx_corruption, p.mx_severity, p.mx_example, p.mx_upload],
            queue=False,
            api_visibility="private",
        )
        self.runs.wire(demo)
        p.mx_ablate.click(
            on_torch(answering(self.ablate, said=lambda line: {p.mx_ablation: line})),
            inputs_kwargs=named(p, AblateAsk, choice=shared.choice, analysis=shared.analysis),
            outputs=p.mx_ablation,
            **MODEL_EVENTS,
        )


class PatchingRuns:
    """The tab's two long runs against a second, corrupted run (activation patching over depth, token patching
    into the class stage), each with its own Stop (`LongWork`, per page)."""

    def __init__(self, parts: MechanismsParts, shared: Shared, cache: ModelCache):
        self.parts, self.shared, self.cache = parts, shared, cache
        self.patch_stops, self.token_stops = LongWork(parts.mx_patch_stop), LongWork(parts.mx_token_stop)

    def _run(self, stops: LongWork, ask: PatchAsk, failed: Callable[[str], dict], plan: Callable, *, request,
             progress, what: str) -> tuple | dict:  # fmt: skip
        """A patching run of `ask` holding the page's Stop (`stops`): plan(loaded, x, corrupted, target, origin)
        says (the runs it reads through the head, the computation); that on the long lane with its progress in runs
        (`mechanisms_view.counted_runs`) and the Stop, heard while it waits for the lane (its line says it waits),
        when it starts and before each block and each read of the head. Returns (loaded, analysis, target, shown
        second image, numbers), or failed(the line said instead: what is missing, or how it ended)."""
        with stops.holding(request) as held:
            got = torch_thread.call(self._asked, ask, failed)
            if isinstance(got, dict):
                return got
            loaded, a, target, shown, corrupted, origin = got
            total, compute = plan(loaded, a.x.to(loaded.device), corrupted, target, origin)
            check = lambda: held.stop_if_pressed(what)  # noqa: E731
            line = ProgressLine(progress)
            report = lambda done, all_: line((done, all_), desc=what, unit="runs")  # noqa: E731

            def work() -> dict:
                with mechanisms_view.counted_runs(loaded.model, total, report=report, check=check):
                    return compute()

            stopped = did_not_finish(what, "press its button again to compute it.")
            n = stops.run(work, held=held, what=what, stopped=lambda: stopped, model=loaded.model, progress=line)
        return failed(n.line) if isinstance(n, Ended) else (loaded, a, target, shown, n)

    def _asked(self, ask: PatchAsk, failed: Callable[[str], dict]):
        """(loaded, analysis, target, shown second image, corrupted input, origin) of a patching request, or the
        failed answer for what is missing (no image, no class stage, no second image, a file that is no image)."""
        a = ask.analysis
        if a is None or a.choice != ask.choice:
            return failed(NO_IMAGE)
        loaded = self.cache.get(ask.choice)
        if without_class_stage(loaded.cfg):
            return failed("**Cannot patch:** this model has no class-attention stage.")
        try:
            shown, corrupted, origin = _second_run(loaded, a, ask)
        except InputError as e:
            log.info("patching refused: %s", e)
            return failed(f"**Cannot patch:** {e}")
        target = _target(a, ask.mx_class, loaded.cfg.num_classes)
        return loaded, a, target, shown, corrupted.to(loaded.device), origin

    def patch_failed(self, line: str) -> dict:
        """A patching run that could not run (or stopped): its line, and no result of an earlier run left."""
        return {self.parts.mx_msg: line} | dict.fromkeys(self.parts.patched)

    def patch(self, request: gr.Request | None = None, progress=gr.Progress(), **asked: Any) -> dict:
        """Activation patching of the chosen class's logit from this image into the second run: bars over depth
        and the CA heads' grid, in Δlogit, each with the share of the gap it restores (when the gap is large
        enough for shares). Progress per patched run; the page's Stop (armed by the button) ends it. asked:
        `PatchAsk`'s fields."""
        p, mv = self.parts, mechanisms_view
        plan = lambda loaded, x, corrupted, target, origin: (  # noqa: E731
            mv.patching_runs(loaded.cfg),
            lambda: mv.patching_numbers(loaded.model, x, corrupted, target, **origin),
        )
        got = self._run(self.patch_stops, PatchAsk(**asked), self.patch_failed, plan, request=request,
                        progress=progress, what="patching")  # fmt: skip
        if isinstance(got, dict):
            return got
        loaded, a, _, shown, n = got
        a.patching = n
        return {
            p.mx_msg: self.small_gap_note(n["gap"]),
            self.shared.json_file: session.numbers_file(loaded, a),
            p.mx_second: figures.image_file(shown, "corrupted"),
            **self.patching_figures(loaded, n),
        }

    @staticmethod
    def small_gap_note(gap: float) -> str:
        """The message line after a patching run: why no shares are given, when the gap is too small."""
        return f"**No shares:** {mechanisms_view.small_gap_words(gap)}." if gap_too_small(gap) else ""

    def patching_figures(self, loaded: LoadedModel, n: dict) -> dict:
        """The patching run's two figures: the profile over depth and the CA heads' grid."""
        p, cfg, label = self.parts, loaded.cfg, loaded.labels[n["target"]]
        title = (
            f"Patching '{label}': clean logit {n['clean_logit']:.2f}, corrupted {n['corrupted_logit']:.2f} "
            f"(top-1 '{loaded.labels[n['corrupted_top1']]}'), gap {n['gap']:.2f}"
        )
        profile = patching_plotly(
            np.array(n["branches"]),
            n["gap"],
            class_token=np.array(n["class_token"]),
            depth=cfg.depth,
            ca_depth=cfg.depth_token_only,
            title=title,
        )
        heads = heads_plotly(np.array(n["heads"]), n["gap"], title="Each CA head's clean output patched in alone")
        return {p.mx_patch: profile, p.mx_patch_heads: heads}

    def token_failed(self, line: str) -> dict:
        """A token-patching run that could not run (or stopped): its line, and no map of an earlier run left."""
        return {self.parts.mx_msg: line, self.parts.mx_second: None, self.parts.mx_tokens: None}

    def tokens(self, request: gr.Request | None = None, progress=gr.Progress(), **asked: Any) -> dict:
        """Token patching of the chosen class's logit into the class stage, region by region of the size asked,
        both directions, drawn over the image beside the class attention with their rank correlation, and kept
        for the JSON download. Progress per region run; the page's Stop (armed by the button) ends it.
        asked: `TokenAsk`'s fields."""
        p, ask, mv = self.parts, TokenAsk(**asked), mechanisms_view

        def plan(loaded, x, corrupted, target, origin) -> tuple:
            region = checked_region(ask.mx_region, loaded.cfg.grid_size, name="region side")
            n = lambda: mv.token_numbers(loaded.model, x, corrupted, target, region=region, **origin)  # noqa: E731
            return mv.token_runs(loaded.cfg, region), n

        got = self._run(self.token_stops, ask, self.token_failed, plan, request=request, progress=progress,
                        what="token patching")  # fmt: skip
        if isinstance(got, dict):
            return got
        loaded, a, target, shown, n = got
        a.token_patching = n
        figure = mechanisms_view.token_map_figure(n, a.view, label=loaded.labels[target])
        return {
            p.mx_msg: self.small_gap_note(n["gap"]),
            p.mx_second: figures.image_file(shown, "corrupted"),
            p.mx_tokens: figure,
            self.shared.json_file: session.numbers_file(loaded, a),
        }

    def wire(self, demo: gr.Blocks) -> None:
        """Each run's button: armed and its Stop enabled at once (off the model queue: a Stop pressed while the
        run still waits counts), the run on the long lane with its progress, then its Stop disabled unless
        another run of the page has not ended, whether this one finished, failed or stopped."""
        p, shared = self.parts, self.shared
        self.patch_stops.wire(
            demo, p.mx_patch_run.click, answering(self.patch, said=self.patch_failed),
            inputs_kwargs=named(p, PatchAsk, choice=shared.choice, analysis=shared.analysis),
            outputs=[p.mx_msg, shared.json_file, *p.patched], show_progress_on=[p.mx_patch],
        )  # fmt: skip
        self.token_stops.wire(
            demo, p.mx_token_run.click, answering(self.tokens, said=self.token_failed),
            inputs_kwargs=named(p, TokenAsk, choice=shared.choice, analysis=shared.analysis),
            outputs=[p.mx_msg, p.mx_second, p.mx_tokens, shared.json_file], show_progress_on=[p.mx_tokens],
        )  # fmt: skip
