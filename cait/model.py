"""CaiT: LayerScale + talking-heads self-attention + a class-attention stage (Touvron et al. 2021).

Parameter names follow the official deit `cait_models.py` and timm's `cait.py`, so published
checkpoints load with strict=True. `forward` is as plain as timm's; `forward_insights` returns the
same logits plus what the paper analyses (class attention, residual ratios, LayerScale), observed with
forward hooks (`cait.insights`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import CaiTConfig
from .insights import Insights, SAReduce, observe


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class TalkingHeadAttn(nn.Module):
    """Self-attention whose heads are mixed by linear maps before (proj_l) and after (proj_w) the softmax."""

    def __init__(self, dim: int, *, num_heads: int, qkv_bias: bool, talking_heads: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        # Without talking heads the mixing is the identity (kept as modules so ablations share code).
        self.proj_l = nn.Linear(num_heads, num_heads) if talking_heads else nn.Identity()
        self.proj_w = nn.Linear(num_heads, num_heads) if talking_heads else nn.Identity()
        # Points to observe with hooks (`forward_insights`), as timm's attn_drop is: softmax(proj_l(q k^T)) and
        # proj_w of that, the weights that multiply the values, each [B, heads, N, N].
        self.attn_softmax = nn.Identity()
        self.attn_mixed = nn.Identity()

    @torch.no_grad()
    def mixing_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(proj_l, proj_w) weights as [heads, heads] (row: output head, column: input head); identity
        matrices for a model built without talking heads. The biases are not included."""
        eye = torch.eye(self.num_heads, device=self.qkv.weight.device, dtype=self.qkv.weight.dtype)
        weight = lambda proj: proj.weight.detach().clone() if isinstance(proj, nn.Linear) else eye
        return weight(self.proj_l), weight(self.proj_w)

    def _mix(self, proj: nn.Module, attn: torch.Tensor) -> torch.Tensor:
        """Apply the [heads, heads] Linear `proj` across the head dim of attn [B, h, N, M]."""
        if isinstance(proj, nn.Identity):
            return attn
        B, h, N, M = attn.shape
        # One batched [h, h] @ [h, N*M] matmul keeps the maps contiguous; permuting heads to the last dim
        # for nn.Linear (timm's way) leaves strided maps that make the softmax slow (~2x on this step).
        return torch.baddbmm(
            proj.bias.view(1, h, 1).expand(B, h, 1), proj.weight.expand(B, h, h), attn.reshape(B, h, N * M)
        ).view(B, h, N, M)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = self.attn_softmax(self._mix(self.proj_l, attn).softmax(dim=-1))
        attn = self.attn_mixed(self._mix(self.proj_w, attn))
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class ClassAttn(nn.Module):
    """Attention where only the class token (index 0) queries; keys/values come from all tokens."""

    def __init__(self, dim: int, *, num_heads: int, qkv_bias: bool):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape  # x: the class token first, then the patch tokens
        heads = lambda t: t.reshape(B, -1, self.num_heads, C // self.num_heads).transpose(1, 2)
        q, k, v = heads(self.q(x[:, :1])), heads(self.k(x)), heads(self.v(x))
        x_cls = F.scaled_dot_product_attention(q, k, v)  # fused: the attention row is never formed
        return self.proj(x_cls.transpose(1, 2).reshape(B, 1, C))


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample during training."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = x.new_empty(x.shape[0], *([1] * (x.dim() - 1))).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


def _residual_weight(block: nn.Module, name: str, cfg: CaiTConfig) -> None:
    """Register the branch weight `name` (gamma_1 / gamma_2) as `cfg.residual_scale` asks."""
    kind = cfg.residual_scale
    if kind == "layerscale":  # full, not init_values * ones: that product on the meta device imports torch._dynamo
        block.register_parameter(name, nn.Parameter(torch.full((cfg.embed_dim,), cfg.init_values)))
    elif kind in ("scalar", "rezero"):
        block.register_parameter(name, nn.Parameter(torch.full((1,), cfg.init_values if kind == "scalar" else 0.0)))
    else:  # "none" (CaiTConfig admits only these four)
        block.register_buffer(name, torch.ones(1), persistent=False)


class _ScaledResidualBlock(nn.Module):
    """Shared body of SA and CA blocks: norm1 -> attn and norm2 -> mlp, each scaled by gamma."""

    def __init__(self, cfg: CaiTConfig, attn: nn.Module, mlp_ratio: float, drop_path: float):
        super().__init__()
        norm = (
            (lambda: nn.Identity())
            if cfg.residual_scale == "rezero"
            else (lambda: nn.LayerNorm(cfg.embed_dim, eps=1e-6))
        )
        self.norm1 = norm()
        self.attn = attn
        self.drop_path = DropPath(drop_path)
        self.norm2 = norm()
        self.mlp = Mlp(cfg.embed_dim, int(cfg.embed_dim * mlp_ratio))
        _residual_weight(self, "gamma_1", cfg)
        _residual_weight(self, "gamma_2", cfg)


class LayerScaleBlock(_ScaledResidualBlock):
    """Self-attention block over the patch tokens."""

    def __init__(self, cfg: CaiTConfig):
        attn = TalkingHeadAttn(
            cfg.embed_dim, num_heads=cfg.num_heads, qkv_bias=cfg.qkv_bias, talking_heads=cfg.talking_heads
        )
        super().__init__(cfg, attn, cfg.mlp_ratio, cfg.drop_path_rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.gamma_1 * self.attn(self.norm1(x)))
        return x + self.drop_path(self.gamma_2 * self.mlp(self.norm2(x)))


class LayerScaleBlockClassAttn(_ScaledResidualBlock):
    """Class-attention block: updates only the class token; patches are read, never changed."""

    def __init__(self, cfg: CaiTConfig):
        attn = ClassAttn(cfg.embed_dim, num_heads=cfg.num_heads, qkv_bias=cfg.qkv_bias)
        super().__init__(cfg, attn, cfg.mlp_ratio_token_only, 0.0)  # no stochastic depth in CA (official)

    def forward(self, x: torch.Tensor, x_cls: torch.Tensor) -> torch.Tensor:
        u = torch.cat((x_cls, x), dim=1)
        x_cls = x_cls + self.drop_path(self.gamma_1 * self.attn(self.norm1(u)))
        return x_cls + self.drop_path(self.gamma_2 * self.mlp(self.norm2(x_cls)))


class PatchEmbed(nn.Module):
    def __init__(self, cfg: CaiTConfig):
        super().__init__()
        self.proj = nn.Conv2d(cfg.in_chans, cfg.embed_dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # [B, N, d]


class CaiT(nn.Module):
    def __init__(self, cfg: CaiTConfig, *, init_weights: bool = True):
        """init_weights=False leaves timm's truncated-normal init out, for weights about to be loaded (it is
        most of the construction time)."""
        super().__init__()
        self.cfg = cfg
        d = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg)
        if cfg.has_class_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        else:  # average pooling, no class token: a constant stand-in keeps the [B, 1+N, d] layout readers index
            self.register_buffer("cls_token", torch.zeros(1, 1, d), persistent=False)
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_patches, d))  # patches only: the class token
        self.blocks = nn.ModuleList([LayerScaleBlock(cfg) for _ in range(cfg.depth)])  # joins after SA
        self.blocks_token_only = nn.ModuleList([LayerScaleBlockClassAttn(cfg) for _ in range(cfg.depth_token_only)])
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(d, cfg.num_classes)
        if init_weights:
            self._init_weights()

    def _init_weights(self) -> None:
        if self.pos_embed.is_meta:
            return
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)  # the stand-in too: the later weights' draws stay as they were
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward_self_attention(self, x: torch.Tensor) -> torch.Tensor:
        """Image [B, C, H, W] -> tokens after the SA stage: the N patch tokens [B, N, d] (in the ViT-style
        ablation, where the class token joins the SA stage, [B, 1+N, d] with it first)."""
        return self.forward_sa_blocks(self.patch_embed(x) + self.pos_embed)

    def forward_sa_blocks(self, x: torch.Tensor, *, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Tokens entering SA block `start` -> tokens leaving block `stop` - 1 (default: the last), so that
        explanations can cache a prefix of the stage and re-run only its suffix."""
        stop = len(self.blocks) if stop is None else stop
        for i in range(start, stop):
            if i == self.cfg.class_token_at:  # ablation only: ViT-style class token, in the SA blocks from here on
                x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
            x = self.blocks[i](x)
        return x

    def forward_class_attention(
        self, x: torch.Tensor, *, start: int = 0, cls: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Tokens after the SA stage -> normalised tokens [B, 1+N, d] (class token first): the class
        token, inserted here, reads the frozen patch tokens through the CA blocks. `cls` [B, 1, d] entering
        CA block `start` resumes the stage there (explanations re-running only its suffix)."""
        if self.cfg.class_token_at is not None:
            return self.norm(x)
        cls = self.cls_token.expand(x.shape[0], -1, -1) if cls is None else cls
        for blk in self.blocks_token_only[start:]:
            cls = blk(x, cls)
        return self.norm(torch.cat((cls, x), dim=1))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Image [B, C, H, W] -> normalised tokens [B, 1+N, d] (class token first)."""
        return self.forward_class_attention(self.forward_self_attention(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(x[:, 1:].mean(dim=1) if self.cfg.global_pool == "avg" else x[:, 0])
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_insights(
        self,
        x: torch.Tensor,
        *,
        sa_layers: tuple[int, ...] = (),
        raw_attention: bool = False,
        sa_reduce: SAReduce | None = None,
    ) -> Insights:
        """Logits plus class-attention maps, residual-branch ratios, LayerScale weights and, for the
        SA layers in `sa_layers`, the self-attention around the talking-heads mixing (with
        raw_attention=True also the unmixed per-head softmax, see `Insights`); sa_reduce(before, after), when
        given, is kept per layer instead of the two maps, each called as its layer runs. The pass is `forward`
        itself, observed with hooks (`cait.insights`): the same logits."""
        return observe(self, x, sa_layers=sa_layers, raw_attention=raw_attention, sa_reduce=sa_reduce)

    @torch.no_grad()
    def layerscale(self) -> dict[str, torch.Tensor]:
        """LayerScale weights per depth: {"sa_gamma_1": [depth, d'], ...} (d'=1 for scalar ablations)."""

        def stack(blocks: nn.ModuleList, name: str) -> torch.Tensor:
            if not len(blocks):
                return torch.zeros(0, 1)
            return torch.stack([getattr(b, name).detach().float().cpu() for b in blocks])

        return {
            f"{stage}_{g}": stack(blocks, g)
            for stage, blocks in (("sa", self.blocks), ("ca", self.blocks_token_only))
            for g in ("gamma_1", "gamma_2")
        }

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops(self, img_size: int | None = None) -> int:
        """Multiply-accumulates of one forward pass (the paper's / fvcore's FLOPs convention), counting
        linear layers, convolutions and attention matmuls; norms, softmax and activations are ignored."""
        cfg = self.cfg
        d, h, n = cfg.embed_dim, cfg.num_heads, ((img_size or cfg.img_size) // cfg.patch_size) ** 2
        patch = n * d * cfg.in_chans * cfg.patch_size**2

        def sa(t: int) -> int:  # one SA block over t tokens
            mix = 2 * h * h * t * t if cfg.talking_heads else 0
            return t * 3 * d * d + 2 * t * t * d + mix + t * d * d + 2 * t * d * int(d * cfg.mlp_ratio)

        # A ViT-style class token (ablations) makes every SA block from `class_token_at` on see 1+N tokens.
        insert_at = cfg.depth if cfg.class_token_at is None else cfg.class_token_at
        sa_total = sum(sa(n if i < insert_at else n + 1) for i in range(cfg.depth))
        return patch + sa_total + self.class_stage_flops(img_size)

    def class_stage_flops(self, img_size: int | None = None) -> int:
        """Multiply-accumulates of the class stage and head alone on the SA stage's patch tokens (part of
        `flops`): what each re-run of it costs (the logit lens, token patching)."""
        cfg = self.cfg
        d, n = cfg.embed_dim, ((img_size or cfg.img_size) // cfg.patch_size) ** 2
        # CA: q and the output projection on the class token; k, v over 1+N tokens; one query row.
        ca = d * d + 2 * (n + 1) * d * d + 2 * (n + 1) * d + d * d + 2 * d * int(d * cfg.mlp_ratio_token_only)
        return cfg.depth_token_only * ca + d * cfg.num_classes


def resize_pos_embed(pos_embed: torch.Tensor, new_grid: int) -> torch.Tensor:
    """Bicubic resampling of a patch position embedding [1, g*g, d] to [1, new_grid^2, d] (DeiT's rule
    for fine-tuning or testing at another resolution)."""
    old_grid = int(round(pos_embed.shape[1] ** 0.5))
    if old_grid == new_grid:
        return pos_embed
    grid = pos_embed.reshape(1, old_grid, old_grid, -1).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=(new_grid, new_grid), mode="bicubic", align_corners=False)
    return grid.permute(0, 2, 3, 1).reshape(1, new_grid * new_grid, -1).to(pos_embed.dtype)
