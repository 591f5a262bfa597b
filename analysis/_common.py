"""Shared plumbing of the analysis scripts: arguments, loading the model and saying what a figure was
made from, the example images, and writing PNG (matplotlib) + HTML (plotly, self-contained) + numbers.

Every figure carries a "made from" line: architecture only, which checkpoint (and what it was trained
on, from its metadata), random init when the shipped weights are missing, or a miniature retraining.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, NoReturn

import torch
from PIL import Image

import cait
from cait.checkpoint import CheckpointError
from cait.config import DEFAULT_MODEL, CaiTConfig
from cait.data import DataError
from cait.hub import weights_status
from cait.runs import RunDir, checkpoint_metadata

EXAMPLES_DIR = Path(cait.__file__).resolve().parent / "examples"
REPO = Path(__file__).resolve().parent.parent


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr and exit code 2, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parser(name: str, doc: str, *, model: bool = True) -> argparse.ArgumentParser:
    """The common flags: --out and --quick, and with model=True --checkpoint / --model."""
    p = argparse.ArgumentParser(prog=f"python analysis/{name}.py", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if model:
        p.add_argument("--checkpoint", default=None,
                       help=f"weights file (ours, timm or official deit); default: the shipped {DEFAULT_MODEL} "
                            f"(random init, said on every figure, while its weights are not there)")
        p.add_argument("--model", default=None, help="variant name (see cait.list_models()); needed with a "
                       "checkpoint that does not carry its config (timm/deit files)")
        p.add_argument("--pretrained", action="store_true", help="the variant's pretrained weights: for a paper "
                       "variant timm's official ones from the local Hugging Face cache, downloaded once when missing "
                       "(HF_HUB_OFFLINE=1: the cache only)")
    p.add_argument("--out", type=Path, default=Path("out") / name, help=f"output directory (default: out/{name})")
    p.add_argument("--quick", action="store_true", help="smallest run that exercises everything (for tests)")
    return p


# ----------------------------------------------------------------------------------------------------
# model and provenance

@dataclass
class Loaded:
    model: cait.CaiT
    made_from: str   # one line stating what the numbers come from, printed on every figure
    trained: bool    # False for random init


def describe_architecture(cfg: CaiTConfig) -> str:
    return (f"{cfg.img_size}px, patch {cfg.patch_size}, dim {cfg.embed_dim}, {cfg.depth} SA + "
            f"{cfg.depth_token_only} CA, {cfg.num_heads} heads, residual {cfg.residual_scale}")


def describe_checkpoint(path: Path, cfg: CaiTConfig) -> str:
    """'<file> (<architecture>; trained N epochs on DATA, val top-1 X%)' from what the file says."""
    meta = checkpoint_metadata(path)
    training = []
    epochs = meta.get("epochs_completed", meta.get("epoch"))
    if epochs:
        training.append(f"{epochs} epochs")
    if meta.get("data"):
        training.append(f"on {meta['data']}")
    if meta.get("val_top1") not in (None, "None"):
        training.append(f"val top-1 {float(meta['val_top1']):.1f}%")
    trained = f"; trained {' '.join(training)}" if training else ""
    return f"{path.name} ({describe_architecture(cfg)}{trained})"


def load_model(args: argparse.Namespace) -> Loaded:
    """The model the flags ask for. --checkpoint: that file. --pretrained: the variant's pretrained weights
    (shipped, or timm's official ones, downloaded when not in the local cache), else a one-line error.
    Neither: the shipped weights of --model (default cait_nano_64), or a paper variant's official weights
    when already in the local cache; when there are none, random init, loudly, rather than no figure."""
    name = args.model
    try:
        if args.checkpoint is not None:
            model = cait.create_model(name, args.checkpoint)
            path = Path(args.checkpoint)
            made = f"checkpoint {describe_checkpoint(path, model.cfg)}"
            return Loaded(model, made + _scale_note(model.cfg), trained=True)
        name = name or DEFAULT_MODEL
        status = weights_status(name)
        if not args.pretrained and status.path is None:
            torch.manual_seed(0)
            model = cait.create_model(name)
            hint = "; --pretrained downloads them" if status.where == "download" else ""
            print(f"WARNING: no weights for {name} here ({status.describe()}{hint}); using RANDOM INIT "
                  f"(figures say so)", file=sys.stderr)
            return Loaded(model, f"RANDOM INIT {name} ({describe_architecture(model.cfg)}): no shipped or cached "
                                 f"weights, NOT a trained model", trained=False)
        model = cait.create_model(name, pretrained=True)
        if status.where == "shipped":
            made = f"shipped {name} weights {describe_checkpoint(status.path, model.cfg)}"
        else:
            made = f"official {name} weights, timm's {model.source} ({describe_architecture(model.cfg)})"
        return Loaded(model, made + _scale_note(model.cfg), trained=True)
    except (CheckpointError, ValueError, TypeError) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)


def _scale_note(cfg: CaiTConfig) -> str:
    # Our Fashion-MNIST models are miniatures: never let their figures pass for the paper's.
    return "" if cfg.labels == "imagenet" else " - a miniature model, not the paper's ImageNet one"


# ----------------------------------------------------------------------------------------------------
# images

@dataclass
class Example:
    name: str                     # file stem
    image: Image.Image            # RGB, as the model sees it (resized and centre-cropped, not normalised)
    label: int | None             # true class, when the image comes with an examples.json entry
    box: torch.Tensor | None      # [4] x0, y0, x1, y1 in model-input pixels, when known


def _annotations(directory: Path) -> dict[str, dict]:
    index = directory / "examples.json"
    if not index.is_file():
        return {}
    data = json.loads(index.read_text())
    canvas = data.get("canvas")
    return {e["file"]: {**e, "canvas": canvas} for e in data.get("examples", [])}


def load_examples(paths: Iterable[str | os.PathLike] | None, cfg: CaiTConfig, *, limit: int | None = None) -> list[Example]:
    """Images to explain: `paths`, or the shipped example scenes. Labels and boxes come from an
    examples.json next to an image (as shipped in cait/examples), boxes rescaled to the model input."""
    from torchvision.transforms import v2 as T

    files = sorted(EXAMPLES_DIR.glob("*.png")) if not paths else [Path(p) for p in paths]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        fail(f"image(s) not found: {', '.join(missing)}")
    files = files[:limit] if limit else files
    view = T.Compose([T.Resize(int(cfg.img_size / cfg.crop_pct), interpolation=T.InterpolationMode.BICUBIC,
                               antialias=True), T.CenterCrop(cfg.img_size)])
    out = []
    for f in files:
        try:
            with Image.open(f) as im:
                original = im.convert("RGB")
        except Exception as e:
            fail(f"{f}: not a readable image ({type(e).__name__})")
        note = _annotations(f.parent).get(f.name, {})
        box = None
        # A box is only valid if the image is square (the eval resize then scales both axes alike).
        if "box_xyxy" in note and original.width == original.height:
            box = torch.tensor(note["box_xyxy"], dtype=torch.float32) * (cfg.img_size / original.width)
        out.append(Example(f.stem, view(original), note.get("label"), box))
    return out


def default_images(cfg: CaiTConfig) -> list[Path] | None:
    """The images a figure shows when none are given: real photos for an ImageNet model (cait.photos),
    None (the shipped example scenes) for our Fashion-MNIST models."""
    if cfg.labels != "imagenet":
        return None
    from cait.photos import available_photos
    return [path for _, path in available_photos()] or None


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
    fig.text(0.005, 0.004, f"made from: {made_from}", fontsize=7, color="#444", ha="left", va="bottom", wrap=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
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
# One light recipe for every run of a comparison, so that only the ablated setting differs between runs.
RECIPE = {"warmup_epochs": 1.0, "mixup": 0.0, "cutmix": 0.0, "randaug": "none", "reprob": 0.0, "crop_scale": 0.8,
          "seed": 0, "workers": 0}


def add_budget_flags(p: argparse.ArgumentParser, *, epochs: int, subset: int) -> None:
    """The training budget, the same for every run of a sweep."""
    g = p.add_argument_group("training budget (the same for every run)")
    g.add_argument("--data", default="fashion-mnist", choices=("fashion-mnist", "fashion-mnist-scenes"),
                   help="training data (default fashion-mnist: from scratch, models stay at chance on the scenes "
                        "for their first ~60k images, longer than a CPU sweep's budget per run)")
    g.add_argument("--epochs", type=int, default=epochs, help=f"epochs per run (default {epochs})")
    g.add_argument("--subset", type=int, default=subset, help=f"training images per run (default {subset})")
    g.add_argument("--val-subset", type=int, default=2000, help="validation images (default 2000)")
    g.add_argument("--batch-size", type=int, default=64)
    g.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    g.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    g.add_argument("--fresh", action="store_true", help="retrain runs that already finished in OUT/runs")


def budget(args: argparse.Namespace, *, quick_epochs: int = 1) -> dict[str, Any]:
    """The cait.train flags of the budget; --quick shrinks it to seconds."""
    if args.quick:
        args.epochs, args.subset, args.val_subset, args.batch_size = quick_epochs, 64, 32, 32
    return {"data": args.data, "epochs": args.epochs, "subset": args.subset, "val_subset": args.val_subset,
            "batch_size": args.batch_size, "lr": args.lr, "threads": args.threads}


def budget_note(args: argparse.Namespace) -> str:
    data = {"fashion-mnist": "Fashion-MNIST", "fashion-mnist-scenes": "Fashion-MNIST scenes"}[args.data]
    return (f"{data}, first {args.subset} training images, {args.epochs} epoch(s), batch {args.batch_size}, "
            f"lr {args.lr:g}, seed 0, val on {args.val_subset} images")


@dataclass
class SweepRun:
    name: str
    run: Path
    flags: dict[str, Any]   # the cait.train flags (by name) that made it
    diverged: bool          # stopped on a non-finite loss (the paper's dagger)
    val_top1: list[float]   # per finished epoch
    params: int
    macs: int               # multiply-accumulates of one forward

    @property
    def final_top1(self) -> float | None:
        return self.val_top1[-1] if self.val_top1 else None


def _finished(run: Path, args: argparse.Namespace) -> dict | None:
    """sweep.json of a run that finished with these flags (as its args.json records them), else None."""
    from cait.train import same_run
    try:
        record = json.loads((run / "sweep.json").read_text())
        saved = RunDir(run).read_args()
    except (OSError, ValueError):
        return None
    return record if same_run(saved, args) else None


def _train(name: str, args: argparse.Namespace, run: Path) -> bool:
    """Train one run from scratch in this process (one torch import for the whole sweep), its output into
    its train.log; True when it diverged. Any other failure ends the sweep with one line."""
    import contextlib
    import shutil

    from cait import train
    if run.exists():
        shutil.rmtree(run)  # never mix the epochs of two trainings
    run.mkdir(parents=True)
    with open(run / "train.log", "w") as log, contextlib.redirect_stderr(log), contextlib.redirect_stdout(log):
        try:
            result = train.run(args)
        except train.Diverged as e:
            print(f"diverged: {e}", file=log)
            return True
        except (DataError, CheckpointError) as e:
            result = e
    if isinstance(result, Exception):
        fail(f"training run {name}: {str(result).splitlines()[0]} (log: {run / 'train.log'})")
    if not result.finished:
        fail(f"training run {name} stopped early ({result.stopped_by}); run the sweep again to retrain it")
    return False


def _train_one(name: str, flags: dict[str, Any], run: Path, fresh: bool) -> SweepRun:
    from cait import train
    try:
        args = train.train_args(**flags, output=run)
    except train.ArgsError as e:
        fail(f"training run {name}: {e}")
    record = None if fresh else _finished(run, args)
    if record is None:
        record = {"flags": train.to_argv(flags), "diverged": _train(name, args, run)}
        write_json(run / "sweep.json", record)
    model = cait.CaiT(train.model_config(args))  # also for a run that diverged in epoch 1
    curve = [line["val_top1"] for line in RunDir(run).read_metrics() if line.get("val_top1") is not None]
    return SweepRun(name, run, flags, record["diverged"], curve, model.num_params(), model.flops())


def train_runs(plan: dict[str, dict[str, Any]], out: Path, args: argparse.Namespace) -> dict[str, SweepRun]:
    """Train every run of `plan` (name -> cait.train flags by name) into OUT/runs/NAME, one after another,
    each run's log in its train.log. A run that finished before with the same flags is reused, so an
    interrupted sweep continues where it stopped (--fresh retrains). A run that stops on a non-finite loss
    is a result: diverged."""
    from tqdm import tqdm

    results = {}
    with tqdm(plan.items(), desc="runs", unit="run", file=sys.stderr) as bar:
        for name, flags in bar:
            bar.set_postfix_str(f"training {name} (log: {out / 'runs' / name / 'train.log'})")
            results[name] = _train_one(name, flags, out / "runs" / name, args.fresh)
    return results
