"""A ViT that encodes each frame of a clip on its own (ALBEF's image encoder, applied to video).

ALBEF (arXiv 2107.07651, §3.1) encodes an image with a 12-layer ViT-B/16 initialised from DeiT (ImageNet-1k).
vlp trains and evaluates every family on the same frame shards, so a clip ``(B, T, 3, H, W)`` is encoded frame
by frame with the same ViT and pooled over time; a still image is a one-frame clip and is encoded exactly as
ALBEF encodes it.

Pooling over time (a choice of vlp; ALBEF has no video):

- the **feature** (what the contrastive loss projects) is the mean over frames of the per-frame [CLS]
  output: parameter-free, and for one frame it is ALBEF's [CLS];
- the **tokens** the multimodal encoder cross-attends to are, with ``temporal="concat"`` (default), every
  frame's ``1 + N`` tokens one after another, each frame's tokens plus a learned time embedding that starts
  at zero (so an image, or a clip before training, is encoded as ALBEF does), which keeps per-frame evidence
  and the order of frames for the fused objectives at ``T`` times the cross-attention keys; with
  ``temporal="mean"``, the tokens averaged over frames (``1 + N`` keys, no order), ALPRO's layout.

Parameter names are a timm ViT's (``cls_token``, ``pos_embed``, ``patch_embed.proj``, ``blocks.{i}.norm1/attn/
norm2/mlp``, ``norm``) plus ``time_embed``, so DeiT / ViT checkpoints (timm, or ALBEF's ``visual_encoder.*``
after the prefix is removed) load one to one, with ``pos_embed`` resized over the patch grid.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vlp.models.layers.blocks import Block, PatchEmbed, layer_norm, trunc_normal_
from vlp.models.layers.timesformer import read_vit_state_dict, resample_pos_embed, vit_size_problems

_IGNORED_PREFIXES = ("head.", "head_drop.", "fc_norm.", "head_dist.", "dist_token")


@dataclass(frozen=True)
class FrameViTConfig:
    """Size and initialisation of a :class:`FrameViT`.

    Attributes:
        img_size: frame side the position table is sized for (other sizes are interpolated on the fly).
        patch_size: patch side in pixels.
        num_frames: frames the time embedding is sized for (``temporal="concat"``; other counts interpolate it).
        width, depth, heads, mlp_ratio: the ViT's sizes (ViT-B/16: 768, 12, 12, 4).
        drop_path: stochastic depth of the last block (linear from 0; ALBEF pre-training: 0).
        temporal: ``"concat"`` or ``"mean"``: how frame tokens reach the multimodal encoder (module docstring).
        init: ``""`` random init; else a timm model name (hub access) or a local ViT / DeiT state dict file.
        init_revision: hub revision of a timm name's weights (branch, tag or commit; ``""`` = the default branch);
            the commit loaded is recorded in the model directory's lineage.
        pos_interp: how ``pos_embed`` is resized over the patch grid (``"bicubic"``, ``"bilinear"``, ``"nearest"``).
    """

    img_size: int = 224
    patch_size: int = 16
    num_frames: int = 4
    width: int = 768
    depth: int = 12
    heads: int = 12
    mlp_ratio: float = 4.0
    drop_path: float = 0.0
    temporal: Literal["concat", "mean"] = "concat"
    init: str = ""
    init_revision: str = ""
    pos_interp: str = "bicubic"

    def __post_init__(self) -> None:
        problems = vit_size_problems(self)
        if self.temporal not in ("concat", "mean"):
            problems.append(f"temporal={self.temporal!r} must be 'concat' or 'mean'")
        if problems:
            raise ValueError("invalid FrameViTConfig: " + "; ".join(problems))

    @property
    def grid(self) -> int:
        return self.img_size // self.patch_size

    @classmethod
    def tiny(cls, **overrides: Any) -> FrameViTConfig:
        """2 layers, width 64, 32 px frames in 8 px patches, 2 frames: seconds on a CPU (tests)."""
        return replace(cls(img_size=32, patch_size=8, num_frames=2, width=64, depth=2, heads=2), **overrides)

    @classmethod
    def paper(cls, **overrides: Any) -> FrameViTConfig:
        """ViT-B/16 from DeiT ImageNet-1k (ALBEF §3.1), at 224 px (ALBEF pre-trains at 256)."""
        return replace(cls(init="deit_base_patch16_224.fb_in1k"), **overrides)


@dataclass
class FrameOutput:
    """Outputs of :class:`FrameViT`.

    Attributes:
        cls: ``(B, C)`` the mean over frames of the per-frame [CLS] output (the feature to project).
        tokens: ``(B, S, C)`` what the multimodal encoder attends to: ``S = T * (1 + N)`` (concat) or ``1 + N``.
        frame_tokens: ``(B, T, 1 + N, C)`` every frame's normalised tokens.
    """

    cls: Tensor
    tokens: Tensor
    frame_tokens: Tensor


class FrameViT(nn.Module):
    """ViT over each frame: ``(B, T, 3, H, W)`` -> :class:`FrameOutput`."""

    def __init__(self, config: FrameViTConfig) -> None:
        super().__init__()
        self.config = config
        self.width = c = config.width
        g = config.grid
        self.patch_embed = PatchEmbed(config.patch_size, 3, c)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + g * g, c))
        self.time_embed = nn.Parameter(torch.zeros(1, config.num_frames, 1, c)) if config.temporal == "concat" else None
        rates = torch.linspace(0, config.drop_path, config.depth).tolist()
        self.blocks = nn.ModuleList(Block(c, config.heads, mlp_ratio=config.mlp_ratio, drop_path=r) for r in rates)
        self.norm = layer_norm(c)
        self.grad_checkpointing = False  # recompute each block in the backward (set_grad_checkpointing)
        trunc_normal_(self.pos_embed, std=0.02)
        trunc_normal_(self.cls_token, std=0.02)
        for m in self.blocks.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        if config.init:
            load_frame_vit_weights(self, config.init, config.init_revision)

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token", "time_embed"}

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Turn per-block activation recomputation on or off (training only, when gradients are recorded)."""
        self.grad_checkpointing = enable

    def forward(self, video: Tensor) -> FrameOutput:
        """``(B, T, 3, H, W)`` frames (H, W multiples of the patch size) -> :class:`FrameOutput`."""
        if video.ndim != 5 or video.shape[2] != 3:
            raise ValueError(f"FrameViT expects video of shape (B, T, 3, H, W), got {tuple(video.shape)}")
        b, t, _, h, w = video.shape
        p = self.config.patch_size
        if h % p or w % p or h < p or w < p:
            raise ValueError(f"frame size {h}x{w} is not a positive multiple of the patch size {p}")
        pos = resample_pos_embed(self.pos_embed, (h // p, w // p), self.config.pos_interp)  # (1, 1+N, C)
        x = self.patch_embed(video.flatten(0, 1))  # (B*T, N, C)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + pos  # (B*T, 1+N, C)
        for blk in self.blocks:
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        frames = self.norm(x).unflatten(0, (b, t))  # (B, T, 1+N, C)
        cls = frames[:, :, 0].mean(dim=1)  # (B, C)
        if self.time_embed is None:
            tokens = frames.mean(dim=1)  # (B, 1+N, C)
        else:
            time: Tensor = self.time_embed  # (1, T0, 1, C); another frame count interpolates it linearly over frames
            if time.shape[1] != t:
                time = F.interpolate(time[:, :, 0].transpose(1, 2), size=t, mode="linear", align_corners=False)
                time = time.transpose(1, 2)[:, :, None]  # (1, T, 1, C)
            tokens = (frames + time).flatten(1, 2)  # (B, T*(1+N), C)
        return FrameOutput(cls=cls, tokens=tokens, frame_tokens=frames)


def load_frame_vit_weights(model: FrameViT, source: str | os.PathLike[str], revision: str = "") -> list[str]:
    """Fill ``model`` from a timm ViT / DeiT state dict (file, or timm name at hub ``revision``); returns the
    ignored keys.

    ``pos_embed`` is resized over the patch grid; ``time_embed``, which no image checkpoint has, stays at zero.
    A distilled DeiT's distillation token and head are ignored; any other unknown key is an error.
    """
    state = read_vit_state_dict(source, revision)
    target = model.state_dict()
    ignored = sorted(k for k in state if k.startswith(_IGNORED_PREFIXES))
    unknown = sorted(k for k in state if k not in target and k not in ignored)
    if unknown:
        raise ValueError(f"checkpoint {str(source)!r} has parameters this ViT cannot hold: {unknown[:8]}")
    out = {k: v for k, v in state.items() if k in target}
    if "pos_embed" in out:
        g = model.config.grid
        out["pos_embed"] = resample_pos_embed(out["pos_embed"], (g, g), model.config.pos_interp)
    if model.time_embed is not None and "time_embed" not in out:
        out["time_embed"] = torch.zeros_like(target["time_embed"])
    missing = sorted(set(target) - set(out))
    wrong = [f"{k}: {tuple(out[k].shape)} vs {tuple(v.shape)}" for k, v in target.items()
             if k in out and out[k].shape != v.shape]  # fmt: skip
    if missing or wrong:
        raise ValueError(
            f"checkpoint {str(source)!r} does not fit the ViT (width={model.config.width}, depth="
            f"{model.config.depth}, patch={model.config.patch_size}): missing {missing[:8]}, mismatched {wrong[:4]}"
        )
    model.load_state_dict({k: v.to(target[k].dtype) for k, v in out.items()}, strict=True)
    return ignored
