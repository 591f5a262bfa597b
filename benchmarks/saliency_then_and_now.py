"""The Saliency tab's work now against the app as it was when issue 15 was filed ("52 s here today").

Issue 15 asks that all saliency methods on cait_xxs24_224 run at least 2x faster than then. This script
checks out that commit (default 86d590f, the last before the issue's work) into a temporary git worktree and
times, each in its own process, alternating rounds:

  then: every method of that commit's `cait.explain.METHODS` (nine), each map followed by its
        deletion/insertion scoring, as its tab ran them (`app.main.heat_for`, `explain.deletion_insertion`);
  now:  every method of today's tab (ten), `app.session.saliency_rows` in the app's --precision.

Both on the same image (scikit-image's chelsea), with seed-0 random weights (speed does not depend on them),
after one warm-up map each. Medians.

    python benchmarks/saliency_then_and_now.py [--then 86d590f] [--rounds 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

from cait.flags import add_precision_flag, add_threads_flag
from cait.runtime import choose_precision

REPO = Path(__file__).resolve().parents[1]
MODEL = "cait_xxs24_224"

THEN = """
import json, time, torch
from app.main import analyse, heat_for, load_model
from cait import explain
loaded = load_model("{model}", None, torch.device("cpu"))
a = analyse(loaded, "{image}")
heat_for(loaded, a.x, 0, "saliency", 32)  # warm-up
target = int(a.probs.argmax())
x, t = a.x, torch.tensor([target])
start = time.perf_counter()
for method in explain.METHODS:
    heat = heat_for(loaded, a.x, target, method, 32)
    with torch.inference_mode():
        explain.deletion_insertion(loaded.model, x, t, heat[None])
print(json.dumps({{"seconds": time.perf_counter() - start, "methods": len(explain.METHODS)}}))
"""

NOW = """
import json, time, torch
from app.loading import load_page_model
from app.models import ModelChoice
from app.session import analyse, saliency_rows
from cait import explain
from cait.runtime import inference_dtype
cpu = torch.device("cpu")
loaded = load_page_model(ModelChoice("{model}", random_init=True), cpu, inference_dtype("{precision}", cpu))
a = analyse(loaded, "{image}")
list(saliency_rows(loaded, a, target=0, methods=["saliency"], options=explain.MethodOptions()))  # warm-up
methods = list(explain.METHODS)
start = time.perf_counter()
list(saliency_rows(loaded, a, target=a.top_class, methods=methods, options=explain.MethodOptions()))
print(json.dumps({{"seconds": time.perf_counter() - start, "methods": len(methods)}}))
"""


def run(code: str, root: Path, threads: int) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "OMP_NUM_THREADS": str(threads),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        "PYTHONWARNINGS": "ignore",
    }
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the run in {root} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--then", default="86d590f", help="commit of the app to compare with")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of then and now")
    add_threads_flag(parser, default=1, help="torch threads of each run (1 on a shared machine)")
    add_precision_flag(parser, help="today's app --precision (decided here once, the same for every run)")
    args = parser.parse_args()
    precision = choose_precision(args.precision, torch.device("cpu"), remeasure=args.remeasure_precision)
    from PIL import Image
    from skimage import data

    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "chelsea.png"
        Image.fromarray(data.chelsea()).save(image)
        old = Path(tmp) / "then"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(old), args.then], check=True)
        try:
            codes = {
                "then": (THEN.format(model=MODEL, image=image), old),
                "now": (NOW.format(model=MODEL, image=image, precision=precision.name), REPO),
            }
            seconds: dict[str, list[float]] = {"then": [], "now": []}
            for r in tqdm(range(args.rounds), desc="rounds (then, now)"):
                for name in ("then", "now") if r % 2 == 0 else ("now", "then"):
                    result = run(*codes[name], args.threads)
                    seconds[name].append(result["seconds"])
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], check=False)
    then, now = statistics.median(seconds["then"]), statistics.median(seconds["now"])
    print(f"{MODEL}, {args.threads} torch thread(s), load average {os.getloadavg()[0]:.1f}")
    print(
        f"then ({args.then}, 9 methods): {then:.1f} s   now (10 methods, {precision.name}, {precision.decided}): "
        f"{now:.1f} s"
    )
    print(f"goal: at least 2x faster than then: {then / now:.2f}x, {'met' if then / now >= 2 else 'NOT met'}")


if __name__ == "__main__":
    main()
