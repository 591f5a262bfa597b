"""Train a CaiT with the DeiT/CaiT recipe, built from timm's parts.

    python -m cait.train --model cait_nano_64 --data fashion-mnist-scenes --epochs 30 --output runs/nano64
    python -m cait.train --resume runs/nano64                    # continue exactly where it stopped
    torchrun --nproc_per_node=2 -m cait.train --data fashion-mnist --output runs/ddp   # data parallel

From Python, the same flags by name, no command line (a non-finite loss raises `Diverged`):

    from cait.train import run, train_args
    result = run(train_args(model="cait_pico_32", epochs=2, output="runs/x"))   # -> RunResult

Shaped like timm's train.py: `TrainState` (model, EMA, optimizer, schedule, loss scaler, position) owns
what --resume restores; `train_one_epoch`, `evaluate` and `end_of_epoch` are the loop; `run` drives it
and `main` is the command line over it. The flags and the config they build are `cait.train.args`'s, the
training images `cait.train.data`'s, the seeding that makes a resume exact `cait.train.seeding`'s.

Recipe (Touvron et al. 2021, sec. 5 / DeiT): AdamW without weight decay on LayerScale, position
embedding, class token, norms and biases; per-step cosine schedule with linear warmup; RandAugment,
random erasing, Mixup/CutMix with soft-target cross-entropy and label smoothing; uniform stochastic
depth; gradient clipping; model EMA; optional hard or soft distillation from a teacher through the
class token.

Training images are augmented on batched uint8 tensors (`cait.train.augment`) read from the dataset's pixel
array, the scenes from a disk cache rendered once (`cait.data.scene_cache`); image folders, or --pipeline pil,
go through timm's PIL transforms image by image.

Everything random is a pure function of --seed: the data order of epoch e comes from (seed, e), the
augmentation of sample i in epoch e from (seed, e, i), and mixup / stochastic depth draw from RNGs
re-seeded from (seed, e, rank) at the start of every epoch and saved in the resume state. So a run that
is stopped (signal, --stop-after) and resumed gives the same weights as one that never stopped.

Writes to --output: last.safetensors, best.safetensors, ema.safetensors (weights + config, loadable by
`cait.load_model(None, checkpoint=...).model`), state.pt (everything --resume needs), metrics.jsonl (one
line per epoch, including the paper's LayerScale / residual-ratio / class-attention statistics) and
args.json (the layout, and its one reader and writer, is cait/runs.py). Every file is written to a
temporary name and renamed, so a kill at any moment leaves the previous version readable.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from ..checkpoint import CheckpointError, grow_depth, load_into, read_checkpoint
from ..cnn import TimmCNN, load_cnn_weights
from ..config import CaiTConfig, CNNConfig
from ..distributed import RankFailed, process_group, rank_zero_does
from ..errors import InputError
from ..explain.layerscale import layerscale_stats
from ..metrics import top1_from_counts
from ..model import CaiT
from ..outputs import writable_folder
from ..runs import RunDir
from ..runtime import autocast, autocast_dtype
from .args import ArgsError, ModelConfig, model_config, parse_args, train_args
from .augment import to_channels
from .data import Data, build_loaders, load_data
from .seeding import derive_seed, rng_state, seed_everything, set_rng_state
from .teacher import load_teacher

# the Python interface: run(train_args(...)) -> RunResult, or Diverged; train_args's ArgsError
__all__ = ["ArgsError", "Diverged", "RunResult", "TrainState", "main", "run", "train_args"]


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
    return CosineLRScheduler(
        optimizer,
        t_initial=max(total - warmup, 1),
        lr_min=args.min_lr,
        warmup_t=warmup,
        warmup_lr_init=1e-6,
        warmup_prefix=True,
        t_in_epochs=False,
    )


def build_criterion(args: argparse.Namespace, num_classes: int):
    """(mixup or None, loss): soft-target CE when mixing (timm's Mixup smooths the targets itself)."""
    from timm.data import Mixup
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    if args.mixup > 0 or args.cutmix > 0:
        mixup = Mixup(
            mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, label_smoothing=args.smoothing, num_classes=num_classes
        )
        return mixup, SoftTargetCrossEntropy()
    if args.smoothing > 0:
        return None, LabelSmoothingCrossEntropy(args.smoothing)
    return None, nn.CrossEntropyLoss()


def teacher_view(x: torch.Tensor, student: ModelConfig, teacher: ModelConfig) -> torch.Tensor:
    """The student's normalised batch as the teacher expects it (its size, channels, mean/std)."""
    if (student.img_size, student.in_chans, student.mean, student.std) == (
        teacher.img_size,
        teacher.in_chans,
        teacher.mean,
        teacher.std,
    ):
        return x
    stats = lambda v: torch.tensor(v, device=x.device).view(1, -1, 1, 1)
    raw = x * stats(student.std) + stats(student.mean)
    if raw.shape[1] != teacher.in_chans:  # grey as the data pipeline makes it (luma), or grey copied to RGB
        raw = to_channels(raw, 1) if teacher.in_chans == 1 else raw.expand(-1, teacher.in_chans, -1, -1)
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
    return {"residual_ratios": {k: v.mean(0).tolist() for k, v in ins.residual_ratios.items()}, "ca_entropy": entropy}


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device, amp: torch.dtype | None) -> float:
    """Top-1 (a fraction) over the whole validation set, its counts summed across ranks."""
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
    return top1_from_counts(counts[0].item(), counts[1].item())


