"""What the Table 1 miniature (depth_stability.py) found, computed from its result rows, never written by
hand: the learning rates each residual weighting trains at per depth, what LayerScale's init eps does on a
short run, and whether the paper's ordering of the methods comes out, the seed-to-seed spread being the noise.

A row is one run in one phase, as depth_stability.py writes them to its CSV/JSON:
    {"phase": "lr" | "eps" | "main", "method": a METHODS key, "depth": int, "lr": float, "eps": float | None,
     "seed": int, "images": training images seen, "diverged": bool, "final_top1": a fraction in [0, 1] | None,
     "gamma_final": mean |gamma| of the SA blocks after training (LayerScale runs, optional)}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import mean

from _paper import TABLE1

from cait.metrics import percent

# top-1 as fractions, as cait.train writes it (the paper's numbers, quoted, are in percent)
CHANCE = 0.1  # Fashion-MNIST: 10 classes
LEARNED = CHANCE + 0.1  # a run that finished below this top-1 did not learn
NEAR_BEST = 0.05  # an eps "learns" when its run ends within this of the best eps's (5 points)
MIN_GAP = 0.005  # differences below this (half a point), or below the larger seed spread of the two, are ties


@dataclass(frozen=True)
class Method:
    label: str
    residual_scale: str  # cait.train --residual-scale
    paper_column: str  # its column in _paper.TABLE1
    has_eps: bool  # its branch weight starts at eps (else at 1: plain residual, or at 0: ReZero)


METHODS = {
    "baseline": Method("plain residual", "none", "baseline", has_eps=False),
    "scalar": Method("scalar alpha", "scalar", "scalar_alpha", has_eps=True),
    "rezero": Method("ReZero", "rezero", "rezero", has_eps=False),
    "layerscale": Method("LayerScale", "layerscale", "layerscale", has_eps=True),
}


def paper_eps(depth: int) -> float:
    """LayerScale / alpha init by depth, the paper's rule (sec. 2)."""
    return 0.1 if depth <= 18 else 1e-5 if depth <= 24 else 1e-6


def num(x: float) -> str:
    """0.1, 3e-4, 1e-6, 1e9: learning rates and eps as one writes them (3 significant digits)."""
    if 0.1 <= x < 1e4:
        return f"{x:.3g}"
    mantissa, exponent = f"{x:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def learned(row: dict) -> bool:
    return not row["diverged"] and row["final_top1"] is not None and row["final_top1"] >= LEARNED


def in_phase(rows: list[dict], phase: str) -> list[dict]:
    return [r for r in rows if r["phase"] == phase]


def _where(rows: list[dict]) -> str:
    return ", ".join(f"{METHODS[r['method']].label} at depth {r['depth']} lr {num(r['lr'])}" for r in rows)


# ----------------------------------------------------------------------------------------------------
# the learning-rate sweep


def stability(rows: list[dict]) -> list[str]:
    """Sentences on the lr phase: divergence, runs that did not learn, the largest lr each method trains
    at per depth, and what depth does to each method's best accuracy."""
    runs = in_phase(rows, "lr")
    if not runs:
        return []
    lrs, depths = sorted({r["lr"] for r in runs}), sorted({r["depth"] for r in runs})
    span = f"peak lr {num(lrs[0])} to {num(lrs[-1])}, depths {', '.join(map(str, depths))}"
    bad = [r for r in runs if r["diverged"]]
    if not bad:
        out = [f"No run of the lr sweep diverged ({len(runs)} runs, {span}): no divergence up to lr {num(lrs[-1])}."]
    else:
        low = min(r["lr"] for r in bad)
        below = f"no divergence below lr {num(low)}" if low > lrs[0] else "divergence already at the lowest lr"
        out = [
            f"{len(bad)} of {len(runs)} runs of the lr sweep diverged (non-finite loss; {span}): {_where(bad)}; "
            f"{below}."
        ]
    stalled = [r for r in runs if not r["diverged"] and not learned(r)]
    if stalled:
        out.append(
            f"{len(stalled)} finished without learning (below {percent(LEARNED):g}% top-1, chance "
            f"{percent(CHANCE):g}%): "
            f"{_where(stalled)}."
        )
    out.append(
        f"Learning rates that trained (finished at >= {percent(LEARNED):g}%), at depth "
        f"{' / '.join(map(str, depths))}: "
        + "; ".join(
            f"{m.label} {' / '.join(_trained(runs, lrs, key, d) for d in depths)}" for key, m in METHODS.items()
        )
        + "."
    )
    if len(depths) > 1:
        out.append(
            f"Best top-1 over the lrs from depth {depths[0]} to {depths[-1]}: "
            + "; ".join(
                f"{m.label} {_best_text(runs, key, depths[0])} -> {_best_text(runs, key, depths[-1])}"
                for key, m in METHODS.items()
            )
            + "."
        )
    return out


