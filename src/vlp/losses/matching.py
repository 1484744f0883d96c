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


@torch.no_grad()
def hard_negative_weights(sim: Tensor) -> Tensor:
    """Row-wise sampling distribution over in-batch negatives.

    Args:
        sim: ``(B, B)`` similarity logits (ALPRO passes the VTC logits, i.e. cosine / temperature),
            row ``i`` = query ``i`` against all candidates, positive on the diagonal.

    Returns:
        ``(B, B)`` float32 probabilities, ``softmax`` of each row with the diagonal set to exactly 0.
        Because the row maximum over off-diagonal entries gets weight ``exp(0)``, a row never
        underflows to all zeros, even for near-one-hot similarities.
    """
    if sim.ndim != 2 or sim.shape[0] != sim.shape[1]:
        raise ValueError(
            f"expected a square (B, B) in-batch similarity, got {tuple(sim.shape)}; with gathered "
            "features pass the local block sim[:, rank * B:(rank + 1) * B]"
        )
    if sim.shape[0] < 2:
        raise ValueError("hard negatives need a batch of at least 2 pairs (B=1 has no in-batch negative)")
    eye = torch.eye(sim.shape[0], dtype=torch.bool, device=sim.device)
    masked = sim.detach().float().masked_fill(eye, float("-inf"))  # (B, B)
    return F.softmax(masked, dim=1)


@torch.no_grad()
def sample_hard_negatives(
    sim_v2t: Tensor, sim_t2v: Tensor, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Draw one hard negative text per video and one hard negative video per text.

    Args:
        sim_v2t: ``(B, B)`` video-to-text similarity logits (row = video).
        sim_t2v: ``(B, B)`` text-to-video similarity logits (row = text).
        generator: optional ``torch.Generator`` on the tensors' device, for reproducible draws.

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
    w_v2t = hard_negative_weights(sim_v2t)  # (B, B)
    w_t2v = hard_negative_weights(sim_t2v)  # (B, B)
    neg_text_idx = torch.multinomial(w_v2t, 1, generator=generator).squeeze(1)  # (B,)
    neg_video_idx = torch.multinomial(w_t2v, 1, generator=generator).squeeze(1)  # (B,)
    return neg_text_idx, neg_video_idx


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
