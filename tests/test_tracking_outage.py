"""Tracking never stops training: a real ``mlflow server`` killed mid-run (and restarted) while a step trains;
killed before the step ends, its run is caught up by ``vlp tracking sync`` or by a rerun of the step."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from common import MlflowServer
from vlp import tracking
from vlp.config import load_config
from vlp.data.loader import ResumableSampler, SamplerBatches
from vlp.models.tokenizer import train_wordpiece
from vlp.steps.common import run_step, train_model, train_summary

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
STEPS = 12


@pytest.fixture
def server(tmp_path: Path):
    srv = MlflowServer(tmp_path)
    srv.start()
    yield srv
    srv.kill()


def _config(url: str, *extra: str) -> Any:
    overrides = [f"tracking.tracking_uri={url}", "tracking.experiment=outage", "tracking.retry_every_s=0",
                 f"pretrain.max_steps={STEPS}", "pretrain.log_every=1", "pretrain.ckpt_every=4", *extra]  # fmt: skip
    return load_config(TINY, overrides)


def _train(out: Path, cfg: Any, hook) -> Any:
    """12 updates of a linear model through the steps' ``train_model`` with MLflow on; ``hook(call)`` runs per step."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    data = SamplerBatches(ResumableSampler(16, seed=0), lambda idx: {"x": x[idx], "y": y[idx]}, 4)
    calls = {"n": 0}

    def step_fn(model: nn.Module, batch: dict) -> dict:
        calls["n"] += 1
        hook(calls["n"])
        return {"loss": F.cross_entropy(model(batch["x"]), batch["y"])}

    tok = train_wordpiece(["a red circle"], vocab_size=20)
    return train_model(nn.Linear(4, 2), step_fn, data, cfg, str(out), "pretrain", tokenizer=tok)


def _rows(out: Path) -> list[dict]:
    return [m for m in (json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()) if "step" in m]


def _tiny_run(out: Path, url: str, hook) -> tuple[Any, list[dict]]:
    return _train(out, _config(url), hook), _rows(out)


def _step(out: Path, url: str, hook) -> dict:
    """The same training as a vlp step runs it (``run_step``: ``summary.json`` written); returns the summary. After
    a failure the logger does not retry within the step (``retry_every_s=60``): only its end tries again."""
    cfg = _config(url, "tracking.retry_every_s=60")
    return run_step("pretrain", str(out), cfg, "pretrain", lambda: train_summary(_train(out, cfg, hook)))


def _sync(out: Path, url: str) -> subprocess.CompletedProcess:
    """``vlp tracking sync OUT`` as a user runs it (a new process)."""
    cmd = [sys.executable, "-m", "vlp.cli", "tracking", "sync", "--config", str(TINY), str(out),
           f"tracking.tracking_uri={url}"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def _histories(client: Any, run_id: str, rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Every metric of ``rows`` as the run holds it: ``(step, value)`` in the order the server received them."""
    keys = sorted({k for row in rows for k in row if k != "step"})
    return {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)] for k in keys}


def _expected(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Each step of ``rows`` once, in step order: what a complete run holds."""
    keys = sorted({k for row in rows for k in row if k != "step"})
    return {k: [(row["step"], row[k]) for row in rows] for k in keys}


def _outage_at_the_end(server: MlflowServer, out: Path) -> dict:
    """The step of the issue: the server dies at update 5 and is still down when the step ends."""

    def hook(call: int) -> None:
        if call == 5:
            server.kill()

    with pytest.warns(UserWarning, match="MLflow tracking at .* is down"):
        summary = _step(out, server.url, hook)
    assert summary["steps"] == STEPS and not summary["skipped"]
    # 8 metric records (updates 5..12) and the run's end never arrived
    assert summary["tracking"] == {"run_id": summary["tracking"]["run_id"], "complete": False, "unsent": 9,
                                   "outages": 1}  # fmt: skip
    assert json.loads((out / "summary.json").read_text())["tracking"]["unsent"] == 9
    server.start()
    client = tracking.client(tracking.TrackingConfig(tracking_uri=server.url))
    assert client.get_run(summary["tracking"]["run_id"]).info.status == "RUNNING"
    assert [m.step for m in client.get_metric_history(summary["tracking"]["run_id"], "train/loss")] == [1, 2, 3, 4]
    return summary


@pytest.mark.slow
def test_server_killed_mid_training_and_restarted_gets_every_metric(server, tmp_path: Path) -> None:
    def hook(call: int) -> None:
        if call == 3:
            server.kill()  # steps 3.. are logged while the server is down
        if call == 8:
            server.start()  # and sent once it is back

    with pytest.warns(UserWarning, match="MLflow tracking at .* is down"):
        result, jsonl = _tiny_run(tmp_path / "out", server.url, hook)
    assert result.step == STEPS and [m["step"] for m in jsonl] == list(range(1, STEPS + 1))
    assert result.tracking["complete"] and result.tracking["unsent"] == 0 and result.tracking["outages"] == 1
    client = tracking.client(tracking.TrackingConfig(tracking_uri=server.url))
    run = client.get_run(result.tracking["run_id"])
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, STEPS + 1)), "the run caught up, each step once"
    assert {m.step: m.value for m in history} == {m["step"]: m["train/loss"] for m in jsonl}


