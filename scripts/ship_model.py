"""Ship a finished training run inside the package: copy its weights to cait/weights/<name>.safetensors,
its metrics.jsonl beside them, and write the model card from the run's own files and an evaluation.

    python scripts/ship_model.py runs/nano64_scenes --weights ema --eval eval.json
    python scripts/ship_model.py runs/stage2 --continues runs/stage1 --eval eval.json   # stage2 used --init
    python scripts/ship_model.py --robustness-only cait_micro_136 --robustness sweep.json --noise-shift noise.json

Everything in the card is read from files the run(s) and `python -m cait.evaluate --json` wrote. A run
that started from an earlier run's weights (`cait.train --init`) is shipped with `--continues` that run's
directory: the earlier epochs come first in the metrics and the card, so the history is the whole one.
`--robustness` (an `evaluate --corruption` JSON) and `--noise-shift` (an `evaluate --pixel-noise` JSON) add the
card's robustness section and <name>.robustness.json; `--robustness-only NAME` does only that, for a model
already shipped (its weights, metrics and evaluation untouched).
`--card-only` rewrites the card of a model already shipped from its run records (no weights needed).
The rebuild of the default model, with its exact ship command, is in docs/scenes_models.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from pathlib import Path

import cait
from cait.checkpoint import WEIGHTS_DIR, load_into, save_weights
from cait.data.scenes import PIXEL_NOISE
from cait.evaluate import format_table
from cait.metrics import lowest_class, percent
from cait.robustness import POINTING_ROWS, headline, shipped_summary
from cait.runs import RunDir, continued, write_jsonl
from cait.train.calibration import ClassBias, apply_class_bias

LOCALIZATION_NOTE = """
Localization uses the garment's box and the true class. "chance" is what a map whose maximum falls at
a random place scores. Costly methods ran on fewer images, as the last column says.
"""


REPO = Path(__file__).resolve().parent.parent
_ABSOLUTE = re.compile(r"(?<![\w.~:/-])/[^\s'\"`|,;)]+")


def portable(text: str, root: Path = REPO) -> str:
    """`text` with every absolute path made machine-free: relative to the repository when inside it, else
    from its last `runs` folder on (where `cait.train --output` puts runs), else its file name alone."""

    def short(match: re.Match) -> str:
        path = Path(match.group(0))
        if path.is_relative_to(root):
            return str(path.relative_to(root))
        parts = path.parts
        if "runs" in parts:
            return str(Path(*parts[len(parts) - parts[::-1].index("runs") - 1 :]))
        return path.name

    return _ABSOLUTE.sub(short, text)


def history(runs: list[Path]) -> tuple[list[dict], list[str], list[dict]]:
    """(metrics, commands, each run's args) of runs that continue one another, oldest first; epochs and steps
    are counted on from the earlier runs, so the metrics read as one training. Paths are made portable()."""
    records = [RunDir(run).read_record() for run in runs]
    missing = [str(run) for run, record in zip(runs, records) if not record["commands"]]
    if missing:
        raise SystemExit(f"not a run directory (no args.json with its command): {', '.join(missing)}")
    epochs = continued([RunDir(run).read_metrics() for run in runs])
    commands = [portable(c) for r in records for c in r["commands"]]
    run_args = [{k: portable(v) if isinstance(v, str) else v for k, v in r["args"].items()} for r in records]
    return epochs, commands, run_args


def teachers_by_stage(run_args: list[dict]) -> list[str]:
    """Which teacher taught which stages (runs, oldest first) and at what size, one entry per span of stages
    with the same teacher: a line whose teacher changed names every teacher, not only the last."""
    spans = []
    for (teacher, size), group in itertools.groupby(
        enumerate(run_args, 1), key=lambda stage: (stage[1].get("teacher"), stage[1].get("teacher_img_size"))
    ):
        numbers = [n for n, _ in group]
        span = f"stage {numbers[0]}" if len(numbers) == 1 else f"stages {numbers[0]}-{numbers[-1]}"
        who = "no teacher" if teacher is None else f"`{teacher}`" + (f" at {size} px" if size else "")
        spans.append(f"{who} ({span})")
    return spans


def teacher_row(run_args: list[dict], teacher: tuple[list[dict], list[str], list[dict]] | None) -> str:
    """The card's lines on distillation, from each run's args (oldest first): how the teacher taught, which
    teacher taught which stages, and the last teacher's own test top-1 and commands. The stages after the last
    taught one (a fine-tuning without a teacher) are named in the spans."""
    taught = [a for a in run_args if a.get("teacher")]
    if not taught:
        return ""
    args = taught[-1]
    how = f"{args.get('distill_type', 'hard')} distillation through the class token, alpha {args['distill_alpha']}"
    if args.get("distill_type") == "soft":
        how += f", tau {args['distill_tau']}"
    spans = teachers_by_stage(run_args)
    if len(spans) > 1:
        how += f"; by stage, oldest first: {', '.join(spans)} (`--teacher`, `--teacher-img-size`)"
    elif args.get("teacher_img_size"):
        how += f", the teacher run at {args['teacher_img_size']} px (`--teacher-img-size`)"
    last = (" (the last stage's)" if args is run_args[-1] else " (the last taught stage's)") if len(spans) > 1 else ""
    rows = f"| distillation | {how} |\n| teacher | `{args['teacher']}`{last}"
    if teacher is None:
        return rows + " |\n"
    epochs, commands, teacher_args = teacher
    # the teacher's last run scored it at its training size, which may not be the size it teaches at
    size = f" at {teacher_args[-1]['img_size']} px" if teacher_args[-1].get("img_size") else ""
    return (
        rows + f": {percent(epochs[-1]['val_top1']):.2f}% test top-1{size} after {epochs[-1]['epoch']} epochs, "
        f"trained here by `{'` then `'.join(commands)}` |\n"
    )


def how_taught(run_args: list[dict]) -> str:
    """The card's words on how training began and when a teacher joined, from the first and the last run's args
    (oldest first): a stage that continues a distilled run does not make the whole line "then distilled"."""
    first, last = run_args[0], run_args[-1]
    start = f"from `{first['init']}`" if first.get("init") else "from scratch"
    if first.get("teacher"):
        after = "" if last.get("teacher") else ", the last stage without it"
        return f" ({start}, distilled from a convolutional teacher from the first epoch{after})"
    return f" ({start}, then distilled from a convolutional teacher)" if last.get("teacher") else ""


def resolution_row(trained_size: int | None, shipped_size: int) -> str:
    """The card's line on testing above the training size, or "" when the two are the same."""
    if trained_size in (None, shipped_size):
        return ""
    return (
        f"| input size | trained at {trained_size} px, shipped at {shipped_size} px: the position embedding "
        f"resampled (bicubic, DeiT's rule). Random-resized crops make objects look larger in training than "
        f"at test; a test size above the training size makes up for it (FixRes, Touvron et al. 2019) |\n"
    )


def calibration_row(report: dict | None) -> str:
    """The card's line on the head bias `scripts/calibrate_head.py` chose (its JSON report), or ""."""
    if report is None:
        return ""
    fit = report["fit"]
    checks = "; ".join(
        f"on the {c['images']} scenes of seed {c['scene_seed']}{' (the test scenes)' * (c['scene_seed'] == 0)} "
        f"top-1 {100 * c['before']['top1']:.2f} -> {100 * c['after']['top1']:.2f}%, lowest class "
        f"{100 * c['before']['lowest']:.1f} -> {100 * c['after']['lowest']:.1f}%"
        for c in report["checks"]
    )
    return (
        f"| head bias | {report['class']}'s logit + {fit['bias']:g} after training (`scripts/calibrate_head.py`, "
        f"`cait.train.calibration`): the bias that makes the lowest per-class top-1 highest on {fit['images']} held-out "
        f"scenes (seed {fit['scene_seed']}), where it took the lowest class from {100 * lowest_class(fit['per_class_before'])[1]:.1f} "
        f"to {100 * lowest_class(fit['per_class_after'])[1]:.1f}% and top-1 from {100 * fit['top1_before']:.2f} to "
        f"{100 * fit['top1_after']:.2f}%; {checks}. It moves errors from {report['class']} to its neighbours; "
        f"class attention and the gradients of each class's logit are unchanged |\n"
    )


def data_row(data: str, run_args: list[dict]) -> str:
    """The card's line on the data: the test split scores every number, except the training curve's test top-1
    in the runs (stages, oldest first) that checked each epoch on a subset of it (`--val-subset`)."""
    subsets = [(stage, a["val_subset"]) for stage, a in enumerate(run_args, 1) if a.get("val_subset")]
    scope = "every number below"
    if subsets:
        where = "; ".join(
            f"{'in stage ' + str(stage) + ', ' if len(run_args) > 1 else ''}on {n} of its images (`--val-subset {n}`)"
            for stage, n in subsets
        )
        scope = f"the evaluation below and the training curve's test top-1, except {where}"
    return (
        f"| data | `{data}` (real Fashion-MNIST from Debian's `dataset-fashion-mnist`, MIT licence); train split for "
        f"training, the 10k test split for {scope} |"
    )


def final_top1_row(last: dict, args: dict, at_size: str) -> str:
    """The card's line on the last epoch's test top-1, saying what it was measured on: the test split, or the
    `--val-subset` images of it that the last run checked each epoch on (the evaluation below scores all)."""
    ema = "" if last.get("val_top1_ema") is None else f", {percent(last['val_top1_ema']):.2f}% (EMA)"
    n = args.get("val_subset")
    on = f" on {n} images of the test split (`--val-subset {n}`)" if n else ""
    whole = "; the whole split: the evaluation below" if n else ""
    return f"| final test top-1 | {percent(last['val_top1']):.2f}% (raw weights){ema}{on}{at_size}{whole} |"


def card(
    name: str,
    past: tuple[list[dict], list[str], list[dict]],
    weights: str,
    evaluation: dict,
    model: cait.CaiT,
    teacher: tuple[list[dict], list[str], list[dict]] | None = None,
    trained_size: int | None = None,
    calibration: dict | None = None,
) -> str:
    """The card of the last of the runs whose history() is `past`, with `teacher` = history() of the
    distillation teacher's runs, if any, and `calibration` the head-bias report, if any."""
    epochs, commands, run_args = past
    args = run_args[-1]  # the shipped run's arguments
    last = epochs[-1]
    hours = sum(e["epoch_seconds"] for e in epochs) / 3600
    cfg = model.cfg
    at_size = f", at the training size {trained_size} px" if trained_size not in (None, cfg.img_size) else ""
    resumed = " (one line per start: the run was resumed or continued)" if len(commands) > 1 else ""
    commands = "\n".join("    " + c for c in commands)
    precision = " then ".join(dict.fromkeys(f"`--precision {a['precision']}`" for a in run_args))
    seeds = " then ".join(str(a["seed"]) for a in run_args)
    seeds += " (one per run, oldest first)" if len(run_args) > 1 else ""
    return f"""# Model card: `{name}`

A small CaiT (talking-heads self-attention, a 2-layer class-attention stage, LayerScale on every
residual branch) trained by this project{how_taught(run_args)}, shipped so that the app and the analysis
scripts show a real trained model offline. It is **not** an ImageNet model and none of its numbers
are the paper's.

| | |
|---|---|
| architecture | {cfg.depth} SA + {cfg.depth_token_only} CA layers, dim {cfg.embed_dim}, {cfg.num_heads} heads, patch {cfg.patch_size}, {cfg.img_size}x{cfg.img_size}x{cfg.in_chans} input, LayerScale eps {cfg.init_values} |
| parameters / FLOPs | {model.num_params() / 1e6:.2f} M / {model.flops() / 1e6:.1f} M multiply-accumulates |
{data_row(args["data"], run_args)}
| weights shipped | `{weights}` weights after the last epoch (no checkpoint selection on the test split) |
| seed | {seeds} |
| training time | {hours:.2f} h on a 2-core CPU shared with other work; autocast {precision} (auto is bf16 only where it measures faster than fp32) |
{final_top1_row(last, args, at_size)}
{resolution_row(trained_size, cfg.img_size)}{teacher_row(run_args, teacher)}{calibration_row(calibration)}
Exact command{resumed}:

{commands}

## Training curve (from `{name}.metrics.jsonl`, one line per epoch)

| epoch | train loss | test top-1 | test top-1 (EMA) | lr | img/s |
|---|---|---|---|---|---|
{curve_rows(epochs)}

{evaluation_section(name, args["data"], evaluation)}"""


def curve_rows(epochs: list[dict]) -> str:
    """The card's training-curve table rows, one per epoch (top-1 in percent; the EMA cell empty without EMA)."""
    return "\n".join(
        f"| {e['epoch']} | {e['train_loss']:.3f} | {percent(e['val_top1']):.2f} | "
        f"{'' if e.get('val_top1_ema') is None else format(percent(e['val_top1_ema']), '.2f')} | "
        f"{e['lr']:.2e} | {e['images_per_s']:.0f} |"
        for e in epochs
    )


def evaluation_section(name: str, data: str, evaluation: dict) -> str:
    """The card's evaluation section: the command that scores the shipped model, and its table."""
    return f"""## Evaluation (`python -m cait.evaluate --model {name} --data {data}`)
{LOCALIZATION_NOTE if evaluation.get("localization") else ""}
```
{format_table(evaluation)}
```
"""


ROBUSTNESS_HEADING = "## Robustness"
OWN = " (the renderer's)"  # the noise level every shipped model was trained on


def robustness_section(name: str, record: dict) -> str:
    """The card's robustness section from `cait.robustness.shipped_summary`'s record: top-1 and CA-1 / CA-2
    pointing per corruption and severity, the mean per severity, and the pixel-noise shift."""
    rows, clean = record["rows"], record["clean"]
    severities = sorted({r["severity"] for r in rows})

    def cell(row: dict) -> str:
        points = " / ".join(f"{100 * row[f'{n}_pointing']:.0f}" for n in POINTING_ROWS if f"{n}_pointing" in row)
        return f"{100 * row['top1']:.1f}" + (f" ({points})" if points else "")

    table = [
        "| corruption | " + " | ".join(f"severity {s}" for s in severities) + " |",
        "|---|" + "---|" * len(severities),
    ]
    for corruption in dict.fromkeys(r["corruption"] for r in rows):
        by = {r["severity"]: r for r in rows if r["corruption"] == corruption}
        table.append(f"| {corruption} | " + " | ".join(cell(by[s]) if s in by else "" for s in severities) + " |")
    means = record["mean_top1_by_severity"]
    table.append("| **mean top-1** | " + " | ".join(f"**{100 * means[str(s)]:.1f}**" for s in severities) + " |")
    images, data = clean["images"], record.get("data", "fashion-mnist-scenes")
    spec = "all" if severities == [1, 2, 3, 4, 5] else " ".join(f"all:{s}" for s in severities)
    scenes = data == "fashion-mnist-scenes"  # only scenes have boxes, so pointing
    what = "test scenes" if scenes else f"{data} test images"
    shown = "top-1 % and, in brackets, CA-1 / CA-2 head-mean pointing %" if scenes else "top-1 %"
    flag = "" if scenes else f" --data {data}"
    text = f"""{ROBUSTNESS_HEADING}

The ImageNet-C corruptions (`cait.corruptions`, Hendrycks & Dietterich 2019's parameters) applied to the
model's input view of the first {images} {what} (corruption seed {record["corruption_seed"]},
{record["precision"]}): {shown}. Clean: {cell(clean)}.
In one line: {headline(record)}.

    python -m cait.evaluate --model {name}{flag} --subset {images} --corruption {spec} --precision fp32 --batch-size 64 --json sweep.json

{chr(10).join(table)}
"""
    shifts = record.get("noise_shift")
    if shifts:
        lines = "\n".join(
            f"| {r['pixel_noise']:g}{OWN * (r['pixel_noise'] == PIXEL_NOISE)} | {r['images']} | "
            f"{100 * r['top1']:.1f} | {100 * r['ca1_mean_pointing']:.1f} | {100 * r['ca2_mean_pointing']:.1f} |"
            for r in shifts
        )
        text += f"""
The renderer's own test scenes at other pixel-noise levels (`--pixel-noise STD`, the first test scenes): the
accuracy tied to the renderer's noise level, and whether class attention still finds the garment.

| pixel noise std | scenes | top-1 % | CA-1 pointing % | CA-2 pointing % |
|---|---|---|---|---|
{lines}
"""
    return text


def with_section(card_text: str, section: str) -> str:
    """`card_text` with its robustness section replaced by `section`, or `section` put after the evaluation."""
    start = card_text.find(ROBUSTNESS_HEADING + "\n")
    if start < 0:
        evaluation = card_text.find("## Evaluation")
        start = card_text.find("\n## ", evaluation + 1) + 1 if evaluation >= 0 else 0
        end = start
        if start == 0:  # no section after the evaluation: at the end
            start = end = len(card_text)
    else:
        following = card_text.find("\n## ", start + 1)
        end = len(card_text) if following < 0 else following + 1
    return card_text[:start] + section + ("\n" if end < len(card_text) else "") + card_text[end:]


def ship_robustness(name: str, sweep: Path | None, noise_shift: list[Path]) -> str:
    """Write WEIGHTS_DIR/<name>.robustness.json from the evaluation JSONs (sweep None: keep the record shipped)
    and put its section in the card."""
    path = WEIGHTS_DIR / f"{name}.robustness.json"
    if sweep is None:
        record = json.loads(path.read_text())
    else:
        record = shipped_summary(json.loads(sweep.read_text()), [json.loads(p.read_text()) for p in noise_shift])
        path.write_text(json.dumps(record, indent=1) + "\n")
    card_path = WEIGHTS_DIR / f"{name}.md"
    card_path.write_text(with_section(card_path.read_text(), robustness_section(name, record)))
    return headline(record)


def as_variant(trained: cait.CaiT, name: str) -> cait.CaiT:
    """`trained`'s weights in a model of variant `name`, whose config must describe the same model. Only the
    input size may differ: the position embedding is then resampled (DeiT's rule), and the card says so."""
    differ = trained.cfg.network_differences(cait.get_config(name), ignore={"img_size"})
    if differ:
        raise SystemExit(f"the run's model is not {name} (run vs variant): " + "; ".join(differ))
    model = cait.CaiT(cait.get_config(name))
    load_into(model, trained.state_dict(), f"the run's weights ({trained.cfg.img_size} px)")
    return model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, nargs="?", help="training output directory")
    p.add_argument("--weights", choices=("last", "ema"), default="ema")
    p.add_argument("--eval", type=Path, help="JSON written by python -m cait.evaluate --json (needed with a run)")
    p.add_argument(
        "--robustness", type=Path, default=None, help="JSON of python -m cait.evaluate --corruption ... --json"
    )
    p.add_argument(
        "--noise-shift",
        type=Path,
        nargs="+",
        default=[],
        help="JSONs of python -m cait.evaluate [--pixel-noise STD] --json on the same scenes (noise levels)",
    )
    p.add_argument(
        "--robustness-only",
        default=None,
        metavar="NAME",
        help="only write the robustness section of shipped model NAME's card (and NAME.robustness.json)",
    )
    p.add_argument(
        "--continues",
        type=Path,
        action="append",
        default=[],
        metavar="RUN",
        help="earlier run directory whose weights this run started from (--init), oldest first",
    )
    p.add_argument(
        "--teacher-run",
        type=Path,
        action="append",
        default=[],
        metavar="RUN",
        help="run directory (oldest first when continued) that trained the --teacher, for its number",
    )
    p.add_argument(
        "--name",
        default=None,
        help="variant to ship as (default: the run's --model); its config must be the run's model, "
        "training-only fields aside, except the input size, which may differ: the position "
        "embedding is resampled and the card says so (e.g. a run of --model cait_nano_64 "
        "--img-size 96 ships as cait_nano_104)",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        default=None,
        metavar="JSON",
        help="report of scripts/calibrate_head.py on the run's weights: its head bias is applied to the "
        "shipped weights and the card says so (--eval is then of its calibrated weights)",
    )
    p.add_argument(
        "--card-only",
        action="store_true",
        help="rewrite the card, metrics and evaluation of the model already shipped as --name from the run "
        "records, leaving its weights file as it is (the run directories need no weights)",
    )
    p.add_argument("--note", default="", help="a sentence put at the top of the card (e.g. an interim snapshot)")
    p.add_argument(
        "--extra",
        type=Path,
        action="append",
        default=[],
        help="markdown file(s) appended to the card (e.g. how the model was made, what it does badly)",
    )
    return p.parse_args(argv)


