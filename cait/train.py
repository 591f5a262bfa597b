"""Train a CaiT with the DeiT/CaiT recipe, built from timm's parts.

    python -m cait.train --model cait_nano_64 --data fashion-mnist-scenes --epochs 30 --output runs/nano64
    python -m cait.train --resume runs/nano64                    # continue exactly where it stopped
    torchrun --nproc_per_node=2 -m cait.train --data fashion-mnist --output runs/ddp   # data parallel

Recipe (Touvron et al. 2021, sec. 5 / DeiT): AdamW without weight decay on LayerScale, position
embedding, class token, norms and biases; per-step cosine schedule with linear warmup; RandAugment,
random erasing, Mixup/CutMix with soft-target cross-entropy and label smoothing; uniform stochastic
depth; gradient clipping; model EMA; optional hard distillation from a teacher through the class token.

Everything random is a pure function of --seed: the data order of epoch e comes from (seed, e), the
augmentation of sample i in epoch e from (seed, e, i), and mixup / stochastic depth draw from RNGs
re-seeded from (seed, e, rank) at the start of every epoch and saved in the resume state. So a run that
is stopped (signal, --stop-after) and resumed gives the same weights as one that never stopped.

Writes to --output: last.safetensors, best.safetensors, ema.safetensors (weights + config, loadable by
`cait.create_model(None, checkpoint=...)`), state.pt (everything --resume needs), metrics.jsonl (one
line per epoch, including the paper's LayerScale / residual-ratio / class-attention statistics) and
args.json. Every file is written to a temporary name and renamed, so a kill at any moment leaves the
previous version readable.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler
from tqdm import tqdm

from .checkpoint import CheckpointError, load_into, read_checkpoint, save_weights
from .config import DEFAULT_MODEL, CaiTConfig, get_config, list_models
from .data import DataError, build_dataset
from .explain import layerscale_stats
from .factory import create_model
from .model import CaiT
from .preprocess import eval_transform
from .runtime import AMP_CHOICES, DEVICE_CHOICES, DeviceError, autocast, autocast_dtype, resolve_device

RESIDUAL_KINDS = ("layerscale", "scalar", "rezero", "none")
# flag dest -> CaiTConfig field, for the flags that change the model (the ablations' miniatures)
MODEL_OVERRIDES = {"img_size": "img_size", "patch_size": "patch_size", "embed_dim": "embed_dim", "depth": "depth",
                   "depth_token_only": "depth_token_only", "num_heads": "num_heads", "class_token_at": "class_token_at",
                   "global_pool": "global_pool", "residual_scale": "residual_scale", "init_values": "init_values",
                   "drop_path": "drop_path_rate"}
INSIGHT_BATCH = 64  # fixed validation images on which residual ratios and class-attention entropy are measured


# ----------------------------------------------------------------------------------------------------
# command line

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump, exit 2 like argparse
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m cait.train", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("run")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"variant to train, one of: {', '.join(list_models())}")
    g.add_argument("--data", default="fashion-mnist-scenes",
                   help="fashion-mnist, fashion-mnist-scenes, or a directory with train/<class>/ and val/<class>/ images")
    g.add_argument("--output", default=None, help="directory for checkpoints, state and metrics (default: runs/<model>)")
    g.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run saved in DIR (its args.json supplies every flag not given again)")
    g.add_argument("--epochs", type=int, default=30, help="length of the schedule in epochs")
    g.add_argument("--batch-size", type=int, default=128, help="images per step on each process")
    g.add_argument("--seed", type=int, default=0, help="seed of init, data order, augmentation, mixup and drop path")
    g.add_argument("--subset", type=int, default=None, help="use only the first N training images (smoke tests)")
    g.add_argument("--val-subset", type=int, default=None, help="evaluate on only the first N validation images")
    g.add_argument("--device", default="auto", choices=DEVICE_CHOICES, help="auto = cuda when present")
    g.add_argument("--workers", type=int, default=2, help="data loading processes per training process (0 = inline)")
    g.add_argument("--threads", type=int, default=None,
                   help="torch threads per process (default: torch's choice; 1 is fastest on a busy machine)")
    g.add_argument("--amp", default="auto", choices=AMP_CHOICES,
                   help="autocast dtype; auto = bf16 where the hardware computes it natively (CUDA, or a CPU with "
                        "AVX512-BF16/AMX: ~1.7x faster), else fp32 (on an AVX2-only CPU bf16 is ~12x slower)")
    g.add_argument("--eval-every", type=int, default=1, help="evaluate every N epochs (and always after the last)")
    g.add_argument("--init", default=None, metavar="CHECKPOINT",
                   help="start from these weights (our safetensors, e.g. a shipped model or another run's "
                        "ema.safetensors, or an official deit / timm file) with a fresh optimizer and schedule: fine-tuning, or "
                        "continuing a finished run under a new recipe")
    g.add_argument("--stop-after", type=int, default=None, metavar="STEPS",
                   help="save and stop after this many optimizer steps in total, as if interrupted; "
                        "--resume continues (for time-sliced runs)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default: DeiT's 5e-4 * global batch / 512)")
    g.add_argument("--min-lr", type=float, default=1e-5, help="learning rate at the end of the cosine")
    g.add_argument("--warmup-epochs", type=float, default=5, help="linear warmup from 1e-6, in epochs")
    g.add_argument("--weight-decay", type=float, default=0.05,
                   help="AdamW weight decay (never on LayerScale, pos_embed, cls_token, norms, biases)")
    g.add_argument("--clip-grad", type=float, default=None, help="clip the global gradient norm to this value")
    g.add_argument("--ema", type=float, default=0.0, help="model EMA decay (e.g. 0.999); 0 = off")
    g = p.add_argument_group("augmentation and regularisation")
    g.add_argument("--randaug", default="rand-m9-mstd0.5-inc1", help="timm RandAugment string, or 'none'")
    g.add_argument("--crop-scale", type=float, default=0.25,
                   help="smallest area of the random resized crop (DeiT: 0.08 on ImageNet; small images with one "
                        "object lose it below ~0.25)")
    g.add_argument("--color-jitter", type=float, default=0.4,
                   help="brightness/contrast/saturation jitter when RandAugment is off (timm's default 0.4; 0 = off)")
    g.add_argument("--hflip", type=float, default=0.5, help="horizontal flip probability")
    g.add_argument("--reprob", type=float, default=0.25, help="random erasing probability")
    g.add_argument("--mixup", type=float, default=0.8, help="mixup alpha (0 = off)")
    g.add_argument("--cutmix", type=float, default=1.0, help="cutmix alpha (0 = off)")
    g.add_argument("--smoothing", type=float, default=0.1, help="label smoothing")
    g.add_argument("--drop-path", type=float, default=None, help="stochastic depth rate (default: the model config's)")
    g = p.add_argument_group("model overrides (default: the --model config's) and distillation")
    g.add_argument("--img-size", type=int, default=None, help="input side in pixels (images are resized to it)")
    g.add_argument("--patch-size", type=int, default=None, help="patch side in pixels")
    g.add_argument("--embed-dim", type=int, default=None, help="token width")
    g.add_argument("--depth", type=int, default=None, help="number of self-attention blocks")
    g.add_argument("--depth-token-only", type=int, default=None, help="number of class-attention blocks")
    g.add_argument("--num-heads", type=int, default=None, help="attention heads (must divide --embed-dim)")
    g.add_argument("--class-token-at", type=int, default=None,
                   help="ViT-style class token inserted before SA block K (paper Table 2; use with "
                        "--depth-token-only 0)")
    g.add_argument("--global-pool", default=None, choices=("token", "avg"),
                   help="classify from the class token or from the mean patch token (paper Table 2)")
    g.add_argument("--residual-scale", default=None, choices=RESIDUAL_KINDS,
                   help="residual branch weighting (paper Table 1 ablations)")
    g.add_argument("--init-values", type=float, default=None, help="LayerScale eps")
    g.add_argument("--teacher", default=None, metavar="CHECKPOINT",
                   help="hard distillation from this checkpoint (any file cait.create_model reads), through the "
                        "class token")
    g.add_argument("--distill-alpha", type=float, default=0.5, help="weight of the distillation loss")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the flags; with --resume, the saved run's flags fill in whatever is not given."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.resume is not None:
        saved = Path(args.resume) / "args.json"
        if not (Path(args.resume) / "state.pt").is_file() or not saved.is_file():
            parser.error(f"--resume {args.resume}: no state.pt/args.json there (not a run directory)")
        given = _explicit_flags(parser, argv)
        # what to stop at is a property of one invocation, not of the run
        inherited = {k: v for k, v in json.loads(saved.read_text())["args"].items() if k not in ("stop_after", "threads")}
        # flags added after the run was saved take their defaults
        defaults = vars(parser.parse_args([]))
        args = argparse.Namespace(**{**defaults, **inherited, "stop_after": None, "threads": None, **given})
        args.output = given.get("output", args.resume)
    if args.output is None:
        args.output = str(Path("runs") / args.model)
    args.argv = argv
    for name in ("epochs", "batch_size", "eval_every", "subset", "val_subset", "stop_after", "threads"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.workers < 0:
        parser.error(f"--workers must be >= 0, got {args.workers}")
    if args.lr is not None and not args.lr > 0:
        parser.error(f"--lr must be positive, got {args.lr}")
    if (args.mixup > 0 or args.cutmix > 0) and args.batch_size % 2:
        parser.error(f"mixup/cutmix need an even --batch-size, got {args.batch_size}")
    try:
        model_config(args)
    except ValueError as e:
        parser.error(str(e))
    try:
        resolve_device(args.device)
    except DeviceError as e:
        parser.error(str(e))
    if not 0 <= args.ema < 1:
        parser.error(f"--ema is a decay in [0, 1), got {args.ema}")
    return args


def model_config(args: argparse.Namespace, **fields: Any) -> CaiTConfig:
    """The --model config with the override flags applied; ValueError says what does not fit."""
    overrides = {field: getattr(args, flag) for flag, field in MODEL_OVERRIDES.items()
                 if getattr(args, flag, None) is not None}
    cfg = get_config(args.model, **overrides, **fields)
    for name in ("img_size", "patch_size", "embed_dim", "depth", "num_heads"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}")
    if cfg.depth_token_only < 0:
        raise ValueError(f"--depth-token-only must be >= 0, got {cfg.depth_token_only}")
    if cfg.img_size % cfg.patch_size:
        raise ValueError(f"--img-size {cfg.img_size} is not a multiple of --patch-size {cfg.patch_size}")
    if cfg.embed_dim % cfg.num_heads:
        raise ValueError(f"--num-heads {cfg.num_heads} does not divide --embed-dim {cfg.embed_dim}")
    if cfg.class_token_at is not None and not 0 <= cfg.class_token_at <= cfg.depth:
        raise ValueError(f"--class-token-at must be in [0, depth={cfg.depth}], got {cfg.class_token_at}")
    if cfg.class_token_at is None and cfg.depth_token_only == 0 and cfg.global_pool == "token":
        raise ValueError("with --depth-token-only 0 the class token needs --class-token-at K to take part (or use "
                         "--global-pool avg)")
    return cfg


def _explicit_flags(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    """Only the flags present on the command line (so a resumed run keeps the saved values of the rest)."""
    quiet = build_parser()
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
    return vars(quiet.parse_args(argv))


# ----------------------------------------------------------------------------------------------------
# randomness: every draw is a function of (seed, epoch, ...) so that resuming reproduces it

def derive_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed python/numpy/torch (CPU) for the block, then put their previous states back."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def rng_state() -> dict[str, Any]:
    """The global RNG states as tensors and plain containers, so torch.load(weights_only=True) reads them."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
            "python": [version, list(internal), gauss_next]}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