# ----------------------------------------------------------------------------------------------------
# signals


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


# ----------------------------------------------------------------------------------------------------
# the state a run carries from step to step, and that --resume restores


@dataclass
class EpochTally:
    """Running sums of the epoch in progress; saved mid-epoch, so that a resumed epoch reports all of it."""

    loss: float = 0.0  # sum over images of the training loss
    correct: int = 0  # training images whose top-1 is their (un-mixed) label
    seen: int = 0  # training images of this epoch, on this process
    seconds: float = 0.0  # time spent in training steps

    def add(self, loss: float, correct: int, images: int, seconds: float) -> None:
        self.loss += loss * images
        self.correct += correct
        self.seen += images
        self.seconds += seconds

    def mean_loss(self) -> float:
        return self.loss / max(self.seen, 1)

    def top1(self) -> float:
        return top1_from_counts(self.correct, self.seen)


@dataclass
class TrainState:
    """Everything that changes while training. `state_dict()` is state.pt: with it, a run that stopped at
    any step boundary continues to the very weights it would have reached without stopping."""

    model: CaiT | TimmCNN
    optimizer: torch.optim.Optimizer
    scheduler: Any  # timm CosineLRScheduler: a function of (flags, step), so rebuilt, never saved
    scaler: torch.amp.GradScaler
    ema: Any | None  # timm ModelEmaV3, or None without --ema
    epoch: int = 0  # epochs completed
    batch: int = 0  # batches done in the current epoch
    step: int = 0  # optimizer steps in total
    best_top1: float = -1.0  # best val top-1 of the raw weights so far (best.safetensors)
    tally: EpochTally = field(default_factory=EpochTally)
    resume_rng: dict[str, Any] | None = None  # global RNG states to put back when continuing mid-epoch

    def state_dict(self) -> dict[str, Any]:
        """Model weights included, so that state and weights never disagree; readable with weights_only."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "ema": self.ema.module.state_dict() if self.ema else None,
            "config": self.model.cfg.to_dict(),
            "epoch": self.epoch,
            "batch": self.batch,
            "step": self.step,
            "best_top1": self.best_top1,
            "partial": asdict(self.tally),
            "rng": rng_state(),
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        # the schedule is rebuilt from the flags, then moved to the step: resuming with another --epochs
        # stretches or shortens the cosine instead of keeping the old length
        self.scheduler.step_update(num_updates=saved["step"])
        self.scaler.load_state_dict(saved["scaler"])
        if self.ema is not None and saved["ema"] is not None:
            self.ema.module.load_state_dict(saved["ema"])
        self.epoch, self.batch, self.step = saved["epoch"], saved["batch"], saved["step"]
        self.best_top1, self.tally, self.resume_rng = saved["best_top1"], EpochTally(**saved["partial"]), saved["rng"]

    def begin_epoch(self, seed: int, rank: int) -> None:
        """This epoch's mixup and drop-path randomness: the global RNGs seeded from (seed, epoch, rank), or
        put back as they were at the stop when continuing mid-epoch."""
        if self.batch and self.resume_rng is not None:
            set_rng_state(self.resume_rng)
        else:
            seed_everything(derive_seed(seed, self.epoch, rank, 1))

    def finish_epoch(self) -> EpochTally:
        """Count the epoch as done; returns its tally and starts the next one's."""
        done, self.tally = self.tally, EpochTally()
        self.epoch, self.batch, self.resume_rng = self.epoch + 1, 0, None
        return done


