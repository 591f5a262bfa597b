"""Shared plumbing of the analysis scripts: arguments, loading the model and saying what a figure was
made from, the example images, and writing PNG (matplotlib) + HTML (plotly, self-contained) + numbers.

Every figure carries a "made from" line: which checkpoint (and what it was trained on, from its metadata),
shipped or official weights, a random init (only with --random-init, when there are no weights), or a
miniature retraining.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NoReturn, ParamSpec, TypeVar

import torch
from PIL import Image

import cait
from cait.config import DEFAULT_MODEL, CaiTConfig
from cait.data import DataError, data_name, read_examples
from cait.data.image_file import IMAGE_ERRORS, read_image, unreadable_reason
from cait.errors import InputError
from cait.flags import add_model_flags, add_precision_flag, add_threads_flag
from cait.preprocess import model_view
from cait.runs import RunDir, write_text
from cait.runtime import autocast, inference_dtype

P = ParamSpec("P")
R = TypeVar("R")
REPO = Path(__file__).resolve().parent.parent


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr and exit code 2, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parser(
    name: str, doc: str, *, model: bool = True, precision: bool = True, images: bool = False, out: str | None = None
) -> argparse.ArgumentParser:
    """The common flags of analysis/<name>.py: --out (default out/<out or name>) and --quick; with model=True
    the model flags and, unless precision=False (a script that runs everything in fp32), the precision flags;
    with images=True --images (the images to explain)."""
    out = out or name
    p = argparse.ArgumentParser(
        prog=f"python analysis/{name}.py", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if model:
        add_model_flags(
            p,
            checkpoint_help=f"weights file (ours, timm or official deit); default: the shipped {DEFAULT_MODEL}",
        )
    if model and precision:
        add_precision_flag(
            p,
            default="fp32",
            help="forward passes whose maps are drawn (class attention, top-1): fp32 (default: the JSON "
            "files are reference numbers), bf16 autocast, or auto = bf16 where it measures faster "
            "than fp32 here; gradient methods always run in fp32",
        )
    if images:
        p.add_argument(
            "--images",
            nargs="+",
            default=None,
            help="image files (default: the shipped example scenes; for an ImageNet model, real photos: "
            "cait.data.photos)",
        )
    p.add_argument("--out", type=Path, default=Path("out") / out, help=f"output directory (default: out/{out})")
    p.add_argument("--quick", action="store_true", help="smallest run that exercises everything (for tests)")
    return p


# ----------------------------------------------------------------------------------------------------
# model and provenance


def calm(main: Callable[P, R]) -> Callable[P, R]:
    """A script's main whose input errors (`cait.InputError`: a model name, a file, a flag, an image) end it in
    one line and exit code 2 (`fail`); any other exception is a bug and keeps its traceback."""

    @functools.wraps(main)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return main(*args, **kwargs)
        except InputError as e:
            fail(str(e).splitlines()[0] if str(e) else type(e).__name__)

    return run


def inference_dtype_of(args: argparse.Namespace) -> torch.dtype | None:
    """The autocast dtype --precision asks for on the CPU, where the scripts run (None: fp32)."""
    return inference_dtype(args.precision, torch.device("cpu"), remeasure=args.remeasure_precision)


def forward_only(args: argparse.Namespace):
    """No autograd and --precision, for the passes whose numbers are only drawn."""
    from contextlib import ExitStack

    stack = ExitStack()
    stack.enter_context(torch.inference_mode())
    stack.enter_context(autocast(inference_dtype_of(args), torch.device("cpu")))
    return stack


# ----------------------------------------------------------------------------------------------------
# images


@dataclass
class Example:
    name: str  # file stem
    image: Image.Image  # RGB, as the model sees it (`cait.preprocess.model_view`, not normalised)
    label: int | None  # true class, when the image comes with an examples.json entry
    box: torch.Tensor | None  # [4] x0, y0, x1, y1 in model-input pixels, when known


def load_examples(
    paths: Iterable[str | os.PathLike] | None, cfg: CaiTConfig, *, limit: int | None = None
) -> list[Example]:
    """Images to explain: `paths`, or the shipped example scenes. Labels and boxes come from an
    examples.json next to an image (as shipped in cait/examples), boxes rescaled to the model input."""
    files = read_examples(paths or None)
    missing = [str(f.path) for f in files if not f.path.is_file()]
    if missing:
        fail(f"image(s) not found: {', '.join(missing)}")
    out = []
    for f in files[:limit] if limit else files:
        try:
            original = read_image(f.path, mode=cfg.image_mode)
        except IMAGE_ERRORS as e:
            fail(f"{f.path}: not a readable image ({unreadable_reason(e)})")
        box = None
        # A box is only valid if the image is square (the eval resize then scales both axes alike).
        if f.box is not None and original.width == original.height:
            box = cfg.box_to_input(torch.tensor(f.box, dtype=torch.float32), original.width)
        out.append(Example(f.path.stem, model_view(original, cfg).convert("RGB"), f.label, box))
    return out


def default_images(cfg: CaiTConfig) -> list[Path] | None:
    """The images a figure shows when none are given: real photos for an ImageNet model (cait.data.photos),
    None (the shipped example scenes) for our Fashion-MNIST models."""
    if not cfg.is_imagenet:
        return None
    from cait.data.photos import available_photos

    return [path for _, path in available_photos()] or None


def add_data_flags(p: argparse.ArgumentParser, *, default: str) -> None:
    """--data/--boxes/--limit (`--scenes` is the same flag as --limit): the images a script averages over,
    read by `cait.data.read_images`. `default`: what the script uses without --data, for the help."""
    cait.flags.add_data_flags(
        p.add_argument_group("data (cait.data.read_images)"),
        help="fashion-mnist-scenes, fashion-mnist, or a folder of images (class folders, or a flat folder: no "
        f"labels); default: {default}",
        boxes_metavar="FILE",
        limit="only the first N images (--scenes: the same)",
        limit_aliases=("--scenes",),
        sample=None,
    )


def read_data(args: argparse.Namespace, cfg: CaiTConfig, *, limit: int | None = None, normalise: bool = True):
    """The ImageSet --data/--boxes/--limit ask for (`limit`: the count when --limit is not given); bad data is
    one line and exit code 2."""
    from cait.data import read_from_flags

    if args.limit is not None and args.limit <= 0:
        fail("--limit must be positive")
    try:
        return read_from_flags(args, cfg, limit=limit, normalise=normalise)
    except DataError as e:
        fail(str(e))


def readable_batches(data, size: int, skipped: list[str]) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(x, labels, boxes) of the readable images of an ImageSet, `size` at a time; the paths of the unreadable
    ones are added to `skipped` (named in the scripts' JSON)."""
    from torch.utils.data import DataLoader

    for x, y, boxes, index, ok in DataLoader(data, batch_size=size, num_workers=0):
        skipped += [data.paths[i] for i in index[~ok].tolist()]
        if ok.any():
            yield x[ok], y[ok], boxes[ok]


