"""Cost of each explanation relative to one plain forward pass of the same batch, in the same run.

    .venv/bin/python benchmarks/explain_speed.py                      # cait_xxs24_224 (B=4), cait_nano_64 (B=16)
    .venv/bin/python benchmarks/explain_speed.py --models cait_pico_32:8 --repeats 5
    .venv/bin/python benchmarks/explain_speed.py --methods knockout_profile knockout_naive   # issue 33's goal
    .venv/bin/python benchmarks/explain_speed.py --methods ca_stage logit_lens patching_block patching_head \
        gradient_rollout --threads 1                                                   # issue 41's goals
    .venv/bin/python benchmarks/explain_speed.py --models cait_micro_136:1 cait_xxs24_224:1 \
        --methods ca_stage token_patching --threads 1                                  # issues 47, 58: forwards per map

Random weights (speed does not depend on them). Each timed run of a method alternates with a timed
forward pass, so that load from other processes drifts both alike, and the reported times are the
median over --repeats such rounds after one warm-up call of each (cait/timing.py, as every benchmark; a
round repeats a call faster than 0.2 s).
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Callable

import torch
from tqdm import tqdm

import cait
from cait import explain
from cait.explain.maps import regions_of_focus
from cait.flags import add_threads_flag
from cait.timing import time_interleaved

# Goals of issue 4 (x one forward pass); methods without a goal are reported only.
GOALS = {
    "ca_maps": 1.2,
    "regions": 1.2,
    "integrated_gradients": 40.0,
    "rollout_raw": 1.5,
    "rollout_after_proj_l": 1.5,
    "rollout_after_proj_w": 1.5,
    "gradient_rollout": 3.0,  # issue 41: one forward and one backward
    # issue 58: token patching per patch, both directions, on the class stage's cached keys and values (the two
    # runs, then the class token's own path per patch and direction)
    "token_patching": 2.5,
}


# Issue 33: every block's knockout (cait.explain.knockout_profile, cached prefix) in at most SA depth / 2 + 2
# forward passes; "knockout_naive" is the same profile by one whole forward per block, for the comparison.
def knockout_goal(cfg: cait.CaiTConfig) -> float:
    return cfg.depth / 2 + 2


# Issue 41: the logit lens runs the SA stage once and the class stage (timed alone as "ca_stage", on the
# SA stage's cached tokens) once per SA depth + 1; patching shares both runs' cached states, and re-runs
# after each block's attention and MLP branch what follows it (SA depth / 2 blocks on average, twice per
# block: SA depth in all; the SA depth / 2 + 3 counts one suffix per block), plus the two runs.
def lens_goal(cfg: cait.CaiTConfig, ca_stage: float) -> float:
    return 1 + (cfg.depth + 1) * ca_stage


def patching_goal(cfg: cait.CaiTConfig) -> float:
    return cfg.depth + 3


SAME_AS_CA_MAPS = ("ca1_mean", "ca2_mean")  # one class_attention call each: timed once as ca_maps
# Issue 46: what observing a forward costs (CaiT.forward_insights, alone and with every SA layer's distances)
NO_GRAD = ("ca_stage", "insights", "insights_sa")


def benchmark(name: str, batch: int, repeats: int, only: list[str] | None) -> list[tuple[str, float, float]]:
    torch.manual_seed(0)
    model = cait.load_model(name, weights=False).model
    cfg = model.cfg
    x = torch.randn(batch, cfg.in_chans, cfg.img_size, cfg.img_size)
    corrupted = x + torch.randn(x.shape)
    target = torch.zeros(batch, dtype=torch.long)
    with torch.no_grad():
        tokens = model.forward_self_attention(x)
    distances = explain.head_stats.distance_reduce(cfg)  # what the atlas keeps of every SA layer

    def forward():
        with torch.no_grad():
            model(x)

    def regions():
        regions_of_focus(explain.class_attention(model, x).mean[:, 0], img_size=cfg.img_size)

    methods: dict[str, Callable[[], object]] = {
        "ca_maps": lambda: explain.class_attention(model, x),
        "regions": regions,
        **{m: (lambda fn=fn: fn(model, x, target)) for m, fn in explain.METHODS.items() if m not in SAME_AS_CA_MAPS},
        "knockout_profile": lambda: explain.knockout_profile(model, x, target),
        "knockout_naive": lambda: explain.knockout_profile(model, x, target, shared_prefix=False),
        "dla": lambda: explain.direct_logit_attribution(model, x, target),
        "ca_stage": lambda: model.forward_head(model.forward_class_attention(tokens)),
        "logit_lens": lambda: explain.logit_lens(model, x),
        "patching_block": lambda: explain.activation_patching(model, x, corrupted, target),
        "patching_head": lambda: explain.activation_patching(model, x, corrupted, target, granularity="head"),
        "insights": lambda: model.forward_insights(x),
        "insights_sa": lambda: model.forward_insights(x, sa_layers=tuple(range(cfg.depth)), sa_reduce=distances),
        "token_patching": lambda: explain.token_patching(model, x, corrupted, target),
    }
    if only:
        methods = {m: fn for m, fn in methods.items() if m in only}
    forward(), forward()  # warm-up: allocator, thread pool, lazy imports
    rows = []
    ratios: dict[str, float] = {}
    for method, fn in tqdm(methods.items(), desc=f"{name} B={batch}", unit="method"):
        with torch.no_grad() if method in NO_GRAD else contextlib.nullcontext():
            sec = time_interleaved({"method": fn, "forward": forward}, repeats=repeats, warmup=1)
        ratios[method] = sec["method"] / sec["forward"]
        rows.append((method, sec["method"], sec["forward"], goal_of(method, cfg, ratios)))
        tqdm.write(row(name, batch, *rows[-1]))  # partial results survive an interrupted run
    return rows


def goal_of(method: str, cfg: cait.CaiTConfig, ratios: dict[str, float]) -> float | None:
    """The goal of `method` in forwards; the lens's needs the class stage's ratio measured before it."""
    if method == "logit_lens":
        return lens_goal(cfg, ratios["ca_stage"]) if "ca_stage" in ratios else None
    if method in ("knockout_profile", "patching_block"):
        return knockout_goal(cfg) if method == "knockout_profile" else patching_goal(cfg)
    return GOALS.get(method)


def row(name: str, batch: int, method: str, t: float, ref: float, goal: float | None) -> str:
    verdict = "" if goal is None else f"{'<=' if t / ref <= goal else '> '}{goal:.3g}"
    return f"{name:<16} {batch:>3} {method:<24} {ref * 1e3:>10.1f} {t * 1e3:>10.1f} {t / ref:>8.2f} {verdict:>6}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--models",
        nargs="+",
        default=["cait_xxs24_224:4", "cait_nano_64:16"],
        help="name:batch pairs (default: %(default)s)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per method (median)")
    p.add_argument(
        "--methods", nargs="+", default=None, help="only these (ca_maps, regions and the names of cait.explain.METHODS)"
    )
    add_threads_flag(p)
    args = p.parse_args()
    extra = ("knockout_profile", "knockout_naive", "dla", "ca_stage", "logit_lens", "patching_block", "patching_head")
    extra += ("insights", "insights_sa", "token_patching")
    known = {"ca_maps", "regions", *extra, *explain.METHODS} - set(SAME_AS_CA_MAPS)
    if args.methods and set(args.methods) - known:
        p.error(f"unknown method(s) {sorted(set(args.methods) - known)}; choose from {', '.join(sorted(known))}")
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for spec in args.models:
        name, _, batch = spec.partition(":")
        if name not in cait.list_models():
            p.error(f"unknown model {name!r}; known: {', '.join(cait.list_models())}")
        if not batch.isdigit():
            p.error(f"give a batch size as name:batch, got {spec!r}")
        results.append((name, int(batch), benchmark(name, int(batch), args.repeats, args.methods)))
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads, CPU; ratio = method time / forward time\n")
    print(f"{'model':<16} {'B':>3} {'method':<24} {'forward ms':>10} {'method ms':>10} {'ratio':>8} {'goal':>6}")
    for name, batch, rows in results:
        for r in rows:
            print(row(name, batch, *r))
        per_forward = {r[0]: r[1] / r[2] for r in rows}  # each against its own interleaved forward
        if {"knockout_profile", "knockout_naive"} <= set(per_forward):
            speedup = per_forward["knockout_naive"] / per_forward["knockout_profile"]
            print(f"{name:<16} {batch:>3} knockout: naive loop / cached prefix = {speedup:.2f}x")
        if "token_patching" in per_forward:
            cfg = cait.get_config(name)
            print(
                f"{name:<16} {batch:>3} token patching, {cfg.num_patches} patches x 2 directions: "
                f"{per_forward['token_patching']:.2f} forwards per map"
            )


if __name__ == "__main__":
    main()
