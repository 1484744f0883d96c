"""Prompting entity modelling (PEM, ALPRO eq. 4-5): crop boxes, pseudo-labels, pooling and the loss.

Pipeline of one step (the model code glues these together):

1. :func:`sample_pem_boxes` draws one box per clip on the patch grid (the same box for every
   frame) -> a token mask for pooling and pixel boxes for cropping.
2. :func:`crop_frames` cuts the box out of the frames for the frozen prompter.
3. :func:`pseudo_labels` turns the prompter's crop feature and the prompt bank into the soft
   entity label ``q = softmax(s / tau)`` (eq. 4); :func:`pem_keep_mask` applies the discard rule.
4. :func:`pool_box_tokens` mean-pools the fused video tokens inside the box; an MLP (model code)
   predicts entity logits; :func:`pem_loss` is the soft cross-entropy (eq. 5) over kept crops.

Box geometry. The paper gives only the area (30-50% of the frame). The ALPRO code
(``random_erase`` in ``src/datasets/dataset_pretrain_sparse.py``) also draws an aspect ratio
``r = height / width`` uniformly in ``[0.3, 1/0.3]`` and floors the box to the 16-pixel patch
grid, so its snapped area can fall below 30% and is never re-checked. Here a candidate
``(area, ratio)`` is drawn, converted to grid cells (``h = round(sqrt(a * gh * gw * r))``,
``w = round(sqrt(a * gh * gw / r))``), and *accepted only if the snapped box still has its area in
``area`` and its aspect in ``ratio`` and fits the grid*; otherwise it is re-drawn (up to
``max_tries`` candidates, drawn at once). If none is accepted (only on very small grids), the box
size is drawn uniformly among all grid sizes that satisfy both ranges, and when no grid size does
(e.g. a 1x1 grid) the size nearest to the ranges is used (distance = area gap + log-aspect gap).
The position is uniform over all placements that fit. ``ratio_dist="log_uniform"`` samples the
ratio symmetrically in log space (torchvision style) instead of the code's uniform draw, which
makes tall boxes (``r > 1``) about three times as likely as wide ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "Box",
    "PemBoxes",
    "box_token_mask",
    "crop_frames",
    "pem_keep_mask",
    "pem_loss",
    "pool_box_tokens",
    "pseudo_labels",
    "sample_pem_box",
    "sample_pem_boxes",
]

_EPS = 1e-9


@dataclass(frozen=True)
class Box:
    """An axis-aligned box; in patch-grid cells unless converted with :meth:`to_pixels`."""

    top: int
    left: int
    height: int
    width: int

    @property
    def area(self) -> int:
        """Number of cells (or pixels) inside the box."""
        return self.height * self.width

    def to_pixels(self, patch_size: int) -> Box:
        """The same box in pixels of a frame whose patches are ``patch_size`` square."""
        p = patch_size
        return Box(self.top * p, self.left * p, self.height * p, self.width * p)


@dataclass(frozen=True)
class PemBoxes:
    """A batch of PEM boxes.

    Attributes:
        boxes: ``(B, 4)`` int64 ``[top, left, height, width]`` in grid cells.
        token_mask: ``(B, grid_h * grid_w)`` bool, True for patch tokens inside the box (row-major).
        pixel_boxes: ``(B, 4)`` int64 ``[top, left, height, width]`` in pixels (``boxes * patch_size``).
    """

    boxes: Tensor
    token_mask: Tensor
    pixel_boxes: Tensor


def _check_ranges(grid_h: int, grid_w: int, area: tuple[float, float], ratio: tuple[float, float]) -> None:
    if grid_h < 1 or grid_w < 1:
        raise ValueError(f"grid must be at least 1x1, got {grid_h}x{grid_w}")
    if not 0 < area[0] <= area[1] <= 1:
        raise ValueError(f"area must satisfy 0 < lo <= hi <= 1 (fractions of the frame), got {area}")
    if not 0 < ratio[0] <= ratio[1]:
        raise ValueError(f"ratio (height / width) must satisfy 0 < lo <= hi, got {ratio}")


def _valid_sizes(h: Tensor, w: Tensor, grid_h: int, grid_w: int, area: tuple, ratio: tuple) -> Tensor:
    frac = (h * w).double() / (grid_h * grid_w)
    aspect = h.double() / w.double().clamp(min=1)
    return (
        (h >= 1)
        & (w >= 1)
        & (h <= grid_h)
        & (w <= grid_w)
        & (frac >= area[0] - _EPS)
        & (frac <= area[1] + _EPS)
        & (aspect >= ratio[0] - _EPS)
        & (aspect <= ratio[1] + _EPS)
    )


def _fallback_sizes(grid_h: int, grid_w: int, area: tuple, ratio: tuple) -> Tensor:
    """All grid sizes satisfying both ranges, else the nearest ones: ``(K, 2)`` int64 ``[h, w]``."""
    hh, ww = torch.meshgrid(torch.arange(1, grid_h + 1), torch.arange(1, grid_w + 1), indexing="ij")
    hh, ww = hh.reshape(-1), ww.reshape(-1)  # (grid_h * grid_w,)
    ok = _valid_sizes(hh, ww, grid_h, grid_w, area, ratio)
    if not ok.any():
        frac = (hh * ww).double() / (grid_h * grid_w)
        log_aspect = (hh.double() / ww.double()).log()
        gap_area = (area[0] - frac).clamp(min=0) + (frac - area[1]).clamp(min=0)
        lo, hi = math.log(ratio[0]), math.log(ratio[1])
        gap_ratio = (lo - log_aspect).clamp(min=0) + (log_aspect - hi).clamp(min=0)
        score = gap_area + gap_ratio
        ok = score <= score.min() + _EPS
    return torch.stack([hh[ok], ww[ok]], dim=1)


def _draw_sizes(
    batch: int, grid_h: int, grid_w: int, area: tuple, ratio: tuple, ratio_dist: str, tries: int, gen: Any
) -> Tensor:
    n = grid_h * grid_w
    a = area[0] + (area[1] - area[0]) * torch.rand(batch, tries, generator=gen, dtype=torch.float64)  # (B, K)
    u = torch.rand(batch, tries, generator=gen, dtype=torch.float64)  # (B, K)
    if ratio_dist == "uniform":
        r = ratio[0] + (ratio[1] - ratio[0]) * u
    elif ratio_dist == "log_uniform":
        r = torch.exp(math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u)
    else:
        raise ValueError(f"ratio_dist must be 'uniform' or 'log_uniform', got {ratio_dist!r}")
    h = torch.round(torch.sqrt(a * n * r)).long()  # (B, K)
    w = torch.round(torch.sqrt(a * n / r)).long()  # (B, K)
    valid = _valid_sizes(h, w, grid_h, grid_w, area, ratio)  # (B, K)
    first = valid.int().argmax(dim=1, keepdim=True)  # (B, 1), first accepted candidate
    sizes = torch.cat([h.gather(1, first), w.gather(1, first)], dim=1)  # (B, 2)
    missing = ~valid.any(dim=1)  # (B,)
    if missing.any():
        options = _fallback_sizes(grid_h, grid_w, area, ratio)  # (K', 2)
        pick = torch.randint(options.shape[0], (int(missing.sum()),), generator=gen)
        sizes[missing] = options[pick]
    return sizes


def box_token_mask(boxes: Tensor, grid_h: int, grid_w: int) -> Tensor:
    """Boolean mask of the patch tokens inside each box.

    Args:
        boxes: ``(B, 4)`` ``[top, left, height, width]`` in grid cells.
        grid_h: patch rows.
        grid_w: patch columns.

    Returns:
        ``(B, grid_h * grid_w)`` bool in row-major patch order (token ``i * grid_w + j`` is cell ``(i, j)``),
        the order of the patch tokens after the [CLS] token in a ViT/TimeSformer.
    """
    top, left, h, w = (boxes[:, k, None, None] for k in range(4))  # each (B, 1, 1)
    rows = torch.arange(grid_h, device=boxes.device)[None, :, None]  # (1, gh, 1)
    cols = torch.arange(grid_w, device=boxes.device)[None, None, :]  # (1, 1, gw)
    inside = (rows >= top) & (rows < top + h) & (cols >= left) & (cols < left + w)  # (B, gh, gw)
    return inside.reshape(boxes.shape[0], grid_h * grid_w)


def sample_pem_boxes(
    batch_size: int,
    grid_h: int,
    grid_w: int,
    *,
    patch_size: int = 16,
    area: tuple[float, float] = (0.3, 0.5),
    ratio: tuple[float, float] = (0.3, 1 / 0.3),
    ratio_dist: Literal["uniform", "log_uniform"] = "uniform",
    max_tries: int = 64,
    generator: torch.Generator | None = None,
) -> PemBoxes:
    """Draw one PEM box per clip, snapped to the patch grid (see the module docstring for the rules).

    Args:
        batch_size: number of clips ``B``.
        grid_h: patch rows of a frame (``H // patch_size``).
        grid_w: patch columns of a frame (``W // patch_size``).
        patch_size: patch side in pixels, for ``pixel_boxes``.
        area: accepted box area as a fraction of the frame (paper: 30-50%).
        ratio: accepted aspect ratio ``height / width`` (ALPRO code: ``[0.3, 1/0.3]``).
        ratio_dist: ``"uniform"`` (ALPRO code) or ``"log_uniform"`` draw of the ratio.
        max_tries: candidates drawn per clip before the fallback.
        generator: optional CPU ``torch.Generator``.

    Returns:
        :class:`PemBoxes` on the CPU.
    """
    _check_ranges(grid_h, grid_w, area, ratio)
    if batch_size < 1 or max_tries < 1:
        raise ValueError(f"batch_size and max_tries must be >= 1, got {batch_size} and {max_tries}")
    sizes = _draw_sizes(batch_size, grid_h, grid_w, area, ratio, ratio_dist, max_tries, generator)  # (B, 2)
    h, w = sizes[:, 0], sizes[:, 1]
    u = torch.rand(batch_size, 2, generator=generator, dtype=torch.float64)  # (B, 2)
    top = (u[:, 0] * (grid_h - h + 1)).floor().long().clamp(max=grid_h - h)
    left = (u[:, 1] * (grid_w - w + 1)).floor().long().clamp(max=grid_w - w)
    boxes = torch.stack([top, left, h, w], dim=1)  # (B, 4)
    return PemBoxes(boxes=boxes, token_mask=box_token_mask(boxes, grid_h, grid_w), pixel_boxes=boxes * patch_size)


def sample_pem_box(
    grid_h: int,
    grid_w: int,
    *,
    area: tuple[float, float] = (0.3, 0.5),
    ratio: tuple[float, float] = (0.3, 1 / 0.3),
    ratio_dist: Literal["uniform", "log_uniform"] = "uniform",
    max_tries: int = 64,
    generator: torch.Generator | None = None,
) -> Box:
    """One box in grid cells; the single-clip form of :func:`sample_pem_boxes` (same distribution)."""
    out = sample_pem_boxes(
        1, grid_h, grid_w, area=area, ratio=ratio, ratio_dist=ratio_dist, max_tries=max_tries, generator=generator
    )
    top, left, h, w = (int(v) for v in out.boxes[0])
    return Box(top, left, h, w)


def crop_frames(
    frames: Tensor,
    pixel_boxes: Tensor,
    *,
    mode: Literal["resize", "zero_outside"] = "resize",
    size: tuple[int, int] | None = None,
    fill: Tensor | None = None,
) -> Tensor:
    """Cut each clip's box out of all its frames, for the prompter.

    Args:
        frames: ``(B, T, C, H, W)`` float frames.
        pixel_boxes: ``(B, 4)`` ``[top, left, height, width]`` in pixels.
        mode: ``"resize"`` crops and bilinearly resizes the box to ``size`` (a real crop, as the paper
            describes; equal to ``F.interpolate`` of the cropped pixels, vectorised with ``grid_sample``);
            ``"zero_outside"`` keeps the frame size and sets everything outside the box to ``fill``,
            which is what the ALPRO code feeds its prompter (``random_erase`` zeroes the raw pixels).
        size: output ``(H', W')`` for ``"resize"``; defaults to ``(H, W)``.
        fill: ``(C,)`` values outside the box for ``"zero_outside"``; None = 0. The frames are normalised,
            so the code's black is ``-mean / std`` per channel (:meth:`vlp.models.alpro.model.AlproConfig.black`).

    Returns:
        ``(B, T, C, H', W')`` frames.
    """
    if frames.ndim != 5 or pixel_boxes.shape != (frames.shape[0], 4):
        raise ValueError(
            f"expected frames (B, T, C, H, W) and boxes (B, 4), got {tuple(frames.shape)}, {tuple(pixel_boxes.shape)}"
        )
    b, t, c, height, width = frames.shape
    boxes = pixel_boxes.to(frames.device)
    if mode == "zero_outside":
        top, left, h, w = (boxes[:, k, None, None] for k in range(4))  # each (B, 1, 1)
        rows = torch.arange(height, device=frames.device)[None, :, None]
        cols = torch.arange(width, device=frames.device)[None, None, :]
        inside = (rows >= top) & (rows < top + h) & (cols >= left) & (cols < left + w)  # (B, H, W)
        outside = torch.zeros(c, dtype=frames.dtype, device=frames.device) if fill is None else fill.to(frames)
        return torch.where(inside[:, None, None], frames, outside.view(1, 1, c, 1, 1))
    if mode != "resize":
        raise ValueError(f"mode must be 'resize' or 'zero_outside', got {mode!r}")
    out_h, out_w = size or (height, width)
    top, left, h, w = (boxes[:, k].to(frames.dtype) for k in range(4))  # each (B,)
    theta = torch.zeros(b, 2, 3, dtype=frames.dtype, device=frames.device)  # (B, 2, 3) output -> input coords
    theta[:, 0, 0] = w / width
    theta[:, 0, 2] = (2 * left + w) / width - 1
    theta[:, 1, 1] = h / height
    theta[:, 1, 2] = (2 * top + h) / height - 1
    theta = theta.repeat_interleave(t, dim=0)  # (B*T, 2, 3)
    grid = F.affine_grid(theta, [b * t, c, out_h, out_w], align_corners=False)  # (B*T, H', W', 2)
    # Clamp to the centres of the box's border pixels, so nothing outside the box leaks in: this is
    # exactly F.interpolate(crop, bilinear, align_corners=False), which replicates the crop's border.
    x_lo = ((2 * left + 1) / width - 1).repeat_interleave(t)[:, None, None]  # (B*T, 1, 1)
    x_hi = ((2 * (left + w) - 1) / width - 1).repeat_interleave(t)[:, None, None]
    y_lo = ((2 * top + 1) / height - 1).repeat_interleave(t)[:, None, None]
    y_hi = ((2 * (top + h) - 1) / height - 1).repeat_interleave(t)[:, None, None]
    grid = torch.stack([grid[..., 0].clamp(x_lo, x_hi), grid[..., 1].clamp(y_lo, y_hi)], dim=-1)
    out = F.grid_sample(frames.reshape(b * t, c, height, width), grid, mode="bilinear", align_corners=False)
    return out.reshape(b, t, c, out_h, out_w)


@torch.no_grad()
def pseudo_labels(crop_feat: Tensor, prompt_feat: Tensor, temp: Tensor | float) -> Tensor:
    """Soft entity labels from the frozen prompter (eq. 4): ``softmax(crop_feat @ prompt_feat.T / temp)``.

    Args:
        crop_feat: ``(B, D)`` normalised prompter features of the crops.
        prompt_feat: ``(M, D)`` prompt-bank entity embeddings (the ALPRO code keeps the template mean
            un-normalised; that is the prompt bank's choice, not this function's).
        temp: the prompter's temperature (its learned value in the ALPRO code).

    Returns:
        ``(B, M)`` float32 probabilities, computed without gradient.
    """
    if crop_feat.ndim != 2 or prompt_feat.ndim != 2 or crop_feat.shape[1] != prompt_feat.shape[1]:
        raise ValueError(
            f"expected crop_feat (B, D) and prompt_feat (M, D) with equal D, "
            f"got {tuple(crop_feat.shape)}, {tuple(prompt_feat.shape)}"
        )
    sim = crop_feat.float() @ prompt_feat.float().t() / temp  # (B, M)
    return F.softmax(sim, dim=1)


def pem_keep_mask(pseudo: Tensor, rule: Literal["paper", "official_code"] = "paper", threshold: float = 0.2) -> Tensor:
    """Which crops keep their pseudo-label.

    Args:
        pseudo: ``(B, M)`` pseudo-label probabilities.
        rule: ``"paper"`` keeps a crop when its top probability is ``>= threshold`` (ALPRO §3.4).
            ``"official_code"`` reproduces salesforce/ALPRO ``Prompter._compute_soft_labels``
            (``src/modeling/alpro_models.py``): ``ignore = torch.max(sim, dim=1)[1] < 0.2`` compares
            the argmax *index* with the threshold, so with 0.2 only crops whose top entity is index 0
            are dropped. The code applies it to the scaled similarities; softmax keeps the argmax,
            so applying it to ``pseudo`` is the same.
        threshold: 0.2 in both.

    Returns:
        ``(B,)`` bool, True = keep.
    """
    if rule == "paper":
        return pseudo.max(dim=1).values >= threshold
    if rule == "official_code":
        return pseudo.argmax(dim=1).to(pseudo.dtype) >= threshold
    raise ValueError(f"rule must be 'paper' or 'official_code', got {rule!r}")


def pool_box_tokens(tokens: Tensor, token_mask: Tensor) -> Tensor:
    """Mean of the tokens inside each box.

    Args:
        tokens: ``(B, N, C)`` patch tokens in row-major grid order, *without* the [CLS] token (for the
            fused sequence ``[text; video]`` pass ``fused[:, text_len + 1:]``).
        token_mask: ``(B, N)`` bool from :func:`sample_pem_boxes`.

    Returns:
        ``(B, C)``; a row whose mask is empty gives zeros.
    """
    if token_mask.shape != tokens.shape[:2]:
        raise ValueError(f"token_mask {tuple(token_mask.shape)} does not match tokens (B, N, C) {tuple(tokens.shape)}")
    weights = token_mask.to(tokens.dtype).unsqueeze(-1)  # (B, N, 1)
    total = (tokens * weights).sum(dim=1)  # (B, C)
    return total / weights.sum(dim=1).clamp(min=1)


def pem_loss(logits: Tensor, pseudo: Tensor, keep: Tensor) -> Tensor:
    """Soft cross-entropy ``-sum_m q_m log p_m`` (eq. 5) averaged over kept crops.

    The average over kept crops is the ALPRO code's normalisation (eq. 5 itself is per crop).
    When no crop is kept the loss is exactly 0 with the graph to ``logits`` intact (zero gradient),
    so every rank still runs the same backward; the ALPRO code divides by zero there.

    Args:
        logits: ``(B, M)`` entity logits of the PEM head.
        pseudo: ``(B, M)`` target probabilities (treated as constants).
        keep: ``(B,)`` bool from :func:`pem_keep_mask`.

    Returns:
        0-d loss.
    """
    if logits.shape != pseudo.shape or keep.shape != logits.shape[:1]:
        raise ValueError(
            f"expected logits/pseudo (B, M) and keep (B,), "
            f"got {tuple(logits.shape)}, {tuple(pseudo.shape)}, {tuple(keep.shape)}"
        )
    ce = -(pseudo.detach() * F.log_softmax(logits.float(), dim=1)).sum(dim=1)  # (B,)
    ce = torch.where(keep, ce, torch.zeros_like(ce))
    return ce.sum() / keep.sum().clamp(min=1)
