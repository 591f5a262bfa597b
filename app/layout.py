"""The page: every component, placed, with the values of the model a new session starts with. No event
wiring here (`app.ui`) and no computing (`app.session`); `Page` names each component for the handlers."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

import gradio as gr

import cait
from app import causal_view, dataset_view, figures, mechanisms_view, session, texts
from app.images import MAX_UPLOAD_MB
from app.models import LoadedModel, ModelChoice
from app.workdir import FILE_TTL
from cait import explain, hub
from cait.figures.attention import head_name

CLASS_ATTENTION_TAB, CAUSAL_TAB, MECHANISMS_TAB = "Class attention", "Causal", "Mechanisms"  # labels handlers compare
# The server takes files up to this size, well over MAX_UPLOAD_MB, so that a file a little too large reaches the
# upload handler, which refuses it in the status line like any file that fails. Gradio's browser check refuses
# only beyond it (a red error toast): each upload's disk stays bounded (Gradio streams it to a file, not memory).
MAX_RECEIVED_MB = 5 * MAX_UPLOAD_MB
STATE_TTL = 3600  # seconds a session's analysis is kept
MAX_CA_LAYERS = 4  # class-attention galleries on the page (CaiT has 2 CA layers; ablations may differ)
SALIENCY_DEFAULT = ("class_specific", "rollout_after_proj_l", "saliency")
SCALES = ("per tile", "shared per layer")
VIEWS = ("smooth", "patch grid")


class GalleryProps(NamedTuple):
    """The props of a class-attention gallery that change with the model or the colour scale."""

    visible: bool
    columns: int | None
    label: str


def _ca_gallery_props(layer: int) -> GalleryProps:
    """A CA gallery's props on a new page: hidden until an image is analysed."""
    return GalleryProps(visible=False, columns=None, label=f"CA layer {layer + 1}")


