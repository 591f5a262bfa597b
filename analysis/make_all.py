"""Regenerate every analysis figure that needs no retraining into one folder, with an index.html gallery.

    python analysis/make_all.py [--checkpoint FILE] [--metrics runs/x/metrics.jsonl] [--out out/all]
    python analysis/make_all.py --model cait_s24_224 --pretrained --out out/s24   # official ImageNet weights

Runs model_table, layerscale_stats, attention_maps, saliency, attention_distance, layer_importance,
mechanisms, residual_ratio (from the shipped miniature run pair, when present) and throughput (not in --quick: it has no
quick mode and takes minutes), each into its own sub-folder, copies the shipped results of the miniature
retrainings (depth_stability, class_attention_ablation in analysis/data/) beside them, then writes
OUT/index.html linking every PNG, HTML and data file (relative links, so the folder can be moved or zipped).
"""

from __future__ import annotations

import html
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import attention_distance
import attention_maps
import layer_importance
import layerscale_stats
import mechanisms
import model_table
import residual_ratio
import saliency
from _common import REPO, out_dir, parser

TITLES = {
    "model_table": "The paper's model table from our architecture",
    "layerscale_stats": "LayerScale weights per depth",
    "attention_maps": "Class-attention maps per layer and head (paper Fig. 6)",
    "saliency": "Regions of focus and localization (paper Fig. 7)",
    "attention_distance": "Mean attention distance per SA head against depth (as in the ViT paper)",
    "layer_importance": "What matters for the prediction: block knockouts vs LayerScale, heads' logit attribution",
    "mechanisms": "Where the answer forms (logit lens) and what carries it (activation patching under a corruption)",
    "residual_ratio": "Residual-branch ratios with and without LayerScale (paper Fig. 4, miniature)",
    "throughput": "Inference throughput on this machine",
    "depth_stability": "Depth stability by residual weighting (paper Table 1, miniature retraining, shipped results)",
    "class_attention_ablation": "Where the class token enters (paper Table 2, miniature retraining, shipped results)",
}
SHIPPED_RESULTS = REPO / "analysis" / "data"  # sweeps too long to redo here: their committed figures and numbers


def jobs(args) -> dict[str, list[str] | None]:
    """script -> its arguments (None: skipped, with the reason printed)."""
    model = (
        (["--checkpoint", args.checkpoint] if args.checkpoint else [])
        + (["--model", args.model] if args.model else [])
        + (["--pretrained"] if args.pretrained else [])
        + (["--random-init"] if args.random_init else [])
    )
    quick = ["--quick"] if args.quick else []
    # --precision goes to the scripts that draw forward passes; the others run in fp32 and do not take it
    drawn = ["--precision", args.precision] + (["--remeasure-precision"] if args.remeasure_precision else [])
    plan = {
        "model_table": quick,
        "layerscale_stats": model + quick + (["--metrics", str(args.metrics)] if args.metrics else []),
        "attention_maps": model + drawn + quick,
        "saliency": model + drawn + quick,
        "attention_distance": model + drawn + quick,
        "layer_importance": model + quick,
        "mechanisms": model + quick,
        "residual_ratio": quick if (residual_ratio.SHIPPED / "none" / "metrics.jsonl").is_file() else None,
        "throughput": None if args.quick else [],
    }
    return plan


def run(name: str, argv: list[str], out: Path) -> str | None:
    """Run one script into out/name; returns an error line or None."""
    argv = argv + ["--out", str(out / name)]
    print(f"== {name} {' '.join(argv)}", flush=True)
    if name == "throughput":  # not ours to import: run it as its own process
        done = subprocess.run([sys.executable, str(REPO / "analysis" / "throughput.py"), *argv], cwd=REPO)
        return None if done.returncode == 0 else f"exit {done.returncode}"
    module = {
        "model_table": model_table,
        "layerscale_stats": layerscale_stats,
        "attention_maps": attention_maps,
        "saliency": saliency,
        "attention_distance": attention_distance,
        "layer_importance": layer_importance,
        "mechanisms": mechanisms,
        "residual_ratio": residual_ratio,
    }[name]
    try:
        module.main(argv)
    except SystemExit as e:  # a script's own clean failure (bad input): keep going with the others
        return f"exit {e.code}"
    return None


def _made_from(folder: Path) -> str:
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "made_from" in data:
            return data["made_from"]
    return ""


def gallery(out: Path, results: dict[str, str | None]) -> Path:
    """index.html: for each script, its PNGs (each linking its interactive HTML when there is one) and
    its data files, all by relative links."""
    parts = [
        "<!doctype html><meta charset='utf-8'><title>CaiT analysis</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}img{max-width:100%;border:1px solid #ccc}"
        ".src{color:#555;font-size:90%}.fail{color:#b00}</style>",
        f"<h1>CaiT analysis figures</h1><p class=src>generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        f" by analysis/make_all.py. Every figure states what it was made from.</p>",
    ]
    for name, error in results.items():
        parts.append(f"<h2 id='{name}'>{html.escape(TITLES[name])}</h2>")
        if error:
            parts.append(f"<p class=fail>{html.escape(error)}</p>")
            continue
        folder = out / name
        made = _made_from(folder)
        if made:
            parts.append(f"<p class=src>made from: {html.escape(made)}</p>")
        pages = {p.stem: p for p in folder.glob("*.html")}
        for png in sorted(folder.glob("*.png")):
            rel = f"{name}/{png.name}"
            page = pages.get(png.stem) or (pages.get("attention_maps") if png.stem.startswith("attention_") else None)
            img = f"<img src='{html.escape(rel)}' alt='{html.escape(png.stem)}' loading=lazy>"
            parts.append(
                f"<p><a href='{html.escape(f'{name}/{page.name}')}'>{img}</a></p>" if page else f"<p>{img}</p>"
            )
        files = sorted(p for p in folder.iterdir() if p.suffix in (".html", ".csv", ".json"))
        parts.append(
            "<p>files: "
            + ", ".join(f"<a href='{html.escape(f'{name}/{p.name}')}'>{html.escape(p.name)}</a>" for p in files)
            + "</p>"
        )
    index = out / "index.html"
    index.write_text("\n".join(parts))
    return index


def main(argv: list[str] | None = None) -> int:
    p = parser("make_all", __doc__, out="all")
    p.add_argument("--metrics", type=Path, default=None, help="a training run's metrics.jsonl for layerscale_stats")
    args = p.parse_args(argv)
    out = out_dir(args.out)
    results: dict[str, str | None] = {}
    for name, script_args in jobs(args).items():
        if script_args is None:
            why = (
                "no shipped run pair in analysis/data/residual_ratio"
                if name == "residual_ratio"
                else "skipped in --quick"
            )
            print(f"== {name}: {why}")
            continue
        results[name] = run(name, script_args, out)
    for name in ("depth_stability", "class_attention_ablation"):
        if (SHIPPED_RESULTS / name / f"{name}.json").is_file():
            shutil.copytree(SHIPPED_RESULTS / name, out / name, dirs_exist_ok=True)
            results[name] = None
        else:
            print(f"== {name}: no shipped results in {SHIPPED_RESULTS / name} (run analysis/{name}.py)")
    index = gallery(out, results)
    failed = [n for n, e in results.items() if e]
    print(
        f"gallery: {index} ({len(results) - len(failed)} of {len(results)} scripts ok"
        f"{'; failed: ' + ', '.join(failed) if failed else ''})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
