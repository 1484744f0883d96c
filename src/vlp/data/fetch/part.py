"""A fetch part (:func:`fetch_part`) and the merge of the parts (:func:`merge`).

Layout under the fetch output ``OUT`` (a folder or an ``s3://`` prefix):

- ``videos/<sha256[:2]>/<sha256><ext>``: each video once, named by the SHA-256 of its bytes, whatever the URL's
  path holds (``ext`` from the Content-Type, else the URL's extension among the known video ones, else ``.mp4``);
- ``parts/<index>-of-<count>/``: a part's ``journal-<n>.parquet`` files (the records of each batch, written
  after its videos are stored), then ``records.parquet`` when the part has finished, and the part's
  ``summary.json``;
- after the merge: ``videos.parquet`` and ``captions.parquet`` (the raw schema ``vlp ingest`` reads: ``OUT`` is
  a raw dataset directory), ``rejects.parquet`` (every row not fetched, with its reason), ``fetch.parquet``
  (every row's record) and ``summary.json``.

A part rerun after a kill reads its journal and fetches only the rows it lacks; a finished part (its
``records.parquet`` there) fetches nothing. One process at a time fetches a part of an output (a lock beside the
part's local scratch folder, where downloads wait for their probe and upload; a run empties what a killed one left
there, and removes it when it ends). A video is stored once: its object is written only when absent, and
rows whose bytes are equal become one video (the first row's id) with every row's caption.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import posixpath
import shutil
import stat
import tempfile
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from vlp import storage
from vlp.data import manifest, video
from vlp.data.fetch import lists
from vlp.data.fetch.client import Fetcher, Outcome
from vlp.data.fetch.config import FetchConfig
from vlp.data.fetch.guard import redact
from vlp.data.ingest.probe import probe_file
from vlp.data.isolate import isolated_map
from vlp.signals import run_interruptible

log = logging.getLogger(__package__)

RECORDS = "records.parquet"  # a finished part's records
FETCHED = "fetch.parquet"  # the merge: every row's record
_META = b"vlp.fetch"
RECORD_SCHEMA = pa.schema(
    [
        pa.field("row", pa.int64(), nullable=False),  # line of the list, from 0 (header excluded)
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("url", pa.string(), nullable=False),  # redacted (guard.redact)
        pa.field("caption", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),  # "" = fetch.split
        pa.field("status", pa.string(), nullable=False),  # "ok" or the reason (client.Outcome)
        pa.field("detail", pa.string(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("seconds", pa.float64(), nullable=False),  # the row's download, waits between attempts included
        pa.field("attempts", pa.int64(), nullable=False),
        pa.field("final_url", pa.string(), nullable=False),  # after redirects, redacted
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),  # the stored video, relative to OUT ("" = none)
        pa.field("content_type", pa.string(), nullable=False),
    ]
)
_TYPES = {"video/mp4": ".mp4", "video/webm": ".webm", "video/quicktime": ".mov", "video/x-matroska": ".mkv",
          "video/x-msvideo": ".avi", "video/x-m4v": ".m4v", "video/mpeg": ".mpg"}  # fmt: skip
_EXTENSIONS = frozenset(_TYPES.values())


def part_dir(out: str, index: int, count: int) -> str:
    return storage.join(out, "parts", f"{index:05d}-of-{count:05d}")


def _record(r: lists.Row, outcome: Outcome | None = None, path: str = "") -> dict[str, Any]:
    status, _, detail = r.problem.partition(": ")
    o = outcome or Outcome(status, detail)
    return {"row": r.row, "video_id": r.video_id, "url": redact(r.url), "caption": r.caption, "split": r.split,
            "status": o.status,
            "detail": o.detail, "bytes": o.bytes, "seconds": o.seconds, "attempts": o.attempts,
            "final_url": o.final_url, "sha256": o.sha256, "path": path, "content_type": o.content_type}  # fmt: skip


def _table(records: Sequence[dict[str, Any]]) -> pa.Table:
    return manifest.from_rows(sorted(records, key=lambda rec: rec["row"]), RECORD_SCHEMA)


def _extension(url: str, content_type: str) -> str:
    if content_type in _TYPES:
        return _TYPES[content_type]
    ext = posixpath.splitext(urllib.parse.urlsplit(url).path)[1].lower()
    return ext if ext in _EXTENSIONS else ".mp4"


def _digest(rows: Sequence[lists.Row]) -> str:
    return hashlib.sha256(json.dumps([[r.row, r.url] for r in rows]).encode()).hexdigest()[:16]


def _journal(where: str, mine: Sequence[lists.Row]) -> tuple[dict[int, dict[str, Any]], int]:
    """The records a killed run of this part left (row -> record), and the next journal number. A record whose
    URL differs from the list's row is an error: the list changed under the same output."""
    urls = {r.row: redact(r.url) for r in mine}
    names = sorted(p for p in storage.list_files(where, suffix=".parquet", recursive=False)
                   if posixpath.basename(p).startswith("journal-"))  # fmt: skip
    done: dict[int, dict[str, Any]] = {}
    for name in names:
        for rec in storage.read_parquet(name).to_pylist():
            if urls.get(rec["row"]) != rec["url"]:
                raise ValueError(f"{name}: row {rec['row']} was fetched from {rec['url']}, but the list now names "
                                 f"{urls.get(rec['row'])!r}: fetch a changed list into a new output")  # fmt: skip
            done[rec["row"]] = rec
    return done, len(names)


