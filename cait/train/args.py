"""The flags of `python -m cait.train`: the parser, the same flags from Python (`train_args`), their checks,
and the model config they build. A resumed run's flags come from its args.json (`cait.runs`), so what
`--resume` may change and what it may not is decided here too."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from ..config import GLOBAL_POOLS, RESIDUAL_SCALES, CaiTConfig, CNNConfig, ConfigError, get_config, list_models
from ..data import NATIVE_INPUT, SCENE_STYLES
from ..errors import InputError
from ..flags import PRECISIONS, add_device_flag, add_precision_flag, add_threads_flag
from ..runs import RunDir
from ..runtime import resolve_device
from .augment import parse_randaug
from .teacher import CNN_PREFIX, cnn_arch

# what --help says first (cait.train's docstring opens with the same line)
DESCRIPTION = "Train a CaiT with the DeiT/CaiT recipe, built from timm's parts."
# flag dest -> CaiTConfig field, for the flags that change the model (the ablations' miniatures)
MODEL_OVERRIDES = {
    "img_size": "img_size",
    "patch_size": "patch_size",
    "embed_dim": "embed_dim",
    "depth": "depth",
    "depth_token_only": "depth_token_only",
    "num_heads": "num_heads",
    "class_token_at": "class_token_at",
    "global_pool": "global_pool",
    "residual_scale": "residual_scale",
    "init_values": "init_values",
    "drop_path": "drop_path_rate",
}
ModelConfig = CaiTConfig | CNNConfig  # what --model builds: a CaiT variant, or a timm CNN (timm:NAME)
# what to stop at, how many threads to use and whether to time the precision again are properties of one
# invocation, not of the run: a resumed run does not inherit them
PER_INVOCATION = ("stop_after", "threads", "remeasure_precision")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump, exit 2 like argparse
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m cait.train", description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    run = p.add_argument_group("run")
    _what_to_train(run)
    _how_to_run(run)
    _optimisation(p.add_argument_group("optimisation"))
    _augmentation(p.add_argument_group("augmentation and regularisation"))
    group = p.add_argument_group("model overrides (default: the --model config's) and distillation")
    _model_overrides(group)
    _distillation(group)
    return p


def _what_to_train(g) -> None:
    """The model, the data, where the run is kept."""
    # not DEFAULT_MODEL: the shipped default is this model fine-tuned at a larger input (its card says how);
    # a run from scratch starts at the scenes' own 64 px, where a step costs a fraction
    g.add_argument(
        "--model",
        default="cait_nano_64",
        help=f"variant to train, one of: {', '.join(list_models())}; or {CNN_PREFIX}NAME for a timm CNN "
        f"(e.g. {CNN_PREFIX}resnet10t: a distillation --teacher for the same data; --img-size and "
        f"--drop-path apply, the CaiT statistics are skipped)",
    )
    g.add_argument(
        "--data",
        default="fashion-mnist-scenes",
        help="fashion-mnist, fashion-mnist-scenes, or a directory with train/<class>/ and val/<class>/ images",
    )
    g.add_argument(
        "--scene-style",
        choices=SCENE_STYLES,
        default="default",
        help="look of the fashion-mnist-scenes training images (varied: noise, lighting, shading and blur drawn "
        "per scene; light: light backgrounds, the garment darker than them; mixed: each scene light or varied; blend: "
        "light, varied or default, half, a quarter, a quarter); "
        "validation stays on the default style's test scenes",
    )
    g.add_argument(
        "--output", default=None, help="directory for checkpoints, state and metrics (default: runs/<model>)"
    )
    g.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue the run saved in DIR (its args.json supplies every flag not given again)",
    )


def _how_to_run(g) -> None:
    """Length, batch, seed, machine, precision, and where the run starts and stops."""
    g.add_argument("--epochs", type=int, default=30, help="length of the schedule in epochs")
    g.add_argument("--batch-size", type=int, default=128, help="images per step on each process")
    g.add_argument("--seed", type=int, default=0, help="seed of init, data order, augmentation, mixup and drop path")
    g.add_argument("--subset", type=int, default=None, help="use only the first N training images (smoke tests)")
    g.add_argument("--val-subset", type=int, default=None, help="evaluate on only the first N validation images")
    add_device_flag(g)
    g.add_argument("--workers", type=int, default=2, help="data loading processes per training process (0 = inline)")
    add_threads_flag(g, help="torch threads per process (default: torch's choice; 1 is fastest on a busy machine)")
    add_precision_flag(
        g,
        choices=PRECISIONS,
        help="autocast dtype of training and evaluation; auto = bf16 where it measures faster "
        "than fp32 on this machine, else fp32; fp16 (CUDA) with a loss scaler",
    )
    g.add_argument("--eval-every", type=int, default=1, help="evaluate every N epochs (and always after the last)")
    g.add_argument(
        "--init",
        default=None,
        metavar="CHECKPOINT",
        help="start from these weights (our safetensors, e.g. a shipped model or another run's "
        "ema.safetensors, or an official deit / timm file) with a fresh optimizer and schedule: fine-tuning, or "
        "continuing a finished run under a new recipe",
    )
    g.add_argument(
        "--init-grow-gamma",
        type=float,
        default=None,
        metavar="GAMMA",
        help="let --init have fewer self-attention blocks than the model: each old block is followed by "
        "copies of itself whose LayerScale gammas are GAMMA (e.g. 0.01), so the deeper model starts "
        "near the shallower one's accuracy",
    )
    g.add_argument(
        "--stop-after",
        type=int,
        default=None,
        metavar="STEPS",
        help="save and stop after this many optimizer steps in total, as if interrupted; "
        "--resume continues (for time-sliced runs)",
    )


def _optimisation(g) -> None:
    g.add_argument(
        "--lr", type=float, default=None, help="peak learning rate (default: DeiT's 5e-4 * global batch / 512)"
    )
    g.add_argument("--min-lr", type=float, default=1e-5, help="learning rate at the end of the cosine")
    g.add_argument("--warmup-epochs", type=float, default=5, help="linear warmup from 1e-6, in epochs")
    g.add_argument(
        "--weight-decay",
        type=float,
        default=0.05,
        help="AdamW weight decay (never on LayerScale, pos_embed, cls_token, norms, biases)",
    )
    g.add_argument("--clip-grad", type=float, default=None, help="clip the global gradient norm to this value")
    g.add_argument("--ema", type=float, default=0.0, help="model EMA decay (e.g. 0.999); 0 = off")


def _augmentation(g) -> None:
    g.add_argument("--randaug", default="rand-m9-mstd0.5-inc1", help="timm RandAugment string, or 'none'")
    g.add_argument(
        "--crop-scale",
        type=float,
        default=0.25,
        help="smallest area of the random resized crop (DeiT: 0.08 on ImageNet; small images with one "
        "object lose it below ~0.25)",
    )
    g.add_argument(
        "--color-jitter",
        type=float,
        default=0.4,
        help="brightness/contrast/saturation jitter when RandAugment is off (timm's default 0.4; 0 = off)",
    )
    g.add_argument("--hflip", type=float, default=0.5, help="horizontal flip probability")
    g.add_argument("--reprob", type=float, default=0.25, help="random erasing probability")
    g.add_argument(
        "--pipeline",
        default="auto",
        choices=("auto", "tensor", "pil"),
        help="where training images are augmented: tensor = whole batches of the dataset's uint8 pixel "
        "array (fashion-mnist, and the scenes from their disk cache; --randaug runs as "
        "RandAugment-lite, see cait/augment.py), pil = timm's PIL transforms image by image "
        "(timm's exact RandAugment; needed for image folders); auto = tensor where the data allows",
    )
    g.add_argument("--mixup", type=float, default=0.8, help="mixup alpha (0 = off)")
    g.add_argument("--cutmix", type=float, default=1.0, help="cutmix alpha (0 = off)")
    g.add_argument("--smoothing", type=float, default=0.1, help="label smoothing")
    g.add_argument("--drop-path", type=float, default=None, help="stochastic depth rate (default: the model config's)")


def _model_overrides(g) -> None:
    g.add_argument("--img-size", type=int, default=None, help="input side in pixels (images are resized to it)")
    g.add_argument("--patch-size", type=int, default=None, help="patch side in pixels")
    g.add_argument("--embed-dim", type=int, default=None, help="token width")
    g.add_argument("--depth", type=int, default=None, help="number of self-attention blocks")
    g.add_argument("--depth-token-only", type=int, default=None, help="number of class-attention blocks")
    g.add_argument("--num-heads", type=int, default=None, help="attention heads (must divide --embed-dim)")
    g.add_argument(
        "--class-token-at",
        type=int,
        default=None,
        help="ViT-style class token inserted before SA block K (paper Table 2; use with --depth-token-only 0)",
    )
    g.add_argument(
        "--global-pool",
        default=None,
        choices=GLOBAL_POOLS,
        help="classify from the class token or from the mean patch token (paper Table 2)",
    )
    g.add_argument(
        "--residual-scale",
        default=None,
        choices=RESIDUAL_SCALES,
        help="residual branch weighting (paper Table 1 ablations)",
    )
    g.add_argument("--init-values", type=float, default=None, help="LayerScale eps")


def _distillation(g) -> None:
    g.add_argument(
        "--teacher",
        default=None,
        metavar="CHECKPOINT",
        help="distillation from this checkpoint, through the class token: a CNN trained with "
        f"--model {CNN_PREFIX}NAME, or any file cait.load_model reads",
    )
    g.add_argument(
        "--teacher-img-size",
        type=int,
        default=None,
        metavar="PX",
        help="run the teacher at this input size (default: the size it was trained at); a CNN can score higher "
        "above its training size",
    )
    g.add_argument("--distill-alpha", type=float, default=0.5, help="weight of the distillation loss")
    g.add_argument(
        "--distill-type",
        default="hard",
        choices=("hard", "soft"),
        help="hard: the teacher's top-1 as a second label (DeiT/CaiT); soft: KL divergence to the "
        "teacher's softened probabilities, times tau^2 (Hinton et al.)",
    )
    g.add_argument("--distill-tau", type=float, default=3.0, help="temperature of --distill-type soft (DeiT used 3)")


class ArgsError(InputError):
    """Flags cait.train refuses; the message is one line that names the flag."""


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _convert(action: argparse.Action, value: Any) -> Any:
    """A flag value given from Python as the command line would have parsed it (1 -> 1.0 for a float
    flag, a Path -> str), or ArgsError for a wrong type or choice."""
    flag = _flag(action.dest)
    if value is not None:
        kind = action.type or str
        if isinstance(value, str) or (kind is str and isinstance(value, Path)):
            try:
                value = kind(value)
            except ValueError:
                raise ArgsError(f"{flag}: invalid {kind.__name__} value {value!r}") from None
        elif kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif not isinstance(value, kind) or isinstance(value, bool):
            raise ArgsError(f"{flag} takes a {kind.__name__}, got {value!r}")
    if value is not None and action.choices and value not in action.choices:
        raise ArgsError(f"{flag}: invalid choice {value!r} (choose from {', '.join(map(str, action.choices))})")
    return value


def train_args(**given: Any) -> argparse.Namespace:
    """The flags of a run without a command line: every flag's default, then (with resume=DIR) the saved
    run's flags, then `given` by flag name (batch_size=64, residual_scale="none", output=Path(...)).
    Values are converted and checked exactly as `python -m cait.train` does; ArgsError says what is wrong."""
    actions = _flag_actions()
    unknown = sorted(set(given) - set(actions))
    if unknown:
        raise ArgsError(f"unknown flag(s) {', '.join(map(_flag, unknown))}")
    given = {k: _convert(actions[k], v) for k, v in given.items()}
    values = _defaults()
    if given.get("resume") is not None:
        values.update(_resumed(given["resume"]))
    args = argparse.Namespace(**{**values, **given})
    if args.output is None:
        args.output = str(Path("runs") / args.model)
    args.argv = to_argv(given)
    check_args(args)
    return args


def _flag_actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in build_parser()._actions if a.dest != "help"}


def _defaults() -> dict[str, Any]:
    """Every flag's default, by name."""
    return {dest: action.default for dest, action in _flag_actions().items()}


