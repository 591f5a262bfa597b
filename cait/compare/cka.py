"""Linear CKA (Kornblith et al. 2019) between every block of two models, with the minibatch estimator of
Nguyen, Raghu and Kornblith (2021): per minibatch of n >= 4 images the unbiased HSIC (Song et al. 2012) of each
pair of linear Gram matrices, summed over the minibatches; CKA is the summed HSIC(K, L) over the root of the
summed HSIC(K, K) and HSIC(L, L). Memory is that of one minibatch whatever the number of images, and sums of
shards add up exactly to the sum of one run over the same minibatches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

MIN_BATCH = 4  # the unbiased HSIC divides by n - 3: a smaller minibatch adds nothing


def unbiased_hsic(grams_k: torch.Tensor, grams_l: torch.Tensor) -> torch.Tensor:
    """The unbiased HSIC estimator of every pair of Gram matrices: grams_k [P, n, n], grams_l [Q, n, n] -> [P, Q].

    HSIC_1(K, L) = (tr(K~ L~) + 1'K~1 1'L~1 / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1) / (n(n-3)), K~ being K with its
    diagonal set to 0 (Song et al. 2012, eq. 5)."""
    n = grams_k.shape[-1]
    if n < MIN_BATCH:
        raise ValueError(f"the unbiased HSIC needs at least {MIN_BATCH} samples, got {n}")
    k = grams_k.double() * (1 - torch.eye(n, dtype=torch.float64, device=grams_k.device))
    l = grams_l.double() * (1 - torch.eye(n, dtype=torch.float64, device=grams_l.device))
    trace = k.flatten(1) @ l.flatten(1).T  # tr(K L) = sum of K * L for symmetric matrices
    sums = k.sum((1, 2))[:, None] * l.sum((1, 2))[None, :]
    rows = k.sum(2) @ l.sum(2).T  # 1'K L 1 = (K 1) . (L 1)
    return (trace + sums / ((n - 1) * (n - 2)) - rows * 2 / (n - 2)) / (n * (n - 3))


def linear_grams(features: torch.Tensor) -> torch.Tensor:
    """Linear-kernel Gram matrices X X' of features [P, n, d] (P blocks of n images) -> [P, n, n], in float64."""
    x = features.double()
    return x @ x.transpose(1, 2)


@dataclass
class HSICSums:
    """The minibatch HSIC sums of two models' blocks: cross [Ka, Kb], self_a [Ka], self_b [Kb], and how many
    minibatches they hold. Sums of disjoint sets of minibatches add (`+`), so shards merge exactly."""

    cross: np.ndarray
    self_a: np.ndarray
    self_b: np.ndarray
    batches: int = 0

    @classmethod
    def zeros(cls, blocks_a: int, blocks_b: int) -> "HSICSums":
        return cls(np.zeros((blocks_a, blocks_b)), np.zeros(blocks_a), np.zeros(blocks_b), 0)

    def __add__(self, other: "HSICSums") -> "HSICSums":
        return HSICSums(
            self.cross + other.cross,
            self.self_a + other.self_a,
            self.self_b + other.self_b,
            self.batches + other.batches,
        )

    def cka(self) -> np.ndarray:
        """CKA [Ka, Kb]: the summed cross HSIC over the root of the summed self HSICs (NaN before any minibatch,
        or for a block whose representation is constant)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.cross / np.sqrt(np.outer(self.self_a, self.self_b))


def minibatch_sums(features_a: torch.Tensor, features_b: torch.Tensor) -> HSICSums:
    """The HSIC sums of one minibatch: features_a [Ka, n, da] and features_b [Kb, n, db], the same n images in
    the same order (widths may differ). A minibatch of fewer than `MIN_BATCH` images gives empty sums."""
    Ka, n = features_a.shape[:2]
    Kb = features_b.shape[0]
    if features_b.shape[1] != n:
        raise ValueError(f"the two models' features hold {n} and {features_b.shape[1]} images")
    if n < MIN_BATCH:
        return HSICSums.zeros(Ka, Kb)
    ga, gb = linear_grams(features_a), linear_grams(features_b)
    cross = unbiased_hsic(ga, gb)
    self_a = torch.stack([unbiased_hsic(g[None], g[None])[0, 0] for g in ga])
    self_b = torch.stack([unbiased_hsic(g[None], g[None])[0, 0] for g in gb])
    return HSICSums(cross.cpu().numpy(), self_a.cpu().numpy(), self_b.cpu().numpy(), 1)
