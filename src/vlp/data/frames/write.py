"""Sparse frame extraction: an ingested dataset -> Parquet shards of JPEG frames + an index.

What is stored, and why it is enough
------------------------------------
For every clip we store ``num_frames`` (default 16) frames chosen with the deterministic ``uniform``
rule of :mod:`vlp.data.sampling` over the *whole* clip (the middle frame of each of 16 equal
segments), or every frame when the clip is shorter. Still images (``media == "image"``) store their
one image; the loader repeats it. Each row keeps the source frame index and its nominal timestamp
(``frame_index / fps``).

Training-time samplers (``rand``, ``headtail``, ``uniform``) then run over the *stored* frames.
16 is the most any configuration we reproduce samples per clip (ALPRO: 4 frames in pre-training,
8 or 16 in fine-tuning), so ``uniform`` with k in {1, 2, 4, 8, 16} returns evenly spread stored frames
and, for clips of at least 16 frames, no loader asks for more frames than are stored. What this gives up: ``rand`` and
``headtail`` pick among 16 fixed candidates instead of every frame of the clip, so temporal jitter
(the augmentation) is coarser - 4 frames drawn from 4 stored frames per segment rather than from
~n/4 - and a k-frame ``uniform`` grid lands on the nearest stored frames, up to half a stored segment
away from where it would fall in the full clip. Re-extract with a larger ``num_frames`` if that
matters (shard names change with the settings, so nothing stale is reused).

Output layout (``out`` is a local directory or an ``s3://`` prefix)
------------------------------------------------------------------
``shards/shard-00003-<hash8>.parquet``  rows :data:`FRAME_SCHEMA` for ``videos_per_shard`` videos
(sorted by ``video_id``); the hash covers those videos (id, path, probe numbers) and the extraction
settings. The shard's Parquet key-value metadata carries, as JSON, the per-video counts and the
shard's rejects, so one atomic write records everything about the shard.
``index.parquet``  :data:`INDEX_SCHEMA`, one row per stored video.
``rejects.parquet``  ``manifest.REJECT_SCHEMA`` rows with ``stage="extract_frames"``.

Idempotency: a re-run plans the same shard names, skips every shard that exists (a shard exists only
once completely written: writes are atomic), rewrites the index and rejects from the shards'
metadata when anything changed, and deletes shard files of an older plan (other settings or inputs).
Outputs of a re-run are byte-identical.

Fan-out (:func:`extract_part`, :func:`merge_parts`): on a cluster, pod ``i`` of ``n`` writes the contiguous run of
planned shards that :func:`vlp.data.manifest.part_range` gives it (and ``part.json`` naming them) into its own
output; a merge copies every planned shard from the parts and finishes as a re-run of :func:`extract` that finds
all shards present, so the merged output is byte-identical to one pod's. A part re-run skips its finished shards,
as :func:`extract` does.

Decoding
--------
The default ``decoder="sparse"`` reads with PyAV and plans at the packet level: whole GOPs that hold
no wanted frame are never sent to the decoder, decoding stops after the last wanted frame of a GOP,
non-reference frames that are not wanted are discarded by the decoder unread (``skip_frame=NONREF``),
and only wanted frames are converted to RGB (through one shared SwsContext). It returns the same
pixels as decord (checked in the tests); in ``benchmarks/bench_extract.py`` (10 s, 30 fps clips) it
used ~2x less CPU than decord ``get_batch``, which cost about as much as decoding every frame. When it
fails on a file, decord then sequential PyAV are tried (:func:`decode_frames`, through
:func:`vlp.data.video.read_with_fallbacks`); a file all of them fail on becomes a reject whose reason
names each decoder's error. Decoders run single-threaded so that worker processes scale.

Before any decoding a file's size and the frame size its header declares are checked against
``frames.max_bytes`` / ``frames.max_pixels``; with ``workers >= 2`` each file is decoded in a worker
process (:mod:`vlp.data.isolate`), and a file whose decoder crashes its worker or runs past
``frames.timeout_s`` becomes a reject, so one hostile file never fails the step or its reruns.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import io
import itertools
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vlp import storage
from vlp.data import manifest, video
from vlp.data.sampling import sample_indices

log = logging.getLogger(__package__)  # "vlp.data.frames": the name its records had before the package

SHARDS_DIR = "shards"
INDEX = "index.parquet"
PART = "part.json"  # what one fan-out part wrote (extract_part), read by merge_parts
FORMAT_VERSION = 2  # bump when the bytes written for the same inputs and settings change (2: a row group per clip)
_META_KEY = b"vlp.frames"
_KEEP_PACKETS_BYTES = 256 * 1024 * 1024  # read_sparse holds the packets of files up to this size in memory
_SHARD_RE = re.compile(r"^shard-\d{5,}-[0-9a-f]{8}\.parquet$")

FRAME_SCHEMA = pa.schema(
    [
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("slot", pa.int32(), nullable=False),  # 0..k-1 in temporal order
        pa.field("frame_index", pa.int64(), nullable=False),  # index of the frame in the source clip
        pa.field("timestamp_s", pa.float64(), nullable=False),  # frame_index / fps (0.0 for stills)
        pa.field("width", pa.int32(), nullable=False),
        pa.field("height", pa.int32(), nullable=False),
        pa.field("jpeg", pa.binary(), nullable=False),
    ]
)

INDEX_SCHEMA = pa.schema(
    [
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("shard", pa.string(), nullable=False),  # relative to the output directory
        pa.field("num_stored", pa.int64(), nullable=False),  # frames stored for the video
        pa.field("num_frames", pa.int64(), nullable=False),  # frames in the source clip (1 for stills)
        pa.field("fps", pa.float64(), nullable=False),  # source frame rate (0.0 for stills)
        pa.field("row_group", pa.int32(), nullable=False),  # the video's row group in its shard
        pa.field("footer_bytes", pa.int32(), nullable=False),  # the shard's footer + 8: what reading it costs
    ]
)
# An index written before row groups per clip (FORMAT_VERSION 1) lacks the last two columns; FrameStore reads its
# shards whole instead. Re-running extract-frames on such an output rewrites it in the current format.
_INDEX_V1_COLUMNS = ("video_id", "shard", "num_stored", "num_frames", "fps")
_V1_SCHEMA = pa.schema([INDEX_SCHEMA.field(name) for name in _INDEX_V1_COLUMNS])


@dataclass
class FramesConfig:
    """Settings of ``vlp extract-frames``."""

    num_frames: int = 16  # frames stored per clip, chosen with the "uniform" rule (all frames if fewer)
    size: int = 224  # output frames are size x size pixels
    resize: Literal["stretch", "short_side_crop"] = "stretch"  # stretch = ALPRO; or short side + centre crop
    jpeg_quality: int = 90  # PIL JPEG quality, 1..95
    videos_per_shard: int = 64  # videos per Parquet shard (the unit of skipping on re-runs)
    workers: int = 2  # decoding processes; 0 = one per CPU core
    decoder: Literal["sparse", "decord", "pyav"] = "sparse"  # first decoder tried; see the module docstring
    progress: bool = True  # tqdm progress bar over videos (shown on a terminal only)
    max_pixels: int = 8192 * 4320  # reject a clip whose header declares larger frames, before decoding (0 = off)
    max_bytes: int = 4 << 30  # reject a larger file before decoding it (0 = off)
    timeout_s: float = 300.0  # decode time per file; a hung or crashing decoder is a reject (workers >= 2; 0 = off)


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class _VideoTask:
    video_id: str
    uri: str  # resolved path or s3:// URI of the media (as the manifest gives it when `problem` is set)
    media: str  # "video" | "image"
    num_frames: int  # from the ingest probe
    fps: float
    problem: str = ""  # why the path must not be opened (outside the dataset's media root, unusable): a reject


@dataclass
class _VideoResult:
    video_id: str
    rows: list[tuple[int, int, float, int, int, bytes]] = field(default_factory=list)  # FRAME_SCHEMA minus video_id
    reject: str = ""  # reason; empty when stored


@dataclass(frozen=True)
class _ShardPlan:
    number: int
    name: str  # shards/shard-00003-<hash8>.parquet
    tasks: tuple[_VideoTask, ...]


def _settings(cfg: FramesConfig) -> dict[str, Any]:
    """The settings that determine a shard's bytes (workers, decoder and progress do not)."""
    return {
        "format": FORMAT_VERSION,
        "num_frames": cfg.num_frames,
        "size": cfg.size,
        "resize": cfg.resize,
        "jpeg_quality": cfg.jpeg_quality,
        "store_rule": "uniform",
    }


