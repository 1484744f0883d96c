"""Tracking never stops training: a real ``mlflow server`` killed mid-run (and restarted) while a step trains."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from faulty_servers import MlflowServer
from vlp import tracking
from vlp.config import load_config
from vlp.models.tokenizer import train_wordpiece
from vlp.steps.common import train_model
from vlp.train.loop import ResumableSampler, SamplerBatches

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
STEPS = 12


@pytest.fixture
def server(tmp_path: Path):
    srv = MlflowServer(tmp_path)
    srv.start()
    yield srv
    srv.kill()


def _tiny_run(out: Path, url: str, hook) -> tuple[dict, list[dict]]:
    """12 updates of a linear model through the steps' ``train_model`` with MLflow on; ``hook(call)`` runs per step."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    data = SamplerBatches(ResumableSampler(16, seed=0), lambda idx: {"x": x[idx], "y": y[idx]}, 4)
    calls = {"n": 0}

    def step_fn(model: nn.Module, batch: dict) -> dict:
        calls["n"] += 1
        hook(calls["n"])
        return {"loss": F.cross_entropy(model(batch["x"]), batch["y"])}

    overrides = [f"tracking.tracking_uri={url}", "tracking.experiment=outage", "tracking.retry_every_s=0",
                 f"pretrain.max_steps={STEPS}", "pretrain.log_every=1", "pretrain.ckpt_every=4"]  # fmt: skip
    cfg = load_config(TINY, overrides)
    tok = train_wordpiece(["a red circle"], vocab_size=20)
    result = train_model(nn.Linear(4, 2), step_fn, data, cfg, str(out), "pretrain", tokenizer=tok)
    lines = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
    return result, [m for m in lines if "step" in m]


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
