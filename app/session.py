"""One image's analysis and what is computed from it, as plain functions of a `LoadedModel` (no Gradio):
the page's handlers call these, and so do the tests, without a server."""

from __future__ import annotations

import dataclasses
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
from PIL import Image

from app.choices import ranked_classes, top_predictions
from app.images import DecodedImage, load_image
from app.models import LoadedModel, ModelChoice
from app.workdir import WORK
from cait import explain
from cait.errors import InputError
from cait.explain import ClassAttention, MethodOptions
from cait.explain import maps as heat_maps
from cait.explain.head_stats import attention_distances_by_stage, attention_entropy, uniform_attention_distance
from cait.explain.layerscale import layerscale_stats
from cait.explain.methods import ROLLOUT_METHODS
from cait.explain.metrics import endpoint_probabilities
from cait.preprocess import model_view, view_tensor


@dataclass
class StageMaps:
    """One SA layer's attention at each stage of the talking-heads computation, [heads, N, N] each."""

    layer: int  # SA layer, 0-based
    raw: np.ndarray  # softmax(q k^T) per head: the counterfactual the model does not compute
    after_proj_l: np.ndarray  # softmax(proj_l(q k^T)): the softmax the model computes
    after_proj_w: np.ndarray  # proj_w(...): the weights that multiply the values


@dataclass
class Analysis:
    """One image's analysis, kept per browser session so that controls re-render without the model."""

    choice: ModelChoice  # the session's model when it was made: another choice makes it stale
    view: Image.Image  # what the model sees: the eval crop at its input size
    x: torch.Tensor  # [1, C, H, W] normalised, on the CPU
    probs: np.ndarray  # [K], fp32
    ca_maps: np.ndarray  # [L, heads, g, g] class token -> patch attention
    self_share: np.ndarray  # [L, heads] class token -> itself
    ratios: dict[str, list[float]]  # residual-branch ratio per block ("sa", "ffn", "ca", "ca_ffn")
    stages: StageMaps  # the SA layer shown in the talking-heads tab
    notes: list[str]  # what was done to the upload (EXIF rotation, transparency, ...)
    original_size: tuple[int, int]
    forward_seconds: float = float("nan")  # the model's fastest analysis forward so far: what costs are told in
    # SA stage (explain.head_stats.DISTANCE_STAGES) -> [SA layers, heads] mean attention distance (px), once computed
    sa_distance: dict[str, np.ndarray] | None = None
    causal: dict[str, Any] | None = None  # the Causal tab's numbers for the top class (the download), once computed
    saliency: list[dict[str, Any]] | None = None  # the last saliency run's numbers (the download), once computed
    # the Mechanisms tab's last logit lens, patching and token-patching run, as /analyze answers them (the
    # download), once computed
    logit_lens: dict[str, Any] | None = None
    patching: dict[str, Any] | None = None
    token_patching: dict[str, Any] | None = None
    # the decoded image, at most SOURCE_SIDE on a side: what another model reads it from (the Compare tab; the
    # file itself may be gone by then)
    source: Image.Image | None = None

    @property
    def top_class(self) -> int:
        """The predicted class: `ranked_classes`' first, as everywhere on the page."""
        return ranked_classes(self.probs, 1)[0]


def _stages(layer: int, raw: torch.Tensor, after_proj_l: torch.Tensor, after_proj_w: torch.Tensor) -> StageMaps:
    as_numpy = lambda t: t[0].float().cpu().numpy()
    return StageMaps(layer, as_numpy(raw), as_numpy(after_proj_l), as_numpy(after_proj_w))


def model_input(path: str, cfg) -> tuple[DecodedImage, Image.Image, torch.Tensor]:
    """An image file decoded safely (ImageInputError for a bad one), what the model sees of it (`model_view`),
    and that as the model's input [1, C, H, W]."""
    decoded = load_image(path, mode=cfg.image_mode)
    return decoded, *model_input_of(decoded.image, cfg)


SOURCE_SIDE = 1024  # above every model's input side (448 at most): another model's view is not blurred by it


def _bounded(image: Image.Image) -> Image.Image:
    bounded = image.copy()
    bounded.thumbnail((SOURCE_SIDE, SOURCE_SIDE))
    return bounded


