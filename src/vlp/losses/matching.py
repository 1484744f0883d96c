"""Video-text matching (VTM) with in-batch hard negatives, as in ALBEF and ALPRO.

For every video one negative text, and for every text one negative video, are drawn from the
softmax of the in-batch similarity with the positive (diagonal) excluded. Sampling is
vectorised: one ``torch.multinomial`` call per direction over the masked ``(B, B)`` weights, with
no per-sample Python loop and no device-to-host sync (the ALPRO code loops over the batch and
calls ``.item()`` per sample).

The multimodal encoder then scores ``3B`` pairs in the order of :func:`vtm_pair_indices`
(the ALPRO/ALBEF order): ``B`` positives, ``B`` (text_i, hard negative video), ``B``
(hard negative text, video_i), with labels :func:`vtm_labels` ``= [1]*B + [0]*2B``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["hard_negative_weights", "sample_hard_negatives", "vtm_labels", "vtm_loss", "vtm_pair_indices"]


NEGATIVES = ("hard", "uniform", "mixed")


def _allowed(size: int, exclude: Tensor | None, device: torch.device) -> Tensor:
    """``(B, B)`` bool: candidates a row may draw (never itself, never ``exclude``; a row left with none
    falls back to every other item, so a negative always exists)."""
    allowed = ~torch.eye(size, dtype=torch.bool, device=device)
    if exclude is not None:
        if exclude.shape != (size, size):
            raise ValueError(f"exclude must be ({size}, {size}), got {tuple(exclude.shape)}")
        keep = allowed & ~exclude.to(device=device, dtype=torch.bool)
        allowed = torch.where(keep.any(dim=1, keepdim=True), keep, allowed)
    return allowed


@torch.no_grad()
def hard_negative_weights(sim: Tensor, exclude: Tensor | None = None) -> Tensor:
    """Row-wise sampling distribution over in-batch negatives.

    Args:
        sim: ``(B, B)`` similarity logits (ALPRO passes the VTC logits, i.e. cosine / temperature),
            row ``i`` = query ``i`` against all candidates, positive on the diagonal.
        exclude: ``(B, B)`` bool, pairs never to draw, e.g. another caption of the same clip (a true
            positive; ALBEF masks these, ALPRO does not). A row with nothing left keeps every other item.

    Returns:
        ``(B, B)`` float32 probabilities, ``softmax`` of each row with the diagonal (and excluded pairs) set to
        exactly 0. Because the row maximum over allowed entries gets weight ``exp(0)``, a row never
        underflows to all zeros, even for near-one-hot similarities. A row whose similarities are NaN or infinite
        (a diverged model) is uniform over its allowed items instead, so sampling never fails on it: the NaN
        reaches the loss, where the training loop stops with one line.
    """
    if sim.ndim != 2 or sim.shape[0] != sim.shape[1]:
        raise ValueError(
            f"expected a square (B, B) in-batch similarity, got {tuple(sim.shape)}; with gathered "
            "features pass the local block sim[:, rank * B:(rank + 1) * B]"
        )
    if sim.shape[0] < 2:
        raise ValueError("hard negatives need a batch of at least 2 pairs (B=1 has no in-batch negative)")
    allowed = _allowed(sim.shape[0], exclude, sim.device)
    masked = sim.detach().float().masked_fill(~allowed, float("-inf"))  # (B, B)
    probs = F.softmax(masked, dim=1)
    finite = probs.isfinite().all(dim=1, keepdim=True)  # (B, 1), no sync
    return torch.where(finite, probs, allowed.float() / allowed.sum(dim=1, keepdim=True))


@torch.no_grad()
def sample_hard_negatives(
    sim_v2t: Tensor,
    sim_t2v: Tensor,
    generator: torch.Generator | None = None,
    *,
    mode: str = "hard",
    hard_fraction: float = 0.5,
    exclude: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Draw one negative text per video and one negative video per text.

    Args:
        sim_v2t: ``(B, B)`` video-to-text similarity logits (row = video).
        sim_t2v: ``(B, B)`` text-to-video similarity logits (row = text).
        generator: optional ``torch.Generator`` on the tensors' device, for reproducible draws.
        mode: ``"hard"`` (ALPRO/ALBEF: in proportion to ``softmax(sim)``), ``"uniform"`` (any other item alike)
            or ``"mixed"`` (each draw hard with probability ``hard_fraction``, else uniform).
        hard_fraction: the hard share of ``"mixed"``.
        exclude: ``(B, B)`` bool pairs never to draw (see :func:`hard_negative_weights`).

    Returns:
        ``(neg_text_idx, neg_video_idx)``, both ``(B,)`` int64 on the input device;
        ``neg_text_idx[i] != i`` and ``neg_video_idx[i] != i`` always.

    Raises:
        ValueError: for non-square inputs or ``B < 2`` (no negative exists).
    """
    if sim_v2t.shape != sim_t2v.shape:
        raise ValueError(
            f"sim_v2t and sim_t2v must have the same shape, got {tuple(sim_v2t.shape)}, {tuple(sim_t2v.shape)}"
        )
    if mode not in NEGATIVES:
        raise ValueError(f"negative sampling mode must be one of {NEGATIVES}, got {mode!r}")
    if not 0.0 <= hard_fraction <= 1.0:
        raise ValueError(f"hard_fraction must be in [0, 1], got {hard_fraction}")
    picks = []
    for sim, ex in ((sim_v2t, exclude), (sim_t2v, None if exclude is None else exclude.t())):
        if mode == "hard":
            weights = hard_negative_weights(sim, ex)  # (B, B)
        else:
            allowed = _allowed(sim.shape[0], ex, sim.device).float()
            weights = allowed / allowed.sum(dim=1, keepdim=True)  # uniform over the allowed items
            if mode == "mixed":  # per-row coin: hard with probability hard_fraction
                coin = torch.rand(sim.shape[0], 1, generator=generator, device=sim.device) < hard_fraction
                weights = torch.where(coin, hard_negative_weights(sim, ex), weights)
        picks.append(torch.multinomial(weights, 1, generator=generator).squeeze(1))  # (B,)
    return picks[0], picks[1]


