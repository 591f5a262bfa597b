"""Product-style photos of Fashion-MNIST *test* garments: the evaluation set of how shops photograph garments (a
white to light-grey studio background, a soft shadow, the garment darker than its background, centred or
off-centre, at several sizes), drawn by a generator of its own so that training, which renders `scenes.py`'s
styles, never sees its look:

    python -m cait.data.products DIR --n 2000 [--seed 0]

writes DIR/<class>/<index>.png and DIR/boxes.json (COCO, as `cait.data.export` writes the scenes), scored by
`python -m cait.evaluate --data DIR --boxes DIR/boxes.json`. Image i is a pure function of (seed, i) and test
garment i: the first n images of any export are the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from ..config import FASHION_MNIST_CLASSES
from .export import run_export
from .names import SCENE_SIDE, DataError

# Frame sides as shares of the canvas (a product photo fills more of its frame than a scene does), and the share of
# photos with the garment centred; the others are placed anywhere the frame fits.
SIZES = (0.45, 0.6, 0.75, 0.9)
CENTRED_SHARE = 0.5
# Garment colours (RGB in 0-1), all darker than the lightest background: black, charcoal, navy, denim, burgundy,
# olive, brown, forest green, mid grey, red, tan, plum.
PALETTE = np.array(
    [
        (0.08, 0.08, 0.09),
        (0.22, 0.22, 0.24),
        (0.10, 0.13, 0.30),
        (0.22, 0.32, 0.50),
        (0.42, 0.08, 0.14),
        (0.33, 0.36, 0.18),
        (0.38, 0.26, 0.16),
        (0.10, 0.30, 0.18),
        (0.50, 0.50, 0.50),
        (0.65, 0.12, 0.12),
        (0.62, 0.52, 0.38),
        (0.35, 0.18, 0.35),
    ]
)
BACKGROUND = (0.82, 1.0)  # the studio background's level: light grey to white
NOISE = 0.01  # std of the sensor noise
MARK = "Fashion-MNIST product photos written by cait.data.products"  # COCO info.description of an export


class ProductPhotos:
    """n product-style photos (canvas x canvas RGB) of the first n Fashion-MNIST test garments, with tight boxes.

    Each photo draws, from its own stream (seed, i): the garment's frame size (SIZES) and place (centred or not),
    the background's level, colour cast and top-to-bottom falloff, the garment's colour (PALETTE, jittered), and
    its shadow (offset down and right, blur, strength). The garment is composed as ink on paper: its grey level g
    is the opacity of its colour over the background, so it is darker than the background where Fashion-MNIST's
    garment is bright (the polarity inverted). `boxes` are the garment's tight boxes (x0, y0, x1, y1).
    """

    classes = FASHION_MNIST_CLASSES

    def __init__(self, n: int, *, seed: int = 0, canvas: int = SCENE_SIDE):
        from .fashion_mnist import load_fashion_mnist  # (here: the command's --help needs no torch)
        from .scenes import garment_boxes

        garments, labels = load_fashion_mnist("val")  # the test split: never a training image
        if not 0 < n <= len(labels):
            raise DataError(f"--n must be in 1..{len(labels)} (the Fashion-MNIST test garments), got {n}")
        self.garments, self.labels = garments[:n], labels[:n]
        self.seed, self.canvas = seed, canvas
        self.draws = [self._draw(i) for i in range(n)]
        sides, x0, y0 = (np.array([d[k] for d in self.draws]) for k in ("side", "x0", "y0"))
        self.boxes = garment_boxes(self.garments, sides, x0, y0)

    def __len__(self) -> int:
        return len(self.labels)

    def _draw(self, i: int) -> dict:
        """Photo i's random draws (see the class doc), from the stream (seed, i) alone."""
        rng = np.random.default_rng([self.seed, i])
        side = round(SIZES[rng.integers(len(SIZES))] * self.canvas)
        if rng.random() < CENTRED_SHARE:
            x0 = y0 = (self.canvas - side) // 2
        else:
            x0, y0 = (int(v) for v in rng.integers(0, self.canvas - side + 1, 2))
        return {
            "side": side,
            "x0": x0,
            "y0": y0,
            "background": rng.uniform(*BACKGROUND) + rng.normal(0, 0.015, 3),
            "falloff": rng.uniform(0.0, 0.08),
            "colour": np.clip(PALETTE[rng.integers(len(PALETTE))] + rng.normal(0, 0.04, 3), 0.02, 0.7),
            "shadow_offset": (int(rng.integers(1, 4)), int(rng.integers(1, 5))),
            "shadow_blur": rng.uniform(1.0, 2.5),
            "shadow_strength": rng.uniform(0.12, 0.3),
            "noise_seed": int(rng.integers(2**31)),
        }

    def render(self, i: int) -> np.ndarray:
        """The uint8 [canvas, canvas, 3] photo of garment i."""
        from .scenes import gaussian_blur

        d, c = self.draws[i], self.canvas
        ramp = np.linspace(0, 1, c)[:, None, None] ** 2  # darker towards the bottom, as a studio sweep falls off
        img = np.broadcast_to(d["background"] - d["falloff"] * ramp, (c, c, 3)).copy()
        frame = Image.fromarray(self.garments[i]).resize((d["side"],) * 2, Image.LANCZOS)
        g = np.zeros((c, c))
        g[d["y0"] : d["y0"] + d["side"], d["x0"] : d["x0"] + d["side"]] = np.asarray(frame, np.float64) / 255
        g = np.clip(g, 0, 1)
        dx, dy = d["shadow_offset"]
        shadow = gaussian_blur(np.roll((g > 0.1).astype(np.float64), (dy, dx), axis=(0, 1)), d["shadow_blur"])
        img *= 1 - d["shadow_strength"] * shadow[..., None]
        img = img * (1 - g[..., None]) + d["colour"] * g[..., None]  # ink on paper: g is the colour's opacity
        img += np.random.default_rng(d["noise_seed"]).normal(0, NOISE, img.shape)
        return (np.clip(img, 0, 1) * 255).round().astype(np.uint8)


def export_products(out: Path, *, n: int, seed: int = 0) -> int:
    """Write photos 0..n-1 under `out` as DIR/<class>/<index>.png with DIR/boxes.json (COCO), as
    `cait.data.export` writes the scenes; returns n."""
    from .export import class_files, coco_document, prepare_folder, write_image_folder

    photos = ProductPhotos(n, seed=seed)
    prepare_folder(out, mark=MARK)
    files = class_files(photos.labels, photos.classes)
    info = {"description": MARK, "split": "val", "seed": seed}
    coco = coco_document(files, photos.boxes, photos.labels, photos.classes, canvas=photos.canvas, info=info)
    write_image_folder(out, files, coco, lambda i: Image.fromarray(photos.render(i)), unit="photo")
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cait.data.products",
        description="Write N product-style photos of Fashion-MNIST test garments (light studio background, soft "
        "shadow, garment darker than the background) as DIR/<class>/<index>.png with their boxes in DIR/boxes.json "
        "(COCO): score a model on them with python -m cait.evaluate --data DIR --boxes DIR/boxes.json.",
    )
    parser.add_argument("dir", type=Path, help="output directory: new, empty, or a previous product export (replaced)")
    parser.add_argument("--n", type=int, required=True, help="how many photos: of the first N test garments")
    parser.add_argument("--seed", type=int, default=0, help="the photos' random draws (default: 0)")
    args = parser.parse_args(argv)
    return run_export(lambda: export_products(args.dir, n=args.n, seed=args.seed), args.dir, what="product photos")


if __name__ == "__main__":
    sys.exit(main())
