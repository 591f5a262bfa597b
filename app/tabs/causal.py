"""The Causal tab: what matters for the prediction (each CA head's direct write to the class's logit, the
knockout profile over depth, one head's ablation), computed once the tab is open, with its cost said before,
its progress block by block, and a Stop that always stops (`PageStops`). `app.causal_view` does the numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from app import causal_view, session, texts, torch_thread
from app.choices import causal_heads, class_choices, top5_html
from app.long_work import Ended, LongWork, did_not_finish
from app.models import LoadedModel, ModelCache, ModelChoice
from app.page_tab import PageTab
from app.shared import CAUSAL_TAB, LONG_EVENTS, MODEL_EVENTS, Shared, answering, named
from app.stops import Held
from cait.figures import head_name


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
    def opened(self) -> list:
        """What computing the tab's view writes: the view, the cost line (its progress, or why it stopped) and the
        Stop (enabled while the view is computed)."""
        return [*self.computed, self.cz_cost, self.cz_stop]

    @property
    def results(self) -> list:
        """What a new image (or a new model) empties here (and the Stop, disabled: nothing runs for it)."""
        return [self.cz_cost, self.cz_class, self.cz_stop, *self.computed]


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
        parts["cz_stop"] = gr.Button(
            "Stop", size="sm", scale=0, min_width=80, interactive=False, elem_id="cz_stop"
        )  # enabled while the view is computed
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


def computes(choice, a, shown) -> bool:
    """Whether opening the tab computes its view: an image analysed by the page's model, not on show yet."""
    return a is not None and a.choice == choice and shown is None


class CausalStop(LongWork):
    """The tab's one Stop over its three long computations (the view of the image's top class when the tab opens,
    another class's view, another part's knockout profile): each armed at once, off the queues, when it is asked
    for."""

    def __init__(self, parts: CausalParts):
        super().__init__(parts.cz_stop)
        self.cost = parts.cz_cost

    def will_compute(self, choice, a, shown, request: gr.Request | None = None) -> dict:
        """The tab opened (at once, off the queues): its view armed when it computes, so that a Stop from now on
        counts, even while the computation waits for the long lane."""
        return self.arm_if(computes(choice, a, shown), request)

    def armed(self, choice, a, request: gr.Request | None = None) -> dict:
        """Another class or knockout asked for (at once, off the queues): armed when the page has an image of its
        model to compute it for."""
        return self.arm_if(a is not None and a.choice == choice, request)

    def new_image(self, open_tab: str, a, request: gr.Request | None = None) -> dict:
        """The page has a new image `a` (off the queues, before what the open tab computes of it): its view armed
        and the Stop enabled if the tab is on show (it computes it). Otherwise the Stop is left as it is: the tab
        may have been opened after the pick, and its armed view be waiting for the long lane: skipped, not an
        empty dict, which Gradio would take as the lone output's value (the Stop's label read "{}")."""
        return self.arm_if(True, request) if open_tab == CAUSAL_TAB and a is not None else gr.skip()

    def shown(self, got: dict | Ended) -> dict | None:
        """What a computation shows: its answer, the line it ended with, or nothing once cancelled."""
        if not isinstance(got, Ended):
            return got
        return None if got.cancelled else {self.cost: got.line}

    def failed(self, line: str) -> dict:
        """A computation that failed: its line where the tab says its cost, and the Stop disabled."""
        return {self.cost: line, self.button: gr.Button(interactive=False)}


class CausalFigures:
    """What the tab draws of a computed view, and its quick event (another head picked)."""

    def __init__(self, parts: CausalParts, cache: ModelCache):
        self.parts, self.cache = parts, cache

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

    def head(self, **asked: Any) -> dict:
        """Another head picked (or another way to remove it): its maps and the top-5 without it. asked:
        `HeadAsk`'s fields."""
        ask = HeadAsk(**asked)
        a, view = ask.analysis, ask.cz_state
        if a is None or a.choice != ask.choice or view is None or ask.cz_head is None:
            return {}
        return self.head_outputs(self.cache.get(ask.choice), a, view, int(ask.cz_head), ask.cz_mode)

    def cost(self, loaded: LoadedModel, a: session.Analysis) -> dict:
        """The first view of a new image here (and the line once a view is computed): what computing the tab
        costs."""
        passes = causal_view.forward_passes(loaded.cfg)
        said = texts.cost_in_passes("Computing this tab", passes, a.forward_seconds, loaded=loaded)
        return {self.parts.cz_cost: said}


