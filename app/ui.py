"""The app assembled: the page (`app.layout`), its events wired to `app.handlers`, the queue, and launch.

Each browser session has its own model (a `ModelChoice` in gr.State), served from one `ModelCache`
shared by all sessions. One public API endpoint, `/analyze`, answers with the server's default model.
"""

from __future__ import annotations

import gradio as gr

from app import dataset_handlers, layout, torch_thread
from app.examples import served_paths
from app.handlers import DetailsAsk, Handlers, SaliencyAsk, layerscale_figure
from app.mechanisms_events import PatchAsk
from app.models import ModelCache, ModelChoice

CONCURRENCY = 2  # model runs at once (all model events share one concurrency group)
QUEUE_SIZE = 64  # waiting requests beyond this are refused: memory stays bounded
# Run in the browser before `details` is sent: wait (at most 3 s) until the class-attention tiles on screen
# are decoded, so that the follow-up's work does not compete with the browser fetching them; the inputs go on
# unchanged. Timers, not animation frames, which a background tab never gets.
AFTER_TILES_SHOWN = """async (...inputs) => {
    const pause = () => new Promise(r => setTimeout(r, 15));
    await pause();  // let the page draw the new gallery values first
    const shown = () => [...document.querySelectorAll('.ca-grid img')].filter(t => t.offsetParent !== null);
    const until = performance.now() + 3000;
    while (!shown().every(t => t.complete) && performance.now() < until) await pause();
    return inputs;
}"""
# After a load: the page's variant goes into the address (?model=...) without a reload, so that a reload or a
# shared link opens the same model (`Handlers.from_address`); "" (a checkpoint file) takes it out.
KEEP_MODEL_IN_ADDRESS = """(name) => {
    if (name === null || name === undefined) return;
    const url = new URL(window.location.href);
    if (name) url.searchParams.set('model', name); else url.searchParams.delete('model');
    window.history.replaceState(null, '', url);
}"""
THEME = dict(font=["DejaVu Sans", "sans-serif"], font_mono=["DejaVu Sans Mono", "monospace"])  # local fonts only


# the events that run the model: one queue, so a page waits its turn; not listed in the API
MODEL_EVENTS = dict(concurrency_id="model", api_visibility="private")


def _wire_class_attention(p: layout.Page, h: Handlers) -> None:
    look = [p.analysis, *p.look, p.selected, p.ca_props]
    redraw_outputs = [*p.ca_galleries, p.ca_props, p.colour_bar, p.grid_file, p.ca_big]
    rerender = torch_thread.handler(h.rerender_ca)  # every handler that computes: see app.torch_thread
    for control in (p.cmap, p.scale, p.view):
        control.change(rerender, look, redraw_outputs, api_visibility="private")
    # sliders: change, not release, so that arrow keys and typed values redraw too; only the latest is drawn
    for slider in (p.alpha, p.keep):
        slider.change(rerender, look, redraw_outputs, trigger_mode="always_last", api_visibility="private")
    for layer, gallery in enumerate(p.ca_galleries):
        gallery.select(
            torch_thread.handler(h.enlarge(layer)), look[:-2], [p.ca_big, p.selected], api_visibility="private"
        )


def _wire_causal(p: layout.Page, h: Handlers) -> None:
    # which tab is open (for `details`), at once and off the model queue; the Causal tab is computed once opened
    p.tabs.select(h.tab_opened, None, p.open_tab, queue=False, api_visibility="private")
    p.causal_tab.select(
        torch_thread.handler(h.causal_opened),
        [p.choice, p.analysis, p.cz_state],
        [*p.causal_results, p.json_file, p.cz_cost],
        show_progress_on=[p.cz_cost],
        **MODEL_EVENTS,
    )
    # off the model queue: it must get through while the computation it stops holds the queue
    p.cz_stop.click(h.causal_stop, None, None, queue=False, api_visibility="private")
    # input, not change: the details event sets the class and the head itself
    p.cz_class.input(
        torch_thread.handler(h.causal_class),
        [p.choice, p.analysis, p.cz_class, p.cz_head, p.cz_mode],
        p.causal_results,
        **MODEL_EVENTS,
    )
    p.cz_knockout_of.input(
        torch_thread.handler(h.causal_knockout),
        [p.choice, p.analysis, p.cz_state, p.cz_knockout_of],
        p.cz_knockout,
        **MODEL_EVENTS,
    )
    for control in (p.cz_head, p.cz_mode):
        control.input(
            torch_thread.handler(h.causal_head),
            [p.choice, p.analysis, p.cz_state, p.cz_head, p.cz_mode],
            [p.cz_maps, p.cz_top5],
            **MODEL_EVENTS,
        )