# ----------------------------------------------------------------------------------------------------
# data

def train_transform(cfg: CaiTConfig, args: argparse.Namespace):
    """timm's DeiT training transform (random resized crop, flip, RandAugment, random erasing) at the
    model's resolution. Augmentation runs on RGB (RandAugment's ops expect it); the image is then put in
    the model's colour mode before normalising with the config's mean/std."""
    from timm.data import create_transform
    from timm.data.random_erasing import RandomErasing
    from torchvision.transforms import v2 as T
    rgb_mean, rgb_std = (tuple(v) * (3 // len(v)) for v in (cfg.mean, cfg.std))  # RandAugment fills with the mean
    primary, secondary, _ = create_transform(
        cfg.img_size, is_training=True, scale=(args.crop_scale, 1.0), hflip=args.hflip,
        auto_augment=None if args.randaug == "none" else args.randaug, interpolation="bicubic",
        color_jitter=args.color_jitter or None,
        mean=rgb_mean, std=rgb_std, separate=True)
    mode = "RGB" if cfg.in_chans == 3 else "L"
    final = T.Compose([T.PILToTensor(), T.ToDtype(torch.float32, scale=True), T.Normalize(cfg.mean, cfg.std),
                       RandomErasing(args.reprob, mode="pixel", device="cpu")])
    pil = T.Compose([*primary.transforms, *secondary.transforms])
    return lambda image: final(pil(image.convert("RGB")).convert(mode))


class Transformed(Dataset):
    """(PIL image, label) dataset -> (tensor, label). With a seed, sample i of epoch e is augmented under
    RNGs seeded from (seed, e, i): the same in any worker, any rank, and after any resume."""

    def __init__(self, data: Dataset, transform, seed: int | None = None):
        self.data, self.transform, self.seed, self.epoch = data, transform, seed, 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, label = self.data[i]
        if self.seed is None:
            return self.transform(image), label
        seed = derive_seed(self.seed, self.epoch, i)
        if torch.utils.data.get_worker_info() is not None:  # a worker's RNGs serve nothing else: no restore
            seed_everything(seed)
            return self.transform(image), label
        with seeded(seed):
            return self.transform(image), label


class EpochSampler(Sampler[int]):
    """Shuffled indices of one epoch, a function of (seed, epoch): padded to a multiple of the world
    size, this rank's share taken, and the first `skip` of them dropped (resuming mid-epoch)."""

    def __init__(self, n: int, *, seed: int, epoch: int, rank: int, world: int, skip: int = 0):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(seed, epoch))).tolist()
        order += order[: (-n) % world]
        self.indices = order[rank::world][skip:]

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)


