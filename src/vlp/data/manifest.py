"""The project's manifest schema: the contract between the data steps.

A *dataset directory* (local path or ``s3://`` prefix) holds Parquet tables named below, next
to (or pointing at) the media. Every step reads and writes these tables through
:mod:`vlp.storage`, and validates them with :func:`check_schema` so a wrong column fails at
the boundary with a clear message instead of deep inside a later step.

Tables
------
``videos.parquet``   one row per clip or still image
``captions.parquet`` one row per caption (several per video)
``qa.parquet``       one row per question/answer pair
``boxes.parquet``    ground truth (synthetic world only): one row per entity per frame
``rejects.parquet``  one row per rejected input record, with the reason

``path`` in ``videos`` is either absolute (``/...``, ``s3://...``) or relative to the dataset
directory; :func:`resolve` turns it into a URI. Ingest records the root those paths lie inside in the
table's metadata (:func:`media_root`), and every step that opens them checks them against it again
(:func:`resolve_inside`): a path changed after ingest (by a script, a merge of tables, a careless edit) cannot
make a step read elsewhere. The record lives in the same file, so this does not stop someone who rewrites the
file's metadata too: the dataset's storage permissions do.
"""

from __future__ import annotations

import unicodedata

import pyarrow as pa

from vlp import storage

VIDEOS = "videos.parquet"
CAPTIONS = "captions.parquet"
QA = "qa.parquet"
BOXES = "boxes.parquet"
REJECTS = "rejects.parquet"
SUMMARY = "summary.json"

SPLITS = ("train", "val", "test")
MEDIA = ("video", "image")
ANSWER_TYPES = ("color", "shape", "direction", "count", "scene")

# Raw (un-probed) videos: what the synthetic world and the importers produce.
RAW_VIDEO_SCHEMA = pa.schema(
    [
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("media", pa.string(), nullable=False),  # "video" | "image"
        pa.field("source", pa.string(), nullable=False),  # "synth" | "alpro" | "lavis" | "webvid" | "msrvtt"
    ]
)

