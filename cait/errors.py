"""The project's one kind of input error: everything a user can get wrong (a model name, a file, a flag, an image,
a target, a dataset) raises an `InputError` with a one-line message. Callers that show calm messages catch only
this class, so a bug inside torch or numpy is never mistaken for a user's mistake. Torch-free."""

from __future__ import annotations


class InputError(ValueError):
    """Something the user gave cannot work; the message says what and, where there is one, the way out.

    A ValueError subclass, so code written against ValueError still catches it."""
