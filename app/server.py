"""Start the app from checked command-line arguments: device and precision, the shared model cache with
the default model loaded, then the server. Every user mistake ends in one line on stderr, no traceback."""

from __future__ import annotations

import argparse
import logging
import sys

import cait
from app import torch_thread
from app.loading import load_model
from app.models import ModelCache, ModelChoice
from app.tabs.dataset import AtlasPlaces
from app.ui import build_app, launch
from cait.factory import requested_variant
from cait.runtime import DeviceError, choose_precision, resolve_device


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("cait.app").setLevel(logging.INFO)  # user mistakes: one line each, no traceback
    try:
        device = resolve_device(args.device)
    except DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    precision = choose_precision(args.precision, device, remeasure=args.remeasure_precision)
    logging.getLogger("cait.app").info(
        "forward-only passes in %s, %s: %s", precision.name, precision.decided, precision.reason
    )
    cache = ModelCache(
        load_model,  # every model of every page and of the Dataset tab's atlases: `cait.load_model`, on `device`
        max_bytes=int(args.model_memory_gb * 2**30),
        device=device,
        dtype=precision.dtype,
        precision=precision,
    )
    default = ModelChoice(  # --random-init holds for every model a page loads
        name=requested_variant(args.model, args.checkpoint),
        checkpoint=args.checkpoint,
        download=args.pretrained,
        random_init=args.random_init,
    )
    try:
        first = torch_thread.call(cache.get, default)
    except cait.InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if first.notice:
        print(f"warning: {first.notice}", file=sys.stderr)
    try:
        places = AtlasPlaces.of(args.atlas, args.atlas_dir)
        launch(build_app(cache, default, places), host=args.host, port=args.port, served=tuple(places.served()))
    except OSError as e:  # the port was taken between the check and the bind
        print(
            f"error: cannot serve on {args.host}:{args.port} ({e.strerror or e}); choose another with --port",
            file=sys.stderr,
        )
        return 2
    return 0