def new_state(
    model: CaiT | TimmCNN,
    args: argparse.Namespace,
    *,
    lr: float,
    steps_per_epoch: int,
    amp: torch.dtype | None,
    device: torch.device,
) -> TrainState:
    """The state of a fresh run: the recipe's optimizer, schedule, loss scaler and EMA around `model`."""
    optimizer = build_optimizer(model, args, lr)
    ema = None
    if args.ema:
        from timm.utils import ModelEmaV3

        ema = ModelEmaV3(model, decay=args.ema, use_warmup=True)
    return TrainState(
        model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, args, steps_per_epoch),
        scaler=torch.amp.GradScaler(device.type, enabled=amp is torch.float16),
        ema=ema,
    )


# ----------------------------------------------------------------------------------------------------
# what stays fixed through a run


@dataclass
class Setup:
    """What stays fixed through one call of run(): flags, processes, data, model wrapper and loss."""

    args: argparse.Namespace
    cfg: ModelConfig
    run: RunDir  # where the run's files go (--output)
    device: torch.device
    amp: torch.dtype | None  # autocast dtype, None = fp32
    rank: int
    world: int
    data: Data
    net: nn.Module  # the model as trained: DDP-wrapped when world > 1
    mixup: Any | None  # timm Mixup/CutMix, or None
    criterion: nn.Module
    teacher: nn.Module | None  # hard-distillation teacher (CaiT or TimmCNN, with .cfg), or None
    lr: float  # peak learning rate
    stop: "StopRequest"
    started: tuple[float, int] = (0.0, 0)  # (time, step) when this call started, for the run's ETA

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(message, file=sys.stderr, flush=True)


def build_model(args: argparse.Namespace, cfg: ModelConfig, *, fresh: bool) -> CaiT | TimmCNN:
    """The model, initialised from --seed, or from --init's weights when a fresh run asks for them."""
    seed_everything(args.seed)
    if isinstance(cfg, CNNConfig):
        model = TimmCNN(cfg)
        if fresh and args.init:
            load_cnn_weights(model, read_checkpoint(args.init)[0], Path(args.init).name)
        return model
    model = CaiT(cfg)
    if fresh and args.init:
        weights, _ = read_checkpoint(args.init)
        head = weights.get("head.weight")
        if head is not None and head.shape[0] != cfg.num_classes:
            raise CheckpointError(f"--init {args.init} has {head.shape[0]} classes, the data {cfg.num_classes}")
        if args.init_grow_gamma is not None:
            weights = grow_depth(weights, cfg.depth, gamma=args.init_grow_gamma)
        load_into(model, weights, Path(args.init).name)
    return model


def build_teacher(args: argparse.Namespace, cfg: ModelConfig, device: torch.device) -> nn.Module | None:
    """The frozen --teacher (a timm CNN trained here, or a CaiT), or None."""
    if not args.teacher:
        return None
    teacher = load_teacher(args.teacher, img_size=args.teacher_img_size).to(device)
    if teacher.cfg.num_classes != cfg.num_classes:
        raise CheckpointError(
            f"teacher {args.teacher} has {teacher.cfg.num_classes} classes, the data {cfg.num_classes}"
        )
    return teacher


def saved_config(config: dict[str, Any]) -> ModelConfig:
    """The model config a state.pt holds (a CNN's names its timm "arch")."""
    return (CNNConfig if "arch" in config else CaiTConfig).from_dict(config)


def prepare(
    args: argparse.Namespace, *, rank: int, world: int, device: torch.device, stop: "StopRequest"
) -> tuple[Setup, TrainState]:
    """Data, model, recipe and state of a fresh run, or of the run in --resume as it was saved."""
    run = RunDir(args.output)
    train_raw, val_raw, classes = load_data(args, world)
    saved = run.load_state() if args.resume else None
    # a resumed run keeps the exact config it started with
    cfg = saved_config(saved["config"]) if saved else model_config(args, num_classes=len(classes), labels=classes)
    model = build_model(args, cfg, fresh=saved is None).to(device).train()
    teacher = build_teacher(args, cfg, device)
    data = build_loaders(args, cfg, train_raw, val_raw, rank=rank, world=world, device=device)
    lr = args.lr or 5e-4 * args.batch_size * world / 512
    amp = autocast_dtype(args.precision, device, remeasure=args.remeasure_precision)
    state = new_state(model, args, lr=lr, steps_per_epoch=data.steps_per_epoch, amp=amp, device=device)
    if saved is not None:
        state.load_state_dict(saved)
    net = model
    if world > 1:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    mixup, criterion = build_criterion(args, cfg.num_classes)
    setup = Setup(
        args,
        cfg,
        run,
        device,
        amp,
        rank,
        world,
        data,
        net,
        mixup,
        criterion,
        teacher,
        lr,
        stop,
        started=(time.time(), state.step),
    )
    if args.init and saved is None:
        setup.log(f"initialised from {args.init}")
    if saved is not None:
        setup.log(f"resuming {run} at epoch {state.epoch + 1}, batch {state.batch} (step {state.step})")
    return setup, state


