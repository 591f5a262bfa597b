"""Fashion-MNIST scenes: garments pasted on clutter, with boxes, the ground truth our attention maps are
checked against. All images at once are `.pixels`, a uint8 [n, H, W, C] array from a disk cache
(`scene_cache`), for augmentation on batched tensors."""

from __future__ import annotations

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from ..config import FASHION_MNIST_CLASSES
from .fashion_mnist import load_fashion_mnist
from .names import SCENE_SIDE, SCENE_STYLES, DataError, split_name

# The "varied" style's draws per scene, each uniform in its range (see FashionMNISTScenes).
VARIED_STYLE = {
    "pixel_noise": (0.0, 0.10),  # std of the pixel noise (the default style's is PIXEL_NOISE)
    "background_brightness": (-0.2, 0.2),  # added to the background
    "background_contrast": (0.5, 1.5),  # the background's deviations from its mean colour scaled by this
    "garment_floor": (0.1, 0.6),  # the garment's darkest shade, as a share of its tint (default 0.35)
    "garment_gamma": (0.6, 1.6),  # its grey levels raised to this power before shading (default 1)
    "garment_blur": (0.0, 1.2),  # std in canvas pixels of a Gaussian blur of the garment (default none)
}
# The "light" style's draws per scene, each uniform in its range: the clutter inverted and lifted towards white,
# the garment darker than its background (its grey levels inverted), as shop photos show garments.
LIGHT_STYLE = {
    "pixel_noise": (0.0, 0.10),
    "background_lift": (0.3, 0.9),  # share of the inverted background's distance to white taken away
    "garment_depth": (0.6, 0.95),  # how much the garment's brightest grey level darkens its tint
    "garment_gamma": (0.6, 1.6),
    "garment_blur": (0.0, 1.2),
}
STYLE_DRAWS = {"varied": VARIED_STYLE, "light": LIGHT_STYLE}  # a drawn look's ranges
STYLE_STREAMS = {"varied": 2, "light": 3}  # the random stream of each look's draws (0, 1: layout and scene)
MIXED_LIGHT_SHARE = 0.5  # the "mixed" style's share of light scenes (the rest are varied), one coin per scene
# The "blend" style's looks and their shares, drawn by the same coin as "mixed" (light below 0.5, so a blend's
# light scenes are the mixed style's): mixed with half its varied scenes drawn in the default style instead, so
# that a light-background fine-tune keeps seeing the scenes the models are scored on.
BLEND_SHARES = (("light", 0.5), ("varied", 0.25), ("default", 0.25))
PIXEL_NOISE = 0.04  # std of the default style's pixel noise


