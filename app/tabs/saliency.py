"""The Saliency tab: the ticked methods' maps for a chosen class (or the top k side by side), each with its
deletion/insertion AUCs, the method options, the enlarged map, and the paper's Fig. 7 regions of focus."""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import gradio as gr
import numpy as np
import torch
from PIL import Image

import cait
from app import figures, session, texts, torch_thread
from app.choices import class_choices, colour_scale_image, map_names, ranked_classes, region_choices
from app.models import LoadedModel, ModelCache, ModelChoice
from app.page_tab import PageTab
from app.shared import MODEL_EVENTS, VIEWS, Shared, answering, named
from app.workdir import WORK
from cait import explain
from cait.explain.attribution import CAPTUM_METHODS, Option, checked_options
from cait.explain.maps import DEFAULT_SHARE
from cait.figures.attention import head_name

SALIENCY_DEFAULT = ("class_specific", "rollout_after_proj_l", "saliency")
_OPTIONS = explain.MethodOptions()  # the method settings' defaults


@dataclass
class SaliencyParts:
    sal_class: gr.Dropdown
    sal_methods: gr.CheckboxGroup
    method_options: dict[str, gr.components.Component]  # option name -> its control (`explain.method_options`)
    sg_seed: gr.Number
    sal_score: gr.Checkbox
    sal_topk: gr.Slider
    sal_run: gr.Button
    sal_msg: gr.Markdown  # what keeps the maps from being computed
    sal_gallery: gr.Gallery
    sal_maps: gr.State  # the maps shown: [(heat [g, g] numpy, caption, signed, method)], for the enlarged view
    sal_bar: gr.Image
    sal_big: gr.Plot
    region_of: gr.Dropdown
    region_share: gr.Slider
    sal_region: gr.Image
    sal_table: gr.Dataframe

    @property
    def results(self) -> list:
        """What a new image (or a new model) empties here."""
        return [
            self.sal_class,
            self.sal_msg,
            self.sal_gallery,
            self.sal_bar,
            self.sal_maps,
            self.sal_big,
            self.sal_region,
            self.sal_table,
        ]


@dataclass(frozen=True)
class SaliencyAsk:
    """What the run button sends, each field named as its component (`app.shared.named`: Gradio passes each value
    as the keyword of that name); method_options: the methods' options by name (`explain.method_options`), each
    its default unless given."""

    choice: ModelChoice
    analysis: session.Analysis | None
    sal_class: int | None  # None: the top prediction
    sal_methods: list[str]
    cmap: str
    alpha: float
    view: str
    sal_score: bool = True  # the deletion/insertion AUCs after the maps
    sal_topk: int = 1  # > 1: each method for each of the top k predicted classes instead of sal_class
    sg_seed: int = session.DEFAULT_SEED  # SmoothGrad's noise
    method_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, asked: dict[str, Any]) -> SaliencyAsk:
        """The ask of a run's inputs by name, the method options among them gathered in method_options."""
        names = explain.method_options()
        given = {k: v for k, v in asked.items() if k in names}
        return cls(**{k: v for k, v in asked.items() if k not in names}, method_options=given)

    def options(self) -> explain.MethodOptions:
        """The method settings as `explain.MethodOptions`, typed and checked (the page's sliders send floats)."""
        return checked_options(**self.method_options)


@dataclass(frozen=True)
class EnlargeAsk:
    """What a click on a map sends (by name)."""

    analysis: session.Analysis | None
    sal_maps: list | None
    cmap: str
    alpha: float
    view: str


