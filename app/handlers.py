"""What each event of the page does: read the session's model from the shared cache, call `app.session`,
and return {component: new value} for the components that change (the others stay as they are)."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import gradio as gr
import numpy as np
import torch
from gradio.data_classes import FileData

import cait
from app import api, causal_view, figures, session, texts, torch_thread
from app.images import ImageInputError
from app.layout import (
    CAUSAL_TAB,
    MAX_CA_LAYERS,
    MECHANISMS_TAB,
    SCALES,
    VIEWS,
    GalleryProps,
    Page,
    causal_heads,
    class_choices,
    region_choices,
    talking_columns,
)
from app.mechanisms_events import MechanismsEvents
from app.models import LoadedModel, ModelCache, ModelChoice
from app.workdir import WORK
from cait import explain, hub
from cait.explain import hooks
from cait.figures import (
    attention_tile,
    attention_tiles,
    colour_bar,
    display_base,
    grid_columns,
    head_name,
    layerscale_plot,
    residual_ratio_plot,
    tile_sheet,
    to_plotly,
)

log = logging.getLogger("cait.app")


def layerscale_figure(loaded: LoadedModel):
    return to_plotly(layerscale_plot(explain.layerscale_stats(loaded.model), init_values=loaded.cfg.init_values))


def _payload_path(payload: Any) -> str | None:
    if payload is None:
        return None
    if isinstance(payload, dict):
        return payload.get("path")
    return getattr(payload, "path", None) or (payload if isinstance(payload, str) else None)


def _colour_bar(cmap: str, scale: str):
    shared = scale == SCALES[1]
    return colour_bar(cmap, "0" if shared else "each tile's min", "layer max" if shared else "each tile's max")


def _map_of(name: str) -> tuple[int, int | None]:
    """'CA2 head 3' -> (1, 2), 'CA1 mean' -> (0, None): the inverse of `cait.figures.attention.head_name`."""
    layer, what = name.split(" ", 1)
    return int(layer[2:]) - 1, None if what == "mean" else int(what.split()[1]) - 1


_OPTIONS = explain.MethodOptions()  # the method settings' defaults


@dataclass(frozen=True)
class DetailsAsk:
    """What the follow-up of a new image (`Handlers.details`) is sent, each field named as its component in `Page`
    (`Page.named`: Gradio passes each value as the keyword of that name)."""

    choice: ModelChoice
    analysis: session.Analysis | None
    cmap: str  # cmap to keep: how class attention is drawn (`Page.look`)
    alpha: float
    scale: str
    view: str
    keep: float
    th_row: int  # the talking-heads query patch
    th_col: int
    region_of: str | None  # the map whose region of focus is drawn
    region_share: float = explain.DEFAULT_SHARE  # the share of its attention mass the region of focus holds

    @property
    def look(self) -> tuple:
        return self.cmap, self.alpha, self.scale, self.view, self.keep


@dataclass(frozen=True)
class SaliencyAsk:
    """What the Saliency tab's run button sends, each field named as its component in `Page` (`Page.named`: Gradio
    passes each value as the keyword of that name); a method setting not given is `explain.MethodOptions`'."""

    choice: ModelChoice
    analysis: session.Analysis | None
    sal_class: int | None  # None: the top prediction
    sal_methods: list[str]
    cmap: str
    alpha: float
    view: str
    sal_score: bool = True  # the deletion/insertion AUCs after the maps
    sal_topk: int = 1  # > 1: each method for each of the top k predicted classes instead of sal_class
    ig_steps: int = _OPTIONS.ig_steps
    sg_samples: int = _OPTIONS.smoothgrad_samples
    sg_noise: float = _OPTIONS.smoothgrad_stdev
    fusion: str = _OPTIONS.rollout_head_fusion
    discard: float = _OPTIONS.rollout_discard_ratio
    ig_baseline: str = _OPTIONS.ig_baseline
    signed: bool = _OPTIONS.signed
    sg_seed: int = session.DEFAULT_SEED  # SmoothGrad's noise

    def options(self) -> explain.MethodOptions:
        """The method settings as `explain.MethodOptions` (the page's sliders send floats)."""
        return explain.MethodOptions(
            ig_steps=int(self.ig_steps),
            smoothgrad_samples=int(self.sg_samples),
            smoothgrad_stdev=float(self.sg_noise),
            rollout_head_fusion=self.fusion,
            rollout_discard_ratio=float(self.discard),
            ig_baseline=self.ig_baseline,
            signed=bool(self.signed),
        )


def _weights_line(status: hub.WeightsStatus) -> str:
    """The Model tab's line on where a variant's weights come from."""
    return f"Weights of {status.name}: {status.describe()}."


