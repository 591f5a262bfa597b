"""The analysis scripts, each run as a user would (a subprocess in --quick mode on a tiny random model),
checked against numbers computed here independently: the paper's table, the checkpoint's own gammas,
the model's own attention, the training runs' own metrics."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import cait
from cait import explain
from cait.paper import MAIN_TABLE
from cait.preprocess import to_batch
from conftest import randomise_

ANALYSIS = Path(__file__).resolve().parent.parent / "analysis"
EXAMPLES = Path(cait.__file__).resolve().parent / "examples"


def run(script: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(ANALYSIS / script), *map(str, args)], capture_output=True, text=True,
                          timeout=600)
    if ok:
        assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny model whose gammas differ per channel and block, so statistics can tell blocks apart."""
    torch.manual_seed(0)
    model = randomise_(cait.create_model("cait_pico_32"))
    path = tmp_path_factory.mktemp("ckpt") / "pico.safetensors"
    cait.save_weights(model, path, {"data": "fashion-mnist-scenes", "epochs_completed": "3", "val_top1": "42.0"})
    return path


@pytest.fixture(scope="module")
def gallery(checkpoint, tmp_path_factory) -> Path:
    """Everything make_all regenerates, in quick mode, in one process (one torch import)."""
    out = tmp_path_factory.mktemp("all")
    run("make_all.py", "--quick", "--checkpoint", checkpoint, "--out", out)
    return out


def test_every_figure_written_with_its_provenance(gallery, checkpoint):
    for name, stems in {"model_table": ["model_table"], "layerscale_stats": ["layerscale_stats"],
                        "saliency": ["regions_of_focus", "localization"]}.items():
        for stem in stems:
            for ext in ("png", "html", "json"):
                path = gallery / name / f"{stem}.{ext}"
                assert path.is_file() and path.stat().st_size > 1000, path
    for name in ("layerscale_stats", "attention_maps", "saliency"):
        made = json.loads((gallery / name / f"{name if name != 'saliency' else 'regions_of_focus'}.json").read_text())
        assert "pico.safetensors" in made["made_from"] and "trained 3 epochs on fashion-mnist-scenes" in made["made_from"]
        assert "not the paper's" in made["made_from"]
    # HTML is self-contained (plotly.js embedded, no CDN) and says what it was made from
    page = (gallery / "layerscale_stats" / "layerscale_stats.html").read_text()
    assert "made from: checkpoint pico.safetensors" in page and 'src="https://cdn' not in page
    with Image.open(gallery / "model_table" / "model_table.png") as im:
        assert im.width > 800 and im.height > 500


def test_gallery_links_resolve(gallery):
    index = (gallery / "index.html").read_text()
    links = re.findall(r"(?:href|src)='([^']+)'", index)
    assert len(links) >= 15
    for link in links:
        assert not link.startswith(("/", "http")), link
        assert (gallery / link).is_file(), link
    for png in ("model_table/model_table.png", "layerscale_stats/layerscale_stats.png",
                "attention_maps/attention_scene_00000_ankle_boot.png", "saliency/regions_of_focus.png"):
        assert f"src='{png}'" in index


def test_model_table_matches_the_paper(gallery):
    rows = {r["model"]: r for r in json.loads((gallery / "model_table" / "model_table.json").read_text())["rows"]}
    assert set(rows) == {r.label for r in MAIN_TABLE}
    for paper in MAIN_TABLE:
        row = rows[paper.label]
        assert abs(row["params_m"] - paper.params_m) <= 0.1, (paper.label, row["params_m"], paper.params_m)
        assert row["paper_params_m"] == paper.params_m
        assert row["params_diff_m"] == pytest.approx(row["params_m"] - paper.params_m, abs=0.011)
        for res, flops in paper.flops_g.items():
            assert row[f"paper_gflops_{res}"] == flops
            assert abs(row[f"gflops_{res}"] - flops) / flops < 0.02  # FLOP counts agree to 2%
        for key, value in paper.top1.items():
            assert row[f"top1_{key}_quoted"] == value


def test_layerscale_stats_equal_the_checkpoint(gallery, checkpoint):
    data = json.loads((gallery / "layerscale_stats" / "layerscale_stats.json").read_text())
    state = load_file(str(checkpoint))
    cfg = cait.create_model(None, checkpoint).cfg
    assert data["init_eps"] == cfg.init_values
    rows = {(r["stage"], r["layer"], r["gamma"]): r for r in data["rows"]}
    assert len(rows) == 2 * (cfg.depth + cfg.depth_token_only)
    for (stage, layer, gamma), row in rows.items():
        prefix = "blocks" if stage == "sa" else "blocks_token_only"
        g = state[f"{prefix}.{layer}.{gamma}"].abs().double().numpy()
        expected = dict(mean=g.mean(), median=np.median(g), p10=np.percentile(g, 10), p90=np.percentile(g, 90))
        for key, value in expected.items():
            assert row[key] == pytest.approx(value, rel=1e-5), (stage, layer, gamma, key)