def made_from_data(made_from: str, data_name: str) -> str:
    """The provenance line of a figure made over a dataset: the model's line and the data's name."""
    return f"{made_from}; data: {data_name}"


def batch_of(examples: list[Example], cfg: CaiTConfig) -> torch.Tensor:
    from cait.preprocess import to_batch

    return to_batch([e.image for e in examples], cfg)


# ----------------------------------------------------------------------------------------------------
# writing


def out_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"cannot create output directory {path}: {e.strerror}")
    return path


def save_png(fig, path: Path, made_from: str, *, dpi: int = 110) -> Path:
    """Matplotlib figure -> PNG with the provenance line along the bottom."""
    import matplotlib.pyplot as plt

    # Below the figure, not on it (the PNG's box grows to take it in): however many lines the line wraps
    # to, it cannot overlap what the figure draws along its bottom edge.
    fig.text(0.005, 0, f"made from: {made_from}", fontsize=7, color="#444", ha="left", va="top", wrap=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight", pad_inches=0.08)
    plt.close(fig)
    return path


def save_image(image: Image.Image, path: Path, made_from: str) -> Path:
    """PIL image -> PNG with the provenance line in a strip along the bottom."""
    from PIL import ImageDraw

    from cait.figures.attention import load_font

    font = load_font(11)
    text = f"made from: {made_from}"
    width = max(image.width, int(ImageDraw.Draw(image).textlength(text, font=font)) + 12)
    sheet = Image.new("RGB", (width, image.height + 18), "white")
    sheet.paste(image, (0, 0))
    ImageDraw.Draw(sheet).text((6, image.height + 3), text, fill="#444", font=font)
    sheet.save(path, format="PNG")
    return path


def save_html(fig, path: Path, made_from: str) -> Path:
    """Plotly figure -> one self-contained HTML file (plotly.js embedded: works offline), with the
    provenance line under the title."""
    title = fig.layout.title.text or ""
    fig.update_layout(title=dict(text=f"{title}<br><sup>made from: {made_from}</sup>"))
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, indent=1))
    return path