def vtm_pair_indices(neg_text_idx: Tensor, neg_video_idx: Tensor) -> tuple[Tensor, Tensor]:
    """Text and video row indices of the ``3B`` pairs the multimodal encoder scores.

    Order (ALPRO ``compute_vtm`` / ALBEF): rows ``[0, B)`` positives ``(t_i, v_i)``; rows ``[B, 2B)``
    ``(t_i, v_neg(i))``; rows ``[2B, 3B)`` ``(t_neg(i), v_i)``.

    Returns:
        ``(text_idx, video_idx)``, both ``(3B,)``; index the text/video token tensors with them.
    """
    batch = neg_text_idx.shape[0]
    ar = torch.arange(batch, device=neg_text_idx.device)  # (B,)
    text_idx = torch.cat([ar, ar, neg_text_idx])  # (3B,)
    video_idx = torch.cat([ar, neg_video_idx, ar])  # (3B,)
    return text_idx, video_idx


def vtm_labels(batch_size: int, device: torch.device | str | None = None) -> Tensor:
    """``[1]*B + [0]*2B`` as int64: positives first, then both kinds of negatives."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return (torch.arange(3 * batch_size, device=device) < batch_size).long()  # built on device: no copy, no sync


def vtm_loss(logits: Tensor, labels: Tensor | None = None) -> Tensor:
    """Cross-entropy of the binary VTM head.

    Args:
        logits: ``(3B, 2)`` match/no-match logits in :func:`vtm_pair_indices` order (class 1 = match).
        labels: ``(3B,)`` int64; defaults to :func:`vtm_labels` ``(B)``.

    Returns:
        0-d mean cross-entropy over the ``3B`` pairs.
    """
    if logits.ndim != 2 or logits.shape[1] != 2:
        raise ValueError(f"VTM logits must be (3B, 2), got {tuple(logits.shape)}")
    if labels is None:
        if logits.shape[0] % 3:
            raise ValueError(f"VTM logits need 3B rows (B positives + 2B negatives), got {logits.shape[0]}")
        labels = vtm_labels(logits.shape[0] // 3, logits.device)
    return F.cross_entropy(logits, labels)
