"""The ViT parts ALPRO's TimeSformer and ALBEF's ViT are built from, written here: timm's (1.0) ``Attention``, ``Mlp``,
``DropPath``, ``PatchEmbed`` and ViT ``Block``, as those encoders configure them.

Parameter names, construction order (a seeded build draws the same random numbers) and arithmetic (the same
operations in the same order: the same bits forward and backward) are timm's; ``tests/test_vit_blocks.py`` compares
them with timm's modules. Importing ``timm.layers`` costs about 1.2 s of start-up (it pulls ``torch._dynamo``) in
every process that builds a model; this module imports torch alone. Only what the encoders use is here: fused
attention (``F.scaled_dot_product_attention``, timm's default; in bf16 on the CPU explicit matmuls, which are faster
there: :mod:`vlp.models.layers.attention`), no QK norm, layer scale, masks or gating; timm's
``LayerNorm`` is ``nn.LayerNorm`` with eps 1e-6 (timm's, without its fast-norm option, off by default);
``trunc_normal_`` draws as timm's (torch's ``nn.init.trunc_normal_`` draws otherwise).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from vlp.models.layers.attention import attend

__all__ = ["Attention", "Block", "DropPath", "Mlp", "PatchEmbed", "layer_norm", "trunc_normal_"]


@torch.no_grad()
def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0) -> Tensor:
    """Fill ``tensor`` in place from N(``mean``, ``std``) truncated to ``[a, b]``, by the inverse CDF of a uniform
    draw, as timm does; returns it."""

    def cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    low, high = cdf((a - mean) / std), cdf((b - mean) / std)
    tensor.uniform_(2 * low - 1, 2 * high - 1)
    tensor.erfinv_()
    tensor.mul_(std * math.sqrt(2.0))
    tensor.add_(mean)
    return tensor.clamp_(min=a, max=b)


def layer_norm(dim: int) -> nn.LayerNorm:
    """timm's ViT LayerNorm: eps 1e-6."""
    return nn.LayerNorm(dim, eps=1e-6)


class Attention(nn.Module):
    """Multi-head self-attention with one ``qkv`` projection and an output ``proj``."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by heads {num_heads}")
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        x = attend(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    """``fc1``, GELU, ``fc2``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class DropPath(nn.Module):
    """Stochastic depth: in training, each sample's branch is zeroed with probability ``drop_prob`` and the kept
    ones scaled by ``1 / (1 - drop_prob)`` (one Bernoulli draw per sample, as timm draws)."""

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: Tensor) -> Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1 - self.drop_prob
        kept = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        if keep > 0.0:
            kept.div_(keep)
        return x * kept

    def extra_repr(self) -> str:
        return f"drop_prob={round(self.drop_prob, 3):0.3f}"


class PatchEmbed(nn.Module):
    """Images ``(B, 3, H, W)`` -> patch tokens ``(B, H*W/P^2, C)`` by a ``P x P`` convolution of stride ``P``; any
    ``H``, ``W`` that are multiples of ``P``."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        H, W = x.shape[-2:]
        if H % self.patch_size or W % self.patch_size:
            raise ValueError(f"frames of {H}x{W} px are not a multiple of the patch size {self.patch_size}")
        return self.proj(x).flatten(2).transpose(1, 2)


class Block(nn.Module):
    """A pre-norm ViT block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``, each branch through stochastic
    depth."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, drop_path: float = 0.0) -> None:
        super().__init__()
        self.norm1 = layer_norm(dim)
        self.attn = Attention(dim, num_heads)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = layer_norm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))
