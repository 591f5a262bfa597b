"""Write the example scenes shipped with the package (cait/examples/): 12 Fashion-MNIST scenes from the
test split, as PNG, with their labels and garment boxes in examples.json. Deterministic; rerun to refresh."""

from __future__ import annotations

import json
from pathlib import Path

from cait.data import FashionMNISTScenes

OUT = Path(__file__).resolve().parents[1] / "cait" / "examples"


def pick_indices(labels, per_class: int = 1, extra: int = 2) -> list[int]:
    """The first test scene of every class, then the next `extra` scenes not already chosen."""
    chosen = [int(next(i for i, y in enumerate(labels) if y == c)) for c in range(10) for _ in range(per_class)]
    chosen += [i for i in range(len(labels)) if i not in chosen][:extra]
    return chosen


def main() -> None:
    scenes = FashionMNISTScenes("val")
    OUT.mkdir(parents=True, exist_ok=True)
    entries = []
    for i in pick_indices(scenes.labels):
        image, label = scenes[i]
        name = f"scene_{i:05d}_{scenes.classes[label].split('/')[0].replace(' ', '_').lower()}.png"
        image.save(OUT / name)
        entries.append(
            {
                "file": name,
                "test_index": i,
                "label": label,
                "class": scenes.classes[label],
                "box_xyxy": [round(float(v), 2) for v in scenes.boxes[i]],
            }
        )
    (OUT / "examples.json").write_text(
        json.dumps(
            {"dataset": "fashion-mnist-scenes (test split, seed 0)", "canvas": scenes.canvas, "examples": entries},
            indent=1,
        )
    )
    print(f"wrote {len(entries)} examples to {OUT}")


if __name__ == "__main__":
    main()
