"""Two models side by side over the same images: what changed between them, block by block, head by head and
image by image.

    python -m cait.compare --model-a cait_micro_136 --model-b cait_nano_28 --data DIR [--boxes boxes.json] --out OUT
    torchrun --nproc-per-node 2 -m cait.compare ... --out OUT        # the images shared over processes
    python -m cait.compare --atlas-a ATLAS1 --atlas-b ATLAS2 --out OUT   # two atlases of the same images

- blocks: linear CKA between every block of A and every block of B (`cait.compare.cka`: the minibatch unbiased
  HSIC estimator, memory flat in the number of images), on the mean patch token after each SA block and the
  class token after each CA block; the two may differ in width, grid and image size;
- heads: every CA head of A against every CA head of B by the mean Spearman correlation of their maps on the
  image's pixels, and the one-to-one matching of the heads (`cait.compare.heads`);
- answers: top-1 of each, agreement, per class with McNemar's exact test, the confusions that changed
  (`cait.compare.stats`); per matched head pair the atlas's numbers of both with a paired bootstrap interval.

`run_compare(CompareOptions(...))` makes a run (the command line's work, with a progress callback and a Stop);
`read_run(folder)` reads a finished one as a `CompareRun`. The files are described in `cait.compare.files`.
"""

from __future__ import annotations

from ..lazy import lazy_attributes
from .files import CompareRun, CompareRunError, Disagreement, read_run
from .options import CompareError, CompareOptions, Side

__getattr__ = lazy_attributes(__name__, {"run_compare": "run"})

__all__ = [
    "CompareError",
    "CompareOptions",
    "CompareRun",
    "CompareRunError",
    "Disagreement",
    "Side",
    "read_run",
    "run_compare",
]
