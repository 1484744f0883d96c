"""Run a per-file function in worker processes so that one bad file cannot take a data step down.

:func:`isolated_map` yields ``fn(item)`` for every item, in input order, computed by long-lived worker
processes. Each worker serves one item at a time over its own pipe, so the parent always knows which
item a worker holds: a worker that dies (a decoder segfault, the kernel's OOM killer) or runs past
``timeout_s`` is killed and replaced, and that item alone gets ``on_failure(item, reason)`` as its
result; the other items carry on. An exception raised by ``fn`` is re-raised in the parent (the
functions used here turn every defect of a file into a result, and raise only for what must fail the
step, e.g. a storage outage). A worker ends with its parent, however the parent dies: it holds no copy of any
parent's end of a pipe (so its next read sees the end), and Linux kills it with the parent
(:func:`vlp.signals.die_with_parent`), even in the middle of an item.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from vlp import storage
from vlp.signals import die_with_parent

_PARENT_ENDS: set[Connection] = set()  # this process's ends of its workers' pipes, which a forked worker inherits


def _serve(conn: Connection, fn: Callable[[Any], Any], settings: storage.StorageConfig, parent: int) -> None:
    die_with_parent(parent)
    for end in list(_PARENT_ENDS):  # a fork's copies: held here, they would keep this pipe open past the parent
        end.close()
    _PARENT_ENDS.clear()
    storage.configure(settings)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        index, item = message
        try:
            reply = (index, True, fn(item))
        except BaseException as exc:  # handed to the parent, which re-raises it
            reply = (index, False, exc)
        conn.send(reply)


class _Worker:
    def __init__(self, ctx: Any, fn: Callable[[Any], Any]) -> None:
        self.conn, child = ctx.Pipe()
        _PARENT_ENDS.add(self.conn)
        self.proc = ctx.Process(target=_serve, args=(child, fn, storage.current_config(), os.getpid()), daemon=True)
        self.proc.start()
        child.close()
        self.index: int | None = None  # the item it holds
        self.since = 0.0

    def give(self, index: int, item: Any) -> None:
        self.index, self.since = index, time.monotonic()
        self.conn.send((index, item))

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        else:
            with contextlib.suppress(OSError):
                self.conn.send(None)
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()
        _PARENT_ENDS.discard(self.conn)


def isolated_map(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    *,
    workers: int,
    timeout_s: float,
    on_failure: Callable[[Any, str], Any],
    window: int = 0,
) -> Iterator[Any]:
    """``fn(item)`` for ``items`` in order, each computed in one of ``workers`` processes.

    Args:
        fn: The per-item function (inherited by the forked workers; picklable where fork is unavailable).
        items: What to process; each item and result crosses a pipe (picklable).
        workers: Worker processes (>= 1).
        timeout_s: Longest an item may run (0 = no limit); a worker past it is killed.
        on_failure: ``on_failure(item, reason)`` is the result of an item whose worker died or timed out;
            ``reason`` reads ``"crashed: ..."`` or ``"timed out after N s"``.
        window: Most items handed out and not yet yielded (bounds memory; default ``4 * workers``).
    """
    ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    window = window or 4 * workers
    pool = [_Worker(ctx, fn) for _ in range(min(workers, max(len(items), 1)))]
    done: dict[int, Any] = {}
    next_item, next_out = 0, 0
    try:
        while next_out < len(items):
            for worker in pool:
                if worker.index is None and next_item < len(items) and next_item - next_out < window:
                    worker.give(next_item, items[next_item])
                    next_item += 1
            busy = [w for w in pool if w.index is not None]
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=0.5) if busy else []
            for slot, worker in enumerate(pool):
                if worker.index is None:
                    continue
                index = worker.index
                if worker.conn in ready or worker.conn.poll():
                    try:
                        got, ok, value = worker.conn.recv()
                    except (EOFError, OSError):
                        got, ok, value = index, None, None
                    if ok is not None:
                        if not ok:
                            raise value
                        done[got], worker.index = value, None
                        continue
                late = timeout_s and time.monotonic() - worker.since > timeout_s
                if worker.proc.is_alive() and not late:
                    continue
                reason = f"timed out after {timeout_s:g} s" if late else f"crashed: exit code {worker.proc.exitcode}"
                worker.stop(kill=True)
                done[index] = on_failure(items[index], reason)
                pool[slot] = _Worker(ctx, fn)
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1
    finally:
        for worker in pool:
            worker.stop(kill=worker.index is not None)
