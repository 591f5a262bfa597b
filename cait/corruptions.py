"""The ImageNet-C corruptions (Hendrycks & Dietterich 2019) on batches of model inputs.

Each corruption takes a float batch x [B, C, H, W] in [0, 1] (the model's input view before normalisation, so
pixel sizes are the model's input pixels, as ImageNet-C's are for 224 px crops), a severity 1-5 and a
`torch.Generator`, and returns a batch of the same shape, dtype and range. Parameters are the paper's
(its reference code, `imagecorruptions`); where that code works per image with OpenCV, scikit-image or PIL,
the same operation is written once here on the whole batch with torch and torchvision:

- gaussian_noise, shot_noise, impulse_noise: additive normal noise, Poisson photon noise, salt and pepper
  on a share of the values;
- defocus_blur: a disk kernel (smoothed by a small Gaussian as in the paper), borders reflected as OpenCV's
  filter2D does; gaussian_blur: a Gaussian, the edge pixel repeated as scikit-image's `gaussian` does;
- brightness: the HSV value channel raised (done as a per-pixel scale: HSV's hue and saturation fixed),
  contrast: each image's channel means kept and the deviations shrunk;
- jpeg_compression: PIL's libjpeg at low quality; pixelate: PIL's BOX down-sampling and NEAREST up-sampling,
  each written as PIL computes it (a weight matrix per axis; the source index per output pixel).

tests/test_corruptions.py holds every deterministic family to within one level (uint8) of the reference
package's outputs on odd-sized photos, and the noises to its distributions (tests/data/corruptions/, made by
scripts/make_corruption_fixture.py).

The package itself is not a dependency, used only to make that fixture in a venv of its own. The paper's
`imagecorruptions` 1.1.2 imports only where setuptools still ships `pkg_resources`, and its gaussian_blur,
glass_blur and fog fail under scikit-image 0.26 (`multichannel`) and numpy 2 (`np.float_`). Its fork
`imagecorruptions-imaug` 1.1.5 runs, but brings OpenCV and numba (with llvmlite, about 400 MB installed),
corrupts one uint8 numpy image at a time (truncating its float results to uint8), and draws gaussian and
shot noise from numpy's global random state. Here a corruption is one batched call on the model's float view,
seeded by a `torch.Generator`, on any device. kornia and albumentations lack several of the families (see
benchmarks/README.md).
"""

from __future__ import annotations

import io
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from .errors import InputError

SEVERITIES = (1, 2, 3, 4, 5)
Corruption = Callable[[torch.Tensor, int, torch.Generator], torch.Tensor]

# The paper's parameter per severity 1-5 (imagecorruptions' corruptions.py).
GAUSSIAN_NOISE_STD = (0.08, 0.12, 0.18, 0.26, 0.38)
SHOT_NOISE_PHOTONS = (60, 25, 12, 5, 3)
IMPULSE_NOISE_AMOUNT = (0.03, 0.06, 0.09, 0.17, 0.27)
DEFOCUS_RADIUS_ALIAS = ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5))
GAUSSIAN_BLUR_SIGMA = (1, 2, 3, 4, 6)
BRIGHTNESS_SHIFT = (0.1, 0.2, 0.3, 0.4, 0.5)
CONTRAST_FACTOR = (0.4, 0.3, 0.2, 0.1, 0.05)
JPEG_QUALITY = (25, 18, 15, 10, 7)
PIXELATE_SCALE = (0.6, 0.5, 0.4, 0.3, 0.25)


def _noise_like(x: torch.Tensor, generator: torch.Generator, draw: Callable[..., torch.Tensor]) -> torch.Tensor:
    # drawn on the generator's device, so a CPU generator gives the same numbers whatever device x is on
    return draw(x.shape, generator=generator, device=generator.device, dtype=torch.float32).to(x)


