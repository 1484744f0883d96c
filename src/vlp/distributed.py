"""The one module of vlp that touches ``torch.distributed``, and where a process learns its device
(:func:`device`) and whether its CPU runs bf16 matmuls no slower than fp32 ones (:func:`probe_cpu_bf16`,
:func:`require_cpu_bf16`).

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

import contextlib
import datetime
import hashlib
import json
import logging
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

log = logging.getLogger(__name__)

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


ALLOW_SLOW_BF16 = "VLP_ALLOW_SLOW_BF16"  # "1": run bf16 on a CPU where it is slow anyway (the tests on such machines)
CPU_BF16 = "VLP_CPU_BF16"  # "fast" or "slow": the probe's verdict, taken as it is, with nothing measured
PROBE_SIZES = (128, 512)  # n of the n x n matmuls timed, smallest first
PROBE_REPEATS = 3  # timed calls of each matmul, after one warm-up call: the best counts
# bf16 matmul time / fp32's above which bf16 is refused: slower than fp32. CPUs fall far on either side (0.25-0.55
# with avx512_bf16 or AMX, 4 and more without), so noise never moves a verdict; at parity bf16 costs only its casts
MAX_BF16_RATIO = 1.0
# ... above which the smallest size decides alone, no larger matmul timed: AVX2's loops take 20-25x fp32's time at
# both sizes (0.02 s for the small one, 0.7 s for both), a bf16 CPU's kernels at most about fp32's
EARLY_BF16_RATIO = 8.0
PROBE_VERSION = 1  # part of the cache's key: a change of the probe measures again


class SlowCpuBf16Error(ValueError):
    """bf16 asked for on a CPU whose bf16 matmuls are slower than its fp32 ones (:func:`require_cpu_bf16`)."""


@dataclass(frozen=True)
class Bf16Probe:
    """What :func:`probe_cpu_bf16` found: the best time of a ``size`` x ``size`` matmul on one thread in bf16 and in
    fp32, its verdict (``fast``: ``bf16_s`` at most :data:`MAX_BF16_RATIO` times ``fp32_s``) and where it comes from:
    ``measured`` in this process, ``cached`` (an earlier process's measurement, read from ``path``) or ``forced``
    (:data:`CPU_BF16`; no figures: ``size`` 0, times NaN)."""

    fast: bool
    size: int
    bf16_s: float
    fp32_s: float
    source: str
    path: str = ""

    @property
    def ratio(self) -> float:
        """bf16's time over fp32's."""
        return self.bf16_s / self.fp32_s

    def figures(self) -> str:
        """The measurement in words (one line), or the setting that stood in for it."""
        if self.source == "forced":
            return f"{CPU_BF16}={'fast' if self.fast else 'slow'} says so (nothing measured)"
        ratio = f"{self.ratio:.2f}" if self.ratio < 10 else f"{self.ratio:.0f}"
        return (
            f"a {self.size} x {self.size} matmul on one thread takes {self.bf16_s * 1e3:.3g} ms in bf16 against "
            f"{self.fp32_s * 1e3:.3g} ms in fp32, {ratio}x as long"
        )


_PROBED: dict[str, Bf16Probe] = {}  # this process's verdicts, by cache file (a verdict is found once per process)


def _cpu_identity() -> tuple[str, list[str]]:
    """This CPU's model name and its feature flags (``/proc/cpuinfo``; the platform's names where there is none)."""
    model = ""
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == "model name" and not model:
                    model = value.strip()
                elif name.strip() in ("flags", "Features") and not flags:
                    flags = sorted(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def _probe_key() -> dict[str, Any]:
    """What the probe's verdict depends on: the CPU (model and flags), torch's version and kernels, the probe's own."""
    model, flags = _cpu_identity()
    return {
        "cpu": model,
        "flags": hashlib.sha256(" ".join(flags).encode()).hexdigest()[:16],
        "capability": torch.backends.cpu.get_cpu_capability(),
        "torch": str(torch.__version__),
        "probe": PROBE_VERSION,
    }


def _cache_path(key: dict[str, Any]) -> Path | None:
    """``$XDG_CACHE_HOME/vlp/cpu-bf16-<key's hash>.json`` (``~/.cache`` without it; None without a home directory
    either): one file per key, so machines that share a home directory keep one each."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    try:
        root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    except RuntimeError:  # no $HOME and no passwd entry
        return None
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return root / "vlp" / f"cpu-bf16-{digest}.json"


def _time_matmuls(size: int) -> tuple[float, float]:
    """``(bf16_s, fp32_s)``: the best of :data:`PROBE_REPEATS` timed calls of a ``size`` x ``size`` matmul in bf16 and
    in fp32, each after one warm-up call (oneDNN builds its kernel at the first)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    best = []
    for x, y in ((a.bfloat16(), b.bfloat16()), (a, b)):
        torch.mm(x, y)
        times = []
        for _ in range(PROBE_REPEATS):
            start = time.perf_counter()
            torch.mm(x, y)
            times.append(time.perf_counter() - start)
        best.append(min(times))
    return best[0], best[1]


