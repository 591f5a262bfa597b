"""What the data commands need before any data is read, without torch: the built-in data's splits and native
inputs, the scene styles (the flags' choices, so a command's --help imports no torch), how the built-in data
and its splits are named wherever they are shown, the mark of an unfinished export and the error a bad data
request raises."""

from __future__ import annotations

from ..errors import InputError

SPLIT_FILES = {"train": "train", "val": "t10k"}  # val is Fashion-MNIST's 10k test split
DATA_NAMES = {"fashion-mnist": "Fashion-MNIST", "fashion-mnist-scenes": "Fashion-MNIST scenes"}  # as shown
SPLIT_GARMENTS = {"train": "training garments", "val": "test garments"}  # the Fashion-MNIST images a split draws on
NATIVE_INPUT = {"fashion-mnist": (28, 1), "fashion-mnist-scenes": (64, 3)}  # built-in data: (side, channels)
SCENE_STYLES = ("default", "varied", "light", "mixed", "blend")
SCENE_SIDE = 64  # pixels a side of a rendered scene; models with a larger input see it upscaled
# the boxes of an export under way (`cait.data.export`), removed once boxes.json is written: the reader warns
UNFINISHED_EXPORT = ".export-unfinished.json"


class DataError(InputError):
    """Data that cannot be used; the message is one line saying what to do."""


class DataWarning(UserWarning):
    """Data that can be used, but not all of it as asked (e.g. class folders that map to no class, boxes left out)."""


def data_name(data: str) -> str:
    """The built-in data as pages, figures and logs name it ("Fashion-MNIST scenes"); anything else as given."""
    return DATA_NAMES.get(data, data)


def split_name(data: str, split: str) -> str:
    """A split of the built-in data as every page, figure, log and summary names it, e.g. "Fashion-MNIST scenes,
    val split (test garments)": the start of the reader's `ImageSet.name`, the dataset's `.name`, the atlas's
    page and the app's words for the scenes it builds an atlas of.

    Args:
        data: "fashion-mnist" or "fashion-mnist-scenes".
        split: "train" or "val".

    Returns:
        The name, one line.

    Raises DataError (one line) for data that is not built in or a split it does not have."""
    if data not in DATA_NAMES:
        raise DataError(f"{data!r} is not built-in data ({', '.join(DATA_NAMES)}): it has no named splits")
    if split not in SPLIT_FILES:
        raise DataError(f"split must be one of {', '.join(SPLIT_FILES)}, got {split!r}")
    return f"{DATA_NAMES[data]}, {split} split ({SPLIT_GARMENTS[split]})"
