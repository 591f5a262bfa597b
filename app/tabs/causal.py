"""The Causal tab: what matters for the prediction (each CA head's direct write to the class's logit, the
knockout profile over depth, one head's ablation), computed once the tab is open, with its cost said before,
its progress block by block, and a Stop that always stops (`PageStops`). `app.causal_view` does the numbers."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import gradio as gr

from app import causal_view, session, texts, torch_thread
from app.choices import causal_heads, class_choices, top5_html
from app.models import LoadedModel, ModelCache, ModelChoice
from app.shared import MODEL_EVENTS, Shared, answering, named
from cait.explain import hooks
from cait.figures import head_name

log = logging.getLogger("cait.app")
MAX_PAGES = 1024  # pages whose Stop is remembered at most (each is dropped when its page closes)


@dataclass
class CausalParts:
    causal_tab: gr.Tab
    cz_state: gr.State  # the tab's CausalView of the shown image and class (or None)
    cz_cost: gr.Markdown  # what the tab will cost, said before it is computed; its progress once under way
    cz_stop: gr.Button
    cz_class: gr.Dropdown
    cz_mode: gr.Radio
    cz_heads_plot: gr.Plot
    cz_head: gr.Radio
    cz_maps: gr.Plot
    cz_top5: gr.HTML
    cz_knockout_of: gr.Radio
    cz_knockout: gr.Plot

    @property
    def computed(self) -> list:
        """What the tab shows of an image (computed when the tab is opened, or after the follow-up when it is
        already open)."""
        return [self.cz_state, self.cz_heads_plot, self.cz_maps, self.cz_top5, self.cz_knockout, self.cz_knockout_of]

    @property
    def results(self) -> list:
        """What a new image (or a new model) empties here."""
        return [self.cz_cost, self.cz_class, *self.computed]


@dataclass(frozen=True)
class ClassAsk:
    """What choosing another class sends (by name)."""

    choice: ModelChoice
    analysis: session.Analysis | None
    cz_class: int | None
    cz_head: int | None
    cz_mode: str


@dataclass(frozen=True)
class HeadAsk:
    """What picking another head (or way to remove it) sends (by name)."""

    choice: ModelChoice
    analysis: session.Analysis | None
    cz_state: causal_view.CausalView | None
    cz_head: int | None
    cz_mode: str


@dataclass(frozen=True)
class KnockoutAsk:
    """What choosing another part to knock out sends (by name)."""

    choice: ModelChoice
    analysis: session.Analysis | None
    cz_state: causal_view.CausalView | None
    cz_knockout_of: str | None


class Stopped(Exception):
    """A page's Stop button ended its Causal tab's computation (the message says so)."""


class PageStops:
    """Each page's Stop of its Causal computation. A request arms it (off the model queue, when the page asks);
    a Stop pressed from then on, even while the computation still waits in the queue, stops it when it starts;
    a computation that stops consumes it. Dropped when the page closes, and at most MAX_PAGES are kept."""

    def __init__(self) -> None:
        self._pressed: OrderedDict[str | None, threading.Event] = OrderedDict()
        self._lock = threading.Lock()

    def _event(self, request: gr.Request | None) -> threading.Event:
        key = getattr(request, "session_hash", None)
        with self._lock:
            event = self._pressed.setdefault(key, threading.Event())
            self._pressed.move_to_end(key)
            while len(self._pressed) > MAX_PAGES:
                self._pressed.popitem(last=False)
        return event

    def arm(self, request: gr.Request | None = None) -> None:
        """A new computation asked for: a Stop pressed before it counts no more."""
        self._event(request).clear()

    def press(self, request: gr.Request | None = None) -> None:
        """The Stop button: this page's computation ends before the next block the model runs."""
        self._event(request).set()

    def pressed(self, request: gr.Request | None) -> threading.Event:
        return self._event(request)

    def drop(self, request: gr.Request | None = None) -> None:
        """The page closed."""
        with self._lock:
            self._pressed.pop(getattr(request, "session_hash", None), None)

    def __len__(self) -> int:
        return len(self._pressed)


