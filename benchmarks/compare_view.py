"""Issue 56's goal for the app: the Compare tab's first view of an image (both models' top-5, every CA head of both
with their differences, DLA per head, the per-depth plot: `CompareTab.view`) within 2.2x one model's first view of
it (the page's handler: analysis, predictions, class-attention tiles: `ImageEvents.analyse_path`), both timed in
the same run on the app's quick lane, in process, interleaved (`cait/timing.py`).

    OMP_NUM_THREADS=1 python benchmarks/compare_view.py [--pairs cait_micro_136:cait_nano_28] [--repeats 9]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the page without a server (app_tabs)

from app import torch_thread  # noqa: E402
from app.loading import load_page_model  # noqa: E402
from app.models import ModelCache, ModelChoice  # noqa: E402
from app.shared import Look  # noqa: E402
from cait.timing import time_interleaved  # noqa: E402

GOAL = 2.2
LOOK = Look("inferno", 0.5, "per tile", "smooth", 1.0)


def ratio(a: str, b: str, *, repeats: int) -> dict[str, float]:
    """Seconds of one model's first view (model `a`) and of the Compare tab's view of `a` against `b`."""
    from app_tabs import page_under_test

    cache = ModelCache(load_page_model, max_bytes=2**31, device=torch.device("cpu"))
    page = torch_thread.call(page_under_test, cache, ModelChoice(a))
    tabs, choice = page.tabs, page.default
    path = cache.get(choice).examples[0][0]
    shown = tuple(page.p.ca_props.value)
    first = lambda: torch_thread.call(tabs.image.analyse_path, choice, path, LOOK, 1, shown, uploaded=False)  # noqa: E731
    a_seen = first()[page.p.analysis]
    chose = dict(choice=choice, analysis=a_seen, cmp_variant=b, cmp_checkpoint="")
    assert page.p.cmp_top5 in torch_thread.call(lambda: tabs.compare.choose(**chose))
    compare = lambda: torch_thread.call(tabs.compare.view, choice, a_seen)  # noqa: E731
    return time_interleaved({"one model": first, "compare": compare}, repeats=repeats, desc=f"{a} vs {b}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", nargs="+", default=["cait_nano_28:cait_micro_136", "cait_micro_136:cait_nano_28"])
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    for pair in args.pairs:
        a, b = pair.split(":")
        s = ratio(a, b, repeats=args.repeats)
        r = s["compare"] / s["one model"]
        verdict = "met" if r <= GOAL else "NOT met"
        print(f"{a} (page) vs {b}: one model's first view {s['one model'] * 1e3:.1f} ms, the Compare tab's view "
              f"{s['compare'] * 1e3:.1f} ms: {r:.2f}x (goal <= {GOAL}x: {verdict})")  # fmt: skip


if __name__ == "__main__":
    main()
