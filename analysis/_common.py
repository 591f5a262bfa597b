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
from cait.checkpoint import CONFIG_KEY, CheckpointError
from cait.config import DEFAULT_MODEL, CaiTConfig
from cait.hub import weights_status

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


def _metadata(path: Path) -> dict[str, str]:
    """Our safetensors metadata (config, epochs, data, val_top1); {} for other formats."""
    try:
        from safetensors import safe_open
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception:  # timm/deit .pth files have no metadata; the loader reports real problems
        return {}


def describe_architecture(cfg: CaiTConfig) -> str:
    return (f"{cfg.img_size}px, patch {cfg.patch_size}, dim {cfg.embed_dim}, {cfg.depth} SA + "
            f"{cfg.depth_token_only} CA, {cfg.num_heads} heads, residual {cfg.residual_scale}")


def describe_checkpoint(path: Path, cfg: CaiTConfig) -> str:
    """'<file> (<architecture>; trained N epochs on DATA, val top-1 X%)' from what the file says."""
    meta = _metadata(path)
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


def run_config(run_dir: Path) -> CaiTConfig | None:
    """The config a training run saved with its weights (last/best.safetensors), if any."""
    for name in ("last.safetensors", "best.safetensors"):
        meta = _metadata(run_dir / name)
        if CONFIG_KEY in meta:
            return CaiTConfig.from_dict(json.loads(meta[CONFIG_KEY]))
    return None


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
MINIATURE = ["--model", "cait_nano_64", "--img-size", "32", "--patch-size", "8", "--embed-dim", "96", "--num-heads", "2"]
QUICK_MINIATURE = ["--model", "cait_pico_32"]  # seconds per run, for tests
# One light recipe for every run of a comparison, so that only the ablated setting differs between runs.
RECIPE = ["--warmup-epochs", "1", "--mixup", "0", "--cutmix", "0",
          "--randaug", "none", "--reprob", "0", "--crop-scale", "0.8", "--seed", "0", "--workers", "0"]


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


def budget(args: argparse.Namespace, *, quick_epochs: int = 1) -> list[str]:
    """The cait.train flags of the budget; --quick shrinks it to seconds."""
    if args.quick:
        args.epochs, args.subset, args.val_subset, args.batch_size = quick_epochs, 64, 32, 32
    return ["--data", args.data, "--epochs", str(args.epochs), "--subset", str(args.subset), "--val-subset", str(args.val_subset),
            "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--threads", str(args.threads)]


def budget_note(args: argparse.Namespace) -> str:
    data = {"fashion-mnist": "Fashion-MNIST", "fashion-mnist-scenes": "Fashion-MNIST scenes"}[args.data]
    return (f"{data}, first {args.subset} training images, {args.epochs} epoch(s), batch {args.batch_size}, "
            f"lr {args.lr:g}, seed 0, val on {args.val_subset} images")


@dataclass
class RunResult:
    name: str
    run: Path
    flags: list[str]        # the cait.train flags that made it
    diverged: bool          # stopped on a non-finite loss (the paper's dagger)
    val_top1: list[float]   # per finished epoch
    params: int
    macs: int               # multiply-accumulates of one forward

    @property
    def final_top1(self) -> float | None:
        return self.val_top1[-1] if self.val_top1 else None


def _finished(run: Path, flags: list[str]) -> dict | None:
    try:
        record = json.loads((run / "sweep.json").read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("flags") == flags else None


def _train_one(name: str, flags: list[str], run: Path, fresh: bool) -> RunResult:
    import contextlib
    import shutil

    from cait import train

    record = None if fresh else _finished(run, flags)
    if record is None:
        if run.exists():
            shutil.rmtree(run)  # never mix the epochs of two trainings
        run.mkdir(parents=True)
        # In this process (one torch import for the whole sweep), its output into the run's log.
        with open(run / "train.log", "w") as log, contextlib.redirect_stderr(log), contextlib.redirect_stdout(log):
            try:
                code = train.main([*flags, "--output", str(run)])
            except SystemExit as e:  # a flag cait.train refuses
                code = e.code if isinstance(e.code, int) else 2
        tail = (run / "train.log").read_text()[-3000:]
        diverged = code == 1 and "error: loss is" in tail
        if code != 0 and not diverged:
            fail(f"training run {name} failed (exit {code}); its log {run / 'train.log'} ends:\n{tail[-1500:]}")
        record = {"flags": flags, "diverged": diverged}
        write_json(run / "sweep.json", record)
    metrics = run / "metrics.jsonl"
    lines = [json.loads(l) for l in metrics.read_text().splitlines() if l.strip()] if metrics.is_file() else []
    model = cait.CaiT(train.model_config(train.parse_args(flags)))  # also for a run that diverged in epoch 1
    return RunResult(name, run, flags, record["diverged"], [l["val_top1"] for l in lines if l.get("val_top1") is not None],
                     model.num_params(), model.flops())


def train_runs(plan: dict[str, list[str]], out: Path, args: argparse.Namespace) -> dict[str, RunResult]:
    """Train every run of `plan` (name -> cait.train flags) into OUT/runs/NAME, one after another, each
    run's log in its train.log. A run that finished before with the same flags is reused, so an interrupted
    sweep continues where it stopped (--fresh retrains). A run that stops on a non-finite loss is a result:
    diverged."""
    from tqdm import tqdm

    results = {}
    with tqdm(plan.items(), desc="runs", unit="run", file=sys.stderr) as bar:
        for name, flags in bar:
            bar.set_postfix_str(f"training {name} (log: {out / 'runs' / name / 'train.log'})")
            results[name] = _train_one(name, flags, out / "runs" / name, args.fresh)
    return results
