"""Extract-frames itself: plan, run the decoders, write each shard atomically, then the index and the rejects;
the fan-out parts and their merge. See :mod:`vlp.data.frames`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from vlp import storage
from vlp.data import manifest
from vlp.data.frames.decode import _extract_video
from vlp.data.frames.layout import _META_KEY, _SHARD_RE, FRAME_SCHEMA, INDEX, INDEX_SCHEMA, PART, SHARDS_DIR
from vlp.data.frames.plan import FramesConfig, _plan_shards, _settings, _ShardPlan, _validate, _VideoResult, _VideoTask
from vlp.data.isolate import isolated_map

log = logging.getLogger(__package__)  # "vlp.data.frames": the name its records had before the package


# --------------------------------------------------------------------------- the step


def extract(dataset: str, out: str, cfg: FramesConfig) -> dict:
    """Extract ``cfg.num_frames`` JPEG frames per video of ``dataset`` into Parquet shards under ``out``.

    Args:
        dataset: Ingested dataset directory (local or ``s3://``) holding ``videos.parquet``.
        out: Output directory or ``s3://`` prefix (shards, ``index.parquet``, ``rejects.parquet``).
        cfg: Extraction settings.

    Returns:
        A summary: counts of videos, stored videos, frames, rejects and shards (written / skipped / pruned).

    Raises:
        ValueError: on invalid settings or duplicate video ids; ``ManifestError`` on a bad ``videos.parquet``.
        RuntimeError: when a worker process died (completed shards are kept; re-run to resume).
    """
    _validate(cfg)
    videos = manifest.read(dataset, manifest.VIDEOS, manifest.VIDEO_SCHEMA)
    plans = _plan_shards(videos, dataset, cfg)
    existing = {
        os.path.basename(u): u for u in storage.list_files(storage.join(out, SHARDS_DIR), ".parquet", recursive=False)
    }
    todo = [p for p in plans if os.path.basename(p.name) not in existing]
    log.info("extract-frames: %d videos, %d shards, %d to write", len(videos), len(plans), len(todo))
    written = _run_shards(todo, out, cfg)
    index, rejects = _collect(plans, out, written)
    names = [p.name for p in plans]
    if written or not _index_is_current(out, names):  # rejects first: the index is the commit marker
        manifest.write(out, manifest.REJECTS, rejects, manifest.REJECT_SCHEMA)
        storage.write_parquet(storage.join(out, INDEX), index.replace_schema_metadata(_index_meta(names)))
    wanted = {os.path.basename(n) for n in names}
    stale = [u for b, u in existing.items() if b not in wanted and _SHARD_RE.match(b)]
    for uri in stale:
        storage.delete(uri)
    return {
        "videos": len(videos),
        "stored_videos": index.num_rows,
        "stored_frames": int(pc.sum(index["num_stored"]).as_py() or 0),
        "rejected": rejects.num_rows,
        "shards": len(plans),
        "shards_written": len(written),
        "shards_skipped": len(plans) - len(written),
        "shards_pruned": len(stale),
        "index": storage.join(out, INDEX),
        "rejects": storage.join(out, manifest.REJECTS),
    }


def extract_part(dataset: str, out: str, cfg: FramesConfig, index: int, count: int) -> dict[str, Any]:
    """Part ``index`` of ``count`` of :func:`extract`: the planned shards :func:`vlp.data.manifest.part_range`
    assigns it, under ``out/shards``, and ``out/part.json`` naming them; no index (the merge writes it). Finished
    shards are skipped, so a retried part redoes only what it had not written.

    Returns:
        A summary: the part, its videos and shards (written / skipped).
    """
    _validate(cfg)
    plans = _plan_shards(manifest.read(dataset, manifest.VIDEOS, manifest.VIDEO_SCHEMA), dataset, cfg)
    mine = [plans[i] for i in manifest.part_range(len(plans), index, count)]
    existing = {os.path.basename(u) for u in storage.list_files(storage.join(out, SHARDS_DIR), ".parquet", False)}
    todo = [p for p in mine if os.path.basename(p.name) not in existing]
    log.info("extract-frames part %d/%d: %d of %d shards, %d to write", index, count, len(mine), len(plans), len(todo))
    written = _run_shards(todo, out, cfg)
    part = {"index": index, "count": count, "settings": _settings(cfg), "shards": [p.name for p in mine]}
    storage.write_text(storage.join(out, PART), json.dumps(part, indent=1, sort_keys=True) + "\n")
    return {
        "part": index,
        "parts": count,
        "videos": sum(len(p.tasks) for p in mine),
        "shards": len(mine),
        "shards_written": len(written),
        "shards_skipped": len(mine) - len(written),
    }


def merge_parts(dataset: str, parts: Sequence[str], out: str, cfg: FramesConfig) -> dict[str, Any]:
    """The output of :func:`extract` from the outputs of its parts (:func:`extract_part`), byte-identical to it.

    Every planned shard is copied from the part that wrote it (shards already in ``out`` are kept), then
    :func:`extract` runs and, finding every shard present, writes the index and the rejects.

    Raises:
        ValueError: the parts are not one complete set (a part missing or twice, another count), were made
            with other settings, lack a planned shard (made from another dataset), or lack a shard they list.
    """
    _validate(cfg)
    plans = _plan_shards(manifest.read(dataset, manifest.VIDEOS, manifest.VIDEO_SCHEMA), dataset, cfg)
    found = {}
    for uri in parts:
        try:
            found[uri] = json.loads(storage.read_text(storage.join(uri, PART)))
        except FileNotFoundError:
            raise ValueError(f"{uri} has no {PART}: not the output of an extract-frames part") from None
    _check_parts(found, cfg)
    owner = {name: uri for uri, part in found.items() for name in part["shards"]}
    missing = [p.name for p in plans if p.name not in owner]
    if missing:
        raise ValueError(
            f"the {len(found)} parts lack {len(missing)} of the {len(plans)} planned shards (first: {missing[0]}): "
            f"they were made from another {manifest.VIDEOS} or other settings than {dataset}"
        )
    present = {os.path.basename(u) for u in storage.list_files(storage.join(out, SHARDS_DIR), ".parquet", False)}
    copied = 0
    for plan in plans:
        if os.path.basename(plan.name) not in present:
            try:
                storage.copy(storage.join(owner[plan.name], plan.name), storage.join(out, plan.name))
            except FileNotFoundError:
                raise ValueError(
                    f"the part {owner[plan.name]} lacks {plan.name}, which its {PART} lists: the part was damaged "
                    "after it ran; run that part again"
                ) from None
            copied += 1
    return {**extract(dataset, out, cfg), "parts": len(found), "shards_copied": copied}  # every shard is present


def _check_parts(found: dict[str, dict[str, Any]], cfg: FramesConfig) -> None:
    """The parts are parts 0..n-1 of one n, made with ``cfg``'s settings."""
    if not found:
        raise ValueError("merge needs at least one part")
    counts = {part["count"] for part in found.values()}
    indices = sorted(part["index"] for part in found.values())
    if len(counts) != 1 or indices != list(range(next(iter(counts)))):
        raise ValueError(f"the parts are not one complete set: indices {indices} of counts {sorted(counts)}")
    for uri, part in found.items():
        if part["settings"] != _settings(cfg):
            raise ValueError(f"part {uri} was made with settings {part['settings']}, not {_settings(cfg)}")


# --------------------------------------------------------------------------- running


def _run_shards(plans: list[_ShardPlan], out: str, cfg: FramesConfig) -> dict[str, dict[str, Any]]:
    """Extract every video of ``plans`` (in parallel) and write each shard as soon as it is complete.

    Returns the metadata of the shards written, by shard name.
    """
    from tqdm import tqdm

    tasks = [t for p in plans for t in p.tasks]
    workers = min(cfg.workers or os.cpu_count() or 1, max(len(tasks), 1))
    fn = functools.partial(_extract_video, cfg=cfg)

    def failed(task: _VideoTask, reason: str) -> _VideoResult:  # the file is quarantined as a reject
        return _VideoResult(task.video_id, reject=f"decoder {reason} (frames.timeout_s={cfg.timeout_s:g})")

    with contextlib.ExitStack() as stack:
        results: Iterator[_VideoResult] = map(fn, tasks)
        if workers > 1:  # forks now, before tqdm starts a thread
            results = isolated_map(fn, tasks, workers=workers, timeout_s=cfg.timeout_s, on_failure=failed)
            next_result = next(results, None)
            results = itertools.chain([] if next_result is None else [next_result], results)
        bar = stack.enter_context(
            tqdm(total=len(tasks), unit="video", desc="extract-frames", disable=None if cfg.progress else True)
        )
        return _write_in_order(plans, results, out, cfg, bar.update)


def _write_in_order(
    plans: list[_ShardPlan], results: Iterator[_VideoResult], out: str, cfg: FramesConfig, tick: Callable[[], Any]
) -> dict[str, dict[str, Any]]:
    """Consume per-video results (in task order) and write each shard when its last video is in."""
    written: dict[str, dict[str, Any]] = {}
    for plan in plans:
        got = []
        for _ in plan.tasks:
            got.append(next(results))
            tick()
        written[plan.name] = _write_shard(out, plan, got, cfg)
        log.debug("wrote %s", plan.name)
    return written


def _write_shard(out: str, plan: _ShardPlan, results: list[_VideoResult], cfg: FramesConfig) -> dict[str, Any]:
    """Write one shard atomically, one row group per video (a reader fetches a clip's bytes alone, see
    :class:`~vlp.data.frames.FrameStore`), with the metadata in its footer; return the metadata and ``footer_bytes``."""
    import pyarrow.parquet as pq

    videos: list[dict[str, Any]] = []
    rejects: list[dict[str, Any]] = []
    tables: list[Any] = []
    for task, res in zip(plan.tasks, results, strict=True):
        if res.reject:
            rejects.append({"video_id": task.video_id, "path": task.uri, "reason": res.reject})
            continue
        counts = {"video_id": task.video_id, "num_stored": len(res.rows), "num_frames": task.num_frames}
        videos.append({**counts, "fps": task.fps, "row_group": len(tables)})
        columns = [[task.video_id] * len(res.rows), *zip(*res.rows, strict=True)]
        tables.append(pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(columns, FRAME_SCHEMA, strict=True)],
                                           schema=FRAME_SCHEMA))  # fmt: skip
    meta = {"settings": _settings(cfg), "videos": videos, "rejects": rejects}
    sink = pa.BufferOutputStream()
    compression = {name: "zstd" for name in FRAME_SCHEMA.names} | {"jpeg": "none"}  # JPEG does not compress
    # A small footer, read once per shard and reader: no statistics (the index says where a clip is) and no copy of
    # the Arrow schema (the Parquet types map back to FRAME_SCHEMA), which would hold the metadata a second time.
    with pq.ParquetWriter(
        sink, FRAME_SCHEMA, compression=compression, use_dictionary=["video_id"], write_statistics=False,
        store_schema=False,
    ) as writer:  # fmt: skip
        for table in tables:
            writer.write_table(table, row_group_size=table.num_rows)
        writer.add_key_value_metadata({_META_KEY: json.dumps(meta, sort_keys=True).encode()})
    data = sink.getvalue().to_pybytes()
    storage.write_bytes(storage.join(out, plan.name), data)
    return {**meta, "footer_bytes": int.from_bytes(data[-8:-4], "little") + 8}


