"""Ctrl-C and SIGTERM as one kind of interruption: while :func:`interrupt_on_signals` is active, SIGTERM raises
:class:`Terminated` (a ``KeyboardInterrupt``) in the main thread, so a command stopped by a pod's deletion ends as
one stopped by Ctrl-C (a training step at its newest checkpoint, its MLflow run KILLED). The CLI and the KFP
components' step runner use it; it imports nothing of vlp."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so a step stops as it does on Ctrl-C."""

    signum = int(signal.SIGTERM)


_received: list[int] = []  # the signals :func:`interrupt_on_signals` saw, in case a C extension swallowed the raise


def _on_signal(signum: int, frame: Any) -> None:
    _received.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _quiet_unraisable(previous: Any, start: int) -> Any:
    """A ``sys.unraisablehook`` that drops the interruption :func:`_on_signal` raised where Python cannot raise it
    (a ``__del__``, a weakref callback such as the import system's module-lock cleanup: Python would print "Exception
    ignored in ..." with a traceback, and carry on); ``_received`` has the signal, so the command still stops as
    interrupted. Everything else goes to ``previous``."""

    def hook(unraisable: Any) -> None:
        if not (isinstance(unraisable.exc_value, KeyboardInterrupt) and len(_received) > start):
            previous(unraisable)

    return hook


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[list[int]]:
    """While inside, SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) in the main thread, SIGINT a
    ``KeyboardInterrupt`` as usual, and the signals seen are in the yielded list (a raise inside a C callback, e.g.
    during video encoding, can be lost: the list still says the command was stopped). The previous handlers are
    put back on the way out. A SIGINT that was ignored (``SIG_IGN``, e.g. a background job) stays ignored. A signal
    that lands where Python cannot raise (a ``__del__`` or weakref callback) is not printed as an ignored exception:
    the list has it.
    Elsewhere than in the main thread (where Python cannot install signal handlers) it does nothing. Under
    torchrun every worker is its own process and main thread: a SIGTERM the launcher sends to stop the workers
    ends each of them like this."""
    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous_hook = sys.unraisablehook
    signal.signal(signal.SIGTERM, _on_signal)
    if previous[signal.SIGINT] is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_signal)
    start = len(_received)
    sys.unraisablehook = _quiet_unraisable(previous_hook, start)
    try:
        yield seen
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.unraisablehook = previous_hook
        seen += _received[start:]
        del _received[start:]


def signal_exception(signum: int) -> KeyboardInterrupt:
    """The exception a signal raises in the main thread: :class:`Terminated` for SIGTERM, else KeyboardInterrupt."""
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def run_interruptible(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, where SIGTERM and SIGINT cancel ``main`` (its tasks unwind: connections close, ``finally``
    blocks run) and are then raised as :func:`signal_exception` from here, rather than wherever a coroutine happened
    to be, which would leave tasks pending and print them on the way out. Outside the main thread, plain
    ``asyncio.run``."""
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(main)
    got: list[int] = []

    async def guarded() -> T:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def stop(signum: int) -> None:
            got.append(signum)
            task.cancel()

        for sig, handler in previous.items():
            if handler is not signal.SIG_IGN:
                loop.add_signal_handler(sig, stop, sig)
        try:
            return await main
        finally:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler)

    try:
        result = asyncio.run(guarded())
    except asyncio.CancelledError:
        if not got:
            raise
    finally:
        _received.extend(got)  # what interrupt_on_signals reports, whatever the unwinding raised
    if got:
        raise signal_exception(got[0])
    return result


_PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(parent: int) -> None:
    """Call first thing in a worker process whose parent is ``parent`` (a pid): the worker is SIGKILLed when its
    parent dies, however it dies (SIGKILL and the OOM killer included), even in the middle of a call that never
    returns (Linux's parent-death signal; elsewhere nothing is set). A parent already gone ends the worker at once.
    The signal follows the thread that started the worker: start workers from a thread that outlives them."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