def fetch_part(source: str, out: str, cfg: FetchConfig, index: int, count: int) -> dict[str, Any]:
    """Fetch part ``index`` of ``count`` of the list at ``source`` into ``out`` (module docstring); returns the
    part's summary: rows, what this run fetched, counts by status, bytes, seconds."""
    fmt, rows = lists.read(source, cfg.format)
    span = manifest.part_range(len(rows), index, count)
    mine = rows[span.start : span.stop]
    where = part_dir(out, index, count)
    meta = {"index": index, "count": count, "rows": len(rows), "digest": _digest(mine)}
    target = storage.join(where, RECORDS)
    start = time.perf_counter()
    if storage.exists(target):
        found = json.loads(storage.read_parquet_metadata(target).get(_META, b"{}"))
        if {key: found.get(key) for key in meta} != meta:
            raise ValueError(f"{target} was fetched from another list or split ({found}; here {meta}): fetch a "
                             "changed list into a new output")  # fmt: skip
        log.info("fetch part %d/%d: %s has finished already", index, count, target)
        table, fetched = storage.read_parquet(target), 0
    else:
        with _scratch(out, index, count) as tmp:
            done, seq = _journal(where, mine)
            todo = [r for r in mine if r.row not in done]
            log.info("fetch part %d/%d: %d of %d rows (%d recorded before)", index, count, len(todo), len(mine),
                     len(done))  # fmt: skip
            records = dict(done)
            if todo:
                run_interruptible(_Run(out, where, cfg, seq, records, tmp).fetch(todo))
        table = _table(list(records.values()))
        finished = meta | {"wall_s": round(time.perf_counter() - start, 3)}  # the run that finished it
        storage.write_parquet(target, table.replace_schema_metadata({_META: json.dumps(finished, sort_keys=True)}))
        fetched = len(todo)
    return {"part": index, "parts": count, "format": fmt, "rows": len(mine), "fetched": fetched,
            "wall_s": round(time.perf_counter() - start, 3), **_counts(table.to_pylist())}  # fmt: skip


def _counts(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in records if r["status"] == "ok"]
    return {"ok": len(ok), "failed": len(records) - len(ok), "bytes": sum(r["bytes"] for r in ok),
            "by_status": dict(sorted(Counter(r["status"] for r in records).items())),
            "download_s": round(sum(r["seconds"] for r in records), 3)}  # fmt: skip


def scratch_dir(out: str, index: int, count: int) -> str:
    """The local folder of part ``index`` of ``count`` of ``out``'s downloads: the same on every run, this user's."""
    key = hashlib.sha256(f"{storage.canonical(out)}\0{index}\0{count}".encode()).hexdigest()[:20]
    return os.path.join(tempfile.gettempdir(), f"vlp-fetch-{os.getuid()}", key)


@contextlib.contextmanager
def _scratch(out: str, index: int, count: int) -> Iterator[str]:
    """An empty local folder for part ``index`` of ``count`` of ``out``'s downloads, held by this process alone.

    The folder is the same on every run (under the system's temporary directory, named by a hash of the output and
    the part), so a run empties what a killed run left; it is removed when the run ends. A second process on the
    same part fails at once, naming the first.

    Raises:
        PartBusy: another process holds the part.
    """
    work = scratch_dir(out, index, count)
    root = os.path.dirname(work)
    os.makedirs(root, mode=0o700, exist_ok=True)
    found = os.lstat(root)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise PermissionError(f"{root} is not a folder of this user's: remove it, or set TMPDIR elsewhere")
    fd = os.open(f"{work}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise PartBusy(f"part {index}/{count} of {out} is being fetched by another process (pid {holder}): wait "
                           "for it to end, or stop it, then run this again") from None  # fmt: skip
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        shutil.rmtree(work, ignore_errors=True)  # a killed run's partial downloads
        os.mkdir(work, 0o700)
        try:
            yield work
        finally:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        os.close(fd)  # the lock goes with it


