"""The CaiT app: every class-attention head, LayerScale per depth, saliency and talking heads for one image.

    python app/main.py [--host 127.0.0.1] [--port 7860] [--model cait_nano_64] [--checkpoint FILE]
                       [--device auto|cpu|cuda]

The model is loaded once and shared by all requests (a lock guards swaps from the Model tab). Each
analysis is one `forward_insights` pass; saliency methods run only when asked for. One public API
endpoint, `/analyze` (see `analyze`), returns predictions and class-attention maps as JSON.
"""
from __future__ import annotations

import os

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported: no outside calls

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
import torch
from gradio.data_classes import FileData
from PIL import Image
from torchvision.transforms import v2 as T

if __package__ in (None, ""):  # `python app/main.py`: make the `app` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cait  # noqa: E402
from app import figures  # noqa: E402
from app.images import ImageInputError, load_image  # noqa: E402
from cait import explain  # noqa: E402
from cait.config import DEFAULT_MODEL  # noqa: E402
from cait.preprocess import class_names, to_batch  # noqa: E402

EXAMPLES_DIR = Path(cait.__file__).parent / "examples"
MAX_UPLOAD = "20mb"          # larger uploads are refused by the server before any handler runs
CONCURRENCY = 2              # model runs at once (all model events share one concurrency group)
QUEUE_SIZE = 64              # waiting requests beyond this are refused: memory stays bounded
STATE_TTL = 3600             # seconds a session's analysis is kept
FILE_TTL = 900               # seconds our download files are kept (Gradio copies them into its cache)
IMAGENET_PHOTOS = ("skimage/data/chelsea.png", "skimage/data/astronaut.png", "skimage/data/coffee.png",
                   "skimage/data/rocket.jpg", "gradio/media_assets/images/cheetah.jpg",
                   "gradio/media_assets/images/lion.jpg", "skimage/data/motorcycle_left.png",
                   "gradio/media_assets/images/tower.jpg")
SALIENCY_DEFAULT = ("class_specific", "rollout_before_mixing", "saliency")
WORK_DIR = Path(tempfile.mkdtemp(prefix="cait-app-"))


# ---------------------------------------------------------------------------------------- model

@dataclass
class LoadedModel:
    model: cait.CaiT
    name: str
    source: str                      # where the weights came from, shown in the Model tab
    notice: str                      # "" or a warning shown everywhere (e.g. untrained weights)
    device: torch.device
    labels: tuple[str, ...]
    examples: list[tuple[str, str]]  # (image path, caption)
    uid: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def cfg(self) -> cait.CaiTConfig:
        return self.model.cfg


def pick_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available here (use --device auto or cpu)")
    return torch.device(choice)


def build_model(name: str | None, checkpoint: str | None) -> tuple[cait.CaiT, str, str]:
    """(model, weight source, notice). Without a checkpoint: the shipped weights or the local Hugging
    Face cache, else a seeded random init flagged as untrained (the app still shows how CaiT works)."""
    if checkpoint:
        model = cait.create_model(name or None, checkpoint=checkpoint)
        return model, f"checkpoint {checkpoint}", ""
    if not name:
        raise ValueError("give a model name or a checkpoint file")
    try:
        model = cait.create_model(name, pretrained=True)
        kind = "shipped weights" if model.cfg.pretrained else "local Hugging Face cache"
        return model, f"{kind}: {model.source}", ""
    except cait.CheckpointError as e:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = cait.create_model(name)
        return model, "random init (seed 0)", f"Untrained (no shipped weights found): {e}"


def load_model(name: str | None, checkpoint: str | None, device: torch.device) -> LoadedModel:
    model, source, notice = build_model(name, checkpoint)
    model.requires_grad_(False)  # the app never trains; gradient methods need d/d(input) only
    model.to(device)
    cfg = model.cfg
    variant = name or ("custom" if checkpoint else DEFAULT_MODEL)
    return LoadedModel(model=model, name=variant, source=source, notice=notice, device=device,
                       labels=class_names(cfg), examples=find_examples(cfg))