def _quiet_worker(_: int) -> None:
    # Ctrl+C reaches the whole process group; the main process saves and shuts the workers down itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def make_loader(data: Dataset, *, batch_size: int, sampler, workers: int, drop_last: bool) -> DataLoader:
    return DataLoader(data, batch_size=batch_size, sampler=sampler, num_workers=workers, drop_last=drop_last,
                      worker_init_fn=_quiet_worker if workers else None,
                      generator=torch.Generator().manual_seed(0))  # never touch the global RNG


# ----------------------------------------------------------------------------------------------------
# recipe pieces

def build_optimizer(model: nn.Module, args: argparse.Namespace, lr: float) -> torch.optim.Optimizer:
    from timm.optim import create_optimizer_v2, param_groups_weight_decay
    # 1-d parameters (LayerScale gammas, norms, biases) are excluded by timm; the position embedding and
    # class token are listed by name (timm reads that list from model.no_weight_decay()).
    groups = lambda m: param_groups_weight_decay(m, args.weight_decay, no_weight_decay_list=("pos_embed", "cls_token"))
    return create_optimizer_v2(model, "adamw", lr=lr, weight_decay=args.weight_decay, param_group_fn=groups)


def build_scheduler(optimizer: torch.optim.Optimizer, args: argparse.Namespace, steps_per_epoch: int):
    from timm.scheduler import CosineLRScheduler
    total = args.epochs * steps_per_epoch
    warmup = min(int(round(args.warmup_epochs * steps_per_epoch)), total // 2)  # short runs still get a cosine
    return CosineLRScheduler(optimizer, t_initial=max(total - warmup, 1), lr_min=args.min_lr, warmup_t=warmup,
                             warmup_lr_init=1e-6, warmup_prefix=True, t_in_epochs=False)


def build_criterion(args: argparse.Namespace, num_classes: int):
    """(mixup or None, loss): soft-target CE when mixing (timm's Mixup smooths the targets itself)."""
    from timm.data import Mixup
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
    if args.mixup > 0 or args.cutmix > 0:
        mixup = Mixup(mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, label_smoothing=args.smoothing,
                      num_classes=num_classes)
        return mixup, SoftTargetCrossEntropy()
    if args.smoothing > 0:
        return None, LabelSmoothingCrossEntropy(args.smoothing)
    return None, nn.CrossEntropyLoss()


def teacher_view(x: torch.Tensor, student: CaiTConfig, teacher: CaiTConfig) -> torch.Tensor:
    """The student's normalised batch as the teacher expects it (its size, channels, mean/std)."""
    if (student.img_size, student.in_chans, student.mean, student.std) == \
            (teacher.img_size, teacher.in_chans, teacher.mean, teacher.std):
        return x
    stats = lambda v: torch.tensor(v, device=x.device).view(1, -1, 1, 1)
    raw = x * stats(student.std) + stats(student.mean)
    if raw.shape[1] != teacher.in_chans:
        raw = raw.mean(1, keepdim=True) if teacher.in_chans == 1 else raw.expand(-1, teacher.in_chans, -1, -1)
    if raw.shape[-1] != teacher.img_size:
        raw = F.interpolate(raw, size=teacher.img_size, mode="bicubic", align_corners=False)
    return (raw - stats(teacher.mean)) / stats(teacher.std)


# ----------------------------------------------------------------------------------------------------
# what the paper analyses, measured once per epoch

@torch.no_grad()
def insight_stats(model: CaiT, batch: torch.Tensor) -> dict[str, Any]:
    """Residual ratios per layer and class-attention entropy (nats) per CA layer and head, averaged over a
    fixed validation batch, in fp32."""
    was_training = model.training
    model.eval()
    ins = model.forward_insights(batch)
    model.train(was_training)
    entropy = [(-(a * a.clamp_min(1e-12).log()).sum(-1)).mean(0).tolist() for a in ins.class_attention]
    return {"residual_ratios": {k: v.mean(0).tolist() for k, v in ins.residual_ratios.items()},
            "ca_entropy": entropy}


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device, amp: torch.dtype | None) -> float:
    """Top-1 accuracy (%) over the whole validation set, summed across ranks."""
    was_training = model.training
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with autocast(amp, device):
            logits = model(x)
        counts += torch.tensor([(logits.argmax(1) == y).sum().item(), len(y)], dtype=torch.float64, device=device)
    model.train(was_training)
    if dist.is_initialized():
        dist.all_reduce(counts)
    return 100.0 * counts[0].item() / max(counts[1].item(), 1.0)


