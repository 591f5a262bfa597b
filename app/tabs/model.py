"""The Model tab: what the page's model is (its table and card), loading another for this page only (a download
with its progress, when asked), where each paper variant's weights come from, and the page's address
(?model=VARIANT opens that variant)."""

from __future__ import annotations

import functools
import inspect
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable

import gradio as gr

import cait
from app import texts, torch_thread
from app.models import LoadedModel, ModelCache, ModelChoice
from app.page_tab import PageTab
from app.shared import Shared, log
from app.stops import ByPage, page_of
from cait import hub

SWAP_WAIT_S = 120  # how long a new image waits at most for its page's address swap to land

# After a load: the page's variant goes into the address (?model=...) without a reload, so that a reload or a
# shared link opens the same model (`ModelTab.from_address`); "" (a checkpoint file) takes it out.
KEEP_MODEL_IN_ADDRESS = """(name) => {
    if (name === null || name === undefined) return;
    const url = new URL(window.location.href);
    if (name) url.searchParams.set('model', name); else url.searchParams.delete('model');
    window.history.replaceState(null, '', url);
}"""


@dataclass
class _Swap:
    """A page's ?model= swap: (the model it replaced, the one it loaded) once landed, and whether an image of the
    page waited for it (then that image's answer, not the swap's, fills the page's results)."""

    landed: Future = field(default_factory=Future)
    awaited: bool = False


class AddressSwaps:
    """Each page's ?model= swap (`ModelTab.from_address`), so that a new image asked before the swap landed is
    analysed by the model the page is getting, not the one its state still names: the browser sends the image's
    event with the old model, and Gradio may run it before the swap, or beside it. At most MAX_PAGES kept.
    Thread-safe."""

    def __init__(self) -> None:
        self.pages: ByPage[_Swap] = ByPage(_Swap)  # made by the swap or an image waiting for it

    def landed(self, page: str | None, before: ModelChoice, after: ModelChoice) -> bool:
        """The page's swap landed; whether an image of the page waits for it."""
        with self.pages.lock:
            swap = self.pages.of(page)
            if not swap.landed.done():
                swap.landed.set_result((before, after))
            return swap.awaited

    def settled(self, choice: ModelChoice, request: gr.Request | None) -> ModelChoice:
        """The model an image event of the page must use: `choice` (what the page's state sent), unless the
        page's address names another known variant, whose swap has not landed when the event was sent: then the
        swap's model once it landed (or `choice`, when the swap kept it or SWAP_WAIT_S passed)."""
        asked = (getattr(request, "query_params", None) or {}).get("model") or ""
        if not asked.strip() or asked.strip() == choice.name or asked.strip() not in cait.list_models():
            return choice
        with self.pages.lock:
            swap = self.pages.of(page_of(request))
            if not swap.landed.done():
                swap.awaited = True
                log.info("an image asked before its page's swap to %s landed waits for it", asked.strip())
        try:
            before, after = swap.landed.result(timeout=SWAP_WAIT_S)
        except FutureTimeout:
            log.warning("the address swap of a page did not land in %d s: its image uses %s", SWAP_WAIT_S, choice)
            return choice
        return after if choice == before else choice


@dataclass
class ModelParts:
    model_md: gr.Markdown
    card_md: gr.Markdown
    variant: gr.Dropdown
    checkpoint: gr.Textbox
    weights_md: gr.Markdown
    download: gr.Checkbox
    load_btn: gr.Button
    load_msg: gr.Markdown
    url_model: gr.Textbox  # hidden: the page's variant, for its address (?model=...), so a reload keeps it
    weights_table: gr.Markdown


@dataclass(frozen=True)
class LoadAsk:
    """What the Load button sends (by name)."""

    choice: ModelChoice
    ca_props: tuple
    variant: str | None
    checkpoint: str | None
    download: bool = False


