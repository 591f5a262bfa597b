"""--precision: bf16 autocast for forward-only passes (predictions, class attention, deletion/insertion
scoring) must give the shipped model's answers; gradients and attributions stay fp32."""

from __future__ import annotations

import pytest
import torch

import cait
from app import session
from app.loading import load_page_model
from app.models import ModelChoice
from cait import explain
from cait.data import DataError, FashionMNISTScenes
from cait.flags import INFERENCE_PRECISIONS, PRECISIONS
from cait.preprocess import eval_transform
from cait.runtime import autocast, autocast_dtype, inference_dtype

CPU = torch.device("cpu")
SCENES = 300  # 1% of disagreement is 3 scenes, not one unlucky image


def test_precision_flag_means_the_same_everywhere():
    assert "fp16" not in INFERENCE_PRECISIONS and set(INFERENCE_PRECISIONS) < set(PRECISIONS)
    assert inference_dtype("fp32", CPU) is None and inference_dtype("bf16", CPU) is torch.bfloat16
    assert inference_dtype("auto", CPU) is autocast_dtype("auto", CPU)  # the probe of training's auto
    with pytest.raises(ValueError, match="--precision must be one of auto, fp32, bf16"):
        inference_dtype("fp8", CPU)


@pytest.fixture(scope="module")
def shipped_scenes():
    model = cait.load_model(cait.DEFAULT_MODEL, pretrained=True).model
    try:
        scenes = FashionMNISTScenes("val", subset=SCENES)
    except DataError as e:
        pytest.skip(str(e))
    tf = eval_transform(model.cfg)
    return model, torch.stack([tf(scenes[i][0]) for i in range(len(scenes))])


def _class_attention(model, x, dtype):
    # batches of 25 stay in the CPU's cache (as explain.metrics.TOKENS_PER_PASS says): a third less time than
    # 250 here, with the same answers (the same 3 of 300 scenes change their top-1)
    with torch.inference_mode(), autocast(dtype, CPU):
        return [explain.ClassAttention.from_insights(model.forward_insights(batch)) for batch in x.split(25)]


def test_bf16_and_fp32_agree_on_the_shipped_model(shipped_scenes):
    model, x = shipped_scenes
    fp32, bf16 = _class_attention(model, x, None), _class_attention(model, x, torch.bfloat16)
    logits32, logits16 = torch.cat([c.logits for c in fp32]), torch.cat([c.logits for c in bf16])
    maps32, maps16 = torch.cat([c.maps for c in fp32]), torch.cat([c.maps for c in bf16])
    assert maps16.dtype == torch.float32  # the maps leave in fp32 whatever the autocast
    assert not torch.equal(logits32, logits16)  # the second pass really ran in bf16
    agree = (logits32.argmax(-1) == logits16.argmax(-1)).float().mean().item()
    assert agree >= 0.99, f"bf16 and fp32 top-1 agree on {agree:.1%} of {SCENES} test scenes"
    # class-attention maps: each map's L1 difference relative to its mass, and where the head mean points
    relative = (maps32 - maps16).abs().sum((-1, -2)) / maps32.sum((-1, -2))
    assert relative.mean() < 0.01 and relative.max() < 0.05, (relative.mean(), relative.max())
    peak = lambda m: m.mean(2).flatten(2).argmax(-1)
    assert (peak(maps32) == peak(maps16)).float().mean() >= 0.98


def test_gradients_and_attributions_stay_fp32(tmp_path):
    from conftest import randomise_

    path = tmp_path / "nano.safetensors"
    cait.save_weights(randomise_(cait.load_model("cait_nano_64", weights=False).model), path)
    choice = ModelChoice(None, str(path))
    fast, exact = load_page_model(choice, CPU, torch.bfloat16), load_page_model(choice, CPU, None)
    scene = sorted(cait.data.EXAMPLES_DIR.glob("scene_*.png"))[0]
    a = session.analyse(fast, str(scene))
    assert a.ca_maps.dtype == a.probs.dtype == "float32"
    methods = ["integrated_gradients", "saliency", "class_specific", "rollout_after_proj_l", "occlusion"]
    options = explain.MethodOptions(ig_steps=8)
    rows = list(session.saliency_rows(fast, a, target=1, methods=methods, options=options))
    for row in rows:  # the maps of a bf16 session are the fp32 maps, to the bit
        expected = explain.saliency_map(exact.model, a.x, torch.tensor([1]), row.method, options)[0]
        assert row.heat.dtype == torch.float32 and torch.equal(row.heat, expected), row.method