def model_input_of(image: Image.Image, cfg) -> tuple[Image.Image, torch.Tensor]:
    """A decoded image as a model sees it (`model_view`) and as its input [1, C, H, W]."""
    view = model_view(image, cfg)
    return view, view_tensor(view, cfg)[None]


def analyse(loaded: LoadedModel, path: str, *, sa_layer: int = 0) -> Analysis:
    """Decode `path` safely and run one insight forward pass. Raises ImageInputError for bad files."""
    cfg = loaded.cfg
    decoded, view, x = model_input(path, cfg)
    sa_layer = min(max(int(sa_layer), 0), cfg.depth - 1)
    start = time.perf_counter()
    with loaded.forward_only():
        ins = loaded.model.forward_insights(x.to(loaded.device), sa_layers=(sa_layer,), raw_attention=True)
    forward_seconds = loaded.timed_forward(time.perf_counter() - start)
    ca = ClassAttention.from_insights(ins)
    return Analysis(
        choice=loaded.choice,
        view=view,
        x=x,
        probs=ins.logits[0].float().softmax(-1).cpu().numpy(),
        ca_maps=ca.maps[0].float().cpu().numpy(),
        self_share=ca.self_share[0].float().cpu().numpy(),
        ratios={k: v[0].float().cpu().tolist() for k, v in ins.residual_ratios.items()},
        stages=_stages(sa_layer, ins.raw_self_attention[sa_layer], *ins.self_attention[sa_layer]),
        notes=decoded.notes,
        original_size=decoded.original_size,
        forward_seconds=forward_seconds,
        source=_bounded(decoded.image),
    )


def with_sa_layer(loaded: LoadedModel, a: Analysis, layer: int) -> Analysis:
    """`a` with the talking-heads stages of SA layer `layer` (one more forward pass when it changes)."""
    if layer != a.stages.layer:
        with loaded.forward_only():
            th = explain.talking_heads(loaded.model, a.x.to(loaded.device), layer)
        a.stages = _stages(layer, th.raw, th.after_proj_l, th.after_proj_w)
    return a


def ca_entropy(a: Analysis) -> np.ndarray:
    """Entropy (nats) of each class-attention head's map over the patches: [CA layers, heads]."""
    return attention_entropy(torch.from_numpy(a.ca_maps)).numpy()


def sa_distance(loaded: LoadedModel, a: Analysis) -> dict[str, np.ndarray]:
    """Each SA head's mean attention distance in pixels on the softmax after proj_l and on |w| after proj_w,
    stage -> [SA layers, heads]: computed on first use (one more forward pass, so not in the first view) and
    kept in the analysis."""
    if a.sa_distance is None:
        with loaded.forward_only():
            by_stage = attention_distances_by_stage(loaded.model, a.x.to(loaded.device))
        a.sa_distance = {stage: d[0].float().cpu().numpy() for stage, d in by_stage.items()}
    return a.sa_distance


def uniform_distance(loaded: LoadedModel) -> float:
    """The mean attention distance (px) of uniform attention over the model's patch grid."""
    return uniform_attention_distance(loaded.cfg.grid_size, loaded.cfg.patch_size)


def numbers(loaded: LoadedModel, a: Analysis) -> dict[str, Any]:
    """Everything the analysis computed, JSON-able (the /analyze answer and the JSON download)."""
    cfg = loaded.cfg
    return {
        "model": {
            "name": loaded.name,
            "source": loaded.source,
            "img_size": cfg.img_size,
            "patch_size": cfg.patch_size,
            "grid_size": cfg.grid_size,
            "num_classes": cfg.num_classes,
            "notice": loaded.notice,
        },
        "image": {"original_size": list(a.original_size), "notes": a.notes},
        "predictions": top_predictions(a.probs, loaded.labels),
        "probabilities": a.probs.tolist(),
        "class_attention": {
            "layout": "maps[ca_layer][head][row][col]: class token -> patch attention (row-major patch grid; "
            "0-based indices, shown from 1 in the app as CA1 head 1)",
            "maps": a.ca_maps.tolist(),
            "mean": a.ca_maps.mean(1).tolist(),
            "self_share": a.self_share.tolist(),
            "entropy": ca_entropy(a).tolist(),
            "entropy_layout": "entropy[ca_layer][head]: nats over the patches (the map renormalised without the "
            f"class token's share); uniform attention is ln(N) = {np.log(cfg.grid_size**2):.3f}",
        },
        "self_attention": {
            "mean_distance": sa_distance(loaded, a)["after_proj_w"].tolist(),
            "mean_distance_after_proj_l": sa_distance(loaded, a)["after_proj_l"].tolist(),
            "uniform_distance": uniform_distance(loaded),
            "layout": "mean_distance[sa_layer][head]: the ViT paper's mean attention distance in input pixels, "
            "from the weights after proj_w (absolute values, renormalised per query patch); "
            "mean_distance_after_proj_l: the same from the softmax after proj_l (a true distribution); "
            "uniform_distance: the level of uniform attention",
        },
        "residual_ratios": a.ratios,
    }


