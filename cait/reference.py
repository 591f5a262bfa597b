"""timm's CaiT built with one of our configs: the independent reference that tests and benchmarks
compare our model against (same parameter names, so the same state dict loads into both)."""

from __future__ import annotations

import torch
from torch import nn

from .config import CaiTConfig


def timm_cait(cfg: CaiTConfig, weights: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """timm's `Cait` with the architecture of `cfg` in eval mode: timm's own init, or a copy of `weights`."""
    from timm.models.cait import Cait

    kwargs = dict(
        img_size=cfg.img_size,
        patch_size=cfg.patch_size,
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        embed_dim=cfg.embed_dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        init_values=cfg.init_values,
        depth_token_only=cfg.depth_token_only,
        mlp_ratio=cfg.mlp_ratio,
        mlp_ratio_token_only=cfg.mlp_ratio_token_only,
        qkv_bias=cfg.qkv_bias,
        drop_path_rate=cfg.drop_path_rate,
    )
    if weights is None:
        return Cait(**kwargs).eval()
    with torch.device("meta"):  # timm's init would be overwritten anyway
        twin = Cait(**kwargs)
    twin.load_state_dict({k: v.detach().clone() for k, v in weights.items()}, strict=True, assign=True)
    return twin.eval()
