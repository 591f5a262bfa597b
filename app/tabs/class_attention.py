"""The Class attention tab: every class-attention head's map of the image (one gallery per CA layer of the page's
model, head mean first), its colour scale, the enlarged tile, and the per-head statistics; the PNG grid download."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import gradio as gr

from app import figures, session, torch_thread
from app.choices import colour_scale_image
from app.models import LoadedModel, ModelCache
from app.page_tab import PageTab
from app.shared import SCALES, VIEWS, Look, Shared, named
from app.workdir import WORK
from cait.figures import attention_tile, attention_tiles, colour_bar, display_base, grid_columns, tile_sheet

MIN_CA_LAYERS = 4  # galleries on a page at least (CaiT has 2 CA layers; a page shows as many as its first model)


class GalleryProps(NamedTuple):
    """The props of a class-attention gallery that change with the model or the colour scale."""

    visible: bool
    columns: int | None
    label: str


def new_props(layer: int) -> GalleryProps:
    """A CA gallery's props on a new page: hidden until an image is analysed."""
    return GalleryProps(visible=False, columns=None, label=f"CA layer {layer + 1}")


@dataclass
class ClassAttentionParts:
    """The tab's components; `ca_galleries` has one gallery per CA layer the page can show."""

    ca_props: gr.State  # the CA galleries' GalleryProps as this page shows them (sent only when changed)
    selected: gr.State  # the enlarged tile (layer, 0 for the head mean or head + 1) or None
    cmap: gr.Dropdown
    alpha: gr.Slider
    scale: gr.Radio
    view: gr.Radio
    keep: gr.Slider
    colour_bar: gr.Image
    ca_galleries: list[gr.Gallery]
    ca_big: gr.Plot
    head_stats: gr.Plot

    @property
    def look(self) -> list:
        """The controls of how class attention is drawn, in `Look`'s order."""
        return [self.cmap, self.alpha, self.scale, self.view, self.keep]

    @property
    def results(self) -> list:
        """What a new image (or a new model) empties here."""
        return [self.selected, self.ca_props, self.ca_big, self.head_stats, self.colour_bar, *self.ca_galleries]


@dataclass(frozen=True)
class EnlargeAsk:
    """What a click on a tile sends (by name, as the components are named)."""

    analysis: session.Analysis | None
    cmap: str
    alpha: float
    scale: str
    view: str
    keep: float


@dataclass(frozen=True)
class RedrawAsk(EnlargeAsk):
    """What a look control's change sends (by name): `EnlargeAsk`'s and the tile enlarged, the galleries' props."""

    selected: tuple[int, int] | None = None
    ca_props: tuple = ()


def look_of(ask: Any) -> Look:
    """The look fields of an ask (any dataclass with them) as a `Look`."""
    return Look(ask.cmap, ask.alpha, ask.scale, ask.view, ask.keep)


def _colour_bar(cmap: str, scale: str):
    shared = scale == SCALES[1]
    return colour_bar(cmap, "0" if shared else "each tile's min", "layer max" if shared else "each tile's max")


def layers_shown(first: LoadedModel) -> int:
    """How many CA galleries a page that starts with `first` shows."""
    return max(MIN_CA_LAYERS, first.cfg.depth_token_only)


