"""Example images for a model: real photos for ImageNet models, the shipped test scenes for colour
Fashion-MNIST models, plain Fashion-MNIST test images for grey ones (generated into the work folder)."""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

import cait
from cait.checkpoint import WEIGHTS_DIR
from cait.data import EXAMPLES_DIR, read_examples

from app.workdir import WORK

# (package, file inside it): photos that ship with packages the app already depends on
IMAGENET_PHOTOS = (("skimage", "data/chelsea.png"), ("skimage", "data/astronaut.png"), ("skimage", "data/coffee.png"),
                   ("skimage", "data/rocket.jpg"), ("gradio", "media_assets/images/cheetah.jpg"),
                   ("gradio", "media_assets/images/lion.jpg"), ("skimage", "data/motorcycle_left.png"),
                   ("gradio", "media_assets/images/tower.jpg"))


def imagenet_photos() -> list[Path]:
    """The photos of IMAGENET_PHOTOS that are installed, each once."""
    found = []
    for package, relative in IMAGENET_PHOTOS:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        path = (Path(next(iter(spec.submodule_search_locations))) / relative).resolve()
        if path.is_file() and path not in found:
            found.append(path)
    return found


def find_examples(cfg: cait.CaiTConfig) -> list[tuple[str, str]]:
    """(image path, caption) pairs for a model with this config."""
    if cfg.labels == "imagenet":
        return [(str(p), p.stem) for p in imagenet_photos()]
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
    return [str(WORK.path), str(EXAMPLES_DIR), *(str(p) for p in imagenet_photos()), *cards]
