"""The one module of vlp that touches ``torch.distributed``, and where a process learns its device
(:func:`device`) and whether its CPU can do bf16 (:func:`require_cpu_bf16`).

Every helper degrades to the single-process behaviour when no process group is initialised
(plain ``python``, pytest, a one-GPU ``torchrun``), so library code can call them
unconditionally. Processes are started by ``torchrun`` (or ``torch.multiprocessing.spawn`` in
tests); :func:`init_from_env` reads the standard torchrun variables ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``.

Gradient convention of :func:`all_gather_with_grad` (the same as ALBEF's ``GatherLayer`` and
``torch.distributed.nn.all_gather``): the backward pass *sums* the incoming gradients over ranks
and hands each rank the slice that belongs to its local input. If rank ``r`` computes a loss
``L_r`` from the gathered tensor, the gradient arriving at ``x_r`` is ``d(sum_r' L_r') / d x_r``.
When every rank's ``L_r`` is a mean over its local rows of a loss over the global batch (ALPRO's
VTC), ``sum_r L_r = W * L`` with ``L`` the one-process loss on the concatenated batch, so the
local feature gradient is ``W`` times the one-process one, and after DDP *averages* parameter
gradients over the ``W`` ranks, the parameters see exactly ``dL/dtheta``. tests/test_distributed.py
checks both statements.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = [
    "DistInfo",
    "all_gather_no_grad",
    "all_gather_with_grad",
    "all_reduce_mean",
    "barrier",
    "cleanup",
    "init_from_env",
    "is_dist",
    "local_rank",
    "rank",
    "world_size",
    "wrap_ddp",
]


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: global rank, rank on its node, number of processes, backend."""

    rank: int
    local_rank: int
    world_size: int
    backend: str | None  # None when not distributed


def is_dist() -> bool:
    """True when a process group is initialised (and so collectives must be used)."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """Global rank of this process; 0 when not distributed."""
    return dist.get_rank() if is_dist() else 0


def world_size() -> int:
    """Number of processes in the group; 1 when not distributed."""
    return dist.get_world_size() if is_dist() else 1


def local_rank() -> int:
    """Rank on this node (``LOCAL_RANK`` from torchrun); 0 when unset."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(f"WORLD_SIZE > 1 but {name} is not set; start the processes with torchrun (or set {name}).")
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"environment variable {name}={value!r} is not an integer") from None


def init_from_env(backend: str = "auto", *, timeout_s: float = 600.0) -> DistInfo:
    """Initialise the default process group from torchrun's environment variables.

    A no-op (returning a single-process :class:`DistInfo`) when ``WORLD_SIZE`` is unset or 1.
    Idempotent: a second call returns the current state.

    Args:
        backend: ``"auto"`` (``nccl`` when CUDA is available, else ``gloo``), ``"gloo"`` or ``"nccl"``.
        timeout_s: how long collectives wait for the other ranks before failing.

    Returns:
        The :class:`DistInfo` of this process.

    Raises:
        RuntimeError: if a needed variable is missing or malformed, or ``nccl`` is asked for without CUDA.
        ValueError: for an unknown backend name.
    """
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"unknown backend {backend!r}; use 'auto', 'gloo' or 'nccl'")
    if is_dist():
        return DistInfo(rank(), local_rank(), world_size(), dist.get_backend())
    world = int(os.environ.get("WORLD_SIZE", "1") or "1")
    if world <= 1:
        return DistInfo(0, 0, 1, None)
    global_rank = _env_int("RANK")
    if not os.environ.get("MASTER_ADDR"):
        raise RuntimeError(f"WORLD_SIZE={world} but MASTER_ADDR is not set; start the processes with torchrun.")
    _env_int("MASTER_PORT")
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("backend 'nccl' needs CUDA; use 'gloo' (or 'auto') on CPU")
        torch.cuda.set_device(local_rank())
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=global_rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return DistInfo(global_rank, local_rank(), world, backend)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather along dim 0 whose backward sums gradients over ranks and returns the local slice."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # (B, ...) -> (W * B, ...)
        ctx.batch = x.shape[0]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # (W * B, ...) -> (B, ...)
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        start = dist.get_rank() * ctx.batch
        return grad[start : start + ctx.batch]


