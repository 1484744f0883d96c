"""What ingest's stages share: the config and its checks, the records a reader produces, the reject rows."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from vlp import storage
from vlp.data import manifest
from vlp.text import invalid_utf8

FORMATS = ("synth", "alpro", "lavis", "webvid", "msrvtt")
STAGE = "ingest"
NO_TEXT = "no valid caption or QA"
KINDS = ("video", "caption", "qa")  # reject kinds, in the order rejects.parquet lists them
KINDS_SUMMARY = ("videos", "captions", "qa")  # the matching summary keys
ProbeResult = tuple[dict[str, Any] | None, str]


@dataclass
class IngestConfig:
    """How ``vlp ingest`` reads, validates and probes a dataset."""

    format: Literal["auto", "synth", "alpro", "lavis", "webvid", "msrvtt"] = "auto"  # source layout; auto = detect
    video_root: str = ""  # where an annotation file's relative video paths live; "" = the file's directory
    split: Literal["", "train", "val", "test"] = ""  # split of records whose source names none; "" = an error
    min_videos: int = 0  # fail the step when fewer videos are accepted (0 = never; 0 accepted always warns)
    video_ext: str = ".mp4"  # appended to ids by formats that name videos by id (alpro, webvid, msrvtt)
    workers: int = 2  # probe processes; 0 or 1 probes in this process
    min_duration_s: float = 0.0  # reject clips shorter than this (still images are exempt)
    max_duration_s: float = 3600.0  # reject clips longer than this; 0 = no upper limit
    require_text: bool = True  # reject a video left without any valid caption or QA
    progress: bool = True  # tqdm progress bar on stderr while probing
    max_pixels: int = 8192 * 4320  # reject a clip whose header declares larger frames, before decoding (0 = off)
    max_bytes: int = 4 << 30  # reject a larger file, before downloading or decoding it (0 = off)
    timeout_s: float = 120.0  # probe time per file; a hung or crashing decoder is a reject (workers >= 2; 0 = off)
    max_caption_chars: int = 2000  # reject a longer caption (0 = off); DiDeMo paragraphs are ~100-600
    max_question_chars: int = 1000  # reject a longer question (0 = off)
    max_answer_chars: int = 200  # reject a longer answer (0 = off); open-ended QA answers are a few words
    max_caption_words: int = 0  # reject a caption of more words (0 = off); with caption_clean: truncate to it
    caption_clean: bool = False  # ALBEF's pre_caption at ingest: lower case, punctuation out, max_caption_words
    #   words kept (30 when 0, as ALBEF's code); the stored caption is the cleaned one
    max_captions_per_video: int = 100  # captions of a video past this many valid ones are rejects (0 = off)
    storage_retries: int = 3  # re-reads of a file the store failed to serve, then the step fails (never a reject)
    retry_wait_s: float = 2.0  # wait before the first re-read; doubled before each further one


@dataclass
class _Raw:
    """What a format reader produces. Rows carry a ``_reject`` reason (None = still accepted)."""

    fmt: str
    origin: str  # the source URI, named by rejects that have no video path
    root: str = ""  # every accepted video path lies inside it (recorded in videos.parquet for later steps)
    videos: list[dict[str, Any]] = field(default_factory=list)  # RAW_VIDEO_SCHEMA rows, path = URI
    captions: list[dict[str, Any]] = field(default_factory=list)  # CAPTION_SCHEMA rows
    qa: list[dict[str, Any]] = field(default_factory=list)  # QA_SCHEMA rows
    rejects: list[dict[str, str]] = field(default_factory=list)  # records that never became a row
    boxes: pa.Table | None = None
    inputs: Counter[str] = field(default_factory=Counter)  # records read, per kind


def _checked(source: str, cfg: IngestConfig) -> str:
    """``source`` as an absolute URI, once ``cfg`` is valid and ``source`` exists."""
    _check_config(cfg)
    source = _absolute(source)
    if not storage.exists(source):
        raise FileNotFoundError(f"ingest source {source} does not exist")
    return source


def _check_config(cfg: IngestConfig) -> None:
    if cfg.format not in ("auto", *FORMATS):
        raise ValueError(f"ingest.format={cfg.format!r} is not one of auto, {', '.join(FORMATS)}")
    if cfg.split and cfg.split not in manifest.SPLITS:
        raise ValueError(f"ingest.split={cfg.split!r} is not one of {', '.join(manifest.SPLITS)} (or '' = unset)")
    numbers = (
        "min_videos",
        "storage_retries",
        "retry_wait_s",
        "max_pixels",
        "max_bytes",
        "timeout_s",
        "max_caption_chars",
        "max_question_chars",
        "max_answer_chars",
        "max_caption_words",
        "max_captions_per_video",
    )
    if any(getattr(cfg, name) < 0 for name in numbers):
        raise ValueError(f"ingest.{', ingest.'.join(numbers)} must be >= 0")
    if cfg.workers < 0:
        raise ValueError(f"ingest.workers={cfg.workers} must be >= 0 (0 or 1 = probe in this process)")
    if cfg.min_duration_s < 0 or cfg.max_duration_s < 0:
        raise ValueError("ingest.min_duration_s and ingest.max_duration_s must be >= 0")
    if cfg.max_duration_s and cfg.max_duration_s < cfg.min_duration_s:
        raise ValueError(f"ingest.max_duration_s={cfg.max_duration_s} is below min_duration_s={cfg.min_duration_s}")
    if cfg.video_ext and not cfg.video_ext.startswith("."):
        raise ValueError(f"ingest.video_ext={cfg.video_ext!r} must start with a dot, e.g. '.mp4'")


def _absolute(uri: str) -> str:
    return storage.absolute(uri)


def _reject_row(kind: str, record_id: str, path: str, reason: str) -> dict[str, str]:
    return {"stage": STAGE, "kind": kind, "record_id": _safe(record_id), "path": _safe(path), "reason": _safe(reason)}


def _bad_utf8(text: str) -> bool:
    """Whether ``text`` holds bytes that were not UTF-8 (lone surrogates): the text gate's test
    (:func:`vlp.text.invalid_utf8`)."""
    return invalid_utf8(text) is not None


def _safe(text: Any) -> str:
    """``text`` as writable UTF-8 (bad bytes shown as escapes), for reject rows."""
    return str(text).encode("utf-8", errors="backslashreplace").decode("utf-8")
