"""MLflow runs: the client, the experiment, a parent run per pipeline run (:func:`pipeline_run`) and a nested run
per step (:func:`track_step`), and what is logged to a run (metrics in batches, params, tags).

``mlflow`` is imported only when tracking is on: :func:`client` imports it, and nothing here runs without a
``tracking.tracking_uri``.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from vlp.tracking.config import TrackingConfig
from vlp.tracking_auth import redact

PARENT_RUN_TAG = "mlflow.parentRunId"
KFP_RUN_TAG = "vlp.kfp_run_id"
KIND_TAG = "vlp.kind"  # "pipeline" for parent runs, "step" for nested step runs
TERMINAL = ("FINISHED", "FAILED", "KILLED")  # MLflow run statuses that end a run
BATCH_METRICS = 1000  # MLflow takes at most 1000 metrics in one log_batch


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


def numeric_leaves(data: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Finite int/float leaves of a nested mapping under dotted names (bools and strings are skipped)."""
    out: dict[str, float] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(numeric_leaves(value, name))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    return out


def client(cfg: TrackingConfig) -> Any:
    """An ``mlflow.MlflowClient`` for ``cfg.tracking_uri`` (which must be set)."""
    if not cfg.tracking_uri:
        raise ValueError("tracking.tracking_uri is empty: set it (e.g. sqlite:///runs/mlflow.db) to use MLflow")
    import mlflow

    return mlflow.MlflowClient(tracking_uri=cfg.tracking_uri)


def experiment_id(cfg: TrackingConfig) -> str:
    """Id of ``cfg.experiment``, created when missing (artifacts next to a sqlite db unless configured)."""
    mlflow_client = client(cfg)
    experiment = mlflow_client.get_experiment_by_name(cfg.experiment)
    if experiment is not None:
        return experiment.experiment_id
    location = cfg.artifact_location
    if not location and cfg.tracking_uri.startswith("sqlite:///"):
        location = (Path(cfg.tracking_uri[len("sqlite:///") :]).parent / "mlartifacts").resolve().as_uri()
    try:
        return mlflow_client.create_experiment(cfg.experiment, artifact_location=location or None)
    except Exception:  # created concurrently by another step: use that one
        experiment = mlflow_client.get_experiment_by_name(cfg.experiment)
        if experiment is None:
            raise
        return experiment.experiment_id


def start_run(
    cfg: TrackingConfig, run_name: str, tags: Mapping[str, str] | None = None, parent_run_id: str = ""
) -> str:
    """Open a run in ``cfg.experiment`` (nested under ``parent_run_id`` when given); returns its id."""
    all_tags = dict(tags or {})
    if parent_run_id:
        all_tags[PARENT_RUN_TAG] = parent_run_id
    run = client(cfg).create_run(experiment_id(cfg), run_name=run_name, tags=all_tags)
    return run.info.run_id


def end_run(cfg: TrackingConfig, run_id: str, status: str = "FINISHED") -> None:
    """Mark ``run_id`` FINISHED / FAILED / KILLED (MLflow's "View run" link goes to stderr: stdout is a CLI's
    JSON summary)."""
    with contextlib.redirect_stdout(sys.stderr):
        client(cfg).set_terminated(run_id, status=status)


def failure_status(exc: BaseException | None) -> str:
    """The status a run ends with when its work raised ``exc``: ``KILLED`` for an interruption (Ctrl-C, a SIGTERM
    the CLI turns into a ``KeyboardInterrupt``, or an exit with status 130 / 143), else ``FAILED``."""
    if isinstance(exc, SystemExit) and exc.code in (130, 143):  # e.g. a TrainJob launcher stopped by SIGTERM
        return "KILLED"
    return "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"


def end_open_runs(cfg: TrackingConfig, parent_run_id: str, status: str = "KILLED") -> list[str]:
    """End every RUNNING run nested under ``parent_run_id`` (at any depth), then the parent itself if it is still
    RUNNING, with ``status``; runs already ended keep their status. For a pipeline run that was stopped: its open
    step runs and its parent run end KILLED rather than staying RUNNING.

    Returns:
        The ids of the runs it ended, children first, the parent last.

    Raises:
        ValueError: ``status`` is not FINISHED, FAILED or KILLED, or tracking is off.
    """
    if status not in TERMINAL:
        raise ValueError(f"status {status!r}: expected one of {', '.join(TERMINAL)}")
    mlflow_client = client(cfg)
    experiment = mlflow_client.get_run(parent_run_id).info.experiment_id
    ended: list[str] = []
    parents, seen = [parent_run_id], {parent_run_id}
    while parents:
        children = mlflow_client.search_runs(
            [experiment], filter_string=f"tags.`{PARENT_RUN_TAG}` = '{parents.pop()}'", max_results=10000
        )
        for child in children:
            if child.info.run_id in seen:
                continue
            seen.add(child.info.run_id)
            parents.append(child.info.run_id)
            if child.info.status == "RUNNING":
                end_run(cfg, child.info.run_id, status)
                ended.append(child.info.run_id)
    if mlflow_client.get_run(parent_run_id).info.status == "RUNNING":
        end_run(cfg, parent_run_id, status)
        ended.append(parent_run_id)
    return ended


