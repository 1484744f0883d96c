"""Ingest: validate a dataset into the manifest schema, probing every video; bad inputs become rejects.

Sources (``IngestConfig.format``; ``auto`` picks one from the source URI):

- ``synth``: a directory (local or ``s3://``) already in the raw manifest schema, as ``vlp data synth``
  writes it: ``videos.parquet`` (RAW_VIDEO_SCHEMA, paths relative to the directory or absolute),
  ``captions.parquet`` and/or ``qa.parquet``, optional ``boxes.parquet``. Auto: a directory with
  ``videos.parquet``.
- ``alpro`` (``*.jsonl``): ALPRO annotations, one JSON object per line: retrieval
  ``{"caption", "clip_name"}`` or QA ``{"question", "answer", "video_id", "answer_type"}``.
  Videos are ``<video_root>/<id><video_ext>``.
- ``lavis`` (``*.json``): a list of ``{"video": "<file>", "caption": str | [str, ...]}`` (retrieval)
  or ``{"video", "question", "answer"}`` (QA). The video id is the path without its extension (``clips/a`` for
  ``clips/a.mp4``).
- ``msrvtt`` (``*.json`` whose first record has ``video_id``): a list of ``{"video_id", "video",
  "caption"}`` (``video`` optional, ``caption`` a string or a list), or the official
  ``{"videos": [...], "sentences": [...]}`` file.
- ``webvid`` (``*.csv``): columns ``videoid,contentUrl,duration,page_dir,name``; videos are
  ``<video_root>/<page_dir>/<videoid><video_ext>`` (``<videoid><video_ext>`` when ``page_dir`` is empty).

Rules. Every input record ends up either in the output tables or in ``rejects.parquet`` with a
reason ``"<category>: <detail>"``, and ``input == accepted + rejected`` is asserted for videos,
captions and QA. Annotation files are read as bytes and decoded record by record, so one line
that is not UTF-8 or not JSON rejects that record only. A caption/QA is rejected when its text is
empty or not UTF-8, longer than its ``max_*_chars`` limit (a caption: more than ``max_caption_words``
words, unless ``caption_clean`` truncates it), past ``max_captions_per_video`` valid captions of its
video, when its video is unknown, or (``"video rejected: ..."``) when its video is. A video is rejected
when its path is unusable or leaves its root, when its id is given to two different files (every row
of the id, each reason naming another file: whose clip would the captions describe?), when it repeats
an earlier row's id and file (a raw table), when its row is inconsistent (split, media), when it has
no valid caption or QA left (``require_text``; such a clip is useless for training, and the check runs
before probing to save the decode), when the probe fails (a still image under a video name included),
or when its duration is outside the configured limits. Annotation formats list one video per distinct
id and file (many records per video are normal there); the first record's split wins.

Fan-out: probing is the step's cost, so on a cluster pod ``i`` of ``n`` probes the contiguous run of the files to
probe that :func:`vlp.data.manifest.part_range` gives it (:func:`probe_part`, into ``probes.parquet``), and
:func:`ingest` with ``probes=`` those parts takes every probe result from them instead of probing. Reading and
validating the annotations is repeated in every pod (cheap next to decoding), so the merged output is
byte-identical to one pod's.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import logging
import os
import posixpath
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from vlp import storage
from vlp.data import manifest, video

log = logging.getLogger(__package__)  # "vlp.data.ingest": the name its records had before the package

FORMATS = ("synth", "alpro", "lavis", "webvid", "msrvtt")
STAGE = "ingest"
NO_TEXT = "no valid caption or QA"
KINDS = ("video", "caption", "qa")  # reject kinds, in the order rejects.parquet lists them
KINDS_SUMMARY = ("videos", "captions", "qa")  # the matching summary keys
_SPLIT_ALIASES = {"training": "train", "valid": "val", "validate": "val", "validation": "val", "dev": "val"}
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


# --------------------------------------------------------------------------- entry point


def ingest(source: str, out: str, cfg: IngestConfig, probes: Sequence[str] = ()) -> dict[str, Any]:
    """Validate and probe dataset ``source`` into the manifest tables under ``out``.

    Args:
        source: a raw dataset directory (``synth``) or an annotation file; local path or ``s3://``.
        out: output dataset directory or ``s3://`` prefix.
        cfg: the ``ingest`` config section.
        probes: the outputs of every :func:`probe_part` of this source and config: their results replace
            probing (a merge); empty = probe here.

    Returns:
        The summary: ``{"format", "videos"|"captions"|"qa": {"input", "accepted", "rejected"},
        "reject_reasons": {category: count}}``.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        ValueError: bad config, undetectable format, or an annotation file that cannot be read at all
            (``manifest.ManifestError`` for a raw directory whose tables lack columns).
    """
    source, out = _checked(source, cfg), _absolute(out)
    if source == out and storage.exists(storage.join(source, manifest.VIDEOS)):
        raise ValueError(f"ingest would overwrite its source {source}: pass a different --out")
    raw = _read(source, cfg)
    winners, survivors = _prevalidate(raw, cfg)
    uris = [r["path"] for r in survivors]
    _finish_validation(raw, winners, survivors, _probed_by(probes, uris, cfg) if probes else _probe_all(uris, cfg), cfg)
    rejects = _reject_rows(raw)
    tables = _tables(raw)
    summary = _summary(raw, tables, rejects)
    if probes:
        summary["probe_parts"] = len(probes)
    _write(out, tables, rejects, raw.boxes, raw.root)
    log.info("ingest: %s", json.dumps({k: summary[k] for k in KINDS_SUMMARY}))
    accepted = summary["videos"]["accepted"]
    if accepted == 0:
        why = Counter(r["reason"].split(":", 1)[0] for r in rejects if r["kind"] == "video")
        reasons = ", ".join(f"{k} x{n}" for k, n in sorted(why.items())) or "the source lists none"
        summary["warnings"] = [f"no video accepted from {source} ({reasons}); see {out}/{manifest.REJECTS}"]
        log.warning("ingest: %s", summary["warnings"][0])
    if accepted < cfg.min_videos:
        raise ValueError(
            f"ingest accepted {accepted} video(s) from {source}, fewer than ingest.min_videos={cfg.min_videos}; "
            f"the reasons are in {out}/{manifest.REJECTS}"
        )
    return summary


def _checked(source: str, cfg: IngestConfig) -> str:
    """``source`` as an absolute URI, once ``cfg`` is valid and ``source`` exists."""
    _check_config(cfg)
    source = _absolute(source)
    if not storage.exists(source):
        raise FileNotFoundError(f"ingest source {source} does not exist")
    return source


def _read(source: str, cfg: IngestConfig) -> _Raw:
    """The records of ``source`` in the format ``cfg`` names or ``auto`` detects."""
    fmt, data = _detect(source) if cfg.format == "auto" else (cfg.format, None)
    log.info("ingest: reading %s as %s", source, fmt)
    return _read_json(source, cfg, fmt, data) if fmt in ("lavis", "msrvtt") else _READERS[fmt](source, cfg)


def detect_format(source: str) -> str:
    """The format ``auto`` resolves to for ``source`` (reads a ``.json`` file to tell lavis from msrvtt)."""
    return _detect(source)[0]


def _detect(source: str) -> tuple[str, Any]:
    """``(format, parsed JSON)``; the JSON (``None`` for other formats) is kept so it is read only once."""
    if storage.exists(storage.join(source, manifest.VIDEOS)):
        return "synth", None
    lower = source.lower()
    if lower.endswith(".jsonl"):
        return "alpro", None
    if lower.endswith(".csv"):
        return "webvid", None
    if lower.endswith(".json"):
        data = _load_json(source)
        return _json_flavour(data, source), data
    raise ValueError(
        f"cannot detect the format of {source}: expected a directory with {manifest.VIDEOS} or a "
        f".jsonl/.json/.csv annotation file; pass --format (one of {', '.join(FORMATS)})"
    )


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


def _inside(root: str, path: str) -> tuple[str, str | None]:
    """``(URI, None)`` for a path inside ``root``; ``(path as given, reason)`` for one that escapes (never opened)."""
    try:
        return manifest.resolve_inside(root, path), None
    except manifest.BadPathError as exc:  # outside the root, or a name the OS or the store refuses
        return _safe(path), str(exc)


def _absolute(uri: str) -> str:
    return uri.rstrip("/") if storage.is_s3(uri) else os.path.abspath(uri)


# --------------------------------------------------------------------------- readers: raw schema directory


def _read_synth(source: str, cfg: IngestConfig) -> _Raw:
    raw = _Raw("synth", source, root=source)
    videos = manifest.read(source, manifest.VIDEOS, manifest.RAW_VIDEO_SCHEMA).to_pylist()
    for row in videos:
        row["_reject"] = None
        if row["path"]:
            row["path"], row["_reject"] = _inside(source, row["path"])
    raw.videos = videos
    captions = _read_text_table(source, manifest.CAPTIONS, manifest.CAPTION_SCHEMA)
    qa = _read_text_table(source, manifest.QA, manifest.QA_SCHEMA)
    if captions is None and qa is None:
        raise manifest.ManifestError(f"{source} has neither {manifest.CAPTIONS} nor {manifest.QA}")
    raw.captions, raw.qa = captions or [], qa or []
    if storage.exists(storage.join(source, manifest.BOXES)):
        raw.boxes = manifest.read(source, manifest.BOXES, manifest.BOX_SCHEMA)
    raw.inputs.update(video=len(raw.videos), caption=len(raw.captions), qa=len(raw.qa))
    return raw


def _read_text_table(source: str, name: str, schema: pa.Schema) -> list[dict[str, Any]] | None:
    """Rows of an optional text table, decoded value by value so one bad string rejects one row."""
    uri = storage.join(source, name)
    if not storage.exists(uri):
        return None
    table = storage.read_parquet(uri)
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise manifest.ManifestError(f"{uri}: missing column(s) {missing}; has {table.column_names}")
    columns = {f.name: _decoded(table.column(f.name), uri) for f in schema}
    return [dict(zip(columns, values, strict=True), _reject=None) for values in zip(*columns.values(), strict=True)]


def _decoded(column: pa.ChunkedArray, uri: str) -> list[str | None]:
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        values = column.cast(pa.large_binary()).to_pylist()  # zero-copy; no UTF-8 validation yet
        return [None if v is None else _decode(v) for v in values]
    try:
        return column.cast(pa.string()).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise manifest.ManifestError(f"{uri}: column of type {kind} cannot be read as text: {exc}") from exc


# --------------------------------------------------------------------------- readers: annotation files


class _Annotations:
    """Turns the records of an annotation file into video, caption and QA rows with stable ids."""

    def __init__(self, fmt: str, origin: str, cfg: IngestConfig) -> None:
        self.cfg = cfg
        self.root = _absolute(cfg.video_root) if cfg.video_root else _parent(origin)
        self.raw = _Raw(fmt, origin, root=self.root)
        self._videos: dict[str, dict[str, dict[str, Any]]] = {}  # video_id -> path -> row
        self._named: set[tuple[str, str | None]] = set()  # (video_id, path as given) already registered
        self._numbers: Counter[str] = Counter()

    def video(self, video_id: str, rel_path: str | None, split: Any) -> None:
        """Register a video once; later records of the same id and file only add text. A record that gives the
        id another file adds a second video row, and :func:`_check_videos` rejects both (whose clip would the
        captions describe?)."""
        if (video_id, rel_path) in self._named:  # the common case: another caption of a known clip
            return
        self._named.add((video_id, rel_path))
        path, problem = _inside(self.root, rel_path or f"{video_id}{self.cfg.video_ext}")
        known = self._videos.setdefault(video_id, {})
        if path in known:
            return
        media = "image" if video.is_image(path) else "video"
        row = {"video_id": video_id, "path": path, "split": self.split(split), "media": media, "source": self.raw.fmt}
        known[path] = row | {"_reject": problem}
        self.raw.videos.append(known[path])
        self.raw.inputs["video"] += 1

    def caption(self, video_id: str, text: Any, split: Any, where: str) -> None:
        if not self._known(video_id, "caption", where):
            return
        caption_id = f"{video_id}#{self._next(video_id)}"
        row = {"video_id": video_id, "caption_id": caption_id, "caption": _clean(text), "split": self.split(split)}
        self.raw.captions.append(row | {"_reject": None})
        self.raw.inputs["caption"] += 1

    def qa(self, video_id: str, question: Any, answer: Any, answer_type: Any, split: Any, where: str) -> None:
        if not self._known(video_id, "qa", where):
            return
        qa_id = f"{video_id}#q{self._next(video_id)}"
        if isinstance(answer, list):  # several annotators: keep the most common answer
            answer = Counter(map(_clean, answer)).most_common(1)[0][0] if answer else None
        row = {"video_id": video_id, "qa_id": qa_id, "question": _clean(question), "answer": _clean(answer)}
        row |= {"answer_type": _clean(answer_type) or "other", "split": self.split(split), "_reject": None}
        self.raw.qa.append(row)
        self.raw.inputs["qa"] += 1

    def reject(self, kind: str, where: str, reason: str) -> None:
        """A record that could not become a row (malformed, no id): counted as input and rejected."""
        self.raw.rejects.append(_reject_row(kind, where, self.raw.origin, reason))
        self.raw.inputs[kind] += 1

    def split(self, value: Any) -> str:
        text = _clean(value)
        if not text:
            if not self.cfg.split:
                raise ValueError(
                    f"{self.raw.origin} ({self.raw.fmt}) gives no split for its records: set ingest.split=train, "
                    "val or test for this file (e.g. the MSR-VTT 1k-A test file is all test), so that a test set "
                    "is never trained on"
                )
            return self.cfg.split
        return _SPLIT_ALIASES.get(text.lower(), text.lower())

    def _known(self, video_id: str, kind: str, where: str) -> bool:
        if video_id not in self._videos:
            self.reject(kind, where, f"unknown video_id: {_safe(video_id)!r} is not listed among the videos")
        return video_id in self._videos

    def _next(self, video_id: str) -> int:
        self._numbers[video_id] += 1
        return self._numbers[video_id] - 1


def _add_record(
    b: _Annotations, rec: Any, where: str, default_kind: str, id_keys: Sequence[str], path_key: str
) -> None:
    """One record of alpro/lavis/msrvtt: a caption (str or list) or a QA pair, plus its video."""
    if not isinstance(rec, dict):
        b.reject(default_kind, where, f"malformed record: expected a JSON object, got {type(rec).__name__}")
        return
    kind = "qa" if "question" in rec else "caption"
    if kind == "caption" and "caption" not in rec:
        b.reject(default_kind, where, "malformed record: no 'caption' or 'question' field")
        return
    rel_path = _clean(rec.get(path_key)) if path_key else None
    video_id = next((_clean(rec[k]) for k in id_keys if _clean(rec.get(k))), None) or _id_from_path(rel_path)
    if not video_id:
        fields = ", ".join(k for k in (*id_keys, path_key) if k)
        b.reject(kind, where, f"malformed record: no video id (fields {fields})")
        return
    if _bad_utf8(video_id) or (rel_path and _bad_utf8(rel_path)):
        b.reject(kind, where, "invalid UTF-8: the video id or path is not valid UTF-8")
        return
    b.video(video_id, rel_path, rec.get("split"))
    if kind == "qa":
        b.qa(video_id, rec["question"], rec.get("answer"), rec.get("answer_type"), rec.get("split"), where)
        return
    captions = rec["caption"] if isinstance(rec["caption"], list) else [rec["caption"]]
    for text in captions or [None]:  # an empty list is still one (empty) caption record
        b.caption(video_id, text, rec.get("split"), where)


def _read_alpro(source: str, cfg: IngestConfig) -> _Raw:
    b = _Annotations("alpro", source, cfg)
    records = list(_jsonl_records(storage.read_bytes(source)))
    is_qa = any(isinstance(r, dict) and "question" in r for _, r, _ in records)
    default_kind = "qa" if is_qa else "caption"
    for line, rec, error in records:
        if error:
            b.reject(default_kind, f"line {line}", f"malformed record: {error}")
        else:
            _add_record(b, rec, f"line {line}", default_kind, ("clip_name", "video_id"), "")
    return b.raw


def _read_json(source: str, cfg: IngestConfig, fmt: str, data: Any = None) -> _Raw:
    """Read a lavis/msrvtt file (``data``: its parsed JSON when the caller has it already)."""
    if data is None:
        data = _load_json(source)
    _json_flavour(data, source)  # raises on a shape that is neither lavis nor msrvtt
    b = _Annotations(fmt, source, cfg)
    if isinstance(data, dict):  # official MSRVTT: {"videos": [...], "sentences": [...]}
        video_split: dict[str, Any] = {}  # a sentence has no split of its own: it takes its video's
        for i, rec in enumerate(data["videos"]):
            vid = _clean(rec.get("video_id")) if isinstance(rec, dict) else None
            if vid and not _bad_utf8(vid):
                b.video(vid, _clean(rec.get("video")), rec.get("split"))
                video_split.setdefault(vid, rec.get("split"))
            else:
                b.reject("video", f"videos[{i}]", "malformed record: no valid 'video_id'")
        for i, rec in enumerate(data["sentences"]):
            if isinstance(rec, dict) and _clean(rec.get("video_id")):
                vid = _clean(rec["video_id"])
                b.caption(vid, rec.get("caption"), video_split.get(vid), f"sentences[{i}]")
            else:
                b.reject("caption", f"sentences[{i}]", "malformed record: no 'video_id'")
        return b.raw
    is_qa = any(isinstance(r, dict) and "question" in r for r in data)
    id_keys, path_key = (("video_id",), "video") if fmt == "msrvtt" else ((), "video")
    for i, rec in enumerate(data):
        _add_record(b, rec, f"record {i}", "qa" if is_qa else "caption", id_keys, path_key)
    return b.raw


def _read_webvid(source: str, cfg: IngestConfig) -> _Raw:
    b = _Annotations("webvid", source, cfg)
    reader = csv.DictReader(io.StringIO(_decode(storage.read_bytes(source)).lstrip("\ufeff"), newline=""))
    missing = {"videoid", "name"} - set(reader.fieldnames or [])
    if missing:
        raise ValueError(
            f"{source}: WebVid csv needs columns videoid,name (has {reader.fieldnames}); missing {missing}"
        )
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            b.reject("caption", f"line {reader.line_num}", f"malformed record: {exc}")
            continue
        where = f"line {reader.line_num}"
        vid, page_dir = _clean(row.get("videoid")), _clean(row.get("page_dir"))
        if not vid or _bad_utf8(vid) or (page_dir and _bad_utf8(page_dir)):
            b.reject("caption", where, "malformed record: no valid 'videoid'")
            continue
        b.video(vid, f"{page_dir}/{vid}{cfg.video_ext}" if page_dir else None, row.get("split"))
        b.caption(vid, row.get("name"), row.get("split"), where)
    return b.raw


_READERS: dict[str, Callable[[str, IngestConfig], _Raw]] = {
    "synth": _read_synth,
    "alpro": _read_alpro,
    "webvid": _read_webvid,
}  # lavis and msrvtt: _read_json


def _jsonl_records(data: bytes) -> Iterator[tuple[int, Any, str]]:
    """``(line number, record, "")`` per non-blank line, or ``(line, None, error)`` when it is not JSON."""
    for number, line in enumerate(data.split(b"\n"), 1):
        text = _decode(line).strip().lstrip("\ufeff")
        if not text:
            continue
        try:
            yield number, json.loads(text), ""
        except json.JSONDecodeError as exc:
            yield number, None, f"not JSON: {exc}"


def _load_json(source: str) -> Any:
    try:
        return json.loads(_decode(storage.read_bytes(source)).lstrip("\ufeff"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source} is not a JSON file: {exc}; (one record per line? use a .jsonl name)") from exc


def _json_flavour(data: Any, source: str) -> str:
    if isinstance(data, dict) and isinstance(data.get("videos"), list) and isinstance(data.get("sentences"), list):
        return "msrvtt"
    if not isinstance(data, list):
        raise ValueError(f"{source}: expected a JSON list of records (LAVIS/MSRVTT), got {type(data).__name__}")
    first = next((r for r in data if isinstance(r, dict)), {})
    return "msrvtt" if "video_id" in first else "lavis"


# --------------------------------------------------------------------------- validation


def probe_part(source: str, out: str, cfg: IngestConfig, index: int, count: int) -> dict[str, Any]:
    """Part ``index`` of ``count`` of ingest's probing: read and validate ``source`` as :func:`ingest` does, probe
    the files :func:`vlp.data.manifest.part_range` gives this part, and write the results to
    ``out/probes.parquet``. A part whose file already holds the results for the same files and settings is
    skipped (a rerun).

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


