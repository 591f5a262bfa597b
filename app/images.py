"""Safe decoding of untrusted uploads into an RGB (or grey) PIL image the model can take.

Every failure raises `ImageInputError` with one sentence a user can act on; oddities that still
give a correct result (EXIF rotation, animation, transparency, 16-bit, tiny or very long images)
are reported as notes so the UI can say what was done.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from cait.errors import InputError

MAX_UPLOAD_MB = 20  # larger files are refused unread, with the same message as any other file that fails
# The server takes files up to this size, well over MAX_UPLOAD_MB, so that a file a little too large reaches the
# upload handler, which refuses it in the status line like any file that fails. Gradio's browser check refuses
# only beyond it (a red error toast): each upload's disk stays bounded (Gradio streams it to a file, not memory).
MAX_RECEIVED_MB = 5 * MAX_UPLOAD_MB
# Beyond MAX_RECEIVED_MB the page does not send the file but a stand-in naming its size (`STAND_IN_JS`), which
# `load_image` refuses with the same message as any file over the limit: Gradio's own browser check would answer
# with a red error toast, and no event would reach the server to clear the last image's highlight.
STAND_IN = b"cait-lens stand-in for a file of this many bytes: "
STAND_IN_JS = f"""() => {{
    const limit = {MAX_RECEIVED_MB * 2**20}, mark = {STAND_IN.decode()!r};
    const swapped = (files) => {{
        const out = new DataTransfer();
        for (const f of files) out.items.add(f.size > limit ? new File([mark + f.size], f.name, {{type: f.type}}) : f);
        return out;
    }};
    const tooLarge = (files) => [...(files || [])].some((f) => f.size > limit);
    document.addEventListener("change", (event) => {{  // capture: before Gradio's own listener reads the files
        const input = event.target;
        if (input.type === "file" && input.closest("#image_in") && tooLarge(input.files)) {{
            input.files = swapped(input.files).files;
        }}
    }}, true);
    document.addEventListener("drop", (event) => {{
        if (!event.isTrusted || !event.target.closest?.("#image_in") || !tooLarge(event.dataTransfer?.files)) return;
        event.preventDefault();
        event.stopImmediatePropagation();
        const again = {{bubbles: true, cancelable: true, dataTransfer: swapped(event.dataTransfer.files)}};
        event.target.dispatchEvent(new DragEvent("drop", again));
    }}, true);
}}"""
MAX_PIXELS = 40_000_000  # refuse larger images before decoding (a 40 MP photo decodes to ~120 MB RGB)
MAX_SIDE = 2048  # larger images are downscaled first: the models see at most 448 px anyway
MAX_ASPECT = 4.0  # longer images are centre-cropped to this ratio first (see `_crop_aspect`)
TINY_SIDE = 8  # below this the image has almost no information: say so, still classify


class ImageInputError(InputError):
    """An upload that cannot be turned into an image; the message says why, in one sentence."""


def payload_path(payload: object) -> str | None:
    """The file of an image Gradio hands over: a FileData, its dict, or a path (None: no image)."""
    if payload is None:
        return None
    if isinstance(payload, dict):
        return payload.get("path")
    return getattr(payload, "path", None) or (payload if isinstance(payload, str) else None)


@dataclass
class DecodedImage:
    image: Image.Image  # RGB or L, at most MAX_SIDE on its long side
    original_size: tuple[int, int]  # (width, height) as stored in the file
    notes: list[str] = field(default_factory=list)  # what was done to get a correct result


def load_image(
    path: str | os.PathLike, *, max_pixels: int = MAX_PIXELS, max_mb: float = MAX_UPLOAD_MB, mode: str = "RGB"
) -> DecodedImage:
    """Open `path` defensively and return it converted to `mode` ("RGB" or "L"); a file over `max_mb` MB is
    refused before it is opened."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError:
        raise ImageInputError(f"the uploaded file could not be read ({path.name}).") from None
    if size == 0:
        raise ImageInputError("the uploaded file is empty (0 bytes).")
    if size <= len(STAND_IN) + 20 and (head := path.read_bytes()).startswith(STAND_IN):
        named = head[len(STAND_IN) :]
        size = int(named) if named.isdigit() else size  # what the page did not send (`STAND_IN_JS`)
    if size > max_mb * 2**20:
        raise ImageInputError(
            f"the file is {size / 2**20:.1f} MB, larger than this app's limit of {max_mb:g} MB, so it was not read."
        )
    with warnings.catch_warnings():
        # Pillow warns above its own bomb limit and raises above twice that; we check our own lower limit.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = Image.open(path)  # reads the header only
        except Image.DecompressionBombError:
            raise ImageInputError(
                f"the image has too many pixels (limit {max_pixels / 1e6:.0f} megapixels); refused without decoding it."
            ) from None
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
            raise ImageInputError(
                f"'{path.name}' is not an image format this app can read (PNG, JPEG, GIF, WebP, BMP, TIFF ...)."
            ) from None
    with im:
        width, height = im.size
        if width * height > max_pixels:
            raise ImageInputError(
                f"the image is {width}x{height} = {width * height / 1e6:.0f} megapixels, above "
                f"the limit of {max_pixels / 1e6:.0f}; refused without decoding it."
            )
        if width < 1 or height < 1:
            raise ImageInputError("the image has no pixels.")
        notes = []
        if getattr(im, "n_frames", 1) > 1:
            notes.append(f"animated image with {im.n_frames} frames: used the first frame.")
        if im.format == "JPEG" and max(width, height) > 2 * MAX_SIDE:
            im.draft("RGB", (MAX_SIDE, MAX_SIDE))  # let libjpeg decode at a reduced scale: less memory
        try:
            im.load()
            rotated = ImageOps.exif_transpose(im)
        except Exception as e:  # truncated data, broken codecs, corrupt EXIF
            raise ImageInputError(
                f"the image file is truncated or corrupt and cannot be decoded ({type(e).__name__})."
            ) from None
        if _exif_orientation(im) not in (None, 1):
            notes.append("rotated as its EXIF orientation tag says.")
        image = _to_mode(rotated, mode, notes)
    image = _crop_aspect(image, notes)
    if max(image.size) > MAX_SIDE:
        image.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.LANCZOS)
    if min(width, height) < TINY_SIDE:
        notes.append(f"the image is only {width}x{height} pixels: it was upscaled and the result means little.")
    return DecodedImage(image=image, original_size=(width, height), notes=notes)