def numbers_file(loaded: LoadedModel, a: Analysis) -> str:
    """All numbers as the JSON download, in a fresh request folder: the analysis, LayerScale and, once computed,
    the causal view, the last saliency run, and the Mechanisms tab's last logit lens, patching and token-patching
    run (each kept on the analysis, so that writing the file for one keeps the others)."""
    data = numbers(loaded, a)
    data["layerscale"] = layerscale_stats(loaded.model)
    # sections computed on demand: a reader of the file learns what is missing and how to get it
    on_demand = {
        "causal": (a.causal, "open the Causal tab"),
        "saliency": (a.saliency, "run the Saliency tab"),
        "logit_lens": (a.logit_lens, "open the Mechanisms tab"),
        "patching": (a.patching, "run patching in the Mechanisms tab"),
        "token_patching": (a.token_patching, "map where the answer enters in the Mechanisms tab"),
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


DEFAULT_SEED = 0  # SmoothGrad's noise: the same map for the same options, run after run


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Torch's random numbers from `seed` inside (SmoothGrad's noise), the generators' state restored after."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(int(seed))
        yield


def options_record(options: MethodOptions, seed: int) -> dict[str, Any]:
    """The method settings a saliency run used, JSON-able: every method option plus SmoothGrad's seed."""
    return {**options.as_dict(), "seed": int(seed)}


def options_caption(method: str, options: MethodOptions, seed: int) -> str:
    """The settings that shaped `method`'s map, in a few words ("" for a method without any): its entry's."""
    return ", ".join(explain.METHODS[method].said(options, seed))


@dataclass
class SaliencyRow:
    method: str
    heat: torch.Tensor  # [g, g] on the patch grid
    deletion_auc: float  # lower = more faithful
    insertion_auc: float  # higher = more faithful
    seconds: float  # the map and its deletion/insertion scoring: what the user waits for


def saliency_numbers(
    target: int, name: str, rows: list[SaliencyRow], *, options: MethodOptions, seed: int
) -> dict[str, Any]:
    """The saliency tab's maps, JSON-able, for the download: each method's patch map and its scores, and the
    method settings they were made with."""
    finite = lambda v: None if np.isnan(v) else v  # not scored
    return {
        "target": target,
        "class": name,
        "options": options_record(options, seed),
        "layout": "methods[name].map[row][col]: the method's patch-grid map for class `target` (0-based)",
        "methods": {
            r.method: {
                "map": r.heat.tolist(),
                "deletion_auc": finite(r.deletion_auc),
                "insertion_auc": finite(r.insertion_auc),
                "seconds": r.seconds,
            }
            for r in rows
        },
    }


def saliency_rows(
    loaded: LoadedModel,
    a: Analysis,
    *,
    target: int,
    methods: list[str],
    options: MethodOptions,
    score: bool = True,
    seed: int = DEFAULT_SEED,
) -> Iterator[SaliencyRow]:
    """Each method's map for class `target` with its deletion/insertion AUC, one row as each is done: what
    `unscored_rows` then `scored` give (without `score` the AUCs are NaN and not computed)."""
    rows = unscored_rows(loaded, a, target=target, methods=methods, options=options, seed=seed)
    yield from (scored(loaded, a, rows, target=target) if score else rows)