# ----------------------------------------------------------------------------------------------------
# files: every write is temp + rename

def atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def read_metrics(path: Path, epoch_index: int) -> list[str]:
    """metrics.jsonl lines a run resumed in epoch `epoch_index` (0-based) keeps: those of the epochs before
    it, which are numbered from 1 (a crash can leave one line past the state; that one is dropped)."""
    if not path.is_file():
        return []
    return [line for line in path.read_text().splitlines() if line and json.loads(line)["epoch"] <= epoch_index]


# ----------------------------------------------------------------------------------------------------
# distributed

def setup_distributed(device_arg: str) -> tuple[int, int, torch.device]:
    """(rank, world size, device). torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; gloo on CPU, NCCL on GPU."""
    use_cuda = resolve_device(device_arg).type == "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, torch.device("cuda" if use_cuda else "cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    return dist.get_rank(), world, device


class StopRequest:
    """SIGINT/SIGTERM set a flag; the loop saves at the next step boundary. A second signal kills at once."""

    def __init__(self):
        self.signum = 0
        self.previous = {}

    def __enter__(self) -> "StopRequest":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.signum:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.signum = signum


class NonFiniteLoss(RuntimeError):
    pass


# ----------------------------------------------------------------------------------------------------
# training

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rank, world, device = setup_distributed(args.device)
    try:
        with StopRequest() as stop:
            return train(args, rank=rank, world=world, device=device, stop=stop)
    except (DataError, CheckpointError) as e:  # bad data dir / teacher: one line, like a bad flag
        if rank == 0:
            print(f"python -m cait.train: error: {e}".splitlines()[0], file=sys.stderr)
        return 2
    except NonFiniteLoss as e:
        if rank == 0:
            print(f"python -m cait.train: error: {e}", file=sys.stderr)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def train(args: argparse.Namespace, *, rank: int, world: int, device: torch.device, stop: StopRequest) -> int:
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if rank == 0 else (lambda msg: None)
    out = Path(args.output)
    amp = autocast_dtype(args.amp, device)

    # data: the model input pipeline adapts any dataset to any variant (size, channels, normalisation)
    train_raw = build_dataset(args.data, "train", subset=args.subset)
    val_raw = build_dataset(args.data, "val", subset=args.val_subset)
    if tuple(train_raw.classes) != tuple(val_raw.classes):
        raise DataError(f"train and val of {args.data} have different classes")
    if len(train_raw) // world < args.batch_size:
        raise DataError(f"{len(train_raw)} training images cannot fill one batch of {args.batch_size} "
                        f"on each of {world} process(es); lower --batch-size or raise --subset")
    classes = tuple(str(c) for c in train_raw.classes)

    # model (the state file, when resuming, carries the exact config the run started with)
    state = torch.load(out / "state.pt", map_location="cpu", weights_only=True) if args.resume else None
    if state is not None:
        cfg = CaiTConfig.from_dict(state["config"])
    else:
        cfg = model_config(args, num_classes=len(classes), labels=classes)
    seed_everything(args.seed)
    model = CaiT(cfg)
    if state is None and args.init:
        weights, _ = read_checkpoint(args.init)
        head = weights.get("head.weight")
        if head is not None and head.shape[0] != cfg.num_classes:
            raise CheckpointError(f"--init {args.init} has {head.shape[0]} classes, the data {cfg.num_classes}")
        load_into(model, weights, Path(args.init).name)
        log(f"initialised from {args.init}")
    model = model.to(device).train()
    teacher = None
    if args.teacher:
        teacher = create_model(None, checkpoint=args.teacher).to(device).eval().requires_grad_(False)
        if teacher.cfg.num_classes != cfg.num_classes:
            raise CheckpointError(f"teacher {args.teacher} has {teacher.cfg.num_classes} classes, the data {len(classes)}")

    train_data = Transformed(train_raw, train_transform(cfg, args), seed=args.seed)
    val_data = Transformed(val_raw, eval_transform(cfg))
    val_loader = make_loader(torch.utils.data.Subset(val_data, range(rank, len(val_data), world)),
                             batch_size=args.batch_size, sampler=None, workers=args.workers, drop_last=False)
    insight_batch = torch.stack([val_data[i][0] for i in range(min(INSIGHT_BATCH, len(val_data)))]).to(device)
    steps_per_epoch = len(EpochSampler(len(train_data), seed=0, epoch=0, rank=rank, world=world)) // args.batch_size

    lr = args.lr or 5e-4 * args.batch_size * world / 512
    optimizer = build_optimizer(model, args, lr)
    scheduler = build_scheduler(optimizer, args, steps_per_epoch)
    mixup, criterion = build_criterion(args, cfg.num_classes)
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)
    ema = None
    if args.ema:
        from timm.utils import ModelEmaV3
        ema = ModelEmaV3(model, decay=args.ema, use_warmup=True)

    epoch, skip, step, best, partial = 0, 0, 0, -1.0, {"loss": 0.0, "correct": 0, "seen": 0, "seconds": 0.0}
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        # the schedule is a function of (flags, step): rebuilt, not loaded, so that resuming with another
        # --epochs stretches or shortens the cosine instead of keeping the old length
        scheduler.step_update(num_updates=state["step"])
        scaler.load_state_dict(state["scaler"])
        if ema is not None and state["ema"] is not None:
            ema.module.load_state_dict(state["ema"])
        epoch, skip, step, best, partial = (state["epoch"], state["batch"] * args.batch_size, state["step"],
                                            state["best_top1"], state["partial"])
        log(f"resuming {out} at epoch {epoch + 1}, batch {state['batch']} (step {step})")
    if world > 1:
        model_ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        model_ddp = model

    metrics = read_metrics(out / "metrics.jsonl", epoch)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        saved = json.loads((out / "args.json").read_text()) if (out / "args.json").is_file() else {"commands": []}
        record = {k: v for k, v in vars(args).items() if k != "argv"}
        command = shlex.join(["python", "-m", "cait.train", *args.argv])
        write_text(out / "args.json", json.dumps({"args": record, "commands": saved["commands"] + [command]}, indent=1))
    log(f"{args.model}: {model.num_params() / 1e6:.2f}M params, {len(train_data)} train / {len(val_data)} val images, "
        f"{steps_per_epoch} steps/epoch x {args.epochs} epochs, global batch {args.batch_size * world}, lr {lr:.2e}, "
        f"amp {args.amp} ({amp or 'fp32'}), {world} process(es) on {device}")

    def save_state(epoch: int, batch: int) -> None:
        """Everything --resume needs, model weights included (so state and weights never disagree)."""
        if rank != 0:
            return
        blob = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(), "ema": ema.module.state_dict() if ema else None,
                "config": cfg.to_dict(), "epoch": epoch, "batch": batch, "step": step, "best_top1": best,
                "partial": dict(partial), "rng": rng_state()}
        atomic_write(out / "state.pt", lambda f: torch.save(blob, f))

    def save_weights_as(name: str, net: nn.Module, **meta: Any) -> None:
        if rank == 0:
            info = {"epochs_completed": str(epoch), "data": str(args.data), "step": str(step), **{k: str(v) for k, v in meta.items()}}
            save_weights(net, out / name, info)

    def stop_now(why: str) -> int:
        save_weights_as("last.safetensors", model)
        save_state(epoch, batch_done)
        log(f"{why}: saved {out}/state.pt at epoch {epoch + 1}, batch {batch_done}/{steps_per_epoch} "
            f"(step {step}); continue with: python -m cait.train --resume {out}")
        return 128 + stop.signum if stop.signum else 0

    total_steps = args.epochs * steps_per_epoch
    run_start, run_start_step = time.time(), step
    while epoch < args.epochs:
        # this epoch's randomness: data order and augmentation from (seed, epoch); mixup and drop path from
        # the global RNGs, seeded here, or restored from the state when resuming in the middle of the epoch
        train_data.epoch = epoch
        sampler = EpochSampler(len(train_data), seed=args.seed, epoch=epoch, rank=rank, world=world, skip=skip)
        loader = make_loader(train_data, batch_size=args.batch_size, sampler=sampler, workers=args.workers, drop_last=True)
        if skip and state is not None:
            set_rng_state(state["rng"])
        else:
            seed_everything(derive_seed(args.seed, epoch, rank, 1))
            partial = {"loss": 0.0, "correct": 0, "seen": 0, "seconds": 0.0}
        batch_done = skip // args.batch_size
        skip = 0
        epoch_start = time.time() - partial["seconds"]  # a resumed epoch counts its time before the stop too
        tick = time.time()
        bar = tqdm(total=steps_per_epoch, initial=batch_done, desc=f"epoch {epoch + 1}/{args.epochs}",
                   disable=rank != 0, dynamic_ncols=True, mininterval=1.0, file=sys.stderr)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            target = y
            if mixup is not None:
                x, target = mixup(x, y)
            with autocast(amp, device):
                logits = model_ddp(x)
                loss = criterion(logits, target)
                if teacher is not None:
                    with torch.no_grad():
                        hard = teacher(teacher_view(x, cfg, teacher.cfg)).argmax(1)
                    loss = (1 - args.distill_alpha) * loss + args.distill_alpha * F.cross_entropy(logits, hard)
            # every rank must agree before the backward's all-reduce: is any loss bad, any stop requested?
            flags = torch.tensor([0.0 if torch.isfinite(loss) else 1.0, float(stop.signum)], device=device)
            if world > 1:
                dist.all_reduce(flags)
            if flags[0] > 0:
                bar.close()
                last = f"{out}/last.safetensors (end of epoch {epoch})" if epoch else "none (no epoch finished)"
                value = loss.item() if not torch.isfinite(loss) else "non-finite on another rank"
                raise NonFiniteLoss(f"loss is {value} at epoch {epoch + 1}, batch {batch_done + 1}, step {step + 1}; "
                                    f"this step was not applied. Last good checkpoint: {last}. Try a lower --lr "
                                    f"(now {lr:g}) or --clip-grad")
            scaler.scale(loss).backward()
            if args.clip_grad:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            batch_done += 1
            scheduler.step_update(num_updates=step)
            if ema is not None:
                ema.update(model, step=step)

            now = time.time()
            partial["seconds"] += now - tick
            tick = now
            partial["loss"] += loss.item() * len(y)
            partial["correct"] += (logits.argmax(1) == y).sum().item()
            partial["seen"] += len(y)
            rate = partial["seen"] * world / max(partial["seconds"], 1e-9)
            bar.update(1)
            bar.set_postfix(loss=f"{partial['loss'] / partial['seen']:.3f}",
                            acc=f"{100 * partial['correct'] / partial['seen']:.1f}", img_s=f"{rate:.0f}",
                            lr=f"{optimizer.param_groups[0]['lr']:.1e}",
                            run_eta=_eta((total_steps - step) * (now - run_start) / max(step - run_start_step, 1)),
                            refresh=False)
            if flags[1] > 0 or (args.stop_after is not None and step >= args.stop_after):
                bar.close()
                return stop_now("interrupted" if flags[1] > 0 else f"--stop-after {args.stop_after} reached")
        bar.close()
        state = None

        # end of epoch: evaluate, measure, write weights, metrics and finally the state
        evaluated = (epoch + 1) % args.eval_every == 0 or epoch + 1 == args.epochs
        top1 = evaluate(model, val_loader, device, amp) if evaluated else None
        top1_ema = evaluate(ema.module, val_loader, device, amp) if evaluated and ema is not None else None
        epoch += 1
        if rank == 0:
            line = {"epoch": epoch, "step": step, "train_loss": partial["loss"] / max(partial["seen"], 1),
                    "train_top1": 100 * partial["correct"] / max(partial["seen"], 1), "val_top1": top1,
                    "val_top1_ema": top1_ema, "lr": optimizer.param_groups[0]["lr"],
                    "images_per_s": partial["seen"] * world / max(partial["seconds"], 1e-9),
                    "epoch_seconds": time.time() - epoch_start, "layerscale": layerscale_stats(model),
                    **insight_stats(model, insight_batch)}
            save_weights_as("last.safetensors", model, val_top1=top1)
            if ema is not None:
                save_weights_as("ema.safetensors", ema.module, val_top1=top1_ema)
            if top1 is not None and top1 > best:
                best = top1
                save_weights_as("best.safetensors", model, val_top1=top1)
            metrics.append(json.dumps(line))
            write_text(out / "metrics.jsonl", "\n".join(metrics) + "\n")
            log(f"epoch {epoch}/{args.epochs}: train loss {line['train_loss']:.4f}, val top-1 "
                f"{'-' if top1 is None else f'{top1:.2f}'}%, {line['images_per_s']:.0f} img/s, "
                f"{line['epoch_seconds']:.0f}s")
        partial = {"loss": 0.0, "correct": 0, "seen": 0, "seconds": 0.0}
        batch_done = 0
        save_state(epoch, 0)  # a signal during evaluation is honoured at the next step, where ranks agree
    log(f"done: best val top-1 {best:.2f}%; weights in {out}")
    return 0


def _eta(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


if __name__ == "__main__":
    sys.exit(main())
