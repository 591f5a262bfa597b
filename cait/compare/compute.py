"""A comparison's numbers for one batch of images, each model seeing them through its own preprocessing: the
atlas's per-image numbers of each (`cait.atlas.compute.batch_numbers`, their one owner) from the same forward
pass that records every block's representation (`cait.explain.hooks.recorded`), the minibatch HSIC sums of CKA
between the blocks, and per image the similarity of every head of A with every head of B."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from ..atlas.compute import batch_numbers
from ..explain.causal import block_names
from ..explain.hooks import recorded
from ..preprocess import normalise
from .cka import minibatch_sums
from .heads import map_similarity

KEPT = ("prediction", "probability", "entropy", "dla", "pointing", "mass_in_box", "box_share")  # per image, per side


class PairedImages(Dataset):
    """The same images as two models see them: item i is (pixels_a, pixels_b, label, box_a, box_b, i, ok), ok
    when both read. Labels come from side A (the two share their classes: the run checks it first)."""

    def __init__(self, images_a: Dataset, images_b: Dataset):
        self.a, self.b = images_a, images_b

    def __len__(self) -> int:
        return len(self.a)

    def __getitem__(self, i: int):
        xa, label, box_a, _, ok_a = self.a[i]
        xb, _, box_b, _, ok_b = self.b[i]
        return xa, xb, label, box_a, box_b, i, ok_a and ok_b


def block_representations(model: nn.Module, seen: dict) -> torch.Tensor:
    """Per block in model order [K, B, d]: the mean patch token after each SA block, the class token after each
    CA block, from the block outputs `recorded` kept."""
    rows = []
    for name in block_names(model):
        out = seen[name].float()
        rows.append(out.mean(1) if name.startswith("blocks.") else out[:, 0])
    return torch.stack(rows)


def side_numbers(model: nn.Module, pixels: torch.Tensor, boxes: torch.Tensor, *, dtype) -> tuple[dict, torch.Tensor]:
    """One model's atlas numbers of a batch of unnormalised pixels (with the CA maps) and its block
    representations [K, B, d], from one forward pass."""
    points = {name: (model.get_submodule(name), False) for name in block_names(model)}
    with recorded(points) as seen:
        numbers = batch_numbers(
            model, normalise(pixels, model.cfg), boxes, knockouts=False, dtype=dtype, keep_maps=True
        )
    return numbers, block_representations(model, seen)


def pair_numbers(
    model_a: nn.Module, model_b: nn.Module, batch: tuple, *, device: torch.device, dtype=None
) -> dict[str, np.ndarray]:
    """Everything a shard keeps of one batch of `PairedImages`: index, label and skipped; per side
    (prefix a_ / b_) the `KEPT` atlas numbers; head_similarity [B, Ha, Hb] per image; and this minibatch's
    HSIC sums (hsic_cross [1, Ka, Kb], hsic_a [1, Ka], hsic_b [1, Kb]; no row for a minibatch under 4 images)."""
    xa, xb, label, box_a, box_b, index, ok = batch
    rows = {"index": index[ok].numpy(), "label": label[ok].numpy(), "skipped": index[~ok].numpy()}
    if not ok.any():
        return rows
    na, fa = side_numbers(model_a, xa[ok].to(device), box_a[ok], dtype=dtype)
    nb, fb = side_numbers(model_b, xb[ok].to(device), box_b[ok], dtype=dtype)
    rows |= {f"a_{k}": na[k] for k in KEPT} | {f"b_{k}": nb[k] for k in KEPT}
    size = max(model_a.cfg.img_size, model_b.cfg.img_size)
    similarity = map_similarity(torch.from_numpy(na["maps"]), torch.from_numpy(nb["maps"]), size=size)
    rows["head_similarity"] = similarity.float().numpy()
    sums = minibatch_sums(fa, fb)
    if sums.batches:
        rows |= {"hsic_cross": sums.cross[None], "hsic_a": sums.self_a[None], "hsic_b": sums.self_b[None]}
    return rows