def build(first: LoadedModel, tab: gr.Tab) -> ClassAttentionParts:
    """The tab's components (inside its gr.Tab), with as many CA galleries as the page shows (`layers_shown`)."""
    layers = layers_shown(first)
    gr.Markdown(
        "Attention of the class token to every patch: one block per class-attention layer, its head mean "
        "first, then every head. *self* is the share the class token keeps for itself (not drawn). "
        "Click a tile to enlarge it."
    )
    parts: dict[str, Any] = {}
    with gr.Row():
        parts["cmap"] = gr.Dropdown(list(figures.COLORMAPS), value="inferno", label="Colormap", elem_id="cmap")
        parts["alpha"] = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label="Overlay opacity", elem_id="alpha")
        parts["scale"] = gr.Radio(list(SCALES), value=SCALES[0], label="Colour scale", elem_id="scale")
        parts["view"] = gr.Radio(list(VIEWS), value=VIEWS[0], label="Heat map", elem_id="view")
    parts["keep"] = gr.Slider(
        0.05,
        1.0,
        value=1.0,
        step=0.05,
        label="Keep the top share of attention mass",
        info="per tile, the paper's Fig. 7 rule: patches outside the smallest set holding this "
        "share of the tile's attention are dimmed (1 = show all)",
        elem_id="keep",
    )
    parts["colour_bar"] = colour_scale_image("Colour scale", elem_id="colour_bar")
    props = [new_props(i) for i in range(layers)]
    parts["ca_props"] = gr.State(tuple(props))
    parts["selected"] = gr.State(None)
    parts["ca_galleries"] = [
        gr.Gallery(
            allow_preview=False,
            object_fit="contain",
            height="auto",
            elem_id=f"ca_grid_{i + 1}",
            elem_classes=["ca-grid"],
            **props[i]._asdict(),
        )
        for i in range(layers)
    ]
    parts["ca_big"] = gr.Plot(label="Selected tile (click one)", elem_id="ca_big")
    parts["head_stats"] = gr.Plot(label="Per-head statistics", elem_id="head_stats")
    return ClassAttentionParts(**parts)


