"""The head atlas (`python -m cait.atlas`) on exported scenes plus one broken file, against independent
references: a plain loop over the model's logits, `cait.explain` on maps computed here, the built-in scenes
path, a resumed run against an uninterrupted one, two torchrun processes against one."""

from __future__ import annotations

import csv
import html
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import PICO_SCENES, killed_after_first_shard

import cait
from cait import explain
from cait.atlas import compute
from cait.atlas.__main__ import main
from cait.corruptions import corrupt
from cait.data import read_images
from cait.explain.causal import block_gamma_mean_abs
from cait.explain.head_stats import attention_entropy, mean_attention_distances
from cait.figures.mechanisms import gap_too_small
from cait.preprocess import normalise

REPO = Path(__file__).resolve().parent.parent
SCENES = PICO_SCENES
PATCHING = "gaussian_noise:3"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, pico_scenes):
    """The shared random cait_pico_32 checkpoint and exported scenes (one broken file), and a full atlas."""
    root = tmp_path_factory.mktemp("atlas")
    checkpoint, scenes = pico_scenes
    model = cait.load_model(checkpoint=checkpoint).model.eval()
    (root / "pico.safetensors").symlink_to(checkpoint)
    args = [
        "--checkpoint",
        str(root / "pico.safetensors"),
        "--data",
        str(scenes),
        "--boxes",
        str(scenes / "boxes.json"),
    ]
    args += ["--knockouts", "--shard-size", "32", "--batch-size", "16", "--exemplars", "2", "--workers", "0"]
    args += ["--patching", PATCHING]
    assert main([*args, "--out", str(root / "full")]) == 0
    return dict(root=root, model=model, scenes=scenes, args=args, full=root / "full")


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def assert_same_files(a: Path, b: Path, tol: float) -> None:
    """images.csv, heads.csv and summary.json of two atlases agree: strings exactly, numbers to `tol`."""
    for name in ("images.csv", "heads.csv"):
        ra, rb = rows(a / name), rows(b / name)
        assert len(ra) == len(rb) and ra[0].keys() == rb[0].keys()
        for x, y in zip(ra, rb):
            for k in x:
                assert _close(x[k], y[k], tol), (name, k, x[k], y[k])
    assert _same_json(json.loads((a / "summary.json").read_text()), json.loads((b / "summary.json").read_text()), tol)


def _close(x: str, y: str, tol: float) -> bool:
    try:
        return math.isclose(float(x), float(y), rel_tol=tol, abs_tol=tol)
    except ValueError:
        return x == y


def _same_json(x, y, tol: float) -> bool:
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_same_json(x[k], y[k], tol) for k in x)
    if isinstance(x, list):
        return len(x) == len(y) and all(_same_json(u, v, tol) for u, v in zip(x, y))
    if isinstance(x, float):
        return math.isclose(x, y, rel_tol=tol, abs_tol=tol)
    return x == y


def test_top1_and_predictions_equal_a_plain_loop(setup):
    model, images = setup["model"], rows(setup["full"] / "images.csv")
    data = read_images(str(setup["scenes"]), model.cfg)
    expected = {}
    with torch.no_grad():
        for x, label, _, i, ok in data:
            if ok:
                logits = model(x[None])[0]
                expected[data.paths[i]] = (label, int(logits.argmax()), float(logits.softmax(-1).max()))
    assert [r["path"] for r in images] == [p for p in data.paths if p in expected]
    for r in images:  # classes by name
        label, prediction, probability = expected[r["path"]]
        assert (r["label"], r["prediction"]) == (data.classes[label], data.classes[prediction])
        assert float(r["probability"]) == pytest.approx(probability, abs=1e-5)
    summary = json.loads((setup["full"] / "summary.json").read_text())
    top1 = sum(label == pred for label, pred, _ in expected.values()) / len(expected)
    assert summary["top1"] == pytest.approx(top1) and summary["images"] == SCENES == len(images)
    assert summary["skipped"] == ["Bag/broken.png"]  # named, not a row


