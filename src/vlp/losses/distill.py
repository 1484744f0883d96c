"""ALBEF's objectives with momentum distillation (arXiv 2107.07651 §3.2-3.3): pure functions of model outputs.

- :func:`itc_targets`: the distilled contrastive targets ``alpha * softmax(teacher) + (1 - alpha) * y`` (eq. 6),
  ``y`` the ground truth spread uniformly over each row's positives (ALBEF fine-tuning: every caption of the
  same image, with weight 1 / #positives; pre-training: the own pair only).
- :func:`itc_distill_loss`: image-text contrastive loss against the batch and the queue with those targets.
- :func:`mlm_distill_loss`: MLM against ``(1 - alpha) * one_hot + alpha * teacher`` at the masked positions (eq. 7).
- :func:`alpha_at`: the linear ramp of ``alpha`` from 0 over the first steps (ALBEF: the first epoch).

Logged value (the paper's, as the issue asks). The released code minimises the cross-entropy against the mixed
target, ``CE(mix, p) = (1 - alpha) CE(y, p) + alpha CE(q, p)``. The paper writes the distillation term as a
KL divergence, ``(1 - alpha) CE(y, p) + alpha KL(q || p)``, and ``KL(q || p) = CE(q, p) - H(q)``: the two differ
by ``alpha * H(q)``, which does not depend on the student, so the gradients are the same and only the logged
number moves. These functions return the paper's form; ``form="code"`` gives the released code's.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from vlp.losses.mlm import IGNORE_INDEX

__all__ = [
    "alpha_at",
    "answer_lm_loss",
    "answer_log_likelihood",
    "itc_distill_loss",
    "itc_targets",
    "mlm_distill_loss",
    "soft_cross_entropy",
]

Form = Literal["paper", "code"]


def alpha_at(step: int, alpha: float, ramp_steps: int) -> float:
    """``alpha`` at training ``step`` (0-based): ``alpha * min(1, step / ramp_steps)``; ``ramp_steps=0``: no ramp.

    ALBEF's code multiplies by ``min(1, i / len(data_loader))`` during the first epoch, ``i`` the batch index.
    """
    if ramp_steps < 0 or step < 0 or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"need step >= 0, ramp_steps >= 0 and alpha in [0, 1], got {step}, {ramp_steps}, {alpha}")
    return alpha if ramp_steps == 0 else alpha * min(1.0, step / ramp_steps)


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean over rows of ``-sum(targets * log_softmax(logits))``; ``targets`` rows are distributions."""
    return -(targets * F.log_softmax(logits.float(), dim=-1)).sum(dim=-1).mean()


def _entropy(p: Tensor) -> Tensor:
    """Row entropies of distributions ``p`` (0 log 0 = 0)."""
    return -(p * torch.log(p.clamp_min(1e-30))).sum(dim=-1)


@torch.no_grad()
def itc_targets(teacher_logits: Tensor, positives: Tensor, alpha: float) -> Tensor:
    """``(R, K)`` distilled targets: ``alpha * softmax(teacher_logits) + (1 - alpha) * positives / #positives``.

    Args:
        teacher_logits: ``(R, K)`` the momentum model's similarities / temperature against the same K columns.
        positives: ``(R, K)`` bool, at least one per row.
        alpha: weight of the teacher (0 = the ground truth alone).
    """
    if positives.shape != teacher_logits.shape or not bool(positives.any(dim=1).all()):
        raise ValueError(f"positives must be {tuple(teacher_logits.shape)} bool with a positive in every row")
    truth = positives.float() / positives.sum(dim=1, keepdim=True)
    if alpha == 0.0:
        return truth
    return alpha * F.softmax(teacher_logits.float(), dim=1) + (1.0 - alpha) * truth


