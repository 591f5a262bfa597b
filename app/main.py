"""The CaiT app: every class-attention head, LayerScale per depth, saliency and talking heads for one image.

    python app/main.py [--host 127.0.0.1] [--port 7860] [--model cait_micro_136] [--checkpoint FILE]
                       [--pretrained] [--random-init] [--device auto|cpu|cuda] [--precision auto|fp32|bf16]
                       [--model-memory-gb 4] [--atlas OUT] [--atlas-dir DIR]

A thin command line: arguments are checked before torch and Gradio are imported (so --help and a bad
flag answer at once), then `app.ui` builds and serves the page.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python app/main.py`: import the `app` package from this clone
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cait.flags import add_device_flag, add_model_flags, add_precision_flag  # no torch: --help answers at once


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python app/main.py", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    p.add_argument("--port", type=int, default=7860, help="port to serve on (default 7860)")
    add_model_flags(
        p,
        pretrained_help="for a paper variant, download timm's official weights from the Hugging Face Hub when "
        "they are not in the local cache (without it: cached or shipped weights only)",
    )
    add_device_flag(p)
    add_precision_flag(
        p,
        help="forward-only passes (predictions, class attention, deletion/insertion scoring) in bf16 "
        "autocast or fp32; auto = bf16 where it measures faster than fp32 here. Gradients and "
        "attributions always run in fp32",
    )
    p.add_argument(
        "--model-memory-gb",
        type=float,
        default=4.0,
        help="weights of loaded models kept for all pages together; the least recently used model is "
        "dropped first (default 4)",
    )
    p.add_argument(
        "--atlas",
        default=None,
        metavar="OUT",
        help="a head atlas (python -m cait.atlas --out OUT) to open in the Dataset tab",
    )
    p.add_argument(
        "--atlas-dir",
        default=None,
        metavar="DIR",
        help="the Dataset tab offers the atlases in DIR's subfolders (default: the folder of --atlas, else out/)",
    )
    return p.parse_args(argv)


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not port_free(args.host, args.port):
        print(f"error: port {args.port} on {args.host} is in use; choose another with --port", file=sys.stderr)
        return 2
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported: no outside calls
    try:
        from app.server import serve  # torch, gradio: seconds, so only once the arguments are known to be good
    except ModuleNotFoundError as e:
        if e.name != "app":
            raise
        print(
            "error: the app package is not installed in this Python; run `bash setup.sh` (or "
            "`pip install -e .`) in the repository",
            file=sys.stderr,
        )
        return 2
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