class ModelStore:
    """The one model of the server. Requests take a reference at their start, so a swap from the
    Model tab never changes the model under a running request."""

    def __init__(self, loaded: LoadedModel):
        self._lock = threading.Lock()
        self._current = loaded

    @property
    def current(self) -> LoadedModel:
        with self._lock:
            return self._current

    def swap(self, name: str | None, checkpoint: str | None) -> LoadedModel:
        loaded = load_model(name, checkpoint, self.current.device)  # slow part outside the lock
        with self._lock:
            self._current = loaded
        return loaded


# ------------------------------------------------------------------------------------- examples

def _copy_examples(files: list[tuple[Path, str]], folder: str) -> list[tuple[str, str]]:
    # Gradio serves files from its temp dirs: copy (small) example files next to our outputs.
    out_dir = WORK_DIR / "examples" / folder
    out_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for src, caption in files:
        dst = out_dir / src.name
        if not dst.exists():
            shutil.copyfile(src, dst)
        out.append((str(dst), caption))
    return out


def _shipped_captions() -> dict[str, str]:
    # examples.json: {"examples": [{"file": ..., "class": ..., "label": ..., "box_xyxy": ...}, ...]}
    try:
        entries = json.loads((EXAMPLES_DIR / "examples.json").read_text()).get("examples", [])
        return {e["file"]: f"true: {e.get('class', e.get('label'))}" for e in entries}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):  # missing or odd file: plain names
        return {}


def find_examples(cfg: cait.CaiTConfig) -> list[tuple[str, str]]:
    """Example images for this model: real photos for ImageNet models; test images of plain Fashion-MNIST
    for grey models (cait_nano_28); for colour Fashion-MNIST models the shipped scenes in cait/examples/,
    else a few validation scenes generated now."""
    if cfg.labels == "imagenet":
        roots = [Path(importlib.util.find_spec(pkg).origin).parents[1] for pkg in ("skimage", "gradio")]
        photos = [(root / rel, Path(rel).stem) for rel in IMAGENET_PHOTOS for root in roots if (root / rel).is_file()]
        return _copy_examples(photos, "imagenet")
    if cfg.in_chans == 1:  # trained on plain 28x28 garments: the colour scenes would be out of its world
        generated = generated_examples(cfg)
        if generated:
            return generated
    shipped = sorted(EXAMPLES_DIR.glob("*.png"))
    if shipped:
        captions = _shipped_captions()
        return _copy_examples([(p, captions.get(p.name, p.stem)) for p in shipped], "shipped")
    return generated_examples(cfg)


def generated_examples(cfg: cait.CaiTConfig, count: int = 8) -> list[tuple[str, str]]:
    from cait.data import DataError, build_dataset
    data = "fashion-mnist-scenes" if cfg.in_chans == 3 else "fashion-mnist"
    try:
        dataset = build_dataset(data, "val", subset=count)
    except DataError:
        return []
    out_dir = WORK_DIR / "examples" / data
    out_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(len(dataset)):
        image, label = dataset[i]
        path = out_dir / f"{data}-{i}.png"
        image.save(path)
        out.append((str(path), f"true: {dataset.classes[label]}"))
    return out


# ------------------------------------------------------------------------------------- analysis

@dataclass
class Analysis:
    """One image's analysis, kept per browser session so controls re-render without the model."""
    model_uid: str
    view: Image.Image                # what the model sees: the eval crop at its input size
    x: torch.Tensor                  # [1, C, H, W] normalised, on the CPU
    probs: np.ndarray                # [K]
    ca_maps: np.ndarray              # [L, heads, g, g] class-token -> patch attention
    self_share: np.ndarray           # [L, heads] class-token -> itself
    ratios: dict[str, list[float]]   # residual-branch ratio per block ("sa", "ffn", "ca", "ca_ffn")
    sa_layer: int                    # the SA layer whose attention is kept for the talking-heads tab
    sa_before: np.ndarray            # [heads, N, N]
    sa_after: np.ndarray             # [heads, N, N]
    notes: list[str]
    original_size: tuple[int, int]


def model_view(image: Image.Image, cfg: cait.CaiTConfig) -> Image.Image:
    """The pixels the eval transform keeps (resize short side, centre crop), as an image."""
    resize = int(cfg.img_size / cfg.crop_pct)
    return T.CenterCrop(cfg.img_size)(T.Resize(resize, interpolation=T.InterpolationMode.BICUBIC)(image))