def _prevalidate(raw: _Raw, cfg: IngestConfig) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Fill ``_reject`` from the checks that need no probe, cheapest first; returns the winning row of every
    video id and the rows left to probe."""
    winners = _check_videos(raw.videos)
    _check_texts(raw.captions, winners, "caption_id", manifest.CAPTION_SCHEMA)
    _check_texts(raw.qa, winners, "qa_id", manifest.QA_SCHEMA)
    _check_sizes(raw.captions, raw.qa, cfg)
    if cfg.require_text:
        with_text = {r["video_id"] for r in raw.captions + raw.qa if r["_reject"] is None}
        for vid, row in winners.items():
            if row["_reject"] is None and vid not in with_text:
                row["_reject"] = NO_TEXT
    return winners, [row for row in raw.videos if row["_reject"] is None]


def _finish_validation(
    raw: _Raw,
    winners: dict[str, dict[str, Any]],
    survivors: list[dict[str, Any]],
    probed: list[ProbeResult],
    cfg: IngestConfig,
) -> None:
    """Apply the probe results of ``survivors``: rejects, measurements, and the texts of rejected videos."""
    for row, (info, reason) in zip(survivors, probed, strict=True):
        row["_reject"] = reason or _duration_problem(row["media"], info, cfg)
        row.update(info or {})
    for row in raw.captions + raw.qa:
        owner = winners.get(row["video_id"])
        if row["_reject"] is None and owner is not None and owner["_reject"]:
            row["_reject"] = f"video rejected: {owner['_reject']}"


def _check_videos(videos: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Row problems and duplicates; returns ``video_id -> first row`` (whose verdict the id's texts follow).

    An id given to two different files is ambiguous: every row of it is rejected, each reason naming another
    file of the id, so its captions are rejected too. A row that repeats the id and the file of an earlier row
    (a raw ``videos.parquet`` listing a clip twice) is rejected as a duplicate and the first row stands.
    """
    winners: dict[str, dict[str, Any]] = {}
    first_row: dict[str, int] = {}
    files: dict[str, list[str]] = {}
    for row in videos:
        if row["video_id"] and row["path"] not in files.setdefault(row["video_id"], []):
            files[row["video_id"]].append(row["path"])
    for i, row in enumerate(videos):
        vid = row["video_id"]
        others = [f for f in files.get(vid, []) if f != row["path"]]
        if others:  # overrides a reader's reject too: the conflict is what the texts must learn of
            row["_reject"] = f"duplicate video_id: {manifest.quoted(vid)} also names {manifest.quoted(others[0])}" + (
                f" and {len(others) - 1} other file(s)" if len(others) > 1 else ""
            )
        if row["_reject"]:  # rejected by its reader (a path outside the root) or ambiguous: its texts follow it
            if vid and vid not in winners:
                winners[vid], first_row[vid] = row, i
            continue
        if not vid:
            row["_reject"] = "malformed record: empty video_id"
        elif vid in winners:
            row["_reject"] = f"duplicate video_id: the same file as row {first_row[vid]}"
        else:
            winners[vid], first_row[vid] = row, i
            row["_reject"] = _video_row_problem(row)
    return winners


