"""URL lists: a WebVid CSV (``videoid,contentUrl,duration,page_dir,name``) or a list of your own (a CSV with a
``url`` column, a JSONL of ``{"url": ...}`` objects, or a text file of one URL per line), each with an optional
caption (``caption`` or ``text``; WebVid: ``name``), id (``id`` or ``video_id``; WebVid: ``videoid``) and split
(``split``: train, val or test; default ``fetch.split``).

Every line becomes a :class:`Row` numbered from 0 in file order (the header excluded), so that a part, a record
and a reject all name the same row. A line that cannot be read (not UTF-8, not JSON, no URL) is a row whose
``problem`` says why; it is recorded as a reject and never fetched. A row without an id gets ``row<number>``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass

from vlp import storage
from vlp.data import manifest
from vlp.data.fetch.config import FORMATS


@dataclass(frozen=True)
class Row:
    """One line of a URL list."""

    row: int
    video_id: str
    url: str
    caption: str
    problem: str = ""  # "" = to fetch; else "<status>: <detail>", why it is not fetched
    split: str = ""  # "" = fetch.split


def detect(source: str, head: bytes) -> str:
    """``webvid`` for a CSV whose header names ``contentUrl``, else ``urls``."""
    if source.lower().endswith(".csv") and b"contenturl" in head.split(b"\n", 1)[0].lower():
        return "webvid"
    return "urls"


def read(source: str, fmt: str = "auto") -> tuple[str, list[Row]]:
    """``(format, rows)`` of the list at ``source`` (a local path or ``s3://`` URI)."""
    if fmt not in ("auto", *FORMATS):
        raise ValueError(f"fetch.format={fmt!r} is not one of auto, {', '.join(FORMATS)}")
    if not storage.exists(source):
        raise FileNotFoundError(f"URL list {source} does not exist")
    data = storage.read_bytes(source)
    fmt = detect(source, data[:4096]) if fmt == "auto" else fmt
    lower = source.lower()
    if lower.endswith(".csv"):
        rows = _csv(data, fmt)
    elif lower.endswith((".jsonl", ".json")):
        rows = _jsonl(data)
    else:
        rows = _lines(data)
    return fmt, _unique_ids(rows)


def _row(n: int, url: object, caption: object = "", video_id: object = "", split: object = "") -> Row:
    url = url.strip() if isinstance(url, str) else ""
    caption = caption if isinstance(caption, str) else ""
    vid = str(video_id).strip() if isinstance(video_id, str | int) and str(video_id).strip() else f"row{n}"
    split = split.strip() if isinstance(split, str) else ""
    problem = "" if url else "bad row: no URL"
    if split and split not in manifest.SPLITS:
        problem = f"bad row: split {split!r} is not one of {', '.join(manifest.SPLITS)}"
    return Row(n, vid, url, caption.strip(), problem, split)


def _csv(data: bytes, fmt: str) -> list[Row]:
    lines = data.split(b"\n")
    header_line, body = lines[0].rstrip(b"\r"), lines[1:]
    header = [h.strip().lower() for h in next(csv.reader([header_line.decode("utf-8", "replace")]), [])]
    if fmt == "webvid":
        need, columns = "contenturl", {"url": "contenturl", "caption": "name", "id": "videoid"}
    else:
        caption, vid = _first(header, "caption", "text"), _first(header, "id", "video_id")
        need, columns = "url", {"url": "url", "caption": caption, "id": vid, "split": _first(header, "split")}
    if need not in header:
        raise ValueError(f"URL list: the CSV header {header} has no {need!r} column")
    at = {key: header.index(name) if name in header else -1 for key, name in columns.items()}
    rows = []
    for n, line in enumerate(line for line in body if line.strip()):
        try:
            values = next(csv.reader([line.rstrip(b"\r").decode("utf-8")]))
        except (UnicodeDecodeError, csv.Error) as exc:
            rows.append(Row(n, f"row{n}", "", "", f"bad row: {type(exc).__name__}"))
            continue
        get = {key: values[i] if 0 <= i < len(values) else "" for key, i in at.items()}
        rows.append(_row(n, get["url"], get["caption"], get["id"], get.get("split", "")))
    return rows


def _first(header: list[str], *names: str) -> str:
    return next((name for name in names if name in header), "")


def _jsonl(data: bytes) -> list[Row]:
    rows = []
    for n, line in enumerate(line for line in data.split(b"\n") if line.strip()):
        try:
            item = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            rows.append(Row(n, f"row{n}", "", "", f"bad row: {type(exc).__name__}"))
            continue
        if not isinstance(item, dict):
            rows.append(Row(n, f"row{n}", "", "", "bad row: not a JSON object"))
            continue
        caption = item.get("caption", item.get("text", ""))
        rows.append(_row(n, item.get("url"), caption, item.get("id", item.get("video_id", "")), item.get("split", "")))
    return rows


def _lines(data: bytes) -> list[Row]:
    rows = []
    for n, line in enumerate(line for line in data.split(b"\n") if line.strip()):
        try:
            rows.append(_row(n, line.decode("utf-8")))
        except UnicodeDecodeError:
            rows.append(Row(n, f"row{n}", "", "", "bad row: UnicodeDecodeError"))
    return rows


def _unique_ids(rows: list[Row]) -> list[Row]:
    """A row repeating an earlier row's id with another URL is not fetched (whose clip would the id name?); with
    the same URL it is fetched once, with the earlier row (:mod:`vlp.data.fetch.part`)."""
    first: dict[str, str] = {}
    out = []
    for r in rows:
        if not r.problem and first.setdefault(r.video_id, r.url) != r.url:
            r = Row(
                r.row, r.video_id, r.url, r.caption, f"duplicate id: {r.video_id} names another URL earlier", r.split
            )
        out.append(r)
    return out
