"""Where tracking goes: the ``tracking`` section of the config (:class:`TrackingConfig`) and the local default
store (:func:`sqlite_uri`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vlp.ranges import RATE, SIZE, ranged


@dataclass
class TrackingConfig:
    """Where runs, metrics and models go besides ``<out>/metrics.jsonl``."""

    tracking_uri: str = ""  # "" = MLflow off; e.g. sqlite:///runs/mlflow.db or http://mlflow:5000
    experiment: str = "vlp"  # MLflow experiment name
    artifact_location: str = ""  # artifacts of a newly created experiment ("" = next to a sqlite db / server default)
    parent_run_id: str = ""  # new runs are nested under this run
    run_id: str = ""  # log into this existing run instead of opening one (the pipeline's step run)
    # While training, a request to the server waits at most ~timeout_s x (retries + 1); after a failure the
    # logger keeps its records and tries again after retry_every_s, so an outage never slows training down.
    timeout_s: float = ranged(10.0, RATE)
    retries: int = ranged(1, SIZE)
    retry_every_s: float = ranged(30.0, SIZE)


def sqlite_uri(run_dir: str | Path) -> str:
    """The local default store: ``sqlite:///<run_dir>/mlflow.db`` (absolute, so subprocesses agree)."""
    return f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"
