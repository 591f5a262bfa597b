"""One image file as the reader opens it: what PIL raises for a file that cannot be read, why it is skipped in
a few words, and 16-bit grey images scaled to the 8 bits a model's view takes."""

from __future__ import annotations

import numpy as np
from PIL import Image

from .names import DataError

# what an unreadable file raises in PIL: not an image, truncated, zero bytes, gone, or a decompression bomb
IMAGE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)


def eight_bit(image: Image.Image) -> Image.Image:
    """A 16-bit grey image (PIL mode I;16, or I holding values above 255) scaled to 8 bits (mode L), since
    PIL's convert to RGB or L clips it at 255 (a white image); mode I holding 8-bit values as they are, in
    mode L; other images as they are. A floating-point image, or integers outside 16 bits, have no scale to
    read: DataError (the reader skips the image with that reason)."""
    if image.mode == "F":
        raise DataError("a 32-bit floating-point image has no 8-bit scale")
    if not image.mode.startswith("I"):
        return image
    values = np.asarray(image).astype(np.int64)
    if values.min(initial=0) < 0 or values.max(initial=0) > 65535:
        raise DataError(f"a 32-bit integer image with values {values.min()}..{values.max()} has no 8-bit scale")
    sixteen = image.mode.startswith("I;16") or values.max(initial=0) > 255
    return Image.fromarray((values >> 8 if sixteen else values).astype(np.uint8), mode="L")


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