# ----------------------------------------------------------------------------------------------------
# training


class Diverged(RuntimeError):
    """The training loss became non-finite (on any process); the step was not applied and nothing was
    saved after the last completed epoch. A result for the stability sweeps, an error for the command line."""

    def __init__(self, message: str, *, epoch: int, step: int, loss: float | None):
        super().__init__(message)
        self.epoch = epoch  # 1-based epoch it happened in
        self.step = step  # the optimizer step that was not applied (1-based)
        self.loss = loss  # the value, or None when it was another process's


@dataclass
class RunResult:
    """What one call of run() did."""

    output: Path  # the run directory
    finished: bool  # all --epochs done; False: stopped early and saved, --resume continues
    stopped_by: str | None  # why it stopped early: "interrupted" or "--stop-after N reached"
    signum: int  # the signal that stopped it, 0 for none
    epochs: int  # epochs completed
    step: int  # optimizer steps in total
    best_top1: float | None  # best val top-1 of the raw weights, None if never evaluated
    metrics: list[dict]  # metrics.jsonl, one line per completed epoch (empty on ranks other than 0)

    @property
    def final(self) -> dict | None:
        return self.metrics[-1] if self.metrics else None

    @property
    def exit_code(self) -> int:
        return 128 + self.signum if self.signum else 0


def distillation_term(logits: torch.Tensor, teacher_logits: torch.Tensor, *, kind: str, tau: float) -> torch.Tensor:
    """What the student pays for disagreeing with the teacher: hard = cross-entropy to the teacher's top-1;
    soft = tau^2 * KL(teacher || student) on probabilities softened by tau (tau^2 keeps the gradient's scale)."""
    if kind == "hard":
        return F.cross_entropy(logits, teacher_logits.argmax(1))
    student = F.log_softmax(logits.float() / tau, dim=1)
    teacher = F.log_softmax(teacher_logits.float() / tau, dim=1)
    return F.kl_div(student, teacher, reduction="batchmean", log_target=True) * tau * tau


