"""Ctrl-C (SIGINT) and SIGTERM stop a `vlp` command cleanly: one line, no traceback, exit 128 + signal, MLflow
runs KILLED, and a rerun of a training step resumes from the checkpoint the line names."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vlp import cli, signals
from vlp.tracking import (
    PARENT_RUN_TAG,
    MlflowLogger,
    TrackingConfig,
    client,
    end_open_runs,
    end_run,
    start_run,
    track_step,
)

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
LINE = re.compile(
    r"^vlp pretrain-prompter: interrupted at step (\d+); rerun the same command to resume from step (\d+)$"
)


def ctrl_c_on() -> None:
    """In the child before exec: SIGINT back to its default, so Python installs its Ctrl-C handler even when this
    test runs where SIGINT is ignored (a job started in the background of a non-interactive shell)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Poll until ``path`` exists (a checkpoint's ``state.json`` is its last file) while ``proc`` runs."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the process ended before {path} existed: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, f"no {path} after {timeout_s} s"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signalled_training_step_says_where_it_stopped_ends_its_run_killed_and_resumes(
    tiny_world, tmp_path, sig, code
):
    out, db = tmp_path / "out", tmp_path / "mlflow.db"
    cmd = [sys.executable, "-m", "vlp.cli", "pretrain-prompter", "--dataset", tiny_world["dataset"],
           "--frames", tiny_world["frames"], "--out", str(out), "--config", str(TINY), "pretrain.max_steps=60",
           "pretrain.ckpt_every=2", "pretrain.log_every=2", f"tracking.tracking_uri=sqlite:///{db}"]  # fmt: skip
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    proc = subprocess.Popen(cmd, **pipes, text=True, env=ENV, preexec_fn=ctrl_c_on)
    _wait_for(out / "checkpoints" / "step-000002" / "state.json", proc)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stdout == "", "an interrupted step prints no summary"
    said = [line for line in stderr.splitlines() if "interrupted" in line]
    assert len(said) == 1 and LINE.match(said[0]), said
    reached, resume = map(int, LINE.match(said[0]).groups())
    newest = max(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*") if (p / "state.json").exists())
    assert 2 <= resume == newest <= reached < 60
    assert not (out / "summary.json").exists()
    record = json.loads((out / "tracking.json").read_text())
    cfg = TrackingConfig(tracking_uri=f"sqlite:///{db}")
    assert record["status"] == "KILLED"
    assert client(cfg).get_run(record["run_id"]).info.status == "KILLED"

    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from step {resume} ({out / 'checkpoints' / f'step-{resume:06d}'})" in rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["resumed_from_step"] == resume and summary["steps"] == 60
    assert summary["tracking"]["run_id"] == record["run_id"], "the rerun continues the killed run"
    assert client(cfg).get_run(record["run_id"]).info.status == "FINISHED"


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signalled_step_that_does_not_train_says_so_in_one_line(tmp_path, sig, code):
    cmd = [sys.executable, "-m", "vlp.cli", "data", "synth", "--out", str(tmp_path / "raw"), "--config", str(TINY),
           "--num-videos", "800"]  # fmt: skip
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    proc = subprocess.Popen(cmd, **pipes, text=True, env=ENV, preexec_fn=ctrl_c_on)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + 120
    while not any("synth ->" in line for line in lines):  # run_step's first log line: the step is running
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-2000:]
        time.sleep(0.02)
    proc.send_signal(sig)  # in the rare case a C extension swallows the raise, synth ends and the CLI still says so
    assert proc.wait(timeout=120) == code, "".join(lines)[-3000:]
    reader.join(timeout=10)
    stderr = "".join(lines)
    assert "Traceback" not in stderr and proc.stdout.read() == "", stderr[-3000:]
    assert [line for line in stderr.splitlines() if "interrupted" in line] == [
        "vlp data: interrupted; rerun the same command to run it again"
    ]