def _resumed(resume: str) -> dict[str, Any]:
    """The flags a saved run was started with (flags added since then keep their defaults), minus the
    per-invocation ones; its directory is the output unless another is given."""
    run = RunDir(resume)
    if not run.is_resumable():
        raise ArgsError(f"--resume {resume}: no state.pt/args.json there (not a run directory)")
    return {**run.read_args(), **dict.fromkeys(PER_INVOCATION), "output": resume}


def same_run(saved: dict[str, Any], args: argparse.Namespace) -> bool:
    """Do the flags of a run's args.json (`saved`) train what `args` would? Flags added since it was saved
    count at their defaults; where the files go and the per-invocation flags do not count."""
    ignored = {"output", "resume", "argv", *PER_INVOCATION}
    then = {**_defaults(), **saved}
    return all(then.get(k) == v for k, v in vars(args).items() if k not in ignored)


def to_argv(given: dict[str, Any]) -> list[str]:
    """The command-line flags of `given` (flag name -> value), for the command recorded in args.json."""
    return [part for dest, value in given.items() if value is not None for part in (_flag(dest), _text(value))]


def _text(value: Any) -> str:
    """A flag value as one writes it: 1e-05 and 1 rather than 1.0 (exact: the parse gives the same value)."""
    if isinstance(value, float) and float(f"{value:g}") == value:
        return f"{value:g}"
    return str(value)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the flags; with --resume, the saved run's flags fill in whatever is not given."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser.parse_args(argv)  # argparse's own errors (unknown flag, bad number, bad choice) come first
    try:
        args = train_args(**_explicit_flags(argv))
    except ArgsError as e:
        parser.error(str(e))
    args.argv = argv
    return args