def itc_distill_loss(
    logits_i2t: Tensor,
    logits_t2i: Tensor,
    teacher_i2t: Tensor,
    teacher_t2i: Tensor,
    positives: Tensor,
    alpha: float,
    *,
    form: Form = "paper",
) -> Tensor:
    """ALBEF's ITC with momentum distillation, the mean of both directions (eq. 2 and eq. 6).

    Args:
        logits_i2t, logits_t2i: ``(B, B + M)`` student similarities / temperature of each local image (text)
            against the momentum texts (images) of the batch then the queue.
        teacher_i2t, teacher_t2i: the same grid from the momentum model.
        positives: ``(B, B + M)`` bool, which columns are each row's positives (the same for both directions).
        alpha: the distillation weight (:func:`alpha_at`).
        form: ``"paper"`` (KL, the value logged) or ``"code"`` (cross-entropy); same gradient.
    """
    if logits_i2t.shape != logits_t2i.shape or teacher_i2t.shape != logits_i2t.shape:
        raise ValueError(f"the four logit grids must have one shape, got {tuple(logits_i2t.shape)} and others")
    total = logits_i2t.new_zeros(())
    for student, teacher in ((logits_i2t, teacher_i2t), (logits_t2i, teacher_t2i)):
        mixed = itc_targets(teacher, positives, alpha)
        loss = soft_cross_entropy(student, mixed)
        if form == "paper" and alpha > 0:
            loss = loss - alpha * _entropy(F.softmax(teacher.float(), dim=1)).mean()
        total = total + loss
    return total / 2


def mlm_distill_loss(
    logits: Tensor, labels: Tensor, teacher_logits: Tensor | None, alpha: float, *, form: Form = "paper"
) -> Tensor:
    """MLM with momentum distillation (eq. 7) over the masked positions (``labels != -100``).

    ``(1 - alpha) * CE(labels, p) + alpha * KL(softmax(teacher) || p)`` in the paper's form (``form="code"``: the
    cross-entropy against the teacher instead of the KL). ``teacher_logits=None`` or ``alpha=0``: plain MLM.

    Args:
        logits: ``(B, L, V)`` student logits; labels ``(B, L)``; teacher_logits ``(B, L, V)``.
    """
    masked = labels != IGNORE_INDEX  # (B, L)
    if not bool(masked.any()):
        return logits.sum() * 0.0  # nothing masked in this batch: zero, still attached to the graph
    student = logits[masked].float()  # (P, V)
    hard = F.cross_entropy(student, labels[masked])
    if teacher_logits is None or alpha == 0.0:
        return hard
    q = F.softmax(teacher_logits[masked].float(), dim=-1)  # (P, V)
    soft = soft_cross_entropy(student, q)
    if form == "paper":
        soft = soft - _entropy(q).mean()
    return (1.0 - alpha) * hard + alpha * soft


def _shifted(logits: Tensor, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Next-token view of an answer: logits at positions ``0..L-2``, targets ``1..L-1``, which targets are real."""
    if logits.shape[:2] != ids.shape or ids.shape != mask.shape:
        raise ValueError(f"logits {tuple(logits.shape)}, ids {tuple(ids.shape)}, mask {tuple(mask.shape)} disagree")
    return logits[:, :-1].float(), ids[:, 1:], mask[:, 1:].bool()


def answer_log_likelihood(logits: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
    """``(N,)`` log-probability of each answer under the decoder: the sum over its real tokens after the first
    (ALBEF's ``rank_answer`` scores candidates by this)."""
    pred, target, real = _shifted(logits, ids, mask)
    token = pred.log_softmax(dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (N, L-1)
    return (token * real).sum(dim=1)


def answer_lm_loss(
    logits: Tensor,
    ids: Tensor,
    mask: Tensor,
    teacher_logits: Tensor | None = None,
    alpha: float = 0.0,
    *,
    form: Form = "paper",
) -> Tensor:
    """ALBEF's answer-generation loss: per answer, the sum over its tokens of ``(1 - alpha) CE(token, p) + alpha
    KL(q || p)`` (``q`` the momentum decoder's next-token distribution; ``form="code"``: CE(q, p)), averaged over
    answers (ALBEF weights each answer by its share of annotators; here every question has one answer, weight 1).
    """
    pred, target, real = _shifted(logits, ids, mask)
    hard = -(pred.log_softmax(dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1) * real).sum(dim=1)  # (N,)
    if teacher_logits is None or alpha == 0.0:
        return hard.mean()
    q = F.softmax(teacher_logits[:, :-1].float(), dim=-1)
    soft = -(q * pred.log_softmax(dim=-1)).sum(dim=-1)  # (N, L-1)
    if form == "paper":
        soft = soft - _entropy(q)
    return ((1.0 - alpha) * hard + alpha * (soft * real).sum(dim=1)).mean()