def _trained(runs: list[dict], lrs: list[float], method: str, depth: int) -> str:
    """The lrs of the grid at which `method` trained at `depth`: "3e-4..3e-3" when they are neighbours in the
    grid, else listed; "none"."""
    ok = {r["lr"] for r in runs if r["method"] == method and r["depth"] == depth and learned(r)}
    where = [i for i, lr in enumerate(lrs) if lr in ok]
    if not where:
        return "none"
    if where == list(range(where[0], where[-1] + 1)):
        return num(lrs[where[0]]) + (f"..{num(lrs[where[-1]])}" if len(where) > 1 else "")
    return ", ".join(num(lrs[i]) for i in where)


def best_lr(runs: list[dict], method: str, depth: int) -> float | None:
    """The lr of the best finished run of `method` at `depth` (the lowest lr if every run diverged);
    None when the sweep has no run of it."""
    mine = [r for r in runs if r["method"] == method and r["depth"] == depth]
    finished = [r for r in mine if not r["diverged"] and r["final_top1"] is not None]
    if finished:
        return max(finished, key=lambda r: (r["final_top1"], -r["lr"]))["lr"]
    return min((r["lr"] for r in mine), default=None)


def _best_text(runs: list[dict], method: str, depth: int) -> str:
    lr = best_lr(runs, method, depth)
    row = next((r for r in runs if r["method"] == method and r["depth"] == depth and r["lr"] == lr), None)
    if row is None:
        return "-"
    return "diverged" if row["diverged"] else f"{percent(row['final_top1']):.1f}% (lr {num(lr)})"


# ----------------------------------------------------------------------------------------------------
# LayerScale's init eps


def best_eps(rows: list[dict]) -> float | None:
    """The eps of the eps phase's best finished run (None when none finished)."""
    finished = [r for r in in_phase(rows, "eps") if not r["diverged"] and r["final_top1"] is not None]
    return max(finished, key=lambda r: (r["final_top1"], r["eps"]))["eps"] if finished else None


def eps_effect(rows: list[dict]) -> list[str]:
    """Sentences on the eps phase: accuracy per eps, the smallest eps from which every larger one ends near
    the best, the paper's rule against it, and how far gamma moved from its init."""
    runs = sorted(in_phase(rows, "eps"), key=lambda r: -r["eps"])
    if not runs:
        return []
    depth, lr, images = runs[0]["depth"], runs[0]["lr"], runs[0]["images"]
    result = lambda r: "diverged" if r["diverged"] else f"{percent(r['final_top1']):.1f}%"
    out = [
        f"LayerScale at depth {depth} (lr {num(lr)}, {images} training images): "
        + ", ".join(f"eps {num(r['eps'])} {result(r)}" for r in runs)
        + "."
    ]
    top = max((r["final_top1"] for r in runs if not r["diverged"] and r["final_top1"] is not None), default=None)
    if top is None:
        return out + ["No eps trained without diverging."]
    if top < LEARNED:
        return out + [
            f"No eps learned in {images} images (the best ends at {percent(top):.1f}%, below {percent(LEARNED):g}%)."
        ]
    good = lambda r: not r["diverged"] and r["final_top1"] is not None and r["final_top1"] >= top - NEAR_BEST
    needed = None
    for r in runs:  # from the largest eps down, while every one so far ends near the best
        if not good(r):
            break
        needed = r["eps"]
    rule = paper_eps(depth)
    if needed is not None and needed <= runs[-1]["eps"]:
        out.append(
            f"Every eps tried ends within {percent(NEAR_BEST):g} points of the best: at this budget the init does "
            f"not matter."
        )
    elif needed is not None:
        out.append(
            f"LayerScale needs eps >= {num(needed)} to end within {percent(NEAR_BEST):g} points of its best in "
            f"{images} images."
        )
    else:
        out.append(f"The largest eps ({num(runs[0]['eps'])}) does not end near the best: no threshold.")
    ruled = next((r for r in runs if r["eps"] == rule), None)
    if ruled is not None:
        out.append(
            f"The paper's rule for depth {depth} (eps {num(rule)}, set for 300-epoch ImageNet runs) gets "
            f"{result(ruled)} here, {'within' if good(ruled) else 'outside'} {percent(NEAR_BEST):g} points of the "
            f"best."
        )
    moved = [r for r in runs if r.get("gamma_final") is not None]
    if moved:
        out.append(
            "Mean |gamma| of the SA blocks, init -> after training: "
            + ", ".join(f"{num(r['eps'])} -> {num(r['gamma_final'])}" for r in moved)
            + "."
        )
    return out


# ----------------------------------------------------------------------------------------------------
# the main comparison against the paper's ordering


