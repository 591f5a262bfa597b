"""analysis/throughput.py runs end to end on a tiny model and reports what it measured."""

import csv
import subprocess
import sys
from pathlib import Path

import cait

ROOT = Path(__file__).resolve().parents[1]


def test_throughput_script_writes_ratios(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "analysis" / "throughput.py"),
            "--models",
            "cait_pico_32",
            "--batch-sizes",
            "1",
            "2",
            "--repeats",
            "1",
            "--warmup",
            "1",
            "--min-seconds",
            "0",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    rows = list(csv.DictReader((tmp_path / "throughput.csv").open()))
    assert [(r["model"], r["batch"]) for r in rows] == [("cait_pico_32", "1"), ("cait_pico_32", "2")]
    flops = cait.load_model("cait_pico_32", weights=False).model.flops() / 1e9
    for r in rows:
        assert abs(float(r["gflops_per_image"]) - flops) < 5e-4
        ratio = float(r["ours_img_s"]) / float(r["timm_img_s"])
        assert abs(ratio - float(r["speed_ratio_ours_over_timm"])) < 0.01 * ratio + 1e-3
        assert float(r["insights_cost_over_forward"]) > 0
    for name in ("throughput.json", "throughput.html", "throughput.png"):
        assert (tmp_path / name).stat().st_size > 0
