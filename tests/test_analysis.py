"""The analysis scripts, each run as a user would (a subprocess in --quick mode on a tiny random model),
checked against numbers computed here independently: the paper's table, the checkpoint's own gammas,
the model's own attention, the training runs' own metrics."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _paper import MAIN_TABLE
from conftest import randomise_
from PIL import Image
from safetensors.torch import load_file

import cait
from cait import explain
from cait.explain.maps import regions_of_focus
from cait.metrics import percent
from cait.preprocess import to_batch

ANALYSIS = Path(__file__).resolve().parent.parent / "analysis"
EXAMPLES = Path(cait.__file__).resolve().parent / "examples"


def run(script: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, str(ANALYSIS / script), *map(str, args)], capture_output=True, text=True, timeout=600
    )
    return _checked(done, ok)


def run_here(script: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """`run` through the script's main in this process, for a script that this file also starts in a fresh
    interpreter, as a user does (with `run`, or inside make_all's): another would only import torch again. A
    bad-input exit is the return code; any other exception fails the test, as a traceback would. Torch's thread
    count, which a training run sets, is given back."""
    module, threads = importlib.import_module(script.removesuffix(".py")), torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = module.main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    finally:
        torch.set_num_threads(threads)
    done = subprocess.CompletedProcess([script, *args], code, out.getvalue(), err.getvalue())
    return _checked(done, ok)


def _checked(done: subprocess.CompletedProcess, ok: bool) -> subprocess.CompletedProcess:
    if ok:
        assert done.returncode == 0, f"{done.args[:2]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny model whose gammas differ per channel and block, so statistics can tell blocks apart."""
    torch.manual_seed(0)
    model = randomise_(cait.load_model("cait_pico_32", weights=False).model)
    path = tmp_path_factory.mktemp("ckpt") / "pico.safetensors"
    cait.save_weights(model, path, {"data": "fashion-mnist-scenes", "epochs_completed": "3", "val_top1": "0.42"})
    return path


@pytest.fixture(scope="module")
def gallery(checkpoint, tmp_path_factory) -> Path:
    """Everything make_all regenerates, in quick mode, in one process (one torch import)."""
    out = tmp_path_factory.mktemp("all")
    run("make_all.py", "--quick", "--checkpoint", checkpoint, "--out", out)
    return out


def test_every_figure_written_with_its_provenance(gallery, checkpoint):
    for name, stems in {
        "model_table": ["model_table"],
        "layerscale_stats": ["layerscale_stats"],
        "saliency": ["regions_of_focus", "localization"],
        "mechanisms": ["mechanisms"],
    }.items():
        for stem in stems:
            for ext in ("png", "html", "json"):
                path = gallery / name / f"{stem}.{ext}"
                assert path.is_file() and path.stat().st_size > 1000, path
    for name in ("layerscale_stats", "attention_maps", "saliency", "mechanisms"):
        made = json.loads((gallery / name / f"{name if name != 'saliency' else 'regions_of_focus'}.json").read_text())
        assert (
            "pico.safetensors" in made["made_from"] and "trained 3 epochs on fashion-mnist-scenes" in made["made_from"]
        )
        assert "val top-1 42.0%" in made["made_from"]  # the file's fraction, shown in percent
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
    for png in (
        "model_table/model_table.png",
        "layerscale_stats/layerscale_stats.png",
        "attention_maps/attention_scene_00000_ankle_boot.png",
        "saliency/regions_of_focus.png",
        "mechanisms/mechanisms.png",
    ):
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
    cfg = cait.load_model(None, checkpoint).model.cfg
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
    model = cait.load_model(None, checkpoint).model
    layers, heads, g = model.cfg.depth_token_only, model.cfg.num_heads, model.cfg.grid_size
    assert (data["layers"], data["heads"]) == (layers, heads)
    assert [len(row) for row in data["panels"]] == [heads + 1] * layers  # one column per head + the mean
    assert all(row[-1].endswith("mean") for row in data["panels"])
    files = sorted(EXAMPLES.glob("scene_*.png"))[:2]  # --quick: the first two shipped example scenes
    assert [r["image"] for r in data["images"]] == [f.stem for f in files]
    ca = explain.class_attention(model, to_batch([Image.open(f) for f in files], model.cfg))
    for b, record in enumerate(data["images"]):
        maps = torch.tensor(record["maps"])
        assert maps.shape == (layers, heads, g, g)
        torch.testing.assert_close(maps, ca.maps[b], atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(
            maps.sum((-1, -2)) + torch.tensor(record["self_share"]), torch.ones(layers, heads), atol=1e-4, rtol=0
        )
        probs = ca.logits[b].softmax(-1)
        assert record["probability"] == pytest.approx(probs.max().item(), abs=1e-4)
        assert (gallery / "attention_maps" / f"attention_{record['image']}.png").is_file()


def test_saliency_regions_and_localization(gallery, checkpoint):
    model = cait.load_model(None, checkpoint).model
    regions = json.loads((gallery / "saliency" / "regions_of_focus.json").read_text())
    files = sorted(EXAMPLES.glob("scene_*.png"))[:4]
    ca = explain.class_attention(model, to_batch([Image.open(f) for f in files], model.cfg))
    masks, boxes = regions_of_focus(ca.mean[:, 0], img_size=model.cfg.img_size)
    for b, record in enumerate(regions["images"]):
        assert torch.equal(torch.tensor(record["mask"]), masks[b])
        assert record["region_box"] == pytest.approx(boxes[b].tolist())
    table = {
        r["method"]: r for r in json.loads((gallery / "saliency" / "localization.json").read_text())["localization"]
    }
    assert {
        "chance",
        "ca1_mean",
        "ca2_mean",
        "class_specific",
        "rollout_raw",
        "rollout_after_proj_l",
        "rollout_after_proj_w",
    } <= set(table)
    for row in table.values():
        assert row["images"] == 4 and 0 <= row["pointing_game"] <= 1 and 0 <= row["mass_in_box"] <= 1 + 1e-6


def test_residual_ratio_quick_retraining(tmp_path):
    run_here("residual_ratio.py", "--retrain", "--quick", "--out", tmp_path)
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
    # cait_pico_32 has no shipped weights: asked for, a random init, said on every output
    done = run_here("layerscale_stats.py", "--model", "cait_pico_32", "--random-init", "--quick", "--out", tmp_path)
    assert "RANDOM INIT" in json.loads((tmp_path / "layerscale_stats.json").read_text())["made_from"]
    assert "RANDOM INIT" in done.stdout
    bad = run_here("attention_maps.py", "--checkpoint", tmp_path / "missing.safetensors", "--out", tmp_path, ok=False)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error:") and "Traceback" not in bad.stderr


def _runs_of(out: Path) -> dict[str, tuple[cait.CaiTConfig, list[float]]]:
    """Each run's saved config and the val top-1 of every epoch in its own metrics.jsonl."""
    found = {}
    for run in sorted((out / "runs").iterdir()):
        cfg = cait.load_model(None, checkpoint=run / "last.safetensors").model.cfg
        found[run.name] = cfg, [json.loads(l)["val_top1"] for l in (run / "metrics.jsonl").read_text().splitlines()]
    return found


def _check_rows_against_their_runs(rows: list[dict], out: Path) -> None:
    """Each depth_stability row says what its run in out/runs was given and what it scored."""
    kinds = {"baseline": "none", "scalar": "scalar", "rezero": "rezero", "layerscale": "layerscale"}
    for row in rows:
        folder = out / "runs" / row["run"]
        saved = json.loads((folder / "args.json").read_text())["args"]
        # the flags reached the run: depth, residual weighting, eps, lr, seed, budget
        assert (saved["depth"], saved["residual_scale"], saved["init_values"]) == (
            row["depth"],
            kinds[row["method"]],
            row["eps"],
        )
        budget = saved["epochs"] * saved["subset"]
        assert (saved["lr"], saved["seed"], budget) == (row["lr"], row["seed"], row["images"])
        # divergence is the typed result: every run at lr 1e9, none below; the others' numbers are their own
        assert row["diverged"] == (row["lr"] == 1e9)
        if row["diverged"]:
            assert row["final_top1"] is None and row["diverged_at_step"] >= 1
            continue
        cfg = cait.load_model(None, checkpoint=folder / "last.safetensors").model.cfg
        assert (cfg.depth, cfg.residual_scale) == (row["depth"], kinds[row["method"]])
        assert row["eps"] is None or cfg.init_values == row["eps"]
        curve = [json.loads(l)["val_top1"] for l in (folder / "metrics.jsonl").read_text().splitlines()]
        assert row["final_top1"] == curve[-1] and row["epochs_done"] == 2
        assert row["paper_top1_quoted"] is None  # depths 2 and 3 are not in the paper: nothing to quote


def _check_replot_from_the_saved_numbers(out: Path) -> None:
    """The figures come back from the saved numbers alone (the committed results have no runs beside them)."""
    shutil.rmtree(out / "runs")
    for png in out.glob("*.png"):
        png.unlink()
    summary_md = (out / "depth_stability_summary.md").read_text()
    (out / "depth_stability_summary.md").unlink()
    replotted = run_here("depth_stability.py", "--replot", "--out", out)
    assert "depth_stability_lr.png" in replotted.stdout
    assert (out / "depth_stability_summary.md").read_text() == summary_md
    for stem in ("depth_stability", "depth_stability_lr", "depth_stability_eps"):
        assert (out / f"{stem}.png").stat().st_size > 1000
    missing = run_here("depth_stability.py", "--replot", "--out", out / "nothing", ok=False)
    assert missing.returncode == 2 and "cannot replot" in missing.stderr and "Traceback" not in missing.stderr


def test_depth_stability_runs_every_phase_as_designed_and_reuses_finished_runs(tmp_path):
    done = run_here("depth_stability.py", "--quick", "--out", tmp_path)
    data = json.loads((tmp_path / "depth_stability.json").read_text())
    assert data["made_from"].startswith("miniature retraining") and data["scale"] == "miniature"
    # --quick: depths 2, 3; lrs 1e-3 and 1e9 (which diverges); eps 0.1 (the rule at depth 3), 1e-6; seeds 0, 1
    assert data["planned"] == {"lr": 16, "eps": 2, "main": 16}
    rows = data["rows"]
    assert {p: sum(r["phase"] == p for r in rows) for p in ("lr", "eps", "main")} == data["planned"]
    _check_rows_against_their_runs(rows, tmp_path)
    main = [r for r in rows if r["phase"] == "main"]
    assert {r["lr"] for r in main} == {1e-3}  # each method's best lr: the one that did not diverge
    assert sorted({r["seed"] for r in main}) == [0, 1]
    eps_rows = [r for r in rows if r["phase"] == "eps"]
    assert sorted(r["eps"] for r in eps_rows) == [1e-6, 0.1]
    for r in eps_rows:  # gamma's trajectory: the init, then each epoch's SA mean from the run's own metrics
        trajectory = data["gamma"][r["run"]]
        assert trajectory[0] == {"epoch": 0, "mean": r["eps"], "min": r["eps"], "max": r["eps"]}
        last = json.loads((tmp_path / "runs" / r["run"] / "metrics.jsonl").read_text().splitlines()[-1])
        means = [g["mean"] for g in last["layerscale"] if g["stage"] == "sa"]
        assert trajectory[-1]["mean"] == pytest.approx(np.mean(means)) == r["gamma_final"]
    pair = data["residual_ratio_pair"]
    assert (pair["depth"], pair["lr"]) == (3, 1e-3) and {pair["layerscale"], pair["none"]} <= {r["run"] for r in rows}
    # Fig. 4's pair is drawn from these runs: the ratios are those of the pair's own metrics
    run_here("residual_ratio.py", "--sweep", tmp_path, "--out", tmp_path / "fig4")
    drawn = json.loads((tmp_path / "fig4" / "residual_ratio.json").read_text())
    assert drawn["runs"] == {kind: str(tmp_path / "runs" / pair[kind]) for kind in ("layerscale", "none")}
    last = json.loads((tmp_path / "runs" / pair["none"] / "metrics.jsonl").read_text().splitlines()[-1])
    assert drawn["data"]["none"]["sa"][-1] == last["residual_ratios"]["sa"]
    for stem in ("depth_stability", "depth_stability_lr", "depth_stability_eps"):
        for ext in ("png", "html"):
            assert (tmp_path / f"{stem}.{ext}").stat().st_size > 1000
    summary = (tmp_path / "depth_stability_summary.md").read_text()
    assert data["summary"]["headline"] in summary
    assert "8 of 16 runs of the lr sweep diverged" in summary and "no divergence below lr 1e9" in summary
    assert len((tmp_path / "depth_stability.csv").read_text().splitlines()) == 1 + 34
    assert "miniature" in done.stdout
    logs = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/metrics.jsonl")}
    run_here("depth_stability.py", "--quick", "--out", tmp_path)
    assert logs == {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/metrics.jsonl")}
    _check_replot_from_the_saved_numbers(tmp_path)


def test_depth_stability_runs_a_part_at_a_time_and_one_sweep_at_a_time(tmp_path):
    # the main phase picks best lrs from the lr phase: asked for first, it says so in one line
    early = run_here("depth_stability.py", "--quick", "--phase", "main", "--out", tmp_path, ok=False)
    assert early.returncode == 2 and early.stderr.strip().splitlines()[-1].startswith("error: the main phase")
    # a time budget already used up starts nothing, and the outputs say what is finished
    run_here("depth_stability.py", "--quick", "--hours", "1e-9", "--out", tmp_path)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert "lr 0/16" in json.loads((tmp_path / "depth_stability.json").read_text())["made_from"]
    assert not (tmp_path / "depth_stability.png").exists()
    # one training at a time: a second sweep into the same directory is refused while the first holds it (held
    # here, the second a fresh interpreter as a user starts it: the script's one run in a process of its own)
    import fcntl

    with open(tmp_path / "sweep.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        busy = run("depth_stability.py", "--quick", "--phase", "eps", "--out", tmp_path, ok=False)
    assert busy.returncode == 2 and "another sweep is training into" in busy.stderr and "Traceback" not in busy.stderr
    # the budget is measured, not guessed: a few steps per depth x method, and each phase's hours from them
    measured = run_here("depth_stability.py", "--quick", "--measure-speed", "2", "--out", tmp_path)
    speed = json.loads((tmp_path / "speed.json").read_text())
    assert sorted(speed["speeds"]) == sorted(
        f"d{d}-{m}" for d in (2, 3) for m in ("baseline", "scalar", "rezero", "layerscale")
    )
    assert all(s["images_per_s"] > 0 for s in speed["speeds"].values())
    hours = speed["estimated_hours"]
    assert set(hours) == {"lr", "eps", "main"} and all(h > 0 for h in hours.values())
    assert "estimated wall time" in measured.stdout and not (tmp_path / "runs").is_dir()
    bad = run_here("depth_stability.py", "--main-depths", "48", "--out", tmp_path, ok=False)
    assert bad.returncode == 2 and "--main-depths must be among --depths" in bad.stderr


def test_class_attention_ablation_runs_the_four_summaries(tmp_path):
    trained = run("class_attention_ablation.py", "--quick", "--out", tmp_path)
    data = json.loads((tmp_path / "class_attention_ablation.json").read_text())
    runs = _runs_of(tmp_path)
    shape = {
        name: (cfg.depth, cfg.depth_token_only, cfg.class_token_at, cfg.global_pool) for name, (cfg, _) in runs.items()
    }
    assert shape == {
        "token_at_0": (3, 0, 0, "token"),
        "token_late": (3, 0, 1, "token"),
        "avg_pool": (3, 0, None, "avg"),
        "class_attention": (1, 2, None, "token"),
    }
    for row in data["rows"]:
        cfg, curve = runs[row["name"]]
        assert row["final_top1"] == curve[-1] and row["params"] == cait.CaiT(cfg).num_params()
    quoted = {r["name"]: r["paper_top1_quoted"] for r in data["rows"]}
    assert quoted == {"token_at_0": 79.9, "token_late": 80.5, "avg_pool": 80.3, "class_attention": 80.3}
    for ext in ("png", "html"):
        assert (tmp_path / f"class_attention_ablation.{ext}").stat().st_size > 1000
    assert len((tmp_path / "class_attention_ablation.csv").read_text().splitlines()) == 1 + 4
    # the summary and figures come back from the JSON alone, our top-1 (fractions) printed in percent
    shutil.rmtree(tmp_path / "runs")
    replotted = run_here("class_attention_ablation.py", "--replot", "--out", tmp_path)
    assert replotted.stdout.splitlines()[:5] == trained.stdout.splitlines()[-6:-1]
    assert f"{percent(data['rows'][0]['final_top1']):.1f}%" in replotted.stdout.splitlines()[1]


def test_committed_class_attention_ablation_counts_the_models_as_built(monkeypatch):
    """The committed Table 2 miniature's sizes are those of the models its flags build today (average
    pooling builds no class token), so a structure change cannot leave them stale unnoticed."""
    monkeypatch.syspath_prepend(str(ANALYSIS))
    from _common import RECIPE, miniature
    from class_attention_ablation import settings

    from cait.train.args import model_config, to_argv, train_args

    saved = json.loads((ANALYSIS / "data" / "class_attention_ablation" / "class_attention_ablation.json").read_text())
    plan = settings(12)
    assert [r["name"] for r in saved["rows"]] == list(plan)
    for row in saved["rows"]:
        flags = plan[row["name"]][1]
        assert row["flags"] == " ".join(to_argv(flags))
        model = cait.CaiT(model_config(train_args(**miniature(False), **RECIPE, data="fashion-mnist", **flags)))
        assert (row["params"], row["macs"]) == (model.num_params(), model.flops()), row["name"]


def test_a_diverging_run_is_a_result_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ANALYSIS))
    import argparse

    import _common

    flags = {
        **_common.QUICK_MINIATURE,
        **_common.RECIPE,
        "epochs": 2,
        "subset": 64,
        "val_subset": 32,
        "batch_size": 16,
        "threads": 1,
        "warmup_epochs": 0,
        "lr": 1e9,
    }
    result = _common.train_runs({"boom": flags}, tmp_path, argparse.Namespace(fresh=False))["boom"]
    assert result.diverged and result.val_top1 == [] and result.params > 0
    assert "loss is nan" in (tmp_path / "runs" / "boom" / "train.log").read_text()
    # the divergence is a finished result: asked again, the sweep reuses it instead of training again
    log = (tmp_path / "runs" / "boom" / "train.log").stat().st_mtime_ns
    again = _common.train_runs({"boom": flags}, tmp_path, argparse.Namespace(fresh=False))["boom"]
    assert again.diverged and (tmp_path / "runs" / "boom" / "train.log").stat().st_mtime_ns == log


def test_a_divergence_reaches_the_sweep_as_the_typed_result(tmp_path, monkeypatch):
    """The runner takes where training diverged from cait.train.Diverged itself, not from any log text."""
    monkeypatch.syspath_prepend(str(ANALYSIS))
    import argparse

    import _common

    from cait import train

    def diverges(args):
        raise train.Diverged("quiet", epoch=2, step=17, loss=float("inf"))

    monkeypatch.setattr(train, "run", diverges)
    flags = {**_common.QUICK_MINIATURE, **_common.RECIPE, "epochs": 2, "subset": 64, "threads": 1}
    result = _common.train_runs({"typed": flags}, tmp_path, argparse.Namespace(fresh=False))["typed"]
    assert result.diverged and result.divergence == {"epoch": 2, "step": 17, "loss": "inf"}
    assert json.loads((tmp_path / "runs" / "typed" / "sweep.json").read_text())["divergence"]["step"] == 17


def test_a_stopped_run_continues_where_it_stopped(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ANALYSIS))
    import argparse

    import _common

    from cait import train

    flags = {
        **_common.QUICK_MINIATURE,
        **_common.RECIPE,
        "epochs": 2,
        "subset": 64,
        "val_subset": 32,
        "batch_size": 16,
        "threads": 1,
    }
    whole = _common.train_runs({"whole": flags}, tmp_path, argparse.Namespace(fresh=False))["whole"]
    # as if the sweep was killed in epoch 2 (cait.train saves on a signal; --stop-after does the same)
    stopped = train.run(train.train_args(**flags, output=tmp_path / "runs" / "parted", stop_after=6))
    assert not stopped.finished and stopped.epochs == 1
    parted = _common.train_runs({"parted": flags}, tmp_path, argparse.Namespace(fresh=False))["parted"]
    assert "resuming" in (tmp_path / "runs" / "parted" / "train.log").read_text()
    assert parted.val_top1 == whole.val_top1 and len(parted.val_top1) == 2
    lines = [json.loads(l) for l in (tmp_path / "runs" / "parted" / "metrics.jsonl").read_text().splitlines()]
    assert [l["epoch"] for l in lines] == [1, 2] and lines[-1]["step"] == 8


# ----------------------------------------------------------------------------------------------------
# what the Table 1 miniature's summary says follows its results (synthetic result rows)


@pytest.fixture
def table1(monkeypatch):
    monkeypatch.syspath_prepend(str(ANALYSIS))
    import _table1

    return _table1


def _row(
    phase: str,
    method: str,
    depth: int,
    top1_percent: float | None,
    *,
    lr: float = 1e-3,
    eps: float | None = None,
    seed: int = 0,
    images: int = 12000,
) -> dict:
    return {
        "phase": phase,
        "method": method,
        "depth": depth,
        "lr": lr,
        "eps": eps,
        "seed": seed,
        "images": images,
        "diverged": top1_percent is None,
        "final_top1": None if top1_percent is None else top1_percent / 100,  # a fraction, as cait.train writes it
    }


def _main_rows(table1, depth: int, top1: dict[str, tuple[float | None, float | None]]) -> list[dict]:
    """Main-phase rows at `depth`, two seeds per method (top-1 given in percent), eps by the paper's rule."""
    return [
        _row("main", m, depth, value, seed=seed, eps=table1.paper_eps(depth) if table1.METHODS[m].has_eps else None)
        for m, values in top1.items()
        for seed, value in enumerate(values)
    ]


def test_summary_says_the_paper_ordering_is_reproduced_when_it_is(table1):
    # the paper at depth 36: LayerScale 82.9 > scalar alpha 81.6 = ReZero 81.6 > plain residual (diverged)
    rows = _main_rows(
        table1,
        36,
        {"layerscale": (71.0, 72.0), "scalar": (66.0, 66.4), "rezero": (65.8, 66.6), "baseline": (None, None)},
    )
    summary = table1.summarize(rows)
    assert summary.headline == "Paper's Table 1 ordering at depth 36: reproduced"
    [sentence] = summary.findings["main"]
    assert "is REPRODUCED" in sentence and "5 agree, 0 reversed, 0 within the seed spread" in sentence
    assert "LayerScale 71.5 ± 0.5 > scalar alpha 66.2 ± 0.2 = ReZero 66.2 ± 0.4 > plain residual diverged" in sentence


def test_summary_says_when_the_paper_ordering_is_not_reproduced(table1):
    # ours: the plain residual is best at depth 36 and LayerScale (eps 1e-6) worst, as in the shipped 3-epoch sweep
    rows = _main_rows(
        table1,
        36,
        {"layerscale": (40.0, 41.0), "scalar": (53.0, 54.0), "rezero": (38.0, 39.0), "baseline": (56.0, 55.0)},
    )
    rows += _main_rows(
        table1,
        12,
        {"layerscale": (58.0, 58.2), "scalar": (56.0, 56.2), "rezero": (35.0, 35.2), "baseline": (57.9, 58.1)},
    )
    summary = table1.summarize(rows)
    assert summary.headline.startswith("Paper's Table 1 ordering at depth 36: not reproduced; at depth 12:")
    deep = next(s for s in summary.findings["main"] if s.startswith("Depth 36"))
    assert "NOT REPRODUCED" in deep and "plain residual 55.5 ± 0.5 > scalar alpha" in deep
    # within the seed spread, LayerScale vs the plain residual at depth 12 is a tie, not a win
    shallow = next(s for s in summary.findings["main"] if s.startswith("Depth 12"))
    assert "LayerScale 58.1 ± 0.1 = plain residual 58.0 ± 0.1" in shallow
    # what depth does to each method, the paper's numbers beside
    assert summary.findings["main"][-1].startswith(
        "From depth 12 to 36, mean final top-1 over seeds: plain residual "
        "58.0 -> 55.5 (paper: 79.9 -> 78.9 (diverged));"
    )
    # a tuned LayerScale arm is judged separately, and the headline says so when its verdict differs
    rows += [_row("main", "layerscale", 36, v, eps=1e-3, seed=s) for s, v in enumerate((70.0, 70.4))]
    rows = [r for r in rows if not (r["method"] == "baseline" and r["depth"] == 36)] + [
        _row("main", "baseline", 36, None, seed=s) for s in (0, 1)
    ]
    rows = [r for r in rows if not (r["method"] == "rezero" and r["depth"] == 36)] + [
        _row("main", "rezero", 36, 54.5, seed=s) for s in (0, 1)
    ]
    summary = table1.summarize(rows)
    assert "not reproduced (with LayerScale's eps tuned: reproduced)" in summary.headline


def test_summary_reports_divergence_and_the_stable_lrs(table1):
    rows = [
        _row("lr", m, d, top1, lr=lr)
        for m, d, lr, top1 in (
            ("baseline", 12, 1e-3, 60.0),
            ("baseline", 12, 1e-2, 55.0),
            ("baseline", 36, 1e-3, 52.0),
            ("baseline", 36, 1e-2, None),
            ("layerscale", 12, 1e-3, 61.0),
            ("layerscale", 12, 1e-2, 15.0),
            ("layerscale", 36, 1e-3, 62.0),
            ("layerscale", 36, 1e-2, 58.0),
        )
    ]
    sentences = table1.stability(rows)
    assert sentences[0].startswith("1 of 8 runs of the lr sweep diverged")
    assert "plain residual at depth 36 lr 1e-2" in sentences[0] and "no divergence below lr 1e-2" in sentences[0]
    assert "1 finished without learning" in sentences[1] and "LayerScale at depth 12 lr 1e-2" in sentences[1]
    assert "plain residual 1e-3..1e-2 / 1e-3" in sentences[2] and "LayerScale 1e-3 / 1e-3..1e-2" in sentences[2]
    assert "plain residual 60.0% (lr 1e-3) -> 52.0% (lr 1e-3)" in sentences[3]
    calm = [dict(r, diverged=False, final_top1=r["final_top1"] or 0.3) for r in rows]
    assert table1.stability(calm)[0].startswith("No run of the lr sweep diverged (8 runs")


def test_summary_says_which_eps_learns(table1):
    gamma = {0.1: 0.12, 1e-3: 0.02, 1e-5: 3e-4, 1e-6: 4e-5}
    rows = [
        dict(_row("eps", "layerscale", 36, top1, eps=eps), gamma_final=gamma[eps])
        for eps, top1 in ((0.1, 64.0), (1e-3, 61.0), (1e-5, 45.0), (1e-6, 30.0))
    ]
    sentences = table1.eps_effect(rows)
    assert sentences[0] == (
        "LayerScale at depth 36 (lr 1e-3, 12000 training images): eps 0.1 64.0%, eps 1e-3 61.0%, "
        "eps 1e-5 45.0%, eps 1e-6 30.0%."
    )
    assert sentences[1] == "LayerScale needs eps >= 1e-3 to end within 5 points of its best in 12000 images."
    assert "eps 1e-6" in sentences[2] and "gets 30.0% here, outside 5 points" in sentences[2]
    assert sentences[3].endswith("0.1 -> 0.12, 1e-3 -> 2e-2, 1e-5 -> 3e-4, 1e-6 -> 4e-5.")
    flat = [dict(r, final_top1=0.6 + r["eps"] / 100) for r in rows]
    assert "does not matter" in table1.eps_effect(flat)[1]
    chance = [dict(r, final_top1=0.1 + r["eps"] / 100) for r in rows]
    assert table1.eps_effect(chance)[1] == "No eps learned in 12000 images (the best ends at 10.1%, below 20%)."


def test_no_verdict_from_runs_that_learned_nothing(table1):
    # chance-level numbers in the paper's order are not a reproduction
    rows = _main_rows(
        table1,
        36,
        {"layerscale": (14.0, 14.2), "scalar": (12.0, 12.2), "rezero": (11.9, 12.1), "baseline": (None, None)},
    )
    assert table1.summarize(rows).headline == "Paper's Table 1 ordering at depth 36: not resolved"


def test_layer_importance_numbers_are_the_models(gallery, checkpoint):
    """--quick: the first 8 test scenes; each block's mean |gamma| and mean knockout change, and each CA
    head's mean attribution, recomputed here for the predicted class."""
    from cait.data import read_images

    data = json.loads((gallery / "layer_importance" / "layer_importance.json").read_text())
    model = cait.load_model(None, checkpoint).model.eval()
    cfg = model.cfg
    images = read_images("fashion-mnist-scenes", cfg, limit=8)
    x = torch.stack([images[i][0] for i in range(8)])
    target = model(x).argmax(1)
    delta = explain.knockout_profile(model, x, target).mean(0)
    dla = explain.direct_logit_attribution(model, x, target)
    heads = dla.heads.mean(0)
    assert data["images"] == 8 and "pico.safetensors" in data["made_from"]
    parts = data["logit_parts"]  # the mean logit, part by part
    assert list(parts) == list(dla.parts())
    assert sum(p["mean"] for p in parts.values()) == pytest.approx(
        dla.logits.gather(1, target[:, None]).mean().item(), abs=1e-4
    )
    assert parts["CA2 MLP"]["mean"] == pytest.approx(dla.mlp[:, 1].mean().item(), abs=1e-4)
    assert sum(p["share_of_mean_logit"] for p in parts.values()) == pytest.approx(1.0, abs=1e-5)
    blocks = data["blocks"]
    assert [(b["stage"], b["index"]) for b in blocks] == [("sa", i + 1) for i in range(cfg.depth)] + [
        ("ca", i + 1) for i in range(cfg.depth_token_only)
    ]
    for k, (b, name) in enumerate(zip(blocks, explain.causal.block_names(model))):
        block = model.get_submodule(name)
        gamma = torch.cat((block.gamma_1, block.gamma_2)).abs().mean().item()
        assert b["gamma_mean_abs"] == pytest.approx(gamma, rel=1e-5)
        assert b["knockout_delta_logit_mean"] == pytest.approx(delta[k].item(), abs=1e-4)
        assert np.isfinite(b["knockout_delta_logit_ci95"])
    for row in data["heads"]:
        assert row["attribution_mean"] == pytest.approx(heads[row["layer"] - 1, row["head"] - 1].item(), abs=1e-4)
        assert 0 <= row["pointing"] <= 1
    rho = data["spearman"]["all_blocks"]
    assert -1 <= rho["low"] <= rho["high"] <= 1 and -1 <= rho["rho"] <= 1
    assert f"rho {rho['rho']:.2f}" in data["verdict"] and "Over 8 images" in data["verdict"]
    assert f"rho {data['heads_spearman']:.2f}" in data["heads_verdict"]
    for name in (
        "layer_importance.png",
        "layer_importance.html",
        "layer_importance_heads.html",
        "layer_importance_parts.html",
    ):
        assert (gallery / "layer_importance" / name).stat().st_size > 1000


def test_layer_importance_verdict_follows_the_rank_correlation(monkeypatch):
    monkeypatch.syspath_prepend(str(ANALYSIS))
    import layer_importance as li

    rng = np.random.default_rng(0)
    gamma = np.linspace(0.01, 0.2, 10)
    follows = -gamma * 10 + 0.01 * rng.standard_normal((50, 10))  # knockouts grow with |gamma|
    unrelated = rng.standard_normal((50, 10))
    well = li.rank_correlation(gamma, follows, resamples=200)
    assert well["rho"] == pytest.approx(1.0) and well["low"] > 0.7
    loose = li.rank_correlation(gamma, unrelated, resamples=200)
    assert loose["low"] < 0 < loose["high"]
    assert "ranks them well" in li.verdict(well, well, 50) and "does not rank" in li.verdict(loose, loose, 50)
    same = li.rank_correlation(np.full(10, 0.1), follows, resamples=10)
    assert same["rho"] is None and "cannot rank" in li.verdict(same, same, 50)


def test_robustness_scores_the_corrupted_views_and_splits_by_whether_the_prediction_held(checkpoint, tmp_path):
    from torchvision.transforms.v2.functional import normalize

    from cait.corruptions import corrupt
    from cait.data import read_images

    run("robustness.py", "--quick", "--checkpoint", checkpoint, "--out", tmp_path)
    result = json.loads((tmp_path / "robustness.json").read_text())
    assert [(r["corruption"], r["severity"]) for r in result["rows"]] == [
        ("gaussian_noise", 1),
        ("gaussian_noise", 5),
        ("shot_noise", 1),
        ("shot_noise", 5),
    ]
    assert (tmp_path / "robustness.png").is_file() and (tmp_path / "robustness.html").is_file()
    (tmp_path / "robustness.png").unlink()
    run_here("robustness.py", "--replot", "--out", tmp_path)  # the figures again from the JSON, no model run
    assert 0 < (tmp_path / "robustness.png").stat().st_size < 100_000  # small enough to ship beside the JSON
    # the row of gaussian_noise:5 recomputed here: the 8 scenes' views corrupted with seed 0, then normalised
    model = cait.load_model(None, checkpoint).model
    views = read_images("fashion-mnist-scenes", model.cfg, limit=8, normalise=False)
    x = torch.stack([views[i][0] for i in range(8)])
    labels, boxes = torch.as_tensor([views[i][1] for i in range(8)]), torch.stack([views[i][2] for i in range(8)])
    x = corrupt(x, "gaussian_noise", 5, generator=torch.Generator().manual_seed(0))
    ca = explain.class_attention(model, normalize(x, model.cfg.mean, model.cfg.std))
    right = ca.logits.argmax(-1) == labels
    hit = explain.pointing_game(ca.mean[:, 0], boxes, model.cfg.img_size)
    row = result["rows"][1]
    assert row["top1"] == pytest.approx(right.float().mean().item())
    assert row["ca1_pointing"] == pytest.approx(hit.float().mean().item())
    assert row["stayed_right"] + row["broke"] == round(result["clean"]["top1"] * 8)  # the clean-right ones, split
    assert result["clean"]["agreement"] == 1 and result["clean"]["focus_kept"] >= 0.5  # the region holds >= 50%
    # photos without labels: agreement with the clean prediction and the focus kept, no top-1 or pointing
    photos = sorted(EXAMPLES.glob("scene_*.png"))[:2]
    run_here("robustness.py", "--quick", "--checkpoint", checkpoint, "--images", *photos, "--out", tmp_path / "photos")
    unlabelled = json.loads((tmp_path / "photos" / "robustness.json").read_text())
    assert unlabelled["images"] == "2 photos" and all("top1" not in r for r in unlabelled["rows"])
    assert all(0 <= r["focus_kept"] <= 1 and 0 <= r["agreement"] <= 1 for r in unlabelled["rows"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """30 exported test scenes with their COCO boxes, as a user's ImageFolder, and one unreadable file."""
    from cait.data.export import export_scenes

    root = tmp_path_factory.mktemp("exported") / "scenes"
    export_scenes(root, n=30, split="val", style="default", seed=0)
    (root / "Bag" / "broken.png").write_text("not an image")
    return root


def test_scripts_over_a_folder_name_it_and_equal_the_atlas(exported, checkpoint, tmp_path):
    """--data/--boxes/--limit through the reader: each script's JSON and figures name the data and the skipped
    file, and the numbers the atlas also computes (knockouts per block, per-head pointing, SA distances) equal
    the atlas's on the same images."""
    from cait.atlas.__main__ import main as atlas

    data = ["--checkpoint", checkpoint, "--data", exported, "--boxes", exported / "boxes.json", "--limit", 24]
    jsons = {
        "layer_importance": "layer_importance.json",
        "attention_distance": "attention_distance.json",
        "robustness": "robustness.json",
        "saliency": "localization.json",
    }
    results = {}
    for script, name in jsons.items():  # each script's fresh interpreter: make_all's (`gallery`), robustness's own
        run_here(f"{script}.py", "--quick", *data, "--out", tmp_path / script)
        results[script] = json.loads((tmp_path / script / name).read_text())
        made = results[script]["made_from"]
        assert "pico.safetensors" in made and f"data: ImageFolder {exported}/ (24 images" in made, script
        assert results[script]["skipped"] == ["Bag/broken.png"], script  # among the seeded stratified 24
    page = (tmp_path / "layer_importance" / "layer_importance.html").read_text()
    assert "made from: checkpoint pico.safetensors" in page and "data: ImageFolder" in page  # plotly escapes "/"
    assert results["saliency"]["images"] == 23 and results["robustness"]["images"].startswith("23 images of")
    out = tmp_path / "atlas"
    atlas_args = ["--knockouts", "--workers", "0", "--exemplars", "1", "--out", str(out)]
    assert atlas([*map(str, data), *atlas_args]) == 0
    summary = json.loads((out / "summary.json").read_text())
    li = results["layer_importance"]
    assert li["images"] == summary["images"] == 23
    for ours, theirs in zip(li["blocks"], summary["blocks"], strict=True):
        assert ours["knockout_delta_logit_mean"] == pytest.approx(theirs["logit_change_mean"], abs=1e-4)
    for ours, theirs in zip(li["heads"], summary["heads"], strict=True):
        assert (ours["layer"], ours["head"]) == (theirs["layer"], theirs["head"])
        assert ours["pointing"] == pytest.approx(theirs["pointing_mean"], abs=1e-6)  # a rate over 23 images, fp32
    distance = results["attention_distance"]["mean_distance"]
    assert np.allclose(distance, summary["sa_attention_distance"]["per_head_px"], atol=1e-4)