@dataclass
class SaliencyRun:
    """One saliency run's progress: per class, every method's map (and tile) once computed, then its AUCs once
    scored."""

    classes: list[str]  # class names, in the order they are run
    methods: list[str]
    scoring: bool  # the AUCs are computed after the maps
    folder: Path  # where the tiles are saved (a request folder of `app.workdir.WORK`)
    options: explain.MethodOptions = _OPTIONS
    seed: int = session.DEFAULT_SEED
    exact: bool = False  # tiles saved lossless (the patch-grid view), else JPEG: `figures.save_tiles`
    rows: list = field(default_factory=list)  # (class name, session.SaliencyRow), in the order shown
    tiles: list = field(default_factory=list)  # (tile file, signed) of each row

    def add(self, name: str, row: session.SaliencyRow, tile: Image.Image, signed: bool) -> None:
        """A computed map and its tile, saved once as a file: every progress update re-sends the gallery, and
        a file is served as it is, where Gradio re-encodes a PIL image into the same cache file on every update,
        truncating it under a browser still fetching the last update's copy (a broken tile)."""
        file = figures.save_tiles([tile], self.folder, f"map_{len(self.rows)}", exact=self.exact)[0]
        self.rows.append((name, row))
        self.tiles.append((file, signed))

    def score(self, name: str, row: session.SaliencyRow) -> None:
        i = next(i for i, (n, r) in enumerate(self.rows) if n == name and r.method == row.method)
        self.rows[i] = (name, row)

    def caption(self, name: str, row: session.SaliencyRow, signed: bool = False) -> str:
        """The method, class and the settings that shaped the map (with "signed" when the map is drawn signed:
        occlusion's settings leave it out, its map being signed whatever the option); its AUCs once scored."""
        settings = session.options_caption(row.method, self.options, self.seed)
        if signed and "signed" not in settings.split(", "):
            settings = ", ".join(filter(None, (settings, "signed")))
        said = f"{row.method} for '{name}'" + (f" ({settings})" if settings else "")
        if np.isnan(row.deletion_auc):  # not scored (yet)
            return said
        return f"{said} · deletion AUC {row.deletion_auc:.3f} · insertion AUC {row.insertion_auc:.3f}"

    def captioned(self) -> list:
        return [(tile, self.caption(n, row, signed)) for (n, row), (tile, signed) in zip(self.rows, self.tiles)]

    def maps(self) -> list:
        """What enlarging a tile needs: (patch map, caption, signed, method) of each row."""
        return [(r.heat.numpy(), self.caption(n, r, s), s, r.method) for (n, r), (_, s) in zip(self.rows, self.tiles)]

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


def _map_of(name: str) -> tuple[int, int | None]:
    """'CA2 head 3' -> (1, 2), 'CA1 mean' -> (0, None): the inverse of `cait.figures.attention.head_name`."""
    layer, what = name.split(" ", 1)
    return int(layer[2:]) - 1, None if what == "mean" else int(what.split()[1]) - 1


def build(first: LoadedModel, tab: gr.Tab) -> SaliencyParts:
    """The tab's components (inside its gr.Tab)."""
    gr.Markdown(
        "Maps for a chosen class, side by side, each with its deletion AUC (lower = more faithful) and "
        "insertion AUC (higher = more faithful). Only the ticked methods run."
    )
    parts: dict[str, Any] = {"sal_class": gr.Dropdown(label="Class", choices=[], elem_id="sal_class")}
    parts["sal_methods"] = gr.CheckboxGroup(
        _menu(first), value=list(SALIENCY_DEFAULT), label="Methods", elem_id="sal_methods"
    )
    _method_options(parts)
    parts["sal_score"] = gr.Checkbox(
        value=True,
        label="Score faithfulness (deletion and insertion AUC: most of a fast method's time)",
        elem_id="sal_score",
    )
    parts["sal_topk"] = gr.Slider(
        1,
        5,
        value=1,
        step=1,
        label="Classes side by side",
        info="1: the class chosen above; k > 1: each method for each of the top k predicted classes",
        elem_id="sal_topk",
    )
    parts["sal_run"] = gr.Button("Compute saliency", variant="primary", elem_id="sal_run")
    parts["sal_msg"] = gr.Markdown(elem_id="sal_msg")
    parts["sal_gallery"] = gr.Gallery(
        label="Maps", columns=4, allow_preview=False, height="auto", elem_id="sal_gallery", elem_classes=["no-scroll"]
    )
    parts["sal_maps"] = gr.State(None)
    # the maps' colour scale right under them, above the enlarged map
    parts["sal_bar"] = colour_scale_image("Colour scale of the maps", elem_id="sal_bar")
    parts["sal_big"] = gr.Plot(label="Selected map (click one; hover: the value)", elem_id="sal_big")
    _regions_and_scores(first.cfg, parts)
    return SaliencyParts(**parts)


def _menu(loaded: LoadedModel) -> list[str]:
    """The saliency methods of `loaded`'s model: caK_mean for each of its CA layers, then the others."""
    return explain.METHODS.names(loaded.cfg.depth_token_only)


def _control(option: Option) -> gr.components.Component:
    """A method option's control, from its declaration: a slider over its bounds (those /analyze accepts), a menu
    of its choices, a tick box, or a plain field."""
    said = dict(value=option.default, label=option.help, elem_id=option.name)
    if option.bounds is not None:
        return gr.Slider(*option.bounds, step=option.step, **said)
    if option.choices:
        return gr.Dropdown(list(option.choices), info=option.note or None, **said)
    if option.kind is bool:
        return gr.Checkbox(**said)
    return gr.Textbox(**said) if option.kind is str else gr.Number(**said)


