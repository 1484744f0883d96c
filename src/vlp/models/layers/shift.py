"""Token shift between adjacent frames (TS2-Net §3.1), parameter-free, on ``(B * T, N + 1, C)`` token tensors.

Index 0 of every frame is [CLS]; frames of one clip are consecutive along dim 0. Three rules, all keeping the
edge frames' own tokens where they have no neighbour (the released code; the paper's Fig. 3 draws padding):

- ``code`` (released code): positions from the token count alone, stride ``(N + 1) // 7``; frame t takes
  positions ``1, 1 + stride, ...`` from frame t - 1 and ``4, 4 + stride, ...`` from frame t + 1. At ViT-B/32's
  49 patches that is 7 + 7 positions (29%), at ViT-B/16's 196 also 7 + 7 (7%).
- ``paper``: ``round(ratio * N)`` patch positions (the paper's best ratio is 25%), spread evenly over the patch
  grid, alternately taken from the previous and the next frame. [CLS] never moves.
- ``channel``: the Shift-ViT baseline of the paper's Table 2: the first ``C // channel_div`` channels of every
  token (the [CLS] too) come from frame t - 1, the next ``C // channel_div`` from frame t + 1.

Where the shift sits is the model's business (:mod:`vlp.models.ts2net` shifts the attention input of chosen
blocks; the residual carries the unshifted tokens). LayerNorm acts per token, so shifting whole tokens commutes
with it: shifting a block's input before or after its first LayerNorm is the same (``token`` rules; a test proves
it). A channel shift does not commute with it.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

ShiftMode = Literal["code", "paper", "channel"]
MODES = ("code", "paper", "channel")


def shift_positions(num_tokens: int, mode: ShiftMode, ratio: float = 0.25) -> tuple[Tensor, Tensor]:
    """``(from_previous, from_next)`` token positions (1-based patch indices; 0 is [CLS]) of a token rule.

    Args:
        num_tokens: ``N + 1``, the [CLS] included.
        mode: ``code`` or ``paper``.
        ratio: ``paper`` only: the share of the ``N`` patch tokens that move (half each way).
    """
    patches = num_tokens - 1
    if patches < 1:
        raise ValueError(f"need at least one patch token besides [CLS], got {num_tokens} tokens")
    if mode == "code":
        stride = max(1, num_tokens // 7)
        return torch.arange(1, num_tokens, stride), torch.arange(4, num_tokens, stride)
    if mode != "paper":
        raise ValueError(f"token shift positions exist for 'code' and 'paper', not {mode!r}")
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"shift ratio must be in (0, 1], got {ratio}")
    count = max(1, round(ratio * patches))
    picks = torch.tensor([1 + (j * patches) // count for j in range(count)])  # distinct, evenly spread
    return picks[0::2], picks[1::2]


def token_shift(x: Tensor, frames: int, mode: ShiftMode, ratio: float = 0.25, channel_div: int = 8) -> Tensor:
    """Shift tokens of ``x`` (``(B * frames, N + 1, C)``) between adjacent frames of each clip; a new tensor.

    Raises:
        ValueError: a leading size that ``frames`` does not divide, or an unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"unknown shift mode {mode!r}; choose one of {MODES}")
    if frames < 1 or x.shape[0] % frames:
        raise ValueError(f"{x.shape[0]} frame rows are not clips of {frames} frames")
    if frames == 1:
        return x
    clips = x.reshape(x.shape[0] // frames, frames, *x.shape[1:])  # (B, T, N + 1, C)
    out = clips.clone()
    if mode == "channel":
        fold = x.shape[-1] // channel_div
        if fold < 1:
            raise ValueError(f"channel_div {channel_div} leaves no channel of {x.shape[-1]} to shift")
        out[:, 1:, :, :fold] = clips[:, :-1, :, :fold]
        out[:, :-1, :, fold : 2 * fold] = clips[:, 1:, :, fold : 2 * fold]
    else:
        left, right = (p.to(x.device) for p in shift_positions(x.shape[1], mode, ratio))
        out[:, 1:, left] = clips[:, :-1, left]
        out[:, :-1, right] = clips[:, 1:, right]
    return out.reshape(x.shape)
