"""Make tests/data/corruptions/: ImageNet-C outputs of the reference package on a few odd-sized photos, as PNGs.

The reference is `imagecorruptions` (Hendrycks & Dietterich's code as a package), in its maintained fork
`imagecorruptions-imaug`, run in a venv of its own (it needs OpenCV and numba, which the project does not):

    python3 -m venv /tmp/ref
    /tmp/ref/bin/pip install imagecorruptions-imaug==1.1.5 numpy==2.4.6 scikit-image==0.26.0 scipy==1.17.1 \
        opencv-python==5.0.0.93 pillow==13.0.0
    /tmp/ref/bin/python scripts/make_corruption_fixture.py

(The original `imagecorruptions` 1.1.2 imports only where setuptools still has `pkg_resources`, and its
gaussian_blur and glass_blur pass scikit-image's removed `multichannel`, its fog numpy's removed `np.float_`:
the fork fixes all three.) This script imports nothing of the project, so the fixture is independent of our code.

The images: two crops of scikit-image's `chelsea` photo (61x83, 37x53) and one of a shipped scene (41x57),
odd sizes small enough for a fixture of about 420 kB. Every family whose output is deterministic is stored for
severities 1-5 as the package's `corrupt` returns it (uint8: its float results truncated, PIL's results as they
are); the three noises are random, so they are stored on the smallest image only, drawn with a fixed seed, for
the test to compare in distribution. Each output is one PNG `{family}_{H}x{W}.png` with severities 1-5 stacked
from top to bottom (`clean_{H}x{W}.png` the input; PNG's row filters keep the blurs small); versions.txt names
the packages that made them.
"""

from __future__ import annotations

import argparse
from importlib.metadata import version
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DETERMINISTIC = ("defocus_blur", "gaussian_blur", "brightness", "contrast", "jpeg_compression", "pixelate")
NOISES = ("gaussian_noise", "shot_noise", "impulse_noise")
SCENE = ROOT / "cait" / "examples" / "scene_00000_ankle_boot.png"
PACKAGES = ("imagecorruptions-imaug", "numpy", "scikit-image", "scipy", "opencv-python", "pillow")


def images() -> dict[str, np.ndarray]:
    """The inputs by name "HxW", uint8 [H, W, 3]: real photos, odd sizes, so no scale divides them evenly."""
    from skimage.data import chelsea

    cat = chelsea()  # 300x451
    scene = np.asarray(Image.open(SCENE).convert("RGB"))
    crops = (cat[80:141, 130:213], scene[12:53, 4:61], cat[215:252, 235:288])  # an eye, the boot, the nose
    return {f"{c.shape[0]}x{c.shape[1]}": np.ascontiguousarray(c) for c in crops}


def reference_outputs(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The package's outputs keyed "family/HxW", uint8 [5, H, W, 3] over severities 1-5, plus the inputs."""
    from imagecorruptions import corrupt

    out = {f"clean/{size}": image for size, image in inputs.items()}
    for name in DETERMINISTIC:
        for size, image in inputs.items():
            out[f"{name}/{size}"] = np.stack([corrupt(image, s, name) for s in range(1, 6)])
    size = min(inputs, key=lambda k: inputs[k].size)
    np.random.seed(0)  # gaussian and shot noise draw from numpy's global generator
    for name in NOISES:
        kwargs = {"seed": 0} if name == "impulse_noise" else {}
        out[f"{name}/{size}"] = np.stack([corrupt(inputs[size], s, name, **kwargs) for s in range(1, 6)])
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "corruptions")
    args = p.parse_args(argv)
    try:
        arrays = reference_outputs(images())
    except ImportError as e:
        raise SystemExit(f"the reference package is missing ({e.name}): run this in its own venv, see --help")
    args.out.mkdir(parents=True, exist_ok=True)
    for key, array in arrays.items():
        name = args.out / f"{key.replace('/', '_')}.png"
        Image.fromarray(array.reshape(-1, *array.shape[-2:])).save(name, optimize=True)
    versions = [f"{name}=={version(name)}" for name in PACKAGES]
    (args.out / "versions.txt").write_text("\n".join(versions) + "\n")
    kb = sum(f.stat().st_size for f in args.out.iterdir()) / 1e3
    print(f"{args.out}: {len(arrays)} images, {kb:.0f} kB, made by {', '.join(versions)}")


if __name__ == "__main__":
    main()
