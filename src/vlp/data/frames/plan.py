"""Planning extract-frames: its settings, the videos grouped into content-named shards, the frames to store."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from vlp import storage
from vlp.data import manifest
from vlp.data.frames.layout import FORMAT_VERSION, SHARDS_DIR
from vlp.data.sampling import sample_indices
from vlp.ranges import COUNT, OFF, at_least, ranged, within


@dataclass
class FramesConfig:
    """Settings of ``vlp extract-frames``."""

    num_frames: int = ranged(16, COUNT)  # frames stored per clip, chosen with the "uniform" rule (all frames if fewer)
    size: int = ranged(224, at_least(8))  # output frames are size x size pixels
    resize: Literal["stretch", "short_side_crop"] = "stretch"  # stretch = ALPRO; or short side + centre crop
    jpeg_quality: int = ranged(90, within(1, 95))  # PIL JPEG quality, 1..95
    videos_per_shard: int = ranged(64, COUNT)  # videos per Parquet shard (the unit of skipping on re-runs)
    workers: int = ranged(2, at_least(0, " (0 = one per CPU core)"))  # decoding processes; 0 = one per CPU core
    decoder: Literal["sparse", "decord", "pyav"] = "sparse"  # first decoder tried; see the module docstring
    progress: bool = True  # tqdm progress bar over videos (shown on a terminal only)
    # reject a clip whose header declares larger frames, before decoding (0 = off)
    max_pixels: int = ranged(8192 * 4320, at_least(0, OFF))
    max_bytes: int = ranged(4 << 30, at_least(0, OFF))  # reject a larger file before decoding it (0 = off)
    # decode time per file; a hung or crashing decoder is a reject (workers >= 2; 0 = off)
    timeout_s: float = ranged(300.0, at_least(0, OFF))


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