def shipped_model(args: argparse.Namespace, run: RunDir, name: str) -> tuple[cait.CaiT, int | None, dict | None]:
    """(the model to ship as `name`, the size it was trained at, the head-bias report): the run's weights as the
    variant with the bias applied, or with --card-only the weights already shipped (the bias is in them)."""
    calibration = json.loads(args.calibration.read_text()) if args.calibration else None
    if args.card_only:
        last = run.read_args()
        trained_size = last.get("img_size") or cait.get_config(last["model"]).img_size
        model = cait.load_model(name).model
    else:
        trained = cait.load_model(None, run.checkpoint(args.weights)).model
        trained_size, model = trained.cfg.img_size, as_variant(trained, name)
    if calibration is not None and calibration["img_size"] != model.cfg.img_size:
        raise SystemExit(
            f"{args.calibration} was fitted at {calibration['img_size']} px, {name} is {model.cfg.img_size} px"
        )
    if calibration is not None and not args.card_only:
        apply_class_bias(model, ClassBias.from_dict(calibration["fit"]))
    return model, trained_size, calibration


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.robustness_only:
        if args.robustness is None or args.run is not None:
            raise SystemExit("--robustness-only needs --robustness and no run")
        print(f"{args.robustness_only}: {ship_robustness(args.robustness_only, args.robustness, args.noise_shift)}")
        return
    if args.run is None or args.eval is None:
        raise SystemExit("a run directory and --eval are needed (or --robustness-only)")
    run = RunDir(args.run)
    run_args = run.read_record()
    name = args.name or run_args["args"]["model"]
    if cait.get_config(name).pretrained != f"{name}.safetensors":
        raise SystemExit(f"{name} has no shipped-weights entry in cait/config.py")
    model, trained_size, calibration = shipped_model(args, run, name)
    if not args.card_only:
        save_weights(
            model, WEIGHTS_DIR / f"{name}.safetensors", metadata={"run_command": portable(run_args["commands"][-1])}
        )
    past = history([*args.continues, args.run])
    write_jsonl(WEIGHTS_DIR / f"{name}.metrics.jsonl", past[0])
    # the evaluation of the run's checkpoint is, from now on, the evaluation of the shipped variant
    evaluation = {**json.loads(args.eval.read_text()), "model": name}
    (WEIGHTS_DIR / f"{name}.eval.json").write_text(json.dumps(evaluation, indent=1) + "\n")
    teacher = history(args.teacher_run) if args.teacher_run else None
    text = card(name, past, args.weights, evaluation, model, teacher, trained_size, calibration)
    if args.note:
        title, rest = text.split("\n", 1)
        text = f"{title}\n\n> **{args.note}**\n{rest}"
    for extra in args.extra:
        text += "\n" + extra.read_text()
    (WEIGHTS_DIR / f"{name}.md").write_text(text)
    shipped_record = WEIGHTS_DIR / f"{name}.robustness.json"
    if args.robustness or (args.card_only and shipped_record.is_file()):
        # a rewritten card keeps the robustness section of the record shipped with these weights
        ship_robustness(name, args.robustness, args.noise_shift)
    else:  # new weights: a record of the earlier ones would be wrong
        shipped_record.unlink(missing_ok=True)
    done = "card of" if args.card_only else "shipped"
    print(f"{done} {name}: {WEIGHTS_DIR / name}.safetensors (+ .md, .metrics.jsonl, .eval.json)")


if __name__ == "__main__":
    main()