def _option_rows() -> list[tuple[str, list[Option]]]:
    """The method options a row each method (the first to declare an option places it), IG's and SmoothGrad's
    first; an option several methods share after them, alone."""
    entries = {name: explain.METHODS[name] for name in ("integrated_gradients", "smoothgrad", *explain.METHODS)}
    users = Counter(o.name for options in {e.options for e in entries.values()} for o in options)
    rows, placed = [], set()
    for name, entry in entries.items():
        row = [o for o in entry.options if users[o.name] == 1 and o.name not in placed]
        placed |= {o.name for o in row}
        rows += [(name, row)] if row else []
    shared = [o for o in explain.method_options().values() if users[o.name] > 1]
    return rows + [(o.name, [o]) for o in shared]


def _method_options(parts: dict) -> None:
    controls = parts["method_options"] = {}
    with gr.Accordion("Method options (integrated gradients, SmoothGrad, rollout)", open=False):
        for method, options in _option_rows():
            with gr.Row() if len(options) > 1 else nullcontext():
                controls |= {o.name: _control(o) for o in options}  # one method's settings a row: no label wraps
                if method == "smoothgrad":
                    parts["sg_seed"] = gr.Number(
                        value=session.DEFAULT_SEED, precision=0, label="SmoothGrad seed", elem_id="sg_seed"
                    )


def _regions_and_scores(cfg: cait.CaiTConfig, parts: dict) -> None:
    with gr.Row():
        with gr.Column():
            parts["region_of"] = gr.Dropdown(
                region_choices(cfg), value=region_choices(cfg)[0], label="Regions of focus of", elem_id="region_of"
            )
            parts["region_share"] = gr.Slider(
                0.05,
                0.95,
                value=DEFAULT_SHARE,
                step=0.05,
                label="Share of the map's attention mass the region holds",
                elem_id="region_share",
            )
            parts["sal_region"] = gr.Image(
                label="Regions of focus", type="pil", interactive=False, height=300, elem_id="sal_region"
            )
        parts["sal_table"] = gr.Dataframe(
            headers=["method", "deletion AUC", "insertion AUC", "seconds"],
            label="Scores (seconds: the map and its deletion/insertion scoring)",
            interactive=False,
            elem_id="sal_table",
        )


