"""BERT's layers, written here: ALPRO's and ALBEF's text, fusion and decoder stacks are built from these modules.

They are the modules transformers' BERT (5.x, ``modeling_bert``) builds, with its parameter names (a BERT checkpoint
and every vlp model directory load unchanged), its construction order (a seeded build draws the same random numbers)
and its arithmetic: the same operations in the same order, so a forward and a backward give the same bits
(``tests/test_bert_layers.py`` compares them with transformers' modules, and its mask builders with
``masking_utils``, on both attention paths). Importing transformers' model code costs about 2 s of start-up
(``modeling_utils`` pulls ``torch._dynamo`` and ``torch.distributed.tensor``) in every process that builds a model:
every training and evaluation step, ``vlp search``, ``vlp serve``; this module imports torch alone.

Masks follow transformers' conventions for each attention path: ``sdpa`` takes a boolean ``(B, 1, Q, K)`` mask
(True = attend) or None when nothing is masked; ``eager`` adds a float mask (0 = attend, the dtype's minimum = not).
``sdpa`` is :func:`vlp.models.layers.attention.attend`: torch's kernel, except in bf16 on the CPU, where explicit
matmuls are faster (that module says by how much).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlp.models.layers.attention import attend

__all__ = [
    "BertAttention",
    "BertDims",
    "BertEmbeddings",
    "BertLayer",
    "BertPredictionHeadTransform",
    "causal_mask",
    "padding_mask",
]


@dataclass(frozen=True)
class BertDims:
    """The sizes and settings BERT's layers read (transformers' ``BertConfig`` fields of the same meaning)."""

    width: int  # hidden_size
    heads: int  # num_attention_heads
    intermediate: int  # intermediate_size
    vocab_size: int = 30522
    max_positions: int = 512
    type_vocab_size: int = 2
    pad_token_id: int = 0
    dropout: float = 0.1  # hidden and attention-probability dropout
    layer_norm_eps: float = 1e-12
    attn: Literal["sdpa", "eager"] = "sdpa"


def padding_mask(mask: Tensor, queries: int, attn: str, dtype: torch.dtype) -> Tensor | None:
    """The attention mask of ``queries`` queries over keys whose ``(B, K)`` ``mask`` marks the real ones (1) and the
    padding (0): None when every key is real, else ``(B, 1, queries, K)`` (boolean for ``sdpa``, additive in ``dtype``
    for ``eager``). transformers' ``create_bidirectional_mask``."""
    real = mask.to(dtype=torch.bool)
    if bool(real.all()):
        return None
    every = torch.ones((1, 1, queries, 1), dtype=torch.bool, device=real.device)  # bidirectional: every query
    return _for(every & real[:, None, None, :], attn, dtype)


def causal_mask(mask: Tensor, attn: str, dtype: torch.dtype) -> Tensor:
    """Causal self-attention over a ``(B, L)`` sequence whose ``mask`` marks its real tokens: query ``i`` attends to
    the real keys ``j <= i``; always materialised, ``(B, 1, L, L)``. transformers' ``create_causal_mask`` without its
    skip (``allow_is_causal_skip=False``)."""
    real = mask.to(dtype=torch.bool)
    positions = torch.arange(real.shape[1], device=real.device)
    lower = positions[None, None, None, :] <= positions[None, None, :, None]  # (1, 1, L, L): kv <= q
    return _for(lower & real[:, None, None, :], attn, dtype)


def _for(allowed: Tensor, attn: str, dtype: torch.dtype) -> Tensor:
    if attn == "sdpa":
        return allowed
    return torch.where(allowed, torch.zeros((), device=allowed.device, dtype=dtype), torch.finfo(dtype).min)