class PartBusy(ValueError):
    """Another process is fetching the same part into the same output."""


class _Run:
    """One run of a part: downloads (``cfg.concurrency`` at a time) feed batches that are probed, stored and
    journaled in a thread while the downloads go on."""

    def __init__(
        self, out: str, where: str, cfg: FetchConfig, seq: int, records: dict[int, dict[str, Any]], tmp: str
    ) -> None:
        self.out, self.where, self.cfg, self.seq, self.records, self.tmp = out, where, cfg, seq, records, tmp
        self.stored: set[str] = set()  # objects this run knows exist
        self.total = self.finished = self.bytes = 0
        self.started = time.perf_counter()
        self.last_log = 0.0

    async def fetch(self, todo: Sequence[lists.Row]) -> None:
        by_url: dict[str, list[lists.Row]] = {}
        now: list[dict[str, Any]] = []
        for r in todo:
            if r.problem:
                now.append(_record(r))
            else:
                by_url.setdefault(r.url, []).append(r)  # the same URL twice: fetched once, for both rows
        self.total = len(todo)
        done: asyncio.Queue[tuple[list[lists.Row], Outcome, str] | None] = asyncio.Queue(maxsize=2 * self.cfg.batch)
        queue: asyncio.Queue[list[lists.Row]] = asyncio.Queue()
        for group in by_url.values():
            queue.put_nowait(group)
        async with Fetcher(self.cfg) as fetcher:

            async def worker() -> None:
                while not queue.empty():
                    group = queue.get_nowait()
                    dest = os.path.join(self.tmp, str(group[0].row))
                    outcome = await fetcher.fetch(group[0].url, dest, seed=group[0].row)
                    await done.put((group, outcome, dest))

            async def workers() -> None:
                await asyncio.gather(*(worker() for _ in range(min(self.cfg.concurrency, len(by_url)))))
                await done.put(None)

            finishing = asyncio.create_task(self._finisher(done, now))
            await asyncio.gather(workers(), finishing)

    async def _finisher(self, done: asyncio.Queue[Any], first: list[dict[str, Any]]) -> None:
        loop = asyncio.get_running_loop()
        pending = list(first)  # records made without a download (rows that cannot be fetched)
        items: list[tuple[list[lists.Row], Outcome, str]] = []
        ended = False
        while not ended:
            deadline = loop.time() + 5.0  # a slow list still journals every few seconds
            while len(items) < self.cfg.batch:
                try:
                    item = await asyncio.wait_for(done.get(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    break
                if item is None:
                    ended = True
                    break
                items.append(item)
            if items or pending:
                batch, items = items, []
                await asyncio.to_thread(self._finish, batch, pending)
                pending = []

    def _finish(self, items: list[tuple[list[lists.Row], Outcome, str]], extra: list[dict[str, Any]]) -> None:
        """Probe the batch's downloads, store the good ones, journal every row (in this order: a journaled row's
        video is stored)."""
        ok = [(group, o, dest) for group, o, dest in items if o.status == "ok"]
        if self.cfg.probe and ok:
            limits = video.DecodeLimits(0, self.cfg.max_bytes, 0.0)
            probe = _Probe(limits)
            results = isolated_map(probe, [dest for _, _, dest in ok], workers=self.cfg.probe_workers,
                                   timeout_s=self.cfg.probe_timeout_s, on_failure=_probe_failed)  # fmt: skip
            for (group, o, dest), (_info, reason) in zip(ok, results, strict=True):
                if reason:
                    o.status, o.detail = "not a video", reason.replace(dest, redact(group[0].url))
        paths = [f"videos/{o.sha256[:2]}/{o.sha256}{_extension(g[0].url, o.content_type)}" if o.status == "ok" else ""
                 for g, o, _ in items]  # fmt: skip
        new = {path: dest for path, (_, _, dest) in zip(paths, items, strict=True) if path and path not in self.stored}
        with ThreadPoolExecutor(self.cfg.store_workers) as pool:  # uploads side by side (object stores answer slowly)
            list(pool.map(self._store, new.items()))
        self.stored.update(new)
        records = list(extra)
        for (group, o, dest), path in zip(items, paths, strict=True):
            self.bytes += o.bytes if path else 0
            records.extend(_record(r, o, path) for r in group)
            with contextlib.suppress(FileNotFoundError):
                os.remove(dest)
        name = storage.join(self.where, f"journal-{self.seq:06d}.parquet")
        storage.write_parquet(name, _table(records))
        self.seq += 1
        for rec in records:
            self.records[rec["row"]] = rec
        self.finished += len(records)
        self._progress()

    def _store(self, item: tuple[str, str]) -> None:
        """Upload a download as ``OUT/<path>`` unless it is there already (stored by an earlier run or part)."""
        path, dest = item
        uri = storage.join(self.out, path)
        if not storage.exists(uri):
            storage.upload(dest, uri)

    def _progress(self) -> None:
        now = time.perf_counter()
        if not self.cfg.progress or (now - self.last_log < 10 and self.finished < self.total):
            return
        self.last_log = now
        seconds = max(now - self.started, 1e-9)
        ok = sum(rec["status"] == "ok" for rec in self.records.values())
        log.info("fetch: %d/%d rows, %d ok in all, %.1f MB stored, %.1f rows/s, %.1f MB/s", self.finished,
                 self.total, ok, self.bytes / 1e6, self.finished / seconds, self.bytes / 1e6 / seconds)  # fmt: skip


class _Probe:
    """ingest's probe of one downloaded file, in a worker process (picklable)."""

    def __init__(self, limits: video.DecodeLimits) -> None:
        self.limits = limits

    def __call__(self, path: str) -> tuple[dict[str, Any] | None, str]:
        return probe_file(path, self.limits)


def _probe_failed(_path: str, reason: str) -> tuple[None, str]:
    return None, f"probe {reason}: the decoder crashed or hung"


def merge(source: str, out: str, cfg: FetchConfig, count: int) -> dict[str, Any]:
    """Gather the ``count`` finished parts of ``out`` into the raw dataset ``vlp ingest`` reads (module
    docstring); every row of the list is in exactly one part's records, or this fails naming what is missing."""
    fmt, rows = lists.read(source, cfg.format)
    tables, missing = [], []
    for index in range(count):
        target = storage.join(part_dir(out, index, count), RECORDS)
        if storage.exists(target):
            tables.append(storage.read_parquet(target))
        else:
            missing.append(index)
    if missing:
        raise RuntimeError(f"fetch merge: part(s) {missing} of {count} have not finished (no {RECORDS}); run them, "
                           "then merge again")  # fmt: skip
    records = pa.concat_tables(tables).sort_by("row").to_pylist()
    if [rec["row"] for rec in records] != list(range(len(rows))):
        raise RuntimeError(f"fetch merge: the parts' records do not cover the list's {len(rows)} rows once each")
    owner: dict[str, dict[str, Any]] = {}
    videos, captions, rejects = [], [], []
    for rec in records:
        if rec["status"] != "ok":
            rejects.append({"stage": "fetch", "kind": "video", "record_id": rec["video_id"], "path": rec["url"],
                            "reason": f"{rec['status']}: {rec['detail']}"})  # fmt: skip
            continue
        first = owner.setdefault(rec["sha256"], rec)
        if first is rec:
            videos.append({"video_id": rec["video_id"], "path": rec["path"], "split": rec["split"] or cfg.split,
                           "media": "video", "source": fmt})  # fmt: skip
        if rec["caption"]:
            captions.append({"video_id": first["video_id"], "caption_id": f"row{rec['row']}",
                             "caption": rec["caption"], "split": first["split"] or cfg.split})  # fmt: skip
    storage.write_parquet(storage.join(out, manifest.VIDEOS), manifest.from_rows(videos, manifest.RAW_VIDEO_SCHEMA))
    storage.write_parquet(storage.join(out, manifest.CAPTIONS), manifest.from_rows(captions, manifest.CAPTION_SCHEMA))
    storage.write_parquet(storage.join(out, manifest.REJECTS), manifest.from_rows(rejects, manifest.REJECT_SCHEMA))
    storage.write_parquet(storage.join(out, FETCHED), _table(records))
    wall = sum(json.loads((t.schema.metadata or {}).get(_META, b"{}")).get("wall_s", 0.0) for t in tables)
    counts = _counts(records)
    return {"format": fmt, "rows": len(records), "parts": count, "videos": len(videos),
            "duplicates": counts["ok"] - len(videos), "captions": len(captions), **counts,
            "part_seconds": round(wall, 3), "videos_per_part_s": round(counts["ok"] / wall, 3) if wall else 0.0,
            "mb_per_part_s": round(counts["bytes"] / 1e6 / wall, 3) if wall else 0.0}  # fmt: skip
