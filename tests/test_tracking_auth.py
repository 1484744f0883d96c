"""MLflow with its built-in authentication, as the chart runs it: a real ``mlflow server --app-name basic-auth``
configured by the chart's init container command (``python -m vlp.tracking_auth write-config``), the step user
made by the hook Job's command (``ensure-user``), then a vlp step that logs and registers as that user, and
alias changes by nobody and by another user refused."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common import MlflowServer
from vlp import tracking
from vlp.tracking_auth import AuthError, ensure_user, redact, write_config

ADMIN = ("admin", "admin-password-of-the-test")
STEP = ("vlp-steps", "step-password-of-the-test")
OTHER = ("someone", "another-password-here")


def _module(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vlp.tracking_auth", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    root = tmp_path_factory.mktemp("mlflow-auth")
    ini = root / "basic_auth.ini"
    config = {"MLFLOW_AUTH_DEFAULT_PERMISSION": "READ", "MLFLOW_AUTH_DATABASE_URI": f"sqlite:///{root / 'auth.db'}"}
    wrote = _module("write-config", str(ini), env=config)
    assert wrote.returncode == 0, wrote.stderr
    env = {
        "MLFLOW_AUTH_CONFIG_PATH": str(ini),
        "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN[0],
        "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN[1],
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "a-test-csrf-key",
    }
    artifacts = ["--serve-artifacts", "--artifacts-destination", str(root / "artifacts")]
    srv = MlflowServer(root, artifacts=artifacts, env=env, extra=["--app-name", "basic-auth"])
    srv.start()
    try:
        yield srv
    finally:
        srv.kill()


def _request(url: str, method: str, path: str, body: dict[str, Any], auth: tuple[str, str] | None) -> int:
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    request = urllib.request.Request(url + path, json.dumps(body).encode(), headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_hook_command_creates_then_resets_the_step_user(server: MlflowServer) -> None:
    env = {"MLFLOW_TRACKING_URI": server.url, "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN[0],
           "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN[1], "VLP_TRACKING_USERNAME": STEP[0],
           "VLP_TRACKING_PASSWORD": STEP[1]}  # fmt: skip
    first = _module("ensure-user", env=env)
    assert first.returncode == 0 and "'vlp-steps' created" in first.stdout, first.stderr
    again = _module("ensure-user", env=env)  # every upgrade runs it: the Secret's password wins
    assert again.returncode == 0 and "'vlp-steps' updated" in again.stdout, again.stderr
    wrong = _module("ensure-user", env={**env, "MLFLOW_AUTH_ADMIN_PASSWORD": "not-the-admin-password"})
    assert wrong.returncode == 1 and "401" in wrong.stderr and "not-the-admin" not in wrong.stderr + wrong.stdout
    missing = _module("ensure-user", env={k: v for k, v in env.items() if k != "VLP_TRACKING_PASSWORD"} | {
        "VLP_TRACKING_PASSWORD": ""})  # fmt: skip
    assert missing.returncode == 2 and "VLP_TRACKING_PASSWORD not set" in missing.stderr
    assert ensure_user(server.url, ADMIN, OTHER[0], OTHER[1]) == "created"
    with pytest.raises(AuthError, match="403"):  # only an admin creates users
        ensure_user(server.url, OTHER, "mallory", "mallory-password-long")


def test_a_step_logs_and_registers_as_its_user_and_nobody_else_moves_the_alias(
    server: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_user(server.url, ADMIN, *STEP)
    ensure_user(server.url, ADMIN, *OTHER)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", STEP[0])  # what every step pod gets from its Secret
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", STEP[1])
    cfg = tracking.TrackingConfig(tracking_uri=server.url, experiment="vlp-auth-test")
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.json").write_text('{"family": "alpro"}\n')

    def work() -> dict[str, Any]:
        version = tracking.register_model(cfg, "vlp-retrieval", str(model), cfg.run_id, {"t2v_r1": 0.5}, "champion")
        return {"registered": int(version), "config": {"step": {"lr": 1e-4}}}

    with _no_tracking_warning():
        summary = tracking.track_step(cfg, "finetune_retrieval", work)
    client = tracking.client(cfg)
    version = client.get_model_version_by_alias("vlp-retrieval", "champion")
    assert version.version == str(summary["registered"]) == "1"
    run = client.get_run(version.run_id)
    assert run.info.status == "FINISHED" and run.data.params["step.lr"] == "0.0001"
    files = {f.path for f in client.list_artifacts(version.run_id, "model")}
    assert files == {"model/model.json"}  # uploaded through the server (--serve-artifacts) as the step user
    move = {"name": "vlp-retrieval", "alias": "champion", "version": "1"}
    path = "/api/2.0/mlflow/registered-models/alias"
    assert _request(server.url, "POST", path, move, None) == 401  # nobody: refused
    assert _request(server.url, "POST", path, move, OTHER) == 403  # another user (default READ): refused
    assert _request(server.url, "DELETE", path, {"name": "vlp-retrieval", "alias": "champion"}, OTHER) == 403
    assert _request(server.url, "POST", path, move, STEP) == 200  # the model's creator may
    assert _request(server.url, "POST", "/api/2.0/mlflow/runs/create", {"experiment_id": "0"}, None) == 401
    assert client.get_model_version_by_alias("vlp-retrieval", "champion").version == "1"


class _no_tracking_warning:
    """Fail on the warning vlp.tracking emits when it could not log (tracking never fails a step, so a refused
    login would otherwise only be a warning)."""

    def __enter__(self) -> None:
        import warnings

        self._catch = warnings.catch_warnings(record=True)
        self._seen = self._catch.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc: object) -> None:
        self._catch.__exit__(*exc)
        problems = [str(w.message) for w in self._seen if "MLflow" in str(w.message)]
        assert not problems, problems


def test_write_config_and_redaction(tmp_path: Path) -> None:
    import configparser

    path = tmp_path / "basic_auth.ini"
    write_config(str(path), "READ", "postgresql://auth:p%40ss%word@db:5432/auth")
    parsed = configparser.ConfigParser()
    parsed.read(path)
    assert parsed["mlflow"]["database_uri"] == "postgresql://auth:p%40ss%word@db:5432/auth"  # % survives
    with pytest.raises(AuthError, match="default permission"):
        write_config(str(path), "ALL", "sqlite:///x.db")
    assert redact("http://vlp-steps:s3cret@mlflow:5000/") == "http://vlp-steps:***@mlflow:5000/"
    assert redact("http://mlflow:5000") == "http://mlflow:5000"
