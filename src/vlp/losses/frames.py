"""Text-video scores over frames and their contrastive loss (TS2-Net §3.3, eq. 4-8).

- :func:`frame_scores`: per-frame cosine similarities ``s_t`` of a query with a clip's frames, combined as
  ``sum_t softmax(lambda * s')_t * s_t`` (eq. 5); ``s' = s`` in the paper, ``s / ||s||_2`` over the frames in the
  released code (``normalise=True``).
- :func:`mean_pool_scores`: the cosine with the mean frame feature (CLIP4Clip's parameter-free ``meanP``, the
  baseline the TS2-Net tables compare with).
- :func:`frame_contrastive_loss`: symmetric InfoNCE over the score matrix scaled by a trainable logit scale
  (eq. 6-8). As :func:`vlp.losses.contrastive.vtc_loss`, each rank scores its local texts against the gathered
  clips and its local clips against the gathered texts and returns the mean over its local rows, so the mean over
  ranks is the one-process loss on the gathered batch.
- :func:`ts2net_losses`: TS2-Net's training losses, a function of its named outputs
  (:class:`vlp.models.ts2net.TS2NetOutput`): :func:`frame_contrastive_loss` under the output's score rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from vlp.losses.contrastive import identity

if TYPE_CHECKING:
    from vlp.models.ts2net.model import TS2NetOutput

__all__ = ["frame_contrastive_loss", "frame_scores", "mean_pool_scores", "score_fn", "ts2net_losses"]

FramePool = Literal["weighted", "mean"]


def _check(text: Tensor, frames: Tensor) -> None:
    if text.ndim != 2 or frames.ndim != 3 or text.shape[1] != frames.shape[2]:
        raise ValueError(f"need text (Q, D) and frames (V, T, D), got {tuple(text.shape)} and {tuple(frames.shape)}")


def frame_scores(text: Tensor, frames: Tensor, lam: float = 4.0, normalise: bool = True, chunk: int = 0) -> Tensor:
    """``(Q, V)`` scores of unit-norm queries ``text`` (``(Q, D)``) against clips of unit-norm ``frames``
    (``(V, T, D)``); ``chunk`` > 0 scores that many queries at a time (memory ``chunk * V * T``)."""
    _check(text, frames)
    if chunk > 0 and text.shape[0] > chunk:
        return torch.cat([frame_scores(text[i : i + chunk], frames, lam, normalise) for i in
                          range(0, text.shape[0], chunk)])  # fmt: skip
    s = torch.einsum("qd,vtd->qvt", text, frames)  # (Q, V, T) cosine per frame
    weights = torch.softmax(lam * (F.normalize(s, dim=-1) if normalise else s), dim=-1)
    return (weights * s).sum(dim=-1)


def mean_pool_scores(text: Tensor, frames: Tensor) -> Tensor:
    """``(Q, V)`` cosine of each query with the normalised mean of each clip's frame features."""
    _check(text, frames)
    return text @ F.normalize(frames.mean(dim=1), dim=-1).t()


def score_fn(pool: FramePool, lam: float = 4.0, normalise: bool = True) -> Callable[[Tensor, Tensor], Tensor]:
    """The ``(text, frames) -> (Q, V)`` score of a frame pooling rule."""
    if pool == "mean":
        return mean_pool_scores
    if pool != "weighted":
        raise ValueError(f"frame pooling must be 'weighted' or 'mean', got {pool!r}")
    return lambda text, frames: frame_scores(text, frames, lam, normalise)


def frame_contrastive_loss(
    text: Tensor,
    frames: Tensor,
    logit_scale: Tensor,
    score: Callable[[Tensor, Tensor], Tensor],
    *,
    gather: Callable[[Tensor], Tensor] = identity,
    rank: int = 0,
) -> Tensor:
    """Symmetric InfoNCE (eq. 8) of ``B`` local pairs: ``text`` ``(B, D)`` and ``frames`` ``(B, T, D)``, unit norm.

    Args:
        logit_scale: the log of the inverse temperature (0-d, trainable); the logits are ``exp(logit_scale) *
            score``.
        score: ``(text, frames) -> (Q, V)`` (:func:`score_fn`).
        gather: concatenates over ranks with gradient (``vlp.distributed.all_gather_with_grad``).
        rank: this process's rank; its positives sit at ``rank * B + arange(B)``.
    """
    _check(text, frames)
    if text.shape[0] != frames.shape[0]:
        raise ValueError(f"need as many texts as clips, got {text.shape[0]} and {frames.shape[0]}")
    batch, scale = text.shape[0], logit_scale.exp()
    all_text, all_frames = gather(text), gather(frames)
    if all_text.shape[0] < (rank + 1) * batch:
        raise ValueError(f"rank={rank} with local batch {batch} needs {(rank + 1) * batch} gathered rows")
    targets = torch.arange(batch, device=text.device) + rank * batch
    t2v = scale * score(text, all_frames)  # (B, W*B): local texts vs every clip
    v2t = scale * score(all_text, frames).t()  # (B, W*B): local clips vs every text
    return (F.cross_entropy(t2v, targets) + F.cross_entropy(v2t, targets)) / 2


def ts2net_losses(
    out: TS2NetOutput, *, gather: Callable[[Tensor], Tensor] = identity, rank: int = 0
) -> dict[str, Tensor]:
    """TS2-Net's training losses from one forward's outputs: the symmetric InfoNCE of :func:`frame_contrastive_loss`
    over the score rule the outputs name (:func:`score_fn`); ``gather`` and ``rank`` as there.

    Returns:
        ``{"loss", "loss_itc", "logit_scale"}``: the loss, its detached copy (TS2-Net's only term) and the detached
        inverse temperature ``exp(logit_scale)``.
    """
    score = score_fn(out.frame_pool, out.frame_lambda, out.frame_norm == "l2")
    loss = frame_contrastive_loss(out.text, out.frames, out.logit_scale, score, gather=gather, rank=rank)
    return {"loss": loss, "loss_itc": loss.detach(), "logit_scale": out.logit_scale.detach().exp()}