def read_saved(path: Path, *keys: str) -> tuple:
    """The values of `keys` in a JSON file a script wrote (what --replot draws again from); a file that is
    missing, unreadable or without one of them is one line and exit code 2."""
    try:
        saved = json.loads(path.read_text())
        return tuple(saved[k] for k in keys)
    except (OSError, ValueError, KeyError) as e:
        fail(f"cannot replot from {path}: {e}")


def write_csv(path: Path, rows: list[dict]) -> Path:
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def matplotlib_pyplot():
    """pyplot on the file-only backend (the scripts run headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ----------------------------------------------------------------------------------------------------
# miniature retraining (residual_ratio, depth_stability, class_attention_ablation)

# The miniature these scripts train: CaiT blocks at a width and input size that a CPU trains in minutes
# (32 px input, 4x4 patches of 8 px, dim 96, 2 heads of 48 like the paper's).
# Runs are given as cait.train flags by name (cait.train.train_args), e.g. {"depth": 12, "residual_scale": "none"}.
MINIATURE = {"model": "cait_nano_64", "img_size": 32, "patch_size": 8, "embed_dim": 96, "num_heads": 2}
QUICK_MINIATURE = {"model": "cait_pico_32"}  # seconds per run, for tests


def miniature(quick: bool) -> dict[str, Any]:
    """The cait.train flags of the miniature (QUICK_MINIATURE with --quick)."""
    return dict(QUICK_MINIATURE if quick else MINIATURE)


def miniature_name(quick: bool) -> str:
    """What the miniature is, for the figures' "made from" lines."""
    if quick:
        return QUICK_MINIATURE["model"]
    m = MINIATURE
    return f"CaiT {m['img_size']}px, patch {m['patch_size']}, dim {m['embed_dim']}, {m['num_heads']} heads"


# One light recipe for every run of a comparison, so that only the ablated setting differs between runs.
RECIPE = {
    "warmup_epochs": 1.0,
    "mixup": 0.0,
    "cutmix": 0.0,
    "randaug": "none",
    "reprob": 0.0,
    "crop_scale": 0.8,
    "seed": 0,
    "workers": 0,
}


