"""URL lists: a WebVid CSV (``videoid,contentUrl,duration,page_dir,name``) or a list of your own (a CSV with a
``url`` column, a JSONL of ``{"url": ...}`` objects, or a text file of one URL per line), each with an optional
caption (``caption`` or ``text``; WebVid: ``name``), id (``id`` or ``video_id``; WebVid: ``videoid``) and split
(``split``: train, val or test; default ``fetch.split``).

A list is read as a stream (:func:`stream`), one record at a time: a CSV by the standard parser (a quoted field may
hold commas, quotes and newlines; CRLF or LF line ends), a JSONL or text file a line at a time; a UTF-8 byte-order
mark at the start is dropped, whatever the format. Every record becomes a :class:`Row` numbered from 0 in file order
(the header excluded), so that a part, a record and a reject all name the same row. A record that cannot be read
(not UTF-8, a NUL byte, a broken quote, not JSON, no URL) is a row whose ``problem`` says why and the line of the
file it starts on; it is recorded as a reject and never fetched. A row without an id gets ``row<number>``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from vlp import storage
from vlp.data import manifest
from vlp.data.fetch.config import FORMATS
from vlp.text import invalid_utf8, nul_problem

BOM = "\ufeff"


@dataclass(frozen=True)
class Row:
    """One record of a URL list."""

    row: int
    video_id: str
    url: str
    caption: str
    problem: str = ""  # "" = to fetch; else "<status>: <detail>", why it is not fetched
    split: str = ""  # "" = fetch.split


def detect(source: str, head: bytes) -> str:
    """``webvid`` for a CSV whose header names ``contentUrl``, else ``urls``."""
    first = head.removeprefix(BOM.encode()).split(b"\n", 1)[0].lower()
    return "webvid" if source.lower().endswith(".csv") and b"contenturl" in first else "urls"


def stream(source: str, fmt: str = "auto") -> tuple[str, Iterator[Row]]:
    """``(format, rows)`` of the list at ``source`` (a local path or ``s3://`` URI), the rows read as they are
    iterated (an object is downloaded to a temporary file first)."""
    if fmt not in ("auto", *FORMATS):
        raise ValueError(f"fetch.format={fmt!r} is not one of auto, {', '.join(FORMATS)}")
    if not storage.exists(source):
        raise FileNotFoundError(f"URL list {source} does not exist")
    if fmt == "auto":
        head = storage.read_range(source, 0, 4096) if storage.size(source) else b""
        fmt = detect(source, head)
    return fmt, _stream(source, fmt)


def _stream(source: str, fmt: str) -> Iterator[Row]:
    # undecodable bytes become lone surrogates, found per record; newline="" lets csv see quoted line ends
    with storage.local_copy(source) as path, open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
        yield from _unique_ids(_records(f, source.lower(), fmt))


def read(source: str, fmt: str = "auto") -> tuple[str, list[Row]]:
    """``(format, rows)`` of the list at ``source``: :func:`stream`'s rows, all of them."""
    fmt, rows = stream(source, fmt)
    return fmt, list(rows)


def _records(f: IO[str], name: str, fmt: str) -> Iterator[Row]:
    if name.endswith(".csv"):
        return _csv(f, fmt)
    return _jsonl(f) if name.endswith((".jsonl", ".json")) else _lines(f)


def _text_problem(fields: dict[str, object]) -> str:
    """Why one of a record's text fields cannot be used (not UTF-8, a NUL byte), or ``""``."""
    for name, value in fields.items():
        if isinstance(value, str):
            bad = invalid_utf8(value) or nul_problem(value)
            if bad:
                return f"its {name} {bad}"
    return ""


def _row(n: int, line: int, url: object, caption: object = "", video_id: object = "", split: object = "") -> Row:
    """Row ``n`` (starting on line ``line`` of the file) from a record's fields."""
    unreadable = _text_problem({"URL": url, "caption": caption, "id": video_id, "split": split})
    if unreadable:  # nothing of it is kept but its number: its text cannot be written down
        return _bad(n, line, unreadable)
    url = url.strip() if isinstance(url, str) else ""
    caption = caption if isinstance(caption, str) else ""
    vid = str(video_id).strip() if isinstance(video_id, str | int) and str(video_id).strip() else f"row{n}"
    split = split.strip() if isinstance(split, str) else ""
    problem = "" if url else f"bad row: no URL (line {line})"
    if split and split not in manifest.SPLITS:
        problem = f"bad row: split {split!r} is not one of {', '.join(manifest.SPLITS)} (line {line})"
    return Row(n, vid, url, caption.strip(), problem, split)


def _bad(n: int, line: int, why: str) -> Row:
    """Row ``n``, a record that cannot be read, with why and the line of the file it starts on."""
    return Row(n, f"row{n}", "", "", f"bad row: {why} (line {line})")


def _csv(f: IO[str], fmt: str) -> Iterator[Row]:
    reader = csv.reader(_no_bom(f), strict=True)
    try:
        header = [h.strip().lower() for h in next(reader, [])]
    except csv.Error as exc:
        raise ValueError(f"URL list: the CSV header cannot be read: {exc}") from None
    if fmt == "webvid":
        need, columns = "contenturl", {"url": "contenturl", "caption": "name", "id": "videoid", "split": ""}
    else:
        caption, vid = _first(header, "caption", "text"), _first(header, "id", "video_id")
        need, columns = "url", {"url": "url", "caption": caption, "id": vid, "split": _first(header, "split")}
    if need not in header:
        raise ValueError(f"URL list: the CSV header {header[:20]} has no {need!r} column")
    at = {key: header.index(name) if name in header else -1 for key, name in columns.items()}
    n = 0
    while True:
        line = reader.line_num + 1  # where the next record starts
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield _bad(n, line, f"not a CSV record: {exc}")
            n += 1
            continue
        if not any(v.strip() for v in values):
            continue  # a blank line
        get = {key: values[i] if 0 <= i < len(values) else "" for key, i in at.items()}
        yield _row(n, line, get["url"], get["caption"], get["id"], get["split"])
        n += 1


def _first(header: list[str], *names: str) -> str:
    return next((name for name in names if name in header), "")


def _no_bom(f: IO[str]) -> Iterator[str]:
    """The lines of ``f`` with a byte-order mark dropped from the first."""
    for number, line in enumerate(f):
        yield line.removeprefix(BOM) if number == 0 else line


def _lines_of(f: IO[str]) -> Iterator[tuple[int, str]]:
    """``(line number from 1, text)`` of each non-blank line, without its line end."""
    for number, line in enumerate(_no_bom(f), 1):
        if line.strip():
            yield number, line.rstrip("\r\n")


def _jsonl(f: IO[str]) -> Iterator[Row]:
    for n, (number, line) in enumerate(_lines_of(f)):
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            yield _bad(n, number, f"not JSON: {exc.msg}")
            continue
        if not isinstance(item, dict):
            yield _bad(n, number, "not a JSON object")
            continue
        caption = item.get("caption", item.get("text", ""))
        vid = item.get("id", item.get("video_id", ""))
        yield _row(n, number, item.get("url"), caption, vid, item.get("split", ""))


def _lines(f: IO[str]) -> Iterator[Row]:
    for n, (number, line) in enumerate(_lines_of(f)):
        yield _row(n, number, line)


def _unique_ids(rows: Iterable[Row]) -> Iterator[Row]:
    """A row repeating an earlier row's id with another URL is not fetched (whose clip would the id name?); with
    the same URL it is fetched once, with the earlier row (:mod:`vlp.data.fetch.part`)."""
    first: dict[str, str] = {}
    for r in rows:
        if not r.problem and first.setdefault(r.video_id, r.url) != r.url:
            r = Row(
                r.row, r.video_id, r.url, r.caption, f"duplicate id: {r.video_id} names another URL earlier", r.split
            )
        yield r