class SaliencyTab(PageTab):
    """The tab's events and what it draws."""

    def __init__(self, parts: SaliencyParts, shared: Shared, cache: ModelCache):
        self.parts, self.shared, self.cache = parts, shared, cache

    def run(self, **asked: Any) -> Iterator[dict]:
        """The ticked methods' maps for the chosen class (or, with topk > 1, for each of the top-k predicted
        classes side by side): each class's maps as soon as they are computed, then, with `score`, each map's
        deletion/insertion AUCs one by one (the gallery label counts them), so the maps are not held back by the
        scoring, which takes most of the time, and the wait is told by real progress.
        asked: the fields of `SaliencyAsk`, by name."""
        p, ask = self.parts, SaliencyAsk.of(asked)
        a = ask.analysis
        if a is None or a.choice != ask.choice:
            yield {p.sal_msg: texts.NO_IMAGE}
            return
        if not ask.sal_methods:
            yield {p.sal_msg: "**Tick at least one saliency method.** The maps of the last run stay below."}
            return
        loaded = self.cache.get(ask.choice)
        methods = [m for m in _menu(loaded) if m in ask.sal_methods]  # the menu's order, whatever the ticking
        targets = [a.top_class if ask.sal_class is None else int(ask.sal_class)]
        if int(ask.sal_topk or 1) > 1:
            targets = ranked_classes(a.probs, int(ask.sal_topk))
        look = dict(cmap=ask.cmap, alpha=float(ask.alpha), smooth=ask.view == VIEWS[0])
        options, seed = ask.options(), int(ask.sg_seed)
        folder = WORK.request_dir()  # the run's tiles and its colour scale
        labels = [loaded.labels[t] for t in targets]
        run = SaliencyRun(labels, methods, bool(ask.sal_score), folder, options, seed, exact=not look["smooth"])
        bars = figures.saliency_bars(ask.cmap, signed=options.signed)
        yield {
            p.sal_msg: "",
            p.sal_bar: figures.image_file(bars, "colour_bar", folder=folder),
            **self.progress(run),
        }
        saved = []
        for t in targets:
            name = loaded.labels[t]
            rows = session.unscored_rows(loaded, a, target=t, methods=methods, options=options, seed=seed)
            for row in rows:
                signed = options.signed and row.method in CAPTUM_METHODS
                run.add(name, row, figures.saliency_tile(a.view, row.heat, signed=signed, **look), signed)
            yield self.progress(run)
            for row in session.scored(loaded, a, rows, target=t) if ask.sal_score else []:
                run.score(name, row)
                yield self.progress(run)
            mine = [r for n, r in run.rows if n == name]
            saved.append(session.saliency_numbers(t, name, mine, options=options, seed=seed))
        a.saliency = saved
        yield {self.shared.json_file: session.numbers_file(loaded, a), p.sal_maps: run.maps()}

    def progress(self, run: SaliencyRun) -> dict:
        """The gallery and table of a saliency run so far."""
        auc = lambda v: None if np.isnan(v) else round(v, 4)  # noqa: E731 - not scored: an empty cell
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
            self.parts.sal_gallery: gr.Gallery(value=run.captioned() or None, label=run.label()),
            self.parts.sal_table: table or None,
        }

    def enlarge(self, evt: gr.SelectData, **asked: Any) -> dict:
        """A clicked saliency map beside its patch grid, whose hover gives each patch's value.
        asked: the fields of `EnlargeAsk`, by name."""
        ask = EnlargeAsk(**asked)
        a, maps = ask.analysis, ask.sal_maps
        if a is None or not maps or int(evt.index) >= len(maps):
            return gr.skip()
        heat, caption, signed, method = maps[int(evt.index)]
        look = dict(cmap=ask.cmap, alpha=float(ask.alpha), smooth=ask.view == VIEWS[0], signed=signed)
        tile = figures.saliency_tile(a.view, torch.from_numpy(heat), **look)
        shown = figures.SIGNED_CMAP if signed else ask.cmap
        figure = figures.enlarged_figure(
            tile, a.view, heat, cmap=shown, title=caption, colour_title=method, signed=signed
        )
        return {self.parts.sal_big: figure}

    def region(self, a, source: str | None, share: float) -> dict:
        """The paper's Fig. 7 region of focus of one class-attention map (a CA layer's mean or one head, as
        `choices.region_choices` names them), holding `share` of its mass."""
        if a is None or source not in map_names(*a.ca_maps.shape[:2]):
            return {self.parts.sal_region: None}  # no image, or a map of the model before: the new one comes with it
        layer, head = _map_of(source)
        img_size = a.x.shape[-1]
        mask, box = session.regions_of_focus(a, layer=layer, head=head, share=float(share), img_size=img_size)
        label = f"Regions of focus: {source}, {float(share):.0%} of its attention mass"
        image = figures.image_file(figures.region_image(a.view, mask, box, img_size), "region")
        return {self.parts.sal_region: gr.Image(value=image, label=label)}

    def detailed(self) -> list:
        return [self.parts.sal_class, self.parts.sal_region]

    def details(self, loaded: LoadedModel, a: session.Analysis, ask: Any) -> dict:
        """The follow-up of a new image here: the class menu and the region of focus."""
        return {self.parts.sal_class: gr.Dropdown(choices=class_choices(loaded.labels), value=a.top_class)} | (
            self.region(a, ask.region_of, ask.region_share)
        )

    def cleared(self, shown: tuple) -> dict:
        return dict.fromkeys(self.parts.results) | {self.parts.sal_msg: ""}

    def for_model(self, loaded: LoadedModel) -> dict:
        """What depends on the page's model here: the class menu, the methods (a CA layer's with each of its CA
        layers; the default ticks) and the maps a region is drawn from."""
        regions = region_choices(loaded.cfg)
        return {
            self.parts.sal_class: gr.Dropdown(choices=[], value=None),
            self.parts.sal_methods: gr.CheckboxGroup(choices=_menu(loaded), value=list(SALIENCY_DEFAULT)),
            self.parts.region_of: gr.Dropdown(choices=regions, value=regions[0]),
        }

    def wire(self, demo: gr.Blocks, page: Any) -> None:
        """The maps are drawn with the Class attention tab's look (cmap, alpha, view)."""
        look, p, shared, on_torch = page.look(), self.parts, self.shared, torch_thread.handler
        said = lambda line: {p.sal_msg: line}  # noqa: E731
        p.sal_run.click(
            on_torch(answering(self.run, said=said), batched=True),
            inputs_kwargs=named(p, SaliencyAsk, choice=shared.choice, analysis=shared.analysis, **look),
            outputs=[p.sal_gallery, p.sal_bar, p.sal_table, p.sal_msg, shared.json_file, p.sal_maps],
            show_progress_on=[p.sal_gallery],
            **MODEL_EVENTS,
        )
        p.sal_gallery.select(
            on_torch(answering(self.enlarge)),
            inputs_kwargs=named(p, EnlargeAsk, analysis=shared.analysis, **look),
            outputs=p.sal_big,
            **MODEL_EVENTS,
        )
        region = on_torch(answering(self.region))
        for control in (p.region_of, p.region_share):
            control.change(
                region,
                [shared.analysis, p.region_of, p.region_share],
                p.sal_region,
                trigger_mode="always_last",
                **MODEL_EVENTS,
            )


__all__ = ["SaliencyAsk", "SaliencyParts", "SaliencyRun", "SaliencyTab", "build", "head_name"]
