"""`python -m cait.train`: outputs, exact resume, NaN stop, signals, bad arguments, ImageFolder, distillation, DDP.

Runs use the tiny cait_pico_32 on a few hundred Fashion-MNIST images with one torch thread, mostly in
process (importing torch and timm in a subprocess costs seconds); the CLI-level behaviours (no traceback,
signals, torchrun) run as real subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file

import cait
import cait.train.args as train_args_mod
import cait.train.data as train_data
import cait.train.loop as train_mod
from cait.checkpoint import file_metadata
from cait.config import FASHION_MNIST_CLASSES, CaiTConfig
from cait.data import DataError, build_dataset
from cait.metrics import top1
from cait.preprocess import eval_transform
from cait.runs import read_metrics
from cait.train.loop import main, teacher_view
from cait.train.seeding import seeded
from cait.train.teacher import load_teacher

TINY = [
    "--model",
    "cait_pico_32",
    "--data",
    "fashion-mnist",
    "--batch-size",
    "32",
    "--workers",
    "0",
    "--threads",
    "1",
    "--val-subset",
    "64",
    "--warmup-epochs",
    "1",
    "--lr",
    "2e-3",
]
REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "cait.train", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
        **kw,
    )


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smoke")
    assert (
        main([*TINY, "--subset", "128", "--epochs", "2", "--ema", "0.9", "--precision", "fp32", "--output", str(out)])
        == 0
    )
    return out


def test_smoke_run_writes_every_file_and_metric(smoke_run):
    names = {p.name for p in smoke_run.iterdir()}
    assert {
        "last.safetensors",
        "best.safetensors",
        "ema.safetensors",
        "state.pt",
        "metrics.jsonl",
        "args.json",
    } <= names
    assert not [n for n in names if n.endswith(".tmp")]
    lines = [json.loads(line) for line in (smoke_run / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in lines] == [1, 2]
    m = lines[-1]
    for key in ("train_loss", "val_top1", "val_top1_ema", "lr", "images_per_s", "epoch_seconds"):
        assert isinstance(m[key], float) and np.isfinite(m[key]), key
    cfg = cait.get_config("cait_pico_32")
    # LayerScale: one row per block x gamma for every SA and CA block
    rows = {(r["stage"], r["layer"], r["gamma"]) for r in m["layerscale"]}
    expected = {
        (s, i, g)
        for s, n in (("sa", cfg.depth), ("ca", cfg.depth_token_only))
        for i in range(n)
        for g in ("gamma_1", "gamma_2")
    }
    assert rows == expected
    for r in m["layerscale"]:
        assert 0 <= r["p10"] <= r["median"] <= r["p90"]
        assert r["p10"] <= r["mean"] <= r["p90"] + 1e-6
    # after training, gamma has moved away from its init eps (0.1 for this config)
    assert any(abs(r["mean"] - cfg.init_values) > 1e-4 for r in m["layerscale"])
    ratios = m["residual_ratios"]
    assert {k: len(v) for k, v in ratios.items()} == {"sa": cfg.depth, "ffn": cfg.depth, "ca": 2, "ca_ffn": 2}
    assert all(v > 0 for vs in ratios.values() for v in vs)
    # class-attention entropy per CA layer and head, at most log(1 + N) nats
    entropy = np.array(m["ca_entropy"])
    assert entropy.shape == (cfg.depth_token_only, cfg.num_heads)
    assert (entropy > 0).all() and (entropy <= np.log(1 + cfg.num_patches) + 1e-4).all()
    saved = json.loads((smoke_run / "args.json").read_text())
    assert saved["args"]["model"] == "cait_pico_32" and "--subset 128" in saved["commands"][0]


def test_smoke_run_writes_top1_as_fractions(smoke_run):
    """val_top1 is the share of the 64 validation images the last weights get right, recounted here."""
    lines = [json.loads(line) for line in (smoke_run / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        for key in ("train_top1", "val_top1", "val_top1_ema"):
            assert 0 <= line[key] <= 1, key
        assert line["train_top1"] * 128 == pytest.approx(round(line["train_top1"] * 128))  # a share of 128 images
    model = cait.load_model(None, checkpoint=smoke_run / "last.safetensors").model.eval()
    val = train_data.Transformed(build_dataset("fashion-mnist", "val", subset=64), eval_transform(model.cfg))
    images = torch.stack([val[i][0] for i in range(len(val))])
    labels = torch.tensor([val[i][1] for i in range(len(val))])
    with torch.no_grad():
        predicted = model(images).argmax(1)
    assert lines[-1]["val_top1"] == top1(predicted, labels)
    assert float(file_metadata(smoke_run / "last.safetensors")["val_top1"]) == lines[-1]["val_top1"]
    assert read_metrics(smoke_run) == lines


def test_checkpoints_load_with_load_model(smoke_run):
    for name in ("last", "best", "ema"):
        model = cait.load_model(None, checkpoint=smoke_run / f"{name}.safetensors").model
        assert model.cfg.labels == FASHION_MNIST_CLASSES and model.cfg.num_classes == 10
    state = torch.load(smoke_run / "state.pt", map_location="cpu", weights_only=True)
    assert state["epoch"] == 2 and state["batch"] == 0 and state["step"] == 8  # 128 images / 32 per step x 2
    last = load_file(smoke_run / "last.safetensors")
    assert all(torch.equal(last[k], v) for k, v in state["model"].items())


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path)


@pytest.mark.parametrize(
    "amp,workers,pipeline", [("bf16", "0", "tensor"), ("fp32", "2", "tensor"), ("fp32", "2", "pil")]
)
def test_resume_is_exact(tmp_path, amp, workers, pipeline):
    """2 epochs in one go == stop mid-epoch, resume, stop at the epoch boundary, resume to the end."""
    args = [
        *TINY,
        "--subset",
        "192",
        "--epochs",
        "2",
        "--ema",
        "0.9",
        "--precision",
        amp,
        "--workers",
        workers,
        "--pipeline",
        pipeline,
    ]
    assert main([*args, "--output", str(tmp_path / "once")]) == 0
    assert main([*args, "--output", str(tmp_path / "split"), "--stop-after", "4"]) == 0
    state = torch.load(tmp_path / "split" / "state.pt", weights_only=True)
    assert (state["epoch"], state["batch"], state["step"]) == (0, 4, 4)
    assert main(["--resume", str(tmp_path / "split"), "--stop-after", "6"]) == 0  # 6 steps = 1 epoch
    assert main(["--resume", str(tmp_path / "split"), "--stop-after", "9"]) == 0  # mid-epoch 2: keeps epoch 1's line
    assert main(["--resume", str(tmp_path / "split")]) == 0
    for name in ("last.safetensors", "ema.safetensors"):
        once, split = _weights(tmp_path / "once" / name), _weights(tmp_path / "split" / name)
        assert once.keys() == split.keys()
        assert all(torch.equal(once[k], split[k]) for k in once), name
    m_once = (tmp_path / "once" / "metrics.jsonl").read_text().splitlines()
    m_split = (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(b)["epoch"] for b in m_split] == [1, 2]
    assert [json.loads(a)["train_loss"] for a in m_once] == [json.loads(b)["train_loss"] for b in m_split]
    assert len(json.loads((tmp_path / "split" / "args.json").read_text())["commands"]) == 4


def test_different_seed_gives_different_weights(tmp_path):
    # guards the resume test against passing because nothing random happens at all
    args = [*TINY, "--subset", "64", "--epochs", "1", "--precision", "fp32"]
    assert main([*args, "--output", str(tmp_path / "a"), "--seed", "1"]) == 0
    assert main([*args, "--output", str(tmp_path / "b"), "--seed", "2"]) == 0
    a, b = _weights(tmp_path / "a" / "last.safetensors"), _weights(tmp_path / "b" / "last.safetensors")
    assert not torch.equal(a["head.weight"], b["head.weight"])


def test_nan_loss_stops_with_message_and_keeps_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    # the loss turns NaN on step 6, inside epoch 2 (4 steps per epoch)
    real = train_mod.build_criterion

    def poisoned(args, num_classes):
        mixup, loss_fn = real(args, num_classes)
        calls = {"n": 0}

        def loss(logits, target):
            calls["n"] += 1
            value = loss_fn(logits, target)
            return value * float("nan") if calls["n"] == 6 else value

        return mixup, loss

    monkeypatch.setattr(train_mod, "build_criterion", poisoned)
    out = tmp_path / "run"
    assert main([*TINY, "--subset", "128", "--epochs", "3", "--precision", "fp32", "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert "loss is nan at epoch 2, batch 2, step 6" in err and "last.safetensors (end of epoch 1)" in err
    assert "Traceback" not in err
    state = torch.load(out / "state.pt", weights_only=True)
    assert (state["epoch"], state["step"]) == (1, 4)
    last = cait.load_model(None, checkpoint=out / "last.safetensors").model
    assert all(torch.isfinite(p).all() for p in last.parameters())
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_huge_lr_diverges_into_the_nan_stop(tmp_path, capsys):
    code = main(
        [
            *TINY,
            "--subset",
            "256",
            "--epochs",
            "1",
            "--precision",
            "fp32",
            "--warmup-epochs",
            "0",
            "--lr",
            "1e30",
            "--output",
            str(tmp_path),
        ]
    )
    assert code == 1
    assert "at epoch 1, batch" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model", "cait_nope"], "unknown model 'cait_nope'"),
        (["--batch-size", "0"], "--batch-size must be positive"),
        (["--epochs", "-1"], "--epochs must be positive"),
        (["--batch-size", "33"], "need an even --batch-size"),
        (["--data", "/no/such/dir"], "unknown dataset '/no/such/dir'"),
        (["--resume", "/no/such/run"], "not a run directory"),
        (["--subset", "16"], "cannot fill one batch of 32"),
        (["--teacher", "/no/teacher.safetensors"], "checkpoint not found"),
        (["--teacher-img-size", "0"], "--teacher-img-size must be positive"),
        (["--embed-dim", "48", "--num-heads", "5"], "--num-heads 5 does not divide --embed-dim 48"),
        (["--img-size", "30"], "--img-size 30 is not a multiple of --patch-size 8"),
        (["--depth", "0"], "--depth must be positive"),
        (["--depth-token-only", "0"], "the class token meets no patch (--class-token-at unset"),
        (["--depth-token-only", "0", "--class-token-at", "3"], "--class-token-at must be in [0, depth=2]"),
        (["--randaug", "augmix-m5"], "--pipeline pil runs any timm policy"),
    ],
)
def test_bad_arguments_get_one_line(argv, message, capsys, tmp_path):
    try:
        code = main([*TINY, "--output", str(tmp_path), *argv])
    except SystemExit as e:
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("python -m cait.train: error:")


def test_directory_without_images_is_a_clear_error(tmp_path, capsys):
    for split in ("train", "val"):
        (tmp_path / "data" / split / "cat").mkdir(parents=True)
    assert main([*TINY, "--data", str(tmp_path / "data"), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds no usable images" in err and len(err.splitlines()) == 1


def test_cli_bad_model_exits_2_without_traceback(tmp_path):
    proc = run_cli("--model", "cait_nope", "--output", str(tmp_path / "never"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "unknown model 'cait_nope'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_help_explains_every_flag():
    text = train_args_mod.build_parser().format_help()
    assert train_mod.__doc__.split("\n\n")[0] in text  # what the command is for, before its flags
    for action in train_args_mod.build_parser()._actions:
        assert action.help, action.dest
    for flag in (
        "--resume",
        "--teacher",
        "--randaug",
        "--ema",
        "--precision",
        "--drop-path",
        "--clip-grad",
        "--subset",
    ):
        assert flag in text


def _image_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("val", 3)):
        for k, cls in enumerate(("circle", "square")):
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 255, (40, 30, 3), dtype=np.uint8) // (k + 1)
                Image.fromarray(pixels).save(root / split / cls / f"{i}.png")
    return root


def test_image_folder_and_distillation_from_a_smaller_teacher(tmp_path):
    data = _image_folder(tmp_path / "shapes")
    # the teacher sees another resolution and channel count: teacher_view adapts the batch
    teacher = cait.load_model("cait_nano_28", weights=False, num_classes=2, labels=("circle", "square")).model
    cait.save_weights(teacher, tmp_path / "teacher.safetensors")
    out = tmp_path / "run"
    argv = [
        "--model",
        "cait_pico_32",
        "--data",
        str(data),
        "--batch-size",
        "4",
        "--workers",
        "0",
        "--threads",
        "1",
        "--epochs",
        "1",
        "--precision",
        "fp32",
        "--teacher",
        str(tmp_path / "teacher.safetensors"),
        "--output",
        str(out),
    ]
    assert main(argv) == 0
    model = cait.load_model(None, checkpoint=out / "last.safetensors").model
    assert model.cfg.num_classes == 2 and model.cfg.labels == ("circle", "square")
    assert json.loads((out / "metrics.jsonl").read_text())["val_top1"] is not None


def test_pipeline_flag_picks_where_images_are_augmented(tmp_path):
    folder = _image_folder(tmp_path / "shapes")
    cfg = cait.get_config("cait_pico_32")
    for data, pipeline, kind in (
        ("fashion-mnist", "auto", train_data.AugmentedPixels),
        ("fashion-mnist", "pil", train_data.Transformed),
        (str(folder), "auto", train_data.Transformed),
    ):
        args = train_args_mod.parse_args([*TINY, "--data", data, "--pipeline", pipeline])
        raw = build_dataset(data, "train", subset=64)
        images = train_data.train_images(args, cfg, raw)
        x, label = images[3]
        assert isinstance(images, kind) and x.shape == (3, 32, 32) and label == raw[3][1]
    # the tensor path gives the same kind of input as the PIL path: normalised, every channel in range
    args = train_args_mod.parse_args([*TINY, "--pipeline", "tensor", "--reprob", "0"])  # (erasing draws N(0, 1) noise)
    batch = torch.stack(
        [
            x
            for x, _ in train_data.train_images(
                args, cfg, build_dataset("fashion-mnist", "train", subset=64)
            ).__getitems__(list(range(32)))
        ]
    )
    assert batch.min() >= -1 - 1e-5 and batch.max() <= 1 + 1e-5 and batch.std() > 0.2
    args = train_args_mod.parse_args([*TINY, "--data", str(folder), "--pipeline", "tensor"])
    with pytest.raises(DataError, match="use --pipeline pil"):
        train_data.train_images(args, cfg, build_dataset(str(folder), "train"))


def test_cnn_teacher_trains_saves_resumes_and_distils(tmp_path):
    """--model timm:resnet10t trains on the same data (no CaiT statistics), is saved with its config, resumes,
    and as --teacher changes what the student learns."""
    cnn = tmp_path / "cnn"
    flags = [*TINY, "--model", "timm:resnet10t", "--subset", "64", "--epochs", "2", "--precision", "fp32"]
    assert main([*flags, "--output", str(cnn), "--stop-after", "3"]) == 0
    assert main(["--resume", str(cnn)]) == 0
    lines = [json.loads(line) for line in (cnn / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in lines] == [1, 2] and "layerscale" not in lines[-1]
    assert np.isfinite(lines[-1]["val_top1"])
    teacher = load_teacher(cnn / "last.safetensors")
    assert teacher.cfg.arch == "resnet10t" and (teacher.cfg.img_size, teacher.cfg.in_chans) == (28, 1)
    # --init starts a new CNN run from those weights
    args = train_args_mod.parse_args([*flags, "--init", str(cnn / "last.safetensors")])
    started = train_mod.build_model(args, teacher.cfg, fresh=True)
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in started.state_dict().items())
    student = [*TINY, "--subset", "64", "--epochs", "1", "--precision", "fp32", "--distill-alpha", "0.9"]
    assert main([*student, "--output", str(tmp_path / "alone")]) == 0
    assert main([*student, "--teacher", str(cnn / "last.safetensors"), "--output", str(tmp_path / "taught")]) == 0
    assert (
        main(
            [
                *student,
                "--teacher",
                str(cnn / "last.safetensors"),
                "--distill-type",
                "soft",
                "--output",
                str(tmp_path / "soft"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                *student,
                "--teacher",
                str(cnn / "last.safetensors"),
                "--distill-type",
                "soft",
                "--teacher-img-size",
                "40",
                "--output",
                str(tmp_path / "soft40"),
            ]
        )
        == 0
    )
    alone, taught, soft, soft40 = (
        _weights(tmp_path / name / "last.safetensors") for name in ("alone", "taught", "soft", "soft40")
    )
    assert not torch.equal(alone["head.weight"], taught["head.weight"])
    assert not torch.equal(soft["head.weight"], taught["head.weight"])
    assert not torch.equal(soft40["head.weight"], soft["head.weight"])  # the teacher at 40 px taught otherwise


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model", "timm:resnet_nonesuch"], "timm has no model 'resnet_nonesuch'"),
        (["--model", "timm:resnet10t", "--depth", "4"], "--depth: for CaiT models only"),
    ],
)
def test_bad_cnn_flags_get_one_line(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main([*TINY, "--output", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and message in err and len(err.splitlines()) == 1


def test_teacher_view_converts_size_channels_and_normalisation():
    student = cait.get_config("cait_pico_32")  # 32 px, RGB, mean/std 0.5
    teacher = CaiTConfig(img_size=28, patch_size=4, in_chans=1, mean=(0.2,), std=(0.4,))
    grey = torch.full((2, 3, 32, 32), 0.6)  # raw value 0.6*0.5+0.5 = 0.8 everywhere
    out = teacher_view(grey, student, teacher)
    assert out.shape == (2, 1, 28, 28)
    # (luma weights sum to 0.9999, hence the tolerance)
    torch.testing.assert_close(out, torch.full_like(out, (0.8 - 0.2) / 0.4), atol=5e-4, rtol=0)
    assert teacher_view(grey, student, student) is grey
    # colour goes to grey the way the data pipeline makes grey (PIL's convert("L") luma), not a channel mean
    red = torch.full((1, 3, 32, 32), -1.0)
    red[:, 0] = 1.0  # raw red 1.0, green and blue 0.0
    luma = np.asarray(Image.new("RGB", (1, 1), (255, 0, 0)).convert("L"), np.float32)[0, 0] / 255
    torch.testing.assert_close(
        teacher_view(red, student, teacher)[0, 0, 0, 0], torch.tensor((luma - 0.2) / 0.4), atol=5e-3, rtol=0
    )  # PIL rounds to 8 bits


def test_sigint_saves_state_and_exits_cleanly(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cait.train",
            *TINY,
            "--subset",
            "256",
            "--epochs",
            "200",
            "--precision",
            "fp32",
            "--output",
            str(out),
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.time() + 180
    while not (out / "metrics.jsonl").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "interrupted: saved" in err and f"--resume {out}" in err and "Traceback" not in err
    state = torch.load(out / "state.pt", weights_only=True)
    assert state["step"] >= 8 and state["epoch"] >= 1
    assert torch.equal(load_file(out / "last.safetensors")["head.weight"], state["model"]["head.weight"])


def test_torchrun_two_processes_trains_and_checkpoint_loads(tmp_path):
    out = tmp_path / "ddp"
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "cait.train",
            *TINY,
            "--subset",
            "256",
            "--epochs",
            "1",
            "--precision",
            "fp32",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 process(es)" in proc.stderr and proc.stderr.count("done: best val top-1") == 1  # rank 0 only logs
    state = torch.load(out / "state.pt", weights_only=True)
    assert state["step"] == 4  # 256 images / (2 ranks x 32)
    model = cait.load_model(None, checkpoint=out / "last.safetensors").model
    assert model.cfg.num_classes == 10


def test_resume_with_more_epochs_stretches_the_schedule(tmp_path):
    args = [*TINY, "--subset", "128", "--precision", "fp32", "--output", str(tmp_path)]
    assert main([*args, "--epochs", "2", "--stop-after", "4"]) == 0  # one epoch of a 2-epoch schedule
    assert main(["--resume", str(tmp_path), "--epochs", "4", "--stop-after", "8"]) == 0
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    # a 2-epoch cosine is at --min-lr (1e-5) after step 8; stretched to 4 epochs it is still near its middle
    assert state["step"] == 8 and state["optimizer"]["param_groups"][0]["lr"] > 100 * 1e-5


def test_init_starts_from_the_given_weights(smoke_run, tmp_path):
    # lr 1e-9 for one step: the weights after it are the --init weights (a fresh init would be far away)
    init = smoke_run / "ema.safetensors"
    assert (
        main(
            [
                *TINY,
                "--subset",
                "64",
                "--epochs",
                "1",
                "--precision",
                "fp32",
                "--warmup-epochs",
                "0",
                "--lr",
                "1e-9",
                "--init",
                str(init),
                "--stop-after",
                "1",
                "--output",
                str(tmp_path),
            ]
        )
        == 0
    )
    start, after = _weights(init), _weights(tmp_path / "last.safetensors")
    assert all(torch.allclose(start[k], after[k], atol=1e-6) for k in start)
    assert "--init" in json.loads((tmp_path / "args.json").read_text())["commands"][0]


def test_init_grow_gamma_starts_a_deeper_model_from_muted_copies(smoke_run, tmp_path):
    from cait.checkpoint import grow_depth, infer_config

    init = smoke_run / "ema.safetensors"
    depth = 2 * infer_config(_weights(init))["depth"]
    assert (
        main(
            [
                *TINY,
                "--subset",
                "64",
                "--epochs",
                "1",
                "--precision",
                "fp32",
                "--warmup-epochs",
                "0",
                "--lr",
                "1e-9",
                "--init",
                str(init),
                "--depth",
                str(depth),
                "--init-grow-gamma",
                "0.01",
                "--stop-after",
                "1",
                "--output",
                str(tmp_path),
            ]
        )
        == 0
    )
    start, after = grow_depth(_weights(init), depth, gamma=0.01), _weights(tmp_path / "last.safetensors")
    assert set(start) == set(after) and all(torch.allclose(start[k], after[k], atol=1e-6) for k in start)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: cait.load_model("cait_nano_28", weights=False).model, "does not fit this model"),
        (lambda: cait.load_model("cait_pico_32", weights=False, num_classes=3).model, "has 3 classes, the data 10"),
    ],
)
def test_init_from_weights_that_do_not_fit_is_one_line(tmp_path, capsys, make, message):
    cait.save_weights(make(), tmp_path / "other.safetensors")
    code = main([*TINY, "--init", str(tmp_path / "other.safetensors"), "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1] and "Traceback" not in "\n".join(err)


@pytest.mark.parametrize("jitter", [0.0, 0.4])
def test_color_jitter_flag_reaches_the_transform(jitter):
    # a uniform grey image stays uniform under crop and flip; only colour jitter moves its value
    args = train_args_mod.parse_args([*TINY, "--randaug", "none", "--reprob", "0", "--color-jitter", str(jitter)])
    transform = train_data.train_transform(cait.get_config("cait_pico_32"), args)
    grey = Image.new("RGB", (32, 32), (128, 128, 128))
    moved = 0.0
    for seed in range(4):
        with seeded(seed):
            moved = max(moved, (transform(grey) - (128 / 255 - 0.5) / 0.5).abs().max().item())
    assert (moved > 1e-3) is (jitter > 0)


def test_resumed_epoch_counts_its_time_before_the_stop(tmp_path, monkeypatch):
    # a clock that advances one second per reading: epoch_seconds counts readings, not the machine's speed
    clock = iter(range(10**6))
    monkeypatch.setattr(train_mod.time, "time", lambda: float(next(clock)))
    args = [*TINY, "--subset", "192", "--epochs", "1", "--precision", "fp32"]
    assert main([*args, "--output", str(tmp_path / "once")]) == 0
    assert main([*args, "--output", str(tmp_path / "split"), "--stop-after", "3"]) == 0
    assert main(["--resume", str(tmp_path / "split")]) == 0
    seconds = [json.loads((tmp_path / run / "metrics.jsonl").read_text())["epoch_seconds"] for run in ("once", "split")]
    assert seconds[1] >= 0.8 * seconds[0], seconds  # without the stop's share it would be about half


def test_resume_of_a_run_saved_before_newer_flags_takes_their_defaults(tmp_path):
    assert (
        main(
            [
                *TINY,
                "--subset",
                "64",
                "--epochs",
                "2",
                "--precision",
                "fp32",
                "--stop-after",
                "1",
                "--output",
                str(tmp_path),
            ]
        )
        == 0
    )
    saved = json.loads((tmp_path / "args.json").read_text())
    for flag in ("color_jitter", "init"):  # as written by a cait.train that had no such flags
        del saved["args"][flag]
    (tmp_path / "args.json").write_text(json.dumps(saved))
    args = train_args_mod.parse_args(["--resume", str(tmp_path)])
    assert (args.color_jitter, args.init, args.subset) == (0.4, None, 64)
    assert main(["--resume", str(tmp_path)]) == 0


# ---------------------------------------------------------------------------------------------------- from Python

TINY_ARGS = dict(
    model="cait_pico_32",
    data="fashion-mnist",
    batch_size=32,
    workers=0,
    threads=1,
    val_subset=64,
    warmup_epochs=1,
    lr=2e-3,
    precision="fp32",
)


def test_train_args_equal_the_command_line_and_check_the_same_way():
    given = {**TINY_ARGS, "subset": 64, "residual_scale": "none", "output": "runs/x"}
    from_python, from_cli = train_mod.train_args(**given), train_args_mod.parse_args(train_args_mod.to_argv(given))
    assert {**vars(from_python), "argv": None} == {**vars(from_cli), "argv": None}
    assert train_args_mod.parse_args(from_python.argv) == from_python  # the command recorded in args.json
    assert train_mod.train_args(warmup_epochs=1).warmup_epochs == 1.0  # converted like the flag
    for bad, message in [
        ({"batch_size": 0}, "--batch-size must be positive"),
        ({"nope": 1}, "unknown flag(s) --nope"),
        ({"precision": "fp8"}, "--precision: invalid choice 'fp8'"),
        ({"epochs": 1.5}, "--epochs takes a int"),
        ({"num_heads": 5, "embed_dim": 48}, "--num-heads 5 does not divide --embed-dim 48"),
        ({"scene_style": "varied", "data": "fashion-mnist"}, "--scene-style applies to fashion-mnist-scenes only"),
    ]:
        with pytest.raises(train_mod.ArgsError, match=re.escape(message)):
            train_mod.train_args(**bad)


def test_scene_style_changes_the_training_images_only():
    given = {**TINY_ARGS, "data": "fashion-mnist-scenes", "subset": 32, "val_subset": 32}
    args, varied = train_mod.train_args(**given), train_mod.train_args(**given, scene_style="varied")
    (train, val, _), (train_v, val_v, _) = train_data.load_data(args, 1), train_data.load_data(varied, 1)
    assert (train.style, train_v.style, val_v.style) == ("default", "varied", "default")
    assert np.array_equal(val.pixels, val_v.pixels) and not np.array_equal(train.pixels, train_v.pixels)
    assert np.array_equal(train.labels, train_v.labels)


def test_run_returns_its_result_and_resumes_from_python(tmp_path):
    args = dict(TINY_ARGS, subset=64, epochs=2, output=tmp_path)
    first = train_mod.run(train_mod.train_args(**args, stop_after=3))  # 2 steps per epoch: stops in epoch 2
    assert (first.finished, first.stopped_by, first.exit_code) == (False, "--stop-after 3 reached", 0)
    assert (first.epochs, first.step, len(first.metrics)) == (1, 3, 1)
    done = train_mod.run(train_mod.train_args(resume=str(tmp_path)))
    assert done.finished and done.stopped_by is None and (done.epochs, done.step) == (2, 4)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert done.metrics == lines and done.final["epoch"] == 2
    assert done.best_top1 == max(line["val_top1"] for line in lines)
    commands = json.loads((tmp_path / "args.json").read_text())["commands"]
    assert "--stop-after 3" in commands[0] and commands[1] == f"python -m cait.train --resume {tmp_path}"


def test_a_non_finite_loss_is_a_typed_error(tmp_path):
    args = train_mod.train_args(**dict(TINY_ARGS, subset=64, epochs=1, warmup_epochs=0, lr=1e30, output=tmp_path))
    with pytest.raises(train_mod.Diverged, match="this step was not applied") as caught:
        train_mod.run(args)
    assert caught.value.epoch == 1 and caught.value.step >= 1 and not np.isfinite(caught.value.loss)


def _tiny_state(seed: int) -> train_mod.TrainState:
    args = train_mod.train_args(**TINY_ARGS, ema=0.9)
    torch.manual_seed(seed)
    model = cait.load_model("cait_pico_32", weights=False).model
    return train_mod.new_state(model, args, lr=1e-3, steps_per_epoch=4, amp=None, device=torch.device("cpu"))


def test_train_state_round_trips_through_its_file(tmp_path):
    state = _tiny_state(0)
    loss = state.model(torch.randn(4, 3, 32, 32)).logsumexp(-1).mean()
    loss.backward()
    state.optimizer.step()
    state.ema.update(state.model, step=1)
    state.epoch, state.batch, state.step, state.best_top1 = 1, 2, 6, 42.0
    state.tally.add(1.5, 3, 4, 0.25)
    torch.save(state.state_dict(), tmp_path / "state.pt")
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    assert "scheduler" not in saved  # rebuilt from the flags and the step, never read back
    copy = _tiny_state(1)
    copy.load_state_dict(saved)
    assert (copy.epoch, copy.batch, copy.step, copy.best_top1) == (1, 2, 6, 42.0)
    assert copy.tally == state.tally and copy.resume_rng is not None
    for a, b in ((state.model, copy.model), (state.ema.module, copy.ema.module)):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    moments = lambda s: [t for v in s.optimizer.state_dict()["state"].values() for t in v.values()]
    assert all(torch.equal(x, y) for x, y in zip(moments(state), moments(copy)))
    state.scheduler.step_update(num_updates=6)
    assert copy.optimizer.param_groups[0]["lr"] == state.optimizer.param_groups[0]["lr"]
    tally = copy.finish_epoch()
    assert tally.seen == 4 and (copy.epoch, copy.batch, copy.tally) == (2, 0, train_mod.EpochTally())


def test_same_run_ignores_where_and_how_but_not_what():
    args = train_mod.train_args(**TINY_ARGS, output="runs/a")
    saved = {k: v for k, v in vars(args).items() if k not in ("argv", "color_jitter")}  # saved before --color-jitter
    assert train_args_mod.same_run({**saved, "output": "elsewhere", "threads": 2}, args)
    assert not train_args_mod.same_run({**saved, "lr": 1e-3}, args)
    assert not train_args_mod.same_run({**saved, "color_jitter": 0.0}, args)  # differs from today's default 0.4


def test_distillation_term_hard_and_soft():
    student = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    teacher = torch.tensor([[0.0, 3.0, 0.0], [0.0, 1.0, 0.0]])
    hard = train_mod.distillation_term(student, teacher, kind="hard", tau=3.0)
    torch.testing.assert_close(hard, F.cross_entropy(student, torch.tensor([1, 1])))
    # soft: zero when the student already matches the teacher, and tau^2 * KL(teacher || student) otherwise
    assert train_mod.distillation_term(teacher, teacher, kind="soft", tau=3.0).abs() < 1e-6
    p_t, p_s = (teacher / 2).softmax(1), (student / 2).softmax(1)
    expected = 4 * (p_t * (p_t.log() - p_s.log())).sum(1).mean()
    torch.testing.assert_close(train_mod.distillation_term(student, teacher, kind="soft", tau=2.0), expected)
