"""The ITC queue's features as rows, kept from step to step.

ALBEF keeps each queue as a ``(D, M)`` buffer (the released code's layout, and so its checkpoints') and scores a
batch against ``torch.cat([batch_feat, queue.t()])``: a ``(B + M, D)`` matrix whose rows are the batch's momentum
features, then the queue's columns. Building it transposes the whole queue at every step. At the paper's 65,536 x 256
and batch 2, a step's queue work (both matrices, the four score matmuls, the enqueue) took 114 ms in fp32 and 81 ms in
bf16 that way on a 2-core CPU, and 33 ms and 5 ms with the rows kept (``benchmarks/speed/bench_albef_queue.py``).

:class:`QueueRows` keeps that matrix: the queue's columns as rows, in the features' dtype, with room for the batch in
front, updated with the columns an enqueue wrote rather than rebuilt. :meth:`QueueRows.with_batch` returns a tensor
with the cat's shape, dtype, values and memory layout (contiguous ``(B + M, D)``), so everything computed from it has
the cat's bits (``tests/test_albef.py``; the benchmark checks the paper size).

Two rules keep it equal to the queue:

- the rows are rebuilt from the queue whenever the queue is another tensor, or was written to other than through
  :meth:`QueueRows.write` (a checkpoint load, a test's write): the queue's identity, storage and autograd
  version counter are compared at every call;
- the returned tensor is a view of the rows, which the next ``with_batch`` writes into. Its step's backward must
  therefore run before the next forward, as every training loop's does; a graph kept across a second forward
  fails loudly in its backward (autograd's check of saved tensors), it does not compute a wrong gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor


class QueueRows:
    """``(B + M, D)`` rows of one ``(D, M)`` queue with the batch's features in front (module docstring)."""

    def __init__(self) -> None:
        self._rows: Tensor | None = None
        self._queue: Tensor | None = None  # the queue the rows mirror (held, so its identity stays unique)
        self._stamp: tuple[int, int] = (0, -1)  # its storage and version when the rows last equalled it
        self._pending: list[tuple[int, int]] = []  # (column, count) written since, to copy in at the next call
        self._lead = 0  # rows in front of the queue's: the largest batch yet
        self.rebuilds = 0  # times the rows were built from the whole queue

    def _in_step(self, queue: Tensor) -> bool:
        return self._queue is queue and self._stamp == (queue.data_ptr(), queue._version)

    @torch.no_grad()
    def write(self, queue: Tensor, ptr: int, feat: Tensor) -> None:
        """``queue[:, ptr : ptr + n] = feat.t()``, noted so that the next :meth:`with_batch` copies those columns in."""
        in_step = self._in_step(queue)
        queue[:, ptr : ptr + feat.shape[0]] = feat.t()
        if in_step:
            self._pending.append((ptr, feat.shape[0]))
            self._stamp = (queue.data_ptr(), queue._version)

    @torch.no_grad()
    def with_batch(self, queue: Tensor, feat: Tensor) -> Tensor:
        """``torch.cat([feat, queue.t().to(feat)])``: the same shape, dtype, values and layout, without the copy."""
        b, (d, m) = feat.shape[0], queue.shape
        rows = self._rows  # in feat's dtype: the queue cast once, as the cat casts it at every step
        if rows is None or not self._in_step(queue) or rows.dtype != feat.dtype or rows.shape[1] != d or self._lead < b:
            self._lead = max(b, self._lead)  # room for the largest batch yet: alternating sizes do not rebuild
            rows = torch.empty(self._lead + m, d, dtype=feat.dtype, device=queue.device)
            rows[self._lead :] = queue.t()
            self._rows, self._queue, self._pending = rows, queue, []
            self._stamp = (queue.data_ptr(), queue._version)
            self.rebuilds += 1
        lead = self._lead
        for ptr, n in self._pending:
            rows[lead + ptr : lead + ptr + n] = queue[:, ptr : ptr + n].t()
        self._pending.clear()
        rows[lead - b : lead] = feat
        return rows[lead - b :]
