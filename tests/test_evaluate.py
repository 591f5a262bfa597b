"""python -m cait.evaluate: accuracy and localization table on real scenes."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import cait
from cait import explain
from cait.checkpoint import WEIGHTS_DIR
from cait.cnn import TimmCNN
from cait.config import CNNConfig
from cait.data import FashionMNISTScenes, read_images
from cait.evaluate import evaluate, format_table


def _check_top1_by_box_side(result: dict, scenes, predicted: torch.Tensor, labels: torch.Tensor) -> None:
    """Top-1 by garment size: every image in the bin of its box's longer side, and each bin's top-1 its own."""
    boxes = scenes.boxes
    sides = np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]) / 64
    by_side = result["top1_by_box_side"]
    assert sum(row["images"] for row in by_side) == len(labels)
    for row in by_side:
        lo, hi = row["box_side"]
        inside = torch.as_tensor((sides >= lo) & (sides < hi))
        assert row["images"] == inside.sum() > 0
        assert row["top1"] == pytest.approx((predicted[inside] == labels[inside]).float().mean().item())
        for name, top1 in row["per_class_top1"].items():
            of_class = inside & (labels == scenes.classes.index(name))
            assert top1 == pytest.approx((predicted[of_class] == labels[of_class]).float().mean().item())
    assert "top-1 by the garment box's side" in format_table(result)


def test_evaluate_scores_every_head_and_method(tmp_path):
    torch.manual_seed(0)
    model = cait.load_model(
        "cait_nano_64", weights=False, depth=1
    ).model  # untrained: the table, not its values, is under test
    scenes = FashionMNISTScenes("val", subset=24)
    result = evaluate(
        model,
        scenes,
        batch_size=12,
        workers=0,
        attribution_subset=4,
        methods=("ca1_mean", "rollout_after_proj_l", "gradient_rollout", "saliency"),
    )
    rows = {r["method"]: r for r in result["localization"]}
    heads = model.cfg.num_heads
    assert {f"ca{l}_head{h}" for l in (1, 2) for h in range(1, heads + 1)} <= set(rows)  # from 1, as the app
    assert "ca1_head0" not in rows and "ca1_head1" in rows
    assert rows["ca1_mean"]["images"] == 24 and rows["saliency"]["images"] == 4  # costly methods on a subset
    assert rows["rollout_after_proj_l"]["images"] == rows["gradient_rollout"]["images"] == 24  # cheap: every image
    boxes = scenes.boxes
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / 64**2).mean()
    assert np.isclose(rows["chance"]["pointing_game"], area, atol=1e-6)
    # the table's numbers are the metrics of the maps themselves
    x = torch.stack([cait.preprocess.eval_transform(model.cfg)(scenes[i][0]) for i in range(24)])
    ca = explain.class_attention(model, x)
    hits = explain.pointing_game(ca.mean[:, 0], torch.as_tensor(boxes), 64).float().mean().item()
    assert np.isclose(rows["ca1_mean"]["pointing_game"], hits)
    logits = model(x)
    labels, predicted = torch.as_tensor(scenes.labels), logits.argmax(-1)
    assert np.isclose(result["top1"], (predicted == labels).float().mean().item())
    confusion = torch.as_tensor(result["confusion"])
    for true, guess in zip(labels, predicted):  # each image counted once, in its (true, predicted) cell
        confusion[true, guess] -= 1
    assert (confusion == 0).all()
    shirts = labels == scenes.classes.index("Shirt")
    expected = (predicted[shirts] == 6).float().mean().item() if shirts.any() else None
    assert result["per_class_top1"]["Shirt"] == (expected if expected is None else pytest.approx(expected))
    assert "pointing game" in format_table(result) and "per class: T-shirt/top" in format_table(result)
    _check_top1_by_box_side(result, scenes, predicted, labels)
    # a bf16 classification pass scores its own head maps; the methods' rows stay the fp32 maps'
    bf16 = evaluate(
        model,
        scenes,
        batch_size=12,
        workers=0,
        attribution_subset=4,
        methods=("ca1_mean", "saliency"),
        dtype=torch.bfloat16,
    )
    assert {r["method"]: r for r in bf16["localization"]}["ca1_mean"] == rows["ca1_mean"]


def test_shipped_results_use_current_row_names():
    for shipped in sorted(WEIGHTS_DIR.glob("*.eval.json")):  # whichever names the shipped files use
        table = format_table(json.loads(shipped.read_text()))
        assert "_head0 " not in table and "mixing" not in table, shipped.name
        if "localization" in table or "pointing game" in table:
            assert "ca1_head1 " in table and "rollout_after_proj_l " in table, shipped.name


def test_cli_writes_json_and_refuses_bad_input(tmp_path, capsys):
    model = cait.load_model("cait_pico_32", weights=False, img_size=64).model
    ckpt = tmp_path / "m.safetensors"
    cait.save_weights(model, ckpt)
    out = tmp_path / "r.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "cait.evaluate",
            "--checkpoint",
            str(ckpt),
            "--subset",
            "16",
            "--methods",
            "ca1_mean",
            "--workers",
            "0",
            "--img-size",
            "80",
            "--scene-seed",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert "top-1 accuracy" in run.stdout and result["images"] == 16
    assert result["img_size"] == 80  # tested above its 64 px: the position embedding resampled, not refused
    # on newly drawn scenes of the test garments: the chance row is their boxes' mean share of the canvas
    redrawn = FashionMNISTScenes("val", seed=1, subset=16)
    boxes = np.asarray(redrawn.boxes)
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / redrawn.canvas**2).mean()
    chance = {r["method"]: r for r in result["localization"]}["chance"]["pointing_game"]
    assert result["scene_seed"] == 1 and np.isclose(chance, area, atol=1e-6)
    assert not np.allclose(boxes, FashionMNISTScenes("val", subset=16).boxes)
    # the refusals through the command's main in this process (the run above is the `python -m` entry): a fresh
    # interpreter each would only add its imports; an exception other than the exit would fail the test here
    from cait.evaluate.__main__ import main

    capsys.readouterr()
    assert main(["--checkpoint", str(tmp_path / "nope.pth")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    with pytest.raises(SystemExit) as unknown:
        main(["--model", "cait_pico_32", "--methods", "magic"])
    assert unknown.value.code == 2 and "unknown method" in capsys.readouterr().err


def test_cli_scores_a_cnn_teacher_on_top1_and_per_class(tmp_path, capsys):
    """The command's main in this process (test_cli_writes_json_and_refuses_bad_input runs `python -m`): a fresh
    interpreter would only add its imports."""
    from cait.evaluate.__main__ import main

    torch.manual_seed(0)
    cnn = TimmCNN(CNNConfig(arch="resnet10t", img_size=32)).eval()
    path = tmp_path / "teacher.safetensors"
    cait.save_weights(cnn, path)
    out = tmp_path / "r.json"
    code = main(
        [
            "--checkpoint",
            str(path),
            "--img-size",
            "48",
            "--subset",
            "12",
            "--workers",
            "0",
            "--precision",
            "fp32",
            "--json",
            str(out),
        ]
    )
    run = capsys.readouterr()
    assert code == 0, run.err
    result = json.loads(out.read_text())
    assert result["img_size"] == 48 and result["weights"] == f"checkpoint {path}"
    assert result["localization"] == [] and "pointing game" not in run.out  # no class attention to score
    # the CNN run at 48 px, on the eval view of each scene: the same predictions as the file's numbers
    scenes = FashionMNISTScenes("val", subset=12)
    x = torch.stack([cait.preprocess.eval_transform(cnn.cfg.replace(img_size=48))(scenes[i][0]) for i in range(12)])
    with torch.no_grad():
        predicted = cnn(x).argmax(-1)
    assert np.isclose(result["top1"], (predicted == torch.as_tensor(scenes.labels)).float().mean().item())
    assert main(["--checkpoint", str(path), "--methods", "ca1_mean"]) == 2
    assert "no class attention" in capsys.readouterr().err


def test_without_flags_the_default_model_is_scored_with_its_shipped_weights(monkeypatch):
    """A full default evaluation is 10k scenes with every method: here the scoring and the data are recorded
    instead; the weights are compared with the shipped file as safetensors reads it."""
    from safetensors.torch import load_file

    from cait.data import reader
    from cait.evaluate import __main__ as cli

    seen = {}

    def scored(model, data, **kwargs):
        seen.update(model=model, data=data, methods=kwargs["methods"])
        return {"images": 0, "top1": 0.0, "per_class_top1": {}, "top1_by_box_side": [], "localization": []}

    def dataset(name, cfg, **kwargs):
        seen.update(asked=(name, kwargs["scene_seed"], kwargs["limit"], kwargs["scene_style"], kwargs["pixel_noise"]))
        return read_images("fashion-mnist-scenes", cfg, limit=2)

    monkeypatch.setattr(cli, "evaluate", scored)
    monkeypatch.setattr(reader, "read_images", dataset)  # what cait.data.read_from_flags calls
    assert cli.main([]) == 0
    cfg = cait.get_config(cait.DEFAULT_MODEL)
    assert not seen["model"].cfg.network_differences(cfg) and seen["methods"] is None  # every method
    shipped = load_file(WEIGHTS_DIR / cfg.pretrained)
    assert shipped.keys() == seen["model"].state_dict().keys()
    assert all(torch.equal(v, seen["model"].state_dict()[k]) for k, v in shipped.items())
    assert seen["asked"] == ("fashion-mnist-scenes", 0, None, "default", None)  # the 10k test scenes


def test_without_a_model_flag_a_subset_is_scored_for_real(capsys):
    from cait.evaluate.__main__ import main

    assert main(["--subset", "40", "--methods", "ca1_mean", "--workers", "0"]) == 0
    out = capsys.readouterr().out
    assert f"shipped {cait.DEFAULT_MODEL} weights" in out and "on 40 images" in out
    top1 = float(out.split("top-1 accuracy: ")[1].split("%")[0]) / 100
    assert top1 > 0.5  # trained (the shipped model scores 79% on the 10k scenes): a random init scores ~10%
