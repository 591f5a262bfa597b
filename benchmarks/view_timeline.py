"""Where the class-attention view's time goes: one example click in the real app, split into its phases.

app_latency.py measures the view as a whole (click to every tile rendered) against one plain forward; this
script says which part of it is the model and which is Gradio and the browser. Server and browser share
the machine's clock (performance.timeOrigin + now() against time.time()), so each phase is timed in one run:

  request     click -> the queue/join request has left the browser (Gradio's client-side event handling)
  to handler  -> the app's handler starts (Gradio's queue, pre-processing, the hop to the torch thread)
  analyse     session.analyse: decode, preprocess, the one insight forward pass
  outputs     the rest of the handler: tiles drawn and encoded, the outputs assembled
  to browser  -> every tile rendered (Gradio's post-processing, the message, the page's update, tile fetches)

Each phase is printed in ms and as a multiple of one plain fp32 forward timed on the quiet page, as
app_latency.py times it (medians over rounds; the first round warms up).

    python benchmarks/view_timeline.py [--model cait_xxs24_224] [--repeats 9]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import torch  # noqa: E402

# run as a script: benchmarks/ is on the path
from app_latency import CPU, EXAMPLES_READY, browser_rounds, click_example, free_port  # noqa: E402

from app import session, torch_thread, ui  # noqa: E402
from app.loading import load_page_model  # noqa: E402
from app.models import ModelCache, ModelChoice  # noqa: E402
from app.ui import build_app, launch  # noqa: E402
from cait.flags import add_precision_flag  # noqa: E402
from cait.runtime import choose_precision  # noqa: E402

PHASES = ("request", "to handler", "analyse", "outputs", "to browser")


def stamped(fn, stamps: dict[str, float], name: str):
    """fn, recording the epoch ms at which its last call started and ended (signature kept for Gradio)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        stamps[name + ">"] = time.time() * 1e3
        try:
            return fn(*args, **kwargs)
        finally:
            stamps[name + "<"] = time.time() * 1e3

    return run


def phases(browser: dict, stamps: dict[str, float]) -> dict[str, float]:
    return dict(
        zip(
            PHASES,
            (
                browser["sent"] - browser["start"],
                stamps["handler>"] - browser["sent"],
                stamps["analyse<"] - stamps["analyse>"],
                stamps["handler<"] - stamps["analyse<"],
                browser["end"] - stamps["handler<"],
            ),
        )
    )


def measure(name: str, dtype: torch.dtype | None, repeats: int) -> tuple[dict[str, list[float]], list[float]]:
    cache = ModelCache(load_page_model, max_bytes=2**34, device=CPU, dtype=dtype)
    choice = ModelChoice(name, random_init=True)  # timing: random weights serve where none are cached
    loaded = torch_thread.call(cache.get, choice)
    x = torch_thread.call(session.analyse, loaded, loaded.examples[0][0]).x
    stamps: dict[str, float] = {}
    ui.ImageEvents.analyse_path = stamped(ui.ImageEvents.analyse_path, stamps, "handler")
    session.analyse = stamped(session.analyse, stamps, "analyse")  # handlers call it through the module

    def plain_forward() -> None:
        with torch.inference_mode():
            loaded.model(x)

    demo, port = build_app(cache, choice), free_port()
    launch(demo, port=port, block=False)
    try:
        # a round's phases are read off the server's stamps as soon as the tiles are shown, while the stamps
        # are still the click's own (the follow-up runs handlers too)
        split, forwards = browser_rounds(
            f"http://127.0.0.1:{port}/",
            EXAMPLES_READY,
            lambda page, r: click_example(page, r, read=lambda clicked: phases(clicked, stamps)),
            functools.partial(torch_thread.call, plain_forward),
            repeats,
        )
    finally:
        demo.close()
    return {phase: [row[phase] for row in split] for phase in PHASES}, [1e3 * f for f in forwards]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cait_xxs24_224")
    add_precision_flag(parser, help="the app's --precision")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    precision = choose_precision(args.precision, CPU, remeasure=args.remeasure_precision)
    rows, forwards = measure(args.model, precision.dtype, args.repeats)
    forward = statistics.median(forwards)
    print(
        f"{args.model}, {precision.name} ({precision.decided}), torch threads {torch.get_num_threads()}, load average "
        f"{os.getloadavg()[0]:.1f}; plain fp32 forward {forward:.1f} ms (median of {len(forwards)})"
    )
    total = 0.0
    for phase in PHASES:
        ms = statistics.median(rows[phase])
        total += ms
        print(
            f"  {phase:<11} {ms:7.1f} ms  {ms / forward:5.2f}x"
            f"   (min {min(rows[phase]):.1f}, max {max(rows[phase]):.1f})"
        )
    print(
        f"  {'sum':<11} {total:7.1f} ms  {total / forward:5.2f}x  of which Gradio and the browser "
        f"{total - statistics.median(rows['analyse']) - statistics.median(rows['outputs']):.1f} ms"
    )


if __name__ == "__main__":
    main()
