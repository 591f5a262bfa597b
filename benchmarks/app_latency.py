"""Latency of the app's /analyze endpoint against one plain forward pass of the same model.

For each model the real app is started in this process on a free port and called through
gradio_client, as a user's script would; request -> full JSON response is timed for the
class-attention view (predictions + all CA maps) and for integrated gradients with 32 steps, and
divided by the median time of one plain `model(x)` forward pass measured in the same run (cait.timing:
interleaved rounds, medians).

    python benchmarks/app_latency.py [--models cait_nano_64 cait_xxs24_224] [--repeats 10] [--ig-repeats 3]

Models without local weights run with random weights (latency does not depend on them).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402

import cait  # noqa: E402
from cait.timing import time_interleaved  # noqa: E402
from app.images import load_image  # noqa: E402
from app.main import ModelStore, analyse, build_app, launch, load_model  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_model(name: str, repeats: int, ig_repeats: int) -> dict:
    loaded = load_model(name, None, torch.device("cpu"))
    image = loaded.examples[0][0]
    x = cait.preprocess.to_batch([load_image(image).image], loaded.cfg)
    demo = build_app(ModelStore(loaded))
    port = free_port()
    launch(demo, port=port, block=False)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)

        def plain_forward() -> None:
            with torch.inference_mode():
                loaded.model(x)
        # warm-up: the first call allocates, picks kernels, opens connections
        sec = time_interleaved({"forward": plain_forward, "in_process": lambda: analyse(loaded, image),
                                "view": lambda: client.predict(handle_file(image), api_name="/analyze")},
                               repeats=repeats, warmup=1, desc=f"{name} forward, analyse(), /analyze")
        forward, in_process, view = sec["forward"], sec["in_process"], sec["view"]
        ig = time_interleaved({"ig": lambda: client.predict(handle_file(image), "integrated_gradients", -1, 32,
                                                            api_name="/analyze")},
                              repeats=ig_repeats, warmup=1, desc=f"{name} /analyze IG-32")["ig"]
    finally:
        demo.close()
    return {"model": name, "weights": loaded.source, "forward_ms": 1e3 * forward,
            "analyse_in_process_ms": 1e3 * in_process, "analyze_request_ms": 1e3 * view,
            "ig32_request_ms": 1e3 * ig, "ratio_analyse_in_process": in_process / forward,
            "ratio_class_attention_view": view / forward, "ratio_ig32": ig / forward}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=[cait.DEFAULT_MODEL, "cait_xxs24_224"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--ig-repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    rows = [bench_model(name, args.repeats, args.ig_repeats) for name in args.models]
    print(f"torch threads {torch.get_num_threads()}, CPU, load average {os.getloadavg()[0]:.1f}")
    print(f"{'model':<16} {'forward ms':>10} {'analyse() ms':>12} {'/analyze ms':>11} {'IG-32 ms':>9} "
          f"{'view/fwd':>8} {'IG-32/fwd':>9}")
    for r in rows:
        print(f"{r['model']:<16} {r['forward_ms']:>10.1f} {r['analyse_in_process_ms']:>12.1f} "
              f"{r['analyze_request_ms']:>11.1f} {r['ig32_request_ms']:>9.1f} "
              f"{r['ratio_class_attention_view']:>8.1f} {r['ratio_ig32']:>9.1f}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