def gaussian_noise(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    std = GAUSSIAN_NOISE_STD[severity - 1]
    return (x + std * _noise_like(x, generator, torch.randn)).clamp(0, 1)


def shot_noise(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    photons = SHOT_NOISE_PHOTONS[severity - 1]
    rate = (x.float() * photons).to(generator.device)
    return (torch.poisson(rate, generator=generator) / photons).to(x).clamp(0, 1)


def impulse_noise(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    # scikit-image's "s&p": each value is replaced with probability `amount`, by 1 or 0 with even odds
    amount = IMPULSE_NOISE_AMOUNT[severity - 1]
    u = _noise_like(x, generator, torch.rand)
    salt = _noise_like(x, generator, torch.rand) < 0.5
    return torch.where(u < amount, salt.to(x), x)


def _filter(x: torch.Tensor, kernel: torch.Tensor, *, border: str) -> torch.Tensor:
    """x filtered per channel with a symmetric odd kernel [kh, kw]. `border` "reflect" mirrors without repeating
    the edge (OpenCV's filter2D default), falling back to "replicate" where the kernel reaches further than
    reflection can; "replicate" repeats the edge pixel (scikit-image's gaussian). Through the FFT: a 21x21 disk
    on a 136 px image costs an eighth of torch's grouped convolution on a CPU."""
    (kh, kw), (H, W) = kernel.shape, x.shape[-2:]
    ph, pw = kh // 2, kw // 2
    mode = "reflect" if border == "reflect" and max(ph, pw) < min(H, W) else "replicate"
    padded = F.pad(x.float(), [pw, pw, ph, ph], mode=mode)
    size = padded.shape[-2:]
    spectrum = torch.fft.rfft2(padded) * torch.fft.rfft2(kernel.to(padded), s=size)
    # a circular convolution: output pixel (i, j) of the valid part sits at (i + 2 ph, j + 2 pw)
    return torch.fft.irfft2(spectrum, s=size)[..., 2 * ph : 2 * ph + H, 2 * pw : 2 * pw + W].to(x.dtype)


def disk_kernel(radius: int, alias_blur: float) -> torch.Tensor:
    """The paper's defocus kernel: a disk of `radius` pixels normalised to sum 1, smoothed by a Gaussian of
    sigma `alias_blur` (3x3 for radii up to 8, else 5x5), on a grid of at least 17x17."""
    half = max(radius, 8)
    grid = torch.arange(-half, half + 1, dtype=torch.float32)
    disk = ((grid[:, None] ** 2 + grid[None, :] ** 2) <= radius**2).float()
    disk /= disk.sum()
    size = 3 if radius <= 8 else 5
    # imported here: torchvision's import pulls in torch._dynamo, seconds of every start of the app, which
    # imports this module (the Mechanisms tab, the atlas) but blurs only when a defocus is asked for
    import torchvision.transforms.v2.functional as TF

    return TF.gaussian_blur(disk[None, None], [size, size], [alias_blur, alias_blur])[0, 0]


def defocus_blur(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    return _filter(x, disk_kernel(*DEFOCUS_RADIUS_ALIAS[severity - 1]), border="reflect").clamp(0, 1)


def gaussian_blur(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    # scikit-image's gaussian (scipy's gaussian_filter): truncated at 4 sigma, the edge pixel repeated
    sigma = float(GAUSSIAN_BLUR_SIGMA[severity - 1])
    radius = int(4 * sigma + 0.5)
    grid = torch.arange(-radius, radius + 1, dtype=torch.float32)
    g = torch.exp(-(grid**2) / (2 * sigma**2))
    g /= g.sum()
    return _filter(x, g[:, None] * g[None, :], border="replicate").clamp(0, 1)


def brightness(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    # HSV's value V = max over channels, raised by the shift and clipped at 1; hue and saturation fixed mean
    # every channel scales by V'/V (a black pixel, V = 0, becomes grey V')
    shift = BRIGHTNESS_SHIFT[severity - 1]
    value = x.amax(dim=1, keepdim=True)
    raised = (value + shift).clamp(max=1)
    return torch.where(value > 0, x * raised / value.clamp_min(1e-12), raised).clamp(0, 1)


def contrast(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    factor = CONTRAST_FACTOR[severity - 1]
    means = x.mean(dim=(2, 3), keepdim=True)
    return ((x - means) * factor + means).clamp(0, 1)


def jpeg_compression(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    # PIL's libjpeg, as the paper's code (torchvision's JPEG codec is deprecated from 0.29 on)
    quality = JPEG_QUALITY[severity - 1]
    pixels = (x.detach().cpu().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    out = []
    for image in pixels:
        buffer = io.BytesIO()
        Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(buffer, "JPEG", quality=quality)
        out.append(np.asarray(Image.open(buffer)).reshape(image.shape))
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).to(device=x.device, dtype=x.dtype) / 255


def box_weights(n_in: int, n_out: int) -> torch.Tensor:
    """PIL's BOX resize of one axis from n_in to n_out pixels as an [n_out, n_in] matrix: output pixel i
    averages, with equal weights, the input pixels whose centres fall in its box around (i + 0.5) n_in / n_out,
    its right end included. Not coverage weights: a pixel cut by a box's edge counts wholly on one side. The
    arithmetic is Resample.c's precompute_coeffs, so that centres on a box's edge fall as they do in PIL."""
    scale = n_in / n_out
    filterscale = max(scale, 1.0)
    support = 0.5 * filterscale
    centre = (torch.arange(n_out, dtype=torch.float64)[:, None] + 0.5) * scale
    x = torch.arange(n_in, dtype=torch.float64)[None, :]
    window = (x >= (centre - support + 0.5).floor()) & (x < (centre + support + 0.5).floor())
    t = (x - centre + 0.5) * (1.0 / filterscale)  # where the box filter is evaluated
    weights = (window & (t > -0.5) & (t <= 0.5)).double()
    return (weights / weights.sum(dim=1, keepdim=True)).float()


def nearest_indices(n_in: int, n_out: int) -> torch.Tensor:
    """The input pixel PIL's NEAREST resize takes for each of n_out output pixels along one axis: the centre
    (i + 0.5) * n_in / n_out rounded down, with the centre accumulated step by step in float64 as PIL's
    ImagingScaleAffine does, so that centres landing exactly on a pixel edge round the way PIL's do."""
    step = n_in / n_out
    centres = np.cumsum(np.r_[0.5 * step, np.full(n_out - 1, step)])  # numpy adds in order, as the C loop
    return torch.from_numpy(np.minimum(centres.astype(np.int64), n_in - 1))


def pixelate(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    # PIL's BOX down (one weight matrix per axis, two matmuls), then its NEAREST back up, as the paper's code
    scale = PIXELATE_SCALE[severity - 1]
    H, W = x.shape[-2:]
    h, w = max(1, int(H * scale)), max(1, int(W * scale))
    small = box_weights(H, h).to(x) @ x @ box_weights(W, w).to(x).T
    rows, cols = nearest_indices(h, H).to(x.device), nearest_indices(w, W).to(x.device)
    return small[..., rows[:, None], cols]  # one gather, a fraction of the time of two index_selects


CORRUPTIONS: dict[str, Corruption] = {
    f.__name__: f
    for f in (
        gaussian_noise,
        shot_noise,
        impulse_noise,
        defocus_blur,
        gaussian_blur,
        brightness,
        contrast,
        jpeg_compression,
        pixelate,
    )
}


def corrupt(x: torch.Tensor, name: str, severity: int, *, generator: torch.Generator) -> torch.Tensor:
    """`CORRUPTIONS[name]` at `severity` (1-5) on x [B, C, H, W] in [0, 1], random draws from `generator`."""
    if name not in CORRUPTIONS:
        raise InputError(f"unknown corruption {name!r}; choose from {', '.join(CORRUPTIONS)}")
    if severity not in SEVERITIES:
        raise InputError(f"severity must be 1-5, got {severity}")
    if x.dim() != 4:
        raise InputError(f"x must be a batch [B, C, H, W], got shape {list(x.shape)}")
    return CORRUPTIONS[name](x, severity, generator)