def _video_row_problem(row: dict[str, Any]) -> str | None:
    path, media, split = row["path"], row["media"], row["split"]
    name = posixpath.basename(path)
    if not path:
        return "malformed record: empty path"
    if split not in manifest.SPLITS:
        return f"unknown split: {_safe(split)!r} (expected one of {', '.join(manifest.SPLITS)})"
    if media not in manifest.MEDIA:
        return f"unknown media: {_safe(media)!r} (expected one of {', '.join(manifest.MEDIA)})"
    if media == "image" and not video.is_image(path):
        return f"media mismatch: media is 'image' but {name} has no image suffix {video.IMAGE_SUFFIXES}"
    if media == "video" and video.is_image(path):
        return f"media mismatch: media is 'video' but {name} is an image file"
    return None


def _check_texts(rows: list[dict[str, Any]], winners: dict[str, Any], id_field: str, schema: pa.Schema) -> None:
    seen: set[str] = set()
    text_fields = [n for n in ("caption", "question", "answer") if n in schema.names]
    for row in rows:
        bad = [n for n in schema.names if isinstance(row[n], str) and _bad_utf8(row[n])]
        empty = [n for n in [id_field, "video_id", *text_fields] if not (row[n] or "").strip()]
        if bad:
            row["_reject"] = f"invalid UTF-8: {', '.join(bad)} not valid UTF-8 text"
        elif empty:
            row["_reject"] = f"empty {empty[0]}" if empty[0] in text_fields else f"malformed record: empty {empty[0]}"
        elif row[id_field] in seen:
            row["_reject"] = f"duplicate {id_field}: {row[id_field]!r} appeared before"
        elif row["video_id"] not in winners:
            row["_reject"] = f"unknown video_id: {row['video_id']!r} is not in {manifest.VIDEOS}"
        elif row["split"] not in manifest.SPLITS:
            row["_reject"] = f"unknown split: {row['split']!r} (expected one of {', '.join(manifest.SPLITS)})"
        if not bad and row[id_field]:
            seen.add(row[id_field])