def _measure() -> tuple[int, float, float]:
    """``(size, bf16_s, fp32_s)`` on one thread, outside autocast: each of :data:`PROBE_SIZES` in turn, stopping at
    the first where bf16 takes over :data:`EARLY_BF16_RATIO` times fp32's time (on an AVX2-only CPU the smallest one
    says it, at 1/64 of the next one's work)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.autocast("cpu", enabled=False), torch.no_grad():
            for size in PROBE_SIZES:
                bf16_s, fp32_s = _time_matmuls(size)
                if bf16_s > EARLY_BF16_RATIO * fp32_s:
                    break
    finally:
        torch.set_num_threads(threads)
    return size, bf16_s, fp32_s


def _read_cached(path: Path, key: dict[str, Any]) -> Bf16Probe | None:
    """The figures ``path`` holds for ``key``, judged again; None when it holds none (no file, another key, damaged)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record["key"] != key:
            return None
        size, bf16_s, fp32_s = int(record["size"]), float(record["bf16_s"]), float(record["fp32_s"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.info("the bf16 probe's cache %s is unreadable (%s): measuring again", path, exc)
        return None
    if not (size > 0 and 0 < bf16_s < math.inf and 0 < fp32_s < math.inf):
        log.info("the bf16 probe's cache %s holds no valid figures: measuring again", path)
        return None
    return Bf16Probe(bf16_s <= MAX_BF16_RATIO * fp32_s, size, bf16_s, fp32_s, "cached", str(path))


def _write_cached(path: Path, key: dict[str, Any], probe: Bf16Probe) -> None:
    """Keep ``probe``'s figures in ``path`` for the next process (atomically); a cache that cannot be written is
    logged and left: the next process measures again."""
    record = {"key": key, "size": probe.size, "bf16_s": probe.bf16_s, "fp32_s": probe.fp32_s}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        log.info("cannot cache the bf16 probe's figures in %s (%s): the next process measures again", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def probe_cpu_bf16() -> Bf16Probe:
    """Whether this CPU runs bf16 matmuls at least as fast as fp32 ones, found by timing both (:func:`_measure`: well
    under a second on any CPU) once per machine: the figures are cached in a JSON file keyed by the CPU's model and
    flags and torch's version (:func:`_cache_path`), and once per process in memory. ``VLP_CPU_BF16=fast|slow``
    gives the verdict without measuring.

    Measured, not read from flags: torch runs bf16 matmuls at about twice fp32's rate with ``avx512_bf16`` or AMX,
    about four times slower than fp32 through oneDNN on AVX-512 without them, and 20 to hundreds of times slower in
    plain loops on AVX2 alone; which kernel a CPU gets depends on torch's build as much as on the CPU.

    Raises:
        ValueError: ``VLP_CPU_BF16`` is set to something other than ``fast`` or ``slow``.
    """
    forced = os.environ.get(CPU_BF16)
    if forced:
        if forced not in ("fast", "slow"):
            raise ValueError(f"{CPU_BF16} must be fast or slow (or unset, to measure), got {forced!r}")
        return Bf16Probe(forced == "fast", 0, math.nan, math.nan, "forced")
    key = _probe_key()
    path = _cache_path(key)
    probe = _PROBED.get(str(path)) or (_read_cached(path, key) if path else None)
    if probe is None:
        size, bf16_s, fp32_s = _measure()
        probe = Bf16Probe(bf16_s <= MAX_BF16_RATIO * fp32_s, size, bf16_s, fp32_s, "measured", str(path or ""))
        log.info("bf16 on this CPU: %s", probe.figures())
        if path:
            _write_cached(path, key, probe)
    _PROBED[str(path)] = probe
    return probe


def cpu_bf16_support() -> tuple[bool, str]:
    """``(fast, what)``: :func:`probe_cpu_bf16`'s verdict, and what it rests on in words (after "this CPU has")."""
    probe = probe_cpu_bf16()
    return probe.fast, f"bf16 matmuls {'no slower than' if probe.fast else 'slower than'} fp32's: {probe.figures()}"


def require_cpu_bf16(setting: str, instead: str) -> None:
    """Refuse ``setting`` (a config key asking for bf16 on the CPU) on a CPU whose bf16 matmuls are slower than fp32
    (:func:`probe_cpu_bf16`), in one line naming the measured figures and ``instead``, what to set: a run there would
    be several to hundreds of times slower than asked, without a word. ``VLP_ALLOW_SLOW_BF16=1`` runs it anyway
    (and skips the probe).

    Raises:
        SlowCpuBf16Error: on such a CPU (a ``ValueError``: the CLI's one line and exit code 2).
    """
    if os.environ.get(ALLOW_SLOW_BF16) == "1":
        return
    probe = probe_cpu_bf16()
    if not probe.fast:
        cache = f"; delete {probe.path} to measure again" if probe.path else ""
        raise SlowCpuBf16Error(
            f"{setting} asks for bf16 on this CPU, where bf16 matmuls are slower than fp32: {probe.figures()}{cache}; "
            f"set {instead} (or {ALLOW_SLOW_BF16}=1 to run it anyway)"
        )
