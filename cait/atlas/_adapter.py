"""TEMPORARY stand-in for cait.data.read_images until the reader is merged (scenes only)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from ..data import build_dataset
from ..preprocess import EvalImages


class _Model:
    def __init__(self, cfg):
        self.cfg = cfg


class ImageSet(Dataset):
    def __init__(self, cfg, limit):
        base = build_dataset("fashion-mnist-scenes", "val", subset=limit, cache=True)
        self.ev = EvalImages(base, _Model(cfg), normalise=False)
        self.name = f"fashion-mnist-scenes val, first {len(base)}"
        self.paths = [f"scene-{i:05d}" for i in range(len(base))]
        self.labels = torch.tensor([base[i][1] for i in range(len(base))])
        self.boxes = self.ev.boxes
        self.classes = list(base.classes)

    def __len__(self):
        return len(self.ev)

    def __getitem__(self, i):
        x, y, box = self.ev[i]
        return x, y, box, i, True


def read_images(data, cfg, *, split="val", boxes=None, limit=None, normalise=True, **kw):
    return ImageSet(cfg, limit)