# Ingested videos: raw columns + what the probe measured.
VIDEO_SCHEMA = pa.schema(
    [
        *RAW_VIDEO_SCHEMA,
        pa.field("num_frames", pa.int64(), nullable=False),  # 1 for still images
        pa.field("fps", pa.float64(), nullable=False),  # 0.0 for still images
        pa.field("duration_s", pa.float64(), nullable=False),  # 0.0 for still images
        pa.field("width", pa.int64(), nullable=False),
        pa.field("height", pa.int64(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=False),
    ]
)

CAPTION_SCHEMA = pa.schema(
    [
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("caption_id", pa.string(), nullable=False),
        pa.field("caption", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
    ]
)

QA_SCHEMA = pa.schema(
    [
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("qa_id", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("answer", pa.string(), nullable=False),
        pa.field("answer_type", pa.string(), nullable=False),  # synth: ANSWER_TYPES; imports: as given, else "other"
        pa.field("split", pa.string(), nullable=False),
    ]
)

# Boxes are normalised to [0, 1] image coordinates, (x0, y0) top-left, (x1, y1) bottom-right.
BOX_SCHEMA = pa.schema(
    [
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("frame_index", pa.int64(), nullable=False),
        pa.field("entity_id", pa.int64(), nullable=False),  # index of the object within the clip
        pa.field("name", pa.string(), nullable=False),  # noun phrase, e.g. "red circle"
        pa.field("shape", pa.string(), nullable=False),
        pa.field("color", pa.string(), nullable=False),
        pa.field("size", pa.string(), nullable=False),
        pa.field("x0", pa.float32(), nullable=False),
        pa.field("y0", pa.float32(), nullable=False),
        pa.field("x1", pa.float32(), nullable=False),
        pa.field("y1", pa.float32(), nullable=False),
    ]
)

REJECT_SCHEMA = pa.schema(
    [
        pa.field("stage", pa.string(), nullable=False),  # "ingest" | "extract_frames" | ...
        pa.field("kind", pa.string(), nullable=False),  # "video" | "caption" | "qa"
        pa.field("record_id", pa.string(), nullable=False),  # video_id / caption_id / qa_id / line number
        pa.field("path", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
    ]
)


class ManifestError(ValueError):
    """A manifest table is missing or does not have the expected columns."""


def check_schema(table: pa.Table, schema: pa.Schema, name: str) -> pa.Table:
    """Return ``table`` cast to ``schema`` (column order too), or raise naming what is wrong."""
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise ManifestError(f"{name}: missing column(s) {missing}; has {table.column_names}")
    table = table.select(schema.names)
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
        raise ManifestError(f"{name}: columns do not match the expected schema: {exc}") from exc


def read(dataset: str, name: str, schema: pa.Schema) -> pa.Table:
    """Read and validate table ``name`` of dataset directory ``dataset`` (its key-value metadata kept)."""
    uri = storage.join(dataset, name)
    if not storage.exists(uri):
        raise ManifestError(f"{uri} does not exist: is {dataset!r} a dataset directory?")
    table = storage.read_parquet(uri)
    return check_schema(table, schema, uri).replace_schema_metadata(table.schema.metadata)


def write(
    dataset: str, name: str, table: pa.Table, schema: pa.Schema, metadata: dict[bytes, bytes] | None = None
) -> str:
    """Validate and atomically write table ``name`` into ``dataset`` (with Parquet key-value ``metadata``);
    returns its URI."""
    uri = storage.join(dataset, name)
    table = check_schema(table, schema, uri)
    storage.write_parquet(uri, table.replace_schema_metadata(metadata) if metadata else table)
    return uri


MEDIA_ROOT_KEY = b"vlp.media_root"  # videos.parquet metadata: the root every path of the table lies inside


def media_root(videos: pa.Table) -> str | None:
    """The root that ingest resolved the paths of ``videos`` (a :func:`read` ``videos.parquet``) inside, or None
    for a table that records none (one written by hand, or by a vlp older than the record)."""
    root = (videos.schema.metadata or {}).get(MEDIA_ROOT_KEY)
    return root.decode() if root else None


def empty(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


def from_rows(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """Build a table from row dicts (an empty list gives an empty table of ``schema``)."""
    return pa.Table.from_pylist(rows, schema=schema)


def resolve(dataset: str, path: str) -> str:
    """URI of a ``videos.path`` value: absolute paths and URIs as they are, else under ``dataset``."""
    if storage.is_absolute(path):
        return path
    return storage.join(dataset, path)


class BadPathError(ValueError):
    """A path read from a file (annotations, a manifest, ``model.json``) cannot be used as it is."""


class PathEscapeError(BadPathError):
    """A path read from a file points outside its root."""


class UnusablePathError(BadPathError):
    """A path read from a file is one the operating system or the object store refuses, or a hostile name."""


MAX_PATH_BYTES = 1024  # an S3 key's limit, and well within a local path's (PATH_MAX 4096)
MAX_NAME_BYTES = 255  # one local path component (NAME_MAX)


def path_problem(path: str) -> str | None:
    """Why ``path`` (a path or URI read from a file) cannot be used, or None.

    Refused: a NUL byte (every OS call raises on it), other control characters and line separators (C0, DEL,
    C1, U+2028/2029: a line break in a name forges log lines and breaks line-based tools), text that is not valid
    UTF-8, more than :data:`MAX_PATH_BYTES` bytes in all or :data:`MAX_NAME_BYTES` in one component.
    """
    if not isinstance(path, str):
        return f"is a {type(path).__name__}, not text"
    if "\x00" in path:
        return "contains a NUL byte"
    control = next((c for c in path if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
    if control is not None:
        return f"contains the control character {control!r}"
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if len(encoded) > MAX_PATH_BYTES:
        return f"is {len(encoded)} bytes long (at most {MAX_PATH_BYTES})"
    longest = max((len(part.encode()) for part in path.split("/")), default=0)
    if longest > MAX_NAME_BYTES:
        return f"has a component of {longest} bytes (at most {MAX_NAME_BYTES})"
    return None


def quoted(text: str, limit: int = 160) -> str:
    """``text`` quoted (``repr``) for an error or a reject reason, cut to ``limit`` characters."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


def resolve_inside(root: str, path: str) -> str:
    """:func:`resolve` ``path`` against ``root``, and insist that the result lies inside ``root``.

    The path must first be usable (:func:`path_problem`). Local paths are compared after resolving ``..``
    and symbolic links (``os.path.realpath``), so neither ``../x``, an absolute path elsewhere nor a link
    out of the root gets through; ``s3://`` keys must sit under ``root``'s bucket and prefix and may not
    contain a ``..`` segment (harmless to S3, but it would climb out of a local directory once the key
    becomes a file name). Nothing is opened.

    Raises:
        UnusablePathError: the path is not usable; the message says why ("unusable path: ...").
        PathEscapeError: the path leaves ``root``; the message names both ("path outside its root: ...").
    """
    problem = path_problem(path)
    if problem:
        raise UnusablePathError(f"unusable path: {quoted(path, 120)} {problem}")
    uri = storage.normalize(resolve(root, path))  # "a.mp4" and "./a.mp4" name one file (symbolic links are kept)
    if not storage.is_below(root, uri):
        raise PathEscapeError(f"path outside its root: {path!r} resolves outside {root}")
    return uri


def part_range(total: int, index: int, count: int) -> range:
    """The contiguous run of ``total`` items that fan-out part ``index`` of ``count`` takes (sizes differ by at
    most one; a part may be empty)."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"part {index} of {count}: need count >= 1 and 0 <= index < count")
    return range(index * total // count, (index + 1) * total // count)