def all_gather_with_grad(x: Tensor) -> Tensor:
    """Concatenate ``x`` from every rank along dim 0, keeping the autograd graph.

    Args:
        x: ``(B, ...)``, the same shape on every rank (use ``drop_last`` samplers).

    Returns:
        ``(W * B, ...)`` in rank order, so this rank's rows are ``[rank * B, (rank + 1) * B)``.
        The gradient flowing back into ``x`` is the sum over ranks of the gradients for that
        slice (see the module docstring). Identity when not distributed.
    """
    if world_size() == 1:
        return x
    return _GatherWithGrad.apply(x)


@torch.no_grad()
def all_gather_no_grad(x: Tensor) -> Tensor:
    """Concatenate ``x`` (``(B, ...)``, same shape on every rank) from every rank along dim 0, detached.

    Returns ``x`` itself (not detached) when not distributed.
    """
    if world_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=0)


@torch.no_grad()
def all_reduce_mean(x: Tensor) -> Tensor:
    """Mean of ``x`` over ranks (a new detached tensor; e.g. for logging a loss). Copy of ``x`` when alone."""
    out = x.detach().clone()
    if world_size() > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        out /= world_size()
    return out


def wrap_ddp(model: nn.Module, **kwargs: Any) -> nn.Module:
    """Wrap ``model`` in DistributedDataParallel when distributed; return it unchanged otherwise.

    DDP averages parameter gradients over ranks. On CUDA the module must already be on
    ``cuda:local_rank()``; ``device_ids`` is filled in for it. ``kwargs`` go to DDP.
    """
    if world_size() == 1:
        return model
    if next(model.parameters()).is_cuda and "device_ids" not in kwargs:
        kwargs["device_ids"] = [local_rank()]
    return nn.parallel.DistributedDataParallel(model, **kwargs)


def barrier() -> None:
    """Wait for every rank; no-op when not distributed."""
    if is_dist():
        dist.barrier()


def cleanup() -> None:
    """Destroy the process group if there is one (safe to call twice)."""
    if is_dist():
        dist.destroy_process_group()


def device() -> torch.device:
    """``cuda:<local rank>`` when a GPU is visible (torchrun sets the rank), else the CPU: where this process
    trains, evaluates and encodes."""
    return torch.device("cuda", local_rank()) if torch.cuda.is_available() else torch.device("cpu")


BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # /proc/cpuinfo flags of bf16 arithmetic ("bf16": on Arm)
ALLOW_SLOW_BF16 = "VLP_ALLOW_SLOW_BF16"  # "1": run bf16 on a CPU without it anyway (the tests on such machines)


def cpu_bf16_support() -> tuple[bool, str]:
    """``(fast, what)``: whether this CPU runs bf16 matmuls at speed, and what it has, in words.

    Fast: instructions for bf16 arithmetic (``avx512_bf16``, ``amx_bf16``; ``bf16`` on Arm), or oneDNN's bf16
    kernels, which need AVX-512 (they convert to fp32 in registers). Without either, as on an AVX2-only CPU, torch
    falls back to plain loops: a 2048 x 2048 bf16 matmul took 54 s there against 0.11 s in fp32.
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = {word for line in f if line.startswith(("flags", "Features")) for word in line.split()}
    except OSError:
        flags = set()
    capability = torch.backends.cpu.get_cpu_capability()
    native = [flag for flag in BF16_FLAGS if flag in flags]
    if native:
        return True, f"{', '.join(native)}; torch's CPU capability {capability}"
    if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return True, f"oneDNN's bf16 kernels on AVX-512; torch's CPU capability {capability}"
    return False, f"no bf16 instructions and no AVX-512; torch's CPU capability {capability}"


def require_cpu_bf16(setting: str, instead: str) -> None:
    """Refuse ``setting`` (a config key asking for bf16 on the CPU) on a CPU that cannot do bf16 at speed
    (:func:`cpu_bf16_support`), in one line naming what the CPU has and ``instead``, what to set: a run there would
    be hundreds of times slower than asked, without a word. ``VLP_ALLOW_SLOW_BF16=1`` runs it anyway.

    Raises:
        RuntimeError: on such a CPU.
    """
    if os.environ.get(ALLOW_SLOW_BF16) == "1":
        return
    fast, what = cpu_bf16_support()
    if not fast:
        raise RuntimeError(
            f"{setting} asks for bf16 on this CPU, which has {what}: its bf16 matmuls run hundreds of times slower "
            f"than fp32; set {instead} (or {ALLOW_SLOW_BF16}=1 to run it anyway)"
        )