def add_budget_flags(
    p: argparse.ArgumentParser, *, epochs: int, subset: int, lr: bool = True, runs: str = "every run"
) -> None:
    """The training budget, the same for `runs` of a sweep (lr=False: a sweep that sets --lr per run)."""
    g = p.add_argument_group(f"training budget (the same for {runs})")
    g.add_argument(
        "--data",
        default="fashion-mnist",
        choices=("fashion-mnist", "fashion-mnist-scenes"),
        help="training data (default fashion-mnist: from scratch, models stay at chance on the scenes "
        "for their first ~60k images, longer than a CPU sweep's budget per run)",
    )
    g.add_argument("--epochs", type=int, default=epochs, help=f"epochs per run (default {epochs})")
    g.add_argument("--subset", type=int, default=subset, help=f"training images per run (default {subset})")
    g.add_argument("--val-subset", type=int, default=2000, help="validation images (default 2000)")
    g.add_argument("--batch-size", type=int, default=64)
    if lr:
        g.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    add_threads_flag(g, default=1, help="torch threads per run (default 1)")
    g.add_argument("--fresh", action="store_true", help="retrain runs that already finished in OUT/runs")


def budget(args: argparse.Namespace, *, quick_epochs: int = 1) -> dict[str, Any]:
    """The cait.train flags of the budget; --quick shrinks it to seconds."""
    if args.quick:
        args.epochs, args.subset, args.val_subset, args.batch_size = quick_epochs, 64, 32, 32
    flags = {
        "data": args.data,
        "epochs": args.epochs,
        "subset": args.subset,
        "val_subset": args.val_subset,
        "batch_size": args.batch_size,
        "threads": args.threads,
    }
    return {**flags, "lr": args.lr} if "lr" in vars(args) else flags


def budget_note(args: argparse.Namespace) -> str:
    return (
        f"{data_name(args.data)}, first {args.subset} training images, {args.epochs} epoch(s), "
        f"batch {args.batch_size}, lr {args.lr:g}, seed 0, val on {args.val_subset} images"
    )


@dataclass
class SweepRun:
    name: str
    run: Path
    flags: dict[str, Any]  # the cait.train flags (by name) that made it
    divergence: dict | None  # where the loss became non-finite (cait.train.Diverged: epoch, step, loss)
    val_top1: list[float]  # per finished epoch, fractions in [0, 1]
    params: int
    macs: int  # multiply-accumulates of one forward

    @property
    def diverged(self) -> bool:
        """Stopped on a non-finite loss (the paper's dagger)."""
        return self.divergence is not None

    @property
    def final_top1(self) -> float | None:
        return self.val_top1[-1] if self.val_top1 else None


def _run_args(name: str, flags: dict[str, Any], run: Path, **more: Any) -> argparse.Namespace:
    from cait.train.args import ArgsError, train_args

    try:
        return train_args(**flags, output=run, **more)
    except ArgsError as e:
        fail(f"training run {name}: {e}")


def _same_flags(run: Path, args: argparse.Namespace) -> bool:
    """Was the run in `run` started with the flags `args` train with (as its args.json records them)?"""
    from cait.train.args import same_run

    try:
        return same_run(RunDir(run).read_args(), args)
    except (OSError, ValueError):
        return False


def _finished(run: Path, args: argparse.Namespace) -> dict | None:
    """sweep.json of a run that finished with these flags, else None."""
    try:
        record = json.loads((run / "sweep.json").read_text())
    except (OSError, ValueError):
        return None
    return record if _same_flags(run, args) else None


def _interrupted(run: Path, args: argparse.Namespace) -> bool:
    """Did a run with these flags stop part-way with its state saved (a signal, a kill after an epoch)?"""
    return RunDir(run).is_resumable() and _same_flags(run, args)


