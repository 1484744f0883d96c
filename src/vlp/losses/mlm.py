"""Masked language modelling: BERT-style token corruption and the loss.

:func:`mask_tokens` follows BERT and the ALPRO/ALBEF collators (``mask_batch_text_tokens``,
itself adapted from ``transformers``' data collator): each non-special token is selected with
probability ``prob``; a selected token becomes ``[MASK]`` with probability 0.8, a uniformly random
vocabulary id with 0.1, and stays unchanged with 0.1. Labels hold the original id at selected
positions and ``-100`` (ignored by the loss) elsewhere. Selection is an independent Bernoulli
draw per token, as in the reference code, so a caption may have no masked token at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["IGNORE_INDEX", "mask_tokens", "mlm_loss"]

IGNORE_INDEX = -100


def _special_positions(input_ids: Tensor, special_ids: Sequence[int] | Tensor, special_mask: Tensor | None) -> Tensor:
    ids = torch.as_tensor(special_ids, dtype=input_ids.dtype, device=input_ids.device).reshape(-1)
    special = torch.isin(input_ids, ids)  # (B, L)
    if special_mask is not None:
        if special_mask.shape != input_ids.shape:
            raise ValueError(
                f"special_mask must match input_ids {tuple(input_ids.shape)}, got {tuple(special_mask.shape)}"
            )
        special = special | special_mask.to(device=input_ids.device, dtype=torch.bool)
    return special


def _random_tokens(
    shape: torch.Size,
    vocab_size: int,
    exclude: Tensor | None,
    device: torch.device,
    generator: torch.Generator | None,
) -> Tensor:
    if exclude is None:
        return torch.randint(vocab_size, shape, device=device, generator=generator)
    keep = torch.ones(vocab_size, dtype=torch.bool, device=device)
    keep[exclude] = False
    candidates = keep.nonzero().squeeze(1)  # (V',)
    pick = torch.randint(candidates.numel(), shape, device=device, generator=generator)
    return candidates[pick]


def mask_tokens(
    input_ids: Tensor,
    *,
    vocab_size: int,
    mask_token_id: int,
    special_ids: Sequence[int] | Tensor = (),
    special_mask: Tensor | None = None,
    prob: float = 0.15,
    mask_frac: float = 0.8,
    random_frac: float = 0.1,
    random_excludes_special: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Corrupt token ids for MLM.

    Args:
        input_ids: ``(B, L)`` int64 token ids (padded).
        vocab_size: size of the vocabulary; random replacements are drawn from ``[0, vocab_size)``.
        mask_token_id: id of ``[MASK]``.
        special_ids: ids that are never selected (``[CLS]``, ``[SEP]``, ``[PAD]``, ...).
        special_mask: optional ``(B, L)`` bool, True where a position must never be selected (e.g.
            the tokenizer's ``special_tokens_mask`` or ``attention_mask == 0``); OR-ed with ``special_ids``.
        prob: selection probability per eligible token (0.15 in BERT/ALPRO).
        mask_frac: share of selected tokens replaced by ``[MASK]``.
        random_frac: share of selected tokens replaced by a random id; the rest stay unchanged.
        random_excludes_special: if True, random replacements never are ``special_ids`` or ``[MASK]``;
            False (default) draws from the whole vocabulary like BERT and the ALPRO code.
        generator: optional ``torch.Generator`` (on ``input_ids``' device) for reproducibility.

    Returns:
        ``(masked_ids, labels)``, both ``(B, L)`` int64; ``labels`` is the original id where selected
        and ``-100`` elsewhere. ``input_ids`` is not modified.
    """
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (B, L), got {tuple(input_ids.shape)}")
    if not 0.0 <= prob <= 1.0 or mask_frac < 0 or random_frac < 0 or mask_frac + random_frac > 1:
        raise ValueError(
            f"need 0 <= prob <= 1 and mask_frac, random_frac >= 0 with sum <= 1; got "
            f"prob={prob}, mask_frac={mask_frac}, random_frac={random_frac}"
        )
    device = input_ids.device
    special = _special_positions(input_ids, special_ids, special_mask)  # (B, L)
    draw = torch.rand(input_ids.shape, device=device, generator=generator)  # (B, L)
    selected = (draw < prob) & ~special  # (B, L)
    how = torch.rand(input_ids.shape, device=device, generator=generator)  # (B, L)
    to_mask = selected & (how < mask_frac)
    to_random = selected & (how >= mask_frac) & (how < mask_frac + random_frac)
    exclude = None
    if random_excludes_special:
        ids = torch.as_tensor(special_ids, dtype=torch.long, device=device).reshape(-1)
        exclude = torch.cat([ids, torch.tensor([mask_token_id], device=device)])
    random_ids = _random_tokens(input_ids.shape, vocab_size, exclude, device, generator)  # (B, L)
    masked = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    masked = torch.where(to_random, random_ids.to(input_ids.dtype), masked)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return masked, labels


def mlm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the selected (label != -100) positions.

    Args:
        logits: ``(B, L, V)`` vocabulary logits of the text positions.
        labels: ``(B, L)`` from :func:`mask_tokens`.

    Returns:
        0-d loss. When no position is selected it is ``0`` with the graph to ``logits`` intact
        (``F.cross_entropy`` alone would return NaN).
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits (B, L, V) {tuple(logits.shape)} do not match labels (B, L) {tuple(labels.shape)}")
    flat_logits = logits.reshape(-1, logits.shape[-1])  # (B*L, V)
    flat_labels = labels.reshape(-1)  # (B*L,)
    total = F.cross_entropy(flat_logits.float(), flat_labels, ignore_index=IGNORE_INDEX, reduction="sum")
    count = (flat_labels != IGNORE_INDEX).sum().clamp(min=1)
    return total / count