class FashionMNISTScenes(Dataset):
    """Colour canvases with one tinted garment at a random position and scale over clutter.

    The garment's pasted frame has a side of 30-65% of the canvas; the clutter is a colour gradient,
    smooth texture, pixel noise and faint fragments of other garments from the same split, so an
    attention map that ignores the garment cannot land in its box by luck more often than the box's
    area allows. Everything is a pure function of (seed, split, index, style): any worker or rank renders
    the same sample, a subset of n scenes is the whole split's first n, and `cache=True` renders them once
    into a memory-mapped file (`.pixels`) that items are then read from. `boxes` are the garment's tight box
    (x0, y0, x1, y1) in canvas pixels.

    style "default" draws every scene the same way (pixel noise std PIXEL_NOISE, fixed shading, no blur): the
    scenes the shipped models are scored on. style "varied" also draws, per scene from its own random
    stream, the pixel noise level, the background's brightness and contrast, the garment's shading (darkest
    shade, gamma) and blur (VARIED_STYLE's ranges); the layout, garments, colours and clutter are the default's,
    and so are the boxes: the varied garment is drawn only inside its box (rounded out to whole pixels).
    style "light" inverts the same clutter and lifts it towards white, and draws the garment darker than its
    background, its grey levels inverted (LIGHT_STYLE's ranges); style "mixed" draws each scene light or varied
    by a coin of its own (MIXED_LIGHT_SHARE light), every scene as that style draws it; style "blend" draws each
    scene light, varied or default by the same coin (BLEND_SHARES).
    pixel_noise: the noise std of every scene instead (either style), e.g. to check a model's dependence on it.
    """

    classes = FASHION_MNIST_CLASSES
    MIN_SIDE, MAX_SIDE = 0.30, 0.65
    # bump whenever render() or the layout draws change: it renames the cache files. 2: styles and the noise
    # override (the default style's pixels are version 1's, bit for bit). 3: a subset's layout is the whole
    # split's, sliced (before, it was drawn for the subset's n scenes, so a subset file of version 2 holds
    # other pixels); the whole split's pixels are version 2's, bit for bit
    GENERATOR_VERSION = 3

    def __init__(
        self,
        split: str,
        *,
        canvas: int = SCENE_SIDE,
        seed: int = 0,
        subset: int | None = None,
        cache: bool = False,
        style: str = "default",
        pixel_noise: float | None = None,
    ):
        if style not in SCENE_STYLES:
            raise DataError(f"unknown scene style {style!r}; choose from {', '.join(SCENE_STYLES)}")
        if pixel_noise is not None and not 0 <= pixel_noise < 1:
            raise DataError(f"pixel noise std must be in [0, 1), got {pixel_noise}")
        self.split, self.canvas, self.seed = split, canvas, seed
        self.style, self.pixel_noise = style, pixel_noise
        self.garments, all_labels = load_fashion_mnist(split)
        n = len(all_labels) if subset is None else min(subset, len(all_labels))
        self.labels = all_labels[:n]
        # The layout is drawn up front, so boxes are known without rendering; for the whole split and then
        # sliced, so that scene i is the same in every subset.
        self.sides, self.x0, self.y0 = (draw[:n] for draw in self._layout(len(all_labels)))
        self.boxes = garment_boxes(self.garments[:n], self.sides, self.x0, self.y0)
        self._pixels: np.ndarray | None = None
        if cache:
            self._pixels = self.pixels

    @property
    def name(self) -> str:
        """The split as every page and log names it (`cait.data.names.split_name`)."""
        return split_name("fashion-mnist-scenes", self.split)

    @property
    def _split_key(self) -> int:
        """The split's entry in every random stream's seed: train and test scenes never share a draw."""
        return 0 if self.split == "train" else 1

    def _layout(self, total: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sides, x0, y0): the garment frame's side and top-left corner in canvas pixels for all `total`
        scenes of the split, each drawn as one vector (a shorter draw would move every frame)."""
        rng = np.random.default_rng([self.seed, self._split_key, 0])
        sides = np.round(rng.uniform(self.MIN_SIDE, self.MAX_SIDE, total) * self.canvas).astype(int)
        x0 = np.floor(rng.uniform(0, 1, total) * (self.canvas - sides + 1)).astype(int)
        y0 = np.floor(rng.uniform(0, 1, total) * (self.canvas - sides + 1)).astype(int)
        return sides, x0, y0

    def generator_params(self) -> dict[str, object]:
        """What the pixels depend on besides the source garments (the cache hashes both)."""
        return {
            "version": self.GENERATOR_VERSION,
            "canvas": self.canvas,
            "seed": self.seed,
            "split": self.split,
            "n": len(self.labels),
            "min_side": self.MIN_SIDE,
            "max_side": self.MAX_SIDE,
            "style": self.style,
            "varied_style": VARIED_STYLE if self.style == "varied" else None,
            "pixel_noise": self.pixel_noise,
            # (only where they apply: the default and varied styles' cache files keep their names)
            **(
                {"style_draws": STYLE_DRAWS, "mixed_light_share": MIXED_LIGHT_SHARE}
                if self.style in ("light", "mixed")
                else {}
            ),
            **({"style_draws": STYLE_DRAWS, "blend_shares": BLEND_SHARES} if self.style == "blend" else {}),
        }

    @property
    def style_tag(self) -> str:
        """What sets these scenes' look apart from the default style's, for file names ("" for the default)."""
        noise = "" if self.pixel_noise is None else f"-noise{self.pixel_noise:g}"
        return ("" if self.style == "default" else f"-{self.style}") + noise

    @property
    def pixels(self) -> np.ndarray:
        """uint8 [n, canvas, canvas, 3], every scene: memory-mapped from the cache (built on first use)."""
        if self._pixels is None:
            from .scene_cache import cached_pixels

            self._pixels = cached_pixels(self)
        return self._pixels

    def __getstate__(self) -> dict:
        # a pickled copy (a spawned worker) maps the cache file itself instead of carrying its bytes
        return {**self.__dict__, "_pixels": None, "_cached": self._pixels is not None}

    def __setstate__(self, state: dict) -> None:
        cached = state.pop("_cached", False)
        self.__dict__.update(state)
        if cached:
            self._pixels = self.pixels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        image = self.render(i) if self._pixels is None else np.asarray(self._pixels[i])
        return Image.fromarray(image), int(self.labels[i])

    def _look(self, i: int) -> str:
        """How sample i is drawn: its style's name, or for "mixed" and "blend" a look chosen by a coin of its own
        stream."""
        if self.style not in ("mixed", "blend"):
            return self.style
        coin = np.random.default_rng([self.seed, self._split_key, 4, i]).random()
        if self.style == "mixed":
            return "light" if coin < MIXED_LIGHT_SHARE else "varied"
        for look, share in BLEND_SHARES:
            if coin < share:
                return look
            coin -= share
        return BLEND_SHARES[-1][0]

    def _style_draws(self, i: int) -> dict[str, float] | None:
        """The drawn look's values for sample i (its STYLE_DRAWS keys), from a stream of their own so that
        the default style's draws stay as they were; None for the default style."""
        look = self._look(i)
        if look == "default":
            return None
        rng = np.random.default_rng([self.seed, self._split_key, STYLE_STREAMS[look], i])
        return {key: float(rng.uniform(*bounds)) for key, bounds in STYLE_DRAWS[look].items()}

    def render(self, i: int, *, garment: bool = True) -> np.ndarray:
        """The uint8 [canvas, canvas, 3] scene of sample i (garment=False: the same scene without its garment,
        every random draw made alike: what tests compare to find where the garment was drawn)."""
        c = self.canvas
        rng = np.random.default_rng([self.seed, self._split_key, 1, i])
        look, style = self._look(i), self._style_draws(i)
        # Background: a colour gradient plus smooth low-frequency texture plus pixel noise.
        ramp = np.linspace(0, 1, c)[None, :, None]
        a, b = rng.uniform(0.1, 0.7, 3), rng.uniform(0.1, 0.7, 3)
        img = a + (b - a) * (ramp if rng.random() < 0.5 else ramp.transpose(1, 0, 2))
        coarse = rng.normal(0, 0.12, (4 + rng.integers(0, 5),) * 2 + (3,))
        img = img + _resize(coarse, c)
        # Faint fragments of other garments: the clutter that makes the box the only right answer.
        for _ in range(rng.integers(2, 5)):
            j = rng.integers(len(self.garments))
            side = int(rng.integers(c // 5, c // 2))
            frag = _resize(self.garments[j].astype(np.float32) / 255, side)[..., None]
            y, x = rng.integers(-side // 3, c - side // 2, 2)
            _paste(img, frag * rng.uniform(0.15, 0.35), rng.uniform(0, 1, 3), x, y)
        if look == "varied":
            mean = img.mean(axis=(0, 1))
            img = (img - mean) * style["background_contrast"] + mean + style["background_brightness"]
        elif look == "light":
            img = 1 - (1 - style["background_lift"]) * np.clip(img, 0, 1)  # inverted, nearer white
        # The garment: its grey levels shade a random saturated colour.
        side = self.sides[i]
        g = _resize(self.garments[i].astype(np.float32) / 255, side)[..., None]
        tint = rng.uniform(0, 1, 3)
        tint[rng.integers(3)] = rng.uniform(0.8, 1.0)  # at least one strong channel: visible, not black
        if style is None:
            colour, alpha = tint * (0.35 + 0.65 * g), np.clip(g * 1.6, 0, 1)
        else:
            shade = g ** style["garment_gamma"]
            if look == "light":  # dark where Fashion-MNIST's garment is bright
                colour = tint * (1 - style["garment_depth"] * shade)
            else:
                colour = tint * (style["garment_floor"] + (1 - style["garment_floor"]) * shade)
            alpha = np.clip(gaussian_blur(g[..., 0], style["garment_blur"])[..., None] * 1.6, 0, 1) * self._box_mask(i)
        alpha = alpha * rng.uniform(0.85, 1.0)
        if garment:
            _paste(img, alpha, colour, self.x0[i], self.y0[i])
        noise = self.pixel_noise if self.pixel_noise is not None else PIXEL_NOISE if style is None else None
        img = img + rng.normal(0, style["pixel_noise"] if noise is None else noise, img.shape)
        return (np.clip(img, 0, 1) * 255).astype(np.uint8)

    def _box_mask(self, i: int) -> np.ndarray:
        """[side, side, 1]: 1 on the pixels of sample i's pasted frame that lie in its box rounded out to
        whole canvas pixels, 0 elsewhere (a blurred garment stays inside its box)."""
        x0, y0, x1, y1 = self.boxes[i]
        canvas_x = self.x0[i] + np.arange(self.sides[i])
        canvas_y = self.y0[i] + np.arange(self.sides[i])
        cols = (canvas_x >= np.floor(x0)) & (canvas_x < np.ceil(x1))
        rows = (canvas_y >= np.floor(y0)) & (canvas_y < np.ceil(y1))
        return (rows[:, None] & cols[None, :]).astype(np.float32)[..., None]


def garment_boxes(garments: np.ndarray, sides: np.ndarray, x0: np.ndarray, y0: np.ndarray) -> np.ndarray:
    """float32 [n, 4]: the tight box (x0, y0, x1, y1) in canvas pixels of each 28x28 garment (its grey levels
    above 25) pasted as a frame of side `sides` at top-left (x0, y0)."""
    ink = garments > 25  # where the garment actually is inside its 28x28 frame
    rows, cols = ink.any(axis=2), ink.any(axis=1)
    first = lambda m: m.argmax(axis=1)
    last = lambda m: m.shape[1] - m[:, ::-1].argmax(axis=1)
    scale = sides / garments.shape[1]
    return np.stack(
        [x0 + first(cols) * scale, y0 + first(rows) * scale, x0 + last(cols) * scale, y0 + last(rows) * scale],
        axis=1,
    ).astype(np.float32)


def _resize(arr: np.ndarray, side: int) -> np.ndarray:
    """Bilinear resize of a float [h, w] or [h, w, 3] array to [side, side(, 3)]."""
    if arr.ndim == 2:
        return np.asarray(Image.fromarray(arr.astype(np.float32), mode="F").resize((side, side), Image.BILINEAR))
    return np.stack([_resize(arr[..., k], side) for k in range(arr.shape[-1])], axis=-1)


def gaussian_blur(arr: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur (std `sigma` pixels, 3 sigma each side, zeros beyond the edge) of a float [h, w] array."""
    if sigma <= 0:
        return arr
    radius = max(1, int(np.ceil(3 * sigma)))
    kernel = np.exp(-(np.arange(-radius, radius + 1) ** 2) / (2 * sigma**2))
    kernel /= kernel.sum()
    arr = np.apply_along_axis(np.convolve, 0, arr, kernel, mode="same")
    return np.apply_along_axis(np.convolve, 1, arr, kernel, mode="same")


def _paste(img: np.ndarray, alpha: np.ndarray, colour: np.ndarray, x: int, y: int) -> None:
    """Alpha-blend `colour` (array or [3]) into img at (x, y) with per-pixel `alpha` [h, w, 1],
    clipped to the canvas."""
    h, w = alpha.shape[:2]
    H, W = img.shape[:2]
    y0, x0, y1, x1 = max(y, 0), max(x, 0), min(y + h, H), min(x + w, W)
    if y0 >= y1 or x0 >= x1:
        return
    a = alpha[y0 - y : y1 - y, x0 - x : x1 - x]
    col = colour[y0 - y : y1 - y, x0 - x : x1 - x] if np.ndim(colour) == 3 else colour
    img[y0:y1, x0:x1] = img[y0:y1, x0:x1] * (1 - a) + col * a
