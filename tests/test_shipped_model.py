"""The trained models shipped in the package: loads offline, is really trained, and its attention is faithful."""

import json

import pytest
import torch

import cait
from cait import explain
from cait.checkpoint import WEIGHTS_DIR, CheckpointError
from cait.data import FashionMNISTScenes, build_dataset
from cait.explain.metrics import endpoint_probabilities
from cait.preprocess import eval_transform

N = 96  # test scenes used here: enough to separate a trained model from chance, quick on 2 cores


# shipped model -> (data it was trained on, accuracy floor on N test images: far above chance, 10%)
SHIPPED = {"cait_micro_136": ("fashion-mnist-scenes", 0.4), "cait_nano_28": ("fashion-mnist", 0.7)}


def _test_batch(model: cait.CaiT, data: str) -> tuple[torch.Tensor, torch.Tensor]:
    images = build_dataset(data, "val", subset=N)
    tf = eval_transform(model.cfg)
    return torch.stack([tf(images[i][0]) for i in range(N)]), torch.as_tensor(images.labels[:N])


@pytest.fixture(scope="module")
def shipped():
    model = cait.load_model(cait.DEFAULT_MODEL, pretrained=True).model  # the scenes model
    x, y = _test_batch(model, "fashion-mnist-scenes")
    scenes = FashionMNISTScenes("val", subset=N)
    return model, x, y, model.cfg.box_to_input(torch.as_tensor(scenes.boxes), scenes.canvas)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_files_are_complete(name):
    assert name in cait.list_models()
    for suffix in (".safetensors", ".md", ".metrics.jsonl", ".eval.json"):
        assert (WEIGHTS_DIR / f"{name}{suffix}").is_file()
    assert (WEIGHTS_DIR / f"{name}.safetensors").stat().st_size < 20 * 2**20
    card = (WEIGHTS_DIR / f"{name}.md").read_text()
    assert "python -m cait.train" in card and "top-1" in card


@pytest.mark.parametrize("name", SHIPPED)
def test_model_is_trained_well_above_chance(name):
    data, floor = SHIPPED[name]
    model = cait.load_model(name, pretrained=True).model
    x, y = _test_batch(model, data)
    with torch.no_grad():
        top1 = (model(x).argmax(-1) == y).float().mean().item()
    last = json.loads((WEIGHTS_DIR / f"{name}.metrics.jsonl").read_text().splitlines()[-1])
    assert top1 > floor, f"shipped {name} scores {top1:.1%} on {N} test images (chance 10%)"
    reported = max(v for v in (last["val_top1"], last.get("val_top1_ema")) if v is not None)
    assert abs(top1 - reported) < 0.2  # same ballpark as the card's full-test-set figure
    evaluation = json.loads((WEIGHTS_DIR / f"{name}.eval.json").read_text())
    assert evaluation["model"] == name and abs(evaluation["top1"] - top1) < 0.2


def test_class_attention_points_at_the_garment(shipped):
    model, x, _, boxes = shipped
    heat = explain.class_attention(model, x).mean[:, 0]
    hits = explain.pointing_game(heat, boxes, model.cfg.img_size).float().mean().item()
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / model.cfg.img_size**2).mean().item()
    assert hits > 2 * area, f"pointing game {hits:.1%} vs chance {area:.1%}"


def test_deletion_of_the_attention_ranking_beats_random(shipped):
    model, x, y, _ = shipped
    x, y = x[:12], y[:12]  # 12 scenes separate the two rankings (below)
    heat = explain.class_attention(model, x).mean[:, 0]
    random_heat = torch.rand(heat.shape, generator=torch.Generator().manual_seed(0))
    # 4 steps cost half of 8 and separate them as well: mean deletion AUC 0.17 vs random's 0.40, insertion 0.60
    # vs 0.39 (8 steps: 0.14 vs 0.41, 0.63 vs 0.39; 16: 0.13 vs 0.41, 0.64 vs 0.39), ours ahead on 11 and 12 of
    # the 12 scenes each time
    ends = endpoint_probabilities(model, x, y)  # the curves' two ends, the same for both maps
    ours = explain.deletion_insertion(model, x, y, heat, steps=4, endpoints=ends)
    rand = explain.deletion_insertion(model, x, y, random_heat, steps=4, endpoints=ends)
    assert ours["deletion_auc"].mean() < rand["deletion_auc"].mean()
    assert ours["insertion_auc"].mean() > rand["insertion_auc"].mean()


def test_paper_variant_without_weights_says_where_to_get_them(monkeypatch, tmp_path):
    for var in ("HF_HOME", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(CheckpointError, match="checkpoint=PATH"):
        cait.load_model("cait_s24_224", pretrained=True)


def test_a_variant_declared_before_its_weights_ship(monkeypatch):
    """A new VARIANTS entry naming a shipped file that is not there yet: a clear error that says how to make it,
    or with random_init (--random-init) a random model that the app and the analysis scripts say is one."""
    import argparse

    from app.loading import load_page_model as app_model
    from app.models import ModelChoice
    from cait.config import VARIANTS
    from cait.factory import load_from_flags

    name = "cait_test_wide_64"
    monkeypatch.setitem(
        VARIANTS, name, VARIANTS["cait_nano_64"].replace(embed_dim=192, num_heads=4, pretrained=f"{name}.safetensors")
    )
    assert name in cait.list_models() and not (WEIGHTS_DIR / f"{name}.safetensors").exists()
    assert cait.load_model(name, weights=False).model.cfg.embed_dim == 192
    with pytest.raises(CheckpointError, match=f"no shipped weights for '{name}'.*python -m cait.train --model {name}"):
        cait.load_model(name, pretrained=True)
    with pytest.raises(CheckpointError, match=f"no weights for '{name}' here.*python -m cait.train --model {name}"):
        cait.load_model(name)
    app = app_model(ModelChoice(name, random_init=True), torch.device("cpu"))
    assert app.cfg.embed_dim == 192 and app.source == "random init (seed 0)" and app.notice.startswith("Untrained")
    loaded = load_from_flags(argparse.Namespace(model=name, checkpoint=None, pretrained=False, random_init=True))
    assert not loaded.trained and "RANDOM INIT" in loaded.made_from