def analyse(loaded: LoadedModel, path: str, *, sa_layer: int = 0) -> Analysis:
    """Decode `path` safely and run one insight forward pass. Raises ImageInputError for bad files."""
    cfg = loaded.cfg
    decoded = load_image(path, mode="RGB" if cfg.in_chans == 3 else "L")
    x = to_batch([decoded.image], cfg)
    sa_layer = min(max(int(sa_layer), 0), cfg.depth - 1)
    with torch.inference_mode():
        ins = loaded.model.forward_insights(x.to(loaded.device), sa_layers=(sa_layer,))
    rows = torch.stack(ins.class_attention, dim=1)[0].float().cpu()  # [L, heads, 1+N]
    g = cfg.grid_size
    before, after = ins.self_attention[sa_layer]
    return Analysis(
        model_uid=loaded.uid, view=model_view(decoded.image, cfg), x=x,
        probs=ins.logits[0].float().softmax(-1).cpu().numpy(),
        ca_maps=rows[..., 1:].reshape(*rows.shape[:2], g, g).numpy(), self_share=rows[..., 0].numpy(),
        ratios={k: v[0].float().cpu().tolist() for k, v in ins.residual_ratios.items()},
        sa_layer=sa_layer, sa_before=before[0].float().cpu().numpy(), sa_after=after[0].float().cpu().numpy(),
        notes=decoded.notes, original_size=decoded.original_size)


def top_predictions(probs: np.ndarray, labels: tuple[str, ...], k: int = 5) -> list[dict[str, Any]]:
    order = np.argsort(-probs)[:k]
    return [{"index": int(i), "label": labels[i], "probability": float(probs[i])} for i in order]


def numbers(loaded: LoadedModel, a: Analysis) -> dict[str, Any]:
    """Everything the analysis computed, JSON-able (the /analyze answer and the JSON download)."""
    cfg = loaded.cfg
    return {
        "model": {"name": loaded.name, "source": loaded.source, "img_size": cfg.img_size,
                  "patch_size": cfg.patch_size, "grid_size": cfg.grid_size, "num_classes": cfg.num_classes,
                  "notice": loaded.notice},
        "image": {"original_size": list(a.original_size), "notes": a.notes},
        "predictions": top_predictions(a.probs, loaded.labels),
        "probabilities": a.probs.tolist(),
        "class_attention": {
            "layout": "maps[ca_layer][head][row][col]: class token -> patch attention (row-major patch grid)",
            "maps": a.ca_maps.tolist(), "mean": a.ca_maps.mean(1).tolist(), "self_share": a.self_share.tolist()},
        "residual_ratios": a.ratios,
    }


def request_dir() -> Path:
    """A fresh folder for one request's downloads (no two requests share a file); old ones are swept."""
    root = WORK_DIR / "requests"
    root.mkdir(exist_ok=True)
    cutoff = time.time() - FILE_TTL
    for old in root.iterdir():
        try:
            if old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except FileNotFoundError:  # swept by a concurrent request
            pass
    return Path(tempfile.mkdtemp(dir=root))


def heat_for(loaded: LoadedModel, x: torch.Tensor, target: int, method: str, steps: int) -> torch.Tensor:
    """One saliency map [g, g] for class `target`; IG takes its number of steps."""
    if method not in explain.METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(explain.METHODS)}")
    x = x.to(loaded.device)
    t = torch.tensor([target], device=loaded.device)
    if method == "integrated_gradients":
        return explain.attribution(loaded.model, x, t, method, n_steps=int(steps)).patch[0].cpu()
    return explain.METHODS[method](loaded.model, x, t)[0].detach().float().cpu()


# -------------------------------------------------------------------------------------- the app

def _payload_path(payload: Any) -> str | None:
    if payload is None:
        return None
    if isinstance(payload, dict):
        return payload.get("path")
    return getattr(payload, "path", None) or (payload if isinstance(payload, str) else None)