class ClassAttentionTab(PageTab):
    """The tab's events and what it draws of an analysis."""

    def __init__(self, parts: ClassAttentionParts, shared: Shared, cache: ModelCache):
        self.parts, self.shared, self.cache = parts, shared, cache

    def outputs(self, a: session.Analysis, look: Look, selected: tuple | None, shown: tuple, *, sheet=True) -> dict:
        """The class-attention galleries (one per CA layer), colour bar and enlarged tile for `look`; with sheet,
        the PNG download too. shown: the galleries' props as the page has them (`ca_props`)."""
        p = self.parts
        layers = attention_tiles(a.view, a.ca_maps, a.self_share, **look.tile_args())
        columns = grid_columns(len(layers[0]))
        folder = WORK.request_dir()
        galleries = []
        for i in range(len(p.ca_galleries)):
            tiles = layers[i] if i < len(layers) else []
            top = f", colour 0 .. {a.ca_maps[i].max():.3f}" if look.scale == SCALES[1] and tiles else ""
            files = figures.save_tiles([t.image for t in tiles], folder, f"ca{i + 1}", exact=look.view != VIEWS[0])
            galleries.append(
                (
                    [(f, t.short_caption) for f, t in zip(files, tiles)] or None,
                    GalleryProps(visible=bool(tiles), columns=columns, label=f"CA layer {i + 1}{top}"),
                )
            )
        out = self.galleries(galleries, shown)
        out.update(
            {
                p.colour_bar: figures.image_file(_colour_bar(look.cmap, look.scale), "colour_bar", folder=folder),
                p.ca_big: self.big(a, look, selected),
            }
        )
        if sheet:
            out[self.shared.grid_file] = self.sheet(layers, look)
        return out

    def galleries(self, galleries: list[tuple[list | None, GalleryProps]], shown: tuple) -> dict:
        """Each CA gallery's new value, with its props only where they differ from `shown`: a props update
        makes Gradio rebuild the component and its config (measured: a few ms each, most of a redraw
        once the tiles are fast), a plain value does not. The new props go to `ca_props`."""
        p, out = self.parts, {}
        for gallery, (value, props), before in zip(p.ca_galleries, galleries, shown):
            out[gallery] = value if props == before else gr.update(value=value, **props._asdict())
        out[p.ca_props] = tuple(props for _, props in galleries)
        return out

    def cleared(self, shown: tuple) -> dict:
        """The tab emptied (a new image, a new model); shown: the galleries' props as the page has them."""
        out = dict.fromkeys(self.parts.results)
        return out | self.galleries([(None, before._replace(visible=False)) for before in shown], shown)

    @staticmethod
    def sheet(layers, look: Look) -> str:
        """The class-attention grid as one PNG file (the download), laid out like the page: every CA layer."""
        png = tile_sheet(
            layers,
            title="Class attention (rows: CA layers; head mean first)",
            footer=_colour_bar(look.cmap, look.scale),
        )
        path = WORK.request_dir() / "class_attention.png"
        png.save(path, compress_level=1)  # lossless like the default level, 4x faster, ~10% larger
        return str(path)

    @staticmethod
    def big(a: session.Analysis, look: Look, selected: tuple[int, int] | None):
        if selected is None or selected[0] >= a.ca_maps.shape[0]:
            return gr.Plot(value=None, label="Selected tile (click one)")
        layer, index = selected
        head = None if index == 0 else index - 1
        tile = attention_tile(display_base(a.view, 448), a.ca_maps, a.self_share, layer, head, **look.tile_args())
        heat = a.ca_maps[layer].mean(0) if head is None else a.ca_maps[layer, head]
        return gr.Plot(
            value=figures.enlarged_figure(tile.image, a.view, heat, cmap=look.cmap, title=tile.caption),
            label=tile.caption,
        )

    def redraw(self, **asked: Any) -> dict:
        """A look control changed: the tab redrawn. asked: the fields of `RedrawAsk`, by name."""
        ask = RedrawAsk(**asked)
        if ask.analysis is None:
            return gr.skip()
        return self.outputs(ask.analysis, look_of(ask), ask.selected, ask.ca_props)

    def enlarge(self, layer: int):
        """The handler of a click on a tile of CA layer `layer`."""

        def enlarge_tile(evt: gr.SelectData, **asked: Any) -> dict:
            ask = EnlargeAsk(**asked)
            if ask.analysis is None:
                return gr.skip()
            selected = (layer, int(evt.index))
            return {self.parts.ca_big: self.big(ask.analysis, look_of(ask), selected), self.parts.selected: selected}

        return enlarge_tile

    def detailed(self) -> list:
        return [self.shared.grid_file, self.parts.head_stats]

    def details(self, loaded: LoadedModel, a: session.Analysis, ask: Any) -> dict:
        """The follow-up of a new image here: the per-head statistics and the PNG grid."""
        look = ask.look
        tiles = attention_tiles(a.view, a.ca_maps, a.self_share, **look.tile_args())
        return {
            self.shared.grid_file: self.sheet(tiles, look),
            self.parts.head_stats: figures.head_stats_figure(
                session.ca_entropy(a),
                session.sa_distance(loaded, a),
                patches=loaded.cfg.grid_size**2,
                uniform_distance=session.uniform_distance(loaded),
            ),
        }

    def wire(self, demo: gr.Blocks, page: Any) -> None:
        p, shared = self.parts, self.shared
        redraw_outputs = [*p.ca_galleries, p.ca_props, p.colour_bar, shared.grid_file, p.ca_big]
        redraw = torch_thread.handler(self.redraw)  # every handler that computes: see app.torch_thread
        by_name = named(p, RedrawAsk, analysis=shared.analysis)
        for control in (p.cmap, p.scale, p.view):
            control.change(redraw, inputs_kwargs=by_name, outputs=redraw_outputs, api_visibility="private")
        # sliders: change, not release, so that arrow keys and typed values redraw too; only the latest is drawn
        for slider in (p.alpha, p.keep):
            slider.change(
                redraw,
                inputs_kwargs=by_name,
                outputs=redraw_outputs,
                trigger_mode="always_last",
                api_visibility="private",
            )
        for layer, gallery in enumerate(p.ca_galleries):
            gallery.select(
                torch_thread.handler(self.enlarge(layer)),
                inputs_kwargs=named(p, EnlargeAsk, analysis=shared.analysis),
                outputs=[p.ca_big, p.selected],
                api_visibility="private",
            )


__all__ = ["ClassAttentionParts", "ClassAttentionTab", "GalleryProps", "MIN_CA_LAYERS", "build", "new_props"]