def _check_sizes(captions: list[dict[str, Any]], qa: list[dict[str, Any]], cfg: IngestConfig) -> None:
    """Text limits on the rows still accepted: characters per field, caption words (or ALBEF's cleaning), and
    captions per video (the first ``max_captions_per_video`` valid ones of a video, in input order, stay)."""
    limits = {"caption": cfg.max_caption_chars, "question": cfg.max_question_chars, "answer": cfg.max_answer_chars}
    for row in captions + qa:
        for name in ("caption", "question", "answer"):
            if row["_reject"] is None and name in row and limits[name] and len(row[name]) > limits[name]:
                size = f"{name} of {len(row[name])} characters"
                row["_reject"] = f"text too long: {size} > ingest.max_{name}_chars={limits[name]}"
    clean = None
    if cfg.caption_clean:
        from vlp.data.video_text import clean_caption as clean
    per_video: Counter[str] = Counter()
    for row in captions:
        if row["_reject"] is not None:
            continue
        words = len(row["caption"].split())
        if clean is not None:
            row["caption"] = clean(row["caption"], cfg.max_caption_words or 30)
            if not row["caption"]:
                row["_reject"] = "empty caption: nothing left after ingest.caption_clean"
                continue
        elif cfg.max_caption_words and words > cfg.max_caption_words:
            limit = cfg.max_caption_words
            row["_reject"] = f"text too long: caption of {words} words > ingest.max_caption_words={limit}"
            continue
        per_video[row["video_id"]] += 1
        if cfg.max_captions_per_video and per_video[row["video_id"]] > cfg.max_captions_per_video:
            row["_reject"] = (
                f"too many captions: {manifest.quoted(row['video_id'])} has more than "
                f"ingest.max_captions_per_video={cfg.max_captions_per_video}"
            )


