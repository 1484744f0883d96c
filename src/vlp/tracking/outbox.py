"""The outbox of a training output's metrics: ``<out>/metrics.jsonl`` holds every record, and
:class:`MlflowLogger` sends them to the output's MLflow run whenever the server can take them.

The run belongs to the training output: ``<out>/tracking.json`` records its id and the step's status, and
whatever the run lacks of ``<out>/metrics.jsonl`` (an outage that outlasted the step, a kill) is sent by the
next logger of that output, before anything new: a resume or a rerun of the step continues the same run, and
``vlp tracking sync <out>`` (:func:`sync`) catches it up and ends it with the step's status without training.
A metric the run already holds at a step is never sent again, so a sync can run any number of times.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from vlp import storage
from vlp.data.manifest import SUMMARY
from vlp.tracking.config import TrackingConfig
from vlp.tracking.runs import (
    BATCH_METRICS,
    KIND_TAG,
    TERMINAL,
    client,
    end_run,
    failure_status,
    log_metrics,
    log_params,
    log_rows,
    numeric_leaves,
    set_tags,
    short_requests,
    start_run,
)
from vlp.tracking_auth import redact

log = logging.getLogger("vlp")
METRICS_FILE = "metrics.jsonl"  # <out>/metrics.jsonl: every training metric, one line per logged step
RECORD_FILE = "tracking.json"  # <out>/tracking.json: the output's MLflow run and the step's status


class TrackingError(RuntimeError):
    """The tracking server could not take what had to be sent (the message says what is left and how to retry)."""


def read_metrics(uri: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(params, rows)`` of a ``metrics.jsonl``: its ``params`` records, and its metric rows one per step in
    step order. The reader every consumer of the file uses.

    The training loop keeps each step once (:meth:`vlp.train.loop.JsonlMetricsLogger.rewind`); a file written
    before it did may repeat the steps a resume ran again, and the last line of a step wins. A line cut short by
    a kill is skipped with a warning. A missing file reads as ``([], [])``.
    """
    if not storage.exists(uri):
        return [], []
    params: list[dict[str, Any]] = []
    rows: dict[int, dict[str, Any]] = {}
    for number, line in enumerate(storage.read_text(uri).splitlines(), 1):
        try:
            record = json.loads(line) if line.strip() else {}
        except json.JSONDecodeError:
            warnings.warn(f"{uri} line {number} is not JSON (a write cut short by a kill?); skipped", stacklevel=2)
            continue
        if not isinstance(record, dict):
            warnings.warn(f"{uri} line {number} is not a JSON object; skipped", stacklevel=2)
        elif "step" in record:
            rows[int(record["step"])] = record
        elif "params" in record:
            params.append(record["params"])
    return params, [rows[step] for step in sorted(rows)]


def read_record(out: str) -> dict[str, Any]:
    """``<out>/tracking.json``: ``run_id``, ``run_name``, ``status`` (the step's, as its process last knew it),
    ``complete``, ``unsent``; ``{}`` when there is none. An output written before the record existed falls back
    to the run id in its ``summary.json``."""

    uri = storage.join(out, RECORD_FILE)
    if storage.exists(uri):
        return json.loads(storage.read_text(uri))
    summary = _read_json(storage.join(out, SUMMARY)) or {}
    run_id = (summary.get("tracking") or {}).get("run_id")
    return {"run_id": run_id, "run_name": summary.get("step", ""), "status": "FINISHED"} if run_id else {}


def _read_json(uri: str) -> dict[str, Any] | None:
    return json.loads(storage.read_text(uri)) if storage.exists(uri) else None


def _backlog(out: str) -> list[tuple[str, Any]]:
    """The records of ``<out>/metrics.jsonl`` as a logger queues them: params first, then one per step."""
    params, rows = read_metrics(storage.join(out, METRICS_FILE))
    metrics = [("metrics", ({k: float(v) for k, v in r.items() if k != "step"}, int(r["step"]), False)) for r in rows]
    return [*(("params", p) for p in params), *metrics]


def _find_run(cfg: TrackingConfig, run_id: str) -> Any:
    """The run ``run_id`` on ``cfg``'s server, or None when the server has no such run (or it was deleted)."""
    from mlflow.exceptions import MlflowException

    try:
        run = client(cfg).get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    return None if run.info.lifecycle_stage == "deleted" else run


def _history(cfg: TrackingConfig, run: Any) -> dict[str, set[int]]:
    """The steps at which ``run`` holds each of its metrics."""
    mlflow_client = client(cfg)
    return {key: {m.step for m in mlflow_client.get_metric_history(run.info.run_id, key)} for key in run.data.metrics}


