"""BERT layers with cross-attention to visual tokens: ALBEF's multimodal encoder (arXiv 2107.07651 §3.1).

Each :class:`CrossAttentionLayer` is a BERT layer (self-attention, then feed-forward) with a cross-attention
block between the two, whose queries are the text tokens and whose keys and values are the visual tokens.
They are assembled from BERT's parts (:mod:`vlp.models.layers.bert`: ``BertAttention``, ``BertIntermediate``,
``BertOutput``), as transformers' ``BertLayer`` builds its cross-attention only for a causal decoder. Parameter
names are BERT's (``attention.*``, ``intermediate.*``, ``output.*``) plus ``crossattention.*``, ALBEF's name, so
BERT layers 7-12 load into the self-attention and feed-forward parts (:func:`vlp.models.text.load_bert_weights`) and
the cross-attention starts random, as in ALBEF; an ALBEF checkpoint's ``crossattention`` weights map one to one.

Masks: text padding is masked in self-attention (bidirectional, as BERT's encoder); visual tokens are never
padded, so cross-attention sees all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vlp.models.layers.bert import (
    BertAttention,
    BertEmbeddings,
    BertIntermediate,
    BertOutput,
    causal_mask,
    padding_mask,
)
from vlp.models.text import MLMHead, TextConfig, init_bert_weights

__all__ = ["AnswerDecoder", "CrossAttentionLayer", "CrossFusionEncoder", "CrossFusionOutput"]


class CrossAttentionLayer(nn.Module):
    """Self-attention over the text, cross-attention to the visual tokens, then BERT's feed-forward."""

    def __init__(self, cfg: TextConfig, visual_width: int) -> None:
        super().__init__()
        bert = cfg.dims()
        self.attention = BertAttention(bert)
        self.crossattention = BertAttention(bert)
        if visual_width != cfg.width:  # ALBEF's encoder_width: keys and values read the visual width
            self.crossattention.self.key = nn.Linear(visual_width, cfg.width)
            self.crossattention.self.value = nn.Linear(visual_width, cfg.width)
        self.intermediate = BertIntermediate(bert)
        self.output = BertOutput(bert, bert.intermediate)

    def forward(self, x: Tensor, self_mask: Tensor | None, visual: Tensor, cross_mask: Tensor | None = None) -> Tensor:
        """``(B, L, C)`` queries, their 4-D self-attention mask (or None), ``(B, S, Cv)`` keys/values and their 4-D
        mask (None: all real) -> ``(B, L, C)``."""
        x = self.attention(x, self_mask)
        x = self.crossattention(x, cross_mask, visual)
        return self.output(self.intermediate(x), x)


@dataclass
class CrossFusionOutput:
    """Output of :class:`CrossFusionEncoder`: the fused text tokens."""

    tokens: Tensor  # (B, L, C)
    attention_mask: Tensor  # (B, L)

    @property
    def text(self) -> Tensor:  # (B, L, C): the sequence MLM predicts from
        return self.tokens

    @property
    def cls(self) -> Tensor:  # (B, C): the fused text [CLS], input of the ITM head
        return self.tokens[:, 0]


class CrossFusionEncoder(nn.Module):
    """The last ``cfg.fusion_layers`` BERT layers, each with cross-attention to the visual tokens (ALBEF)."""

    def __init__(self, cfg: TextConfig, *, visual_width: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.width = cfg.width
        self.attn = cfg.dims().attn
        self.grad_checkpointing = cfg.grad_checkpointing
        self.layers = nn.ModuleList(CrossAttentionLayer(cfg, visual_width) for _ in range(cfg.fusion_layers))
        init_bert_weights(self, cfg.init_std)

    def forward(self, text_tokens: Tensor, text_mask: Tensor, visual_tokens: Tensor) -> CrossFusionOutput:
        """Fuse ``(B, L, C)`` text tokens (mask ``(B, L)``, 1 = real) with ``(B, S, Cv)`` visual tokens."""
        b, length = text_mask.shape
        if text_tokens.shape[:2] != (b, length) or visual_tokens.ndim != 3 or visual_tokens.shape[0] != b:
            raise ValueError(
                f"text tokens {tuple(text_tokens.shape)}, mask {tuple(text_mask.shape)} and visual tokens "
                f"{tuple(visual_tokens.shape)} must share the batch (B, L, C) / (B, L) / (B, S, Cv)"
            )
        mask = padding_mask(text_mask, length, self.attn, text_tokens.dtype)
        x, visual = text_tokens, visual_tokens.to(text_tokens.dtype)
        for layer in self.layers:
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, mask, visual, use_reentrant=False)
            else:
                x = layer(x, mask, visual)
        return CrossFusionOutput(tokens=x, attention_mask=text_mask)


class AnswerDecoder(nn.Module):
    """ALBEF's answer decoder for open-ended QA (§5, VQA): BERT embeddings, ``num_layers`` layers of causal
    self-attention, cross-attention to the fused question and feed-forward, and an LM head tied to its word
    embeddings. ALBEF starts it as a copy of the multimodal encoder (:meth:`init_from`)."""

    def __init__(self, cfg: TextConfig, *, states_width: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.attn = cfg.dims().attn
        self.embeddings = BertEmbeddings(cfg.dims())
        self.layers = nn.ModuleList(CrossAttentionLayer(cfg, states_width) for _ in range(cfg.fusion_layers))
        self.lm_head = MLMHead(cfg, self.embeddings.word_embeddings)
        init_bert_weights(self, cfg.init_std)

    @torch.no_grad()
    def init_from(self, text: nn.Module, fusion: CrossFusionEncoder, mlm: dict[str, Tensor] | None = None) -> None:
        """Embeddings from the text encoder, layer ``i`` from fusion layer ``i`` (self-attention, cross-attention
        where the widths agree, feed-forward), the LM head's transform and bias from ``mlm`` (an MLM head's
        ``transform.*`` / ``bias`` tensors) when given."""
        self.embeddings.load_state_dict(cast(nn.Module, text.embeddings).state_dict())
        for mine, theirs in zip(self.layers, fusion.layers, strict=True):
            source = theirs.state_dict()
            target = mine.state_dict()
            mine.load_state_dict({k: source[k] if source[k].shape == v.shape else v for k, v in target.items()})
        if mlm:
            self.lm_head.load_state_dict({k: v for k, v in mlm.items() if k != "decoder_weight"}, strict=False)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, states: Tensor, states_mask: Tensor) -> Tensor:
        """``(N, La)`` answer ids / mask, ``(N, Lq, C)`` fused question states / mask -> ``(N, La, V)`` logits of the
        next token at every position."""
        x = self.embeddings(input_ids=input_ids)
        causal = causal_mask(attention_mask, self.attn, x.dtype)
        cross = padding_mask(states_mask, x.shape[1], self.attn, states.dtype)
        for layer in self.layers:
            x = layer(x, causal, states.to(x.dtype), cross)
        return self.lm_head(x)
