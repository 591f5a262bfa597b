"""The answers of two models on the same labelled images side by side: top-1 of each and how often they agree,
per class with McNemar's exact test, the confusions that changed; and a paired bootstrap interval for the
difference of any per-image number between two matched heads."""

from __future__ import annotations

import numpy as np
from scipy.stats import binomtest

BOOTSTRAP_DRAWS = 2000


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """McNemar's exact test: the two-sided binomial p-value of a_only successes in a_only + b_only discordant
    pairs at 1/2 (1.0 without a discordant pair)."""
    n = a_only + b_only
    return float(binomtest(a_only, n, 0.5).pvalue) if n else 1.0


def class_rows(labels: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray, names: list[str]) -> list[dict]:
    """Per class with images: its count, top-1 of A and of B, B minus A, the images only A gets right and
    only B gets right, and McNemar's exact p-value of those two counts."""
    rows = []
    for k, name in enumerate(names):
        mine = labels == k
        if not mine.any():
            continue
        right_a, right_b = pred_a[mine] == k, pred_b[mine] == k
        a_only, b_only = int((right_a & ~right_b).sum()), int((right_b & ~right_a).sum())
        rows.append(
            {
                "class": name,
                "images": int(mine.sum()),
                "top1_a": float(right_a.mean()),
                "top1_b": float(right_b.mean()),
                "difference": float(right_b.mean() - right_a.mean()),
                "a_only": a_only,
                "b_only": b_only,
                "mcnemar_p": mcnemar_exact(a_only, b_only),
            }
        )
    return rows


def confusion_changes(
    labels: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray, names: list[str], *, top: int = 10
) -> list[dict]:
    """The (true, predicted) confusions whose counts differ most between A and B (wrong answers only), the
    largest change first: true, predicted, count of A, count of B."""
    classes = len(names)
    wrong_a, wrong_b = pred_a != labels, pred_b != labels
    count_a = np.bincount(labels[wrong_a] * classes + pred_a[wrong_a], minlength=classes * classes)
    count_b = np.bincount(labels[wrong_b] * classes + pred_b[wrong_b], minlength=classes * classes)
    changed = np.flatnonzero(count_a != count_b)
    order = changed[np.argsort(-np.abs(count_b - count_a)[changed], kind="stable")][:top]
    return [
        {"true": names[i // classes], "predicted": names[i % classes], "a": int(count_a[i]), "b": int(count_b[i])}
        for i in order
    ]


def paired_difference(a: np.ndarray, b: np.ndarray, *, seed: int = 0) -> dict:
    """Mean of a and of b over the images where both are known, the mean of b - a, and its 95% percentile
    bootstrap interval over those images resampled with replacement (`BOOTSTRAP_DRAWS` draws, seeded)."""
    known = ~(np.isnan(a) | np.isnan(b))
    a, b = a[known].astype(float), b[known].astype(float)
    if not len(a):
        return {"a": None, "b": None, "difference": None, "ci95": None, "images": 0}
    diff = b - a
    rng = np.random.default_rng(seed)
    # in chunks of 100 draws: the index array of all draws at once grows with the images (160 MB at 10k)
    means = np.concatenate(
        [diff[rng.integers(0, len(diff), (100, len(diff)))].mean(1) for _ in range(BOOTSTRAP_DRAWS // 100)]
    )
    low, high = np.percentile(means, [2.5, 97.5])
    return {
        "a": float(a.mean()),
        "b": float(b.mean()),
        "difference": float(diff.mean()),
        "ci95": [float(low), float(high)],
        "images": int(len(diff)),
    }
