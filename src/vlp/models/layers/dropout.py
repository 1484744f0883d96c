"""Dropout with masks drawn as 16-bit integers on the CPU: the training sections' ``cpu_dropout: 16bit``.

torch's dropout on the CPU draws its mask with ``bernoulli_`` into a tensor of the input's dtype, divides it by
``1 - p`` and multiplies it in. On the AMD CPU of ``docs/results/speed.md`` that took 23 ms for the attention
probabilities of ALPRO's fusion layer at paper size (6 x 12 x 227 x 227, bf16 or fp32) and 6.6 ms for one of its
hidden states (6 x 227 x 768): about 4% of ALPRO's bf16 training step. ``16bit`` draws the mask from the same global
generator with ``random_`` over int64's whole range, reads each 64-bit draw as four 16-bit integers, and keeps an
element where its integer is at or above a threshold: 3 ms for the draw and 1 ms for the comparison at the first
shape, 3.7x faster with the multiplication.

So ``p`` is taken in steps of 1/65,536: ``round(p * 65536)`` of the 65,536 equally likely integers drop (``p = 0.1``
drops 6,554 of them: 0.100006), and the kept values are scaled by ``65536 / (65536 - that count)``, the inverse of
the share kept, so every element's expectation is its input's, as with torch's. A ``p`` that rounds to none or to
all of them (below 1/131,072 of 0 or 1) is left to torch's. The same seed gives the same masks (and a checkpointed
block's recomputation, which restores the generator, draws its forward's), but not torch's masks: a config choice
whose default (``torch``) keeps every recorded figure. Elsewhere (CUDA, evaluation, a non-float input) the layers
call ``F.dropout`` whatever the setting. The mask is kept for the backward as one byte an element.

The setting lives on the modules: :class:`Dropout` (``nn.Dropout`` with a ``kind``) in vlp's BERT layers, which
also passes it to the attention probabilities' dropout; :func:`set_cpu_dropout` sets it on a model.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["CPU_DROPOUTS", "Dropout", "check_cpu_dropout", "dropout", "keep_mask", "set_cpu_dropout"]

CPU_DROPOUTS = ("torch", "16bit")  # the ``cpu_dropout`` values
LEVELS = 1 << 16  # the equally likely values of one element's draw


def check_cpu_dropout(kind: str) -> None:
    """Refuse, in one line, a ``cpu_dropout`` value that is not one."""
    if kind not in CPU_DROPOUTS:
        raise ValueError(f"cpu_dropout must be one of {list(CPU_DROPOUTS)}, got {kind!r}")


def keep_mask(shape: tuple[int, ...] | torch.Size, drop: int, generator: torch.Generator | None = None) -> Tensor:
    """A boolean CPU tensor of ``shape``: True where an element is kept, each independently with probability
    ``1 - drop / 65536``. Four elements a 64-bit draw of ``generator`` (default: the global CPU generator)."""
    if not 0 <= drop <= LEVELS:
        raise ValueError(f"drop must be in [0, {LEVELS}], got {drop}")
    if drop == LEVELS:  # no 16-bit value reaches the threshold (32,768 is not one)
        return torch.zeros(shape, dtype=torch.bool)
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None, generator=generator)
    return words.view(torch.int16)[:n].view(shape) >= drop - LEVELS // 2


class _Dropout16(torch.autograd.Function):
    """``x * keep * scale`` with a :func:`keep_mask` drawn in the forward; the backward multiplies by the same."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, drop: int) -> Tensor:
        keep = keep_mask(x.shape, drop)
        ctx.scale = LEVELS / (LEVELS - drop)
        ctx.save_for_backward(keep)
        return x.mul(keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None


def dropout(x: Tensor, p: float, training: bool = True, kind: str = "torch", inplace: bool = False) -> Tensor:
    """``F.dropout(x, p, training, inplace)``, or with ``kind="16bit"`` on a CPU float tensor in training (not in
    place), a mask from 16-bit draws (the module docstring)."""
    if kind == "torch" or not training or inplace or x.device.type != "cpu" or not x.is_floating_point():
        return F.dropout(x, p, training, inplace)
    check_cpu_dropout(kind)
    drop = round(p * LEVELS) if 0.0 <= p <= 1.0 else -1
    if not 0 < drop < LEVELS:  # p = 0 or 1, or within 1/131,072 of them; or not a probability (torch says so)
        return F.dropout(x, p, training)
    return _Dropout16.apply(x, drop)


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose masks on the CPU are ``kind``'s (``"torch"`` or ``"16bit"``; :func:`set_cpu_dropout`)."""

    kind: str = "torch"

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training, self.kind, self.inplace)


def set_cpu_dropout(model: nn.Module, kind: str) -> int:
    """Give every :class:`Dropout` of ``model`` the masks ``kind`` on the CPU; returns how many it set. Plain
    ``nn.Dropout`` modules (e.g. transformers') keep torch's."""
    check_cpu_dropout(kind)
    found = [m for m in model.modules() if isinstance(m, Dropout)]
    for module in found:
        module.kind = kind
    return len(found)