def _weights_line(status: hub.WeightsStatus) -> str:
    """The tab's line on where a variant's weights come from."""
    return f"Weights of {status.name}: {status.describe()}."


def build(first: LoadedModel, tab: gr.Tab) -> ModelParts:
    """The tab's components (inside its gr.Tab), with every paper variant's weights (`hub.list_weights`)."""
    statuses = hub.list_weights()
    parts: dict[str, Any] = {"model_md": gr.Markdown(texts.model_markdown(first), elem_id="model_md")}
    with gr.Accordion("Model card (how it was trained, what it does badly)", open=False):
        parts["card_md"] = gr.Markdown(texts.card_markdown(first) or "This model has no card.", elem_id="card_md")
    gr.Markdown(
        "### Load another model\nA variant name and, optionally, a local checkpoint (official deit .pth, "
        "timm .pth/.safetensors or ours). Without a path: the shipped weights or timm's official ones in "
        "the local Hugging Face cache, downloaded once if you tick the box; without weights, a message with the "
        "ways out (random weights only when the app was started with --random-init). The choice is yours only: "
        "other pages keep their own model."
    )
    with gr.Row():
        parts["variant"] = gr.Dropdown(cait.list_models(), value=first.choice.name, label="Variant", elem_id="variant")
        parts["checkpoint"] = gr.Textbox(
            label="Checkpoint file (optional)", placeholder="/path/to/cait.pth", elem_id="checkpoint"
        )
    parts["weights_md"] = gr.Markdown(elem_id="weights_md")
    parts["download"] = gr.Checkbox(
        value=False,
        label="Download timm's official weights from the Hugging Face Hub when they are not cached",
        elem_id="download",
    )
    parts["load_btn"] = gr.Button("Load model", elem_id="load_btn")
    parts["load_msg"] = gr.Markdown(elem_id="load_msg")
    parts["url_model"] = gr.Textbox(visible=False, elem_id="url_model")
    with gr.Accordion("Every paper variant: size and where its weights come from", open=False):
        parts["weights_table"] = gr.Markdown(texts.weights_table(statuses), elem_id="weights_table")
    return ModelParts(**parts)


