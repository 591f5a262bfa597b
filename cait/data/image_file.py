"""The one image decoder: every reader of an image file (the app's uploads, `read_images` and so the atlas and
evaluate, the analysis scripts, training's ImageFolder) turns a file into the same picture, so that a photo
gives the same pixels, maps and numbers wherever it is read.

The rules: the first frame of an animation; rotated as its EXIF orientation tag says (a phone photo stands up
as it is shown); transparency composited on a stated background (white by default, as a page shows it);
16-bit images scaled to 8 bits by rounding (PIL's convert clips them at 255: a white image); floating-point
images in [0, 1] scaled by 255, others stretched from their minimum to their maximum (they state no scale);
palettes, CMYK, 1-bit and the rest converted by PIL. Very large or very long images are bounded before the
model's view is taken (a JPEG decoded at a reduced scale, a centre crop to MAX_ASPECT, then at most MAX_SIDE
a side): the view keeps its centre and is taken from at most MAX_SIDE pixels anyway. 16-bit RGB files reach
us as 8 bits already: PIL keeps each sample's high byte.

Also what PIL raises for a file that cannot be read, and why it is skipped in a few words.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageOps

from .names import DataError

# what an unreadable file raises in PIL: not an image, truncated, zero bytes, gone, or a decompression bomb
IMAGE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)
WHITE = (255, 255, 255)  # the background transparent pixels are put on, as a page shows them
MAX_SIDE = 2048  # larger images are downscaled first: the models see at most 448 px anyway
MAX_ASPECT = 4.0  # longer images are centre-cropped to this ratio first (see `_crop_aspect`)
TINY_SIDE = 8  # below this the image has almost no information: said in a note, still decoded
_HIGH_DEPTH = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")
_ALPHA = ("RGBA", "LA", "PA", "RGBa", "La")


@dataclass
class DecodedImage:
    """An image file as every reader sees it."""

    image: Image.Image  # the mode asked (RGB or L), at most MAX_SIDE on its long side
    original_size: tuple[int, int]  # (width, height) as stored in the file
    notes: list[str] = field(default_factory=list)  # what was done to get a correct picture, one sentence each


def decode_image(im: Image.Image, *, mode: str = "RGB", background: tuple[int, int, int] = WHITE) -> DecodedImage:
    """An opened image file (PIL has read its header, nothing more) decoded by the rules above.

    Args:
        im: what `PIL.Image.open` returned; decoded here (a caller checks its size before that).
        mode: "RGB" or "L", the channels of the picture returned.
        background: the colour transparent pixels are composited on.

    Returns:
        The picture, the file's size and the notes of what was done.

    Raises:
        OSError: data that cannot be decoded (truncated, broken codec, corrupt EXIF); `IMAGE_ERRORS` in general.
        DataError: an integer image beyond 16 bits, which has no 8-bit scale.
    """
    width, height = im.size
    notes = []
    if getattr(im, "n_frames", 1) > 1:
        notes.append(f"animated image with {im.n_frames} frames: used the first frame.")
    if im.format == "JPEG" and max(width, height) > 2 * MAX_SIDE:
        im.draft("RGB", (MAX_SIDE, MAX_SIDE))  # let libjpeg decode at a reduced scale: less memory
    try:
        im.load()
        rotated = ImageOps.exif_transpose(im)
    except IMAGE_ERRORS:
        raise
    except Exception as e:  # corrupt EXIF and broken codecs raise anything: the file is at fault, not the code
        raise OSError(f"truncated or corrupt image data ({type(e).__name__})") from e
    if exif_orientation(im) not in (None, 1):
        notes.append("rotated as its EXIF orientation tag says.")
    # bounded in RGB whatever the mode asked, so that a grey picture is the grey of the RGB one (which a reader
    # that knows no model, training's ImageFolder, hands on)
    image = _crop_aspect(_to_rgb(rotated, notes, background), notes)
    if max(image.size) > MAX_SIDE:
        image.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.LANCZOS)
    if min(width, height) < TINY_SIDE:
        notes.append(f"the image is only {width}x{height} pixels: it was upscaled and the result means little.")
    return DecodedImage(image=image.convert(mode), original_size=(width, height), notes=notes)


def read_image(path: str | os.PathLike, *, mode: str = "RGB", background: tuple[int, int, int] = WHITE) -> Image.Image:
    """The picture of the image file at `path` (`decode_image`'s rules), decoded in full here so that a
    truncated file fails now. Raises `IMAGE_ERRORS` for a file that cannot be read (DataError among them)."""
    with Image.open(path) as im:
        return decode_image(im, mode=mode, background=background).image


def exif_orientation(im: Image.Image) -> int | None:
    """The EXIF orientation tag of an opened image (1-8; None: none, or a corrupt EXIF block)."""
    try:
        return im.getexif().get(0x0112)
    except Exception:  # a corrupt EXIF block: no orientation to report (exif_transpose read it already)
        return None


# where `decode_image` (through ImageOps.exif_transpose) moves a point (x, y) of a stored picture of size (w, h),
# per EXIF orientation: 2 mirrored, 3 turned half round, 4 flipped, 5 transposed, 6 turned a quarter clockwise,
# 7 transversed, 8 turned a quarter anticlockwise; 5-8 swap the width and the height
_UPRIGHT = {
    2: lambda x, y, w, h: (w - x, y),
    3: lambda x, y, w, h: (w - x, h - y),
    4: lambda x, y, w, h: (x, h - y),
    5: lambda x, y, w, h: (y, x),
    6: lambda x, y, w, h: (h - y, x),
    7: lambda x, y, w, h: (h - y, w - x),
    8: lambda x, y, w, h: (y, w - x),
}


def upright_box(
    box: list[float], size: tuple[int, int], orientation: int | None
) -> tuple[list[float], tuple[int, int]]:
    """A box (x0, y0, x1, y1) in the pixels of a picture of `size` (width, height) as stored, and that size, in
    the picture `decode_image` gives, turned upright as its EXIF `orientation` says (unchanged for none)."""
    turn = _UPRIGHT.get(orientation)
    if turn is None:
        return list(box), tuple(size)
    w, h = size
    (ax, ay), (bx, by) = turn(box[0], box[1], w, h), turn(box[2], box[3], w, h)
    return [min(ax, bx), min(ay, by), max(ax, bx), max(ay, by)], ((h, w) if orientation >= 5 else (w, h))


def _to_rgb(im: Image.Image, notes: list[str], background: tuple[int, int, int]) -> Image.Image:
    """Colour conversion that keeps the picture: high bit depths rescaled (`_eight_bit`), transparency
    composited on `background` (a plain convert() shows whatever colour the transparent pixels happen to
    hold), then PIL's conversion (CMYK, YCbCr, palettes, 1-bit, L and RGB all convert correctly from there)."""
    if im.mode in _HIGH_DEPTH:
        im = _eight_bit(im)
        notes.append("high bit depth image: rescaled to 8 bits.")
    if im.mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    if im.mode in _ALPHA:
        rgba = im.convert("RGBA")
        if rgba.getchannel("A").getextrema()[0] < 255:
            notes.append(f"transparent pixels were put on a {_colour_name(background)} background.")
        im = Image.alpha_composite(Image.new("RGBA", rgba.size, (*background, 255)), rgba)
    return im.convert("RGB")


def _eight_bit(im: Image.Image) -> Image.Image:
    """A grey image of more than 8 bits (PIL modes I;16*, I, F) as 8 bits (mode L), rounded: 16-bit data (and
    mode I above 255) over 65535, mode I up to 255 as it is, floats in [0, 1] times 255, other floats from their
    minimum to their maximum (NaN and infinities as the minimum). DataError for integers outside 0..65535."""
    data = np.asarray(im, dtype=np.float64)
    finite = data[np.isfinite(data)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    data = np.where(np.isfinite(data), data, lo)
    if im.mode == "F":
        scaled = data if 0 <= lo and hi <= 1 else (data - lo) / max(hi - lo, 1e-12)
    elif lo < 0 or hi > 65535:
        raise DataError(f"a 32-bit integer image with values {lo:.0f}..{hi:.0f} has no 8-bit scale")
    else:
        scaled = data / (65535.0 if im.mode.startswith("I;16") or hi > 255 else 255.0)
    return Image.fromarray(np.clip(scaled * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")


def _colour_name(rgb: tuple[int, int, int]) -> str:
    return {WHITE: "white", (0, 0, 0): "black"}.get(tuple(rgb), "rgb({}, {}, {})".format(*rgb))


def _crop_aspect(im: Image.Image, notes: list[str]) -> Image.Image:
    """Centre-crop very long images to MAX_ASPECT. The eval transform keeps only the central square anyway
    (short side resized to the input size, then centre crop), so the model sees the same pixels; without this
    a 10000x1 strip would be resized to 2.2 million x 224 first."""
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


def unreadable_reason(error: BaseException) -> str:
    """What an `IMAGE_ERRORS` error says of a file, in a few words and without its path."""
    from PIL import UnidentifiedImageError

    if isinstance(error, UnidentifiedImageError):
        return "not an image PIL can read"
    if isinstance(error, FileNotFoundError):
        return "the file is gone"
    if isinstance(error, Image.DecompressionBombError):
        return "too many pixels (PIL's decompression-bomb limit)"
    if isinstance(error, (EOFError, SyntaxError)) or "truncated" in str(error):
        return "truncated or damaged"
    if isinstance(error, OSError) and error.strerror:  # its str() would carry the file's absolute path
        return f"{type(error).__name__}: {error.strerror}"
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text if isinstance(error, ValueError) else f"{type(error).__name__}: {text}"