def _log_step_summary(cfg: TrackingConfig, run_id: str, summary: Mapping[str, Any]) -> None:
    """What :func:`vlp.tracking.track_step` logs when a step ends (its config as params, its numbers as metrics),
    for a step run (``vlp.kind=step``) that missed it; keys the run already has are left alone."""
    run = client(cfg).get_run(run_id)
    if run.data.tags.get(KIND_TAG) != "step":
        return
    log_params(cfg, run_id, summary.get("config") or {})
    numbers = numeric_leaves({k: v for k, v in summary.items() if k not in ("config", "tracking")})
    log_metrics(cfg, run_id, {k: v for k, v in numbers.items() if k not in run.data.metrics})


# --------------------------------------------------------------------------- the training logger


class MlflowLogger:
    """One MLflow run; :meth:`log_metrics` / :meth:`log_params` as the training loop calls them. Never raises.

    Opens a new run (nested under ``cfg.parent_run_id`` when set), or attaches to ``cfg.run_id`` when set;
    an attached run is left open by :meth:`close` (its owner ends it). When the server cannot be reached
    (or answers with an error), the records wait here, in order, a warning says tracking is down, and they
    go out with the first call that reaches it again (at most every ``cfg.retry_every_s``): the run catches
    up. Training never waits for the server beyond one short request; ``metrics.jsonl`` has every record
    either way. :meth:`close` says whether everything arrived (:attr:`complete`, :attr:`unsent`).

    With ``out`` (the training output) the run is that output's: ``<out>/tracking.json`` records it, a later
    logger of ``out`` continues it rather than opening another (a resume, a rerun of a finished step, a sync),
    and the first thing sent is what ``<out>/metrics.jsonl`` holds and the run lacks, in step order; a metric
    the run already holds at a step is never sent again. An attached run takes the output over: it gets the
    whole file, and the output's earlier run, if still RUNNING, is ended with the status its process recorded
    (KILLED when it recorded none). Such a logger reaches the server at its first call, not when built, so that
    :meth:`rewind` (which the training loop calls first) can drop what a killed attempt wrote past the checkpoint
    before any of it is sent: the resumed values of those steps are the ones the run gets.
    """

    def __init__(
        self, cfg: TrackingConfig, run_name: str, tags: Mapping[str, str] | None = None, out: str = ""
    ) -> None:
        self._cfg, self._run_name, self._tags, self._out = cfg, run_name, dict(tags or {}), out
        self._owned = not cfg.run_id
        self._record, self._backlog = self._read_output(out) if out else ({}, [])
        recorded = self._record.get("run_id") or None
        self.run_id: str | None = cfg.run_id or recorded
        self._superseded = recorded if cfg.run_id and recorded not in (None, cfg.run_id) else None
        self._pending: list[tuple[str, Any]] = [("tags", self._tags)] if cfg.run_id and tags else []
        self._connected, self._status = False, ""
        self._known: dict[str, set[int]] = {}
        self._known_max = -1
        self._down_since: float | None = None
        self._next_try = 0.0
        self.outages = 0
        self.sent = 0  # metric values this logger sent
        if not out:
            self._flush(force=True)

    def rewind(self, step: int) -> None:
        """Forget the records of ``metrics.jsonl`` past ``step`` not yet sent (training logs those steps again),
        then reach the server."""

        def keep(record: tuple[str, Any]) -> bool:
            kind, payload = record
            return kind != "metrics" or payload[2] or payload[1] <= step  # (metrics, step, live)

        self._backlog = [r for r in self._backlog if keep(r)]
        self._pending = [r for r in self._pending if keep(r)]
        self._flush(force=True)

    @property
    def unsent(self) -> int:
        """Records (one step's metrics, params, tags, the run's end) not yet accepted by the server; until the
        server is first reached, every record of the output's ``metrics.jsonl`` counts too."""
        return len(self._pending) + len(self._backlog)

    @property
    def complete(self) -> bool:
        return self._connected and not self._pending

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        record = (dict(metrics), int(step), True)
        if self._connected:
            self._queue(*record)
        else:
            self._pending.append(("metrics", record))
        self._flush()

    def log_params(self, params: dict[str, Any]) -> None:
        self._pending.append(("params", params))
        self._flush()

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Queue a step's summary for a step run that missed it (see :func:`_log_step_summary`)."""
        self._pending.append(("summary", dict(summary)))

    def close(self, status: str = "FINISHED") -> dict[str, Any]:
        """End an owned run (or mark an attached one ``FAILED`` / ``KILLED``) after sending what is left;
        ``"RUNNING"`` sends what is left and ends nothing. Returns ``{"run_id", "complete", "unsent", "outages"}``.

        ``"FAILED"`` while an interruption is being handled (a ``KeyboardInterrupt``, e.g. Ctrl-C or the CLI's
        SIGTERM) becomes ``"KILLED"``: a step stopped by its user did not fail.
        """
        if status == "FAILED":
            status = failure_status(sys.exc_info()[1])
        if status != "RUNNING" and (self._owned or status != "FINISHED"):
            self._pending.append(("end", status))
        self._flush(force=True)
        if self.unsent:
            retry = f"; `vlp tracking sync {self._out}` sends them once the server is back" if self._out else ""
            warnings.warn(
                f"MLflow run {self.run_id or '(never created)'} at {redact(self._cfg.tracking_uri)} is incomplete: "
                f"{self.unsent} record(s) never reached the server; every metric is in metrics.jsonl{retry}",
                stacklevel=2,
            )
        result = {"run_id": self.run_id, "complete": self.complete, "unsent": self.unsent, "outages": self.outages}
        if self._out:
            self._write_record(status if status != "RUNNING" else self._record.get("status", "RUNNING"))
        return result

    @staticmethod
    def _read_output(out: str) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        """``out``'s record and backlog; unreadable ones count as none (tracking never fails the step)."""
        try:
            return read_record(out), _backlog(out)
        except Exception as exc:
            warnings.warn(f"cannot read the tracking state of {out} ({exc}); its run starts afresh", stacklevel=3)
            return {}, []

    def _write_record(self, status: str) -> None:
        self._record = {"run_id": self.run_id, "run_name": self._run_name, "experiment": self._cfg.experiment,
                        "tracking_uri": redact(self._cfg.tracking_uri), "status": status,
                        "complete": self.complete, "unsent": self.unsent}  # fmt: skip
        try:
            storage.write_text(storage.join(self._out, RECORD_FILE), json.dumps(self._record, indent=2) + "\n")
        except Exception as exc:  # the record helps a later sync; losing it never fails the step
            warnings.warn(f"cannot write {RECORD_FILE} in {self._out}: {exc}", stacklevel=3)

    def _connect(self) -> None:
        """Find (or open) the run, learn which steps it holds, queue what it lacks; once per logger."""
        status, known = "RUNNING", {}
        if self.run_id is not None and self._out:
            run = _find_run(self._cfg, self.run_id)
            if run is None and not self._owned:
                raise TrackingError(f"run {self.run_id} (tracking.run_id) is not on this server")
            if run is None:
                warnings.warn(
                    f"the MLflow run {self.run_id} of {self._out} is not on {redact(self._cfg.tracking_uri)}; "
                    f"a new run gets every metric of its {METRICS_FILE}",
                    stacklevel=4,
                )
                self.run_id = None
            else:
                status, known = run.info.status, _history(self._cfg, run)
        if self.run_id is None:
            self.run_id = start_run(self._cfg, self._run_name, self._tags, self._cfg.parent_run_id)
        if self._superseded:
            self._end_superseded(self._superseded)
        self._status, self._connected = status, True
        self._requeue(known)
        if self._out and self._record.get("run_id") != self.run_id:
            self._write_record(self._record.get("status", "RUNNING") if self._owned else "RUNNING")

    def _end_superseded(self, run_id: str) -> None:
        run = _find_run(self._cfg, run_id)
        if run is not None and run.info.status == "RUNNING":
            recorded = self._record.get("status", "")
            end_run(self._cfg, run_id, recorded if recorded in TERMINAL else "KILLED")
        self._superseded = None

    def _requeue(self, known: dict[str, set[int]]) -> None:
        """Queue the backlog, then what was logged before the run was reached, without what the run holds."""
        records, self._pending, self._backlog = [*self._backlog, *self._pending], [], []
        steps = [payload[1] for kind, payload in records if kind == "metrics"]
        self._known = known
        self._known_max = max([*(max(s) for s in known.values() if s), *steps, -1])
        for kind, payload in records:
            if kind == "metrics":
                self._queue(*payload)
            else:
                self._pending.append((kind, payload))

    def _queue(self, metrics: dict[str, float], step: int, live: bool) -> None:
        if step <= self._known_max:  # a step the run may hold already (later steps are always new)
            metrics = {k: v for k, v in metrics.items() if step not in self._known.setdefault(k, set())}
            for key in metrics:
                self._known[key].add(step)
        if metrics:
            self._pending.append(("metrics", (metrics, step, live)))

    @property
    def _run(self) -> str:
        """The run's id: records are sent only once the run is reached, and so has one."""
        if self.run_id is None:
            raise TrackingError("no MLflow run to send to: the run was not reached")
        return self.run_id

    def _send_next(self) -> int:
        """Send the first pending record (consecutive metrics as one batch); returns how many records went."""
        kind, payload = self._pending[0]
        if kind != "metrics":
            self._send(kind, payload)
            return 1
        rows: list[Any] = []
        size = 0
        for kind, payload in self._pending:
            if kind != "metrics" or (rows and size + len(payload[0]) > BATCH_METRICS):
                break
            rows.append(payload)
            size += len(payload[0])
        if self._status in TERMINAL and any(live for *_, live in rows):  # training goes on in an ended run
            client(self._cfg).update_run(self._run, status="RUNNING")
            self._status = "RUNNING"
        log_rows(self._cfg, self._run, [(metrics, step) for metrics, step, _ in rows])
        self.sent += size
        return len(rows)

    def _send(self, kind: str, payload: Any) -> None:
        if kind == "params":
            log_params(self._cfg, self._run, payload)
        elif kind == "tags":
            set_tags(self._cfg, self._run, payload)
        elif kind == "summary":
            _log_step_summary(self._cfg, self._run, payload)
        elif payload != self._status:  # "end"; a run already in that status is left as it is
            end_run(self._cfg, self._run, payload)
            self._status = payload

    def _flush(self, force: bool = False) -> None:
        if not force and self._down_since is not None and time.monotonic() < self._next_try:
            return
        try:
            with short_requests(self._cfg):
                if not self._connected:
                    self._connect()
                while self._pending:
                    del self._pending[: self._send_next()]
        except Exception as exc:  # any failure of the server or the network: keep the records, train on
            if self._down_since is None:
                self._down_since, self.outages = time.monotonic(), self.outages + 1
                warnings.warn(
                    f"MLflow tracking at {redact(self._cfg.tracking_uri)} is down "
                    f"({type(exc).__name__}: {str(exc)[:200]}); "
                    f"training goes on, metrics go to metrics.jsonl and are sent when the server is back",
                    stacklevel=3,
                )
            self._next_try = time.monotonic() + self._cfg.retry_every_s
            return
        if self._down_since is not None:
            log.warning("MLflow tracking is back after %.0f s; caught up", time.monotonic() - self._down_since)
            self._down_since = None


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

    def rewind(self, step: int) -> None:
        """Rewind the loggers that can (the JSONL file) to ``step``; see the training loop's resume."""
        for logger in self.loggers:
            if hasattr(logger, "rewind"):
                logger.rewind(step)