class ModelTab(PageTab):
    """The tab's events. page_for(loaded, shown): everything on the page that a new model changes (the tabs
    emptied and redrawn for it; `app.ui` composes it); image_emptied(shown): its part that empties the image box and
    the image's results; ca_layers: the class-attention layers the page can show."""

    def __init__(
        self,
        parts: ModelParts,
        shared: Shared,
        cache: ModelCache,
        *,
        default: ModelChoice,
        statuses: list[hub.WeightsStatus],
        ca_layers: int,
        page_for: Callable[[LoadedModel, tuple], dict],
        image_emptied: Callable[[tuple], dict],
    ):
        self.parts, self.shared, self.cache, self.default = parts, shared, cache, default
        self.statuses, self.ca_layers, self.page_for, self.image_emptied = statuses, ca_layers, page_for, image_emptied
        self.swaps = AddressSwaps()

    @classmethod
    def on_page(cls, parts: ModelParts, page: Any) -> ModelTab:
        statuses, ca_layers, image = hub.list_weights(), page.ca_layers, page.image
        return cls(parts, page.shared, page.cache, default=page.default, statuses=statuses, ca_layers=ca_layers,
                   page_for=image.page_for, image_emptied=image.emptied)  # fmt: skip

    def weights_status(self, name: str | None, checkpoint: str | None = None) -> str:
        """Where the chosen variant's weights would come from, without any request (cait.hub): from the
        checkpoint file when one is given."""
        if (checkpoint or "").strip():
            return "Weights from the checkpoint file given (nothing is downloaded)."
        if not name:
            return ""
        try:
            return _weights_line(hub.weights_status(name))
        except cait.InputError as e:
            return str(e)

    def _fetched(self, wanted: ModelChoice, progress) -> None:
        """A paper variant's official weights into the local cache, with the page's progress bar (nothing to do
        when shipped or cached); off the torch thread: other pages go on meanwhile. Its status is computed here
        once; the load finds the file in the cache."""
        report = lambda done, total: progress((done, total), desc=f"downloading {wanted.name}", unit="bytes")  # noqa: E731
        hub.fetch_weights(hub.weights_status(wanted.name), on_progress=report)

    def _refused(self, loaded: LoadedModel) -> str:
        """Why the page cannot show `loaded` ("" when it can)."""
        layers = loaded.cfg.depth_token_only
        if layers <= self.ca_layers:
            return ""
        return (
            f"{loaded.name} has {layers} class-attention layers and this page shows {self.ca_layers}; start the app "
            f"with it (--model or --checkpoint) to see every layer"
        )

    def load(self, progress=gr.Progress(), **asked: Any) -> dict:
        """Load a model for this page only (a download, when asked for, with a progress bar). A failure is one
        message next to the button; nothing else on the page changes. The server's --random-init holds here
        too (`default`). asked: `LoadAsk`'s fields, by name."""
        ask = LoadAsk(**asked)
        checkpoint = (ask.checkpoint or "").strip() or None
        wanted = ModelChoice(
            name=ask.variant or None,
            checkpoint=checkpoint,
            download=bool(ask.download) and checkpoint is None,
            random_init=self.default.random_init,
        )
        p = self.parts
        try:
            if wanted.download and wanted.name:
                self._fetched(wanted, progress)
            loaded = torch_thread.call(self.cache.get, wanted)
            refused = self._refused(loaded)
        except (cait.InputError, OSError) as e:  # a user's choice, or a file or network that failed
            refused = str(e) or type(e).__name__
        if refused:
            first_line, *rest = refused.splitlines()
            log.info("could not load %s: %s", wanted, first_line)
            more = "\n\n```\n" + "\n".join(rest) + "\n```" if rest else ""
            # the Variant box goes back to the page's model, which stays loaded
            return {p.load_msg: f"**Could not load the model:** {first_line}{more}", p.variant: ask.choice.name}
        out = torch_thread.call(self.page_for, loaded, ask.ca_props)
        warn = f" ⚠ {loaded.notice}" if loaded.notice else ""
        out[p.load_msg] = f"Loaded **{loaded.name}** ({loaded.source}) for this page.{warn}"
        out[p.weights_md] = _weights_line(loaded.status) if loaded.status is not None else ""
        if loaded.status is not None:  # a download changes its row, and only its row
            self.statuses[:] = [loaded.status if s.name == loaded.status.name else s for s in self.statuses]
        out[p.weights_table] = texts.weights_table(self.statuses)
        # the address names a variant loaded without a file (a file's path is not the page's to share)
        out[p.url_model] = loaded.choice.name if loaded.choice.checkpoint is None else ""
        return out

    def from_address(self, choice: ModelChoice, shown: tuple, request: gr.Request) -> dict:
        """A page opened (or reloaded) with ?model=VARIANT starts with that variant, as if loaded here; an unknown
        name is said next to the Load button. The page's images asked meanwhile wait for it (`after_swap`)."""
        name = (request.query_params.get("model") or "").strip() if request else ""
        if not name or name == choice.name:
            return gr.skip()
        out: dict = {}
        try:
            out = self._swapped(choice, shown, name)
        finally:  # landed, loaded or not: the page's state names its model from this answer on
            awaited = self.swaps.landed(page_of(request), choice, out.get(self.shared.choice, choice))
        if awaited:  # an image waits for this swap: its answer may reach the page first, and must not be emptied
            image = self.image_emptied(shown)
            out = {part: value for part, value in out.items() if part not in image}
        return out

    def after_swap(self, handler: Callable) -> Callable:
        """`handler` (an image event's, taking `choice` by name) run with the model its page's address swap gives
        when the event was sent before that swap landed (`AddressSwaps.settled`). It waits here, off the quick
        lane, which the swap needs. Gradio reads the handler's signature with the page's request added."""
        signature = inspect.signature(handler)
        params = list(signature.parameters.values())
        request = inspect.Parameter(
            "request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=gr.Request
        )
        where = next((i for i, q in enumerate(params) if q.kind is inspect.Parameter.VAR_KEYWORD), len(params))
        with_request = signature.replace(parameters=[*params[:where], request, *params[where:]])
        rest = params[where].name if where < len(params) else None  # the handler's **asked, if it has one

        @functools.wraps(handler)
        def waiting(*args: Any, **kwargs: Any) -> Any:
            bound = with_request.bind(*args, **kwargs)
            page = bound.arguments.pop("request", None)
            named = bound.arguments[rest] if rest else bound.arguments
            named["choice"] = self.swaps.settled(named["choice"], page)
            return handler(*bound.args, **bound.kwargs)

        waiting.__signature__ = with_request  # type: ignore[attr-defined]
        waiting.__annotations__ = {**getattr(handler, "__annotations__", {}), "request": gr.Request}
        return waiting

    def _swapped(self, choice: ModelChoice, shown: tuple, name: str) -> dict:
        """The page's answer to an address naming `name`, another model than its `choice`."""
        if name not in cait.list_models():
            return self._address_refused(f"**The address asks for an unknown model** `{name}`", choice)
        out = self.load(choice=choice, ca_props=shown, variant=name, checkpoint="", download=False)
        if self.shared.choice in out:
            return out
        # a known variant this server cannot load (no weights here): said as an unknown name is, with the reason
        reason = out[self.parts.load_msg].removeprefix("**Could not load the model:** ").split("\n")[0]
        return self._address_refused(
            f"**The address asks for** `{name}`**, which cannot be loaded here:** {reason}", choice
        )

    def _address_refused(self, said: str, choice: ModelChoice) -> dict:
        """The page keeps `choice` though its address asked for another model: `said` (why) in a toast, next to
        the Load button and in the status line where the page opens; the address then names the model shown."""
        said = f"{said.rstrip('.')}; this page shows {choice}."
        gr.Warning(said.replace("**", ""))
        return {
            self.parts.load_msg: said,
            self.shared.status: said,
            self.parts.url_model: choice.name if choice.checkpoint is None else "",
        }

    def for_model(self, loaded: LoadedModel) -> dict:
        p = self.parts
        return {
            p.model_md: texts.model_markdown(loaded),
            p.card_md: texts.card_markdown(loaded) or "This model has no card.",
            p.variant: loaded.choice.name,
        }

    def wire(self, demo: gr.Blocks, page: Any) -> None:
        """A new model empties the Class attention tab's galleries (their props) and writes everything `page_for`
        may write."""
        p, shared, ca_props, everything = self.parts, self.shared, page.ca.ca_props, page.everything()
        asked = dict(choice=shared.choice, ca_props=ca_props, variant=p.variant, checkpoint=p.checkpoint)
        p.load_btn.click(
            self.load,
            inputs_kwargs=asked | dict(download=p.download),
            outputs=everything,
            show_progress_on=[p.load_msg],
            concurrency_id="model",
            api_visibility="private",
        ).then(None, p.url_model, None, js=KEEP_MODEL_IN_ADDRESS)
        for control in (p.variant, p.checkpoint):
            control.change(self.weights_status, [p.variant, p.checkpoint], p.weights_md, api_visibility="private")
        # a group of its own, unlimited: the page's images asked before it landed wait for it (`after_swap`) in
        # the model group's places, and it must not wait behind them
        demo.load(
            self.from_address,
            [shared.choice, ca_props],
            everything,
            show_progress_on=[p.load_msg],
            concurrency_id="address",
            concurrency_limit=None,
            api_visibility="private",
        ).then(None, p.url_model, None, js=KEEP_MODEL_IN_ADDRESS)