def unscored_rows(
    loaded: LoadedModel,
    a: Analysis,
    *,
    target: int,
    methods: list[str],
    options: MethodOptions,
    seed: int = DEFAULT_SEED,
) -> list[SaliencyRow]:
    """Every method's map for class `target`, AUCs NaN, each with its own time; SmoothGrad's noise drawn from
    `seed`. The attributions run in fp32, the CA head means are read from the analysis; what the methods share
    (the rollouts' forward pass) is done once, and its time is split evenly between the rollouts that share it."""
    rows, start = [], time.perf_counter()
    maps = explain.saliency_maps(
        loaded.model,
        a.x.to(loaded.device),
        torch.tensor([target], device=loaded.device),
        methods,
        options,
        class_attention_maps=torch.from_numpy(a.ca_maps)[None].to(loaded.device),
    )
    with seeded(seed, loaded.device):
        for m, heat in maps:
            now = time.perf_counter()
            # rows keep the names asked for (earlier names too)
            rows.append(SaliencyRow(m, heat[0].float().cpu(), float("nan"), float("nan"), now - start))
            start = now
    shared = [r for r in rows if r.method in ROLLOUT_METHODS]
    each = sum(r.seconds for r in shared) / max(len(shared), 1)
    for r in shared:
        r.seconds = each
    return rows


def scored(loaded: LoadedModel, a: Analysis, rows: list[SaliencyRow], *, target: int) -> Iterator[SaliencyRow]:
    """Each row with its deletion/insertion AUCs for class `target` (forward-only, in the session's precision),
    one as each is done; the curves' two ends, the same for every map, are scored once, in the first row's time.
    A row's seconds grow by its scoring: the map and its score are what the user waits for."""
    x, t = a.x.to(loaded.device), torch.tensor([target], device=loaded.device)
    start = time.perf_counter()
    with torch.inference_mode():
        endpoints = endpoint_probabilities(loaded.model, x, t, forward_dtype=loaded.dtype)
        for row in rows:
            scores = explain.deletion_insertion(
                loaded.model, x, t, row.heat[None].to(loaded.device), forward_dtype=loaded.dtype, endpoints=endpoints
            )
            auc = {k: float(scores[k][0]) for k in ("deletion_auc", "insertion_auc")}
            yield dataclasses.replace(row, **auc, seconds=row.seconds + time.perf_counter() - start)
            start = time.perf_counter()


def regions_of_focus(
    a: Analysis, *, layer: int, head: int | None, share: float, img_size: int
) -> tuple[torch.Tensor, tuple[float, float, float, float]]:
    """The paper's Fig. 7 region of one class-attention map (CA `layer`, `head` or None for the head mean,
    0-based) holding `share` of its mass: patch mask [g, g] and its box in input pixels."""
    heat = a.ca_maps[layer].mean(0) if head is None else a.ca_maps[layer, head]
    mask, boxes = heat_maps.regions_of_focus(torch.from_numpy(heat)[None], float(share), img_size=img_size)
    return mask[0], tuple(boxes[0].tolist())


class TargetError(InputError):
    """A class number that the model does not have."""


def checked_target(target: int, classes: int) -> int:
    """An /analyze call's `target` (-1: the top prediction) when a model of `classes` classes has it; TargetError
    in one line for any other number (checked before any work)."""
    if not -1 <= target < classes:
        raise TargetError(f"target must be in 0..{classes - 1} or -1, got {target}")
    return target


def api_target(a: Analysis, target: int, classes: int) -> int:
    """The class an /analyze call's `target` names: -1 the top prediction, else itself (`checked_target`)."""
    target = checked_target(target, classes)
    return a.top_class if target == -1 else target


def attribution_for_api(
    loaded: LoadedModel, a: Analysis, *, method: str, target: int, options: MethodOptions, seed: int = DEFAULT_SEED
) -> dict[str, Any]:
    """One saliency map for the /analyze API: {"method", "target", "options", "patch" [row][col]}, SmoothGrad's
    noise drawn from `seed`. ValueError for a bad method, class or option, with the choices."""
    target = api_target(a, target, loaded.cfg.num_classes)
    name = explain.METHODS.canonical(method)
    with seeded(seed, loaded.device):
        heat = explain.saliency_map(
            loaded.model, a.x.to(loaded.device), torch.tensor([target], device=loaded.device), name, options
        )
    return {
        "method": method,
        "target": target,
        "options": options_record(options, seed),
        "patch": heat[0].float().cpu().tolist(),
    }
