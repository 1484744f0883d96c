"""What a ``kfp.local`` run prints: one start line and one end line per task, the steps' own output, and none of
the executor's bookkeeping (unless ``verbose``).

``kfp.local`` (2.17) logs a banner, the executor's whole input as indented JSON, every output artifact and a
horizontal rule around each task: hundreds of lines per short step, among which a step's progress is lost. It
offers no switch for that, so :class:`Talk` wraps four of its module functions for the duration of a run
(``kfp`` is pinned in ``requirements/constraints.txt``; ``tests/test_local_talk.py`` fails when a new release
moves them):

- ``task_executor.execute_single_task``: a ``[HH:MM:SS] <task> started`` / ``... done in 12.3 s`` /
  ``... reused from KFP's cache`` / ``... FAILED after 4.1 s`` line around every task, and the task's outputs
  recorded in :attr:`Talk.outputs` (the cached ones included: their files live in the run that made them);
- ``task_dispatcher.run_single_task_implementation``: tells a run task from a cache hit;
- ``subprocess_task_handler.run_local_subprocess``: the step's output, less the ``[KFP Executor ...]`` lines and
  the executor input's JSON; each step runs in a process group of its own, which an interruption stops;
- ``logging_utils.local_logger_context`` and ``print_horizontal_line``: kfp's own INFO lines and rules off
  (warnings and errors stay).
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

EXECUTOR_PREFIX = "[KFP Executor "  # kfp.dsl.executor_main's log format
EXECUTOR_INPUT = "Got executor_input:"  # followed by the input as indented JSON, closed by a "}" line


def clock() -> str:
    return time.strftime("%H:%M:%S")


class ExecutorFilter:
    """Drops kfp's executor log lines and the JSON dump that follows ``Got executor_input:`` from a line stream."""

    def __init__(self) -> None:
        self.in_dump = False

    def keep(self, line: str) -> bool:
        if self.in_dump:
            self.in_dump = line.rstrip("\r\n") != "}"
            return False
        if line.startswith(EXECUTOR_PREFIX):
            self.in_dump = EXECUTOR_INPUT in line
            return False
        return True


class Talk:
    """Context manager around a ``kfp.local`` pipeline call; see the module docstring.

    Attributes:
        outputs: ``{task: {output name: artifact or value}}`` of every task that ended, in the order they ended.
        order: ``[(task, "done" | "cached" | "failed", seconds)]``.
        running: The task being run (None between tasks).
    """

    def __init__(self, verbose: bool = False, stream: TextIO | None = None):
        self.verbose, self.stream = verbose, stream
        self.outputs: dict[str, dict[str, Any]] = {}
        self.order: list[tuple[str, str, float]] = []
        self.running: str | None = None
        self._executed = threading.local()
        self._lock = threading.Lock()
        self._saved: list[tuple[Any, str, Any]] = []

    def say(self, text: str) -> None:
        out = self.stream or sys.stdout
        with self._lock:
            out.write(f"[{clock()}] {text}\n")
            out.flush()

    # ------------------------------------------------------------------ wrappers

    def _execute_single_task(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(task_name: str, *args: Any, **kwargs: Any) -> Any:
            from kfp.local import status

            self._executed.ran = False
            self.running = task_name
            start = time.perf_counter()
            self.say(f"{task_name} started")
            outputs, task_status = original(task_name, *args, **kwargs)
            took = time.perf_counter() - start
            self.running = None
            if task_status == status.Status.SUCCESS:
                kind = "done" if getattr(self._executed, "ran", True) else "cached"
                self.outputs[task_name] = dict(outputs or {})
                said = f"done in {took:.1f} s" if kind == "done" else "reused from KFP's cache"
                self.say(f"{task_name} {said}")
            else:
                kind = "failed"
                self.say(f"{task_name} FAILED after {took:.1f} s (its output is above)")
            self.order.append((task_name, kind, took))
            return outputs, task_status

        return wrapper

    def _run_single_task_implementation(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self._executed.ran = True
            return original(*args, **kwargs)

        return wrapper

    def _run_local_subprocess(self, full_command: list[str], env_vars: dict[str, str] | None = None) -> int:
        """kfp's ``run_local_subprocess``, less the executor's bookkeeping lines, in a process group of its own; an
        interruption (Ctrl-C, or the SIGTERM that ``pipelines.local_run`` turns into an exception) stops that group
        before it goes on."""
        import os

        env = {**os.environ, **env_vars} if env_vars else None
        keep = (lambda line: True) if self.verbose else ExecutorFilter().keep
        with subprocess.Popen(
            full_command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=env,
            start_new_session=True,  # kfp runs `sh -ec ... python -m kfp.dsl.executor_main`: stop both, not sh alone
        ) as process:
            try:
                assert process.stdout is not None
                for line in iter(process.stdout.readline, ""):
                    if keep(line):
                        print(line, end="", flush=True)  # kfp indents it under the task (indented_print)
                return process.wait()
            except BaseException:
                self.stop(process)
                raise

    @staticmethod
    def stop(process: subprocess.Popen[str], grace_s: float = 30.0) -> None:
        """End a step's process group: SIGTERM, which the step handles as an interruption (``vlp.cli``'s
        ``interrupt_on_signals`` in ``components._runtime.Step.run``: its MLflow run ends KILLED), ``grace_s`` to
        exit, then SIGKILL to whatever is left of the group. Its last output is not shown: the run says one line."""
        import os

        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)  # sh: it ends at once, the step under it may take a moment
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    # ------------------------------------------------------------------ context

    def _patch(self, module: Any, name: str, value: Any) -> None:
        self._saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    def __enter__(self) -> Talk:
        from kfp.local import logging_utils, subprocess_task_handler, task_dispatcher
        from kfp.local.orchestrator import task_executor

        # kfp indents a task's output by replacing builtins.print for the task (indented_print); tasks of a
        # ParallelFor run side by side and can leave it replaced, indenting every later print of this process
        self._patch(builtins, "print", builtins.print)
        self._patch(task_executor, "execute_single_task", self._execute_single_task(task_executor.execute_single_task))
        run_impl = task_dispatcher.run_single_task_implementation
        self._patch(task_dispatcher, "run_single_task_implementation", self._run_single_task_implementation(run_impl))
        self._patch(subprocess_task_handler, "run_local_subprocess", self._run_local_subprocess)
        if not self.verbose:
            self._patch(logging_utils, "local_logger_context", _quiet_logger_context)
            self._patch(logging_utils, "print_horizontal_line", lambda: None)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._saved:
            module, name, value = self._saved.pop()
            setattr(module, name, value)


@contextlib.contextmanager
def _quiet_logger_context() -> Iterator[None]:
    """kfp's ``local_logger_context`` at WARNING: its errors and warnings reach stderr, its INFO chatter does not."""
    logger = logging.getLogger()
    saved_level, saved_handlers = logger.level, logger.handlers[:]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kfp.local %(levelname)s: %(message)s"))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(saved_level)
        logger.handlers[:] = saved_handlers
