"""What the C allocator does with the memory a process frees: keep it for the next allocation, or hand it back.

A training step allocates and frees the same large host tensors at every step: activations, each weight's bf16
copy under autocast, each gradient, the optimiser's temporaries. glibc's ``malloc`` serves a block above its mmap
threshold (128 KiB at start, raised up to 32 MiB as such blocks are freed) with a fresh ``mmap`` and unmaps it at
``free``, and trims the top of its heap back to the kernel once enough is free there. So at every step the kernel
maps in and zeroes the pages of those tensors again, one page fault per 4 KiB page: 65,000-264,000 minor faults in
each paper-size ALPRO or ALBEF step measured on a 2-core CPU (``docs/results/speed.md``, round 4).

:func:`keep_freed_memory` (the training sections' ``freed_memory: keep``, their default) tells glibc to serve every
block from its heap (``M_MMAP_MAX`` = 0) and never to trim it (``M_TRIM_THRESHOLD`` = -1): a freed block stays with
the process and serves the next step's tensors, with no page fault (measured: ALBEF's paper-size bf16 step 24%
shorter, its fp32 step and ALPRO's fp32 step 3-17%, ALPRO's bf16 step within the runs' spread). The cost is that the
process's resident memory no longer falls after a peak: it stays at its high-water mark, which a training process
reaches in its first step and comes back to at every step anyway. Where a block lies changes no computed value:
torch aligns every tensor to 64 bytes either way, and the tests compare the weights of training runs with and
without it byte for byte. It is the effect for which PyTorch's CPU performance guides recommend preloading jemalloc
or tcmalloc, without a library to install: two ``mallopt`` calls. Elsewhere than glibc (musl, macOS) it does nothing
and says so by returning False. The setting holds for the rest of the process (``freed_memory: release`` only leaves
glibc's defaults alone).
"""

from __future__ import annotations

import ctypes
import functools
import platform

FREED_MEMORY = ("keep", "release")  # the ``freed_memory`` values

_M_TRIM_THRESHOLD = -1  # <malloc.h>: mallopt's parameters
_M_MMAP_MAX = -4


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL(None)
    return libc if hasattr(libc, "mallopt") else None


def keep_freed_memory() -> bool:
    """Have glibc keep the memory this process frees for its next allocations (see the module docstring); True
    when it took effect, False where the C library is not glibc (nothing changed)."""
    libc = _glibc()
    if libc is None:
        return False
    # mallopt returns 1 on success, 0 on error
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, -1))


def apply_freed_memory(choice: str) -> bool:
    """Apply a ``freed_memory`` value: ``"keep"`` calls :func:`keep_freed_memory` (its result is returned),
    ``"release"`` leaves the allocator as it is (False); anything else is refused in one line."""
    if choice not in FREED_MEMORY:
        raise ValueError(f"freed_memory must be one of {list(FREED_MEMORY)}, got {choice!r}")
    return keep_freed_memory() if choice == "keep" else False