@pytest.fixture(scope="module")
def shipped_examples():
    from PIL import Image

    from cait.data import read_examples
    from cait.preprocess import to_batch

    model = cait.load_model(cait.DEFAULT_MODEL, pretrained=True).model.eval()
    mode = "RGB" if model.cfg.in_chans == 3 else "L"
    images = [Image.open(e.path).convert(mode) for e in read_examples()]
    x = to_batch(images, model.cfg)
    with torch.no_grad():
        return model, x, model(x).argmax(-1)


def test_deletion_insertion_scores_in_bf16_agree_with_fp32(shipped_examples):
    """The scoring's forward passes in bf16 (class stage and head in fp32) give fp32's AUCs within 0.01
    on every shipped example (the class-attention head-mean map ranks the patches)."""
    model, x, target = shipped_examples
    heat = explain.class_attention(model, x).mean[:, 0]
    # The bound is on the AUC, whatever the steps; each bf16 image costs this CPU's emulated bf16 matmuls. 4 steps
    # (3 perturbed images per curve and example, and the two ends) cost half of 8 and keep the bound's margin:
    # the largest difference over the 14 examples is 0.0017 at 4 steps, 0.0020 at 8, 0.0021 at 16
    fp32 = explain.deletion_insertion(model, x, target, heat, steps=4)
    bf16 = explain.deletion_insertion(model, x, target, heat, steps=4, forward_dtype=torch.bfloat16)
    for key in ("deletion_auc", "insertion_auc"):
        assert not torch.equal(fp32[key], bf16[key])
        assert (fp32[key] - bf16[key]).abs().max() <= 0.01, key


def test_the_saliency_tab_reads_what_it_can_from_the_analysis(tmp_path):
    """In a bf16 session the CA head means are the analysis's maps (the Class attention tab's), occlusion is
    the fp32 attribution, and the scores are deletion_insertion's in the session's precision."""
    from conftest import randomise_

    path = tmp_path / "nano.safetensors"
    cait.save_weights(randomise_(cait.load_model("cait_nano_64", weights=False).model), path)
    fast = load_page_model(ModelChoice(None, str(path)), CPU, torch.bfloat16)
    a = session.analyse(fast, str(sorted(cait.data.EXAMPLES_DIR.glob("scene_*.png"))[0]))
    rows = {
        r.method: r
        for r in session.saliency_rows(
            fast, a, target=2, methods=["occlusion", "ca2_mean"], options=explain.MethodOptions()
        )
    }
    assert torch.equal(rows["ca2_mean"].heat, torch.from_numpy(a.ca_maps[1].mean(0)))
    t = torch.tensor([2])
    occlusion = explain.attribution(fast.model, a.x, t, "occlusion").patch
    assert torch.equal(rows["occlusion"].heat, occlusion[0])
    with torch.inference_mode():
        scores = explain.deletion_insertion(fast.model, a.x, t, occlusion, forward_dtype=torch.bfloat16)
    assert rows["occlusion"].deletion_auc == pytest.approx(float(scores["deletion_auc"][0]), abs=1e-6)


def test_split_precision_logits_keeps_the_class_stage_in_fp32_even_inside_bf16_autocast():
    """Perturbation passes: SA stage in bf16, class stage and head in fp32, whatever autocast the caller has
    on (a thread's autocast is its own, so sessions sharing the model cannot switch each other's)."""
    from cait.explain.metrics import split_precision_logits

    model = cait.load_model("cait_nano_64", weights=False).model.eval()
    x = torch.randn(3, 3, 64, 64)
    dtypes: dict[str, torch.dtype] = {}
    record = lambda name: lambda module, args, out: dtypes.__setitem__(name, out.dtype)  # noqa: E731
    model.blocks[-1].attn.register_forward_hook(record("sa"))  # a branch (the residual stream stays fp32)
    model.blocks_token_only[-1].attn.register_forward_hook(record("ca"))
    with torch.no_grad():
        assert torch.equal(split_precision_logits(model, x, None), model(x))  # fp32: the model's own forward
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = split_precision_logits(model, x, torch.bfloat16)
    assert dtypes == {"sa": torch.bfloat16, "ca": torch.float32} and logits.dtype == torch.float32
    assert torch.allclose(logits, model(x), atol=0.1)