# --------------------------------------------------------------------------- sync


def sync(cfg: TrackingConfig, out: str, status: str = "") -> dict[str, Any]:
    """Bring the MLflow run of training output ``out`` up to date with ``<out>/metrics.jsonl`` and end it with
    the step's status: what ``vlp tracking sync <out>`` runs. Running it again sends nothing twice.

    The run is the one ``<out>/tracking.json`` (or, for older outputs, ``summary.json``) names; when the server
    has no such run, a new one gets everything. The status is ``status`` when given, else FINISHED for a step
    that finished (it wrote ``summary.json``), else the one its process recorded; a step that has not finished
    (or was killed before it could say) leaves the run RUNNING. A step run of a pipeline also gets the summary
    numbers its step could not log. On success ``summary.json``'s ``tracking`` entry is brought up to date.

    Returns:
        ``{"out", "run_id", "sent" (metric values sent now), "status" (the run's), "complete"}``.

    Raises:
        ValueError: tracking is off, or ``status`` is not FINISHED, FAILED or KILLED.
        FileNotFoundError: ``out`` has no ``metrics.jsonl``.
        TrackingError: the server could not take everything (nothing is lost: run it again later).
    """

    if status and status not in TERMINAL:
        raise ValueError(f"status {status!r}: expected one of {', '.join(TERMINAL)}")
    client(cfg)  # tracking_uri must be set
    if not storage.exists(storage.join(out, METRICS_FILE)):
        raise FileNotFoundError(f"{out} has no {METRICS_FILE}: nothing to sync (is it a training step's output?)")
    summary = _read_json(storage.join(out, SUMMARY))
    record = read_record(out)
    status = status or ("FINISHED" if summary is not None else record.get("status", "RUNNING"))
    name = record.get("run_name") or (summary or {}).get("step") or "train"
    logger = MlflowLogger(replace(cfg, run_id=""), name, {"vlp.step": name, "vlp.out": out}, out=out)
    if summary is not None:
        logger.log_summary(summary)
    result = logger.close(status if status in TERMINAL else "RUNNING")
    if not result["complete"]:
        raise TrackingError(
            f"MLflow at {redact(cfg.tracking_uri)} did not take {result['unsent']} record(s) of {out}; they are "
            f"all in {METRICS_FILE}: run `vlp tracking sync {out}` again once the server is up"
        )
    if summary is not None and summary.get("tracking") != result:
        summary["tracking"] = result
        storage.write_text(storage.join(out, SUMMARY), json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return {"out": out, "run_id": result["run_id"], "sent": logger.sent, "status": status, "complete": True}