def test_attention_grid_is_the_models_class_attention(gallery, checkpoint):
    data = json.loads((gallery / "attention_maps" / "attention_maps.json").read_text())
    model = cait.create_model(None, checkpoint)
    layers, heads, g = model.cfg.depth_token_only, model.cfg.num_heads, model.cfg.grid_size
    assert (data["layers"], data["heads"]) == (layers, heads)
    assert [len(row) for row in data["panels"]] == [heads + 1] * layers  # one column per head + the mean
    assert all(row[-1].endswith("mean") for row in data["panels"])
    files = sorted(EXAMPLES.glob("*.png"))[:2]  # --quick: the first two shipped examples
    assert [r["image"] for r in data["images"]] == [f.stem for f in files]
    ca = explain.class_attention(model, to_batch([Image.open(f) for f in files], model.cfg))
    for b, record in enumerate(data["images"]):
        maps = torch.tensor(record["maps"])
        assert maps.shape == (layers, heads, g, g)
        torch.testing.assert_close(maps, ca.maps[b], atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(maps.sum((-1, -2)) + torch.tensor(record["self_share"]),
                                   torch.ones(layers, heads), atol=1e-4, rtol=0)
        probs = ca.logits[b].softmax(-1)
        assert record["probability"] == pytest.approx(probs.max().item(), abs=1e-4)
        assert (gallery / "attention_maps" / f"attention_{record['image']}.png").is_file()


def test_saliency_regions_and_localization(gallery, checkpoint):
    model = cait.create_model(None, checkpoint)
    regions = json.loads((gallery / "saliency" / "regions_of_focus.json").read_text())
    files = sorted(EXAMPLES.glob("*.png"))[:4]
    ca = explain.class_attention(model, to_batch([Image.open(f) for f in files], model.cfg))
    masks, boxes = explain.regions_of_focus(ca.mean[:, 0], img_size=model.cfg.img_size)
    for b, record in enumerate(regions["images"]):
        assert torch.equal(torch.tensor(record["mask"]), masks[b])
        assert record["region_box"] == pytest.approx(boxes[b].tolist())
    table = {r["method"]: r for r in json.loads((gallery / "saliency" / "localization.json").read_text())["localization"]}
    assert {"chance", "ca1_mean", "ca2_mean", "class_specific", "rollout_before_mixing"} <= set(table)
    for row in table.values():
        assert row["images"] == 4 and 0 <= row["pointing_game"] <= 1 and 0 <= row["mass_in_box"] <= 1 + 1e-6


def test_residual_ratio_quick_retraining(tmp_path):
    run("residual_ratio.py", "--retrain", "--quick", "--out", tmp_path)
    data = json.loads((tmp_path / "residual_ratio.json").read_text())
    assert data["made_from"].startswith("miniature retraining")
    for kind in ("layerscale", "none"):
        run_data = data["data"][kind]
        assert run_data["residual_scale"] == kind and run_data["epochs"] == [1, 2]
        lines = [json.loads(l) for l in (tmp_path / "runs" / kind / "metrics.jsonl").read_text().splitlines()]
        assert run_data["sa"] == [l["residual_ratios"]["sa"] for l in lines]
        assert run_data["ffn"] == [l["residual_ratios"]["ffn"] for l in lines]
        assert len(run_data["sa"][0]) == cait.get_config("cait_pico_32").depth
    # LayerScale (gamma starts at eps 0.1) keeps the branches far smaller than plain residuals, the paper's Fig. 4
    with_ls, without = (np.mean(data["data"][k]["sa"][-1]) for k in ("layerscale", "none"))
    assert with_ls < without / 2
    for ext in ("png", "html", "csv"):
        assert (tmp_path / f"residual_ratio.{ext}").is_file()


def test_random_init_is_said_and_bad_input_is_one_line(tmp_path):
    # cait_pico_32 has no shipped weights: the script falls back to random init and says so
    done = run("layerscale_stats.py", "--model", "cait_pico_32", "--quick", "--out", tmp_path)
    assert "RANDOM INIT" in json.loads((tmp_path / "layerscale_stats.json").read_text())["made_from"]
    assert "RANDOM INIT" in done.stdout
    bad = run("attention_maps.py", "--checkpoint", tmp_path / "missing.safetensors", "--out", tmp_path, ok=False)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error:") and "Traceback" not in bad.stderr


def _runs_of(out: Path) -> dict[str, tuple[cait.CaiTConfig, list[float]]]:
    """Each run's saved config and the val top-1 of every epoch in its own metrics.jsonl."""
    found = {}
    for run in sorted((out / "runs").iterdir()):
        cfg = cait.create_model(None, checkpoint=run / "last.safetensors").cfg
        found[run.name] = cfg, [json.loads(l)["val_top1"] for l in (run / "metrics.jsonl").read_text().splitlines()]
    return found


def test_depth_stability_grid_trains_what_it_says_and_reuses_finished_runs(tmp_path):
    done = run("depth_stability.py", "--quick", "--out", tmp_path)
    data = json.loads((tmp_path / "depth_stability.json").read_text())
    assert data["made_from"].startswith("miniature retraining") and data["scale"] == "miniature"
    runs = _runs_of(tmp_path)
    kinds = {"baseline": "none", "scalar": "scalar", "rezero": "rezero", "layerscale": "layerscale"}
    assert len(data["rows"]) == len(runs) == 2 * 4
    for row in data["rows"]:
        cfg, curve = runs[f"depth{row['depth']}-{row['method']}"]
        # the flags reached the model: depth, residual weighting, eps by the paper's depth rule
        assert (cfg.depth, cfg.residual_scale, cfg.init_values) == (row["depth"], kinds[row["method"]], 0.1)
        assert row["final_top1"] == curve[-1] and not row["diverged"]
        assert row["params"] == cait.CaiT(cfg).num_params()
        assert row["paper_top1_quoted"] is None  # depths 2 and 3 are not in the paper: nothing to quote
    for ext in ("png", "html"):
        assert (tmp_path / f"depth_stability.{ext}").stat().st_size > 1000
    assert len((tmp_path / "depth_stability.csv").read_text().splitlines()) == 1 + 8
    assert "miniature" in done.stdout
    logs = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/metrics.jsonl")}
    run("depth_stability.py", "--quick", "--out", tmp_path)
    assert logs == {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/metrics.jsonl")}


def test_class_attention_ablation_runs_the_four_summaries(tmp_path):
    run("class_attention_ablation.py", "--quick", "--out", tmp_path)
    data = json.loads((tmp_path / "class_attention_ablation.json").read_text())
    runs = _runs_of(tmp_path)
    shape = {name: (cfg.depth, cfg.depth_token_only, cfg.class_token_at, cfg.global_pool)
             for name, (cfg, _) in runs.items()}
    assert shape == {"token_at_0": (3, 0, 0, "token"), "token_late": (3, 0, 1, "token"),
                     "avg_pool": (3, 0, None, "avg"), "class_attention": (1, 2, None, "token")}
    for row in data["rows"]:
        cfg, curve = runs[row["name"]]
        assert row["final_top1"] == curve[-1] and row["params"] == cait.CaiT(cfg).num_params()
    quoted = {r["name"]: r["paper_top1_quoted"] for r in data["rows"]}
    assert quoted == {"token_at_0": 79.9, "token_late": 80.5, "avg_pool": 80.3, "class_attention": 80.3}
    for ext in ("png", "html"):
        assert (tmp_path / f"class_attention_ablation.{ext}").stat().st_size > 1000
    assert len((tmp_path / "class_attention_ablation.csv").read_text().splitlines()) == 1 + 4


def test_a_diverging_run_is_a_result_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ANALYSIS))
    import argparse
    import _common
    flags = {**_common.QUICK_MINIATURE, **_common.RECIPE, "epochs": 2, "subset": 64, "val_subset": 32,
             "batch_size": 16, "threads": 1, "warmup_epochs": 0, "lr": 1e9}
    result = _common.train_runs({"boom": flags}, tmp_path, argparse.Namespace(fresh=False))["boom"]
    assert result.diverged and result.val_top1 == [] and result.params > 0
    assert "loss is nan" in (tmp_path / "runs" / "boom" / "train.log").read_text()
    # the divergence is a finished result: asked again, the sweep reuses it instead of training again
    log = (tmp_path / "runs" / "boom" / "train.log").stat().st_mtime_ns
    again = _common.train_runs({"boom": flags}, tmp_path, argparse.Namespace(fresh=False))["boom"]
    assert again.diverged and (tmp_path / "runs" / "boom" / "train.log").stat().st_mtime_ns == log