# what opening the Mechanisms tab writes (the download too: it gets the lens)
MECHANISMS_OPENED = ("mx_class", "mx_heads", "mx_example", "mx_msg", "mx_lens", "mx_cost", "json_file")


def _wire_mechanisms(p: layout.Page, h: Handlers) -> None:
    on_torch = torch_thread.handler
    opened = [getattr(p, name) for name in MECHANISMS_OPENED]
    p.mechanisms_tab.select(on_torch(h.mechanisms_opened), [p.choice, p.analysis, p.mx_class], opened, **MODEL_EVENTS)
    p.mx_class.input(
        on_torch(h.mechanisms_class),
        [p.choice, p.analysis, p.mx_class],
        [p.mx_lens, p.mx_cost, p.json_file],
        **MODEL_EVENTS,
    )
    p.mx_source.change(
        h.mechanisms_source,
        p.mx_source,
        [p.mx_corruption, p.mx_severity, p.mx_example, p.mx_upload],
        queue=False,
        api_visibility="private",
    )
    p.mx_patch_run.click(
        on_torch(h.mechanisms_patch),
        inputs_kwargs=p.named(PatchAsk),  # by name: the handler gets each as the keyword of its name
        outputs=[p.mx_msg, p.json_file, p.mx_second, p.mx_patch, p.mx_patch_heads],
        show_progress_on=[p.mx_patch],
        **MODEL_EVENTS,
    )
    p.mx_ablate.click(
        on_torch(h.mechanisms_ablate),
        [p.choice, p.analysis, p.mx_class, p.mx_heads, p.mx_mode],
        p.mx_ablation,
        **MODEL_EVENTS,
    )


def _everything(p: layout.Page) -> list:
    """Every component of the page but the Dataset tab's (a new model leaves an open atlas as it is)."""
    return [c for c in p.components().values() if isinstance(c, gr.blocks.Block)] + p.ca_galleries


def _wire_saliency(p: layout.Page, h: Handlers) -> None:
    on_torch = torch_thread.handler
    p.sal_run.click(
        on_torch(h.saliency, batched=True),
        inputs_kwargs=p.named(SaliencyAsk),  # by name: the handler gets each as the keyword of its name
        outputs=[p.sal_gallery, p.sal_bar, p.sal_table, p.sal_msg, p.json_file, p.sal_maps],
        show_progress_on=[p.sal_gallery],
        **MODEL_EVENTS,
    )
    p.sal_gallery.select(
        on_torch(h.enlarge_saliency), [p.analysis, p.sal_maps, p.cmap, p.alpha, p.view], p.sal_big, **MODEL_EVENTS
    )
    region = torch_thread.handler(h.region)
    for control in (p.region_of, p.region_share):
        control.change(
            region, [p.analysis, p.region_of, p.region_share], p.sal_region, trigger_mode="always_last", **MODEL_EVENTS
        )


def _wire_talking_heads(p: layout.Page, h: Handlers) -> None:
    on_torch = torch_thread.handler
    talking_outputs = [p.analysis, p.th_gallery, p.th_plot, p.th_pick]
    # input, not release: arrow keys and a typed value + Enter redraw too (a drag's steps: only the latest);
    # not change, which a programmatic value (a click on the patch grid, a new model) would also fire
    for slider in (p.th_layer, p.th_row, p.th_col):
        slider.input(
            on_torch(h.talking),
            [p.choice, p.analysis, p.th_layer, p.th_row, p.th_col],
            talking_outputs,
            trigger_mode="always_last",
            **MODEL_EVENTS,
        )
    p.th_pick.select(
        on_torch(h.pick_query),
        [p.choice, p.analysis, p.th_layer],
        [p.th_row, p.th_col, *talking_outputs],
        **MODEL_EVENTS,
    )


