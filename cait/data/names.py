"""What the data commands need before any data is read, without torch: the built-in data's splits and native
inputs, the scene styles (the flags' choices, so a command's --help imports no torch), the mark of an unfinished
export and the error a bad data request raises."""

from __future__ import annotations

from ..errors import InputError

SPLIT_FILES = {"train": "train", "val": "t10k"}  # val is Fashion-MNIST's 10k test split
NATIVE_INPUT = {"fashion-mnist": (28, 1), "fashion-mnist-scenes": (64, 3)}  # built-in data: (side, channels)
SCENE_STYLES = ("default", "varied", "light", "mixed", "blend")
SCENE_SIDE = 64  # pixels a side of a rendered scene; models with a larger input see it upscaled
# the boxes of an export under way (`cait.data.export`), removed once boxes.json is written: the reader warns
UNFINISHED_EXPORT = ".export-unfinished.json"


class DataError(InputError):
    """Data that cannot be used; the message is one line saying what to do."""


class DataWarning(UserWarning):
    """Data that can be used, but not all of it as asked (e.g. class folders that map to no class, boxes left out)."""
