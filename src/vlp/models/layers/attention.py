"""Scaled dot-product attention for every vlp layer: ``F.scaled_dot_product_attention``, except in bf16 on the CPU.

On the CPU torch's attention kernels are slow in bf16: at the paper models' shapes, forward and backward, two bf16
matmuls and a softmax took 0.2-0.75x the time of its flash kernel (0.56x for ALPRO's TimeSformer space attention,
0.20x for TS2-Net's CLIP ViT-B/32) and of its math kernel, which it takes where dropout is on (every BERT layer in
training), and which upcasts to fp32 (``benchmarks/speed/bench_attention.py``; ``docs/results/speed.md``). So where
the queries are bf16 on the CPU (under ``cpu_bf16``'s autocast, or a bf16 model), :func:`attend` computes
``softmax(q k^T * scale + mask) v`` itself, in bf16: the matmuls accumulate in fp32 and so does the softmax's sum
(torch's CPU kernels for bf16); its bf16 output is what the second matmul would cast the probabilities to under
autocast, and one bf16 copy of them is saved for the backward, not an fp32 and a bf16 one. Everywhere else (fp32 on
any device, CUDA in any precision) it calls ``F.scaled_dot_product_attention`` as the layers did before, so every
fp32 figure keeps its bits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["attend"]


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    is_causal: bool = False,
    *,
    explicit: bool | None = None,
) -> Tensor:
    """``softmax(q k^T * scale + mask) v`` of ``q`` ``(..., Q, D)`` over ``k``, ``v`` ``(..., K, D)``, with
    ``F.scaled_dot_product_attention``'s arguments: ``mask`` boolean (True = attend) or additive, broadcast to
    ``(..., Q, K)``; ``is_causal`` lets query ``i`` see keys ``<= i``; ``dropout_p`` drops probabilities (the global
    generator).

    ``explicit``: None (the layers' choice) computes it in explicit ops for bf16 queries on the CPU and calls
    ``F.scaled_dot_product_attention`` otherwise (the module docstring says why); True or False forces one path
    (tests, ``benchmarks/speed/bench_attention.py``). In explicit ops a query that may see no key gets the mean of
    the values, where sdpa's fused kernels give NaN or zeros; no vlp layer masks a whole row."""
    if explicit is None:
        explicit = q.dtype == torch.bfloat16 and q.device.type == "cpu"
    if not explicit:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale, is_causal=is_causal
        )
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if mask is not None:  # boolean: True = attend; else additive
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
    if is_causal:
        hidden = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
    with torch.autocast(q.device.type, enabled=False):  # autocast would run it in fp32 and cast back: 2x the memory
        probs = torch.softmax(scores, dim=-1).to(v.dtype)  # a bf16 softmax sums in fp32; its output is bf16
    if dropout_p:
        probs = F.dropout(probs, p=dropout_p)
    return torch.matmul(probs, v)