def test_head_numbers_equal_explain_on_maps_computed_here(setup):
    """Entropy, DLA, pointing and mass per head, and the knockouts, from cait.explain on one image at a time."""
    model, images = setup["model"], rows(setup["full"] / "images.csv")
    data = read_images(str(setup["scenes"]), model.cfg, boxes=setup["scenes"] / "boxes.json")
    by_path = {p: i for i, p in enumerate(data.paths)}
    img = model.cfg.img_size
    for r in images[:: len(images) // 12]:
        x, _, box, _, ok = data[by_path[r["path"]]]
        maps = explain.class_attention(model, x[None]).maps[0]  # [L, H, g, g]
        target = torch.tensor([data.classes.index(r["prediction"])])
        dla = explain.direct_logit_attribution(model, x[None], target).heads[0]
        knock = explain.knockout_profile(model, x[None], target, shared_prefix=False)[0]
        for l in range(maps.shape[0]):
            for h in range(maps.shape[1]):
                head = f"ca{l + 1}_head{h + 1}"
                heat = maps[l, h][None]
                assert float(r[f"{head}_pointing"]) == float(explain.pointing_game(heat, box[None], img)[0])
                assert float(r[f"{head}_mass_in_box"]) == pytest.approx(
                    float(explain.mass_in_box(heat, box[None], img)[0]), abs=1e-5
                )
                assert float(r[f"{head}_entropy"]) == pytest.approx(float(attention_entropy(heat)[0]), abs=1e-5)
                assert float(r[f"{head}_dla"]) == pytest.approx(float(dla[l, h]), abs=1e-5)
        blocks = explain.causal.block_names(model)
        names = [n.replace("blocks_token_only.", "ca").replace("blocks.", "sa") for n in blocks]
        for k, name in enumerate(names):
            label = name[:2] + str(int(name[2:]) + 1)
            assert float(r[f"knockout_{label}"]) == pytest.approx(float(knock[k]), abs=1e-4)


def test_batch_knockouts_reuse_the_passes_sa_states_and_equal_knockout_profile(setup):
    """The knockouts of a batch equal `explain.knockout_profile` on it bit for bit, and the first SA block runs
    only in the batch's one pass (the knockouts re-use its SA states instead of a forward of their own; the
    distances are kept layer by layer in that same pass)."""
    model = setup["model"]
    data = read_images(str(setup["scenes"]), model.cfg, boxes=setup["scenes"] / "boxes.json")
    x, _, boxes, _, _ = next(iter(torch.utils.data.DataLoader(data, batch_size=12)))
    calls = []
    hook = model.blocks[0].register_forward_pre_hook(lambda module, args: calls.append(args[0].shape[0]))
    try:
        out = compute.batch_numbers(model, x, boxes, knockouts=True, dtype=None)
    finally:
        hook.remove()
    assert calls == [12]
    expected = explain.knockout_profile(model, x, torch.from_numpy(out["prediction"])).float().numpy()
    assert np.array_equal(out["knockout"], expected)


def test_patching_equals_explain_on_corrupted_images_made_here(setup):
    """Per image, activation patching of its predicted class into its corrupted twin (the corruption's draws
    seeded by the image's index); over the images, each component's share of the gap and its interval."""
    model, images = setup["model"], rows(setup["full"] / "images.csv")
    data = read_images(str(setup["scenes"]), model.cfg, normalise=False)
    by_path = {p: i for i, p in enumerate(data.paths)}
    labels = [n.replace("blocks_token_only.", "ca").replace("blocks.", "sa") for n in explain.causal.block_names(model)]
    labels = [name[:2] + str(int(name[2:]) + 1) for name in labels]
    for r in images[:: len(images) // 8]:
        i = by_path[r["path"]]
        pixels = data[i][0][None]
        broken = corrupt(pixels, "gaussian_noise", 3, generator=torch.Generator().manual_seed(i))
        clean, corrupted = normalise(pixels, model.cfg), normalise(broken, model.cfg)
        target = torch.tensor([data.classes.index(r["prediction"])])
        block = explain.activation_patching(model, clean, corrupted, target)
        head = explain.activation_patching(model, clean, corrupted, target, granularity="head")
        assert float(r["patching_gap"]) == pytest.approx(float(block.gap[0]), abs=1e-4)
        for k, label in enumerate(labels):
            assert float(r[f"patching_{label}_attention"]) == pytest.approx(float(block.branches[0, k, 0]), abs=1e-4)
            assert float(r[f"patching_{label}_mlp"]) == pytest.approx(float(block.branches[0, k, 1]), abs=1e-4)
        assert float(r["patching_ca1_class_token"]) == pytest.approx(float(block.class_token[0, 0]), abs=1e-4)
        assert float(r["patching_ca2_head2"]) == pytest.approx(float(head.heads[0, 1, 1]), abs=1e-4)
    summary = json.loads((setup["full"] / "summary.json").read_text())["patching"]
    assert (summary["corruption"], summary["severity"]) == ("gaussian_noise", 3)
    gap = [float(r["patching_gap"]) for r in images]
    for entry, label in zip(summary["blocks"], labels):
        for part, column in (("attention", "attention"), ("MLP", "mlp"), ("class_token", "class_token")):
            if part == "class_token" and label != "ca1":  # only CA blocks but the last have one
                assert part not in entry
                continue
            values = [float(r[f"patching_{label}_{column}"]) for r in images]
            got = entry[part]
            assert got["restored"] == pytest.approx(sum(values) / sum(gap), rel=1e-5, abs=1e-6)
            assert got["delta_logit_mean"] == pytest.approx(sum(values) / len(values), abs=1e-6)
            low, high = got["restored_ci95"]
            assert low <= got["restored"] <= high
    heads = {(h["layer"], h["head"]): h for h in summary["heads"]}
    values = [float(r["patching_ca1_head2"]) for r in images]
    assert heads[1, 2]["restored"] == pytest.approx(sum(values) / sum(gap), rel=1e-5, abs=1e-6)
    # the interval of a ratio of means by the delta method, from numpy's covariance of the CSV's columns
    a, g = np.array(values), np.array(gap)
    cov, share = np.cov(a, g), a.mean() / g.mean()
    half = 1.959963984540054 * np.sqrt((cov[0, 0] - 2 * share * cov[0, 1] + share**2 * cov[1, 1]) / len(a)) / g.mean()
    assert heads[1, 2]["restored_ci95"] == pytest.approx([share - half, share + half], rel=1e-4, abs=1e-6)
    table = {r["head"]: r for r in rows(setup["full"] / "heads.csv")}
    assert float(table["ca1_head2"]["patching_restored"]) == pytest.approx(heads[1, 2]["restored"], rel=1e-6)
    # one name per number: heads.csv's patching columns are summary.json's names after "patching_"
    for name in ("delta_logit_mean", "restored"):
        assert float(table["ca1_head2"][f"patching_{name}"]) == pytest.approx(heads[1, 2][name], rel=1e-6)
    for name in ("delta_logit_ci95", "restored_ci95"):
        low, high = (float(table["ca1_head2"][f"patching_{name}_{end}"]) for end in ("low", "high"))
        assert [low, high] == pytest.approx(heads[1, 2][name], rel=1e-6)


def test_no_patching_number_is_true_by_construction(setup):
    """The whole stream after an SA block (or the last CA block's class token) restores the gap by definition:
    no column or summary entry reports it, and no patching column equals the gap on every image."""
    images = rows(setup["full"] / "images.csv")
    columns = [c for c in images[0] if c.startswith("patching_") and c != "patching_gap"]
    assert not [c for c in columns if "stream" in c]
    for column in columns:
        same = [abs(float(r[column]) - float(r["patching_gap"])) < 1e-6 for r in images if r[column]]
        assert not all(same), f"{column} equals the gap on every image"
    summary = json.loads((setup["full"] / "summary.json").read_text())["patching"]
    assert all("stream" not in b for b in summary["blocks"]) and "orientation" in summary["whole_stream"]
    page = (setup["full"] / "atlas.html").read_text()
    assert "stream patched" not in page.replace("whole stream patched", "") and "by construction (orientation)" in page


def test_token_patching_columns_equal_explain_and_the_box(setup):
    """Per image: the best patch's restored logit, the three best together, and the share of the best patch's
    pixels inside the image's box (from boxes.json, by hand); over the images, their means in summary.json."""
    model, images = setup["model"], rows(setup["full"] / "images.csv")
    data = read_images(str(setup["scenes"]), model.cfg, boxes=str(setup["scenes"] / "boxes.json"), normalise=False)
    by_path, p, g = {q: i for i, q in enumerate(data.paths)}, model.cfg.patch_size, model.cfg.grid_size
    inside_box = []
    for r in images:
        i = by_path[r["path"]]
        pixels, _, box, _, _ = data[i]
        broken = corrupt(pixels[None], "gaussian_noise", 3, generator=torch.Generator().manual_seed(i))
        clean, corrupted = normalise(pixels[None], model.cfg), normalise(broken, model.cfg)
        target = torch.tensor([data.classes.index(r["prediction"])])  # images.csv names classes
        tokens = explain.token_patching(model, clean, corrupted, target, direction="restore", top=3)
        best = int(tokens.restored.flatten().argmax())
        assert float(r["patching_tokens_best"]) == pytest.approx(float(tokens.restored.max()), abs=1e-4)
        assert float(r["patching_tokens_top3"]) == pytest.approx(float(tokens.top_restored[0]), abs=1e-4)
        x0, y0 = (best % g) * p, (best // g) * p
        wide = max(0.0, min(x0 + p, float(box[2])) - max(x0, float(box[0])))
        high = max(0.0, min(y0 + p, float(box[3])) - max(y0, float(box[1])))
        assert float(r["patching_tokens_best_in_box"]) == pytest.approx(wide * high / p**2, abs=1e-5)
        inside_box.append(wide * high / p**2)
        if len(inside_box) == 6:
            break
    tokens = json.loads((setup["full"] / "summary.json").read_text())["patching"]["tokens"]
    assert (tokens["region_patches"], tokens["top"]) == (1, 3)
    gap = sum(float(r["patching_gap"]) for r in images)
    top = sum(float(r["patching_tokens_top3"]) for r in images)
    assert tokens["top_together"]["restored"] == pytest.approx(top / gap, rel=1e-5)
    share = [float(r["patching_tokens_best_in_box"]) for r in images]
    assert tokens["best_in_box"]["mean"] == pytest.approx(sum(share) / len(share), abs=1e-6)
    assert tokens["best_in_box"]["images"] == len(images)


def test_summary_means_and_distances(setup):
    model, images = setup["model"], rows(setup["full"] / "images.csv")
    summary = json.loads((setup["full"] / "summary.json").read_text())
    head = summary["heads"][1]
    assert (head["layer"], head["head"]) == (1, 2)
    mean = sum(float(r["ca1_head2_dla"]) for r in images) / len(images)
    assert head["dla_mean"] == pytest.approx(mean, abs=1e-6)
    assert head["pointing_mean"] == pytest.approx(sum(float(r["ca1_head2_pointing"]) for r in images) / len(images))
    table = {r["head"]: r for r in rows(setup["full"] / "heads.csv")}["ca1_head2"]
    for key, value in head.items():  # one name per number: heads.csv names every mean as summary.json does
        if key.endswith("_mean"):
            assert float(table[key]) == pytest.approx(value, rel=1e-9), key
    assert len(head["exemplars"]["writes"]) == 2
    top = max(images, key=lambda r: float(r["ca1_head2_dla"]))
    assert head["exemplars"]["writes"][0]["path"] == top["path"]
    data = read_images(str(setup["scenes"]), model.cfg)
    x = torch.stack([item[0] for item in data if item[4]])
    with torch.inference_mode():
        each = mean_attention_distances(model, x)  # [images, D, H], from its own passes
    per_head = torch.tensor(summary["sa_attention_distance"]["per_head_px"])
    torch.testing.assert_close(per_head, each.mean(0), atol=1e-4, rtol=0)
    uniform = explain.head_stats.patch_distances(model.cfg.grid_size, model.cfg.patch_size).mean().item()
    assert summary["sa_attention_distance"]["uniform_px"] == pytest.approx(uniform)
    blocks = summary["blocks"]
    assert [b["name"] for b in blocks] == explain.causal.block_names(model)
    gamma = block_gamma_mean_abs(model)
    assert [b["gamma_mean_abs"] for b in blocks] == pytest.approx(gamma.tolist())


def test_a_resumed_run_after_a_kill_equals_a_full_run(setup):
    out = setup["root"] / "killed"
    command = [sys.executable, "-m", "cait.atlas", *setup["args"], "--out", str(out)]
    before = killed_after_first_shard(command, out, cwd=REPO, env=ENV)
    assert 1 <= len(before) < 5 and not (out / "summary.json").exists()
    # the same arguments continue; --stop-after stops once more, between two shards (a shard that skipped the
    # broken file is retried: it is among the shards to do again)
    assert main([*setup["args"], "--out", str(out), "--stop-after", "1"]) == 0
    after = {p.name: p.stat().st_mtime_ns for p in (out / "shards").glob("*.npz")}
    assert len([name for name, t in after.items() if before.get(name) != t]) == 1
    assert (out / "summary.json").exists() == (len(after) == 5)
    assert main([*setup["args"], "--out", str(out)]) == 0
    assert_same_files(out, setup["full"], 1e-6)


def test_two_torchrun_processes_equal_one(setup):
    out = setup["root"] / "ranks"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "cait.atlas", *setup["args"], "--out", str(out)]
    proc = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the 151 images' 10 batches of 16 split 5/5 over the ranks, each in shards of at most 32
    names = ["0000000-0000032", "0000032-0000064", "0000064-0000080", "0000080-0000112", "0000112-0000144"]
    names.append("0000144-0000151")
    assert sorted(p.name for p in (out / "shards").glob("*.npz")) == [f"shard-{n}.npz" for n in names]
    assert "151 images to do over 2 processes (rank 0: 80 images in 3 shard(s), rank 1: 71 images in 3 shard(s))" in (
        proc.stderr
    )
    assert_same_files(out, setup["full"], 0)  # the same bits: sums in image order, whatever the shards


def test_the_same_command_twice_writes_the_same_bytes(setup):
    """The page too: its figures' div ids come from the figures, not from plotly's random uuids."""
    again = setup["root"] / "again"
    assert main([*setup["args"], "--out", str(again)]) == 0
    for name in ("atlas.html", "images.csv", "heads.csv", "summary.json"):
        assert (again / name).read_bytes() == (setup["full"] / name).read_bytes(), name
    page = (again / "atlas.html").read_text()
    ids = re.findall(r'<div id="([^"]+)" class="plotly-graph-div"', page)
    assert len(ids) >= 4 and len(set(ids)) == len(ids) and "figure-0-per-head-map-entropy-nats" in ids


def test_the_merge_phase_has_a_named_progress_bar(setup, capsys):
    """The last phase, merging the shards into the atlas's files, says what it is on stderr (and so in the app's
    progress, which follows tqdm), not a bare time: a finished atlas run again goes straight to it."""
    again = setup["root"] / "merged_again"
    shutil.copytree(setup["full"], again)
    capsys.readouterr()
    assert main([*setup["args"], "--out", str(again)]) == 0
    err = capsys.readouterr().err.replace("\r", "\n")
    assert re.search(r"^atlas: merging the shards into its files: 100%.* 5/5 ", err, re.M), err


def test_page_is_self_contained_and_names_data_and_model(setup):
    page = (setup["full"] / "atlas.html").read_text()
    summary = json.loads((setup["full"] / "summary.json").read_text())
    assert re.search(r"<script[^>]*\bsrc\s*=", page) is None  # plotly.js inline, no script from the web
    assert re.search(r"<(img|link)[^>]*(src|href)\s*=\s*[\"']https?:", page) is None
    assert html.escape(summary["data"]) in page and html.escape(summary["model"]) in page
    assert page.count("data:image/jpeg;base64,") == 2 * 2 * len(summary["heads"])  # k=2, two kinds per head
    assert "Knockout profile" in page and "uniform attention" in page
    assert "Activation patching under gaussian_noise at severity 3" in page
    gap = summary["patching"]["gap"]["mean"]
    if gap_too_small(gap):  # the heads' grid gives Δlogits and says why there are no shares
        assert f"mean Δlogit (no shares: the mean gap, {gap:.2f} logits, is too small for them)" in page
        assert "share of the mean gap, 95% interval" not in page
    else:  # the heads' grid gives each its interval
        assert "mean Δlogit (share of the mean gap, 95% interval)" in page
        for head in summary["patching"]["heads"]:
            low, high = head["restored_ci95"]
            assert f"\\u003cbr\\u003e[{low:.0%}, {high:.0%}]" in page  # written under the head's share of the gap


def test_parquet_round_trip(setup):
    import pyarrow.parquet as pq

    for name in ("images", "heads"):
        table = pq.read_table(setup["full"] / f"{name}.parquet").to_pylist()
        text = rows(setup["full"] / f"{name}.csv")
        assert len(table) == len(text) and list(table[0]) == list(text[0])
        for got, want in zip(table, text):
            for k, v in got.items():
                if isinstance(v, bool):
                    assert str(v) == want[k]
                elif v is None:
                    assert want[k] == ""  # no box, no label: empty in the CSV, null in parquet
                else:
                    assert _close(str(v), want[k], 1e-12), (name, k)
    assert pq.read_schema(setup["full"] / "images.parquet").field("correct").type == "bool"


def test_bad_input_is_one_line_and_exit_code_2(setup, capsys):
    assert main(["--checkpoint", str(setup["root"] / "pico.safetensors"), "--data", "/no/such/dir", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not Path("x").exists()  # bad input makes no output folder
    # other arguments into an existing atlas: refused, nothing overwritten
    before = (setup["full"] / "images.csv").read_bytes()
    assert main([*setup["args"], "--limit", "50", "--out", str(setup["full"])]) == 2
    err = capsys.readouterr().err
    assert "--limit None there, 50 here" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exit_code:  # a corruption without a severity: argparse's one line
        main([*setup["args"][:-1], "gaussian_noise", "--out", str(setup["root"] / "bad")])
    assert exit_code.value.code == 2 and "--patching: give one corruption as NAME:SEVERITY" in capsys.readouterr().err
    assert (setup["full"] / "images.csv").read_bytes() == before


def test_exported_scenes_give_the_scenes_own_numbers(setup):
    """The folder written by cait.data.export, read with its COCO boxes, against the built-in scenes path."""
    out = setup["root"] / "built_in"
    args = ["--checkpoint", str(setup["root"] / "pico.safetensors"), "--data", "fashion-mnist-scenes"]
    assert main([*args, "--limit", str(SCENES), "--batch-size", "16", "--workers", "0", "--out", str(out)]) == 0
    folder = {Path(r["path"]).stem: r for r in rows(setup["full"] / "images.csv")}
    scenes = {r["path"].rsplit("/", 1)[1]: r for r in rows(out / "images.csv")}
    assert len(scenes) == SCENES and {f"{int(k):05d}" for k in scenes} == set(folder)
    for index, r in scenes.items():
        twin = folder[f"{int(index):05d}"]
        for column in r:
            if column.endswith(("_pointing", "_mass_in_box", "_entropy", "_dla")) or column in ("label", "prediction"):
                assert _close(r[column], twin[column], 1e-4), (index, column, r[column], twin[column])


def test_the_library_entry_with_options_writes_the_command_lines_files(setup):
    """`cait.atlas.run.run(AtlasOptions(...))`, built in Python, makes the atlas the command line made, bit for
    bit, and records the same arguments (so either continues the other)."""
    from cait.atlas.options import AtlasOptions
    from cait.atlas.run import run
    from cait.atlas.shards import ARGS_FILE

    out = setup["root"] / "options"
    scenes, weights = setup["scenes"], setup["root"] / "pico.safetensors"
    options = AtlasOptions(out=out, data=str(scenes), checkpoint=str(weights), boxes=str(scenes / "boxes.json"))
    more = dict(knockouts=True, shard_size=32, batch_size=16, exemplars=2, workers=0, patching=("gaussian_noise", 3))
    assert run(AtlasOptions(**{**options.__dict__, **more})) == out
    for name in ("atlas.html", "images.csv", "heads.csv", "summary.json", ARGS_FILE):
        assert (out / name).read_bytes() == (setup["full"] / name).read_bytes(), name
