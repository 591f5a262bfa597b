"""Example images for a model: real photos for ImageNet models, the shipped test scenes for colour
Fashion-MNIST models, plain Fashion-MNIST test images for grey ones (generated into the work folder)."""

from __future__ import annotations

from functools import lru_cache

import cait
from app.workdir import WORK
from cait.checkpoint import WEIGHTS_DIR
from cait.data import EXAMPLES_DIR, read_examples
from cait.data.photos import available_photos


def find_examples(cfg: cait.CaiTConfig) -> list[tuple[str, str]]:
    """(image path, caption) pairs for a model with this config."""
    if cfg.is_imagenet:
        return [(str(path), photo.name) for photo, path in available_photos()]
    if cfg.in_chans == 3:
        shipped = read_examples()
        if shipped:
            return [(str(e.path), e.caption) for e in shipped]
    return list(generated_examples("fashion-mnist-scenes" if cfg.in_chans == 3 else "fashion-mnist"))


@lru_cache(maxsize=2)
def generated_examples(data: str, count: int = 8) -> tuple[tuple[str, str], ...]:
    """The first `count` test images of `data`, written once per process (empty without the dataset)."""
    from cait.data import DataError, build_dataset

    try:
        dataset = build_dataset(data, "val", subset=count)
    except DataError:
        return ()
    out_dir = WORK.folder(f"examples-{data}")
    out = []
    for i in range(len(dataset)):
        image, label = dataset[i]
        path = out_dir / f"{data}-{i}.png"
        image.save(path)
        out.append((str(path), f"true: {dataset.classes[label]}"))
    return tuple(out)


def served_paths() -> list[str]:
    """Files and folders outside Gradio's cache that the page shows or links (for allowed_paths)."""
    cards = sorted(str(p) for p in WEIGHTS_DIR.glob("*.md"))  # the model cards the header links to
    return [str(WORK.path), str(EXAMPLES_DIR), *(str(path) for _, path in available_photos()), *cards]
