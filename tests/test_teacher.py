"""CNN teachers: a timm model saved with its config comes back as the same function; CaiT files still
load as teachers; a CNN file given where a CaiT is expected is a clear error."""

from __future__ import annotations

import pytest
import torch

import cait
from cait.checkpoint import CheckpointError, read_checkpoint, save_weights, stored_config
from cait.cnn import TimmCNN
from cait.config import CNNConfig
from cait.train.loop import teacher_view
from cait.train.teacher import cnn_arch, load_teacher


def test_cnn_round_trips_through_safetensors(tmp_path):
    torch.manual_seed(0)
    cfg = CNNConfig(arch="resnet10t", img_size=32, in_chans=1, mean=(0.5,), std=(0.5,))
    model = TimmCNN(cfg).eval()
    save_weights(model, tmp_path / "t.safetensors", {"val_top1": "0.125"})
    _, stored = read_checkpoint(tmp_path / "t.safetensors")
    assert stored == cfg and stored_config(tmp_path / "t.safetensors") == cfg
    teacher = load_teacher(tmp_path / "t.safetensors")
    assert isinstance(teacher, TimmCNN) and teacher.cfg == cfg and not teacher.training
    assert not any(p.requires_grad for p in teacher.parameters())
    x = torch.randn(3, 1, 32, 32)
    assert torch.equal(teacher(x), model(x)) and teacher(x).shape == (3, 10)
    # the student's batch reaches it at its own size, channels and normalisation
    student = cait.get_config("cait_nano_64")
    assert teacher_view(torch.randn(2, 3, 64, 64), student, teacher.cfg).shape == (2, 1, 32, 32)
    # run above its training size (--teacher-img-size): the same weights, fed the batch at that size
    larger = load_teacher(tmp_path / "t.safetensors", img_size=48)
    assert larger.cfg == cfg.replace(img_size=48)
    assert teacher_view(torch.randn(2, 3, 64, 64), student, larger.cfg).shape == (2, 1, 48, 48)
    x48 = torch.randn(2, 1, 48, 48)
    assert torch.equal(larger(x48), model(x48))


def test_a_cait_checkpoint_is_a_teacher_too(tmp_path):
    model = cait.load_model("cait_pico_32", weights=False, num_classes=10).model
    save_weights(model, tmp_path / "c.safetensors")
    teacher = load_teacher(tmp_path / "c.safetensors")
    assert isinstance(teacher, cait.CaiT) and teacher.cfg == model.cfg
    larger = load_teacher(tmp_path / "c.safetensors", img_size=48)  # position embedding resampled
    assert larger.cfg.img_size == 48 and larger(torch.randn(1, 3, 48, 48)).shape == (1, 10)


def test_wrong_files_and_names_are_clear(tmp_path):
    cnn = TimmCNN(CNNConfig(arch="resnet10t", img_size=32))
    save_weights(cnn, tmp_path / "t.safetensors")
    with pytest.raises(CheckpointError, match=r"timm CNN \(resnet10t\), not a CaiT"):
        cait.load_model(None, checkpoint=tmp_path / "t.safetensors")
    # weights of another architecture under a resnet10t config
    other = TimmCNN(CNNConfig(arch="resnet18", img_size=32))
    other.cfg = cnn.cfg
    save_weights(other, tmp_path / "bad.safetensors")
    with pytest.raises(CheckpointError, match="do not fit timm's resnet10t"):
        load_teacher(tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match="timm has no model 'resnet_nonesuch'"):
        TimmCNN(CNNConfig(arch="resnet_nonesuch", img_size=32))
    assert cnn_arch("timm:resnet18") == "resnet18" and cnn_arch("cait_nano_64") is None