@dataclass
class Arm:
    """One method at one eps and depth, over its seeds."""

    method: str
    eps: float | None
    depth: int
    top1: list[float] = field(default_factory=list)  # final top-1 (fractions) of the seeds that finished
    diverged: int = 0  # seeds that diverged

    @property
    def tuned(self) -> bool:
        """LayerScale / alpha at an eps other than the paper's rule (the eps phase's pick)."""
        return self.eps is not None and self.eps != paper_eps(self.depth)

    @property
    def label(self) -> str:
        return METHODS[self.method].label + (f" (eps {num(self.eps)}, tuned)" if self.tuned else "")

    @property
    def mean(self) -> float | None:
        return mean(self.top1) if self.top1 else None

    @property
    def score(self) -> float | None:
        """What it is ranked by: the mean, or None (last) when any seed diverged."""
        return None if self.diverged else self.mean

    @property
    def spread(self) -> float:
        return max(self.top1) - min(self.top1) if len(self.top1) > 1 else 0.0

    def text(self) -> str:
        if self.diverged:
            return f"{self.label} diverged ({self.diverged} of {self.diverged + len(self.top1)} seeds)"
        seeds = [percent(v) for v in self.top1]  # shown in percent, the half-range from the seeds' percentages
        pm = f" ± {(max(seeds) - min(seeds)) / 2:.1f}" if len(seeds) > 1 else ""
        return f"{self.label} {mean(seeds):.1f}{pm}"


def arms(rows: list[dict], depth: int) -> list[Arm]:
    """The main phase's arms at `depth`, in METHODS order (a tuned arm after its method)."""
    found: dict[tuple, Arm] = {}
    mine = [r for r in in_phase(rows, "main") if r["depth"] == depth]
    for r in sorted(mine, key=lambda r: (list(METHODS).index(r["method"]), r["eps"] != paper_eps(depth))):
        arm = found.setdefault((r["method"], r["eps"]), Arm(r["method"], r["eps"], depth))
        if r["diverged"] or r["final_top1"] is None:
            arm.diverged += 1
        else:
            arm.top1.append(r["final_top1"])
    return list(found.values())


def _ahead(a: float | None, b: float | None, noise: float) -> int:
    """+1 if a is ahead of b by more than the noise, -1 if behind, 0 within it; None = diverged (last)."""
    if a is None or b is None:
        return (a is not None) - (b is not None)
    return (a - b > noise) - (b - a > noise)


def order_text(
    values: dict[str, float | None], noise: dict[str, float], labels: dict[str, str], *, min_gap: float = MIN_GAP
) -> str:
    """'LayerScale > scalar alpha = ReZero > plain residual', best first (diverged = None last); '=' within the
    noise (the larger of the two, at least min_gap, in the values' unit)."""
    keys = sorted(values, key=lambda k: float("inf") if values[k] is None else -values[k])
    text = labels[keys[0]]
    for prev, key in zip(keys, keys[1:]):
        tie = _ahead(values[prev], values[key], max(noise[prev], noise[key], min_gap)) == 0
        text += f" {'=' if tie else '>'} {labels[key]}"
    return text


@dataclass
class Verdict:
    depth: int
    word: str  # "reproduced", "not reproduced" or "not resolved" (ties, or no arm learned)
    agree: int  # the paper's pairwise differences ours shows too
    reversed: int  # ... that ours shows the other way round
    ties: int  # ... that ours has within the noise
    ours: str  # our ordering
    paper: str  # the paper's ordering (ImageNet, quoted)

    def sentence(self, prefix: str = "") -> str:
        pairs = self.agree + self.reversed + self.ties
        return (
            f"Depth {self.depth}{prefix}: the paper's ordering ({self.paper}; ImageNet, quoted) is "
            f"{self.word.upper()} here ({self.ours}; of its {pairs} pairwise differences: {self.agree} agree, "
            f"{self.reversed} reversed, {self.ties} within the seed spread)."
        )


@dataclass(frozen=True)
class Quoted:
    """One number of the paper's Table 1."""

    top1_percent: float  # ImageNet top-1 in percent, as printed (for a run that diverged, the paper's 78.9)
    diverged: bool  # the paper's dagger

    def text(self) -> str:
        return f"{self.top1_percent:g}" + (" (diverged)" if self.diverged else "")


def paper_values(depth: int) -> dict[str, Quoted] | None:
    """The paper's Table 1 per method at `depth`, or None if it has no such depth."""
    row = next((r for r in TABLE1 if r["depth"] == depth), None)
    if row is None:
        return None
    return {k: Quoted(row[m.paper_column], k == "baseline" and row["baseline_diverged"]) for k, m in METHODS.items()}


