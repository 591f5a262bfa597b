"""Peak memory of `python -m cait.evaluate` over one batch: the explanation methods in chunks of
`cait.evaluate.core.METHOD_CHUNK` images (today) against the whole batch at once (before issue 51), each in a
process of its own, in one run.

    OMP_NUM_THREADS=1 python benchmarks/evaluate_memory.py [--batch-size 32] [--methods saliency rollout_raw]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHILD = (
    "import resource, sys; import cait.evaluate.core as core; core.METHOD_CHUNK = int(sys.argv[1]); "
    "from cait.evaluate.__main__ import main; code = main(sys.argv[2:]); "
    "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(code)"
)


def peak_rss_mb(chunk: int, command: list[str]) -> float:
    """Peak RSS (MB) of one evaluate command whose methods see `chunk` images at a time."""
    proc = subprocess.run([sys.executable, "-c", CHILD, str(chunk), *command], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return int(proc.stdout.split("peak_rss_kb")[-1]) / 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cait_micro_136", help="default: the default model, with its weights")
    p.add_argument("--batch-size", type=int, default=32, help="one batch of this many scenes (default 32)")
    p.add_argument("--methods", nargs="+", default=["saliency", "rollout_raw"], help="default: saliency rollout_raw")
    args = p.parse_args(argv)
    from cait.evaluate.core import METHOD_CHUNK

    n = str(args.batch_size)
    command = ["--model", args.model, "--limit", n, "--batch-size", n, "--attribution-subset", n, "--workers", "0"]
    command += ["--methods", *args.methods]
    chunked, whole = peak_rss_mb(METHOD_CHUNK, command), peak_rss_mb(args.batch_size, command)
    print(
        f"peak RSS of evaluate on one batch of {n} ({args.model}, {' '.join(args.methods)}): {chunked:.0f} MB with "
        f"the methods in chunks of {METHOD_CHUNK}, {whole:.0f} MB with the whole batch at once ({whole / chunked:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
