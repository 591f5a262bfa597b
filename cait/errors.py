"""The project's one kind of input error: everything a user can get wrong (a model name, a file, a flag, an image,
a target, a dataset) raises an `InputError` with a one-line message. Callers that show calm messages catch only
this class, so a bug inside torch or numpy is never mistaken for a user's mistake. Torch-free."""

from __future__ import annotations

from typing import Any

SHOWN = 80  # characters of a bad value a message echoes: a 100 KB value must not make a 100 KB message


def shown(value: Any, *, limit: int = SHOWN) -> str:
    """`repr(value)` for an error message, cut to `limit` characters (`cut`)."""
    return cut(repr(value), limit=limit)


def cut(text: str, *, limit: int = SHOWN) -> str:
    """`text` cut to `limit` characters, the cut marked "..."."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class InputError(ValueError):
    """Something the user gave cannot work; the message says what and, where there is one, the way out.

    A ValueError subclass, so code written against ValueError still catches it."""
