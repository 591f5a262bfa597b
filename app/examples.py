"""Example images for a model: real photos for ImageNet models, the shipped test scenes for colour
Fashion-MNIST models, plain Fashion-MNIST test images for grey ones (generated into the work folder)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import cait
from cait.checkpoint import WEIGHTS_DIR
from cait.data import EXAMPLES_DIR, read_examples
from cait.data.photos import available_photos


def find_examples(cfg: cait.CaiTConfig, work: Path) -> list[tuple[str, str]]:
    """(image path, caption) pairs for a model with this config; generated ones are written under `work` (the
    app's work folder, which it serves)."""
    if cfg.is_imagenet:
        return [(str(path), photo.name) for photo, path in available_photos()]
    if cfg.in_chans == 3:
        shipped = read_examples()
        if shipped:
            return [(str(e.path), e.caption) for e in shipped]
    return list(generated_examples("fashion-mnist-scenes" if cfg.in_chans == 3 else "fashion-mnist", work))


@lru_cache(maxsize=2)
def generated_examples(data: str, work: Path, count: int = 8) -> tuple[tuple[str, str], ...]:
    """The first `count` test images of `data`, written once per process under `work` (empty without the
    dataset)."""
    from cait.data import DataError, build_dataset

    try:
        dataset = build_dataset(data, "val", subset=count)
    except DataError:
        return ()
    out_dir = work / f"examples-{data}"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(len(dataset)):
        image, label = dataset[i]
        path = out_dir / f"{data}-{i}.png"
        image.save(path)
        out.append((str(path), f"true: {dataset.classes[label]}"))
    return tuple(out)


def served_paths(work: Path) -> list[str]:
    """Files and folders outside Gradio's cache that the page shows or links (for allowed_paths); `work`: the
    app's work folder."""
    cards = sorted(str(p) for p in WEIGHTS_DIR.glob("*.md"))  # the model cards the header links to
    return [str(work), str(EXAMPLES_DIR), *(str(path) for _, path in available_photos()), *cards]
