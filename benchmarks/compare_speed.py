"""What a comparison of two models (`python -m cait.compare`) costs, against issue 56's goals:

- per batch, the comparison's work against the two models' atlas passes added up (`cait.atlas.compute
  .batch_numbers` of each, which the comparison runs too: goal <= 1.15x), and the share of CKA's HSIC sums and of
  the head similarity in it (CKA goal < 5%), timed together (cait/timing.py);
- peak RSS of the whole command on --rss-from and --rss-to images (goal: it grows by <= 200 MB).

    python benchmarks/compare_speed.py                      # cait_micro_136 against cait_nano_28, batches of 64
    python benchmarks/compare_speed.py --rss-from 1000 --rss-to 10000

Images: Fashion-MNIST's test garments (each model through its own preprocessing). Run it with one torch thread
on a shared machine (OMP_NUM_THREADS=1, nice); the subprocesses inherit it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.data import DataLoader

import cait
from cait.atlas.compute import batch_numbers
from cait.compare.cka import minibatch_sums
from cait.compare.compute import PairedImages, pair_numbers, side_numbers
from cait.compare.heads import map_similarity
from cait.data import read_images
from cait.preprocess import normalise
from cait.timing import time_interleaved

REPO = Path(__file__).resolve().parent.parent
DATA = "fashion-mnist"


def per_batch(args: argparse.Namespace) -> dict[str, float]:
    """Seconds per batch of the comparison, of the two atlas passes, of CKA's sums and of the head similarity."""
    a, b = (cait.load_model(name).model.eval() for name in (args.model_a, args.model_b))
    paired = PairedImages(*(read_images(DATA, m.cfg, limit=args.batch_size, normalise=False) for m in (a, b)))
    batch = next(iter(DataLoader(paired, batch_size=args.batch_size)))
    xa, xb, _, box_a, box_b, _, _ = batch
    na, fa = side_numbers(a, xa, box_a, dtype=None)
    nb, fb = side_numbers(b, xb, box_b, dtype=None)
    maps_a, maps_b = torch.from_numpy(na["maps"]), torch.from_numpy(nb["maps"])
    size = max(a.cfg.img_size, b.cfg.img_size)

    def atlases():
        batch_numbers(a, normalise(xa, a.cfg), box_a, knockouts=False, dtype=None)
        batch_numbers(b, normalise(xb, b.cfg), box_b, knockouts=False, dtype=None)

    return time_interleaved(
        {
            "compare": lambda: pair_numbers(a, b, batch, device=torch.device("cpu")),
            "two atlas passes": atlases,
            "cka sums": lambda: minibatch_sums(fa, fb),
            "head similarity": lambda: map_similarity(maps_a, maps_b, size=size),
        },
        repeats=args.repeats,
        desc="per batch",
    )


def peak_rss_mb(args: argparse.Namespace, images: int) -> float:
    """Peak RSS (MB) of one comparison command on `images` images, in-process data loading (--workers 0)."""
    code = (
        "import resource, sys; from cait.compare.__main__ import main; code = main(sys.argv[1:]); "
        "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(code)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        flags = [*args.rss_models, "--data", DATA, "--limit", str(images), "--workers", "0", "--threads", "1"]
        command = [sys.executable, "-c", code, *flags, "--out", str(Path(tmp) / "run")]
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return int(proc.stdout.split("peak_rss_kb")[-1]) / 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/compare_speed.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-a", default="cait_micro_136")
    p.add_argument("--model-b", default="cait_nano_28")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--rss-models",
        nargs="+",
        default=["--model-a", "cait_nano_28", "--model-b", "cait_nano_28"],
        help="the two models' flags of the memory runs (default the smallest shipped model against itself)",
    )
    p.add_argument("--rss-from", type=int, default=1000)
    p.add_argument("--rss-to", type=int, default=10000)
    p.add_argument("--skip-rss", action="store_true")
    args = p.parse_args(argv)
    s = per_batch(args)
    print(f"{args.model_a} against {args.model_b}, batch {args.batch_size}, {torch.get_num_threads()} thread(s):")
    print(f"  compare {s['compare'] * 1e3:.0f} ms, two atlas passes {s['two atlas passes'] * 1e3:.0f} ms: ")
    print(f"  {s['compare'] / s['two atlas passes']:.3f}x (goal <= 1.15x)")
    print(f"  CKA sums {s['cka sums'] / s['compare']:.2%} of the comparison (goal < 5%)")
    print(f"  head similarity {s['head similarity'] / s['compare']:.2%} of the comparison")
    if not args.skip_rss:
        low, high = peak_rss_mb(args, args.rss_from), peak_rss_mb(args, args.rss_to)
        print(
            f"peak RSS ({' '.join(args.rss_models)}): {low:.0f} MB on {args.rss_from} images, {high:.0f} MB on "
            f"{args.rss_to}: +{high - low:.0f} MB (goal <= 200 MB)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
