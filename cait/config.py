"""Model configuration and the table of named variants.

Every variant is one line in VARIANTS; `cait.load_model(name)` loads it (weights=False: a random init).
The paper variants use the hyper-parameters of the official deit `cait_models.py`
(LayerScale eps, uniform stochastic depth) as listed in the paper's Table 4 / appendix.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, TypeVar

from .errors import InputError

if TYPE_CHECKING:
    import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
RESIDUAL_SCALES = ("layerscale", "scalar", "rezero", "none")  # CaiTConfig.residual_scale's choices
GLOBAL_POOLS = ("token", "avg")  # CaiTConfig.global_pool's choices


# Config fields that shape training or initialisation but not the trained function.
TRAINING_ONLY = frozenset({"drop_path_rate", "drop_rate", "pretrained", "init_values"})


class ConfigError(InputError):
    """Fields that do not make a model; the one-line message names them (and says what would)."""


_Config = TypeVar("_Config", bound="_StoredConfig")


class _StoredConfig:
    """What the frozen config dataclasses share: checked replace, and a JSON round trip (files store
    their config as JSON in the safetensors metadata under METADATA_KEY)."""

    METADATA_KEY: ClassVar[str]

    def replace(self: _Config, **overrides: Any) -> _Config:
        unknown = set(overrides) - set(self.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown config field(s) {sorted(unknown)}; known: {sorted(self.__dataclass_fields__)}")
        return replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def is_imagenet(self) -> bool:
        """Whether the head predicts ImageNet-1k (the paper's variants), named by timm's class list."""
        return self.labels == "imagenet"

    @property
    def image_mode(self) -> str:
        """The PIL mode of the pictures the model sees: "RGB" for 3 input channels, "L" (grey) for 1."""
        return "RGB" if self.in_chans == 3 else "L"

    def view_geometry(self, width: int, height: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """Where an image of (width, height) lands in the model's evaluation view: the (width, height) it is
        resized to (short side floor(img_size / crop_pct)) and the (left, top) of the centred img_size crop.
        The one owner of that geometry: `cait.preprocess.model_view` cuts pixels with it, `box_to_input` maps
        boxes with it."""
        short = math.floor(self.img_size / self.crop_pct)
        size = (short, int(short * height / width)) if width <= height else (int(short * width / height), short)
        return size, (round((size[0] - self.img_size) / 2), round((size[1] - self.img_size) / 2))

    def box_to_input(self, boxes: Any, size: int | tuple[int, int]) -> torch.Tensor:
        """Boxes (x0, y0, x1, y1) [..., 4] in an image's pixels, in this model's input pixels (a float tensor):
        scaled by the evaluation resize, shifted by its centre crop and clipped to the crop. size: the image's
        (width, height), or one side for a square image (a scene's canvas). NaN boxes stay NaN."""
        import torch  # here, not at the top: the config (and --help) stay free of torch's import time

        width, height = (size, size) if isinstance(size, int) else size
        (new_w, new_h), (left, top) = self.view_geometry(width, height)
        boxes = torch.as_tensor(boxes, dtype=torch.float32)
        scale = torch.tensor([new_w / width, new_h / height] * 2)
        shift = torch.tensor([left, top] * 2, dtype=torch.float32)
        return (boxes * scale - shift).clamp(0, self.img_size)

    @classmethod
    def from_dict(cls: type[_Config], data: dict[str, Any]) -> _Config:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for key in ("mean", "std", "labels"):
            if isinstance(known.get(key), list):
                known[key] = tuple(known[key])
        return cls(**known)


@dataclass(frozen=True)
class CaiTConfig(_StoredConfig):
    METADATA_KEY: ClassVar[str] = "cait_config"
    img_size: int = 224  # square input side in pixels the position embedding is built for
    patch_size: int = 16  # side of the square patches cut by the conv patch embedding
    in_chans: int = 3  # input channels (3 for RGB; 1 for grey Fashion-MNIST)
    num_classes: int = 1000  # size of the linear head on the class token
    embed_dim: int = 192  # token width d
    depth: int = 24  # number of self-attention (SA) blocks, patches only
    num_heads: int = 4  # heads in SA and CA; the paper keeps head dim 48
    depth_token_only: int = 2  # number of class-attention (CA) blocks
    mlp_ratio: float = 4.0  # FFN hidden width / d in SA blocks
    mlp_ratio_token_only: float = 4.0  # FFN hidden width / d in CA blocks
    qkv_bias: bool = True  # bias in q/k/v projections (official: True)
    init_values: float = 1e-5  # LayerScale eps: initial value of every gamma
    drop_path_rate: float = 0.0  # stochastic depth, the SAME rate in every SA block (paper: uniform)
    drop_rate: float = 0.0  # dropout before the head
    residual_scale: str = "layerscale"  # "layerscale" (per-channel gamma), "scalar" (one alpha=eps per
    # branch), "rezero" (alpha=0, no pre-norm) or "none" (plain residual);
    # the alternatives exist for the paper's Table 1 / Figure 4 ablations
    talking_heads: bool = True  # mix heads before/after the softmax in SA (proj_l / proj_w)
    class_token_at: int | None = None  # None: CaiT (class token joins in the CA stage). k: ViT-style, the class
    # token is inserted before SA block k (0 = from the start; paper Table 2)
    global_pool: str = "token"  # "token": head on the class token; "avg": on the mean patch token (Table 2)
    mean: tuple[float, ...] = IMAGENET_MEAN  # per-channel normalisation of the eval transform
    std: tuple[float, ...] = IMAGENET_STD
    crop_pct: float = 1.0  # eval transform: resize then centre crop this fraction (CaiT: 1.0)
    labels: tuple[str, ...] | str = "imagenet"  # class names, or "imagenet" for timm's ImageNet-1k names
    pretrained: str | None = None  # file name under cait/weights/ shipped with the package, if any

    def __post_init__(self) -> None:
        # checked here, where every config is made, so a bad one fails with its reason, not deep in a reshape
        problem = self._problem()
        if problem:
            raise ConfigError(problem)

    def _problem(self) -> str | None:
        for name in ("img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "num_heads"):
            if getattr(self, name) <= 0:
                return f"{name} must be positive, got {getattr(self, name)}"
        for name in ("depth", "depth_token_only"):
            if getattr(self, name) < 0:
                return f"{name} must be >= 0, got {getattr(self, name)}"
        if self.img_size % self.patch_size:
            return f"img_size {self.img_size} is not a multiple of patch_size {self.patch_size}"
        if self.embed_dim % self.num_heads:
            return f"num_heads {self.num_heads} does not divide embed_dim {self.embed_dim}"
        if self.residual_scale not in RESIDUAL_SCALES:
            return f"residual_scale must be one of {', '.join(RESIDUAL_SCALES)}, got {self.residual_scale!r}"
        if self.global_pool not in GLOBAL_POOLS:
            return f"global_pool must be one of {', '.join(GLOBAL_POOLS)}, got {self.global_pool!r}"
        if self.class_token_at is not None and not 0 <= self.class_token_at <= self.depth:
            return f"class_token_at must be in [0, depth={self.depth}], got {self.class_token_at}"
        for name in ("mlp_ratio", "mlp_ratio_token_only"):
            if not getattr(self, name) > 0:
                return f"{name} must be positive, got {getattr(self, name)}"
        for name in ("drop_path_rate", "drop_rate"):
            if not 0 <= getattr(self, name) < 1:
                return f"{name} is a probability in [0, 1), got {getattr(self, name)}"
        if not 0 < self.crop_pct <= 1:
            return f"crop_pct must be in (0, 1], got {self.crop_pct}"
        return self._unused_part()

    def _unused_part(self) -> str | None:
        """Why this structure would build parameters that no forward reaches (None if it would not): unused
        parameters overcount size and FLOPs, and make DDP fail."""
        ca, at = self.depth_token_only, self.class_token_at
        if at is not None and ca:
            return (
                f"depth_token_only {ca} builds class-attention blocks that never run: class_token_at {at} "
                "puts the class token in the SA stage instead (set depth_token_only 0)"
            )
        if self.global_pool == "avg" and ca:
            return (
                f"depth_token_only {ca} builds class-attention blocks that never reach the output: they update only "
                "the class token, which global_pool 'avg' never reads (set depth_token_only 0)"
            )
        if at is not None and at < self.depth or ca:
            return None  # the class token meets the patches in the SA or the CA stage
        if self.global_pool == "token":
            return (
                "the class token meets no patch (class_token_at unset or = depth, depth_token_only 0), so the token "
                "head never sees the image (set class_token_at below depth, depth_token_only above 0, or global_pool "
                "'avg')"
            )
        if at is not None:
            return (
                f"class_token_at {at} = depth adds a class token after the last SA block that global_pool 'avg' "
                "never reads (leave class_token_at unset: average pooling then has no class token)"
            )
        return None

    @property
    def grid_size(self) -> int:
        return self.img_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size**2

    @property
    def has_class_token(self) -> bool:
        """Whether the class token reaches the output; average pooling without `class_token_at` has none."""
        return self.global_pool == "token" or self.class_token_at is not None

    def network_differences(self, other: CaiTConfig, *, ignore: Iterable[str] = ()) -> list[str]:
        """The fields, besides `ignore`, where `other` describes another network: a different function or
        input handling. Fields that only shape training (TRAINING_ONLY) are never a difference."""
        skip = TRAINING_ONLY | set(ignore)
        return [
            f"{k}: {v!r} vs {getattr(other, k)!r}"
            for k, v in self.to_dict().items()
            if k not in skip and getattr(other, k) != v
        ]


@dataclass(frozen=True)
class CNNConfig(_StoredConfig):
    """A timm convolutional classifier trained here (the distillation teacher of the paper's recipe)."""

    METADATA_KEY: ClassVar[str] = "timm_cnn_config"
    arch: str  # timm model name, e.g. "resnet18" (built with pretrained=False)
    img_size: int  # input side it is trained and evaluated at
    in_chans: int = 3  # input channels
    num_classes: int = 10  # size of its classifier
    drop_path_rate: float = 0.0  # stochastic depth, for the timm models that have it
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)  # per-channel normalisation of its input
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    crop_pct: float = 1.0  # eval transform: resize then centre crop this fraction
    labels: tuple[str, ...] = FASHION_MNIST_CLASSES  # class names


def _paper(img_size: int, dim: int, depth: int, eps: float, drop_path: float) -> CaiTConfig:
    # Paper variants: patch 16, head dim 48, MLP ratio 4, ImageNet-1k.
    return CaiTConfig(
        img_size=img_size, embed_dim=dim, depth=depth, num_heads=dim // 48, init_values=eps, drop_path_rate=drop_path
    )


def _small(
    img_size: int, patch: int, dim: int, depth: int, heads: int, in_chans: int = 3, pretrained: str | None = None
) -> CaiTConfig:
    # Small configs for Fashion-MNIST and its scenes (28-104 px inputs): LayerScale eps 0.1 is the
    # paper's rule for depth <= 18.
    return CaiTConfig(
        img_size=img_size,
        patch_size=patch,
        in_chans=in_chans,
        num_classes=10,
        embed_dim=dim,
        depth=depth,
        num_heads=heads,
        init_values=0.1,
        drop_path_rate=0.05,
        mean=(0.5,) * in_chans,
        std=(0.5,) * in_chans,
        labels=FASHION_MNIST_CLASSES,
        pretrained=pretrained,
    )


# name: config. eps and stochastic depth as in the official deit cait_models.py (its XXS-36 uses
# eps 1e-5 where the paper's table says 1e-6; we follow the released weights).
VARIANTS: dict[str, CaiTConfig] = {
    "cait_xxs24_224": _paper(224, 192, 24, 1e-5, 0.05),
    "cait_xxs24_384": _paper(384, 192, 24, 1e-5, 0.05),
    "cait_xxs36_224": _paper(224, 192, 36, 1e-5, 0.1),
    "cait_xxs36_384": _paper(384, 192, 36, 1e-5, 0.1),
    "cait_xs24_384": _paper(384, 288, 24, 1e-5, 0.05),
    "cait_xs36_224": _paper(224, 288, 36, 1e-6, 0.1),
    "cait_xs36_384": _paper(384, 288, 36, 1e-6, 0.1),
    "cait_s24_224": _paper(224, 384, 24, 1e-5, 0.1),
    "cait_s24_384": _paper(384, 384, 24, 1e-5, 0.1),
    "cait_s36_224": _paper(224, 384, 36, 1e-6, 0.2),
    "cait_s36_384": _paper(384, 384, 36, 1e-6, 0.2),
    "cait_s48_224": _paper(224, 384, 48, 1e-6, 0.3),
    "cait_m24_224": _paper(224, 768, 24, 1e-5, 0.2),
    "cait_m24_384": _paper(384, 768, 24, 1e-5, 0.2),
    "cait_m36_224": _paper(224, 768, 36, 1e-6, 0.3),
    "cait_m36_384": _paper(384, 768, 36, 1e-6, 0.3),
    "cait_m48_448": _paper(448, 768, 48, 1e-6, 0.4),
    # small configs for our own training and tests
    "cait_nano_28": _small(28, 4, 96, 6, 3, in_chans=1, pretrained="cait_nano_28.safetensors"),
    # training's default: a small model for the 64 px scenes (no shipped weights)
    "cait_nano_64": _small(64, 8, 128, 6, 4),
    # the default model's architecture at the scenes' own 64 px, where its training began
    "cait_micro_64": _small(64, 8, 192, 8, 4),
    # the same at 136 px (17x17 patches): trained in stages at 64 to 128 px, tested at 136; the default
    "cait_micro_136": _small(136, 8, 192, 8, 4, pretrained="cait_micro_136.safetensors"),
    "cait_pico_32": _small(32, 8, 32, 2, 2),
}

# The ten variants released with the paper (timm's names); the others are paper sizes without weights.
RELEASED = (
    "cait_xxs24_224",
    "cait_xxs24_384",
    "cait_xxs36_224",
    "cait_xxs36_384",
    "cait_xs24_384",
    "cait_s24_224",
    "cait_s24_384",
    "cait_s36_384",
    "cait_m36_384",
    "cait_m48_448",
)

# The default model of the app and the analysis scripts: trained by us on Fashion-MNIST scenes.
DEFAULT_MODEL = "cait_micro_136"


def is_paper_variant(name: str) -> bool:
    return VARIANTS[name].is_imagenet


def list_models() -> list[str]:
    """Names accepted by `cait.load_model`."""
    return list(VARIANTS)


def get_config(name: str, **overrides: Any) -> CaiTConfig:
    if name not in VARIANTS:
        import difflib

        close = difflib.get_close_matches(name, VARIANTS, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown model '{name}'.{hint} Known: {', '.join(VARIANTS)}")
    return VARIANTS[name].replace(**overrides)
