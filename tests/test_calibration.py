"""cait.train.calibration: the weakest class's head bias, chosen for the floor on every class's top-1."""

import json
import sys

import pytest
import torch

import cait
from cait import explain
from cait.checkpoint import read_checkpoint
from cait.data import build_dataset
from cait.metrics import lowest_class, per_class_top1
from cait.train.calibration import (
    ClassBias,
    apply_class_bias,
    collect_logits,
    fit_weakest_class_bias,
    shifted,
)
from scripts import calibrate_head


def _under_predicted(n_per_class: int = 400, classes: int = 4, weak: int = 2, offset: float = 1.0):
    """Balanced labels whose logits favour the truth, with class `weak` pushed down by `offset`."""
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(classes).repeat_interleave(n_per_class)
    logits = torch.randn(len(labels), classes, generator=g) + 1.5 * torch.nn.functional.one_hot(labels, classes)
    logits[:, weak] -= offset
    return logits, labels


def test_per_class_top1_counts_each_class_alone():
    logits = torch.tensor([[2.0, 0, 0], [0, 2.0, 0], [2.0, 0, 0], [0, 0, 2.0]])
    labels = torch.tensor([0, 0, 1, 2])
    top1 = per_class_top1(logits.argmax(1), labels, 4)
    assert top1[:3].tolist() == [0.5, 0.0, 1.0]
    assert torch.isnan(top1[3])  # no images of class 3
    assert lowest_class(top1) == (1, 0.0) and lowest_class([None, 0.25, 0.5]) == (1, 0.25)


def test_the_under_predicted_class_gets_back_about_what_it_lost():
    logits, labels = _under_predicted(offset=1.0)
    choice = fit_weakest_class_bias(logits, labels)
    assert choice.index == 2
    assert 0.6 <= choice.bias <= 1.4
    assert min(choice.per_class_after) > min(choice.per_class_before) + 0.1
    assert choice.per_class_after == pytest.approx(
        per_class_top1(shifted(logits, 2, choice.bias).argmax(1), labels, 4).tolist()
    )
    assert choice.images == len(labels)


def test_a_balanced_classifier_is_left_as_it_is():
    logits, labels = _under_predicted(offset=0.0)
    choice = fit_weakest_class_bias(logits, labels)
    # raising the weakest class costs its neighbours as much as it gains: at most a step or two
    assert choice.bias <= 0.15
    assert choice.top1_after == pytest.approx(choice.top1_before, abs=0.01)


def test_the_bias_moves_one_logit_and_no_attention():
    torch.manual_seed(0)
    model = cait.load_model("cait_nano_28", weights=False).model.eval()
    x = torch.randn(3, 1, 28, 28)
    before = explain.class_attention(model, x)
    apply_class_bias(
        model,
        ClassBias(index=6, bias=0.5, per_class_before=[], per_class_after=[], top1_before=0, top1_after=0, images=0),
    )
    after = explain.class_attention(model, x)
    assert torch.allclose(after.logits, shifted(before.logits, 6, 0.5), atol=1e-5)
    assert torch.equal(after.maps, before.maps)


def test_the_script_writes_weights_that_score_what_its_report_says(tmp_path, monkeypatch):
    out, report = tmp_path / "calibrated.safetensors", tmp_path / "calibration.json"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "calibrate_head.py",
            str(cait.checkpoint.WEIGHTS_DIR / "cait_micro_136.safetensors"),
            # 40 scenes each: the fit still moves a logit (class 4, +0.55, its top-1 0.20 -> 0.33), so the test
            # sees head.bias change; 120 and 100 cost three times as much for the same checks
            "--fit-subset",
            "40",
            "--check-seeds",
            "0",
            "--check-subset",
            "40",
            "--out",
            str(out),
            "--json",
            str(report),
        ],
    )
    calibrate_head.main()
    result = json.loads(report.read_text())
    fit = result["fit"]
    assert result["class"] == cait.load_model("cait_micro_136", weights=False).model.cfg.labels[fit["index"]]
    assert fit["bias"] > 0 and lowest_class(fit["per_class_after"])[1] >= lowest_class(fit["per_class_before"])[1]
    calibrated = cait.load_model(None, checkpoint=out).model
    state, _ = read_checkpoint(out)
    original, _ = read_checkpoint(cait.checkpoint.WEIGHTS_DIR / "cait_micro_136.safetensors")
    changed = [k for k in state if not torch.equal(state[k], original[k])]
    assert changed == (["head.bias"] if fit["bias"] else [])
    logits, labels = collect_logits(calibrated, build_dataset("fashion-mnist-scenes", "val", subset=40, cache=True))
    check = result["checks"][0]
    assert check["scene_seed"] == 0 and check["images"] == 40
    assert (logits.argmax(1) == labels).float().mean().item() == pytest.approx(check["after"]["top1"])