def distill_loss(setup: Setup, loss: torch.Tensor, logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Distillation through the class token: the label's loss mixed with the teacher's term."""
    with torch.no_grad():
        teacher_logits = setup.teacher(teacher_view(x, setup.cfg, setup.teacher.cfg))
    alpha, args = setup.args.distill_alpha, setup.args
    term = distillation_term(logits, teacher_logits, kind=args.distill_type, tau=args.distill_tau)
    return (1 - alpha) * loss + alpha * term


def train_step(
    setup: Setup, state: TrainState, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """One optimizer step on a batch: (loss, logits, whether a stop was requested on any process).
    Raises Diverged, before the step is applied, when the loss is not finite on any process."""
    target = y
    if setup.mixup is not None:
        x, target = setup.mixup(x, y)
    with autocast(setup.amp, setup.device):
        logits = setup.net(x)
        loss = setup.criterion(logits, target)
        if setup.teacher is not None:
            loss = distill_loss(setup, loss, logits, x)
    # every rank must agree before the backward's all-reduce: is any loss bad, any stop requested?
    flags = torch.tensor([0.0 if torch.isfinite(loss) else 1.0, float(setup.stop.signum)], device=setup.device)
    if setup.world > 1:
        dist.all_reduce(flags)
    if flags[0] > 0:
        raise diverged(setup, state, loss)
    args, opt = setup.args, state.optimizer
    state.scaler.scale(loss).backward()
    if args.clip_grad:
        state.scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(state.model.parameters(), args.clip_grad)
    state.scaler.step(opt)
    state.scaler.update()
    opt.zero_grad(set_to_none=True)
    state.step += 1
    state.batch += 1
    state.scheduler.step_update(num_updates=state.step)
    if state.ema is not None:
        state.ema.update(state.model, step=state.step)
    return loss, logits, bool(flags[1] > 0)


def diverged(setup: Setup, state: TrainState, loss: torch.Tensor) -> Diverged:
    value = loss.item() if not torch.isfinite(loss) else None
    last = f"{setup.run}/last.safetensors (end of epoch {state.epoch})" if state.epoch else "none (no epoch finished)"
    return Diverged(
        f"loss is {'non-finite on another rank' if value is None else value} at epoch {state.epoch + 1}, "
        f"batch {state.batch + 1}, step {state.step + 1}; this step was not applied. Last good checkpoint: "
        f"{last}. Try a lower --lr (now {setup.lr:g}) or --clip-grad",
        epoch=state.epoch + 1,
        step=state.step + 1,
        loss=value,
    )


def train_one_epoch(setup: Setup, state: TrainState) -> str | None:
    """Train from state.batch to the end of the epoch. Returns why it stopped early (a signal, --stop-after),
    or None at the end of the epoch."""
    args = setup.args
    state.begin_epoch(args.seed, setup.rank)
    loader = setup.data.train_loader(args, state.epoch, skip=state.batch * args.batch_size)
    tick = time.time()
    with tqdm(
        total=setup.data.steps_per_epoch,
        initial=state.batch,
        desc=f"epoch {state.epoch + 1}/{args.epochs}",
        disable=setup.rank != 0,
        dynamic_ncols=True,
        mininterval=1.0,
        file=sys.stderr,
    ) as bar:
        for x, y in loader:
            x, y = x.to(setup.device, non_blocking=True), y.to(setup.device, non_blocking=True)
            loss, logits, stop_requested = train_step(setup, state, x, y)
            now = time.time()
            state.tally.add(loss.item(), (logits.argmax(1) == y).sum().item(), len(y), now - tick)
            tick = now
            bar.update(1)
            bar.set_postfix(refresh=False, **_progress(setup, state, now))
            if stop_requested:
                return "interrupted"
            if args.stop_after is not None and state.step >= args.stop_after:
                return f"--stop-after {args.stop_after} reached"
    return None


def _progress(setup: Setup, state: TrainState, now: float) -> dict[str, str]:
    tally, (start, start_step) = state.tally, setup.started
    remaining = (
        (setup.args.epochs * setup.data.steps_per_epoch - state.step) * (now - start) / max(state.step - start_step, 1)
    )
    return {
        "loss": f"{tally.mean_loss():.3f}",
        "acc": f"{100 * tally.top1():.1f}",
        "img_s": f"{tally.seen * setup.world / max(tally.seconds, 1e-9):.0f}",
        "lr": f"{state.optimizer.param_groups[0]['lr']:.1e}",
        "run_eta": _eta(remaining),
    }


def end_of_epoch(setup: Setup, state: TrainState, started: float) -> None:
    """Evaluate, measure what the paper analyses, then write weights, metrics and finally the state (a
    signal during this is honoured at the next step, where all ranks agree)."""
    args, model, ema = setup.args, state.model, state.ema
    evaluated = (state.epoch + 1) % args.eval_every == 0 or state.epoch + 1 == args.epochs
    top1 = evaluate(model, setup.data.val_loader, setup.device, setup.amp) if evaluated else None
    top1_ema = evaluate(ema.module, setup.data.val_loader, setup.device, setup.amp) if evaluated and ema else None
    tally = state.finish_epoch()
    line = {
        "epoch": state.epoch,
        "step": state.step,
        "train_loss": tally.mean_loss(),
        "train_top1": tally.top1(),
        "val_top1": top1,
        "val_top1_ema": top1_ema,
        "lr": state.optimizer.param_groups[0]["lr"],
        "images_per_s": tally.seen * setup.world / max(tally.seconds, 1e-9),
        "epoch_seconds": time.time() - started,
    }
    rank_zero_does(lambda: write_epoch(setup, state, line))


def write_epoch(setup: Setup, state: TrainState, line: dict[str, Any]) -> None:
    """Rank 0's end of an epoch: the paper's statistics into its metrics line, the weights, the line, then the
    state."""
    model, ema, top1 = state.model, state.ema, line["val_top1"]
    if isinstance(model, CaiT):  # the paper's per-epoch statistics exist for CaiT only
        line.update(layerscale=layerscale_stats(model), **insight_stats(model, setup.data.insight_batch))
    save_checkpoint(setup, state, "last", model, val_top1=top1)
    if ema is not None:
        save_checkpoint(setup, state, "ema", ema.module, val_top1=line["val_top1_ema"])
    if top1 is not None and top1 > state.best_top1:
        state.best_top1 = top1
        save_checkpoint(setup, state, "best", model, val_top1=top1)
    setup.run.append_metrics(line)
    setup.log(
        f"epoch {state.epoch}/{setup.args.epochs}: train loss {line['train_loss']:.4f}, val top-1 "
        f"{'-' if top1 is None else f'{top1:.2%}'}, {line['images_per_s']:.0f} img/s, "
        f"{line['epoch_seconds']:.0f}s"
    )
    setup.run.save_state(state.state_dict())


def save_checkpoint(setup: Setup, state: TrainState, name: str, net: nn.Module, **meta: Any) -> None:
    setup.run.save_checkpoint(name, net, epochs_completed=state.epoch, step=state.step, data=setup.args.data, **meta)


def write_stopped(setup: Setup, state: TrainState) -> None:
    """Rank 0's files of a run stopped mid-epoch: the last weights and the state --resume continues from."""
    save_checkpoint(setup, state, "last", state.model)
    setup.run.save_state(state.state_dict())


def record_args(setup: Setup) -> None:
    """args.json: the run's flags, and the command that started or continued it; written by rank 0 before any
    step, so an --output that cannot be written stops every rank at once with one line."""
    args = setup.args

    def record() -> None:
        writable_folder(setup.run.path)
        command = shlex.join(["python", "-m", "cait.train", *args.argv])
        setup.run.record_command({k: v for k, v in vars(args).items() if k != "argv"}, command)

    rank_zero_does(record)


def run(args: argparse.Namespace) -> RunResult:
    """Train as `args` say (from parse_args or train_args): a fresh run, or the one in --resume. Under
    torchrun this process is one rank of data-parallel training. SIGINT/SIGTERM save and return an
    unfinished result; a non-finite loss raises Diverged; a bad dataset or checkpoint DataError or
    CheckpointError."""
    if args.threads:
        torch.set_num_threads(args.threads)
    with process_group(args.device) as (rank, world, device), StopRequest() as stop:
        setup, state = prepare(args, rank=rank, world=world, device=device, stop=stop)
        return train(setup, state)


def train(setup: Setup, state: TrainState) -> RunResult:
    """The epochs from where `state` is to --epochs, or to a stop."""
    args = setup.args
    record_args(setup)
    setup.log(
        f"{args.model}: {state.model.num_params() / 1e6:.2f}M params, {len(setup.data.train)} train / "
        f"{len(setup.data.val_loader.dataset)} val images, {setup.data.steps_per_epoch} steps/epoch x "
        f"{args.epochs} epochs, global batch {args.batch_size * setup.world}, lr {setup.lr:.2e}, "
        f"precision {args.precision} ({setup.amp or 'fp32'}), {setup.world} process(es) on {setup.device}"
    )
    while state.epoch < args.epochs:
        started = time.time() - state.tally.seconds  # a resumed epoch counts its time before the stop too
        stopped_by = train_one_epoch(setup, state)
        if stopped_by is not None:
            rank_zero_does(lambda: write_stopped(setup, state))
            setup.log(
                f"{stopped_by}: saved {setup.run}/state.pt at epoch {state.epoch + 1}, batch {state.batch}/"
                f"{setup.data.steps_per_epoch} (step {state.step}); continue with: python -m cait.train "
                f"--resume {setup.run}"
            )
            return result(setup, state, stopped_by)
        end_of_epoch(setup, state, started)
    setup.log(f"done: best val top-1 {state.best_top1:.2%}; weights in {setup.run}")
    return result(setup, state, None)


def result(setup: Setup, state: TrainState, stopped_by: str | None) -> RunResult:
    metrics = setup.run.read_metrics() if setup.rank == 0 else []
    return RunResult(
        output=setup.run.path,
        finished=stopped_by is None,
        stopped_by=stopped_by,
        signum=setup.stop.signum,
        epochs=state.epoch,
        step=state.step,
        best_top1=state.best_top1 if state.best_top1 >= 0 else None,
        metrics=metrics,
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m cait.train`: exit 0 when done or stopped and saved (128 + signal number for a signal),
    1 on a non-finite loss, 2 on bad flags, data or checkpoints (one line, no traceback)."""
    args = parse_args(argv)
    try:
        return run(args).exit_code
    except InputError as e:  # flags, data or a checkpoint that cannot work; anything else is a bug
        _error(str(e))
        return 2
    except Diverged as e:
        _error(str(e))
        return 1
    except RankFailed:  # rank 0 says what failed, with its traceback
        return 1


def _error(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, one message rather than one per rank
        print(f"python -m cait.train: error: {message}".splitlines()[0], file=sys.stderr)


def _eta(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
