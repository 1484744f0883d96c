"""vlp.tracking without a server: params, fan-out, reading metrics.jsonl, and `vlp tracking sync` on a sqlite store."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from vlp.cli import main
from vlp.tracking import (
    KIND_TAG,
    MlflowLogger,
    MultiLogger,
    TrackingConfig,
    client,
    end_run,
    flatten,
    read_metrics,
    start_run,
)


def test_flatten_nested_params():
    assert flatten({"optim": {"lr": 1e-4, "betas": (0.9, 0.98)}, "seed": 0}) == {
        "optim.lr": "0.0001",
        "optim.betas": "[0.9, 0.98]",
        "seed": "0",
    }
    assert len(flatten({"x": "y" * 10_000})["x"]) == 6000


def test_multi_logger_fans_out():
    class Recorder:
        def __init__(self):
            self.calls = []

        def log_metrics(self, metrics, step):
            self.calls.append(("m", metrics, step))

        def log_params(self, params):
            self.calls.append(("p", params))

    a, b = Recorder(), Recorder()
    multi = MultiLogger([a, b])
    multi.log_params({"k": 1})
    multi.log_metrics({"loss": 0.5}, 3)
    assert a.calls == b.calls == [("p", {"k": 1}), ("m", {"loss": 0.5}, 3)]


# --------------------------------------------------------------------------- metrics.jsonl and `vlp tracking sync`


def _write_out(out: Path, lines: list[str], summary: dict | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text("".join(f"{line}\n" for line in lines))
    if summary is not None:
        (out / "summary.json").write_text(json.dumps(summary))


OLD_FILE = [  # as written before resumes rewound the file: steps 2 and 3 twice, and a line cut by a kill
    '{"params": {"train": {"max_steps": 4}}}',
    '{"step": 1, "train/loss": 4.0}',
    '{"step": 2, "train/loss": 3.5}',
    '{"step": 3, "train/loss": 3.25}',
    '{"step": 2, "train/loss": 3.0}',
    '{"step": 3, "train/loss": 2.0}',
    '{"step": 4, "train/lo',
    '{"step": 4, "train/loss": 1.0}',
]


def test_read_metrics_keeps_each_step_once_the_last_line_winning(tmp_path: Path) -> None:
    _write_out(tmp_path, OLD_FILE, None)
    with pytest.warns(UserWarning, match=r"metrics.jsonl line 7 is not JSON"):
        params, rows = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert params == [{"train": {"max_steps": 4}}]
    assert rows == [{"step": s, "train/loss": v} for s, v in ((1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0))]
    assert read_metrics(str(tmp_path / "missing.jsonl")) == ([], [])


def _sync(out: Path, store: Path, capsys: pytest.CaptureFixture, *extra: str) -> tuple[int, dict | str]:
    code = main(["tracking", "sync", str(out), f"tracking.tracking_uri=sqlite:///{store}", *extra])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else captured.err


def test_sync_sends_each_step_once_in_order_and_twice_nothing(tmp_path: Path, capsys) -> None:
    out, store = tmp_path / "out", tmp_path / "mlflow.db"
    stale = {"step": "pretrain", "steps": 4, "tracking": {"run_id": None, "complete": False, "unsent": 6}}
    _write_out(out, OLD_FILE, stale)  # the server was down for the whole step: no run was ever opened
    with pytest.warns(UserWarning, match="line 7 is not JSON"):
        code, report = _sync(out, store, capsys)
    assert code == 0 and report["sent"] == 4 and report["status"] == "FINISHED"
    cfg = TrackingConfig(tracking_uri=f"sqlite:///{store}")
    run = client(cfg).get_run(report["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "pretrain"
    assert run.data.tags["vlp.out"] == str(out) and run.data.params == {"train.max_steps": "4"}
    history = [(m.step, m.value) for m in client(cfg).get_metric_history(run.info.run_id, "train/loss")]
    assert history == [(1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tracking"] == {"run_id": run.info.run_id, "complete": True, "unsent": 0, "outages": 0}
    record = json.loads((out / "tracking.json").read_text())
    assert (record["run_id"], record["status"], record["complete"]) == (run.info.run_id, "FINISHED", True)

    with pytest.warns(UserWarning, match="line 7 is not JSON"):
        code, again = _sync(out, store, capsys)
    assert code == 0 and again == report | {"sent": 0}
    assert len(client(cfg).get_metric_history(run.info.run_id, "train/loss")) == 4
    assert client(cfg).get_run(run.info.run_id).info.end_time == run.info.end_time


def test_sync_of_a_step_that_did_not_finish_leaves_its_run_running_unless_told(tmp_path: Path, capsys) -> None:
    out, store = tmp_path / "out", tmp_path / "mlflow.db"
    _write_out(out, OLD_FILE[:4], None)  # killed: no summary.json, nothing recorded
    code, report = _sync(out, store, capsys)
    assert code == 0 and (report["sent"], report["status"]) == (3, "RUNNING")
    cfg = TrackingConfig(tracking_uri=f"sqlite:///{store}")
    assert client(cfg).get_run(report["run_id"]).info.status == "RUNNING"
    code, killed = _sync(out, store, capsys, "--status", "KILLED")
    assert code == 0 and (killed["run_id"], killed["sent"], killed["status"]) == (report["run_id"], 0, "KILLED")
    assert client(cfg).get_run(report["run_id"]).info.status == "KILLED"


def test_sync_errors_say_what_is_wrong(tmp_path: Path, capsys) -> None:
    code, err = _sync(tmp_path / "nothing", tmp_path / "m.db", capsys)
    assert code == 2 and "has no metrics.jsonl: nothing to sync" in err
    _write_out(tmp_path / "out", OLD_FILE[:2], {"step": "pretrain"})
    assert main(["tracking", "sync", str(tmp_path / "out")]) == 2
    assert "tracking.tracking_uri is empty" in capsys.readouterr().err
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.warns(UserWarning, match="is down"):
        code = main(["tracking", "sync", str(tmp_path / "out"), f"tracking.tracking_uri={url}",
                     "tracking.timeout_s=1", "tracking.retries=0"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "tracking error" in err and "run `vlp tracking sync" in err


def test_multi_logger_rewinds_the_loggers_that_can():
    class Rewindable:
        def __init__(self):
            self.rewound = []

        def rewind(self, step):
            self.rewound.append(step)

    a = Rewindable()
    MultiLogger([a, object()]).rewind(3)
    assert a.rewound == [3]


def test_a_resume_sends_the_resumed_values_of_steps_the_killed_attempt_never_sent(tmp_path: Path) -> None:
    """The server was down while the killed attempt logged steps 3 and 4 past its checkpoint at 2: those lines are
    in metrics.jsonl only. The resumed logger must send steps 1-2 from the file and the resumed 3-4, each once."""
    cfg = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", experiment="resume")
    out = tmp_path / "out"
    _write_out(out, [f'{{"step": {s}, "train/loss": 1.0}}' for s in (1, 2, 3, 4)], None)
    logger = MlflowLogger(cfg, "pretrain", out=str(out))
    MultiLogger([logger]).rewind(2)  # the checkpoint the loop resumes from
    for step in (3, 4):
        logger.log_metrics({"train/loss": 2.0}, step)
    logger.close()
    history = client(cfg).get_metric_history(logger.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0)]


def test_a_pipeline_retry_takes_the_output_over_and_a_resumed_run_reopens(tmp_path: Path) -> None:
    cfg = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", experiment="takeover")
    out = tmp_path / "out"
    _write_out(out, OLD_FILE[:4], None)
    first = MlflowLogger(cfg, "pretrain", out=str(out))  # an attempt that is killed: it never closes
    first.rewind(3)  # as train() does first: the logger reaches the server and sends the file's steps
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"step": 4, "train/loss": 1.0}\n')  # in the file, never sent
    mlflow_client = client(cfg)

    def steps(run_id: str) -> list[int]:
        return [m.step for m in mlflow_client.get_metric_history(run_id, "train/loss")]

    assert steps(first.run_id) == [1, 2, 3]
    retry = start_run(cfg, "pretrain", {KIND_TAG: "step"})  # the retry's step run (track_step opens it)
    second = MlflowLogger(replace(cfg, run_id=retry), "pretrain", out=str(out))
    second.log_metrics({"train/loss": 0.5}, 5)
    assert second.close() == {"run_id": retry, "complete": True, "unsent": 0, "outages": 0}
    assert steps(retry) == [1, 2, 3, 4, 5], "the retry's run holds the whole curve"
    assert mlflow_client.get_run(first.run_id).info.status == "KILLED"
    assert mlflow_client.get_run(retry).info.status == "RUNNING", "an attached run is its owner's to end"
    assert json.loads((out / "tracking.json").read_text())["run_id"] == retry

    end_run(cfg, retry, "FAILED")  # the step failed; a rerun resumes it
    third = MlflowLogger(cfg, "pretrain", out=str(out))
    assert third.run_id == retry
    third.log_metrics({"train/loss": 0.5, "train/lr": 0.1}, 5)  # step 5 again after a resume from step 4
    third.log_metrics({"train/loss": 0.25}, 6)
    assert mlflow_client.get_run(retry).info.status == "RUNNING", "training goes on in the reopened run"
    third.close()
    assert steps(retry) == [1, 2, 3, 4, 5, 6] and mlflow_client.get_run(retry).info.status == "FINISHED"
    assert [m.step for m in mlflow_client.get_metric_history(retry, "train/lr")] == [5]
