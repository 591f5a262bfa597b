"""scripts/ship_model.py: a run continued from an earlier run's weights ships with the whole history."""

import json
from pathlib import Path

import pytest
import torch

import cait
from scripts import ship_model


def _run(path: Path, commands: list[str], precision: str, epochs: int, steps_per_epoch: int, **args) -> Path:
    path.mkdir()
    (path / "args.json").write_text(json.dumps({"args": {"precision": precision, **args}, "commands": commands}))
    lines = [
        {"epoch": e, "step": e * steps_per_epoch, "val_top1": 0.5 + e / 100, "epoch_seconds": 60.0}
        for e in range(1, epochs + 1)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_history_counts_epochs_and_steps_on_across_runs(tmp_path):
    first = _run(
        tmp_path / "first", ["python -m cait.train --epochs 3", "python -m cait.train --resume first"], "bf16", 3, 100
    )
    second = _run(tmp_path / "second", ["python -m cait.train --init first/ema.safetensors"], "auto", 2, 100)
    epochs, commands, run_args = ship_model.history([first, second])
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4, 5]
    assert [e["step"] for e in epochs] == [100, 200, 300, 400, 500]
    assert [e["val_top1"] for e in epochs] == [0.51, 0.52, 0.53, 0.51, 0.52]  # the second run's own numbers
    assert commands[-1].endswith("--init first/ema.safetensors") and len(commands) == 3
    assert [a["precision"] for a in run_args] == ["bf16", "auto"]


def test_history_refuses_a_directory_that_is_not_a_run(tmp_path):
    first = _run(tmp_path / "first", ["python -m cait.train --epochs 3"], "fp32", 3, 100)
    with pytest.raises(SystemExit, match="not a run directory.*typo"):
        ship_model.history([tmp_path / "typo", first])


def test_the_card_says_when_the_teacher_joined():
    plain, taught, again = {}, {"teacher": "t"}, {"init": "w.safetensors", "teacher": "t"}
    assert ship_model.how_taught([plain]) == ""
    assert ship_model.how_taught([plain, taught]) == " (from scratch, then distilled from a convolutional teacher)"
    assert ship_model.how_taught([taught, again]) == (
        " (from scratch, distilled from a convolutional teacher from the first epoch)"
    )
    assert ship_model.how_taught([again]).startswith(" (from `w.safetensors`, distilled")
    assert ship_model.how_taught([taught, again, plain]) == (
        " (from scratch, distilled from a convolutional teacher from the first epoch, the last stage without it)"
    )


def test_teacher_row_names_the_teacher_its_number_and_how_it_taught(tmp_path):
    assert ship_model.teacher_row([{"teacher": None}], None) == ""
    teacher = _run(
        tmp_path / "teacher", ["python -m cait.train --model timm:resnet10t --epochs 4"], "auto", 4, 10, img_size=112
    )
    args = {"teacher": "t.safetensors", "distill_type": "soft", "distill_alpha": 0.5, "distill_tau": 3.0}
    row = ship_model.teacher_row([args], ship_model.history([teacher]))
    assert "| teacher | `t.safetensors`: 54.00% test top-1 at 112 px after 4 epochs" in row
    assert "--model timm:resnet10t" in row and "soft distillation through the class token, alpha 0.5, tau 3.0 |" in row
    # a teacher run above its training size says so
    row = ship_model.teacher_row([{**args, "teacher_img_size": 80}], None)
    assert "tau 3.0, the teacher run at 80 px (`--teacher-img-size`) |" in row


def test_teacher_row_names_every_teacher_of_a_line_whose_teacher_changed():
    old, new = (
        {"teacher": "old.safetensors", "teacher_img_size": 88},
        {"teacher": "new.safetensors", "teacher_img_size": 128},
    )
    stages = [{}, old, old, new, {**new, "teacher_img_size": 136}]
    assert ship_model.teachers_by_stage(stages) == [
        "no teacher (stage 1)",
        "`old.safetensors` at 88 px (stages 2-3)",
        "`new.safetensors` at 128 px (stage 4)",
        "`new.safetensors` at 136 px (stage 5)",
    ]
    args = {"distill_type": "hard", "distill_alpha": 0.5}
    row = ship_model.teacher_row([{**args, **s} for s in stages], None)
    assert "alpha 0.5; by stage, oldest first: no teacher (stage 1), `old.safetensors` at 88 px (stages 2-3)" in row
    assert "| teacher | `new.safetensors` (the last stage's) |" in row and "the teacher run at" not in row
    # a fine-tuning without a teacher after the taught stages keeps the distillation row, naming the stage
    row = ship_model.teacher_row([{**args, **s} for s in [*stages, {}]], None)
    assert "`new.safetensors` at 136 px (stage 5), no teacher (stage 6)" in row
    assert "| teacher | `new.safetensors` (the last taught stage's) |" in row