@dataclass
class Page:
    choice: gr.State  # the session's ModelChoice
    ca_props: gr.State  # the CA galleries' GalleryProps as this page shows them (sent only when changed)
    analysis: gr.State  # the session's Analysis (or None)
    selected: gr.State  # the enlarged tile (layer, head or None for the mean) or None
    header: gr.Markdown
    image_in: gr.Image
    examples: gr.Gallery
    top5: gr.HTML
    status: gr.Markdown
    grid_file: gr.File
    json_file: gr.File
    cmap: gr.Dropdown
    alpha: gr.Slider
    scale: gr.Radio
    view: gr.Radio
    keep: gr.Slider
    ca_galleries: list[gr.Gallery]
    colour_bar: gr.Image
    ca_big: gr.Plot
    head_stats: gr.Plot
    sal_class: gr.Dropdown
    ig_steps: gr.Slider
    sal_methods: gr.CheckboxGroup
    sal_score: gr.Checkbox
    sal_topk: gr.Slider
    sg_samples: gr.Slider
    sg_noise: gr.Slider
    sg_seed: gr.Number
    fusion: gr.Dropdown
    discard: gr.Slider
    ig_baseline: gr.Dropdown
    signed: gr.Checkbox
    sal_run: gr.Button
    sal_msg: gr.Markdown
    sal_gallery: gr.Gallery
    sal_bar: gr.Image
    sal_maps: gr.State  # the maps shown: [(heat [g, g] numpy, caption, signed, method)], for the enlarged view
    sal_big: gr.Plot
    region_of: gr.Dropdown
    region_share: gr.Slider
    sal_region: gr.Image
    sal_table: gr.Dataframe
    ls_plot: gr.Plot
    ratio_plot: gr.Plot
    th_layer: gr.Slider
    th_row: gr.Slider
    th_col: gr.Slider
    th_pick: gr.Image
    th_gallery: gr.Gallery
    th_plot: gr.Plot
    model_md: gr.Markdown
    card_md: gr.Markdown
    variant: gr.Dropdown
    weights_md: gr.Markdown
    weights_table: gr.Markdown
    checkpoint: gr.Textbox
    download: gr.Checkbox
    load_btn: gr.Button
    load_msg: gr.Markdown
    open_tab: gr.State  # the label of the tab on show: the Causal tab is computed only once it is open
    tabs: gr.Tabs
    causal_tab: gr.Tab
    cz_state: gr.State  # the Causal tab's CausalView of the shown image and class (or None)
    cz_class: gr.Dropdown
    cz_head: gr.Radio
    cz_mode: gr.Radio
    cz_cost: gr.Markdown
    cz_stop: gr.Button
    cz_heads_plot: gr.Plot
    cz_knockout_of: gr.Radio
    cz_maps: gr.Plot
    cz_top5: gr.HTML
    cz_knockout: gr.Plot
    mechanisms_tab: gr.Tab
    mx_class: gr.Dropdown
    mx_lens: gr.Plot
    mx_source: gr.Radio
    mx_corruption: gr.Dropdown
    mx_severity: gr.Slider
    mx_example: gr.Dropdown
    mx_upload: gr.Image
    mx_cost: gr.Markdown
    mx_patch_run: gr.Button
    mx_msg: gr.Markdown
    mx_second: gr.Image
    mx_patch: gr.Plot
    mx_patch_heads: gr.Plot
    mx_heads: gr.CheckboxGroup
    mx_mode: gr.Radio
    mx_ablate: gr.Button
    mx_ablation: gr.HTML
    url_model: gr.Textbox  # hidden: the page's variant, for its address (?model=...), so a reload keeps it
    dataset: dataset_view.DatasetTab  # the Dataset tab's components (a head atlas over many images)

    @property
    def results(self) -> list:
        """What analysing an image writes: its results in every tab (all of them, none left to be skipped:
        Gradio rebuilds a skipped output's component as if its props had changed). The class menus are among
        them: the first view empties their value only (the choices, 1000 for ImageNet, are sent by `details` with
        the new image's class), so an image that failed keeps no class of the last one, and a new one starts from
        its top class."""
        return [
            self.analysis,
            self.selected,
            self.ca_props,
            self.top5,
            self.status,
            self.grid_file,
            self.json_file,
            self.ca_big,
            self.head_stats,
            self.colour_bar,
            self.sal_class,
            self.sal_msg,
            self.sal_gallery,
            self.sal_bar,
            self.sal_maps,
            self.sal_big,
            self.sal_region,
            self.sal_table,
            self.ratio_plot,
            self.th_gallery,
            self.th_plot,
            self.th_pick,
            self.cz_cost,
            self.cz_class,
            *self.causal_results,
            self.mx_class,
            *self.mechanism_results,
            *self.ca_galleries,
        ]

    @property
    def mechanism_results(self) -> list:
        """What the Mechanisms tab shows of an image (emptied with the image's other results)."""
        return [
            self.mx_lens,
            self.mx_cost,
            self.mx_msg,
            self.mx_second,
            self.mx_patch,
            self.mx_patch_heads,
            self.mx_ablation,
        ]

    @property
    def causal_results(self) -> list:
        """What the Causal tab shows of an image (computed when the tab is opened, or with the downloads when it
        is already open)."""
        return [self.cz_state, self.cz_heads_plot, self.cz_maps, self.cz_top5, self.cz_knockout, self.cz_knockout_of]

    @property
    def look(self) -> list:
        """The controls of how class attention is drawn, in the order the handlers take them."""
        return [self.cmap, self.alpha, self.scale, self.view, self.keep]

    def components(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def named(self, ask: type) -> dict[str, object]:
        """The components the fields of the dataclass `ask` are named after, by name: an event's `inputs_kwargs`,
        so that its handler gets each value as the keyword of that name."""
        return {f.name: getattr(self, f.name) for f in fields(ask)}


def _inputs(first: LoadedModel, parts: dict) -> None:
    with gr.Row():
        with gr.Column(scale=2):
            parts["image_in"] = gr.Image(
                type="filepath", label="Image", sources=["upload", "clipboard"], height=300, elem_id="image_in"
            )
            gr.Markdown(
                f"Any common image format, up to {MAX_UPLOAD_MB} MB (larger files are refused). The model "
                f"sees the central square, resized to its input size.",
                elem_id="upload_note",
            )
            parts["examples"] = gr.Gallery(
                value=first.examples,
                label="Examples (click one)",
                columns=4,
                height="auto",
                allow_preview=False,
                buttons=[],  # no "Download All" of the examples
                elem_id="examples",
            )
        with gr.Column(scale=3):
            parts["top5"] = gr.HTML(elem_id="top5")
            parts["status"] = gr.Markdown(elem_id="status")
            with gr.Row():
                parts["grid_file"] = gr.File(label="Class-attention grid (PNG)", elem_id="grid_png")
                parts["json_file"] = gr.File(label="All numbers (JSON)", elem_id="numbers_json")


def _class_attention_tab(parts: dict) -> None:
    gr.Markdown(
        "Attention of the class token to every patch: one block per class-attention layer, its head mean "
        "first, then every head. *self* is the share the class token keeps for itself (not drawn). "
        "Click a tile to enlarge it."
    )
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
    parts["colour_bar"] = gr.Image(
        label="Colour scale",
        type="pil",
        interactive=False,
        height=60,
        show_label=False,
        container=False,
        elem_id="colour_bar",
        buttons=[],
    )
    props = [_ca_gallery_props(i) for i in range(MAX_CA_LAYERS)]
    parts["ca_props"] = gr.State(tuple(props))
    parts["ca_galleries"] = [
        gr.Gallery(
            allow_preview=False,
            object_fit="contain",
            height="auto",
            elem_id=f"ca_grid_{i + 1}",
            elem_classes=["ca-grid"],
            **props[i]._asdict(),
        )
        for i in range(MAX_CA_LAYERS)
    ]
    parts["ca_big"] = gr.Plot(label="Selected tile (click one)", elem_id="ca_big")
    parts["head_stats"] = gr.Plot(label="Per-head statistics", elem_id="head_stats")


def _saliency_tab(first: LoadedModel, parts: dict) -> None:
    gr.Markdown(
        "Maps for a chosen class, side by side, each with its deletion AUC (lower = more faithful) and "
        "insertion AUC (higher = more faithful). Only the ticked methods run."
    )
    parts["sal_class"] = gr.Dropdown(label="Class", choices=[], elem_id="sal_class")
    parts["sal_methods"] = gr.CheckboxGroup(
        list(explain.METHODS), value=list(SALIENCY_DEFAULT), label="Methods", elem_id="sal_methods"
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
    parts["sal_msg"] = gr.Markdown(elem_id="sal_msg")  # what keeps the maps from being computed
    parts["sal_gallery"] = gr.Gallery(
        label="Maps", columns=4, allow_preview=False, height="auto", elem_id="sal_gallery", elem_classes=["no-scroll"]
    )
    parts["sal_maps"] = gr.State(None)
    # the maps' colour scale right under them, above the enlarged map
    parts["sal_bar"] = gr.Image(
        label="Colour scale of the maps",
        type="pil",
        interactive=False,
        height=60,
        show_label=False,
        container=False,
        elem_id="sal_bar",
        buttons=[],
    )
    parts["sal_big"] = gr.Plot(label="Selected map (click one; hover: the value)", elem_id="sal_big")
    _regions_and_scores(first, parts)


def _method_options(parts: dict) -> None:
    defaults = explain.MethodOptions()
    with gr.Accordion("Method options (integrated gradients, SmoothGrad, rollout)", open=False):
        with gr.Row():  # one method's settings a row, so that no label wraps
            parts["ig_steps"] = gr.Slider(
                4, 128, value=defaults.ig_steps, step=4, label="Integrated-gradients steps", elem_id="ig_steps"
            )
            parts["ig_baseline"] = gr.Dropdown(
                list(explain.IG_BASELINES),
                value=defaults.ig_baseline,
                label="Integrated-gradients baseline",
                info="mean: the normalisation's mean colour",
                elem_id="ig_baseline",
            )
        with gr.Row():
            parts["sg_samples"] = gr.Slider(
                2, 64, value=defaults.smoothgrad_samples, step=2, label="SmoothGrad samples", elem_id="sg_samples"
            )
            parts["sg_noise"] = gr.Slider(
                0.0,
                1.0,
                value=defaults.smoothgrad_stdev,
                step=0.05,
                label="SmoothGrad noise (std, normalised units)",
                elem_id="sg_noise",
            )
            parts["sg_seed"] = gr.Number(
                value=session.DEFAULT_SEED, precision=0, label="SmoothGrad seed", elem_id="sg_seed"
            )
        with gr.Row():
            parts["fusion"] = gr.Dropdown(
                list(explain.HEAD_FUSIONS),
                value=defaults.rollout_head_fusion,
                label="Rollout head fusion",
                elem_id="fusion",
            )
            parts["discard"] = gr.Slider(
                0.0,
                0.95,
                value=defaults.rollout_discard_ratio,
                step=0.05,
                label="Rollout discard ratio (lowest weights of each layer set to 0)",
                elem_id="discard",
            )
        parts["signed"] = gr.Checkbox(
            value=defaults.signed,
            label="Signed attributions (captum methods: red for the class, blue against it; else |attribution|)",
            elem_id="signed",
        )


def _regions_and_scores(first: LoadedModel, parts: dict) -> None:
    with gr.Row():
        with gr.Column():
            parts["region_of"] = gr.Dropdown(
                region_choices(first.cfg),
                value=region_choices(first.cfg)[0],
                label="Regions of focus of",
                elem_id="region_of",
            )
            parts["region_share"] = gr.Slider(
                0.05,
                0.95,
                value=explain.DEFAULT_SHARE,
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


def _talking_heads_tab(first: LoadedModel, parts: dict) -> None:
    gr.Markdown(
        "Where one query patch (outlined) looks in a self-attention layer, per head, at each stage of the "
        "talking-heads computation: the raw per-head softmax(QK^T), which the model never computes; after "
        "proj_l mixes the logits across heads and the softmax; after proj_w mixes the weights (what "
        "multiplies the values). Below, the two mixing matrices."
    )
    g = first.cfg.grid_size
    with gr.Row():
        parts["th_layer"] = gr.Slider(1, first.cfg.depth, value=1, step=1, label="SA layer", elem_id="th_layer")
        parts["th_row"] = gr.Slider(1, g, value=g // 2 + 1, step=1, label="Query patch row", elem_id="th_row")
        parts["th_col"] = gr.Slider(1, g, value=g // 2 + 1, step=1, label="Query patch column", elem_id="th_col")
    parts["th_pick"] = gr.Image(
        label="Click a patch to make it the query",
        type="pil",
        interactive=False,
        height=figures.PICKER_SIDE,
        elem_id="th_pick",
        buttons=[],
    )
    parts["th_gallery"] = gr.Gallery(
        label="Attention of the query patch",
        columns=talking_columns(first.cfg),
        allow_preview=False,
        height="auto",
        elem_id="th_gallery",
        elem_classes=["no-scroll"],
    )
    parts["th_plot"] = gr.Plot(label="Mixing matrices", elem_id="th_plot")


def class_choices(labels: tuple[str, ...]) -> list[tuple[str, int]]:
    """A class menu's choices: (index: name, index), the Saliency, Causal and Mechanisms tabs' alike."""
    return [(f"{i}: {name}", i) for i, name in enumerate(labels)]


def causal_heads(cfg: cait.CaiTConfig) -> list[tuple[str, int]]:
    """The Causal tab's head choices: (label numbered from 1, index layer * heads + head)."""
    return [
        (f"CA{layer + 1} head {head + 1}", layer * cfg.num_heads + head)
        for layer in range(cfg.depth_token_only)
        for head in range(cfg.num_heads)
    ]


def _causal_tab(first: LoadedModel, parts: dict) -> None:
    gr.Markdown(
        "What *matters* for the prediction, not only where the model looks: each class-attention head's "
        "direct write to the chosen class's logit, beside the logit built from all its parts (heads, MLPs, "
        "initial class token, biases: the final norm linearised at this image, so they add up to the logit), "
        "the logit change when a whole block, or one of its branches, is knocked out (its "
        "LayerScale gammas set to 0) beside its mean |gamma|, and what removing one head does to the top-5. "
        "Pick a head to see where it read (attention) beside what it wrote from each patch."
    )
    with gr.Row():
        # what the tab will cost, said before it is computed; its progress once under way
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


def mechanisms_tab(first: LoadedModel, parts: dict) -> None:
    from cait.corruptions import CORRUPTIONS  # torchvision: only once the page is built

    gr.Markdown(
        "How the answer forms along depth. **Logit lens:** the model's own class-attention stage and head read "
        "the patch tokens after each SA block: the chosen class's probability and the top-1 there. "
        "**Activation patching:** a second, corrupted run; each component's clean output patched into it alone, "
        "and how much of the clean-corrupted gap of the class's logit that restores. **Ablation:** remove several "
        "class-attention heads together."
    )
    parts["mx_class"] = gr.Dropdown(label="Class", choices=[], elem_id="mx_class")
    parts["mx_lens"] = gr.Plot(label="Logit lens", elem_id="mx_lens")
    with gr.Row():
        parts["mx_source"] = gr.Radio(
            list(mechanisms_view.SOURCES), value=mechanisms_view.SOURCES[0], label="Corrupted run", elem_id="mx_source"
        )
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


def region_choices(cfg: cait.CaiTConfig) -> list[str]:
    """The class-attention maps a region of focus can be drawn from: each CA layer's mean, then its heads."""
    return [head_name(layer, head) for layer in range(cfg.depth_token_only) for head in (None, *range(cfg.num_heads))]


def talking_columns(cfg: cait.CaiTConfig) -> int:
    """Tiles per row of the talking-heads gallery: one per head, at most 8 (16 heads: two rows per stage)."""
    return min(cfg.num_heads, 8)


def _model_tab(first: LoadedModel, parts: dict) -> None:
    parts["model_md"] = gr.Markdown(texts.model_markdown(first), elem_id="model_md")
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
        parts["weights_table"] = gr.Markdown(texts.weights_table(hub.list_weights()), elem_id="weights_table")


def build_page(first: LoadedModel, ls_figure) -> tuple[gr.Blocks, Page]:
    """The page for a session that starts with `first` (each session may then load its own model)."""
    parts: dict = {}
    with gr.Blocks(title="CaiT lens", delete_cache=(FILE_TTL, FILE_TTL)) as demo:
        parts["choice"] = gr.State(first.choice)
        parts["analysis"] = gr.State(None, time_to_live=STATE_TTL)
        parts["selected"] = gr.State(None)
        parts["header"] = gr.Markdown(texts.header_markdown(first, hub.cached_variants()), elem_id="header")
        _inputs(first, parts)
        parts["open_tab"] = gr.State(CLASS_ATTENTION_TAB)
        with gr.Tabs() as parts["tabs"]:
            with gr.Tab(CLASS_ATTENTION_TAB, id="ca"):
                _class_attention_tab(parts)
            with gr.Tab("Saliency", id="saliency"):
                _saliency_tab(first, parts)
            with gr.Tab("LayerScale", id="layerscale"):
                parts["ls_plot"] = gr.Plot(value=ls_figure, label="LayerScale per depth", elem_id="ls_plot")
                parts["ratio_plot"] = gr.Plot(label="Residual-branch ratio of the analysed image", elem_id="ratio_plot")
            with gr.Tab("Talking heads", id="talking"):
                _talking_heads_tab(first, parts)
            with gr.Tab(CAUSAL_TAB, id="causal") as parts["causal_tab"]:
                _causal_tab(first, parts)
            with gr.Tab(MECHANISMS_TAB, id="mechanisms") as parts["mechanisms_tab"]:
                mechanisms_tab(first, parts)
            with gr.Tab("Dataset", id="dataset"):
                parts["dataset"] = dataset_view.build_tab()
            with gr.Tab("Model", id="model"):
                _model_tab(first, parts)
    return demo, Page(**parts)


CSS = """
/* galleries grow with their content: every computed tile is on the page, none behind a scroll bar */
.no-scroll .grid-wrap, .ca-grid .grid-wrap, #examples .grid-wrap {
    height: auto !important; min-height: 0 !important; max-height: none !important; overflow: visible !important; }
/* small inputs (a 64 px scene) are shown enlarged with crisp pixels, as the model sees them */
#image_in img, #examples img, #ca_big img { image-rendering: pixelated; }
/* captions go under their tile, never over the map, and wrap instead of being cut ("CA1 he...") when tiles
   are narrow (16 heads at 1280 px): the tile is a column of its square image and its caption */
.ca-grid .thumbnail-item, .no-scroll .thumbnail-item, #examples .thumbnail-item {
    aspect-ratio: auto !important; height: auto !important; display: flex !important; flex-direction: column;
    justify-content: flex-start; }
.ca-grid .thumbnail-item > img, .no-scroll .thumbnail-item > img, #examples .thumbnail-item > img {
    aspect-ratio: 1 / 1; height: auto !important; flex: none; }
.ca-grid .caption-label, .no-scroll .caption-label, #examples .caption-label {
    position: static !important; white-space: normal !important; overflow: visible !important;
    text-overflow: clip !important; max-width: 100% !important; border: none !important; border-radius: 0 !important;
    opacity: 1 !important; line-height: 1.25; }
/* saliency tiles at most a quarter of the page wide, however few are ticked (one was 1196 px) */
#sal_gallery .grid-container { grid-template-columns: repeat(4, minmax(0, 1fr)) !important; }
#image_in img { width: 100%; height: 100%; object-fit: contain; }
/* a gallery's label sits above its first row of tiles, not on it */
#examples .grid-wrap, .ca-grid .grid-wrap, .no-scroll .grid-wrap { padding-top: 1.8rem !important; }
.top5 { font-size: 0.95rem; }
.top5-title { font-weight: 600; margin-bottom: 0.4rem; }
.top5-row { display: grid; grid-template-columns: 14rem 1fr 4.5rem; align-items: center; gap: 0.6rem;
            margin: 0.25rem 0; }
.top5-label { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.top5-track { background: var(--neutral-100); height: 0.7rem; border-radius: 0.35rem; overflow: hidden; }
.top5-bar { display: block; height: 100%; background: var(--color-accent); }
.top5-value { text-align: right; font-variant-numeric: tabular-nums; }
.causal-top5 td, .causal-top5 th { padding: 0.15rem 0.5rem; font-variant-numeric: tabular-nums; }
/* the model card's key column keeps its words whole beside a long value (it was crushed letter by letter) */
#card_md table td:first-child { min-width: 11rem; word-break: normal; overflow-wrap: normal; }
#card_md table td:last-child { overflow-wrap: anywhere; }
/* a checked radio under the mouse keeps its fill and border. Gradio's `input:hover:not([disabled])` comes after
   its `input:checked:hover` and is as specific, so once a clicked radio lost focus (Tab, a key on another control)
   with the mouse still on it, it was drawn white and borderless, as if unchecked */
input[type=radio]:checked:hover:not([disabled]) {
    border-color: var(--checkbox-border-color-selected); background-color: var(--checkbox-background-color-selected); }
"""

__all__ = [
    "CAUSAL_TAB",
    "CLASS_ATTENTION_TAB",
    "MECHANISMS_TAB",
    "CSS",
    "GalleryProps",
    "MAX_CA_LAYERS",
    "MAX_RECEIVED_MB",
    "MAX_UPLOAD_MB",
    "Page",
    "ModelChoice",
    "SCALES",
    "VIEWS",
    "build_page",
    "causal_heads",
    "class_choices",
    "region_choices",
    "talking_columns",
]