def _train(name: str, flags: dict[str, Any], args: argparse.Namespace, run: Path, *, resume: bool) -> dict:
    """Train one run in this process (one torch import for the whole sweep), its output into its train.log,
    continuing it where it stopped when `resume`; returns its sweep record. A non-finite loss is a result
    (cait.train.Diverged, typed: no log parsing); a stop by a signal ends the sweep, to be continued by
    running it again; any other failure ends it with one line."""
    import shutil

    from cait import train
    from cait.train.args import to_argv

    if resume:
        args = _run_args(name, flags, run, resume=run)
    elif run.exists():
        shutil.rmtree(run)  # never mix the epochs of two trainings
    run.mkdir(parents=True, exist_ok=True)
    divergence = None
    with (
        open(run / "train.log", "a" if resume else "w") as log,
        contextlib.redirect_stderr(log),
        contextlib.redirect_stdout(log),
    ):
        try:
            result = train.run(args)
        except train.Diverged as e:
            print(f"diverged: {e}", file=log)
            divergence, result = {"epoch": e.epoch, "step": e.step, "loss": str(e.loss)}, None
        except InputError as e:  # a flag, the data or a file that cannot work
            result = e
    if isinstance(result, Exception):
        fail(f"training run {name}: {str(result).splitlines()[0]} (log: {run / 'train.log'})")
    if result is not None and not result.finished:
        print(
            f"sweep stopped ({result.stopped_by}) in run {name}, its state saved: run the same command again to "
            f"continue it and the runs after it",
            file=sys.stderr,
        )
        raise SystemExit(result.exit_code or 1)
    return {"flags": to_argv(flags), "diverged": divergence is not None, "divergence": divergence}


def _sweep_run(name: str, flags: dict[str, Any], args: argparse.Namespace, run: Path, record: dict) -> SweepRun:
    from cait.train.args import model_config

    model = cait.CaiT(model_config(args))  # also for a run that diverged in epoch 1
    curve = [line["val_top1"] for line in RunDir(run).read_metrics() if line.get("val_top1") is not None]
    # records written before divergences were typed say only diverged: true
    divergence = record.get("divergence") or ({} if record["diverged"] else None)
    return SweepRun(name, run, flags, divergence, curve, model.num_params(), model.flops())


def finished_runs(plan: dict[str, dict[str, Any]], out: Path) -> dict[str, SweepRun]:
    """The runs of `plan` (name -> cait.train flags by name) that finished in OUT/runs with the same flags;
    nothing is trained (so this may look while a sweep is training)."""
    results = {}
    for name, flags in plan.items():
        run = out / "runs" / name
        args = _run_args(name, flags, run)
        record = _finished(run, args)
        if record is not None:
            results[name] = _sweep_run(name, flags, args, run, record)
    return results


@contextlib.contextmanager
def sweep_lock(out: Path) -> Iterator[None]:
    """Held while a sweep trains into `out`: a second sweep into the same directory (which would train the
    same runs over each other, and compete for the cores) is refused with one line. The lock goes with the
    process, however it ends."""
    import fcntl

    with open(out / "sweep.lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            fail(
                f"another sweep is training into {out} (pid {f.read().strip() or '?'}); one training at a time: "
                f"wait for it to end or stop it (it continues where it stopped when started again)"
            )
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def train_runs(
    plan: dict[str, dict[str, Any]], out: Path, args: argparse.Namespace, *, deadline: float | None = None
) -> dict[str, SweepRun]:
    """Train every run of `plan` (name -> cait.train flags by name) into OUT/runs/NAME, one after another,
    each run's log in its train.log. A run that finished before with the same flags is reused, and one
    stopped part-way continues from its saved state, so an interrupted sweep continues where it stopped
    (--fresh retrains from scratch). A run that stops on a non-finite loss is a result: diverged.
    With a `deadline` (time.time()), no run starts after it: the result holds only the finished runs."""
    from tqdm import tqdm

    results = {}
    with sweep_lock(out_dir(out)), tqdm(plan.items(), desc="runs", unit="run", file=sys.stderr) as bar:
        for name, flags in bar:
            run = out / "runs" / name
            run_args = _run_args(name, flags, run)
            record = None if args.fresh else _finished(run, run_args)
            if record is None:
                if deadline is not None and time.time() >= deadline:
                    continue
                bar.set_postfix_str(f"training {name} (log: {run / 'train.log'})")
                record = _train(name, flags, run_args, run, resume=not args.fresh and _interrupted(run, run_args))
                write_text(run / "sweep.json", json.dumps(record, indent=1))  # the last file a finished run gets
            results[name] = _sweep_run(name, flags, run_args, run, record)
    return results
