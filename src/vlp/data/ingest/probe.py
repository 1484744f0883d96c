"""Probing: every file a worker process opens (size, frames, duration), retried while the store fails; and the
fan-out parts that probe a share of the files each (:func:`probe_part`) and the merge that reads their results."""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from tqdm import tqdm

from vlp import storage
from vlp.data import manifest, video
from vlp.data.ingest.readers import _read
from vlp.data.ingest.records import IngestConfig, ProbeResult, _absolute, _checked
from vlp.data.ingest.validate import _prevalidate
from vlp.data.isolate import isolated_map

log = logging.getLogger(__package__)  # "vlp.data.ingest": the name its records had before the package

_WINDOW = 1024  # probe tasks handed to the pool at a time (bounds the futures held in memory)
_NO_LIMITS = video.DecodeLimits(0, 0, 0.0)
_STORAGE_FAILURE = "storage failure: "  # a probe result that says nothing about the file
PROBES = "probes.parquet"  # what one fan-out part probed (probe_part)
_PROBES_META = b"vlp.probes"
PROBE_SCHEMA = pa.schema(
    [
        pa.field("uri", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),  # "" = probed; else the reject reason
        pa.field("num_frames", pa.int64()),  # the probe's measurements (null when rejected)
        pa.field("fps", pa.float64()),
        pa.field("duration_s", pa.float64()),
        pa.field("width", pa.int64()),
        pa.field("height", pa.int64()),
        pa.field("size_bytes", pa.int64()),
    ]
)
_MEASURES = PROBE_SCHEMA.names[2:]


# --------------------------------------------------------------------------- probing


def _probe_one(uri: str, limits: video.DecodeLimits = _NO_LIMITS) -> tuple[dict[str, Any] | None, str]:
    """Probe one video/image URI (runs in a worker): ``(measurements, "")`` or ``(None, reason)``.

    The file's size and declared frame size and duration are checked against ``limits`` first, so a
    file too large to decode safely is rejected without decoding (an S3 object without downloading).
    """
    try:
        remote = storage.local_path(uri) is None  # a file to copy first: its size is checked before the copy
        if remote and limits.max_bytes and (size := storage.size(uri)) > limits.max_bytes:
            return None, f"too large: {size} bytes > ingest.max_bytes={limits.max_bytes}"
        with storage.local_copy(uri) as local:
            if not os.path.exists(local):
                return None, f"missing file: {uri}"
            problem = video.limits_problem(local, limits, "ingest.")
            if problem:
                return None, problem
            try:
                info = video.probe(local)
            except video.VideoError as exc:
                reason = str(exc)
                return None, reason if local == uri else reason.replace(local, uri)
            size = os.path.getsize(local)
    except FileNotFoundError:
        return None, f"missing file: {uri}"
    except storage.StorageError as exc:  # the store failed, not the file: retried by _probe_all, never a reject
        return None, f"{_STORAGE_FAILURE}{video.short_reason(exc, 300)}"
    except Exception as exc:  # a worker answers for every file, whatever the decoder or the store did
        return None, f"probe failed: {type(exc).__name__}: {video.short_reason(exc, 200)}"
    fields = {"num_frames": info.num_frames, "fps": info.fps, "duration_s": info.duration_s}
    return fields | {"width": info.width, "height": info.height, "size_bytes": size}, ""


def probe_file(uri: str, limits: video.DecodeLimits = _NO_LIMITS) -> tuple[dict[str, Any] | None, str]:
    """ingest's probe of one file (what ``vlp fetch`` checks a download with): ``(measurements, "")`` or
    ``(None, reason)``; decode it in a worker process (:func:`vlp.data.isolate.isolated_map`)."""
    return _probe_one(uri, limits)


def _probe_all(uris: list[str], cfg: IngestConfig) -> list[ProbeResult]:
    """Probe ``uris`` with ``cfg.workers`` processes and a progress bar; results in input order.

    A file the store failed to serve (5xx, connection reset, timeout: a ``StorageError``) is read again
    ``cfg.storage_retries`` times with a doubling wait; if the store still fails, the step fails with an
    error that names the files. Only a file's own defects become rejects, so an outage drops no video.

    Raises:
        storage.StorageError: the store kept failing for some files.
    """
    results: list[tuple[dict[str, Any] | None, str]] = [(None, "")] * len(uris)
    todo, wait = list(range(len(uris))), cfg.retry_wait_s
    for attempt in range(cfg.storage_retries + 1):
        for i, result in zip(todo, _probe_pass([uris[i] for i in todo], cfg, attempt), strict=True):
            results[i] = result
        todo = [i for i in todo if results[i][1].startswith(_STORAGE_FAILURE)]
        if not todo:
            return results
        if attempt < cfg.storage_retries:
            log.warning("ingest: the store failed on %d file(s); reading them again in %.1f s", len(todo), wait)
            time.sleep(wait)
            wait *= 2
    first = results[todo[0]][1][len(_STORAGE_FAILURE) :]
    raise storage.StorageError(
        f"ingest: the store failed on {len(todo)} file(s) after {cfg.storage_retries + 1} attempts (first: "
        f"{uris[todo[0]]}: {first}); nothing was rejected for it - rerun when the store is back"
    )


