"""Parquet over any backend: a file's footer, row groups and columns fetched by ranged reads, so a reader of one
clip or one column of a remote file costs about those bytes, not the file's."""

from __future__ import annotations

import io
import os
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from vlp.storage.base import StorageError
from vlp.storage.files import local_path, read_bytes, read_range, read_tail, write_bytes
from vlp.storage.files import size as _object_size  # RangedFile's `size` argument shadows the function


class RangedFile(io.RawIOBase):
    """A read-only, seekable file over ``uri`` whose reads are ranged reads (:func:`read_range`), for readers
    that seek (pyarrow's Parquet reader): only the bytes asked for are fetched. ``size`` saves a HEAD request."""

    def __init__(self, uri: str | os.PathLike[str], size: int | None = None) -> None:
        super().__init__()
        self.uri = str(uri)
        self._size = _object_size(self.uri) if size is None else int(size)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position in {self.uri}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        if n:
            data = read_range(self.uri, self._pos, n)
            view[: len(data)] = data
            n = len(data)
            self._pos += n
        return n


# --------------------------------------------------------------------------- parquet


def read_parquet(uri: str | os.PathLike[str], columns: list[str] | None = None) -> pa.Table:
    """A Parquet file as a table (its ``columns`` only: from an object store just their column chunks are fetched,
    after the footer, so the other columns' bytes are never read). A missing column raises ``pyarrow.ArrowInvalid``."""
    uri = str(uri)
    path = local_path(uri)
    if path is not None:
        if not os.path.exists(path):
            raise FileNotFoundError(f"no such file: {uri}")
        if columns is None:  # read through read_bytes: counted in read_stats(), as on S3
            return pq.read_table(pa.BufferReader(_arrow_owned(read_bytes(uri))))
        return pq.read_table(path, columns=columns)
    if columns is None:
        return pq.read_table(pa.BufferReader(_arrow_owned(read_bytes(uri))))
    footer = parquet_footer(uri)
    names = footer.metadata.schema.to_arrow_schema().names
    missing = [c for c in columns if c not in names]
    if missing:
        raise pa.ArrowInvalid(f"{uri}: no column(s) {missing}; it has {names}")
    table = read_row_groups(uri, list(range(footer.metadata.num_row_groups)), columns, footer)
    return table.replace_schema_metadata(footer.metadata.schema.to_arrow_schema().metadata)


def _arrow_owned(data: bytes) -> pa.Buffer:
    """``data`` copied into memory that Arrow allocated (no Python object behind it).

    ``pq.read_table`` decodes on Arrow's thread pools, and a task there may drop its reference to the input buffer
    after the read has returned. Were that buffer a Python ``bytes`` (``pa.BufferReader(bytes)``, ``io.BytesIO``), the
    pool thread would take the GIL to release it; when that happens while the interpreter is finalizing (a command
    that fails right after a read and exits), Python ends the thread inside Arrow's C++ destructor and the process
    aborts ("terminate called without an active exception", exit 134) after printing its error. Memory Arrow owns is
    released without the GIL.
    """
    buffer = pa.allocate_buffer(len(data))
    memoryview(buffer).cast("B")[:] = data
    return buffer


def read_parquet_metadata(uri: str | os.PathLike[str]) -> dict[bytes, bytes]:
    """The key-value metadata of a Parquet file's schema, read from its footer alone (:func:`parquet_footer`)."""
    return dict(parquet_footer(uri).metadata.schema.to_arrow_schema().metadata or {})


class ParquetFooter(NamedTuple):
    """A Parquet file's parsed footer and the file's size (what :func:`read_row_groups` needs to seek in it)."""

    metadata: pq.FileMetaData
    size: int


FOOTER_GUESS = 64 * 1024  # bytes read from the end at first: most footers fit, so one request does


