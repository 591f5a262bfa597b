"""Safe decoding of untrusted uploads into an RGB (or grey) PIL image the model can take: the upload's limits
(file size, megapixels) checked before anything is decoded, then the one decoder every reader of an image file
calls (`cait.data.image_file`), so that an upload gives the pixels the atlas and the scripts read of the file.

Every failure raises `ImageInputError` with one sentence a user can act on; oddities that still
give a correct result (EXIF rotation, animation, transparency, 16-bit, tiny or very long images)
are reported as notes so the UI can say what was done.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from cait.data.image_file import IMAGE_ERRORS, DecodedImage, decode_image
from cait.data.names import DataError
from cait.errors import InputError

MAX_UPLOAD_MB = 20  # larger files are refused unread, with the same message as any other file that fails
# The server takes files up to this size, well over MAX_UPLOAD_MB, so that a file a little too large reaches the
# upload handler, which refuses it in the status line like any file that fails. Gradio's browser check refuses
# only beyond it (a red error toast): each upload's disk stays bounded (Gradio streams it to a file, not memory).
MAX_RECEIVED_MB = 5 * MAX_UPLOAD_MB
# Beyond MAX_RECEIVED_MB the page does not send the file but a stand-in naming its size (`STAND_IN_JS`), which
# `load_image` refuses with the same message as any file over the limit: Gradio's own browser check would answer
# with a red error toast, and no event would reach the server to clear the last image's highlight. For the same
# reason a file the browser does not type as an image (a PDF, a file of unknown extension) is sent typed as one,
# past Gradio's check of the image box's "image/*": the decoder tells it apart, as it does a corrupt image.
STAND_IN = b"cait-lens stand-in for a file of this many bytes: "
UNTYPED_IMAGE = "image/x-unknown"  # the type a file the browser types as no image is sent with (`STAND_IN_JS`)
STAND_IN_JS = f"""() => {{
    const limit = {MAX_RECEIVED_MB * 2**20}, mark = {STAND_IN.decode()!r}, anyImage = {UNTYPED_IMAGE!r};
    const image = (f) => f.type.startsWith("image/");
    const sent = (f) => f.size > limit ? new File([mark + f.size], f.name, {{type: image(f) ? f.type : anyImage}})
        : image(f) ? f : new File([f], f.name, {{type: anyImage}});
    const swapped = (files) => {{
        const out = new DataTransfer();
        for (const f of files) out.items.add(sent(f));
        return out;
    }};
    const toSwap = (files) => [...(files || [])].some((f) => f.size > limit || !image(f));
    document.addEventListener("change", (event) => {{  // capture: before Gradio's own listener reads the files
        const input = event.target;
        if (input.type === "file" && input.closest("#image_in") && toSwap(input.files)) {{
            input.files = swapped(input.files).files;
        }}
    }}, true);
    document.addEventListener("drop", (event) => {{
        if (!event.isTrusted || !event.target.closest?.("#image_in") || !toSwap(event.dataTransfer?.files)) return;
        event.preventDefault();
        event.stopImmediatePropagation();
        const again = {{bubbles: true, cancelable: true, dataTransfer: swapped(event.dataTransfer.files)}};
        event.target.dispatchEvent(new DragEvent("drop", again));
    }}, true);
}}"""
MAX_PIXELS = 40_000_000  # refuse larger images before decoding (a 40 MP photo decodes to ~120 MB RGB)


class ImageInputError(InputError):
    """An upload that cannot be turned into an image; the message says why, in one sentence."""


def payload_path(payload: object) -> str | None:
    """The file of an image Gradio hands over: a FileData, its dict, or a path (None: no image)."""
    if payload is None:
        return None
    if isinstance(payload, dict):
        return payload.get("path")
    return getattr(payload, "path", None) or (payload if isinstance(payload, str) else None)


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
        try:
            return decode_image(im, mode=mode)
        except DataError as e:
            raise ImageInputError(f"the image cannot be shown: {e}.") from None
        except IMAGE_ERRORS as e:  # truncated data, broken codecs, corrupt EXIF
            raise ImageInputError(
                f"the image file is truncated or corrupt and cannot be decoded ({type(e).__name__})."
            ) from None