def test_the_cli_puts_the_signal_handlers_back(tmp_path):
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    assert cli.main(["data", "synth", "--out", str(tmp_path / "raw"), "--config", str(tmp_path / "missing.yaml")]) == 2
    assert {sig: signal.getsignal(sig) for sig in before} == before
    with signals.interrupt_on_signals() as seen:
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
        with pytest.raises(signals.Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises in this thread long before
    assert seen == [signal.SIGTERM]
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_signal_that_lands_where_python_cannot_raise_is_not_printed(monkeypatch):
    """A signal handled inside a ``__del__`` or a weakref callback (the import system's module-lock cleanup, say)
    cannot raise there: Python hands the exception to ``sys.unraisablehook``, which printed "Exception ignored in"
    and a traceback into an interrupted step's one-line log. The interruption is dropped there (the list has it);
    any other unraisable exception still reaches the hook that was installed."""
    got = []
    record = got.append
    monkeypatch.setattr(sys, "unraisablehook", record)
    monkeypatch.setattr(signals, "_received", [])  # this test's signals alone

    class SignalledWhileCollected:
        def __del__(self):
            signals._on_signal(signal.SIGTERM, None)  # what the handler does when SIGTERM lands in a __del__

    class Broken:
        def __del__(self):
            raise ValueError("not an interruption")

    with signals.interrupt_on_signals() as seen:
        SignalledWhileCollected()  # collected at once, its raise unraisable
        Broken()
        assert sys.unraisablehook is not record
    assert sys.unraisablehook is record  # put back
    assert [type(u.exc_value) for u in got] == [ValueError]
    assert seen == [signal.SIGTERM]
    SignalledWhileCollected()  # outside the context an interruption is not dropped
    assert [type(u.exc_value) for u in got] == [ValueError, signals.Terminated]


# --------------------------------------------------------------------------- MLflow statuses


def test_an_interrupted_step_run_and_training_run_end_killed_and_a_failed_one_failed(tmp_path):
    cfg = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", experiment="interrupt")
    statuses = {}
    for name, error in (("killed", KeyboardInterrupt), ("terminated", signals.Terminated), ("failed", RuntimeError)):

        def work(name=name, error=error):
            statuses[name] = cfg.run_id
            logger = MlflowLogger(cfg, name)  # attached to the step run, as a training step's logger is
            try:
                raise error()
            except BaseException:
                logger.close("FAILED")  # what vlp.steps.common.train_model says on any exception
                raise

        with pytest.raises(error):
            track_step(cfg, name, work)
    mlflow_client = client(cfg)
    got = {name: mlflow_client.get_run(run_id).info.status for name, run_id in statuses.items()}
    assert got == {"killed": "KILLED", "terminated": "KILLED", "failed": "FAILED"}
    owned = MlflowLogger(cfg, "owned")
    owned.close("FAILED")  # no exception being handled: FAILED stays FAILED
    assert mlflow_client.get_run(owned.run_id).info.status == "FAILED"


def test_end_open_runs_ends_the_running_runs_under_a_parent_and_the_parent(tmp_path):
    cfg = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", experiment="pipeline")
    parent = start_run(cfg, "pipeline")
    running = start_run(cfg, "pretrain", parent_run_id=parent)
    done = start_run(cfg, "ingest", parent_run_id=parent)
    end_run(cfg, done, "FINISHED")
    failed = start_run(cfg, "extract-frames", parent_run_id=parent)
    end_run(cfg, failed, "FAILED")
    grandchild = start_run(cfg, "inner", parent_run_id=running)
    other_parent = start_run(cfg, "another pipeline")
    stranger = start_run(cfg, "another step", parent_run_id=other_parent)

    ended = end_open_runs(cfg, parent)
    assert set(ended[:-1]) == {running, grandchild} and ended[-1] == parent and len(ended) == 3
    mlflow_client = client(cfg)
    status = {run_id: mlflow_client.get_run(run_id).info.status for run_id in
              (parent, running, done, failed, grandchild, other_parent, stranger)}  # fmt: skip
    assert status == {parent: "KILLED", running: "KILLED", done: "FINISHED", failed: "FAILED",
                      grandchild: "KILLED", other_parent: "RUNNING", stranger: "RUNNING"}  # fmt: skip
    assert mlflow_client.get_run(running).data.tags[PARENT_RUN_TAG] == parent
    assert end_open_runs(cfg, parent) == [], "a second call finds nothing open"
    assert end_open_runs(cfg, other_parent, "FAILED") == [stranger, other_parent]
    assert mlflow_client.get_run(stranger).info.status == "FAILED"
    with pytest.raises(ValueError, match="expected one of"):
        end_open_runs(cfg, parent, "STOPPED")