def build(first: LoadedModel, tab: gr.Tab) -> CausalParts:
    """The tab's components (inside `tab`)."""
    gr.Markdown(
        "What *matters* for the prediction, not only where the model looks: each class-attention head's "
        "direct write to the chosen class's logit, beside the logit built from all its parts (heads, MLPs, "
        "initial class token, biases: the final norm linearised at this image, so they add up to the logit), "
        "the logit change when a whole block, or one of its branches, is knocked out (its "
        "LayerScale gammas set to 0) beside its mean |gamma|, and what removing one head does to the top-5. "
        "Pick a head to see where it read (attention) beside what it wrote from each patch."
    )
    parts: dict[str, Any] = {"causal_tab": tab}
    with gr.Row():
        parts["cz_cost"] = gr.Markdown(elem_id="cz_cost")
        parts["cz_stop"] = gr.Button("Stop", size="sm", scale=0, min_width=80, elem_id="cz_stop")
    parts["cz_state"] = gr.State(None)
    with gr.Row():
        parts["cz_class"] = gr.Dropdown(label="Class", choices=[], elem_id="cz_class")
        parts["cz_mode"] = gr.Radio(
            list(causal_view.ABLATIONS), value=causal_view.ABLATIONS[0], label="Remove a head by", elem_id="cz_mode"
        )
    parts["cz_heads_plot"] = gr.Plot(label="Each head: direct write vs. effect of removal", elem_id="cz_heads_plot")
    parts["cz_head"] = gr.Radio(causal_heads(first.cfg), value=0, label="Head (click to ablate)", elem_id="cz_head")
    with gr.Row():
        with gr.Column(scale=3):
            parts["cz_maps"] = gr.Plot(label="Where the head read, what it wrote", elem_id="cz_maps")
        with gr.Column(scale=2):
            parts["cz_top5"] = gr.HTML(elem_id="cz_top5")
    parts["cz_knockout_of"] = gr.Radio(
        list(causal_view.KNOCKOUTS), value=None, label="Knock out of each block", elem_id="cz_knockout_of"
    )
    parts["cz_knockout"] = gr.Plot(label="Knockout profile over depth", elem_id="cz_knockout")
    return CausalParts(**parts)


