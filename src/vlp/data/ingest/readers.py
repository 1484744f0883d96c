"""The format readers: a source (raw directory or annotation file) -> video, caption and QA records.

What each format looks like, and how ``auto`` tells them apart, is in :mod:`vlp.data.ingest`.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import posixpath
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from vlp import storage
from vlp.data import manifest, video
from vlp.data.ingest.records import FORMATS, IngestConfig, _absolute, _bad_utf8, _Raw, _reject_row, _safe

log = logging.getLogger(__package__)  # "vlp.data.ingest": the name its records had before the package

_SPLIT_ALIASES = {"training": "train", "valid": "val", "validate": "val", "validation": "val", "dev": "val"}


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


def _inside(root: str, path: str) -> tuple[str, str | None]:
    """``(URI, None)`` for a path inside ``root``; ``(path as given, reason)`` for one that escapes (never opened)."""
    try:
        return manifest.resolve_inside(root, path), None
    except manifest.BadPathError as exc:  # outside the root, or a name the OS or the store refuses
        return _safe(path), str(exc)


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
        id another file adds a second video row, and :func:`~vlp.data.ingest.validate._check_videos` rejects both
        (whose clip would the captions describe?)."""
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
            if isinstance(rec, dict) and (vid := _clean(rec.get("video_id"))):
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


# --------------------------------------------------------------------------- text helpers


def _decode(data: bytes) -> str:
    """UTF-8 that never fails: undecodable bytes become lone surrogates, found later by :func:`_bad_utf8`."""
    return data.decode("utf-8", errors="surrogateescape")


def _clean(value: Any) -> str | None:
    """A record field as stripped text (numbers become text; None, lists and dicts stay None)."""
    if value is None or isinstance(value, (list, dict)):
        return None
    return str(value).strip()


def _id_from_path(path: str | None) -> str | None:
    if not path:
        return None
    if storage.is_absolute(path):
        path = posixpath.basename(path)
    return posixpath.splitext(path)[0] or None


def _parent(uri: str) -> str:
    return storage.parent(uri)