def compare(depth: int, chosen: list[Arm]) -> Verdict | None:
    """Our arms (one per method) against the paper's ordering at `depth`; None without a paper row or runs."""
    paper = paper_values(depth)
    if paper is None or not chosen:
        return None
    ours = {a.method: a for a in chosen}
    labels = {k: METHODS[k].label for k in paper}
    counts = {1: 0, -1: 0, 0: 0}
    keys = [k for k in paper if k in ours]
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            claim = _ahead(paper[a].top1_percent, paper[b].top1_percent, percent(MIN_GAP))
            if claim:
                noise = max(ours[a].spread, ours[b].spread, MIN_GAP)
                got = _ahead(ours[a].score, ours[b].score, noise)
                counts[got * claim] += 1
    word = "not reproduced" if counts[-1] else "reproduced" if not counts[0] else "not resolved"
    if not any(a.score is not None and a.score >= LEARNED for a in chosen):
        word = "not resolved"  # nothing learned: the order of chance-level numbers says nothing
    ours_text = order_text(
        {k: a.score for k, a in ours.items()},
        {k: a.spread for k, a in ours.items()},
        {k: a.text() for k, a in ours.items()},
    )
    paper_text = order_text(
        {k: paper[k].top1_percent for k in keys},
        dict.fromkeys(keys, 0.0),
        {k: f"{labels[k]} {paper[k].text()}" for k in keys},
        min_gap=percent(MIN_GAP),
    )
    return Verdict(depth, word, counts[1], counts[-1], counts[0], ours_text, paper_text)


def verdicts(rows: list[dict]) -> tuple[list[Verdict], list[Verdict]]:
    """(at the paper's eps rule, with the eps phase's tuned LayerScale in its place), per main depth."""
    ruled, tuned = [], []
    for depth in sorted({r["depth"] for r in in_phase(rows, "main")}):
        all_arms = arms(rows, depth)
        v = compare(depth, [a for a in all_arms if not a.tuned])
        if v is not None:
            ruled.append(v)
        swapped = [a for a in all_arms if a.tuned and a.method == "layerscale"]
        if v is not None and swapped:
            tuned.append(compare(depth, [a for a in all_arms if not a.tuned and a.method != "layerscale"] + swapped))
    return ruled, tuned


def depth_trend(rows: list[dict]) -> list[str]:
    """What going from the shallowest to the deepest main depth does to each method (eps by the rule), the
    paper's numbers quoted beside."""
    depths = sorted({r["depth"] for r in in_phase(rows, "main")})
    if len(depths) < 2:
        return []
    ends = [{a.method: a for a in arms(rows, d) if not a.tuned} for d in (depths[0], depths[-1])]
    quoted = [paper_values(d) for d in (depths[0], depths[-1])]
    result = lambda a: "diverged" if a.score is None else f"{percent(a.score):.1f}"
    parts = []
    for key, m in METHODS.items():
        if key in ends[0] and key in ends[1]:
            paper = f" (paper: {quoted[0][key].text()} -> {quoted[1][key].text()})" if all(quoted) else ""
            parts.append(f"{m.label} {result(ends[0][key])} -> {result(ends[1][key])}{paper}")
    return [f"From depth {depths[0]} to {depths[-1]}, mean final top-1 over seeds: " + "; ".join(parts) + "."]


# ----------------------------------------------------------------------------------------------------
# the summary


@dataclass
class Summary:
    headline: str  # one line, for the main figure's title
    findings: dict[str, list[str]]  # phase -> sentences

    def text(self) -> str:
        titles = {"main": "Main comparison", "lr": "Learning-rate sweep", "eps": "LayerScale init eps"}
        parts = [self.headline, ""]
        for phase, sentences in self.findings.items():
            if sentences:
                parts += [f"{titles[phase]}:", *(f"- {s}" for s in sentences), ""]
        return "\n".join(parts).rstrip() + "\n"


def summarize(rows: list[dict]) -> Summary:
    ruled, tuned = verdicts(rows)
    main = [v.sentence() for v in ruled] + [v.sentence(" with LayerScale at the eps sweep's best eps") for v in tuned]
    main += depth_trend(rows)
    if ruled:
        deepest = ruled[-1]
        headline = f"Paper's Table 1 ordering at depth {deepest.depth}: {deepest.word}"
        if tuned and tuned[-1].depth == deepest.depth and tuned[-1].word != deepest.word:
            headline += f" (with LayerScale's eps tuned: {tuned[-1].word})"
        headline += "".join(f"; at depth {v.depth}: {v.word}" for v in ruled[:-1])
    elif in_phase(rows, "main"):
        headline = "The paper has no Table 1 row at the main comparison's depths: no ordering to compare"
    else:
        headline = "Main comparison not run yet: no verdict on the paper's ordering"
    return Summary(headline, {"main": main, "lr": stability(rows), "eps": eps_effect(rows)})