def _plan_shards(videos: pa.Table, dataset: str, cfg: FramesConfig) -> list[_ShardPlan]:
    """Sort videos by id, group them ``videos_per_shard`` at a time and name each group by a content hash."""
    rows = sorted(videos.to_pylist(), key=lambda r: r["video_id"])
    dupes = sorted({a["video_id"] for a, b in itertools.pairwise(rows) if a["video_id"] == b["video_id"]})
    if dupes:
        raise ValueError(f"videos.parquet has duplicate video_id values {dupes[:5]}; re-run ingest to deduplicate")
    recorded = manifest.media_root(videos)
    tasks = [_task(r, recorded or dataset) for r in rows]
    escaped = [t for t in tasks if t.problem.startswith("path outside its root")]
    if recorded is None and escaped:  # an older vlp's dataset: its paths point at the source, not the dataset
        raise manifest.ManifestError(
            f"{storage.join(dataset, manifest.VIDEOS)} records no media root (written by hand, or by a vlp older "
            f"than that record) and {len(escaped)} of its paths lie outside {dataset} (first: {escaped[0].uri!r}): "
            "re-run `vlp ingest` into this dataset, which records the root the paths were checked against"
        )
    settings = json.dumps(_settings(cfg), sort_keys=True)
    plans = []
    for number, start in enumerate(range(0, len(tasks), cfg.videos_per_shard)):
        group = tuple(tasks[start : start + cfg.videos_per_shard])
        digest = hashlib.sha256(settings.encode())
        for t in group:
            refused = [t.problem] if t.problem else []  # a path refused now names another shard than it did opened
            digest.update(json.dumps([t.video_id, t.uri, t.media, t.num_frames, t.fps, *refused]).encode())
        name = f"{SHARDS_DIR}/shard-{number:05d}-{digest.hexdigest()[:8]}.parquet"
        plans.append(_ShardPlan(number, name, group))
    return plans