def check_args(args: argparse.Namespace) -> None:
    """ArgsError for values, or combinations, that cannot train."""
    for name in (
        "epochs",
        "batch_size",
        "eval_every",
        "subset",
        "val_subset",
        "stop_after",
        "threads",
        "teacher_img_size",
    ):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ArgsError(f"{_flag(name)} must be positive, got {value}")
    if args.workers < 0:
        raise ArgsError(f"--workers must be >= 0, got {args.workers}")
    if args.lr is not None and not args.lr > 0:
        raise ArgsError(f"--lr must be positive, got {args.lr}")
    if (args.mixup > 0 or args.cutmix > 0) and args.batch_size % 2:
        raise ArgsError(f"mixup/cutmix need an even --batch-size, got {args.batch_size}")
    try:
        model_config(args)
        resolve_device(args.device)
    except InputError as e:  # an unknown model, a config that does not fit, no CUDA here
        raise ArgsError(str(e)) from None
    if not 0 <= args.ema < 1:
        raise ArgsError(f"--ema is a decay in [0, 1), got {args.ema}")
    if args.scene_style != "default" and args.data != "fashion-mnist-scenes":
        raise ArgsError(f"--scene-style applies to fashion-mnist-scenes only, not {args.data}")
    if args.pipeline != "pil":
        try:
            parse_randaug(args.randaug)
        except InputError as e:  # timm's other policies (AutoAugment, AugMix) exist on the PIL path only
            raise ArgsError(f"{e}; --pipeline pil runs any timm policy") from None


