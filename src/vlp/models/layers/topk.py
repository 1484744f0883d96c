"""Differentiable top-k by the perturbed maximum (Berthet et al. 2020; TS2-Net §3.2).

The forward is the expectation of the hard top-k indicator under Gaussian noise on the scores, estimated with
``draws`` samples: ``y = E[onehot(topk(s + sigma * Z))]``, shape ``(rows, k, n)``. Two backward estimators, with
the same draws:

- ``full``: the Jacobian of that expectation, ``dy[k, j] / ds[d] = E[onehot[k, j] * Z[d]] / sigma`` (Berthet et al.
  eq. 3; what a finite difference of the forward converges to). Computed without the ``(k, n, n)`` tensor: the
  gradient is ``sum_m <g, onehot_m> Z_m / (m * sigma)``.
- ``code``: the released TS2-Net code's einsum, which keeps only the diagonal ``j = d`` of that Jacobian (each
  score receives gradient only through its own token's indicator).

Memory: the one-hot draws are kept for backward, ``rows * draws * k * n`` floats.

Slot order: ``index`` sorts the k picks of each draw by position (the released code: the selected tokens keep
their order in the frame); ``score`` keeps them by score, so slot 0 is the soft arg-max (the paper's "most
informative token").
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

SlotOrder = Literal["index", "score"]
Backward = Literal["full", "code"]


def _onehot_topk(x: Tensor, k: int, order: SlotOrder) -> Tensor:
    """Hard top-k one-hot ``(..., k, n)`` of ``x`` (``(..., n)``), slots by ``order``."""
    idx = torch.topk(x, k=k, dim=-1, sorted=True).indices
    if order == "index":
        idx = torch.sort(idx, dim=-1).values
    return F.one_hot(idx, num_classes=x.shape[-1]).to(x.dtype)


class _PerturbedTopK(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: Tensor, noise: Tensor, k: int, sigma: float, order: SlotOrder, backward: Backward
    ) -> Tensor:
        picks = _onehot_topk(x.unsqueeze(1) + sigma * noise, k, order)  # (R, m, k, n)
        ctx.save_for_backward(picks, noise)
        ctx.sigma, ctx.rule = sigma, backward
        return picks.mean(dim=1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        picks, noise = ctx.saved_tensors
        scale = noise.shape[1] * ctx.sigma
        if ctx.rule == "full":
            weight = torch.einsum("rkn,rmkn->rm", grad, picks)  # <g, onehot_m> per draw
            grad_x = torch.einsum("rm,rmd->rd", weight, noise) / scale
        else:
            grad_x = torch.einsum("rkd,rmkd,rmd->rd", grad, picks, noise) / scale
        return grad_x, None, None, None, None, None


def perturbed_topk(
    scores: Tensor,
    k: int,
    *,
    draws: int = 500,
    sigma: float = 0.05,
    order: SlotOrder = "index",
    backward: Backward = "full",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Soft top-k indicators ``(R, k, n)`` of ``scores`` (``(R, n)``); rows of each slot sum to 1.

    Args:
        k: picks per row (``1 <= k <= n``).
        draws: noise samples ``m`` (the paper: 500).
        sigma: noise scale (the paper: 0.05).
        order: slot order (module docstring).
        backward: the gradient estimator (module docstring).
        generator: the noise's generator (None: the global one); must live on ``scores``' device.
    """
    if scores.ndim != 2 or not 1 <= k <= scores.shape[1]:
        raise ValueError(f"need (rows, n) scores and 1 <= k <= n, got {tuple(scores.shape)} and k={k}")
    if draws < 1 or sigma <= 0 or backward not in ("full", "code"):
        raise ValueError(f"need draws >= 1, sigma > 0, backward 'full' or 'code'; got {draws}, {sigma}, {backward!r}")
    noise = torch.randn((scores.shape[0], draws, scores.shape[1]), generator=generator, device=scores.device)
    return _PerturbedTopK.apply(scores, noise.to(scores.dtype), k, float(sigma), order, backward)


def hard_topk(scores: Tensor, k: int, order: SlotOrder = "index") -> Tensor:
    """The hard top-k indicators ``(R, k, n)`` (the limit of :func:`perturbed_topk` as sigma -> 0); no gradient."""
    if scores.ndim != 2 or not 1 <= k <= scores.shape[1]:
        raise ValueError(f"need (rows, n) scores and 1 <= k <= n, got {tuple(scores.shape)} and k={k}")
    return _onehot_topk(scores.detach(), k, order)
