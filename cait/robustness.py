"""Corruption robustness of a model, its arithmetic and records: the mean corruption error (mCE) against a
baseline model, as Hendrycks & Dietterich (2019) define it, of the sweep that `cait.evaluate.sweep` runs
(`cait.evaluate` under each ImageNet-C corruption and severity), its table, and the shipped record.

    python -m cait.evaluate --model cait_micro_136 --corruption all:3 --subset 1000 --json sweep.json
    python -m cait.evaluate --model cait_s24_224 --pretrained --data PHOTOS --corruption all --baseline base.json

For corruption c, with E the top-1 error (1 - top-1) at severity s of the model and B the baseline's:
CE_c = sum_s E_{s,c} / sum_s B_{s,c}, and relative CE_c = sum_s (E_{s,c} - E_clean) / sum_s (B_{s,c} - B_clean);
mCE and relative mCE are their means over the corruptions. The paper's baseline is AlexNet; here it is whatever
`--baseline` names (a model, a checkpoint, or an earlier sweep's JSON, which must cover the same corruptions,
severities and images). Every model sees the same corrupted images: each run's random draws come from a
generator seeded with `--corruption-seed`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from .data.scenes import PIXEL_NOISE
from .errors import InputError, shown

# The records' helpers (shipped_summary, headline) serve the app, whose start would pay a second for
# torchvision's import: cait.corruptions is imported only where its names are needed.

POINTING_ROWS = ("ca1_mean", "ca2_mean")  # the class-attention maps scored under corruption (head means)


class CorruptionError(InputError):
    """A corruption spec or an earlier sweep that cannot be used; the message is one line."""


def parse_corruptions(specs: Sequence[str]) -> list[tuple[str, int]]:
    """(name, severity) pairs from specs "NAME", "NAME:SEVERITY", "all" or "all:SEVERITY" (no severity: 1-5),
    in the order given, each pair once."""
    from .corruptions import CORRUPTIONS, SEVERITIES

    pairs: list[tuple[str, int]] = []
    for spec in specs:
        name, _, severity = spec.partition(":")
        if name != "all" and name not in CORRUPTIONS:
            raise CorruptionError(f"unknown corruption {shown(name)}; choose from all, {', '.join(CORRUPTIONS)}")
        if severity and (not severity.isdigit() or int(severity) not in SEVERITIES):
            raise CorruptionError(f"severity must be 1-5, got {shown(severity)} in {shown(spec)}")
        names = list(CORRUPTIONS) if name == "all" else [name]
        severities = [int(severity)] if severity else list(SEVERITIES)
        pairs += [(n, s) for n in names for s in severities if (n, s) not in pairs]
    return pairs


def parse_corruption(spec: str) -> tuple[str, int]:
    """One (name, severity) from "NAME:SEVERITY" (activation patching compares one clean and one corrupted
    run); CorruptionError in one line otherwise."""
    pairs = parse_corruptions([spec])
    if len(pairs) != 1 or ":" not in spec:
        raise CorruptionError(f"give one corruption as NAME:SEVERITY (e.g. gaussian_noise:3), got {shown(spec)}")
    return pairs[0]


def summary(result: dict) -> dict:
    """Top-1 and the class-attention pointing (CA-1 / CA-2 head means, when scored) of an `evaluate` result."""
    rows = {r["method"]: r for r in result.get("localization") or []}
    out = {"images": result["images"], "top1": result["top1"], "per_class_top1": result["per_class_top1"]}
    for name in POINTING_ROWS:
        if name in rows:
            out[f"{name}_pointing"] = rows[name]["pointing_game"]
            out[f"{name}_mass_in_box"] = rows[name]["mass_in_box"]
    return out


def _error_sums(rows: Sequence[dict]) -> dict[str, dict[int, float]]:
    errors: dict[str, dict[int, float]] = {}
    for row in rows:
        errors.setdefault(row["corruption"], {})[row["severity"]] = 1 - row["top1"]
    return errors


def mean_corruption_error(
    rows: Sequence[dict], clean_top1: float, baseline: Sequence[dict], baseline_top1: float
) -> dict:
    """mCE and relative mCE (module doc) of sweep `rows` against the baseline's sweep, both with their clean
    top-1; per corruption CE and relative CE over the severities both sweeps ran (None where the baseline's
    denominator is 0)."""
    ours, theirs = _error_sums(rows), _error_sums(baseline)
    per_corruption = {}
    for name, by_severity in ours.items():
        severities = sorted(set(by_severity) & set(theirs.get(name, {})))
        if not severities:
            continue
        e = [by_severity[s] for s in severities]
        b = [theirs[name][s] for s in severities]
        rel_num = sum(v - (1 - clean_top1) for v in e)
        rel_den = sum(v - (1 - baseline_top1) for v in b)
        per_corruption[name] = {
            "severities": severities,
            "ce": sum(e) / sum(b) if sum(b) > 0 else None,
            "relative_ce": rel_num / rel_den if rel_den != 0 else None,
        }

    def mean(key: str) -> float | None:
        values = [v[key] for v in per_corruption.values()]
        return sum(values) / len(values) if values and None not in values else None

    return {"mce": mean("ce"), "relative_mce": mean("relative_ce"), "per_corruption": per_corruption}


def read_sweep(path: str | Path) -> dict:
    """An earlier `--corruption` result JSON's clean summary and sweep rows (as a baseline)."""
    try:
        result = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise CorruptionError(f"{path} is not a readable result JSON ({type(e).__name__})") from None
    if not isinstance(result, dict) or "corruption" not in result:
        raise CorruptionError(f"{path} holds no corruption sweep (run cait.evaluate with --corruption and --json)")
    return result["corruption"]