def log_metrics(cfg: TrackingConfig, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
    """Log a dict of numbers to ``run_id`` in one batch."""
    log_rows(cfg, run_id, [(metrics, step)])


def log_params(cfg: TrackingConfig, run_id: str, params: Mapping[str, Any]) -> None:
    """Log a (nested) dict of params to ``run_id``; keys already logged are skipped (MLflow params are immutable)."""
    from mlflow.entities import Param

    mlflow_client = client(cfg)
    existing = mlflow_client.get_run(run_id).data.params
    new = [Param(k, v) for k, v in flatten(params).items() if k not in existing]
    for start in range(0, len(new), 100):  # MLflow takes at most 100 params per batch
        mlflow_client.log_batch(run_id, params=new[start : start + 100])


def set_tags(cfg: TrackingConfig, run_id: str, tags: Mapping[str, str]) -> None:
    mlflow_client = client(cfg)
    for key, value in tags.items():
        mlflow_client.set_tag(run_id, key, str(value))


def find_pipeline_run(cfg: TrackingConfig, kfp_run_id: str) -> str | None:
    """Id of the parent run of KFP run ``kfp_run_id``, or None."""
    runs = client(cfg).search_runs(
        [experiment_id(cfg)],
        filter_string=f"tags.`{KFP_RUN_TAG}` = '{kfp_run_id}' and tags.`{KIND_TAG}` = 'pipeline'",
        order_by=["attributes.start_time ASC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def pipeline_run(
    cfg: TrackingConfig, kfp_run_id: str, run_name: str = "", tags: Mapping[str, str] | None = None
) -> str:
    """The parent run of KFP run ``kfp_run_id``: found by its tag, or created (tagged with ``tags``)."""
    if not kfp_run_id:
        raise ValueError("kfp_run_id is empty: pass the KFP run id (a step reads it from $KFP_RUN_ID)")
    found = find_pipeline_run(cfg, kfp_run_id)
    if found:
        return found
    all_tags = {**dict(tags or {}), KFP_RUN_TAG: kfp_run_id, KIND_TAG: "pipeline"}
    return start_run(cfg, run_name or f"pipeline-{kfp_run_id}", all_tags)


def track_step(
    cfg: TrackingConfig,
    step: str,
    work: Callable[[], dict[str, Any]],
    kfp_run_id: str = "",
    tags: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``work`` (a step) inside a nested MLflow run; returns its summary.

    With tracking off this is just ``work()``. Otherwise a run named ``step`` is opened under the pipeline's
    parent run (``kfp_run_id``) or ``cfg.parent_run_id``; while ``work`` runs, ``cfg.run_id`` names it, so
    a training step that builds an :class:`vlp.tracking.MlflowLogger` from the same ``cfg`` logs into it. The summary's
    numbers become metrics and its ``config`` params; the run ends FINISHED, or if ``work`` raises
    :func:`failure_status`'s status (KILLED for an interruption, else FAILED).

    Tracking never decides the step's fate: when the server cannot be reached the step runs untracked (with
    a warning; ``summary.json`` and ``metrics.jsonl`` hold everything), a failure to log the summary or end
    the run is a warning, and an exception of ``work`` is re-raised as it is.
    """
    if not cfg.tracking_uri:
        return work()
    run_tags = {**dict(tags or {}), KIND_TAG: "step", "vlp.step": step}
    if kfp_run_id:
        run_tags[KFP_RUN_TAG] = kfp_run_id
    opened: list[str] = []

    def open_run() -> None:
        parent = pipeline_run(cfg, kfp_run_id) if kfp_run_id else cfg.parent_run_id
        opened.append(start_run(cfg, step, run_tags, parent_run_id=parent))

    if not _quietly(cfg, f"opening the run of step {step} (it runs untracked)", open_run):
        return work()
    run_id = opened[0]
    previous, cfg.run_id = cfg.run_id, run_id
    try:
        summary = work()
    except BaseException as exc:
        status = failure_status(exc)
        _quietly(cfg, f"marking run {run_id} {status}", lambda: end_run(cfg, run_id, status))  # the error wins
        raise
    finally:
        cfg.run_id = previous

    def finish() -> None:
        log_params(cfg, run_id, summary.get("config") or {})
        log_metrics(cfg, run_id, numeric_leaves({k: v for k, v in summary.items() if k != "config"}))
        end_run(cfg, run_id)

    _quietly(cfg, f"logging the summary of {step} to run {run_id} (it is in summary.json)", finish)
    return summary


def _quietly(cfg: TrackingConfig, what: str, call: Callable[[], Any]) -> bool:
    """``call()`` with short requests; a failure is a warning (tracking never fails a step that did its work)."""
    try:
        with short_requests(cfg):
            call()
        return True
    except Exception as exc:
        warnings.warn(
            f"MLflow at {redact(cfg.tracking_uri)}: {what} failed ({type(exc).__name__}: {exc})", stacklevel=3
        )
        return False


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """``values`` in this process's environment while inside (MLflow's client reads its settings there); what was
    there before is put back."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def short_requests(cfg: TrackingConfig) -> contextlib.AbstractContextManager[None]:
    """MLflow's HTTP client with ``cfg``'s timeout and retries (its defaults retry for minutes)."""
    return environment(
        MLFLOW_HTTP_REQUEST_TIMEOUT=str(int(max(1, cfg.timeout_s))),
        MLFLOW_HTTP_REQUEST_MAX_RETRIES=str(cfg.retries),
        MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="1",
    )


def log_rows(cfg: TrackingConfig, run_id: str, rows: Sequence[tuple[Mapping[str, float], int]]) -> None:
    """Log ``(metrics, step)`` rows to ``run_id`` in one batch (at most :data:`BATCH_METRICS` metrics)."""
    from mlflow.entities import Metric
    from mlflow.utils.time import get_current_time_millis

    now = get_current_time_millis()
    batch = [Metric(k, float(v), now, step) for metrics, step in rows for k, v in metrics.items()]
    if batch:
        client(cfg).log_batch(run_id, metrics=batch)
