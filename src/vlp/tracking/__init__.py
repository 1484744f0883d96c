"""Experiment tracking: MLflow runs, nested step runs and the model registry (and always ``metrics.jsonl``).

A training step logs through the :class:`vlp.train.loop.MetricsLogger` protocol. With
``tracking.tracking_uri`` set (``sqlite:///runs/mlflow.db``, ``http://mlflow:5000``, ...) the step opens
one MLflow run in ``tracking.experiment`` and mirrors every metric and parameter there; the JSONL file
next to the checkpoints is written either way, so nothing depends on a tracking server being up.

A pipeline run adds two levels (the KFP components call these; the library itself never imports kfp):

- one *parent* run per pipeline run, found or created by its KFP run id (tag ``vlp.kfp_run_id``) so every
  step of the same run finds it without passing ids around (:func:`pipeline_run`);
- one *nested* run per step (tag ``mlflow.parentRunId``) holding the step's params and summary numbers
  (:func:`track_step`); a training step logs its curves into that same run (``tracking.run_id``).

Fine-tuned models are registered with their evaluation metrics as version tags (``metric.<name>``), so a
re-evaluation can pick them by ``name@alias``, ``name/version`` or ``name`` (latest) — :func:`resolve_model`.
``mlflow`` is imported only when tracking is on. Callers import every name from here:

- :mod:`vlp.tracking.config`: :class:`TrackingConfig` (the ``tracking`` section) and the local default store;
- :mod:`vlp.tracking.runs`: the MLflow client, parent and step runs, logging metrics, params and tags to a run;
- :mod:`vlp.tracking.outbox`: ``<out>/metrics.jsonl`` and ``<out>/tracking.json``, :class:`MlflowLogger` (the
  training logger that keeps its records through an outage and sends them once the server is back) and
  :func:`sync` (``vlp tracking sync <out>``);
- :mod:`vlp.tracking.registry`: the MLflow model registry (register, resolve, download, re-evaluation tags).
"""

from __future__ import annotations

from vlp.tracking.config import TrackingConfig, sqlite_uri
from vlp.tracking.outbox import (
    METRICS_FILE,
    RECORD_FILE,
    MlflowLogger,
    MultiLogger,
    TrackingError,
    read_metrics,
    read_record,
    sync,
)
from vlp.tracking.registry import (
    LAST_EVAL_TAG_PREFIX,
    METRIC_TAG_PREFIX,
    MODEL_ARTIFACT_PATH,
    download_model,
    local_dir,
    parse_model_ref,
    record_reevaluation,
    register_model,
    resolve_model,
    version_metrics,
)
from vlp.tracking.runs import (
    BATCH_METRICS,
    KFP_RUN_TAG,
    KIND_TAG,
    PARENT_RUN_TAG,
    TERMINAL,
    client,
    end_open_runs,
    end_run,
    environment,
    experiment_id,
    failure_status,
    find_pipeline_run,
    flatten,
    log_metrics,
    log_params,
    numeric_leaves,
    pipeline_run,
    set_tags,
    start_run,
    track_step,
)

__all__ = [
    "BATCH_METRICS", "KFP_RUN_TAG", "KIND_TAG", "LAST_EVAL_TAG_PREFIX", "METRICS_FILE", "METRIC_TAG_PREFIX",
    "MODEL_ARTIFACT_PATH", "PARENT_RUN_TAG", "RECORD_FILE", "TERMINAL", "MlflowLogger", "MultiLogger",
    "TrackingConfig", "TrackingError", "client", "download_model", "end_open_runs", "end_run", "environment",
    "experiment_id", "failure_status", "find_pipeline_run", "flatten", "local_dir", "log_metrics", "log_params",
    "numeric_leaves", "parse_model_ref", "pipeline_run", "read_metrics", "read_record", "record_reevaluation",
    "register_model", "resolve_model", "set_tags", "sqlite_uri", "start_run", "sync", "track_step",
    "version_metrics",
]  # fmt: skip