class CausalTab:
    """The tab's events and what it draws."""

    def __init__(self, parts: CausalParts, shared: Shared, cache: ModelCache):
        self.parts, self.shared, self.cache = parts, shared, cache
        self.stops = PageStops()

    def outputs(self, loaded: LoadedModel, a: session.Analysis, view, head: int, mode: str) -> dict:
        """The tab for `view` (a `causal_view.CausalView`) with head `head` (layer * heads + head) picked: the
        bars, its maps and its ablation, the knockout profile."""
        p = self.parts
        return {
            p.cz_state: view,
            p.cz_heads_plot: causal_view.head_figure(view, loaded.labels[view.target]),
            p.cz_knockout: causal_view.knockout_figure(view, loaded.cfg),
            p.cz_knockout_of: next(iter(causal_view.KNOCKOUTS)),  # a new view starts with whole blocks
            **self.head_outputs(loaded, a, view, head, mode),
        }

    def head_outputs(self, loaded: LoadedModel, a: session.Analysis, view, head: int, mode: str) -> dict:
        layer, head = divmod(int(head), loaded.cfg.num_heads)
        reference = causal_view.ablation_reference(loaded, mode)
        top5 = causal_view.ablation(
            loaded.model, a.x.to(loaded.device), layer=layer, head=head, labels=loaded.labels, reference=reference
        )
        return {
            self.parts.cz_maps: causal_view.maps_figure(view, a.ca_maps[layer, head], layer, head, a.view),
            self.parts.cz_top5: top5_html(top5, f"without {head_name(layer, head)}"),
        }

    def opened(self, choice, a, shown, request: gr.Request | None = None, progress=gr.Progress()) -> dict:
        """The tab opened: its view of the image's top class, computed now unless it is on show already, and the
        JSON download rewritten with its numbers. Progress is told block by block; the page's Stop (`PageStops`)
        ends the work before the next block the model runs, which frees the model queue."""
        if a is None or a.choice != choice or shown is not None:
            return gr.skip()
        loaded = self.cache.get(choice)
        stop = self.stops.pressed(request)
        knocked = [0, loaded.cfg.depth + loaded.cfg.depth_token_only]  # knockouts done, of how many

        def on_block(done: int, total: int) -> None:
            knocked[:] = done, total
            progress((done, total), desc="knocking out block by block", unit="blocks")

        def stopped() -> None:
            if stop.is_set():
                stop.clear()  # consumed: the next request computes
                done, total = knocked
                raise Stopped(f"**Stopped** after {done} of {total} knockouts; open the tab again to compute it.")

        progress((0, knocked[1]), desc="attributing the logit and ablating each head", unit="blocks")
        try:
            with hooks.before_each([*loaded.model.blocks, *loaded.model.blocks_token_only], stopped):
                view = causal_view.compute(loaded.model, a.x.to(loaded.device), a.top_class, on_block=on_block)
                a.causal = causal_view.numbers(loaded.model, a.x.to(loaded.device), view)
                out = self.outputs(loaded, a, view, 0, causal_view.ABLATIONS[0])
        except Stopped as e:
            log.info("causal view stopped by its page")
            return {self.parts.cz_cost: str(e)}
        out[self.shared.json_file] = session.numbers_file(loaded, a)
        return out

    def choose_class(self, **asked: Any) -> dict:
        """Another class chosen: the attribution and knockouts for its logit. asked: `ClassAsk`'s fields."""
        ask = ClassAsk(**asked)
        a = ask.analysis
        if a is None or a.choice != ask.choice or ask.cz_class is None:
            return {}
        loaded = self.cache.get(ask.choice)
        view = causal_view.compute(loaded.model, a.x.to(loaded.device), int(ask.cz_class))
        return self.outputs(loaded, a, view, int(ask.cz_head or 0), ask.cz_mode)

    def knockout(self, **asked: Any) -> dict:
        """Another part to knock out of each block (whole block, attention or MLP branch): the profile for it.
        asked: `KnockoutAsk`'s fields."""
        ask = KnockoutAsk(**asked)
        a, view = ask.analysis, ask.cz_state
        if a is None or a.choice != ask.choice or view is None or ask.cz_knockout_of is None:
            return {}
        loaded = self.cache.get(ask.choice)
        profile = causal_view.branch_knockout(loaded.model, a.x.to(loaded.device), view, ask.cz_knockout_of)
        return {self.parts.cz_knockout: causal_view.knockout_figure(view, loaded.cfg, profile, ask.cz_knockout_of)}

    def head(self, **asked: Any) -> dict:
        """Another head picked (or another way to remove it): its maps and the top-5 without it. asked:
        `HeadAsk`'s fields."""
        ask = HeadAsk(**asked)
        a, view = ask.analysis, ask.cz_state
        if a is None or a.choice != ask.choice or view is None or ask.cz_head is None:
            return {}
        return self.head_outputs(self.cache.get(ask.choice), a, view, int(ask.cz_head), ask.cz_mode)

    def cost(self, loaded: LoadedModel, a: session.Analysis) -> dict:
        """The first view of a new image here: what computing the tab will cost."""
        passes = causal_view.forward_passes(loaded.cfg)
        said = texts.cost_in_passes(
            "Computing this tab", passes, a.forward_seconds, reduced_precision=loaded.dtype is not None
        )
        return {self.parts.cz_cost: said}

    def details(self, loaded: LoadedModel, a: session.Analysis) -> dict:
        """The follow-up of a new image here: the class menu at the top class, the first head."""
        return {
            self.parts.cz_class: gr.Dropdown(choices=class_choices(loaded.labels), value=a.top_class),
            self.parts.cz_head: 0,
        }

    def cleared(self) -> dict:
        return dict.fromkeys(self.parts.results) | {self.parts.cz_cost: ""}

    def for_model(self, loaded: LoadedModel) -> dict:
        return {
            self.parts.cz_class: gr.Dropdown(choices=[], value=None),
            self.parts.cz_head: gr.Radio(choices=causal_heads(loaded.cfg), value=0),
        }

    def wire(self) -> None:
        p, shared, on_torch = self.parts, self.shared, torch_thread.handler
        # armed at once, off the model queue: a Stop pressed while the computation waits stops it when it starts
        p.causal_tab.select(self.stops.arm, None, None, queue=False, api_visibility="private").then(
            on_torch(answering(self.opened, said=lambda line: {p.cz_cost: line})),
            [shared.choice, shared.analysis, p.cz_state],
            [*p.computed, shared.json_file, p.cz_cost],
            show_progress_on=[p.cz_cost],
            **MODEL_EVENTS,
        )
        # off the model queue: it must get through while the computation it stops holds the queue
        p.cz_stop.click(self.stops.press, None, None, queue=False, api_visibility="private")
        # input, not change: the follow-up of a new image sets the class and the head itself
        p.cz_class.input(
            on_torch(answering(self.choose_class)),
            inputs_kwargs=named(p, ClassAsk, choice=shared.choice, analysis=shared.analysis),
            outputs=p.computed,
            **MODEL_EVENTS,
        )
        p.cz_knockout_of.input(
            on_torch(answering(self.knockout)),
            inputs_kwargs=named(p, KnockoutAsk, choice=shared.choice, analysis=shared.analysis),
            outputs=p.cz_knockout,
            **MODEL_EVENTS,
        )
        for control in (p.cz_head, p.cz_mode):
            control.input(
                on_torch(answering(self.head)),
                inputs_kwargs=named(p, HeadAsk, choice=shared.choice, analysis=shared.analysis),
                outputs=[p.cz_maps, p.cz_top5],
                **MODEL_EVENTS,
            )
