"""Experiment tracking: training metrics and parameters to MLflow (and always to ``metrics.jsonl``).

A training step logs through the :class:`vlp.train.loop.MetricsLogger` protocol. With
``tracking.tracking_uri`` set (``sqlite:///runs/mlflow.db``, ``http://mlflow:5000``, ...) the step opens
one MLflow run in ``tracking.experiment`` and mirrors every metric and parameter there; the JSONL file
next to the checkpoints is written either way, so nothing depends on a tracking server being up.
``mlflow`` is imported only when tracking is on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class TrackingConfig:
    """Where training metrics go besides ``<out>/metrics.jsonl``."""

    tracking_uri: str = ""  # "" = MLflow off; e.g. sqlite:///runs/mlflow.db or http://mlflow:5000
    experiment: str = "vlp"  # MLflow experiment name


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"optim": {"lr": 1e-4}}`` -> ``{"optim.lr": "0.0001"}`` (MLflow params are flat strings, <= 6000 chars)."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten(value, name))
        else:
            out[name] = str(list(value) if isinstance(value, tuple) else value)[:6000]
    return out


class MlflowLogger:
    """One MLflow run; :meth:`log_metrics` / :meth:`log_params` as the training loop calls them."""

    def __init__(self, cfg: TrackingConfig, run_name: str, tags: Mapping[str, str] | None = None) -> None:
        import mlflow

        self._mlflow = mlflow
        self._client = mlflow.MlflowClient(tracking_uri=cfg.tracking_uri)
        experiment = self._client.get_experiment_by_name(cfg.experiment)
        experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(cfg.experiment)
        self.run_id = self._client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {})).info.run_id

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = self._mlflow.utils.time.get_current_time_millis()
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self._client.log_batch(self.run_id, metrics=batch)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        self._client.log_batch(self.run_id, params=[Param(k, v) for k, v in flatten(params).items()])

    def close(self, status: str = "FINISHED") -> None:
        self._client.set_terminated(self.run_id, status=status)


class MultiLogger:
    """Fan one stream of metrics out to several loggers."""

    def __init__(self, loggers: Sequence[Any]) -> None:
        self.loggers = list(loggers)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log_metrics(metrics, step)

    def log_params(self, params: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.log_params(params)