def model_markdown(loaded: LoadedModel) -> str:
    cfg = loaded.cfg
    rows = [("variant", loaded.name), ("weights", loaded.source), ("device", str(loaded.device)),
            ("parameters", f"{loaded.model.num_params() / 1e6:.2f} M"),
            ("FLOPs (multiply-accumulates)", f"{loaded.model.flops() / 1e9:.3f} G"),
            ("input", f"{cfg.img_size}x{cfg.img_size}, {cfg.in_chans} channel(s), patch {cfg.patch_size} "
                      f"-> {cfg.grid_size}x{cfg.grid_size} patches"),
            ("blocks", f"{cfg.depth} SA + {cfg.depth_token_only} CA, width {cfg.embed_dim}, {cfg.num_heads} heads"),
            ("LayerScale init eps", f"{cfg.init_values:g}"), ("talking heads", str(cfg.talking_heads)),
            ("classes", f"{cfg.num_classes} ({'ImageNet-1k' if cfg.labels == 'imagenet' else ', '.join(loaded.labels)})")]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    warn = f"\n\n**⚠ {loaded.notice}**" if loaded.notice else ""
    return f"| model | |\n|---|---|\n{table}{warn}"


def header_markdown(loaded: LoadedModel) -> str:
    warn = f"  \n**⚠ {loaded.notice.split(':')[0]}** — predictions are meaningless; see the Model tab." \
        if loaded.notice else ""
    return (f"# CaiT: class attention & LayerScale\nModel **{loaded.name}** ({loaded.source}) on "
            f"**{loaded.device}**. Upload an image or pick an example.{warn}")