def _task(row: dict[str, Any], root: str) -> _VideoTask:
    """The task of one ``videos.parquet`` row; a path outside ``root`` (the dataset's media root) or unusable is
    never opened and becomes the video's reject (the table was edited after ingest, or written by hand)."""
    try:
        uri, problem = manifest.resolve_inside(root, row["path"]), ""
    except manifest.BadPathError as exc:
        uri, problem = str(row["path"]).encode("utf-8", "backslashreplace").decode(), str(exc)
    return _VideoTask(row["video_id"], uri, row["media"], int(row["num_frames"]), float(row["fps"]), problem)


def stored_indices(num_frames: int, k: int) -> list[int]:
    """Source frame indices stored for a clip of ``num_frames`` frames: ``uniform`` over the clip, or all frames."""
    return list(range(num_frames)) if num_frames <= k else sample_indices(num_frames, k, "uniform")


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
            with other settings, or lack a planned shard (made from another dataset).
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
            storage.copy(storage.join(owner[plan.name], plan.name), storage.join(out, plan.name))
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


def _validate(cfg: FramesConfig) -> None:
    checks = [
        (cfg.num_frames >= 1, f"frames.num_frames must be >= 1, got {cfg.num_frames}"),
        (cfg.size >= 8, f"frames.size must be >= 8 pixels, got {cfg.size}"),
        (
            cfg.resize in ("stretch", "short_side_crop"),
            f"frames.resize must be stretch|short_side_crop: {cfg.resize!r}",
        ),
        (1 <= cfg.jpeg_quality <= 95, f"frames.jpeg_quality must be in 1..95, got {cfg.jpeg_quality}"),
        (cfg.videos_per_shard >= 1, f"frames.videos_per_shard must be >= 1, got {cfg.videos_per_shard}"),
        (cfg.workers >= 0, f"frames.workers must be >= 0 (0 = one per CPU core), got {cfg.workers}"),
        (cfg.decoder in ("sparse", "decord", "pyav"), f"frames.decoder must be sparse|decord|pyav: {cfg.decoder!r}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


# --------------------------------------------------------------------------- running


def _run_shards(plans: list[_ShardPlan], out: str, cfg: FramesConfig) -> dict[str, dict[str, Any]]:
    """Extract every video of ``plans`` (in parallel) and write each shard as soon as it is complete.

    Returns the metadata of the shards written, by shard name.
    """
    from tqdm import tqdm

    from vlp.data.isolate import isolated_map

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
    :class:`FrameStore`), with the metadata in its footer; return the metadata and ``footer_bytes``."""
    import pyarrow.parquet as pq

    videos, rejects, tables = [], [], []
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


def _is_shard_name(name: str) -> bool:
    """True for ``shards/shard-NNNNN-<hash8>.parquet``, the only names an index may point at."""
    folder, _, base = name.partition("/")
    return folder == SHARDS_DIR and _SHARD_RE.match(base) is not None and "\n" not in base


def _index_meta(shard_names: list[str]) -> dict[bytes, bytes]:
    return {_META_KEY: json.dumps({"shards": shard_names}).encode()}


def _index_is_current(out: str, shard_names: list[str]) -> bool:
    """True when index.parquet and rejects.parquet exist and the index was built from exactly these shards."""
    index_uri = storage.join(out, INDEX)
    if not (storage.exists(index_uri) and storage.exists(storage.join(out, manifest.REJECTS))):
        return False
    return storage.read_parquet_metadata(index_uri).get(_META_KEY) == _index_meta(shard_names)[_META_KEY]


# --------------------------------------------------------------------------- one video (runs in a worker)


def _extract_video(task: _VideoTask, cfg: FramesConfig) -> _VideoResult:
    """Decode, resize and JPEG-encode the stored frames of one video; any decode failure is a reject.

    Storage errors other than a missing object propagate: a transient outage must not become a
    permanent reject baked into a completed shard.
    """
    if task.problem:
        return _VideoResult(task.video_id, reject=task.problem)
    if task.media == "image":
        indices, fps = [0], 0.0
    elif task.num_frames < 1 or task.fps <= 0:
        return _VideoResult(task.video_id, reject=f"manifest says {task.num_frames} frames at {task.fps} fps")
    else:
        indices, fps = stored_indices(task.num_frames, cfg.num_frames), task.fps
    try:
        with storage.local_copy(task.uri) as local:
            if not os.path.exists(local):
                raise FileNotFoundError(local)
            problem = video.limits_problem(local, video.DecodeLimits(cfg.max_pixels, cfg.max_bytes), "frames.")
            if problem:
                return _VideoResult(task.video_id, reject=problem)
            frames = (
                video.read_image(local)[None] if task.media == "image" else decode_frames(local, indices, cfg.decoder)
            )
        rows = []
        for slot, (index, frame) in enumerate(zip(indices, frames, strict=True)):
            jpeg, width, height = encode_frame(frame, cfg.size, cfg.resize, cfg.jpeg_quality)
            rows.append((slot, index, index / fps if fps else 0.0, width, height, jpeg))
    except FileNotFoundError as exc:
        return _VideoResult(task.video_id, reject=f"missing file: {video.short_reason(exc, 200)}")
    except storage.StorageError:
        raise
    except Exception as exc:  # decord, PyAV and PIL raise many types; all mean "this file is bad"
        return _VideoResult(task.video_id, reject=video.short_reason(exc, 200))
    return _VideoResult(task.video_id, rows=rows)


def encode_frame(frame: np.ndarray, size: int, resize: str, quality: int) -> tuple[bytes, int, int]:
    """Resize an RGB frame ``(H, W, 3)`` uint8 and JPEG-encode it; returns ``(jpeg, width, height)``.

    ``stretch`` resizes to ``size x size`` ignoring the aspect ratio (as ALPRO); ``short_side_crop``
    scales the short side to ``size`` and crops the centre square. PIL bilinear with antialiasing.
    """
    from PIL import Image

    img = Image.fromarray(frame)
    if resize == "short_side_crop":
        w, h = img.size
        scale = size / min(w, h)
        nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
        left, top = (nw - size) // 2, (nh - size) // 2
        img = img.resize((nw, nh), Image.BILINEAR).crop((left, top, left + size, top + size))
    else:
        img = img.resize((size, size), Image.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue(), img.width, img.height


def decode_frames(path: str, indices: Sequence[int], decoder: str = "sparse") -> np.ndarray:
    """Frames ``indices`` of local video ``path`` as ``(N, H, W, 3)`` uint8 RGB.

    ``decoder="sparse"`` tries :func:`read_sparse` first, then decord, then sequential PyAV;
    ``"decord"`` starts at decord; ``"pyav"`` uses sequential PyAV only.
    """
    readers = {"sparse": read_sparse, **video.BACKENDS}
    return video.read_with_fallbacks(path, indices, [(name, readers[name]) for name in _DECODER_CHAINS[decoder]])


_DECODER_CHAINS = {"sparse": ("sparse", "decord", "pyav"), "decord": ("decord", "pyav"), "pyav": ("pyav",)}


# --------------------------------------------------------------------------- the sparse PyAV reader


def packet_plan(pts: Sequence[int], keyframe: Sequence[bool], wanted: Iterable[int]) -> tuple[list[bool], set[int]]:
    """Which packets (in decode order) must reach the decoder to output display frames ``wanted``.

    Display index ``i`` is the packet with the ``i``-th smallest pts. A GOP runs from a keyframe to the
    next one (in decode order); within it, packets after the last wanted one are not needed. A GOP with
    no wanted frame is skipped entirely - unless the next GOP has a wanted *leading* picture (pts before
    its keyframe's, an open GOP), which may reference this GOP, in which case all of it is kept.

    Returns:
        ``(send, wanted_pts)``: a mask over packets and the pts values of the wanted frames.
    """
    order = sorted(pts)
    if len(set(order)) != len(order):
        raise video.VideoError("packets with duplicate pts: cannot map frames to indices")
    wanted_pts = {order[i] for i in wanted}
    starts = [i for i, key in enumerate(keyframe) if key]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    gops = list(zip(starts, [*starts[1:], len(pts)], strict=True))
    send = [False] * len(pts)
    for g, (a, b) in enumerate(gops):
        last = max((j for j in range(a, b) if pts[j] in wanted_pts), default=-1)
        if g + 1 < len(gops):
            na, nb = gops[g + 1]
            if any(pts[j] in wanted_pts and pts[j] < pts[na] for j in range(na, nb)):
                last = b - 1
        for j in range(a, last + 1):
            send[j] = True
    return send, wanted_pts


def read_sparse(path: str, indices: Sequence[int]) -> np.ndarray:
    """Decode only what frames ``indices`` need (see :func:`packet_plan`) -> ``(N, H, W, 3)`` uint8 RGB.

    A demux pass reads packet timestamps and keyframe flags (no decoding); the planned packets then
    go to a single-threaded decoder that discards unwanted non-reference frames and stops once every
    wanted frame is out. Files up to ``_KEEP_PACKETS_BYTES`` keep their packets in memory between the
    two steps; larger files are demuxed a second time instead.
    """
    import av

    keep = os.path.getsize(path) <= _KEEP_PACKETS_BYTES
    with av.open(path) as container:
        stream = container.streams.video[0]
        demuxed = (p for p in container.demux(stream) if p.size)
        packets = list(demuxed) if keep else None
        meta = [(p.pts, p.is_keyframe) for p in (packets if packets is not None else demuxed)]
        if not meta or any(p is None for p, _ in meta):
            raise video.VideoError("no packets with timestamps")
        bad = [i for i in indices if not 0 <= i < len(meta)]
        if bad:
            raise video.VideoError(f"frame indices {bad[:5]} out of range for {len(meta)} frames")
        pts = [p for p, _ in meta]
        send, wanted_pts = packet_plan(pts, [k for _, k in meta], indices)
        if packets is not None:
            got = _decode_planned(stream.codec_context, packets, send, wanted_pts)
    if packets is None:
        with av.open(path) as container:
            stream = container.streams.video[0]
            got = _decode_planned(
                stream.codec_context, (p for p in container.demux(stream) if p.size), send, wanted_pts
            )
    order = sorted(pts)
    missing = [i for i in indices if order[i] not in got]
    if missing:
        raise video.VideoError(f"frames {missing[:5]} were not produced by the decoder")
    return np.stack([got[order[i]] for i in indices])


def _decode_planned(
    codec: Any, packets: Iterable[Any], send: list[bool], wanted_pts: set[int]
) -> dict[int, np.ndarray]:
    """Feed the packets marked in ``send`` to ``codec``; return the wanted frames as RGB arrays by pts."""
    from av.video.reformatter import VideoReformatter

    codec.thread_count = 1
    rgb = VideoReformatter()  # one SwsContext for all frames: frame.to_ndarray(format=) builds one per frame
    got: dict[int, np.ndarray] = {}

    def keep(frames: Iterable[Any]) -> None:
        for frame in frames:
            if frame.pts in wanted_pts:
                got[frame.pts] = rgb.reformat(frame, format="rgb24").to_ndarray()

    for packet, needed in zip(packets, send, strict=False):
        if needed:
            codec.skip_frame = "DEFAULT" if packet.pts in wanted_pts else "NONREF"
            keep(codec.decode(packet))
            if len(got) == len(wanted_pts):
                return got
    keep(codec.decode(None))  # flush the frames the decoder still holds back for reordering
    return got


# --------------------------------------------------------------------------- reading the frames back


class CorruptClipError(ValueError):
    """A stored clip that cannot be decoded (a damaged JPEG, or a row group that is not the clip's)."""


class FrameStore:
    """Read access to an extract-frames output for training code.

    ``FrameStore(out).load(video_id)`` -> ``(k, H, W, 3)`` uint8 RGB, frames in temporal order.

    What a clip costs: shards hold one row group per clip (``FORMAT_VERSION`` 2), so a clip is one ranged read of
    its row group's column chunks (the frames' JPEG bytes plus about a hundred bytes), after the shard's footer
    (about 460 bytes per clip of the shard; its exact size is in the index, so it too is one read). Footers are
    cached (the ``cache_footers`` most recently used shards): reading the clips of a shard one after another reads
    its footer once. An output written before row groups per clip (its index lacks ``row_group``) is read a whole
    shard at a time into a cache of ``cache_shards`` shards, as vlp did then; re-running ``extract-frames`` on it
    rewrites it in the current format.

    The index is held as NumPy arrays (no Python object per clip): the sorted ids as fixed-width bytes, the shard
    as a code into the list of shard names, and the counts; ``bytes_per_clip`` says what that costs. Forked
    loader workers share those pages instead of copying them.
    """

    def __init__(self, out: str, cache_shards: int = 2, cache_footers: int = 1024) -> None:
        self.out = out
        uri = storage.join(out, INDEX)
        if not storage.exists(uri):
            raise FileNotFoundError(f"{uri} does not exist: run `vlp extract-frames --out {out}` first")
        table = storage.read_parquet(uri)
        missing = [c for c in _INDEX_V1_COLUMNS if c not in table.column_names]
        if missing:
            raise manifest.ManifestError(f"{uri}: missing column(s) {missing}; has {table.column_names}")
        self._load_index(uri, table)
        self._footers: collections.OrderedDict[str, tuple[storage.ParquetFooter, dict[int, str]]] = (
            collections.OrderedDict()
        )
        self._cache: collections.OrderedDict[str, tuple[pa.Table, dict[str, tuple[int, int]]]] = (
            collections.OrderedDict()
        )
        self._cache_shards, self._cache_footers = max(1, cache_shards), max(1, cache_footers)

    def _load_index(self, uri: str, table: pa.Table) -> None:
        has_groups = "row_group" in table.column_names and "footer_bytes" in table.column_names
        table = manifest.check_schema(table, INDEX_SCHEMA if has_groups else _V1_SCHEMA, uri)
        ids = np.array([v.encode() for v in table.column("video_id").to_pylist()], dtype=bytes)
        if len(ids) == 0:
            ids = np.zeros(0, dtype="S1")
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        if len(ids) > 1 and (ids[1:] == ids[:-1]).any():
            dupe = ids[1:][ids[1:] == ids[:-1]][0].decode()
            raise manifest.ManifestError(f"{uri}: video {dupe!r} is listed twice")
        codes = table.column("shard").dictionary_encode().combine_chunks()
        self._shard_names: list[str] = codes.dictionary.to_pylist()
        bad = next((name for name in self._shard_names if not _is_shard_name(name)), None)
        if bad is not None:  # the index names files relative to `out`: only names extract-frames writes
            raise manifest.ManifestError(
                f"{uri}: {bad!r} is not a shard name ({SHARDS_DIR}/shard-NNNNN-<hash>.parquet)"
            )

        def column(name: str, dtype: Any) -> np.ndarray:
            return table.column(name).to_numpy().astype(dtype, copy=False)[order]

        self._ids = ids
        self._shard = codes.indices.to_numpy().astype(np.int32)[order]
        self._num_stored = column("num_stored", np.int32)
        self._num_frames = column("num_frames", np.int64)
        self._fps = column("fps", np.float64)
        n = len(ids)
        self._row_group = column("row_group", np.int32) if has_groups else np.full(n, -1, np.int32)
        self._footer_bytes = column("footer_bytes", np.int32) if has_groups else np.zeros(n, np.int32)

    @property
    def bytes_per_clip(self) -> float:
        """Memory the index takes per stored clip, in bytes (its arrays; the shard names are counted too)."""
        arrays = (self._ids, self._shard, self._num_stored, self._num_frames, self._fps, self._row_group,
                  self._footer_bytes)  # fmt: skip
        names = sum(len(name) + 56 for name in self._shard_names)  # a Python str's header is about 56 bytes
        return (sum(a.nbytes for a in arrays) + names) / max(1, len(self))

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, video_id: object) -> bool:
        return isinstance(video_id, str) and self._find(video_id) >= 0

    @property
    def video_ids(self) -> list[str]:
        """Ids of the stored videos, sorted (by their UTF-8 bytes)."""
        return [v.decode() for v in self._ids]

    def positions(self, video_ids: Sequence[str]) -> np.ndarray:
        """Each id's row in the store's sorted index (-1 where it has no frames): int64, one lookup for all."""
        keys = np.array([v.encode() for v in video_ids], dtype=bytes) if len(video_ids) else np.zeros(0, "S1")
        if len(self._ids) == 0:
            return np.full(len(keys), -1, np.int64)
        at = np.searchsorted(self._ids, keys).clip(0, len(self._ids) - 1)
        return np.where(self._ids[at] == keys, at, -1).astype(np.int64)

    def _find(self, video_id: str) -> int:
        key = video_id.encode()
        at = int(np.searchsorted(self._ids, key))
        return at if at < len(self._ids) and self._ids[at] == key else -1

    def _row(self, video_id: str) -> int:
        row = self._find(video_id)
        if row < 0:
            raise KeyError(f"video {video_id!r} is not in {self.out}/{INDEX} (rejected, or not in the dataset)")
        return row

    def info(self, video_id: str) -> dict[str, Any]:
        """The index row of ``video_id``: shard, num_stored, num_frames, fps, row_group (-1: read the shard whole)."""
        row = self._row(video_id)
        return {
            "video_id": video_id,
            "shard": self._shard_names[self._shard[row]],
            "num_stored": int(self._num_stored[row]),
            "num_frames": int(self._num_frames[row]),
            "fps": float(self._fps[row]),
            "row_group": int(self._row_group[row]),
        }

    def num_stored(self, video_id: str) -> int:
        """Frames stored for ``video_id``."""
        return int(self._num_stored[self._row(video_id)])

    def shard_of(self, video_ids: Sequence[str]) -> np.ndarray:
        """The shard number (a code, equal for clips of one shard) of each of ``video_ids``: int64."""
        rows = self.positions(video_ids)
        if (rows < 0).any():
            raise KeyError(f"video {video_ids[int(np.argmax(rows < 0))]!r} is not in {self.out}/{INDEX}")
        return self._shard[rows].astype(np.int64)

    def rows(self, video_id: str, columns: Sequence[str] | None = None) -> pa.Table:
        """The :data:`FRAME_SCHEMA` rows of ``video_id`` (``columns`` of them), ordered by slot."""
        row = self._row(video_id)
        shard = self._shard_names[self._shard[row]]
        group = int(self._row_group[row])
        if group < 0:  # an output written before row groups per clip
            table, spans = self._shard_table(shard)
            start, length = spans[video_id]
            rows = table.slice(start, length)
            return rows if columns is None else rows.select(list(columns))
        uri = storage.join(self.out, shard)
        footer, owners = self._footer(uri, int(self._footer_bytes[row]))
        rows = storage.read_row_groups(uri, [group], None if columns is None else list(columns), footer=footer)
        if rows.num_rows != self._num_stored[row] or owners.get(group) != video_id:  # the shard's own record
            raise CorruptClipError(
                f"{uri}: row group {group} does not hold the {self._num_stored[row]} frames of video {video_id!r} "
                f"the index says it does (the index and the shard disagree: re-run extract-frames)"
            )
        return rows

    def load(self, video_id: str, slots: Sequence[int] | None = None) -> np.ndarray:
        """Decoded frames of ``video_id`` (all stored, or ``slots`` in that order) -> ``(k, H, W, 3)`` uint8.

        Raises:
            CorruptClipError: a chosen frame's JPEG does not decode; the message names the clip, shard and slot.
        """
        from PIL import Image

        jpegs = self.rows(video_id, ["jpeg"]).column("jpeg").to_pylist()
        chosen = range(len(jpegs)) if slots is None else slots
        frames = []
        for slot in chosen:
            try:
                frames.append(np.asarray(Image.open(io.BytesIO(jpegs[slot])).convert("RGB")))
            except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError ... for damaged data
                shard = self._shard_names[self._shard[self._row(video_id)]]
                why = video.short_reason(exc, 120)
                raise CorruptClipError(
                    f"video {video_id!r} ({shard}, slot {slot}): its JPEG does not decode: {why}"
                ) from exc
        return np.stack(frames)

    def sample(self, video_id: str, num_frames: int, mode: str = "uniform", rng: Any = None) -> np.ndarray:
        """``num_frames`` stored frames chosen by sampler ``mode`` (see :mod:`vlp.data.sampling`)."""
        return self.load(video_id, sample_indices(self.num_stored(video_id), num_frames, mode, rng))

    def _footer(self, uri: str, footer_bytes: int) -> tuple[storage.ParquetFooter, dict[int, str]]:
        """A shard's footer and the video of each row group (from its ``vlp.frames`` metadata), cached."""
        if uri in self._footers:
            self._footers.move_to_end(uri)
            return self._footers[uri]
        footer = storage.parquet_footer(uri, tail=footer_bytes or storage.FOOTER_GUESS)
        raw = (footer.metadata.metadata or {}).get(_META_KEY)
        videos = json.loads(raw)["videos"] if raw else []
        owners = {int(v["row_group"]): v["video_id"] for v in videos if "row_group" in v}
        self._footers[uri] = (footer, owners)
        while len(self._footers) > self._cache_footers:
            self._footers.popitem(last=False)
        return footer, owners

    def _shard_table(self, shard: str) -> tuple[pa.Table, dict[str, tuple[int, int]]]:
        if shard in self._cache:
            self._cache.move_to_end(shard)
            return self._cache[shard]
        table = storage.read_parquet(storage.join(self.out, shard))
        ids = table.column("video_id").to_pylist()
        spans: dict[str, tuple[int, int]] = {}
        for vid, group in itertools.groupby(range(len(ids)), key=ids.__getitem__):
            members = list(group)
            spans[vid] = (members[0], len(members))
        self._cache[shard] = (table, spans)
        while len(self._cache) > self._cache_shards:
            self._cache.popitem(last=False)
        return self._cache[shard]


def load_video_frames(out: str, video_id: str) -> np.ndarray:
    """All stored frames of one video -> ``(k, H, W, 3)`` uint8 RGB.

    Opens the index on every call; use :class:`FrameStore` when reading many videos.
    """
    return FrameStore(out, cache_shards=1).load(video_id)


__all__ = [
    "FRAME_SCHEMA",
    "INDEX",
    "INDEX_SCHEMA",
    "CorruptClipError",
    "FrameStore",
    "FramesConfig",
    "decode_frames",
    "encode_frame",
    "extract",
    "load_video_frames",
    "packet_plan",
    "read_sparse",
    "stored_indices",
]