def test_the_card_lists_every_method_and_each_run_seed(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "args.json").write_text(
        json.dumps(
            {
                "args": {"precision": "auto", "data": "fashion-mnist-scenes", "seed": 0},
                "commands": ["python -m cait.train --epochs 1"],
            }
        )
    )
    line = {
        "epoch": 1,
        "step": 10,
        "train_loss": 1.0,
        "val_top1": 0.5,
        "val_top1_ema": None,
        "lr": 1e-3,
        "images_per_s": 100.0,
        "epoch_seconds": 60.0,
    }
    (run / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    methods = ("chance", "ca1_head1", "ca2_head2", "rollout_after_proj_l", "rollout_after_proj_w")
    rows = [{"method": m, "pointing_game": 0.5, "mass_in_box": 0.4, "images": 8} for m in methods]
    evaluation = {"images": 8, "top1": 0.5, "per_class_top1": {}, "localization": rows}
    text = ship_model.card(
        "cait_pico_32",
        ship_model.history([run]),
        "last",
        evaluation,
        cait.load_model("cait_pico_32", weights=False).model,
    )
    assert all(f"{m} " in text for m in methods) and "Localization uses the garment's box" in text
    assert "| final test top-1 | 50.00% (raw weights) |" in text and "| 1 | 1.000 | 50.00 |  |" in text
    assert "| seed | 0 |" in text
    later = tmp_path / "later"  # a second stage with its own seed: the card names both
    later.mkdir()
    (later / "args.json").write_text((run / "args.json").read_text().replace('"seed": 0', '"seed": 1'))
    (later / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    text = ship_model.card(
        "cait_pico_32",
        ship_model.history([run, later]),
        "last",
        evaluation,
        cait.load_model("cait_pico_32", weights=False).model,
    )
    assert "| seed | 0 then 1 (one per run, oldest first) |" in text
    assert "the 10k test split for every number below |" in text
    # a last stage that checked its epochs on part of the test split says so, where its number stands
    (later / "args.json").write_text(
        (run / "args.json").read_text().replace('"seed": 0', '"seed": 1, "val_subset": 2000')
    )
    text = ship_model.card(
        "cait_pico_32",
        ship_model.history([run, later]),
        "last",
        evaluation,
        cait.load_model("cait_pico_32", weights=False).model,
    )
    assert (
        "| final test top-1 | 50.00% (raw weights) on 2000 images of the test split (`--val-subset 2000`); "
        "the whole split: the evaluation below |" in text
    )
    assert "test top-1, except in stage 2, on 2000 of its images (`--val-subset 2000`) |" in text


def test_as_variant_takes_the_run_model_where_only_the_input_size_may_differ():
    import pytest

    wide = cait.load_model("cait_nano_64", weights=False, embed_dim=192, num_heads=4, drop_path_rate=0.0).model
    with pytest.raises(SystemExit, match=r"cait_nano_64 \(run vs variant\): embed_dim: 192 vs 128"):
        ship_model.as_variant(wide, "cait_nano_64")
    trained = cait.load_model(
        "cait_nano_64", weights=False, img_size=56, drop_path_rate=0.0
    ).model  # a run with --img-size 56
    shipped = ship_model.as_variant(trained, "cait_nano_64")
    assert shipped.cfg == cait.get_config("cait_nano_64")  # the variant's config, training-only fields included
    assert shipped.pos_embed.shape[1] == 64 and torch.equal(shipped.head.weight, trained.head.weight)
    assert "trained at 56 px, shipped at 64 px" in ship_model.resolution_row(56, 64)
    assert ship_model.resolution_row(64, 64) == ""


def test_a_calibrated_model_says_its_head_bias_and_what_it_did():
    assert ship_model.calibration_row(None) == ""
    fit = {
        "scene_seed": 1,
        "index": 6,
        "bias": 0.55,
        "images": 5000,
        "top1_before": 0.8064,
        "top1_after": 0.8024,
        "per_class_before": [0.775, 0.506, 0.9],
        "per_class_after": [0.70, 0.658, 0.9],
    }
    check = {
        "scene_seed": 0,
        "images": 10000,
        "before": {"top1": 0.8071, "lowest": 0.531},
        "after": {"top1": 0.8013, "lowest": 0.623},
    }
    row = ship_model.calibration_row({"class": "Shirt", "img_size": 136, "fit": fit, "checks": [check]})
    assert row.startswith("| head bias | Shirt's logit + 0.55 after training")
    assert "on 5000 held-out scenes (seed 1), where it took the lowest class from 50.6 to 65.8%" in row
    assert "top-1 from 80.64 to 80.24%" in row
    assert "on the 10000 scenes of seed 0 (the test scenes) top-1 80.71 -> 80.13%, lowest class 53.1 -> 62.3%" in row


def test_portable_paths_name_no_machine(tmp_path):
    root = tmp_path / "repo"
    text = (
        f"--init /home/me/exp/runs/s1/last.safetensors --teacher {root}/cait/weights/t.safetensors "
        "--output runs/s2 --data /srv/data/scenes.npy --url https://example.org/a/b"
    )
    assert ship_model.portable(text, root) == (
        "--init runs/s1/last.safetensors --teacher cait/weights/t.safetensors "
        "--output runs/s2 --data scenes.npy --url https://example.org/a/b"
    )


def test_history_and_card_carry_no_absolute_path(tmp_path):
    run = _run(
        tmp_path / "run",
        [f"python -m cait.train --init {tmp_path}/runs/s0/last.safetensors --output {tmp_path}/runs/run"],
        "auto",
        1,
        10,
        init=f"{tmp_path}/runs/s0/last.safetensors",
        teacher="/data/runs/t/last.safetensors",
    )
    _, commands, run_args = ship_model.history([run])
    assert commands == ["python -m cait.train --init runs/s0/last.safetensors --output runs/run"]
    assert run_args[0]["init"] == "runs/s0/last.safetensors" and run_args[0]["teacher"] == "runs/t/last.safetensors"


def test_card_only_rewrites_the_card_and_leaves_the_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(ship_model, "WEIGHTS_DIR", tmp_path / "weights")
    (tmp_path / "weights").mkdir()
    run = _run(
        tmp_path / "run",
        [f"python -m cait.train --model cait_nano_28 --output {tmp_path}/runs/run"],
        "auto",
        2,
        10,
        model="cait_nano_28",
        data="fashion-mnist",
        seed=0,
        img_size=None,
    )
    lines = [  # the card's curve needs every column of a real metrics line
        {**json.loads(line), "train_loss": 1.0, "lr": 1e-3, "images_per_s": 100.0}
        for line in (run / "metrics.jsonl").read_text().splitlines()
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    evaluation = tmp_path / "eval.json"
    evaluation.write_text(json.dumps({"images": 8, "top1": 0.9, "per_class_top1": {}}))
    extra = tmp_path / "extra.md"
    extra.write_text("## What it does badly\n\nShirt.\n")
    ship_model.main(
        [str(run), "--card-only", "--name", "cait_nano_28", "--eval", str(evaluation), "--extra", str(extra)]
    )
    written = sorted(p.name for p in (tmp_path / "weights").iterdir())
    assert written == ["cait_nano_28.eval.json", "cait_nano_28.md", "cait_nano_28.metrics.jsonl"]  # no weights
    card = (tmp_path / "weights" / "cait_nano_28.md").read_text()
    assert "--output runs/run" in card and str(tmp_path) not in card
    assert "| input size |" not in card and card.endswith("Shirt.\n")
    # the robustness section: --robustness-only adds it and the record; a later --card-only keeps both
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps(_sweep_result()))
    ship_model.main(["--robustness-only", "cait_nano_28", "--robustness", str(sweep)])
    record = (tmp_path / "weights" / "cait_nano_28.robustness.json").read_text()
    with_robustness = (tmp_path / "weights" / "cait_nano_28.md").read_text()
    assert with_robustness.index("## Robustness") < with_robustness.index("## What it does badly")
    ship_model.main(
        [str(run), "--card-only", "--name", "cait_nano_28", "--eval", str(evaluation), "--extra", str(extra)]
    )
    assert (tmp_path / "weights" / "cait_nano_28.md").read_text() == with_robustness
    assert (tmp_path / "weights" / "cait_nano_28.robustness.json").read_text() == record


def _sweep_result() -> dict:
    """An `evaluate --corruption all:1 all:3` result in miniature: two corruptions, two severities."""
    row = lambda c, s, t: {
        "corruption": c,
        "severity": s,
        "images": 10,
        "top1": t,
        "per_class_top1": {},
        **{"ca1_mean_pointing": 0.9, "ca2_mean_pointing": 0.8, "ca1_mean_mass_in_box": 0.5},
    }
    rows = [row("contrast", 1, 0.7), row("contrast", 3, 0.5), row("pixelate", 1, 0.6), row("pixelate", 3, 0.2)]
    clean = {"images": 10, "top1": 0.8, "per_class_top1": {}, "ca1_mean_pointing": 1.0, "ca2_mean_pointing": 0.9}
    return {"precision": "fp32", "scene_seed": 0, "corruption": {"seed": 0, "clean": clean, "rows": rows}}


def test_the_robustness_section_tabulates_the_sweep_and_replaces_itself():
    noise = {
        "pixel_noise": 0.08,
        "images": 10,
        "top1": 0.3,
        "per_class_top1": {},
        "localization": [
            {"method": "ca1_mean", "pointing_game": 0.85, "mass_in_box": 0.4, "images": 10},
            {"method": "ca2_mean", "pointing_game": 0.7, "mass_in_box": 0.3, "images": 10},
        ],
    }
    own = {**noise, "pixel_noise": None, "top1": 0.75}  # evaluated without --pixel-noise: the renderer's 0.04
    record = ship_model.shipped_summary(_sweep_result(), [noise, own])
    assert record["mean_top1_by_severity"] == pytest.approx({"1": 0.65, "3": 0.35})
    assert [(r["pixel_noise"], r["top1"], r["ca1_mean_pointing"]) for r in record["noise_shift"]] == [
        (0.04, 0.75, 0.85),
        (0.08, 0.3, 0.85),
    ]
    assert "per_class_top1" not in record["rows"][0] and "ca1_mean_mass_in_box" not in record["rows"][0]
    section = ship_model.robustness_section("m", record)
    assert "| contrast | 70.0 (90 / 80) | 50.0 (90 / 80) |" in section and "| pixelate | 60.0 (90 / 80) |" in section
    assert "| **mean top-1** | **65.0** | **35.0** |" in section and "--corruption all:1 all:3" in section
    assert "| 0.04 (the renderer's) | 10 | 75.0 | 85.0 | 70.0 |\n| 0.08 | 10 | 30.0 | 85.0 | 70.0 |" in section
    assert ship_model.headline(record) == (
        "top-1 clean 80.0%, 35.0% mean over 2 corruptions at severity 3, "
        "30.0% with the renderer's pixel noise at std 0.08"
    )
    card = "# Model card\n\n## Evaluation\n\ntable\n\n## How this model was made\n\nstory\n"
    once = ship_model.with_section(card, section)
    assert once.index("## Evaluation") < once.index("## Robustness") < once.index("## How this model was made")
    assert ship_model.with_section(once, section) == once  # a second run replaces the section, adds nothing
    other = ship_model.with_section(once, section.replace("70.0", "71.0"))
    assert "71.0" in other and other.count("## Robustness") == 1 and other.endswith("story\n")
    assert ship_model.with_section("# card\n\n## Evaluation\n\nx\n", section).endswith(section)


def test_the_robustness_section_of_a_model_without_boxes_names_its_data():
    sweep = _sweep_result()
    sweep["data"] = "fashion-mnist"
    for row in [sweep["corruption"]["clean"], *sweep["corruption"]["rows"]]:
        row.pop("ca1_mean_pointing"), row.pop("ca2_mean_pointing")
    section = ship_model.robustness_section("m", ship_model.shipped_summary(sweep))
    assert "first 10 fashion-mnist test images" in section and "pointing" not in section
    assert "--model m --data fashion-mnist --subset 10 --corruption all:1 all:3" in section
    assert "| contrast | 70.0 | 50.0 |" in section
    scenes = ship_model.robustness_section("m", ship_model.shipped_summary(_sweep_result()))
    assert "first 10 test scenes" in scenes and "--data" not in scenes
