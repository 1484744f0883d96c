"""vlp.tracking against a real ``mlflow server`` process (one worker) with artifacts proxied to the S3 server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from common import MlflowServer
from vlp import storage, tracking


@pytest.fixture
def mlflow_server(tmp_path: Path, s3_bucket: str, s3_env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """``(url, artifact root)``: ``mlflow server --workers 1`` on loopback, sqlite backend, artifacts in S3."""
    artifacts = f"{s3_bucket}/mlartifacts"
    server = MlflowServer(
        tmp_path, ["--serve-artifacts", "--artifacts-destination", artifacts],
        {**s3_env, "MLFLOW_S3_ENDPOINT_URL": s3_env["AWS_ENDPOINT_URL"]},
    )  # fmt: skip
    server.start()
    try:
        yield server.url, artifacts
    finally:
        server.kill()


@pytest.mark.slow
def test_nested_step_run_and_registered_model_land_in_the_bucket(mlflow_server, tmp_path, s3_config):
    url, artifacts = mlflow_server
    cfg = tracking.TrackingConfig(tracking_uri=url, experiment="server-test")

    def work() -> dict:
        logger = tracking.MlflowLogger(cfg, run_name="ignored")  # attaches to the step run (cfg.run_id)
        logger.log_metrics({"loss": 1.5}, step=1)
        logger.close()
        return {"step": "pretrain", "steps": 3, "config": {"pretrain": {"lr": 0.001}}}

    tracking.track_step(cfg, "pretrain", work, kfp_run_id="kfp-42")
    parent = tracking.find_pipeline_run(cfg, "kfp-42")
    client = tracking.client(cfg)
    (step_run,) = client.search_runs([tracking.experiment_id(cfg)], f"tags.`{tracking.PARENT_RUN_TAG}` = '{parent}'")
    assert step_run.info.run_name == "pretrain" and step_run.info.status == "FINISHED"
    assert step_run.data.metrics == {"loss": 1.5, "steps": 3.0}
    assert step_run.data.params == {"pretrain.lr": "0.001"}

    model_dir = tmp_path / "model"
    (model_dir / "checkpoints").mkdir(parents=True)
    (model_dir / "model.json").write_text('{"kind": "alpro"}')
    (model_dir / "checkpoints" / "w.safetensors").write_bytes(b"weights")
    version = tracking.register_model(cfg, "srv-model", str(model_dir), parent, {"t2v_r1": 12.5}, alias="candidate")
    keys = [uri[len(artifacts) + 1 :] for uri in storage.list_files(artifacts)]
    stored = [k for k in keys if k.endswith("model/checkpoints/w.safetensors")]
    assert len(stored) == 1, keys
    assert storage.read_bytes(f"{artifacts}/{stored[0]}") == b"weights"

    info = tracking.download_model(cfg, "srv-model@candidate", str(tmp_path / "back"))
    assert (info["version"], info["metrics"]) == (version, {"t2v_r1": 12.5})
    assert (tmp_path / "back" / "checkpoints" / "w.safetensors").read_bytes() == b"weights"