def _wire(p: layout.Page, h: Handlers, places: dataset_handlers.AtlasPlaces, demo: gr.Blocks) -> None:
    everything = _everything(p)
    view = [*p.look, p.th_layer]
    on_torch = torch_thread.handler  # every handler that computes: see app.torch_thread
    details = dict(
        fn=on_torch(h.details),
        inputs_kwargs=p.named(DetailsAsk),  # by name: the handler gets each as the keyword of its name
        outputs=[
            *(p.grid_file, p.json_file, p.ratio_plot, p.head_stats, p.th_gallery, p.th_plot, p.th_pick),
            *(p.sal_class, p.sal_region, p.cz_class, p.cz_head),
        ],
        show_progress="hidden",
        js=AFTER_TILES_SHOWN,
        **MODEL_EVENTS,
    )
    # then, in an event of its own so that the page is interactive meanwhile, what the open tab computes
    in_open_tab = [*p.causal_results, p.cz_cost, *(getattr(p, name) for name in MECHANISMS_OPENED)]
    open_tab = dict(
        fn=on_torch(h.open_tab_follow_up),
        inputs=[p.choice, p.analysis, p.open_tab],
        outputs=in_open_tab,
        show_progress_on=[p.cz_cost],
        **MODEL_EVENTS,
    )
    # upload (user's file or paste), not change: a programmatic value (an example, a model swap) must
    # not run the analysis a second time. The class-attention view comes first, the rest right after.
    # Each event lists as outputs only what it writes, and writes all of them.
    # one progress indicator, on the predictions, not one on each of the ~20 outputs: their overlays kept the
    # browser busy on the cores the analysis runs on
    progress = dict(show_progress_on=[p.top5])
    p.image_in.upload(
        on_torch(h.on_upload),
        [p.choice, p.ca_props, p.image_in, *view],
        [*p.results, p.examples],
        preprocess=False,
        **progress,
        **MODEL_EVENTS,
    ).success(**details).success(**open_tab)
    p.image_in.change(
        h.image_changed, [p.image_in, p.ca_props], p.results, preprocess=False, queue=False, api_visibility="private"
    )
    p.examples.select(
        on_torch(h.on_example), [p.choice, p.ca_props, *view], [*p.results, p.image_in], **progress, **MODEL_EVENTS
    ).success(**details).success(**open_tab)
    _wire_class_attention(p, h)
    _wire_saliency(p, h)
    _wire_talking_heads(p, h)
    _wire_causal(p, h)
    _wire_mechanisms(p, h)
    dataset_handlers.wire(p, h, places, demo, details, open_tab)
    p.load_btn.click(
        h.load_model,
        [p.choice, p.ca_props, p.variant, p.checkpoint, p.download],
        everything,
        show_progress_on=[p.load_msg],
        **MODEL_EVENTS,
    ).then(None, p.url_model, None, js=KEEP_MODEL_IN_ADDRESS)
    for control in (p.variant, p.checkpoint):
        control.change(h.weights_status, [p.variant, p.checkpoint], p.weights_md, api_visibility="private")


def build_app(cache: ModelCache, default: ModelChoice, places: dataset_handlers.AtlasPlaces | None = None) -> gr.Blocks:
    """The whole app; a new session starts with `default`; `places`: where the Dataset tab finds atlases."""
    first = torch_thread.call(cache.get, default)
    demo, page = layout.build_page(first, torch_thread.call(layerscale_figure, first))
    handlers = Handlers(page, cache, default)
    with demo:
        _wire(page, handlers, places or dataset_handlers.AtlasPlaces.of(None, None), demo)
        demo.load(
            handlers.from_address,
            [page.choice, page.ca_props],
            _everything(page),
            show_progress_on=[page.load_msg],
            concurrency_id="model",
            api_visibility="private",
        ).then(None, page.url_model, None, js=KEEP_MODEL_IN_ADDRESS)
        gr.api(torch_thread.handler(handlers.analyze), api_name="analyze", concurrency_id="model")
    demo.queue(default_concurrency_limit=CONCURRENCY, max_size=QUEUE_SIZE)
    return demo


def launch(
    demo: gr.Blocks, *, host: str = "127.0.0.1", port: int = 7860, block: bool = True, served: tuple[str, ...] = ()
) -> None:
    """Serve `demo`; `served`: folders beyond `served_paths` whose files the page links to (atlas pages)."""
    demo.launch(
        server_name=host,
        server_port=port,
        share=False,
        theme=gr.themes.Default(**THEME),
        css=layout.CSS,
        max_file_size=layout.MAX_RECEIVED_MB * 2**20,  # larger than we analyse: see layout.MAX_RECEIVED_MB
        ssr_mode=False,
        show_error=True,
        prevent_thread_lock=True,
        allowed_paths=[*served_paths(), *served],
        quiet=True,  # Gradio's own banner names a share link we never make; ours is one line
    )
    print(f"cait-lens app on {demo.local_url} (Ctrl+C to stop)", flush=True)
    if block:
        demo.block_thread()