def _duration_problem(media: str, info: dict[str, Any] | None, cfg: IngestConfig) -> str | None:
    if info is None or media != "video":
        return None
    duration = info["duration_s"]
    if duration < cfg.min_duration_s:
        return f"too short: {duration:.3f} s < ingest.min_duration_s={cfg.min_duration_s}"
    if cfg.max_duration_s and duration > cfg.max_duration_s:
        return f"too long: {duration:.3f} s > ingest.max_duration_s={cfg.max_duration_s}"
    return None


# --------------------------------------------------------------------------- probing


def _probe_one(uri: str, limits: video.DecodeLimits = _NO_LIMITS) -> tuple[dict[str, Any] | None, str]:
    """Probe one video/image URI (runs in a worker): ``(measurements, "")`` or ``(None, reason)``.

    The file's size and declared frame size and duration are checked against ``limits`` first, so a
    file too large to decode safely is rejected without decoding (an S3 object without downloading).
    """
    try:
        if storage.is_s3(uri) and limits.max_bytes and (size := storage.size(uri)) > limits.max_bytes:
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
    from vlp.data.isolate import isolated_map

    def failed(item: Any, reason: str) -> tuple[None, str]:
        if reason.startswith("crashed"):
            return None, f"probe crashed: the decoder killed its worker process ({reason})"
        return None, f"probe {reason}: a hanging decoder (ingest.timeout_s)"

    results = []
    for result in isolated_map(fn, items, workers=workers, timeout_s=timeout_s, on_failure=failed, window=_WINDOW):
        results.append(result)
        tick()
    return results


