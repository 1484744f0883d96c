"""Video-text contrastive loss (VTC, ALPRO eq. 1-3) and the temperature clamp.

The loss is *given* the gather function (open_clip style) instead of calling collectives
itself: pass ``vlp.distributed.all_gather_with_grad`` and ``rank=distributed.rank()`` for
negatives from every rank, or leave the defaults for a one-process batch.

Each rank scores its ``B`` local videos against the ``W * B`` gathered texts (and its local
texts against the gathered videos), as the ALPRO code does; the positive of local row ``i`` sits
at column ``rank * B + i``. The returned value is the mean over local rows, so the mean over
ranks equals the one-process loss on the concatenated batch (see ``vlp.distributed`` for
the matching gradient relation).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["clamp_temperature", "identity", "vtc_logits", "vtc_loss"]

TEMP_MIN = 0.001
TEMP_MAX = 0.5


def identity(x: Tensor) -> Tensor:
    """The gather function of a single process: returns ``x``."""
    return x


def clamp_temperature(temp: Tensor, lo: float = TEMP_MIN, hi: float = TEMP_MAX) -> Tensor:
    """Clamp a learnable temperature into ``[lo, hi]`` in place, outside autograd; returns it.

    The ALPRO code does ``temp.clamp_(0.001, 0.5)`` under ``torch.no_grad()`` at the start of every
    forward (init 0.07 lives in the model), so the parameter itself stays in range and the
    optimiser keeps updating the clamped value. Call it the same way, once per step.

    Args:
        temp: the temperature parameter (a 0-d tensor).
        lo: lower bound.
        hi: upper bound.

    Returns:
        ``temp`` (same object), clamped.
    """
    if not lo < hi:
        raise ValueError(f"temperature bounds must satisfy lo < hi, got lo={lo}, hi={hi}")
    with torch.no_grad():
        temp.clamp_(lo, hi)
    return temp


def vtc_logits(
    video_feat: Tensor,
    text_feat: Tensor,
    temp: Tensor | float,
    *,
    gather: Callable[[Tensor], Tensor] = identity,
) -> tuple[Tensor, Tensor]:
    """Similarity logits of local rows against gathered columns (eq. 1 divided by the temperature).

    Args:
        video_feat: ``(B, D)`` normalised video projections of this rank.
        text_feat: ``(B, D)`` normalised text projections of this rank.
        temp: temperature (0-d tensor or float).
        gather: concatenates a ``(B, D)`` tensor over ranks -> ``(W * B, D)``.

    Returns:
        ``(logits_v2t, logits_t2v)``, both ``(B, W * B)``.
    """
    if video_feat.ndim != 2 or video_feat.shape != text_feat.shape:
        raise ValueError(
            f"video_feat and text_feat must both be (B, D) with equal shapes, got "
            f"{tuple(video_feat.shape)} and {tuple(text_feat.shape)}"
        )
    all_text = gather(text_feat)  # (W*B, D)
    all_video = gather(video_feat)  # (W*B, D)
    logits_v2t = video_feat @ all_text.t() / temp  # (B, W*B)
    logits_t2v = text_feat @ all_video.t() / temp  # (B, W*B)
    return logits_v2t, logits_t2v


def vtc_loss(
    video_feat: Tensor,
    text_feat: Tensor,
    temp: Tensor | float,
    *,
    gather: Callable[[Tensor], Tensor] = identity,
    rank: int = 0,
    positives: Tensor | None = None,
) -> Tensor:
    """Symmetric InfoNCE between videos and texts, ``(L_v2t + L_t2v) / 2`` (ALPRO eq. 2-3).

    Args:
        video_feat: ``(B, D)`` L2-normalised video features (256-d in ALPRO) of this rank.
        text_feat: ``(B, D)`` L2-normalised text features; row ``i`` is the caption of video ``i``.
        temp: temperature; clamp it with :func:`clamp_temperature` beforehand.
        gather: gathers ``(B, D)`` over ranks to ``(W * B, D)`` in rank order; use
            ``all_gather_with_grad`` so that negatives from other ranks carry gradient.
        rank: this process's rank; its positives are at columns ``rank * B + arange(B)``.
        positives: ``(B, W * B)`` bool, every column that counts as a positive of each local row (its own pair
            included), e.g. all captions of the same clip: the target is then uniform over them (ALBEF's
            same-id targets). None = only the own pair (ALPRO: another caption of the clip is a negative).

    Returns:
        0-d loss, the mean over the ``B`` local rows of both directions, averaged.
    """
    logits_v2t, logits_t2v = vtc_logits(video_feat, text_feat, temp, gather=gather)
    batch = video_feat.shape[0]
    if logits_v2t.shape[1] < (rank + 1) * batch:
        raise ValueError(
            f"rank={rank} with local batch {batch} needs at least {(rank + 1) * batch} gathered rows, "
            f"got {logits_v2t.shape[1]}; pass the rank that matches the gather function"
        )
    targets = torch.arange(batch, device=video_feat.device) + rank * batch  # (B,)
    if positives is None:
        return (F.cross_entropy(logits_v2t, targets) + F.cross_entropy(logits_t2v, targets)) / 2
    if positives.shape != logits_v2t.shape or not bool(positives[torch.arange(batch), targets].all()):
        raise ValueError(f"positives must be ({batch}, {logits_v2t.shape[1]}) bool and hold each row's own pair")
    soft = positives.to(logits_v2t.dtype) / positives.sum(dim=1, keepdim=True)  # (B, W*B), rows sum to 1
    return (F.cross_entropy(logits_v2t, soft) + F.cross_entropy(logits_t2v, soft)) / 2
