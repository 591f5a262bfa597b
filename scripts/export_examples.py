"""Write the example images shipped with the package (cait/examples/): 12 Fashion-MNIST scenes from the
test split and 2 product-style photos of test garments (`cait.data.products`: the first centred and the first
off-centre one), as PNG, with their labels and garment boxes in examples.json (a product photo's entry says
"source": "products"). Deterministic; rerun to refresh."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from cait.data import FashionMNISTScenes
from cait.data.products import ProductPhotos

OUT = Path(__file__).resolve().parents[1] / "cait" / "examples"


def pick_indices(labels, per_class: int = 1, extra: int = 2) -> list[int]:
    """The first test scene of every class, then the next `extra` scenes not already chosen."""
    chosen = [int(next(i for i, y in enumerate(labels) if y == c)) for c in range(10) for _ in range(per_class)]
    chosen += [i for i in range(len(labels)) if i not in chosen][:extra]
    return chosen


def pick_products(photos: ProductPhotos) -> list[int]:
    """The first photo drawn with its garment centred and the first drawn off-centre."""
    centred = [d["x0"] == d["y0"] == (photos.canvas - d["side"]) // 2 for d in photos.draws]
    return sorted({centred.index(True), centred.index(False)})


def _entry(prefix: str, i: int, image: Image.Image, label: int, box, classes) -> dict:
    """Save image as OUT/<prefix>_<index>_<class>.png; its examples.json entry."""
    name = f"{prefix}_{i:05d}_{classes[label].split('/')[0].replace(' ', '_').lower()}.png"
    image.save(OUT / name)
    box_xyxy = [round(float(v), 2) for v in box]
    return {"file": name, "test_index": i, "label": label, "class": classes[label], "box_xyxy": box_xyxy}


def main() -> None:
    scenes, photos = FashionMNISTScenes("val"), ProductPhotos(100)
    OUT.mkdir(parents=True, exist_ok=True)
    entries = [_entry("scene", i, *scenes[i], scenes.boxes[i], scenes.classes) for i in pick_indices(scenes.labels)]
    for i in pick_products(photos):
        image, label = Image.fromarray(photos.render(i)), int(photos.labels[i])
        entries.append({**_entry("product", i, image, label, photos.boxes[i], photos.classes), "source": "products"})
    dataset = "fashion-mnist-scenes (test split, seed 0); source products: cait.data.products (test split, seed 0)"
    (OUT / "examples.json").write_text(
        json.dumps({"dataset": dataset, "canvas": scenes.canvas, "examples": entries}, indent=1)
    )
    print(f"wrote {len(entries)} examples to {OUT}")


if __name__ == "__main__":
    main()