# --------------------------------------------------------------------------- outputs


def _reject_row(kind: str, record_id: str, path: str, reason: str) -> dict[str, str]:
    return {"stage": STAGE, "kind": kind, "record_id": _safe(record_id), "path": _safe(path), "reason": _safe(reason)}


def _reject_rows(raw: _Raw) -> list[dict[str, str]]:
    """Rejected videos, captions, QA (input order within each kind), then records that never became rows."""
    first_path = {}
    for row in raw.videos:
        first_path.setdefault(row["video_id"], row["path"])
    rows = [_reject_row("video", v["video_id"] or "", v["path"], v["_reject"]) for v in raw.videos if v["_reject"]]
    for kind, items, id_field in (("caption", raw.captions, "caption_id"), ("qa", raw.qa, "qa_id")):
        for r in items:
            if r["_reject"]:
                path = first_path.get(r["video_id"], raw.origin)
                rows.append(_reject_row(kind, r[id_field] or "", path, r["_reject"]))
    rows.extend(raw.rejects)
    rows.sort(key=lambda r: KINDS.index(r["kind"]))  # stable: keeps input order within a kind
    return rows


def _tables(raw: _Raw) -> dict[str, pa.Table]:
    def accepted(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
        return manifest.from_rows([{k: r[k] for k in schema.names} for r in rows if r["_reject"] is None], schema)

    return {
        manifest.VIDEOS: accepted(raw.videos, manifest.VIDEO_SCHEMA),
        manifest.CAPTIONS: accepted(raw.captions, manifest.CAPTION_SCHEMA),
        manifest.QA: accepted(raw.qa, manifest.QA_SCHEMA),
    }


def _summary(raw: _Raw, tables: dict[str, pa.Table], rejects: list[dict[str, str]]) -> dict[str, Any]:
    """Counts per kind; asserts that every record read is either written or rejected."""
    rejected = Counter(r["kind"] for r in rejects)
    summary: dict[str, Any] = {"format": raw.fmt, "source": raw.origin}
    for kind, key, name in zip(KINDS, KINDS_SUMMARY, (manifest.VIDEOS, manifest.CAPTIONS, manifest.QA), strict=True):
        counts = {"input": raw.inputs[kind], "accepted": tables[name].num_rows, "rejected": rejected[kind]}
        assert counts["input"] == counts["accepted"] + counts["rejected"], f"ingest lost {kind} records: {counts}"
        summary[key] = counts
    summary["reject_reasons"] = dict(sorted(Counter(r["reason"].split(":", 1)[0] for r in rejects).items()))
    return summary


def _write(
    out: str, tables: dict[str, pa.Table], rejects: list[dict[str, str]], boxes: pa.Table | None, root: str
) -> None:
    schemas = {manifest.VIDEOS: manifest.VIDEO_SCHEMA, manifest.CAPTIONS: manifest.CAPTION_SCHEMA}
    for name, table in tables.items():
        meta = {manifest.MEDIA_ROOT_KEY: root.encode()} if name == manifest.VIDEOS else None
        manifest.write(out, name, table, schemas.get(name, manifest.QA_SCHEMA), meta)
    if boxes is None:
        storage.delete(storage.join(out, manifest.BOXES))  # never leave a stale table from an earlier run
    else:
        keep = pc.is_in(boxes["video_id"], value_set=tables[manifest.VIDEOS]["video_id"].combine_chunks())
        manifest.write(out, manifest.BOXES, boxes.filter(keep), manifest.BOX_SCHEMA)
    manifest.write(out, manifest.REJECTS, manifest.from_rows(rejects, manifest.REJECT_SCHEMA), manifest.REJECT_SCHEMA)


# --------------------------------------------------------------------------- text helpers


def _decode(data: bytes) -> str:
    """UTF-8 that never fails: undecodable bytes become lone surrogates, found later by :func:`_bad_utf8`."""
    return data.decode("utf-8", errors="surrogateescape")


def _bad_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _safe(text: Any) -> str:
    """``text`` as writable UTF-8 (bad bytes shown as escapes), for reject rows."""
    return str(text).encode("utf-8", errors="backslashreplace").decode("utf-8")


def _clean(value: Any) -> str | None:
    """A record field as stripped text (numbers become text; None, lists and dicts stay None)."""
    if value is None or isinstance(value, (list, dict)):
        return None
    return str(value).strip()


def _id_from_path(path: str | None) -> str | None:
    if not path:
        return None
    if storage.is_s3(path) or path.startswith("/"):
        path = posixpath.basename(path)
    return posixpath.splitext(path)[0] or None


def _parent(uri: str) -> str:
    return uri.rsplit("/", 1)[0] if storage.is_s3(uri) else os.path.dirname(uri)