def build_app(store: ModelStore) -> gr.Blocks:
    """The whole UI; every handler reads the model from `store`."""
    first = store.current
    cfg = first.cfg

    def stale(a: Analysis | None) -> bool:
        return a is None or a.model_uid != store.current.uid

    def ca_outputs(a: Analysis, cmap: str, alpha: float, selected: int | None):
        loaded = store.current
        tiles = figures.attention_tiles(a.view, a.ca_maps, cmap=cmap, alpha=float(alpha))
        columns = a.ca_maps.shape[1] + 1
        png = figures.grid_png(tiles, columns, request_dir() / "class_attention.png",
                               title=f"{loaded.name}: class attention (rows: CA layers; columns: heads, mean)")
        big = big_tile(a, cmap, alpha, selected)
        return gr.Gallery(value=tiles, columns=columns), str(png), big

    def big_tile(a: Analysis, cmap: str, alpha: float, selected: int | None):
        if selected is None:
            return None
        heads = a.ca_maps.shape[1]
        layer, head = divmod(int(selected), heads + 1)
        heat = a.ca_maps[layer].mean(0) if head == heads else a.ca_maps[layer, head]
        base = figures.display_base(a.view, 448)
        return explain.overlay(base, torch.from_numpy(heat), cmap=cmap, alpha=float(alpha))

    def talking_outputs(a: Analysis, row: int, col: int):
        loaded = store.current
        g = loaded.cfg.grid_size
        patch = min(int(row), g - 1) * g + min(int(col), g - 1)
        tiles = figures.query_tiles(a.view, a.sa_before, a.sa_after, patch, cmap="inferno", alpha=0.6)
        attn = loaded.model.blocks[a.sa_layer].attn
        eye = np.eye(attn.num_heads)
        mix = lambda p: p.weight.detach().float().cpu().numpy() if isinstance(p, torch.nn.Linear) else eye
        return (gr.Gallery(value=tiles, columns=attn.num_heads),
                figures.mixing_figure(mix(attn.proj_l), mix(attn.proj_w), a.sa_layer))

    def empty_outputs(status: str):
        return (None, None, status, None, None, None, None, None, None, gr.Dropdown(), None, None)

    def analyze_view(payload, cmap, alpha, th_layer, th_row, th_col):
        path = _payload_path(payload)
        if path is None:
            return empty_outputs("")
        loaded = store.current
        try:
            a = analyse(loaded, path, sa_layer=int(th_layer) - 1)
        except ImageInputError as e:
            gr.Warning(f"Could not analyse this file: {e}")
            return empty_outputs(f"**Could not analyse this file:** {e}")
        for note in a.notes:
            gr.Info(note)
        preds = top_predictions(a.probs, loaded.labels)
        gallery, png, _ = ca_outputs(a, cmap, alpha, None)
        json_path = request_dir() / "cait_analysis.json"
        data = numbers(loaded, a)
        data["layerscale"] = explain.layerscale_stats(loaded.model)
        json_path.write_text(json.dumps(data))
        status = f"Top-1: **{preds[0]['label']}** ({preds[0]['probability']:.1%})"
        if a.notes:
            status += "  \nInput notes: " + " ".join(a.notes)
        if loaded.notice:
            status += "  \n⚠ untrained model: the prediction means nothing."
        choices = [(f"{i}: {name}", i) for i, name in enumerate(loaded.labels)]
        th_gallery, th_plot = talking_outputs(a, th_row, th_col)
        return (a, {p["label"]: p["probability"] for p in preds}, status, gallery, None, png, str(json_path),
                figures.layerscale_figure(data["layerscale"], loaded.cfg.init_values),
                figures.residual_figure(a.ratios), gr.Dropdown(choices=choices, value=preds[0]["index"]),
                th_gallery, th_plot)

    def rerender_ca(a: Analysis | None, cmap: str, alpha: float, selected: int | None):
        if a is None:
            return None, None, None
        return ca_outputs(a, cmap, alpha, selected)

    def enlarge(a: Analysis | None, cmap: str, alpha: float, evt: gr.SelectData):
        if a is None:
            return None, None
        return big_tile(a, cmap, alpha, evt.index), evt.index

    def saliency_view(a: Analysis | None, target: int | None, methods: list[str], steps: int, cmap: str,
                      alpha: float):
        if stale(a):
            raise gr.Error("Analyse an image with the current model first.")
        if not methods:
            raise gr.Error("Tick at least one method.")
        loaded = store.current
        target = int(target if target is not None else a.probs.argmax())
        base = figures.display_base(a.view)
        x = a.x.to(loaded.device)
        t = torch.tensor([target], device=loaded.device)
        tiles, table = [], []
        for method in methods:
            start = time.perf_counter()
            heat = heat_for(loaded, a.x, target, method, steps)
            seconds = time.perf_counter() - start
            with torch.inference_mode():
                scores = explain.deletion_insertion(loaded.model, x, t, heat[None].to(loaded.device))
            deletion, insertion = float(scores["deletion_auc"][0]), float(scores["insertion_auc"][0])
            tiles.append((explain.overlay(base, heat, cmap=cmap, alpha=float(alpha)),
                          f"{method} · deletion AUC {deletion:.3f} · insertion AUC {insertion:.3f}"))
            table.append([method, round(deletion, 4), round(insertion, 4), round(seconds, 3)])
        mask, boxes = explain.regions_of_focus(torch.from_numpy(a.ca_maps[0].mean(0))[None],
                                               img_size=loaded.cfg.img_size)
        region = explain.overlay(base, mask[0].float(), cmap="gray", alpha=0.45)
        region = figures.draw_box(region, tuple(boxes[0].tolist()), base.width / loaded.cfg.img_size)
        return tiles, region, table

    def talking_view(a: Analysis | None, layer: int, row: int, col: int):
        if stale(a):
            return a, None, None
        if int(layer) - 1 != a.sa_layer:  # a new layer needs its attention: one more forward pass
            loaded = store.current
            th = explain.talking_heads(loaded.model, a.x.to(loaded.device), int(layer) - 1)
            a.sa_layer = int(layer) - 1
            a.sa_before, a.sa_after = th.after_proj_l[0].float().cpu().numpy(), th.after_proj_w[0].float().cpu().numpy()
        return (a, *talking_outputs(a, row, col))

    def pick_example(evt: gr.SelectData):
        return evt.value["image"]["path"]

    def load_model_ui(name: str, checkpoint: str):
        try:
            loaded = store.swap(name or None, checkpoint.strip() or None)
        except (cait.CheckpointError, ValueError, OSError) as e:
            raise gr.Error(f"Could not load the model: {e}")
        g = loaded.cfg.grid_size
        gr.Info(f"Loaded {loaded.name} ({loaded.source}).")
        return (model_markdown(loaded), header_markdown(loaded), loaded.examples, None, None,
                gr.Slider(maximum=loaded.cfg.depth, value=1), gr.Slider(maximum=g - 1, value=g // 2),
                gr.Slider(maximum=g - 1, value=g // 2))

    def analyze(image: FileData, method: str = "", target: int = -1, steps: int = 32) -> dict:
        """Predictions and class-attention maps for one image.

        image: the image file (gradio_client: handle_file(path)).
        method: "" for none, or a saliency method (see the "methods" field of the answer) to also compute
            its patch-grid map for class `target` (-1: the top prediction); integrated_gradients uses `steps`.
        Returns {"model", "image", "predictions" (top 5), "probabilities", "class_attention" {"maps"
        [ca_layer][head][row][col], "mean", "self_share"}, "residual_ratios", "methods"[, "attribution"]}.
        """
        path = _payload_path(image)
        if path is None:
            raise gr.Error("no image given")
        loaded = store.current
        try:
            a = analyse(loaded, path)
        except ImageInputError as e:
            raise gr.Error(f"Could not analyse this file: {e}")
        out = numbers(loaded, a)
        out["methods"] = list(explain.METHODS)
        if method:
            target = int(a.probs.argmax()) if target < 0 else target
            if not 0 <= target < loaded.cfg.num_classes:
                raise gr.Error(f"target must be in 0..{loaded.cfg.num_classes - 1} or -1, got {target}")
            if method not in explain.METHODS:
                raise gr.Error(f"unknown method {method!r}; choose from {', '.join(explain.METHODS)}")
            heat = heat_for(loaded, a.x, target, method, steps)
            out["attribution"] = {"method": method, "target": target, "patch": heat.tolist()}
        return out

    g = cfg.grid_size
    with gr.Blocks(title="CaiT lens", delete_cache=(FILE_TTL, FILE_TTL)) as demo:
        state = gr.State(None, time_to_live=STATE_TTL)
        selected = gr.State(None)
        header = gr.Markdown(header_markdown(first), elem_id="header")
        with gr.Row():
            with gr.Column(scale=2):
                image_in = gr.Image(type="filepath", label="Image", sources=["upload", "clipboard"], height=300,
                                    elem_id="image_in")
                examples = gr.Gallery(value=first.examples, label="Examples (click one)", columns=4, height="auto",
                                      allow_preview=False, show_label=True, elem_id="examples")
            with gr.Column(scale=3):
                top5 = gr.Label(num_top_classes=5, label="Top-5 predictions", elem_id="top5")
                status = gr.Markdown(elem_id="status")
                with gr.Row():
                    grid_file = gr.File(label="Class-attention grid (PNG)", elem_id="grid_png")
                    json_file = gr.File(label="All numbers (JSON)", elem_id="numbers_json")
        with gr.Tabs():
            with gr.Tab("Class attention", id="ca"):
                gr.Markdown("Attention of the class token to every patch, for each class-attention layer (rows) "
                            "and head (columns), plus the head mean. Click a tile to enlarge it.")
                with gr.Row():
                    cmap = gr.Dropdown(list(figures.COLORMAPS), value="inferno", label="Colormap", elem_id="cmap")
                    alpha = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label="Overlay opacity", elem_id="alpha")
                ca_gallery = gr.Gallery(label="Class attention", columns=cfg.num_heads + 1, allow_preview=False,
                                        object_fit="contain", height="auto", elem_id="ca_grid")
                ca_big = gr.Image(label="Selected head", type="pil", interactive=False, height=448,
                                  elem_id="ca_big")
            with gr.Tab("Saliency", id="saliency"):
                gr.Markdown("Maps for a chosen class, side by side, each with its deletion AUC (lower = more "
                            "faithful) and insertion AUC (higher = more faithful). Only the ticked methods run.")
                with gr.Row():
                    sal_class = gr.Dropdown(label="Class", choices=[], elem_id="sal_class")
                    ig_steps = gr.Slider(4, 128, value=32, step=4, label="Integrated-gradients steps")
                sal_methods = gr.CheckboxGroup(list(explain.METHODS), value=list(SALIENCY_DEFAULT),
                                               label="Methods", elem_id="sal_methods")
                sal_run = gr.Button("Compute saliency", variant="primary", elem_id="sal_run")
                sal_gallery = gr.Gallery(label="Maps", columns=4, allow_preview=True, height="auto",
                                         elem_id="sal_gallery")
                with gr.Row():
                    sal_region = gr.Image(label="Regions of focus (CA layer 1, half the attention mass)",
                                          type="pil", interactive=False, height=300)
                    sal_table = gr.Dataframe(headers=["method", "deletion AUC", "insertion AUC", "seconds"],
                                             label="Scores", interactive=False)
            with gr.Tab("LayerScale", id="layerscale"):
                ls_plot = gr.Plot(label="LayerScale per depth", elem_id="ls_plot")
                ratio_plot = gr.Plot(label="Residual-branch ratio", elem_id="ratio_plot")
            with gr.Tab("Talking heads", id="talking"):
                gr.Markdown("Where one query patch looks in a self-attention layer, per head, before and after "
                            "the talking-heads mixing (the query patch is outlined), and the mixing matrices.")
                with gr.Row():
                    th_layer = gr.Slider(1, cfg.depth, value=1, step=1, label="SA layer")
                    th_row = gr.Slider(0, g - 1, value=g // 2, step=1, label="Query patch row")
                    th_col = gr.Slider(0, g - 1, value=g // 2, step=1, label="Query patch column")
                th_gallery = gr.Gallery(label="Attention of the query patch", columns=cfg.num_heads,
                                        allow_preview=False, height="auto")
                th_plot = gr.Plot(label="Mixing matrices")
            with gr.Tab("Model", id="model"):
                model_md = gr.Markdown(model_markdown(first), elem_id="model_md")
                gr.Markdown("### Load another model\nA variant name and a local checkpoint (official deit "
                            ".pth, timm .pth/.safetensors or ours). Leave the path empty for the shipped "
                            "weights or the local Hugging Face cache. Nothing is downloaded. This changes the "
                            "model for every user of this server.")
                with gr.Row():
                    variant = gr.Dropdown(cait.list_models(), value=first.name if first.name in cait.list_models()
                                          else None, label="Variant")
                    checkpoint = gr.Textbox(label="Checkpoint file (optional)", placeholder="/path/to/cait.pth")
                load_btn = gr.Button("Load model")

        model_events = dict(concurrency_id="model", api_visibility="private")
        image_in.change(analyze_view, [image_in, cmap, alpha, th_layer, th_row, th_col],
                        [state, top5, status, ca_gallery, ca_big, grid_file, json_file, ls_plot, ratio_plot,
                         sal_class, th_gallery, th_plot], preprocess=False, **model_events)
        for event in (cmap.change, alpha.release):
            event(rerender_ca, [state, cmap, alpha, selected], [ca_gallery, grid_file, ca_big],
                  api_visibility="private")
        ca_gallery.select(enlarge, [state, cmap, alpha], [ca_big, selected], api_visibility="private")
        sal_run.click(saliency_view, [state, sal_class, sal_methods, ig_steps, cmap, alpha],
                      [sal_gallery, sal_region, sal_table], **model_events)
        for slider in (th_layer, th_row, th_col):
            slider.release(talking_view, [state, th_layer, th_row, th_col], [state, th_gallery, th_plot],
                           **model_events)
        examples.select(pick_example, None, image_in, api_visibility="private")
        load_btn.click(load_model_ui, [variant, checkpoint],
                       [model_md, header, examples, state, image_in, th_layer, th_row, th_col], **model_events)
        gr.api(analyze, api_name="analyze", concurrency_id="model")
    demo.queue(default_concurrency_limit=CONCURRENCY, max_size=QUEUE_SIZE)
    return demo


THEME = dict(font=["DejaVu Sans", "sans-serif"], font_mono=["DejaVu Sans Mono", "monospace"])  # local fonts only


def launch(demo: gr.Blocks, *, host: str = "127.0.0.1", port: int = 7860, block: bool = True) -> None:
    demo.launch(server_name=host, server_port=port, share=False, theme=gr.themes.Default(**THEME),
                max_file_size=MAX_UPLOAD, ssr_mode=False, show_error=True, prevent_thread_lock=not block,
                allowed_paths=[str(WORK_DIR)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"variant name (default {DEFAULT_MODEL})")
    parser.add_argument("--checkpoint", default=None, help="local checkpoint file (.pth / .safetensors)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    try:
        loaded = load_model(args.model, args.checkpoint, device)
    except (cait.CheckpointError, ValueError) as e:
        raise SystemExit(f"error: {e}")
    if loaded.notice:
        print(f"warning: {loaded.notice}", file=sys.stderr)
    launch(build_app(ModelStore(loaded)), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