def _look(cmap: str, alpha: float, scale: str, view: str, keep: float) -> dict[str, Any]:
    """The class-attention controls (in `layout.Page.look` order) as `attention_tile` arguments."""
    return dict(
        cmap=cmap, alpha=float(alpha), shared_scale=scale == SCALES[1], smooth=view == VIEWS[0], keep_mass=float(keep)
    )


@dataclass
class _SaliencyRun:
    """One saliency run's progress: per class, every method's map (and tile) once computed, then its AUCs once
    scored."""

    classes: list[str]  # class names, in the order they are run
    methods: list[str]
    scoring: bool  # the AUCs are computed after the maps
    options: explain.MethodOptions = _OPTIONS
    seed: int = session.DEFAULT_SEED
    rows: list = field(default_factory=list)  # (class name, session.SaliencyRow), in the order shown
    tiles: list = field(default_factory=list)  # (tile image, signed) of each row

    def add(self, name: str, row: session.SaliencyRow, tile, signed: bool) -> None:
        self.rows.append((name, row))
        self.tiles.append((tile, signed))

    def score(self, name: str, row: session.SaliencyRow) -> None:
        i = next(i for i, (n, r) in enumerate(self.rows) if n == name and r.method == row.method)
        self.rows[i] = (name, row)

    def caption(self, name: str, row: session.SaliencyRow) -> str:
        """The method, class and the settings that shaped the map; its AUCs once scored."""
        settings = session.options_caption(row.method, self.options, self.seed)
        said = f"{row.method} for '{name}'" + (f" ({settings})" if settings else "")
        if np.isnan(row.deletion_auc):  # not scored (yet)
            return said
        return f"{said} · deletion AUC {row.deletion_auc:.3f} · insertion AUC {row.insertion_auc:.3f}"

    def captioned(self) -> list:
        return [(tile, self.caption(name, row)) for (name, row), (tile, _) in zip(self.rows, self.tiles)]

    def maps(self) -> list:
        """What enlarging a tile needs: (patch map, caption, signed, method) of each row."""
        return [(r.heat.numpy(), self.caption(n, r), s, r.method) for (n, r), (_, s) in zip(self.rows, self.tiles)]

    def label(self) -> str:
        one = len(self.classes) == 1
        title = f"Maps for class '{self.classes[0]}'" if one else f"Maps for the top {len(self.classes)} classes"
        total = len(self.classes) * len(self.methods)
        scored = sum(not np.isnan(r.deletion_auc) for _, r in self.rows)
        if len(self.rows) < total:
            name = self.classes[len(self.rows) // len(self.methods)]
            return f"{title}; computing the maps{'' if one else f' for {name!r}'} ({len(self.rows)} of {total} done)"
        if self.scoring and scored < total:
            name, row = self.rows[scored]
            return f"{title}; scoring {row.method}{'' if one else f' for {name!r}'} ({scored + 1} of {total})"
        return title


class _Stopped(Exception):
    """A page's Stop button ended its Causal tab's computation (the message says so)."""


class Handlers(MechanismsEvents):
    def __init__(self, page: Page, cache: ModelCache, default: ModelChoice):
        self.page, self.cache, self.default = page, cache, default
        self._stops: dict[str | None, threading.Event] = {}  # per page (session): its Causal tab's Stop

    # ------------------------------------------------------------------------ class-attention view

    def ca_outputs(
        self, a: session.Analysis, look: tuple, selected: tuple[int, int] | None, shown: tuple, *, sheet: bool = True
    ) -> dict:
        """The class-attention galleries (one per CA layer), colour bar and enlarged tile for the
        controls' values `look` (cmap, alpha, scale, view, keep); with sheet, the PNG download too.
        shown: the galleries' props as the page has them (`Page.ca_props`)."""
        p, (cmap, _, scale, view, _) = self.page, look
        layers = attention_tiles(a.view, a.ca_maps, a.self_share, **_look(*look))
        columns = grid_columns(len(layers[0]))
        folder = WORK.request_dir()
        galleries = []
        for i in range(len(p.ca_galleries)):
            tiles = layers[i] if i < len(layers) else []
            top = f", colour 0 .. {a.ca_maps[i].max():.3f}" if scale == SCALES[1] and tiles else ""
            files = figures.save_tiles([t.image for t in tiles], folder, f"ca{i + 1}", exact=view != VIEWS[0])
            galleries.append(
                (
                    [(f, t.short_caption) for f, t in zip(files, tiles)] or None,
                    GalleryProps(visible=bool(tiles), columns=columns, label=f"CA layer {i + 1}{top}"),
                )
            )
        out = self._galleries(galleries, shown)
        out.update({p.colour_bar: _colour_bar(cmap, scale), p.ca_big: self._big(a, look, selected)})
        if sheet:
            out[p.grid_file] = self._sheet(layers, cmap, scale)
        return out

    def _galleries(self, galleries: list[tuple[list | None, "GalleryProps"]], shown: tuple) -> dict:
        """Each CA gallery's new value, with its props only where they differ from `shown`: a props update
        makes Gradio rebuild the component and its config (measured: a few ms each, most of a redraw
        once the tiles are fast), a plain value does not. The new props go to `Page.ca_props`."""
        p, out = self.page, {}
        for gallery, (value, props), before in zip(p.ca_galleries, galleries, shown):
            out[gallery] = value if props == before else gr.update(value=value, **props._asdict())
        out[p.ca_props] = tuple(props for _, props in galleries)
        return out

    def _sheet(self, layers, cmap: str, scale: str) -> str:
        """The class-attention grid as one PNG file (the download), laid out like the page."""
        png = tile_sheet(
            layers[:MAX_CA_LAYERS],
            title="Class attention (rows: CA layers; head mean first)",
            footer=_colour_bar(cmap, scale),
        )
        path = WORK.request_dir() / "class_attention.png"
        png.save(path, compress_level=1)  # lossless like the default level, 4x faster, ~10% larger
        return str(path)

    def _big(self, a: session.Analysis, look: tuple, selected: tuple[int, int] | None):
        if selected is None or selected[0] >= a.ca_maps.shape[0]:
            return gr.Plot(value=None, label="Selected tile (click one)")
        layer, index = selected
        head = None if index == 0 else index - 1
        tile = attention_tile(display_base(a.view, 448), a.ca_maps, a.self_share, layer, head, **_look(*look))
        heat = a.ca_maps[layer].mean(0) if head is None else a.ca_maps[layer, head]
        return gr.Plot(
            value=figures.enlarged_figure(tile.image, a.view, heat, cmap=look[0], title=tile.caption),
            label=tile.caption,
        )

    def rerender_ca(self, a, cmap, alpha, scale, view, keep, selected, shown) -> dict:
        if a is None:
            return gr.skip()
        return self.ca_outputs(a, (cmap, alpha, scale, view, keep), selected, shown)

    def enlarge(self, layer: int):
        def handler(a, cmap, alpha, scale, view, keep, evt: gr.SelectData) -> dict:
            if a is None:
                return gr.skip()
            selected = (layer, int(evt.index))
            return {
                self.page.ca_big: self._big(a, (cmap, alpha, scale, view, keep), selected),
                self.page.selected: selected,
            }

        return handler

    # ------------------------------------------------------------------------ a new image

    def image_changed(self, image: object, shown: tuple) -> dict:
        """The image box emptied: by its remove button, or by the browser refusing a file over what the server
        takes (`layout.MAX_RECEIVED_MB`), which sends no clear event. The last image's results go with it; a new
        image changes nothing here."""
        if image is not None:
            return {c: gr.skip() for c in self.page.results}
        return self.cleared(shown)

    def cleared(self, shown: tuple, status: str = "") -> dict:
        """Every result of the last image emptied (a removed image, a new model, a file that failed);
        shown: the CA galleries' props as the page has them (`Page.ca_props`)."""
        p = self.page
        out = dict.fromkeys(p.results)  # every result empty; the markdown ones as empty text, and the status
        out.update({p.top5: "", p.status: status, p.sal_msg: "", p.cz_cost: ""})
        out.update(self._galleries([(None, before._replace(visible=False)) for before in shown], shown))
        return out

    def _analysed(
        self,
        loaded: LoadedModel,
        a: session.Analysis,
        look: tuple,
        shown: tuple,
        *,
        uploaded: bool,
        selected: tuple | None = None,
    ) -> dict:
        """The first answer to a new image: predictions and the class-attention view, as soon as they are
        computed (with the tile `selected` enlarged); what the other tabs and the downloads need follows in
        `details`."""
        p = self.page
        for note in a.notes:
            gr.Info(note)
        preds = session.top_predictions(a.probs, loaded.labels)
        out = self.cleared(shown, texts.status_markdown(loaded, preds[0], a.notes, uploaded=uploaded))
        out.update(self.ca_outputs(a, look, selected, shown, sheet=False))
        out.update({p.analysis: a, p.top5: texts.top5_html(preds), p.selected: selected})
        passes = causal_view.forward_passes(loaded.cfg)
        out[p.cz_cost] = texts.cost_in_passes(
            "Computing this tab", passes, a.forward_seconds, reduced_precision=loaded.dtype is not None
        )
        return out

    def details(self, **asked: Any) -> dict:
        """After the first view of an image: the downloads, the residual ratios, the per-head statistics and the
        talking-heads tab, about two forward passes in all (the SA distances take one); what costs more waits for
        its tab (`open_tab_follow_up`). asked: the fields of `DetailsAsk`, by name."""
        p, ask = self.page, DetailsAsk(**asked)
        a = ask.analysis
        if a is None or a.choice != ask.choice:
            return gr.skip()
        loaded = self.cache.get(ask.choice)
        json_path = self._numbers_file(loaded, a)
        classes = class_choices(loaded.labels)  # 1000 for ImageNet: not in the first view
        tiles = attention_tiles(a.view, a.ca_maps, a.self_share, **_look(*ask.look))
        sheet = self._sheet(tiles, ask.cmap, ask.scale)
        out = {
            p.json_file: str(json_path),
            p.grid_file: sheet,
            p.ratio_plot: to_plotly(residual_ratio_plot(a.ratios)),
            p.head_stats: figures.head_stats_figure(
                session.ca_entropy(a),
                session.sa_distance(loaded, a),
                patches=loaded.cfg.grid_size**2,
                uniform_distance=session.uniform_distance(loaded),
            ),
            p.sal_class: gr.Dropdown(choices=classes, value=a.top_class),
        }
        out.update(self.talking_outputs(loaded, a, ask.th_row, ask.th_col))
        out.update(self.region(a, ask.region_of, ask.region_share))
        out[p.cz_class] = gr.Dropdown(choices=classes, value=a.top_class)
        out[p.cz_head] = 0
        return out

    def open_tab_follow_up(self, choice, a, open_tab, request: gr.Request | None = None, progress=gr.Progress()):
        """After a new image's `details`: what the tab on show computes of it, at once and in an event of its own
        (the Causal tab's view with its progress and Stop, the Mechanisms tab's lens); a tab not on show computes
        its part once opened."""
        if open_tab == CAUSAL_TAB:
            return self.causal_opened(choice, a, None, request, progress)
        if open_tab == MECHANISMS_TAB:
            return self.mechanisms_opened(choice, a, None)
        return gr.skip()  # the first view emptied both tabs (`cleared`)

    def _causal_numbers(self, loaded: LoadedModel, a: session.Analysis, on_block=None):
        """The Causal tab's view of the top class, its numbers kept on the analysis for the JSON download;
        on_block(done, total) after each block's knockout."""
        causal = causal_view.compute(loaded.model, a.x.to(loaded.device), a.top_class, on_block=on_block)
        a.causal = causal_view.numbers(loaded.model, a.x.to(loaded.device), causal)
        return causal

    def _causal_first(self, loaded: LoadedModel, a: session.Analysis, causal) -> dict:
        return self.causal_outputs(loaded, a, causal, 0, causal_view.ABLATIONS[0])

    def causal_opened(self, choice, a, shown, request: gr.Request | None = None, progress=gr.Progress()) -> dict:
        """The Causal tab opened: its view of the image's top class, computed now unless it is on show already,
        and the JSON download rewritten with its numbers. Progress is told block by block; the Stop button
        (`causal_stop`) ends the work before the next block the model runs, which frees the model queue."""
        if a is None or a.choice != choice or shown is not None:
            return gr.skip()
        loaded = self.cache.get(choice)
        stop = self._stops.setdefault(getattr(request, "session_hash", None), threading.Event())
        stop.clear()
        knocked = [0, loaded.cfg.depth + loaded.cfg.depth_token_only]  # knockouts done, of how many

        def on_block(done: int, total: int) -> None:
            knocked[:] = done, total
            progress((done, total), desc="knocking out block by block", unit="blocks")

        def stopped() -> None:
            if stop.is_set():
                done, total = knocked
                raise _Stopped(f"**Stopped** after {done} of {total} knockouts; open the tab again to compute it.")

        progress((0, knocked[1]), desc="attributing the logit and ablating each head", unit="blocks")
        try:
            with hooks.before_each([*loaded.model.blocks, *loaded.model.blocks_token_only], stopped):
                out = self._causal_first(loaded, a, self._causal_numbers(loaded, a, on_block))
        except _Stopped as e:
            log.info("causal view stopped by its page")
            return {self.page.cz_cost: str(e)}
        out[self.page.json_file] = str(self._numbers_file(loaded, a))
        return out

    def causal_stop(self, request: gr.Request | None = None) -> None:
        """The Stop button: the Causal tab's computation of this page ends before the next block the model runs."""
        self._stops.setdefault(getattr(request, "session_hash", None), threading.Event()).set()

    @staticmethod
    def tab_opened(evt: gr.SelectData) -> str:
        return evt.value

    def _numbers_file(self, loaded: LoadedModel, a: session.Analysis) -> str:
        """All numbers as the JSON download: the analysis, LayerScale and, once computed, the causal view, the
        last saliency run, and the Mechanisms tab's last logit lens and patching run (each kept on the analysis,
        so that writing the file for one keeps the others)."""
        data = session.numbers(loaded, a)
        data["layerscale"] = explain.layerscale_stats(loaded.model)
        # sections computed on demand: a reader of the file learns what is missing and how to get it
        on_demand = {
            "causal": (a.causal, "open the Causal tab"),
            "saliency": (a.saliency, "run the Saliency tab"),
            "logit_lens": (a.logit_lens, "open the Mechanisms tab"),
            "patching": (a.patching, "run patching in the Mechanisms tab"),
        }
        data["not_computed"] = {}
        for key, (section, how) in on_demand.items():
            if section is None:
                data["not_computed"][key] = f"not computed for this image: {how}, then download again"
            else:
                data[key] = section
        path = WORK.request_dir() / "cait_analysis.json"
        path.write_text(json.dumps(data))
        return str(path)

    def analyse_path(
        self,
        choice: ModelChoice,
        path: str | None,
        look: tuple,
        sa_layer: int,
        shown: tuple,
        *,
        uploaded: bool,
        selected: tuple[int, int] | None = None,
    ) -> dict:
        """The image at `path` analysed by the session's model: the first answer to a new image (`_analysed`,
        with the class-attention tile `selected` (layer, 0 for the mean or head + 1) enlarged), or a message."""
        if path is None:
            return self.cleared(shown)
        loaded = self.cache.get(choice)
        start = time.perf_counter()
        try:
            a = session.analyse(loaded, path, sa_layer=int(sa_layer) - 1)
        except ImageInputError as e:
            log.info("could not analyse an upload: %s", e)
            return self.cleared(shown, f"**Could not analyse this file:** {e}")
        log.info("analysed %s with %s in %.2f s", Path(path).name, loaded.name, time.perf_counter() - start)
        return self._analysed(loaded, a, look, shown, uploaded=uploaded, selected=selected)

    def on_upload(self, choice, shown, payload, cmap, alpha, scale, view, keep, th_layer) -> dict:
        """An uploaded file analysed (or refused, in the status line); no example is highlighted any more."""
        out = self.analyse_path(
            choice, _payload_path(payload), (cmap, alpha, scale, view, keep), th_layer, shown, uploaded=True
        )
        # its props only, the examples stay; a component, not gr.update, which drops a None
        out[self.page.examples] = gr.Gallery(selected_index=None)
        return out

    def on_example(self, choice, shown, cmap, alpha, scale, view, keep, th_layer, evt: gr.SelectData) -> dict:
        path = evt.value["image"]["path"]
        out = self.analyse_path(choice, path, (cmap, alpha, scale, view, keep), th_layer, shown, uploaded=False)
        out[self.page.image_in] = path
        return out

    # ------------------------------------------------------------------------ saliency

    def saliency(self, **asked: Any) -> Iterator[dict]:
        """The ticked methods' maps for the chosen class (or, with topk > 1, for each of the top-k predicted
        classes side by side): each class's maps as soon as they are computed, then, with `score`, each map's
        deletion/insertion AUCs one by one (the gallery label counts them), so the maps are not held back by the
        scoring, which takes most of the time, and the wait is told by real progress.
        asked: the fields of `SaliencyAsk`, by name."""
        p, ask = self.page, SaliencyAsk(**asked)
        a = ask.analysis
        if a is None or a.choice != ask.choice:
            yield {p.sal_msg: texts.NO_IMAGE}
            return
        if not ask.sal_methods:
            yield {p.sal_msg: "**Tick at least one saliency method.** The maps of the last run stay below."}
            return
        loaded = self.cache.get(ask.choice)
        methods = [m for m in explain.METHODS if m in ask.sal_methods]  # the menu's order, whatever the ticking
        targets = [a.top_class if ask.sal_class is None else int(ask.sal_class)]
        if int(ask.sal_topk or 1) > 1:
            targets = session.ranked_classes(a.probs, int(ask.sal_topk))
        look = dict(cmap=ask.cmap, alpha=float(ask.alpha), smooth=ask.view == VIEWS[0])
        options, seed = ask.options(), int(ask.sg_seed)
        run = _SaliencyRun([loaded.labels[t] for t in targets], methods, bool(ask.sal_score), options, seed)
        yield {p.sal_msg: "", p.sal_bar: figures.saliency_bars(ask.cmap, signed=options.signed), **self._progress(run)}
        saved = []
        for t in targets:
            name = loaded.labels[t]
            rows = session.unscored_rows(loaded, a, target=t, methods=methods, options=options, seed=seed)
            for row in rows:
                signed = options.signed and row.method in explain.CAPTUM_METHODS
                run.add(name, row, figures.saliency_tile(a.view, row.heat, signed=signed, **look), signed)
            yield self._progress(run)
            for row in session.scored(loaded, a, rows, target=t) if ask.sal_score else []:
                run.score(name, row)
                yield self._progress(run)
            mine = [r for n, r in run.rows if n == name]
            saved.append(session.saliency_numbers(t, name, mine, options=options, seed=seed))
        a.saliency = saved
        yield {p.json_file: self._numbers_file(loaded, a), p.sal_maps: run.maps()}

    def enlarge_saliency(self, a, maps, cmap, alpha, view, evt: gr.SelectData) -> dict:
        """A clicked saliency map beside its patch grid, whose hover gives each patch's value."""
        if a is None or not maps or int(evt.index) >= len(maps):
            return gr.skip()
        heat, caption, signed, method = maps[int(evt.index)]
        look = dict(cmap=cmap, alpha=float(alpha), smooth=view == VIEWS[0], signed=signed)
        tile = figures.saliency_tile(a.view, torch.from_numpy(heat), **look)
        shown = figures.SIGNED_CMAP if signed else cmap
        figure = figures.enlarged_figure(
            tile, a.view, heat, cmap=shown, title=caption, colour_title=method, signed=signed
        )
        return {self.page.sal_big: figure}

    def region(self, a, source: str | None, share: float) -> dict:
        """The paper's Fig. 7 region of focus of one class-attention map (a CA layer's mean or one head, as
        `layout.region_choices` names them), holding `share` of its mass."""
        if a is None or not source:
            return {self.page.sal_region: None}
        layer, head = _map_of(source)
        if layer >= a.ca_maps.shape[0] or (head is not None and head >= a.ca_maps.shape[1]):
            return {self.page.sal_region: None}  # a choice of the model before: the new one comes with it
        img_size = a.x.shape[-1]
        mask, box = session.regions_of_focus(a, layer=layer, head=head, share=float(share), img_size=img_size)
        label = f"Regions of focus: {source}, {float(share):.0%} of its attention mass"
        return {self.page.sal_region: gr.Image(value=figures.region_image(a.view, mask, box, img_size), label=label)}

    def _progress(self, run: _SaliencyRun) -> dict:
        """The gallery and table of a saliency run so far."""
        auc = lambda v: None if np.isnan(v) else round(v, 4)  # not scored: an empty cell
        one = len(run.classes) == 1
        table = [
            [
                r.method if one else f"{r.method} ({name})",
                auc(r.deletion_auc),
                auc(r.insertion_auc),
                round(r.seconds, 2),
            ]
            for name, r in run.rows
        ]
        return {
            self.page.sal_gallery: gr.Gallery(value=run.captioned() or None, label=run.label()),
            self.page.sal_table: table or None,
        }

    # ------------------------------------------------------------------------ causal

    def causal_outputs(self, loaded: LoadedModel, a: session.Analysis, view, head: int, mode: str) -> dict:
        """The Causal tab for `view` (a `causal_view.CausalView`) with head `head` (layer * heads + head)
        picked: the bars, its maps and its ablation, the knockout profile."""
        p = self.page
        return {
            p.cz_state: view,
            p.cz_heads_plot: causal_view.head_figure(view, loaded.labels[view.target]),
            p.cz_knockout: causal_view.knockout_figure(view, loaded.cfg),
            p.cz_knockout_of: next(iter(causal_view.KNOCKOUTS)),  # a new view starts with whole blocks
            **self.causal_head_outputs(loaded, a, view, head, mode),
        }

    def causal_head_outputs(self, loaded: LoadedModel, a: session.Analysis, view, head: int, mode: str) -> dict:
        layer, head = divmod(int(head), loaded.cfg.num_heads)
        reference = causal_view.ablation_reference(loaded, mode)
        top5 = causal_view.ablation(
            loaded.model, a.x.to(loaded.device), layer=layer, head=head, labels=loaded.labels, reference=reference
        )
        return {
            self.page.cz_maps: causal_view.maps_figure(view, a.ca_maps[layer, head], layer, head, a.view),
            self.page.cz_top5: causal_view.top5_html(top5, f"without {head_name(layer, head)}"),
        }

    def causal_class(self, choice, a, target, head, mode) -> dict:
        """Another class chosen: the attribution and knockouts for its logit."""
        if a is None or a.choice != choice or target is None:
            return {}
        loaded = self.cache.get(choice)
        view = causal_view.compute(loaded.model, a.x.to(loaded.device), int(target))
        return self.causal_outputs(loaded, a, view, int(head or 0), mode)

    def causal_knockout(self, choice, a, view, knockout) -> dict:
        """Another part to knock out of each block (whole block, attention or MLP branch): the profile for it."""
        if a is None or a.choice != choice or view is None or knockout is None:
            return {}
        loaded = self.cache.get(choice)
        profile = causal_view.branch_knockout(loaded.model, a.x.to(loaded.device), view, knockout)
        return {self.page.cz_knockout: causal_view.knockout_figure(view, loaded.cfg, profile, knockout)}

    def causal_head(self, choice, a, view, head, mode) -> dict:
        """Another head picked (or another way to remove it): its maps and the top-5 without it."""
        if a is None or a.choice != choice or view is None or head is None:
            return {}
        return self.causal_head_outputs(self.cache.get(choice), a, view, int(head), mode)

    # ------------------------------------------------------------------------ talking heads

    def talking_outputs(self, loaded: LoadedModel, a: session.Analysis, row: int, col: int) -> dict:
        g = loaded.cfg.grid_size
        patch = (min(max(int(row), 1), g) - 1) * g + min(max(int(col), 1), g) - 1
        st = a.stages
        tiles = figures.query_tiles(
            a.view, {"raw": st.raw, "after_proj_l": st.after_proj_l, "after_proj_w": st.after_proj_w}, patch
        )
        proj_l, proj_w = (m.float().cpu().numpy() for m in explain.mixing_matrices(loaded.model, st.layer))
        files = figures.save_tiles([image for image, _ in tiles], WORK.request_dir(), "query")
        # a value only: the columns follow the model (`model_outputs`)
        return {
            self.page.th_gallery: [(f, caption) for f, (_, caption) in zip(files, tiles)],
            self.page.th_plot: figures.mixing_figure(proj_l, proj_w, st.layer),
            self.page.th_pick: figures.query_picker(a.view, g, patch),
        }

    def talking(self, choice, a, layer, row, col) -> dict:
        if a is None or a.choice != choice:
            return gr.skip()
        loaded = self.cache.get(choice)
        a = session.with_sa_layer(loaded, a, int(layer) - 1)
        return {self.page.analysis: a, **self.talking_outputs(loaded, a, row, col)}

    def pick_query(self, choice, a, layer, evt: gr.SelectData) -> dict:
        """A click on the patch-grid image: that patch becomes the query (the sliders follow)."""
        if a is None or a.choice != choice:
            return gr.skip()
        g = self.cache.get(choice).cfg.grid_size
        x, y = evt.index  # pixels of the picker image
        row, col = (min(int(v * g / figures.PICKER_SIDE), g - 1) + 1 for v in (y, x))
        return {self.page.th_row: row, self.page.th_col: col, **self.talking(choice, a, layer, row, col)}

    # ------------------------------------------------------------------------ the Model tab

    def model_outputs(self, loaded: LoadedModel) -> dict:
        """Everything on the page that depends on the session's model, for `loaded`."""
        p, cfg, g = self.page, loaded.cfg, loaded.cfg.grid_size
        return {
            p.choice: loaded.choice,
            p.header: texts.header_markdown(loaded, hub.cached_variants()),
            p.model_md: texts.model_markdown(loaded),
            p.card_md: texts.card_markdown(loaded) or "This model has no card.",
            p.examples: gr.Gallery(value=loaded.examples),
            p.image_in: None,
            p.ls_plot: layerscale_figure(loaded),
            p.th_layer: gr.Slider(maximum=cfg.depth, value=1),
            p.th_row: gr.Slider(maximum=g, value=g // 2 + 1),
            p.th_col: gr.Slider(maximum=g, value=g // 2 + 1),
            p.sal_class: gr.Dropdown(choices=[], value=None),
            p.region_of: gr.Dropdown(choices=region_choices(cfg), value=region_choices(cfg)[0]),
            p.th_gallery: gr.Gallery(value=None, columns=talking_columns(cfg)),
            p.cz_class: gr.Dropdown(choices=[], value=None),
            p.cz_head: gr.Radio(choices=causal_heads(cfg), value=0),
            p.variant: loaded.choice.name,
        }

    def weights_status(self, name: str | None, checkpoint: str | None = None) -> str:
        """Where the chosen variant's weights would come from, without any request (cait.hub): from the
        checkpoint file when one is given."""
        if (checkpoint or "").strip():
            return "Weights from the checkpoint file given (nothing is downloaded)."
        if not name:
            return ""
        try:
            return _weights_line(hub.weights_status(name))
        except ValueError as e:
            return str(e)

    def load_model(
        self,
        choice: ModelChoice,
        shown: tuple,
        name: str | None,
        checkpoint: str | None,
        download: bool = False,
        progress=gr.Progress(),
    ) -> dict:
        """Load a model for this session only (a download, when asked for, with a progress bar). A failure
        is one message next to the button; nothing else on the page changes. The server's --random-init holds
        here too (`self.default`)."""
        wanted = ModelChoice(
            name=name or None,
            checkpoint=(checkpoint or "").strip() or None,
            download=bool(download) and not (checkpoint or "").strip(),
            random_init=self.default.random_init,
        )
        try:
            if wanted.download and wanted.name:
                report = lambda done, total: progress((done, total), desc=f"downloading {wanted.name}", unit="bytes")
                # into the cache, which the load reads (nothing to do when shipped or cached); off the torch
                # thread: other pages go on meanwhile. The load asks for the status again (a fraction of a ms):
                # after the download it is another one, "cached" with the file, which the Model tab shows
                hub.fetch_weights(hub.weights_status(wanted.name), on_progress=report)
            loaded = torch_thread.call(self.cache.get, wanted)
        except (cait.CheckpointError, ValueError, OSError, RuntimeError) as e:
            first_line, *rest = str(e).splitlines() or [type(e).__name__]
            log.info("could not load %s: %s", wanted, first_line)
            more = "\n\n```\n" + "\n".join(rest) + "\n```" if rest else ""
            # the Variant box goes back to the page's model, which stays loaded
            return {
                self.page.load_msg: f"**Could not load the model:** {first_line}{more}",
                self.page.variant: choice.name,
            }
        out = {**self.cleared(shown), **torch_thread.call(self.model_outputs, loaded)}
        warn = f" ⚠ {loaded.notice}" if loaded.notice else ""
        out[self.page.load_msg] = f"Loaded **{loaded.name}** ({loaded.source}) for this page.{warn}"
        out[self.page.weights_md] = _weights_line(loaded.status) if loaded.status is not None else ""
        out[self.page.weights_table] = texts.weights_table(hub.list_weights())  # a download changes a row
        # the address names a variant loaded without a file (a file's path is not the page's to share)
        out[self.page.url_model] = loaded.choice.name if loaded.choice.checkpoint is None else ""
        return out

    def from_address(self, choice: ModelChoice, shown: tuple, request: gr.Request) -> dict:
        """A page opened (or reloaded) with ?model=VARIANT starts with that variant, as if loaded in the
        Model tab; an unknown name is said next to the Load button."""
        name = (request.query_params.get("model") or "").strip() if request else ""
        if not name or name == choice.name:
            return gr.skip()
        if name not in cait.list_models():
            said = f"**The address asks for an unknown model** `{name}`; this page shows {choice}."
            gr.Warning(said.replace("**", ""))
            return {
                self.page.load_msg: said,
                self.page.status: said,  # on the first tab too, where the page opens
                # the address names the model shown, not the unknown one
                self.page.url_model: choice.name if choice.checkpoint is None else "",
            }
        return self.load_model(choice, shown, name, "", False)

    # ------------------------------------------------------------------------ the /analyze API

    def analyze(
        self,
        image: FileData,
        method: str = "",
        target: int = -1,
        ig_steps: int = _OPTIONS.ig_steps,
        causal: bool = False,
        ig_baseline: str = _OPTIONS.ig_baseline,
        signed: bool = _OPTIONS.signed,
        smoothgrad_samples: int = _OPTIONS.smoothgrad_samples,
        smoothgrad_stdev: float = _OPTIONS.smoothgrad_stdev,
        rollout_head_fusion: str = _OPTIONS.rollout_head_fusion,
        rollout_discard_ratio: float = _OPTIONS.rollout_discard_ratio,
        seed: int = session.DEFAULT_SEED,
        logit_lens: bool = False,
        patching: str = "",
    ) -> dict:
        """Predictions and class-attention maps for one image, by the server's default model.

        image: the image file (gradio_client: handle_file(path)).
        method: "" for none, or a saliency method (see the "methods" field of the answer) to also compute
            its patch-grid map for class `target` (-1: the top prediction), with the method settings named as
            the fields of `cait.explain.MethodOptions` (ig_steps, ig_baseline, signed, smoothgrad_samples,
            smoothgrad_stdev, rollout_head_fusion, rollout_discard_ratio) and SmoothGrad's noise from `seed`
            (the same map for the same call).
        causal: also the Causal tab's numbers for class `target` (direct logit attribution per head and
            patch, knockout profile, every head's zero ablation; about SA depth / 2 + 2 forward passes).
        logit_lens: also the logit lens for class `target` (per SA depth: its probability and the top-1, where
            the answer forms; about 1.3 forward passes). Opt-in by keyword: logit_lens=True.
        patching: "CORRUPTION:SEVERITY" (e.g. "gaussian_noise:3"): also activation patching of class `target`'s
            logit from the image into itself under that ImageNet-C corruption, per block, branch and CA head
            (about SA depth + 5 forward passes). Opt-in by keyword: patching="gaussian_noise:3".
        Returns {"model", "image", "predictions" (top 5), "probabilities", "class_attention" {"maps"
        [ca_layer][head][row][col], "mean", "self_share"}, "residual_ratios", "methods"[, "attribution"
        {"method", "target", "options", "patch"}][, "causal"][, "logit_lens"][, "patching"]}; each of the last
        two has a "layout" key saying its arrays.
        """
        asked = {name: value for name, value in locals().items() if name not in ("self", "image")}  # as published
        path = _payload_path(image)
        if path is None:
            raise _refused("no image given")
        loaded = self.cache.get(self.default)
        try:
            return api.answer(loaded, path, **asked)
        except (ImageInputError, ValueError) as e:
            prefix = "Could not analyse this file: " if isinstance(e, ImageInputError) else ""
            raise _refused(f"{prefix}{e}") from None


def _refused(message: str) -> gr.Error:
    """A bad /analyze call's answer, logged as one line (Gradio would print the traceback: a caller's mistake
    is not the server's)."""
    log.info("/analyze refused: %s", message)
    return gr.Error(message, print_exception=False)