def _probe_pass(uris: list[str], cfg: IngestConfig, attempt: int) -> list[tuple[dict[str, Any] | None, str]]:
    desc = "ingest: probe" if attempt == 0 else f"ingest: probe again ({attempt})"
    limits = video.DecodeLimits(cfg.max_pixels, cfg.max_bytes, cfg.max_duration_s)
    probe = functools.partial(_probe_one, limits=limits)
    with tqdm(total=len(uris), desc=desc, unit="file", mininterval=1.0, disable=not cfg.progress or not uris) as bar:
        if cfg.workers <= 1 or len(uris) <= 1:
            results = []
            for uri in uris:
                results.append(probe(uri))
                bar.update()
            return results
        return _run_pool(probe, uris, cfg.workers, bar.update, timeout_s=cfg.timeout_s)


def _run_pool(
    fn: Callable[[Any], Any], items: Sequence[Any], workers: int, tick: Callable[[], Any], timeout_s: float = 0.0
) -> list[Any]:
    """``[fn(x) for x in items]`` in worker processes (:func:`vlp.data.isolate.isolated_map`).

    A worker killed by a decoder crash, or still busy after ``timeout_s``, makes its item a reject
    (``probe crashed: ...`` / ``probe timed out ...``: the file is quarantined) and the rest go on.
    """

    def failed(item: Any, reason: str) -> tuple[None, str]:
        if reason.startswith("crashed"):
            return None, f"probe crashed: the decoder killed its worker process ({reason})"
        return None, f"probe {reason}: a hanging decoder (ingest.timeout_s)"

    results = []
    for result in isolated_map(fn, items, workers=workers, timeout_s=timeout_s, on_failure=failed, window=_WINDOW):
        results.append(result)
        tick()
    return results


# --------------------------------------------------------------------------- fan-out


def probe_part(source: str, out: str, cfg: IngestConfig, index: int, count: int) -> dict[str, Any]:
    """Part ``index`` of ``count`` of ingest's probing: read and validate ``source`` as
    :func:`~vlp.data.ingest.ingest` does, probe the files :func:`vlp.data.manifest.part_range` gives this part, and
    write the results to ``out/probes.parquet``. A part whose file already holds the results for the same files and
    settings is skipped (a rerun).

    Returns:
        A summary: the part, the files to probe in all and in this part, whether it was skipped.
    """
    source, out = _checked(source, cfg), _absolute(out)
    _, survivors = _prevalidate(_read(source, cfg), cfg)
    uris = [r["path"] for r in survivors]
    span = manifest.part_range(len(uris), index, count)
    mine = uris[span.start : span.stop]
    meta = {"index": index, "count": count, "files": len(uris), "settings": _probe_settings(cfg)}
    meta["digest"] = _digest(mine)
    target = storage.join(out, PROBES)
    summary = {"part": index, "parts": count, "files": len(uris), "part_files": len(mine)}
    if storage.exists(target) and json.loads(storage.read_parquet_metadata(target).get(_PROBES_META, b"{}")) == meta:
        log.info("ingest part %d/%d: %s already holds its %d probes", index, count, target, len(mine))
        return {**summary, "skipped": True}
    log.info("ingest part %d/%d: probing %d of %d files", index, count, len(mine), len(uris))
    results = _probe_all(mine, cfg)
    rows = [{"uri": u, "reason": reason, **{k: (info or {}).get(k) for k in _MEASURES}} for u, (info, reason) in
            zip(mine, results, strict=True)]  # fmt: skip
    table = manifest.from_rows(rows, PROBE_SCHEMA)
    storage.write_parquet(target, table.replace_schema_metadata({_PROBES_META: json.dumps(meta, sort_keys=True)}))
    return {**summary, "skipped": False, "rejected": sum(bool(reason) for _, reason in results)}


def _probe_settings(cfg: IngestConfig) -> dict[str, Any]:
    """The settings that change a probe's result (the limits; min_duration_s is applied after probing)."""
    return {"max_pixels": cfg.max_pixels, "max_bytes": cfg.max_bytes, "max_duration_s": cfg.max_duration_s,
            "timeout_s": cfg.timeout_s}  # fmt: skip


def _digest(uris: Sequence[str]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(list(uris)).encode()).hexdigest()[:16]


def _probed_by(parts: Sequence[str], uris: list[str], cfg: IngestConfig) -> list[ProbeResult]:
    """The probe results of ``uris`` from the outputs of :func:`probe_part`, checked to be exactly their parts."""
    found = []
    for part in parts:
        uri = storage.join(part, PROBES)
        if not storage.exists(uri):
            raise ValueError(f"{part} has no {PROBES}: not the output of an ingest probe part")
        table = storage.read_parquet(uri)
        found.append((part, json.loads(table.schema.metadata[_PROBES_META]), table))
    found.sort(key=lambda item: item[1]["index"])
    indices, counts = [m["index"] for _, m, _ in found], {m["count"] for _, m, _ in found}
    if len(counts) != 1 or indices != list(range(len(found))) or counts != {len(found)}:
        raise ValueError(f"the probe parts are not one complete set: indices {indices} of counts {sorted(counts)}")
    results: list[ProbeResult] = []
    for part, meta, table in found:
        span = manifest.part_range(len(uris), meta["index"], meta["count"])
        if meta["settings"] != _probe_settings(cfg) or meta["digest"] != _digest(uris[span.start : span.stop]):
            raise ValueError(
                f"probe part {part} was made from other files or settings than this ingest (part "
                f"{meta['index']} of {meta['count']}, {meta['files']} files to probe, settings {meta['settings']}; "
                f"here {len(uris)} files, settings {_probe_settings(cfg)})"
            )
        for row in table.to_pylist():
            results.append((None if row["reason"] else {k: row[k] for k in _MEASURES}, row["reason"]))
    return results