class CausalTab(PageTab):
    """The tab's events. Its three long computations run on the long lane with the page's one Stop
    (`CausalStop`); `CausalFigures` draws what they computed."""

    def __init__(self, parts: CausalParts, shared: Shared, cache: ModelCache):
        self.parts, self.shared, self.cache = parts, shared, cache
        self.stops = CausalStop(parts)
        self.figures = CausalFigures(parts, cache)
        self.at_first_view = self.figures.cost  # a new image's first view says what computing the tab costs
        self.kept = causal_view.Kept()  # views computed or begun, shared by every page

    def opened(self, choice, a, shown, request: gr.Request | None = None, progress=gr.Progress()) -> dict:
        """The tab opened: its view of the image's top class, computed now on the long lane unless it is on show
        already, and the JSON download rewritten with its numbers. Progress is told by phase, block by block; the
        page's Stop (armed by `CausalStop.will_compute`) ends the work before the next block the model runs, and what
        was done is kept (`causal_view.Kept`): opened again, it goes on from there. The page's next image cancels
        it (`LongWork.moved_on`): then only the Stop is written."""
        if not computes(choice, a, shown):
            return gr.skip()
        again = "open the tab again to go on from there."
        return self._view(request, choice, a, a.top_class, progress, again=again, keep=True)

    def _view(self, request, choice: ModelChoice, a: session.Analysis, target: int | None, progress, *, again: str,
              head: int = 0, mode: str = causal_view.ABLATIONS[0], keep: bool = False) -> dict:  # fmt: skip
        """The view of class `target` (None: nothing to compute) on the long lane as far as `Kept` has it, computed
        on with its progress, holding the page's Stop (whose line says how far it got, then `again`): what
        the tab shows of it (head `head` picked, removed by `mode`) and, with `keep` (the top class's view), its
        numbers kept on the analysis and the download rewritten; only the Stop when the page's next image
        cancelled it (that image's first view emptied the tab)."""

        line = texts.ProgressLine(progress)

        def view(held: Held) -> dict | None:
            if target is None:
                return {}
            loaded = torch_thread.call(self.cache.get, choice)
            partial = self.kept.of(loaded.choice, a.x, target)
            knocked = [len(partial.knocked), loaded.cfg.depth + loaded.cfg.depth_token_only]  # done, of all

            def on_block(done: int, total: int) -> None:
                knocked[:] = done, total
                line((done, total), desc="knocking out block by block", unit="blocks")

            def on_first_phase(done: int, total: int) -> None:
                line((done, total), desc="attributing the logit and ablating each head", unit="SA blocks")

            def work() -> dict:
                x = a.x.to(loaded.device)
                view = causal_view.compute(
                    loaded.model, x, target, on_block=on_block, on_first_phase=on_first_phase, partial=partial
                )
                out = self.figures.outputs(loaded, a, view, head, mode) | self.figures.cost(loaded, a)
                if not keep:
                    return out
                a.causal = causal_view.numbers(loaded.model, x, view)
                return out | {self.shared.json_file: session.numbers_file(loaded, a)}

            done = lambda: f"**Stopped** after {knocked[0]} of {knocked[1]} knockouts; {again}"  # noqa: E731
            what = "causal view" if keep else f"causal view of class {target}"
            got = self.stops.run(work, held=held, what=what, stopped=done, model=loaded.model, progress=line)
            return self.stops.shown(got)

        return self.stops.answered(request, view)

    def choose_class(self, request: gr.Request | None = None, progress=gr.Progress(), **asked: Any) -> dict:
        """Another class chosen: the attribution and knockouts for its logit, on the long lane with its progress
        and the page's Stop (kept as far as done, as the top class's). asked: `ClassAsk`'s fields."""
        ask = ClassAsk(**asked)
        a, asked_for = ask.analysis, ask.cz_class
        target = None if a is None or a.choice != ask.choice or asked_for is None else int(asked_for)
        head, again = int(ask.cz_head or 0), "choose the class again to go on from there."
        return self._view(request, ask.choice, a, target, progress, again=again, head=head, mode=ask.cz_mode)

    def knockout(self, request: gr.Request | None = None, progress=gr.Progress(), **asked: Any) -> dict:
        """Another part to knock out of each block (whole block, attention or MLP branch): the profile for it, on
        the long lane with its progress and the page's Stop. asked: `KnockoutAsk`'s fields."""
        ask = KnockoutAsk(**asked)
        a, view, what = ask.analysis, ask.cz_state, ask.cz_knockout_of
        line = texts.ProgressLine(progress)

        def on_block(done: int, total: int) -> None:
            line((done, total), desc=f"knocking out the {what} block by block", unit="blocks")

        def profile(held: Held) -> dict | None:
            if a is None or a.choice != ask.choice or view is None or what is None:
                return {}
            loaded = torch_thread.call(self.cache.get, ask.choice)

            def work() -> dict:
                done = causal_view.branch_knockout(loaded.model, a.x.to(loaded.device), view, what, on_block=on_block)
                return {self.parts.cz_knockout: causal_view.knockout_figure(view, loaded.cfg, done, what)}

            said = did_not_finish(f"the knockout profile of the {what}", "choose it again to compute it.")
            got = self.stops.run(
                work, held=held, what=f"knockout profile ({what})", stopped=lambda: said, model=loaded.model,
                progress=line,
            )  # fmt: skip
            return self.stops.shown(got)

        return self.stops.answered(request, profile)

    def detailed(self) -> list:
        return [self.parts.cz_class, self.parts.cz_head]

    def details(self, loaded: LoadedModel, a: session.Analysis, ask: Any = None) -> dict:
        """The follow-up of a new image here: the class menu at the top class, the first head."""
        return {
            self.parts.cz_class: gr.Dropdown(choices=class_choices(loaded.labels), value=a.top_class),
            self.parts.cz_head: 0,
        }

    def followed(self) -> list:
        return self.parts.opened

    def follow_up(self, choice, a, request, progress) -> dict:  # on the long lane (its own progress and Stop)
        return self.opened(choice, a, None, request, progress)

    def cleared(self, shown: tuple = ()) -> dict:
        p = self.parts
        return dict.fromkeys(p.results) | {p.cz_cost: "", p.cz_stop: gr.Button(interactive=False)}

    def for_model(self, loaded: LoadedModel) -> dict:
        return {
            self.parts.cz_class: gr.Dropdown(choices=[], value=None),
            self.parts.cz_head: gr.Radio(choices=causal_heads(loaded.cfg), value=0),
        }

    def wire(self, demo: gr.Blocks, page: Any) -> None:
        p, shared, stops = self.parts, self.shared, self.stops
        stops.wire_stop(demo)
        # Each long computation: armed at once, off the queues (a Stop pressed while it waits stops it when it
        # starts), then run on the long lane's queue (app.torch_thread: its handler is not on the quick lane, only
        # its loads)
        shown = [shared.choice, shared.analysis, p.cz_state]
        off_queue = dict(queue=False, api_visibility="private", show_progress="hidden")
        p.causal_tab.select(stops.will_compute, shown, p.cz_stop, **off_queue).then(
            answering(self.opened, said=stops.failed),
            shown,
            outputs=[*p.opened, shared.json_file],
            show_progress_on=[p.cz_cost],
            **LONG_EVENTS,
        )
        # input, not change: the follow-up of a new image sets the class and the head itself
        asked = [shared.choice, shared.analysis]
        p.cz_class.input(stops.armed, asked, p.cz_stop, **off_queue).then(
            answering(self.choose_class, said=stops.failed),
            inputs_kwargs=named(p, ClassAsk, choice=shared.choice, analysis=shared.analysis),
            outputs=p.opened,
            show_progress_on=[p.cz_cost],
            **LONG_EVENTS,
        )
        p.cz_knockout_of.input(stops.armed, asked, p.cz_stop, **off_queue).then(
            answering(self.knockout, said=stops.failed),
            inputs_kwargs=named(p, KnockoutAsk, choice=shared.choice, analysis=shared.analysis),
            outputs=[p.cz_knockout, p.cz_cost, p.cz_stop],
            show_progress_on=[p.cz_cost],
            **LONG_EVENTS,
        )
        for control in (p.cz_head, p.cz_mode):
            control.input(
                torch_thread.handler(answering(self.figures.head)),
                inputs_kwargs=named(p, HeadAsk, choice=shared.choice, analysis=shared.analysis),
                outputs=[p.cz_maps, p.cz_top5],
                **MODEL_EVENTS,
            )