class BertEmbeddings(nn.Module):
    """Word + token-type + position embeddings, LayerNorm, dropout."""

    position_ids: Tensor  # (1, max_positions), a buffer outside the state dict

    def __init__(self, d: BertDims) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(d.vocab_size, d.width, padding_idx=d.pad_token_id)
        self.position_embeddings = nn.Embedding(d.max_positions, d.width)
        self.token_type_embeddings = nn.Embedding(d.type_vocab_size, d.width)
        self.LayerNorm = nn.LayerNorm(d.width, eps=d.layer_norm_eps)
        self.dropout = nn.Dropout(d.dropout)
        self.register_buffer("position_ids", torch.arange(d.max_positions).expand((1, -1)), persistent=False)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """``(B, L)`` ids (and segment ids, None = all 0) -> ``(B, L, C)``."""
        batch, length = input_ids.shape
        positions = self.position_ids[:, :length]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(positions).expand(batch, length)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head attention of the queries ``x`` over ``x`` itself, or over ``states`` (cross-attention)."""

    def __init__(self, d: BertDims) -> None:
        super().__init__()
        if d.width % d.heads:
            raise ValueError(f"width {d.width} is not divisible by heads {d.heads}")
        # transformers' attribute names (code that reads a BERT layer's attention, e.g. the VTM probe, reads these)
        self.num_attention_heads, self.attention_head_size = d.heads, d.width // d.heads
        self.scaling = self.attention_head_size**-0.5
        self.attn = d.attn
        self.query = nn.Linear(d.width, d.width)
        self.key = nn.Linear(d.width, d.width)
        self.value = nn.Linear(d.width, d.width)
        self.dropout = nn.Dropout(d.dropout)

    def forward(self, x: Tensor, mask: Tensor | None, states: Tensor | None = None) -> Tensor:
        source = x if states is None else states
        q = self.query(x).view(*x.shape[:-1], -1, self.attention_head_size).transpose(1, 2)  # (B, H, Q, D)
        k = self.key(source).view(*source.shape[:-1], -1, self.attention_head_size).transpose(1, 2)  # (B, H, K, D)
        v = self.value(source).view(*source.shape[:-1], -1, self.attention_head_size).transpose(1, 2)
        p = self.dropout.p if self.training else 0.0
        if self.attn == "sdpa":
            out = attend(q, k, v, mask, dropout_p=p, scale=self.scaling)
            out = out.reshape(out.shape[0], -1, q.shape[2], v.shape[-1])
        else:
            weights = torch.matmul(q, k.transpose(2, 3)) * self.scaling
            if mask is not None:
                weights = weights + mask
            weights = F.dropout(F.softmax(weights, dim=-1), p=p, training=self.training)
            out = torch.matmul(weights, v)
        return out.transpose(1, 2).contiguous().reshape(*x.shape[:-1], -1).contiguous()


class BertOutput(nn.Module):
    """Projection to the width (from the attention's ``width``, or the feed-forward's ``intermediate``: transformers'
    ``BertSelfOutput`` and ``BertOutput``), dropout, residual, LayerNorm."""

    def __init__(self, d: BertDims, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, d.width)
        self.LayerNorm = nn.LayerNorm(d.width, eps=d.layer_norm_eps)
        self.dropout = nn.Dropout(d.dropout)

    def forward(self, hidden: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    """Attention (``self``) and its output block (``output``): BERT's self-attention, or with ``states`` given to
    :meth:`forward`, cross-attention (ALBEF's ``crossattention``)."""

    def __init__(self, d: BertDims) -> None:
        super().__init__()
        self.self = BertSelfAttention(d)
        self.output = BertOutput(d, d.width)

    def forward(self, x: Tensor, mask: Tensor | None, states: Tensor | None = None) -> Tensor:
        return self.output(self.self(x, mask, states), x)


class BertIntermediate(nn.Module):
    def __init__(self, d: BertDims) -> None:
        super().__init__()
        self.dense = nn.Linear(d.width, d.intermediate)

    def forward(self, hidden: Tensor) -> Tensor:
        return F.gelu(self.dense(hidden))


class BertLayer(nn.Module):
    """Self-attention, then the feed-forward block: ``(B, L, C)`` and its attention mask -> ``(B, L, C)``."""

    def __init__(self, d: BertDims) -> None:
        super().__init__()
        self.attention = BertAttention(d)
        self.intermediate = BertIntermediate(d)
        self.output = BertOutput(d, d.intermediate)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class BertPredictionHeadTransform(nn.Module):
    """The MLM head's transform: dense, GELU, LayerNorm."""

    def __init__(self, d: BertDims) -> None:
        super().__init__()
        self.dense = nn.Linear(d.width, d.width)
        self.LayerNorm = nn.LayerNorm(d.width, eps=d.layer_norm_eps)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.LayerNorm(F.gelu(self.dense(hidden)))
