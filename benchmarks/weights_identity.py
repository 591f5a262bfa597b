"""Cost of the weights' identity (`cait.provenance.weights_identity`, the sha256 of the weights file) on a load:
`cait.load_model` of a file whose hash is not known yet (the first load of a file version) against one whose hash
the process keeps (every later load), for the shipped model and a random-init paper-size file.

    .venv/bin/python benchmarks/weights_identity.py                     # cait_micro_136 (shipped), cait_s24_224
    .venv/bin/python benchmarks/weights_identity.py --models cait_xxs24_224 --repeats 3
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import cait
from cait.checkpoint import WEIGHTS_DIR
from cait.provenance import file_sha256
from cait.timing import time_interleaved


def weights_file(name: str, folder: Path) -> Path:
    """The shipped file of `name`, else its seeded random init written to `folder` (speed needs no training)."""
    cfg = cait.get_config(name)
    if cfg.pretrained and (WEIGHTS_DIR / cfg.pretrained).is_file():
        return WEIGHTS_DIR / cfg.pretrained
    path = folder / f"{name}.safetensors"
    cait.save_weights(cait.load_model(name, weights=False).model, path)
    return path


def first_load(path: Path) -> None:
    file_sha256.cache_clear()
    cait.load_model(checkpoint=path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["cait_micro_136", "cait_s24_224"])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models:
            path = weights_file(name, Path(folder))
            fns = {"hashed": lambda: first_load(path), "known": lambda: cait.load_model(checkpoint=path)}
            seconds = time_interleaved(fns, repeats=args.repeats, calls=1, desc=name)
            mb = path.stat().st_size / 1e6
            print(
                f"{name} ({mb:.0f} MB): first load {seconds['hashed']:.3f} s, later loads {seconds['known']:.3f} s, "
                f"{seconds['hashed'] / seconds['known']:.2f}x"
            )


if __name__ == "__main__":
    main()