def model_config(args: argparse.Namespace, **fields: Any) -> ModelConfig:
    """The --model config with the override flags applied; ConfigError says, in the flags' names, what
    does not fit."""
    if cnn_arch(args.model) is not None:
        return cnn_config(args, **fields)
    overrides = {
        field: getattr(args, flag) for flag, field in MODEL_OVERRIDES.items() if getattr(args, flag, None) is not None
    }
    try:
        cfg = get_config(args.model, **overrides, **fields)
    except ConfigError as e:
        raise ConfigError(_in_flag_names(str(e))) from None
    if cfg.depth == 0:  # what training needs beyond a model that builds: blocks to train
        raise ConfigError("--depth must be positive, got 0")
    return cfg


def cnn_config(args: argparse.Namespace, **fields: Any) -> CNNConfig:
    """A timm CNN (--model timm:NAME) for the data: its native side (or --img-size) and channels."""
    import timm

    arch = cnn_arch(args.model)
    if not timm.is_model(arch):
        raise ConfigError(f"timm has no model '{arch}' (see timm.list_models(), e.g. resnet10t, resnet18)")
    cait_only = [
        _flag(dest)
        for dest in MODEL_OVERRIDES
        if dest not in ("img_size", "drop_path") and getattr(args, dest, None) is not None
    ]
    if cait_only:
        raise ConfigError(f"{', '.join(cait_only)}: for CaiT models only, not {args.model}")
    side, chans = NATIVE_INPUT.get(args.data, (None, 3))  # image folders are read as RGB
    side = args.img_size or side
    if side is None or side <= 0:
        raise ConfigError(f"--model {args.model} on an image folder needs a positive --img-size")
    return CNNConfig(
        arch=arch,
        img_size=side,
        in_chans=chans,
        mean=(0.5,) * chans,
        std=(0.5,) * chans,
        drop_path_rate=args.drop_path or 0.0,
        **fields,
    )


def _in_flag_names(message: str) -> str:
    """A CaiTConfig message with the config fields that flags set named as the flags
    ("num_heads 5 does not divide embed_dim 48" -> "--num-heads 5 does not divide --embed-dim 48")."""
    flags = {field: _flag(dest) for dest, field in MODEL_OVERRIDES.items()}
    return re.sub(r"\b(\w+)(?= )", lambda m: flags.get(m.group(1), m.group(1)), message)


def _explicit_flags(argv: list[str]) -> dict[str, Any]:
    """Only the flags present on the command line (so a resumed run keeps the saved values of the rest)."""
    quiet = build_parser()
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
    return vars(quiet.parse_args(argv))
