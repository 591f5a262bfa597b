"""analysis/attention_distance.py run as a user would (a subprocess in --quick mode on a tiny random model),
its numbers checked against cait.explain on the same images."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from conftest import randomise_
from PIL import Image

import cait
from cait import explain
from cait.explain.head_stats import mean_attention_distances
from cait.preprocess import model_view, to_batch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "cait" / "examples").glob("scene_*.png"))[:2]


def test_attention_distance_script_writes_the_models_own_distances(tmp_path):
    torch.manual_seed(0)
    model = randomise_(cait.load_model("cait_pico_32", weights=False).model)
    path = tmp_path / "pico.safetensors"
    cait.save_weights(model, path)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(ROOT / "analysis" / "attention_distance.py"), "--quick", "--checkpoint", str(path)]
        + ["--images", *map(str, EXAMPLES), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # the checkout under test, whatever is installed
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "attention_distance.png").stat().st_size > 0 and "plotly" in (
        out / "attention_distance.html"
    ).read_text()
    data = json.loads((out / "attention_distance.json").read_text())
    x = to_batch([model_view(Image.open(p).convert("RGB"), model.cfg).convert("RGB") for p in EXAMPLES], model.cfg)
    with torch.inference_mode():
        want = mean_attention_distances(model.eval(), x).mean(0)
    np.testing.assert_allclose(data["mean_distance"], want.numpy(), rtol=1e-4)
    assert np.array(data["mean_distance"]).shape == (model.cfg.depth, model.cfg.num_heads)
    uniform = explain.head_stats.patch_distances(model.cfg.grid_size, model.cfg.patch_size).mean().item()
    assert abs(data["uniform_attention_px"] - uniform) < 1e-4
