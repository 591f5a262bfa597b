"""Does the 28-pixel Fashion-MNIST model see a garment the way the 136-pixel scenes model does?

The shipped `cait_micro_136` (8 SA + 2 CA blocks, dim 192, 4 heads, trained on garments placed in scenes) against
the shipped `cait_nano_28` (6 SA + 2 CA, dim 96, 3 heads, trained on plain Fashion-MNIST), on the same plain
Fashion-MNIST test garments (each model through its own preprocessing: 28 px grey for the nano, 136 px for the
micro), with `cait.compare`. Three answers, each computed from the run's numbers against a bar stated here before
the run: which blocks stay alike (a block whose best CKA with any block of the other model reaches `CKA_BAR`),
which CA heads have a partner (a matched pair whose mean map rank correlation reaches `HEAD_BAR`) and which are new,
and where the two disagree (top-1 of each, agreement, the classes whose difference McNemar's exact test finds at
p < 0.05, the confusions that changed most). The verdict lines are built from those numbers.

    python analysis/compare_models.py                                # 500 Fashion-MNIST test garments
    python analysis/compare_models.py --run OUT                      # read a finished comparison (cait.compare)
    python analysis/compare_models.py --data DIR --boxes boxes.json  # your images

Writes compare_models.json (the numbers and the verdict), compare_models.png (CKA and head similarity),
compare_models_cka.html and compare_models_heads.html; the comparison run itself goes to OUT/run (resumable).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from _common import calm, fail, matplotlib_pyplot, out_dir, save_html, save_png, write_json

from cait.compare import CompareOptions, CompareRun, CompareRunError, Side, read_run
from cait.figures.compare import cka_plotly, head_similarity_plotly
from cait.flags import add_data_flags

CKA_BAR = 0.7  # a block "stays alike" when some block of the other model reaches this linear CKA
HEAD_BAR = 0.5  # a matched head has a partner at a mean Spearman correlation of its maps of at least this
P_BAR = 0.05  # McNemar's exact test: a class whose top-1 differs


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python analysis/compare_models.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model-a", default="cait_micro_136", help="model A (default cait_micro_136)")
    p.add_argument("--model-b", default="cait_nano_28", help="model B (default cait_nano_28)")
    said = dict(boxes="COCO-format boxes of a folder's images")
    said |= dict(help="the images (default fashion-mnist: its test split)", limit="images (default 500)", sample=None)
    add_data_flags(p, default="fashion-mnist", limit_default=500, **said)
    p.add_argument("--run", type=Path, default=None, help="a finished comparison to read instead of making one")
    p.add_argument("--out", type=Path, default=Path("out") / "compare_models", help="output directory")
    return p.parse_args(argv)


def blocks(run: CompareRun) -> dict:
    """Per block of each model its closest block of the other (by CKA), and which stay alike."""

    def side(cka: np.ndarray, mine: list[str], theirs: list[str]) -> list[dict]:
        best = np.nanargmax(cka, axis=1)
        return [
            {"block": b, "closest": theirs[j], "cka": float(cka[i, j]), "alike": bool(cka[i, j] >= CKA_BAR)}
            for i, (b, j) in enumerate(zip(mine, best))
        ]

    return {"a": side(run.cka, run.blocks_a, run.blocks_b), "b": side(run.cka.T, run.blocks_b, run.blocks_a)}


def heads(run: CompareRun) -> dict:
    """The matched pairs with their similarity, the pairs that are partners, and the heads of each without one."""
    pairs = [{"head_a": list(a), "head_b": list(b), "similarity": s} for a, b, s in run.matching]
    partners = [p for p in pairs if p["similarity"] >= HEAD_BAR]
    paired_a = {tuple(p["head_a"]) for p in partners}
    paired_b = {tuple(p["head_b"]) for p in partners}
    return {
        "pairs": pairs,
        "partners": partners,
        "new_in_a": [list(h) for h in run.heads_a if h not in paired_a],
        "new_in_b": [list(h) for h in run.heads_b if h not in paired_b],
        "best_similarity": float(np.nanmax(run.head_similarity)),
    }


def answers(run: CompareRun) -> dict:
    s = run.summary
    differing = [c for c in run.classes if c["mcnemar_p"] < P_BAR]
    return {
        "top1_a": s["top1_a"],
        "top1_b": s["top1_b"],
        "agreement": s["agreement"],
        "mcnemar": s["mcnemar"],
        "classes_differing": differing,
        "confusions_changed": s["confusions_changed"][:5],
    }


def _head(h) -> str:
    return f"CA{h[0]} head {h[1]}"


def verdict(b: dict, h: dict, a: dict) -> list[str]:
    """The conclusions, each a sentence built from the numbers."""
    alike = [x for x in b["a"] if x["alike"]]
    said_blocks = ", ".join(f"{x['block']}~{x['closest']} {x['cka']:.2f}" for x in alike) or "none"
    said_heads = ", ".join(f"{_head(p['head_a'])}~{_head(p['head_b'])} {p['similarity']:.2f}" for p in h["partners"])
    lines = [
        f"Blocks: {len(alike)} of {len(b['a'])} blocks of A have a block of B at CKA >= {CKA_BAR} ({said_blocks}); "
        f"the highest CKA of any pair is {max(x['cka'] for x in b['a']):.2f}; blocks of B without a counterpart in A: "
        + (", ".join(f"{x['block']} (best {x['cka']:.2f})" for x in b["b"] if not x["alike"]) or "none")
        + ".",
        f"Heads: {len(h['partners'])} of {len(h['pairs'])} matched pairs reach the bar {HEAD_BAR} "
        f"({said_heads or 'none'}); the best pair of all is at {h['best_similarity']:.2f}; without a partner: "
        f"{len(h['new_in_a'])} heads of A, {len(h['new_in_b'])} of B.",
    ]
    top = lambda v: "n/a" if v is None else f"{v:.1%}"  # noqa: E731
    m = a["mcnemar"]
    better = "A" if m["a_only"] > m["b_only"] else "B"
    sig = "significant" if m["p"] < P_BAR else "not significant"
    lines.append(
        f"Answers: top-1 A {top(a['top1_a'])}, B {top(a['top1_b'])}; they agree on {a['agreement']:.1%}; only A right "
        f"{m['a_only']}, only B right {m['b_only']} ({better} ahead, McNemar p = {m['p']:.2g}, {sig} at {P_BAR}); "
        f"classes that differ at p < {P_BAR}: "
        + (", ".join(f"{c['class']} ({c['difference']:+.0%})" for c in a["classes_differing"]) or "none")
        + "."
    )
    return lines


def figure(run: CompareRun, path: Path, made_from: str) -> None:
    plt = matplotlib_pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    im = left.imshow(run.cka, vmin=0, vmax=1, cmap="viridis")
    left.set(title="linear CKA", xlabel="blocks of B", ylabel="blocks of A")
    short = lambda n: ("CA" if "token_only" in n else "SA") + str(int(n.rsplit(".", 1)[1]) + 1)  # noqa: E731
    left.set_xticks(range(len(run.blocks_b)), [short(n) for n in run.blocks_b], rotation=90)
    left.set_yticks(range(len(run.blocks_a)), [short(n) for n in run.blocks_a])
    fig.colorbar(im, ax=left, shrink=0.8)
    bound = float(np.nanmax(np.abs(run.head_similarity))) or 1.0
    im = right.imshow(run.head_similarity, vmin=-bound, vmax=bound, cmap="RdBu_r")
    label = lambda h: f"CA{h[0]}h{h[1]}"  # noqa: E731
    right.set_xticks(range(len(run.heads_b)), [label(h) for h in run.heads_b], rotation=90)
    right.set_yticks(range(len(run.heads_a)), [label(h) for h in run.heads_a])
    for a, b, _ in run.matching:
        right.scatter(run.heads_b.index(b), run.heads_a.index(a), s=160, facecolors="none", edgecolors="black")
    right.set(title="head similarity (Spearman on pixels), matching circled", xlabel="heads of B", ylabel="heads of A")
    fig.colorbar(im, ax=right, shrink=0.8)
    save_png(fig, path, made_from)


def the_run(args: argparse.Namespace) -> CompareRun:
    """The finished comparison --run names, or one made (or continued) in OUT/run."""
    if args.run is not None:
        return read_run(args.run)
    from cait.compare import run_compare

    options = CompareOptions(
        Side(args.model_a), Side(args.model_b), data=args.data, boxes=args.boxes, limit=args.limit, out=args.out / "run"
    )
    run_compare(options)
    try:
        return read_run(options.out)
    except CompareRunError:
        fail(f"the comparison in {options.out} did not finish: run the same command again")


@calm
def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = out_dir(args.out)
    run = the_run(args)
    b, h, a = blocks(run), heads(run), answers(run)
    made_from = f"A: {run.model_a}; B: {run.model_b}; data: {run.summary['data']}"
    result = {
        "made_from": made_from,
        "images": run.summary["images"],
        "bars": {"cka": CKA_BAR, "head_similarity": HEAD_BAR, "mcnemar_p": P_BAR},
        "blocks": b,
        "heads": h,
        "answers": a,
        "verdict": verdict(b, h, a),
    }
    write_json(out / "compare_models.json", result)
    figure(run, out / "compare_models.png", made_from)
    names = (run.model_a.split(" ")[0], run.model_b.split(" ")[0])
    save_html(cka_plotly(run.cka, run.blocks_a, run.blocks_b, names=names), out / "compare_models_cka.html", made_from)
    heads_fig = head_similarity_plotly(run.head_similarity, run.heads_a, run.heads_b, run.matching)
    save_html(heads_fig, out / "compare_models_heads.html", made_from)
    print("\n".join(result["verdict"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
