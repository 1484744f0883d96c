"""The MLflow model registry: a fine-tuned model registered with its evaluation metrics as version tags
(``metric.<name>``, :func:`register_model`), found again by ``name@alias``, ``name/version`` or ``name`` (the
newest, :func:`resolve_model`), downloaded (:func:`download_model`), and its newest re-evaluation stored beside
(``last_eval.<name>``, :func:`record_reevaluation`)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vlp import storage
from vlp.tracking.config import TrackingConfig
from vlp.tracking.runs import client

METRIC_TAG_PREFIX = "metric."  # model version tags holding the eval metrics at registration
LAST_EVAL_TAG_PREFIX = "last_eval."  # model version tags holding the newest re-evaluation metrics
MODEL_ARTIFACT_PATH = "model"


def register_model(
    cfg: TrackingConfig,
    name: str,
    model_dir: str,
    run_id: str,
    metrics: Mapping[str, float],
    alias: str = "",
    tags: Mapping[str, str] | None = None,
    artifact_path: str = MODEL_ARTIFACT_PATH,
) -> str:
    """Copy ``model_dir`` (local or ``s3://``) into ``run_id``'s artifacts (under ``artifact_path``) and register
    it as a new version of ``name`` tagged ``metric.<k>`` with ``metrics``; point ``alias`` at it.

    Returns:
        The new version number.
    """
    mlflow_client = client(cfg)
    with tempfile.TemporaryDirectory(prefix="vlp-register-") as tmp:
        mlflow_client.log_artifacts(run_id, local_dir(model_dir, tmp), artifact_path)
    source = f"{mlflow_client.get_run(run_id).info.artifact_uri.rstrip('/')}/{artifact_path}"
    try:
        mlflow_client.create_registered_model(name)
    except Exception:  # already registered
        mlflow_client.get_registered_model(name)
    version_tags = {**dict(tags or {}), **{f"{METRIC_TAG_PREFIX}{k}": repr(float(v)) for k, v in metrics.items()}}
    version = mlflow_client.create_model_version(name, source, run_id=run_id, tags=version_tags).version
    if alias:
        mlflow_client.set_registered_model_alias(name, alias, version)
    return str(version)


def local_dir(uri: str, tmp: str) -> str:
    """``uri`` itself when local, else its files downloaded under ``tmp``."""
    if storage.local_path(uri) is not None:
        return uri
    root = uri.rstrip("/")
    for file_uri in storage.list_files(root):
        storage.download(file_uri, storage.local_path_under(tmp, file_uri[len(root) + 1 :]))
    return tmp


def parse_model_ref(ref: str) -> tuple[str, str, str]:
    """``name@alias`` -> (name, "", alias); ``name/3`` -> (name, "3", ""); ``name`` -> (name, "", "")."""
    name, at, alias = ref.partition("@")
    if at:
        if not name or not alias:
            raise ValueError(f"model reference {ref!r}: expected name@alias, name/version or name")
        return name, "", alias
    name, slash, version = ref.rpartition("/")
    if slash and version.isdigit() and name:
        return name, version, ""
    if not ref or "/" in ref:
        raise ValueError(f"model reference {ref!r}: expected name@alias, name/version or name")
    return ref, "", ""


def resolve_model(cfg: TrackingConfig, ref: str) -> Any:
    """The ``ModelVersion`` that ``ref`` (``name@alias``, ``name/version`` or ``name`` = newest) names."""
    name, version, alias = parse_model_ref(ref)
    mlflow_client = client(cfg)
    if alias:
        return mlflow_client.get_model_version_by_alias(name, alias)
    if version:
        return mlflow_client.get_model_version(name, version)
    versions = mlflow_client.search_model_versions(f"name = '{name}'")
    if not versions:
        raise ValueError(f"registered model {name!r} has no versions: run the pre-training pipeline first")
    return max(versions, key=lambda v: int(v.version))


def version_metrics(version: Any, prefix: str = METRIC_TAG_PREFIX) -> dict[str, float]:
    """The metrics stored as ``<prefix><name>`` tags on a model version."""
    return {k[len(prefix) :]: float(v) for k, v in (version.tags or {}).items() if k.startswith(prefix)}


def download_model(cfg: TrackingConfig, ref: str, dst: str) -> dict[str, Any]:
    """Download the model ``ref`` names into ``dst``; returns its name, version, run and stored metrics."""
    import mlflow.artifacts

    version = resolve_model(cfg, ref)
    Path(dst).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vlp-download-") as tmp:
        local = mlflow.artifacts.download_artifacts(version.source, dst_path=tmp, tracking_uri=cfg.tracking_uri)
        for item in Path(local).iterdir():
            shutil.move(str(item), str(Path(dst) / item.name))
    info = {
        "name": version.name,
        "version": str(version.version),
        "run_id": version.run_id,
        "metrics": version_metrics(version),
        "last_eval": version_metrics(version, LAST_EVAL_TAG_PREFIX),
    }
    (Path(dst) / "registry.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return info


def record_reevaluation(cfg: TrackingConfig, name: str, version: str, metrics: Mapping[str, float]) -> None:
    """Store the newest re-evaluation metrics on a model version as ``last_eval.<k>`` tags."""
    mlflow_client = client(cfg)
    for key, value in metrics.items():
        mlflow_client.set_model_version_tag(name, version, f"{LAST_EVAL_TAG_PREFIX}{key}", repr(float(value)))