def _exif_orientation(im: Image.Image) -> int | None:
    try:
        return im.getexif().get(0x0112)
    except Exception:
        return None


def _to_mode(im: Image.Image, mode: str, notes: list[str]) -> Image.Image:
    """Colour conversion that keeps the picture: 16-bit and float data are rescaled (a plain
    convert() would clip them to white), transparency is composited on white (a plain convert()
    shows whatever colour the transparent pixels happen to hold)."""
    if im.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        data = np.asarray(im, dtype=np.float64)
        top = 65535.0 if im.mode.startswith("I;16") or data.max() > 255 else 255.0
        if im.mode == "F":
            lo, hi = float(data.min()), float(data.max())
            data, top = data - lo, max(hi - lo, 1e-12)
        im = Image.fromarray(np.clip(data / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
        notes.append("high bit depth image: rescaled to 8 bits.")
    if im.mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        if rgba.getchannel("A").getextrema()[0] < 255:
            notes.append("transparent pixels were put on a white background.")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        im = Image.alpha_composite(background, rgba)
    return im.convert(mode)  # CMYK, YCbCr, 1-bit, L and RGB all convert correctly from here


def _crop_aspect(im: Image.Image, notes: list[str]) -> Image.Image:
    """Centre-crop very long images to MAX_ASPECT. The eval transform keeps only the central
    square anyway (short side resized to the input size, then centre crop), so the model sees
    the same pixels; without this a 10000x1 strip would be resized to 2.2 million x 224 first."""
    w, h = im.size
    long, short = max(w, h), min(w, h)
    if long <= MAX_ASPECT * short:
        return im
    keep = int(round(MAX_ASPECT * short))
    notes.append(f"very elongated image ({w}x{h}): the model sees its centre, as with any image.")
    if w > h:
        left = (w - keep) // 2
        return im.crop((left, 0, left + keep, h))
    top = (h - keep) // 2
    return im.crop((0, top, w, top + keep))