# --------------------------------------------------------------------------- index


def _collect(plans: list[_ShardPlan], out: str, written: dict[str, dict[str, Any]]) -> tuple[pa.Table, pa.Table]:
    """Index and rejects tables of all shards (metadata of shards not written now is read back)."""
    index_rows, reject_rows = [], []
    for plan in plans:
        meta = written.get(plan.name) or _read_shard_meta(storage.join(out, plan.name))
        index_rows += [{**v, "shard": plan.name, "footer_bytes": meta["footer_bytes"]} for v in meta["videos"]]
        reject_rows += [
            {"stage": "extract_frames", "kind": "video", "record_id": r["video_id"], "path": r["path"],
             "reason": r["reason"]}
            for r in meta["rejects"]
        ]  # fmt: skip
    return manifest.from_rows(index_rows, INDEX_SCHEMA), manifest.from_rows(reject_rows, manifest.REJECT_SCHEMA)


def _read_shard_meta(uri: str) -> dict[str, Any]:
    """A shard's ``vlp.frames`` metadata (from its footer alone) and ``footer_bytes``, what reading that costs."""
    footer = storage.parquet_footer(uri)
    raw = (footer.metadata.schema.to_arrow_schema().metadata or {}).get(_META_KEY)
    if raw is None:
        raise manifest.ManifestError(f"{uri} has no {_META_KEY.decode()} metadata: not written by extract-frames?")
    return {**json.loads(raw), "footer_bytes": footer.metadata.serialized_size + 8}


def _index_meta(shard_names: list[str]) -> dict[bytes, bytes]:
    return {_META_KEY: json.dumps({"shards": shard_names}).encode()}


def _index_is_current(out: str, shard_names: list[str]) -> bool:
    """True when index.parquet and rejects.parquet exist and the index was built from exactly these shards."""
    index_uri = storage.join(out, INDEX)
    if not (storage.exists(index_uri) and storage.exists(storage.join(out, manifest.REJECTS))):
        return False
    return storage.read_parquet_metadata(index_uri).get(_META_KEY) == _index_meta(shard_names)[_META_KEY]