def format_sweep(section: dict) -> str:
    """The sweep as a table: one line per corruption and severity, then the mean per severity, then mCE."""
    rows = section["rows"]
    has_pointing = any("ca1_mean_pointing" in r for r in rows)
    head = f"{'corruption':<18}{'sev':>4}{'top-1':>8}" + (f"{'CA-1 pt':>9}{'CA-2 pt':>9}" if has_pointing else "")
    lines = [head]
    clean = section["clean"]
    for row in [{"corruption": "clean", "severity": 0, **clean}, *rows]:
        line = f"{row['corruption']:<18}{row['severity'] or '-':>4}{100 * row['top1']:>7.1f}%"
        if has_pointing:
            line += "".join(f"{100 * row.get(f'{n}_pointing', float('nan')):>8.1f}%" for n in POINTING_ROWS)
        lines.append(line)
    for s, top1 in mean_by_severity(rows).items():
        lines.append(f"{'mean':<18}{s:>4}{100 * top1:>7.1f}%")
    mce = section.get("mce")
    if mce and mce["mce"] is not None:
        rel = mce["relative_mce"]
        lines.append(
            f"mCE {100 * mce['mce']:.1f}%, relative mCE "
            f"{'-' if rel is None else f'{100 * rel:.1f}%'} against {section['baseline']['name']}"
        )
    return "\n".join(lines)


def mean_by_severity(rows: Sequence[dict]) -> dict[int, float]:
    """Mean top-1 over the corruptions at each severity run."""
    by: dict[int, list[float]] = {}
    for row in rows:
        by.setdefault(row["severity"], []).append(row["top1"])
    return {s: sum(v) / len(v) for s, v in sorted(by.items())}


def shipped_summary(sweep_result: dict, noise_results: Sequence[dict] = ()) -> dict:
    """The small record a model card's robustness section and the app are made from: the clean and corrupted
    top-1 and pointing of an `evaluate --corruption` result, and the top-1 and pointing of `evaluate` results on
    scenes of other pixel-noise levels (`--pixel-noise`; one without it is the renderer's own level)."""
    keep = ("corruption", "severity", "images", "top1", *(f"{n}_pointing" for n in POINTING_ROWS))
    section = sweep_result["corruption"]
    out = {
        "data": sweep_result.get("data", "fashion-mnist-scenes"),
        "scene_seed": sweep_result.get("scene_seed"),
        "precision": sweep_result.get("precision"),
        "corruption_seed": section["seed"],
        "clean": {k: v for k, v in section["clean"].items() if k in keep},
        "rows": [{k: v for k, v in row.items() if k in keep} for row in section["rows"]],
        "mean_top1_by_severity": {str(s): v for s, v in mean_by_severity(section["rows"]).items()},
    }
    if noise_results:
        shifts = [{"pixel_noise": r.get("pixel_noise") or PIXEL_NOISE, **summary(r)} for r in noise_results]
        out["noise_shift"] = sorted(
            ({k: v for k, v in r.items() if k in ("pixel_noise", *keep)} for r in shifts),
            key=lambda r: r["pixel_noise"],
        )
    return out


def headline(record: dict) -> str:
    """One line on a shipped model's robustness from its `shipped_summary` record (the app's Model tab)."""
    parts = [f"clean {record['clean']['top1']:.1%}"]
    for severity in ("3", "5"):
        if severity in record["mean_top1_by_severity"]:
            corruptions = sum(r["severity"] == int(severity) for r in record["rows"])
            parts.append(
                f"{record['mean_top1_by_severity'][severity]:.1%} mean over {corruptions} corruptions at severity "
                f"{severity}"
            )
    shifted = [r for r in record.get("noise_shift", []) if r["pixel_noise"] != PIXEL_NOISE]
    if shifted:
        worst = max(shifted, key=lambda r: r["pixel_noise"])
        parts.append(f"{worst['top1']:.1%} with the renderer's pixel noise at std {worst['pixel_noise']:g}")
    return "top-1 " + ", ".join(parts)
