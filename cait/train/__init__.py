"""Training: `python -m cait.train` on the command line, `run(train_args(...))` from Python.

The loop is `loop`, the flags `args`, the training images `data` and `augment`, the seeding that makes a
resume exact `seeding`, a run directory's files `runs`, distillation teachers `teacher`, and a trained
model's head-bias calibration `calibration`.
"""

from .args import train_args
from .loop import Diverged, RunResult, main, run

__all__ = ["Diverged", "RunResult", "main", "run", "train_args"]
