"""fp32 linear layers through oneDNN on the CPU: the training sections' ``cpu_linear: onednn``.

torch computes an fp32 ``F.linear`` on the CPU with the BLAS it was built with: MKL in the x86 wheels. On the AMD
CPUs this was measured on, MKL ran at the rate of AVX2 code while oneDNN (which torch also ships, and uses for bf16)
computed the same products 1.6-2.6x faster in fp32 at the paper models' shapes, to fp32's accuracy
(``benchmarks/speed/bench_linear.py``; 2-core AMD EPYC, Zen 5: 138-234 against 311-471 GFLOP/s; largest error
against fp64 3-5e-7 and 3e-7-1.3e-6 of the product's largest entry). Every FLOP-heavy layer of the three families is an
``F.linear`` (the towers' projections and MLPs, the heads), so routing those through oneDNN moves most of an fp32
training step.

:func:`cpu_linears` with ``"onednn"`` is a context under which every fp32 ``F.linear`` on the CPU runs as
:class:`OneDnnLinear`: oneDNN's matmul forward, and oneDNN's matmuls for the input's and the weight's gradients in
the backward. Anything else passes through unchanged: bf16 (autocast, or a bf16 model), other devices, every other
op. The sums are the same products in another order, so the bits are not torch's: the result differs from torch's
``F.linear`` by fp32 rounding (``tests/test_linear.py``), and a run is deterministic on the same machine and thread
count, as torch's own is. Hence a config choice whose default (``torch``) keeps every recorded figure; at small
shapes oneDNN can be the slower one (``bench_linear.py --scale 0.1``: up to 7x slower on some tenth-size products).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

CPU_LINEARS = ("torch", "onednn")  # the ``cpu_linear`` values


def onednn_available() -> bool:
    """Whether this torch has oneDNN (``torch.backends.mkldnn``) and its dense linear op."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return torch.ops.mkldnn._linear_pointwise.default is not None
    except (AttributeError, RuntimeError):
        return False


def onednn_matmul(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.t() (+ bias)`` through oneDNN (``x``: ``(..., K)``, ``weight``: ``(N, K)``, any strides)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class OneDnnLinear(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` in fp32 through oneDNN, forward and backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_matmul(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = onednn_matmul(grad, weight.t())  # grad @ weight: (..., N) x (N, K)
        rows = grad.reshape(-1, grad.shape[-1])  # (M, N)
        if ctx.needs_input_grad[1]:
            grad_w = onednn_matmul(rows.t(), x.reshape(-1, x.shape[-1]).t())  # rows.t() @ x: (N, M) x (M, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = rows.sum(0)
        return grad_x, grad_w, grad_b


def _takes(x: Any, weight: Any, bias: Any) -> bool:
    """Whether :class:`OneDnnLinear` computes this call: fp32 CPU tensors outside CPU autocast."""
    tensors = (x, weight) if bias is None else (x, weight, bias)
    return (
        all(isinstance(t, Tensor) and t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
        and x.dim() >= 1
        and weight.dim() == 2
        and not torch.is_autocast_enabled("cpu")
    )


class _OneDnnLinears(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            if _takes(x, weight, bias):
                return OneDnnLinear.apply(x, weight, bias)
        return func(*args, **kwargs)


@contextlib.contextmanager
def cpu_linears(kind: str) -> Iterator[None]:
    """Run the fp32 CPU ``F.linear`` calls inside through ``kind``: ``"torch"`` (as they are) or ``"onednn"``.
    :class:`OneDnnLinear`'s backward needs no context. The mode did not reach the calls ``torch.utils.checkpoint``
    recomputes in the backward (the recomputation saved other tensors than the forward), and compiled blocks were
    not tried under it: the training loop refuses ``cpu_linear=onednn`` with ``grad_checkpointing`` or ``compile``."""
    check_cpu_linear(kind)
    if kind == "torch":
        yield
        return
    with _OneDnnLinears():
        yield


def check_cpu_linear(kind: str) -> None:
    """Refuse, in one line, a ``cpu_linear`` value that is not one or that this torch cannot run."""
    if kind not in CPU_LINEARS:
        raise ValueError(f"cpu_linear must be one of {list(CPU_LINEARS)}, got {kind!r}")
    if kind == "onednn" and not onednn_available():
        raise RuntimeError("cpu_linear=onednn: this torch has no oneDNN (torch.backends.mkldnn); set cpu_linear=torch")