def parquet_footer(uri: str | os.PathLike[str], tail: int = FOOTER_GUESS) -> ParquetFooter:
    """A Parquet file's footer (schema, row groups, key-value metadata) without reading its data: one read of the
    file's last ``tail`` bytes (64 KiB), and a second only when the footer is larger. A caller that knows the
    footer's size (``metadata.serialized_size + 8``, e.g. from an index) passes it as ``tail`` and reads exactly it.

    Raises:
        StorageError: ``uri`` is not a Parquet file (no ``PAR1`` at its end, or a footer that does not parse).
    """
    uri = str(uri)
    data, total = read_tail(uri, max(12, tail))
    if total < 12 or data[-4:] != b"PAR1":
        raise StorageError(f"{uri} is not a Parquet file (it does not end with PAR1)")
    footer_len = int.from_bytes(data[-8:-4], "little")
    if footer_len + 8 > total - 4:
        raise StorageError(f"{uri}: its footer claims {footer_len} bytes of a {total}-byte file")
    if footer_len + 8 > len(data):
        data = read_range(uri, total - footer_len - 8, footer_len + 8)
    footer = data[len(data) - footer_len - 8 :]
    try:  # pyarrow parses a footer from any buffer that starts and ends like a Parquet file
        return ParquetFooter(pq.read_metadata(io.BytesIO(b"PAR1" + footer)), total)
    except (pa.ArrowException, OSError) as exc:
        raise StorageError(f"{uri}: cannot parse its Parquet footer: {exc}") from exc


def read_row_groups(
    uri: str | os.PathLike[str],
    row_groups: list[int],
    columns: list[str] | None = None,
    footer: ParquetFooter | None = None,
) -> pa.Table:
    """Rows of ``row_groups`` of Parquet file ``uri``. With its ``footer`` given (:func:`parquet_footer`), only the
    column chunks asked for are read - one ranged read per run of adjacent chunks - and nothing else.

    The chunks are fetched first (:func:`read_range`) and pyarrow decodes them from memory: no request per page and
    no I/O thread pool calling back into Python for every read.
    """
    uri = str(uri)
    footer = footer if footer is not None else parquet_footer(uri)
    meta = footer.metadata
    try:
        wanted = _column_indices(meta, columns)
        spans = sorted(_chunk_span(meta.row_group(g).column(c)) for g in row_groups for c in wanted)
        segments: list[tuple[int, bytes]] = []
        for start, end in _coalesce(spans):
            segments.append((start, read_range(uri, start, end - start)))
        # on this thread: the file object is Python's, which a task left on Arrow's pools could outlive the read
        # holding (see _arrow_owned); a clip's row group is small, and loaders read clips in worker processes
        with pq.ParquetFile(_Segments(uri, footer.size, segments), metadata=meta, pre_buffer=False) as pf:
            return pf.read_row_groups(row_groups, columns=columns, use_threads=False)
    except (FileNotFoundError, StorageError):
        raise
    except (pa.ArrowException, OSError, IndexError, KeyError) as exc:
        raise StorageError(f"cannot read row groups {row_groups[:5]} of {uri}: {exc}") from exc


def _column_indices(meta: pq.FileMetaData, columns: list[str] | None) -> list[int]:
    """Leaf column indices of ``columns`` (all when None) in a file of flat columns."""
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    if columns is None:
        return list(range(meta.num_columns))
    missing = [c for c in columns if c not in names]
    if missing:
        raise KeyError(f"no column(s) {missing}; the file has {names}")
    return [names.index(c) for c in columns]


def _chunk_span(chunk: Any) -> tuple[int, int]:
    """``[start, end)`` bytes of a column chunk: its dictionary page (if any) and its data pages."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
        start = min(start, chunk.dictionary_page_offset)
    return start, start + chunk.total_compressed_size


def _coalesce(spans: list[tuple[int, int]], gap: int = 4096) -> list[tuple[int, int]]:
    """Sorted byte spans merged where they touch or lie less than ``gap`` bytes apart (one request each run)."""
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start - merged[-1][1] <= gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


class _Segments(RangedFile):
    """A :class:`RangedFile` of which ``segments`` (``(offset, bytes)``) were fetched already: reads inside a segment
    come from memory; anything else is a ranged read (pyarrow should need none)."""

    def __init__(self, uri: str, size: int, segments: list[tuple[int, bytes]]) -> None:
        super().__init__(uri, size=size)
        self._segments = segments

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        for start, data in self._segments:
            if start <= self._pos and self._pos + n <= start + len(data):
                view[:n] = data[self._pos - start : self._pos - start + n]
                self._pos += n
                return n
        return super().readinto(buffer)


def write_parquet(uri: str | os.PathLike[str], table: pa.Table, **kwargs: Any) -> None:
    """Write ``table`` as Parquet to ``uri`` atomically (deterministic bytes for equal tables)."""
    buf = io.BytesIO()
    kwargs.setdefault("compression", "zstd")
    pq.write_table(table, buf, **kwargs)
    write_bytes(uri, buf.getvalue())