@pytest.mark.slow
def test_with_the_server_gone_the_training_error_wins_and_nothing_waits_for_minutes(server, tmp_path: Path) -> None:
    def hook(call: int) -> None:
        if call == 2:
            server.kill()
        if call == 6:
            raise RuntimeError("boom: out of memory in step 6")

    start = time.monotonic()
    with pytest.warns(UserWarning, match="is down"), pytest.raises(RuntimeError, match=r"^boom: out of memory"):
        _tiny_run(tmp_path / "out", server.url, hook)
    assert time.monotonic() - start < 60, "an outage must not hold training up"
    lines = [json.loads(s) for s in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "step" in m] == [1, 2, 3, 4, 5], "every finished step is in metrics.jsonl"
    assert (tmp_path / "out" / "checkpoints" / "step-000004" / "state.json").exists()

    # a step whose server is down from the start trains untracked and finishes
    with pytest.warns(UserWarning, match="is incomplete"):
        result, jsonl = _tiny_run(tmp_path / "again", server.url, lambda call: None)
    assert result.step == STEPS and len(jsonl) == STEPS
    assert result.tracking == {"run_id": None, "complete": False, "unsent": STEPS + 2, "outages": 1}


def test_track_step_runs_the_step_untracked_when_the_server_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    cfg = tracking.TrackingConfig(tracking_uri=url, timeout_s=1, retries=0)
    with pytest.warns(UserWarning, match="opening the run of step evaluate .* failed"):
        assert tracking.track_step(cfg, "evaluate", lambda: {"metrics": {"r1": 1.0}}) == {"metrics": {"r1": 1.0}}
    with pytest.raises(ValueError, match=r"^the step's own error$"), pytest.warns(UserWarning):
        tracking.track_step(cfg, "evaluate", lambda: (_ for _ in ()).throw(ValueError("the step's own error")))


@pytest.mark.slow
def test_server_down_when_the_step_ends_then_vlp_tracking_sync_finishes_the_run(server, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_id = _outage_at_the_end(server, out)["tracking"]["run_id"]
    client = tracking.client(tracking.TrackingConfig(tracking_uri=server.url))
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))

    done = _sync(out, server.url)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    keys = len(_expected(rows))
    assert report == {"out": str(out), "run_id": run_id, "sent": 8 * keys, "status": "FINISHED", "complete": True}
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert _histories(client, run_id, rows) == _expected(rows), "every step once, sent in step order"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tracking"] == {"run_id": run_id, "complete": True, "unsent": 0, "outages": 0}

    again = _sync(out, server.url)  # idempotent: nothing is sent twice, the run's end stays as it was
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["sent"] == 0
    assert _histories(client, run_id, rows) == _expected(rows)
    assert client.get_run(run_id).info.end_time == run.info.end_time
    assert [r.info.run_id for r in client.search_runs([tracking.experiment_id(_config(server.url).tracking)])] == [
        run_id
    ]


@pytest.mark.slow
def test_rerun_of_the_finished_step_catches_its_run_up_instead_of_opening_a_new_one(server, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_id = _outage_at_the_end(server, out)["tracking"]["run_id"]
    rerun = _step(out, server.url, lambda call: pytest.fail("a finished step trains nothing"))
    assert rerun["skipped"] and rerun["steps"] == STEPS
    assert rerun["tracking"] == {"run_id": run_id, "complete": True, "unsent": 0, "outages": 0}
    client = tracking.client(tracking.TrackingConfig(tracking_uri=server.url))
    assert client.get_run(run_id).info.status == "FINISHED"
    assert _histories(client, run_id, _rows(out)) == _expected(_rows(out))
    runs = client.search_runs([tracking.experiment_id(_config(server.url).tracking)])
    assert [r.info.run_id for r in runs] == [run_id], "no new, empty run"


@pytest.mark.slow
def test_a_resumed_step_continues_its_run_and_each_step_is_logged_once(server, tmp_path: Path) -> None:
    out = tmp_path / "out"

    def crash(call: int) -> None:
        if call == 6:  # updates 1..5 logged, the checkpoint of update 4 written
            raise RuntimeError("boom: the node went away")

    with pytest.raises(RuntimeError, match=r"^boom"):
        _step(out, server.url, crash)
    client = tracking.client(tracking.TrackingConfig(tracking_uri=server.url))
    (first,) = client.search_runs([tracking.experiment_id(_config(server.url).tracking)])
    assert first.info.status == "FAILED"

    summary = _step(out, server.url, lambda call: None)
    assert summary["resumed_from_step"] == 4 and summary["tracking"]["run_id"] == first.info.run_id
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), "metrics.jsonl holds each step once"
    histories = _histories(client, first.info.run_id, rows)
    assert all([step for step, _ in h] == list(range(1, STEPS + 1)) for h in histories.values()), histories
    assert histories["train/loss"] == _expected(rows)["train/loss"]
    assert client.get_run(first.info.run_id).info.status == "FINISHED"
    assert len(client.search_runs([first.info.experiment_id])) == 1
