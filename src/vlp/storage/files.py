"""Files named by URI, whatever the backend: each function asks :func:`~vlp.storage.base.backend_for` for the
backend of its URI and calls it. What a caller needs of a storage has a name here (a local view, an append, a
ranged read, a listing); no caller tests a scheme."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from vlp.storage.base import atomic_local, backend_for
from vlp.storage.local import refuse_links_below

# --------------------------------------------------------------------------- names


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """Join URI parts with ``/`` (``s3://b/a`` + ``x`` -> ``s3://b/a/x``; local paths likewise)."""
    out = str(base)
    for part in parts:
        part = str(part).strip("/")
        if not part:
            continue
        out = out.rstrip("/") + "/" + part if out else part
    return out


def canonical(uri: str | os.PathLike[str]) -> str:
    """One spelling per place: a local path absolute and with its links resolved, an object URI as it is."""
    return backend_for(uri).canonical(str(uri))


def absolute(uri: str | os.PathLike[str]) -> str:
    """``uri`` independent of the working directory (a local path made absolute, links kept; an object URI as it
    is, less a trailing ``/``)."""
    return backend_for(uri).absolute(str(uri))


def normalize(uri: str | os.PathLike[str]) -> str:
    """One spelling without reading the storage: a local ``./a/../b`` is ``b`` (links kept); a key as it is."""
    return backend_for(uri).normalize(str(uri))


def is_absolute(uri: str | os.PathLike[str]) -> bool:
    """``uri`` names a place by itself (a URI of a storage backend, an absolute path), not one under a directory."""
    return backend_for(uri).is_absolute(str(uri))


def parent(uri: str | os.PathLike[str]) -> str:
    """The directory or prefix ``uri`` lies in."""
    return backend_for(uri).parent(str(uri))


def relative(uri: str | os.PathLike[str], root: str | os.PathLike[str]) -> str:
    """``uri``, listed under ``root`` (:func:`list_files`), relative to ``root``, with ``/`` between parts."""
    return backend_for(root).relative(str(uri), str(root))


def is_below(root: str | os.PathLike[str], uri: str | os.PathLike[str]) -> bool:
    """True when ``uri`` lies strictly inside ``root`` on the same storage: locally once ``..`` and symbolic links
    are resolved; in an object store under ``root``'s prefix, with no ``..`` segment in the rest of the key."""
    backend = backend_for(root)
    return backend is backend_for(uri) and backend.is_below(str(root), str(uri))


def local_path(uri: str | os.PathLike[str]) -> str | None:
    """A path on this machine that *is* ``uri`` (reads and writes through it are ``uri``'s own), or None where
    ``uri`` lives elsewhere (an object store): then :func:`local_copy` gives a local copy to read."""
    return backend_for(uri).local_path(str(uri))


def library_options(uri: str | os.PathLike[str]) -> dict[str, str] | None:
    """The connection to ``uri``'s store as the ``storage_options`` of a library that opens it itself (LanceDB),
    or None where the library needs none (a local path)."""
    return backend_for(uri).library_options()


# --------------------------------------------------------------------------- queries


def exists(uri: str | os.PathLike[str]) -> bool:
    """True when ``uri`` is an existing file/object, or a non-empty directory/prefix."""
    return backend_for(uri).exists(str(uri))


def list_files(uri: str | os.PathLike[str], suffix: str = "", recursive: bool = True) -> list[str]:
    """Sorted URIs of the files under directory/prefix ``uri`` (ending in ``suffix``)."""
    return backend_for(uri).list_files(str(uri), suffix, recursive)


def size(uri: str | os.PathLike[str]) -> int:
    """Size in bytes of a file/object."""
    return backend_for(uri).size(str(uri))


# --------------------------------------------------------------------------- bytes


@dataclass
class ReadStats:
    """Bytes and requests this process has read through :func:`read_bytes`, :func:`read_range`,
    :func:`read_tail` and :class:`~vlp.storage.RangedFile` (every backend alike): what a benchmark divides by."""

    bytes: int = 0
    requests: int = 0


_read_stats = ReadStats()


def read_stats() -> ReadStats:
    """A copy of this process's read counters."""
    return ReadStats(_read_stats.bytes, _read_stats.requests)


def reset_read_stats() -> None:
    _read_stats.bytes = _read_stats.requests = 0


def _counted(data: bytes) -> bytes:
    _read_stats.bytes += len(data)
    _read_stats.requests += 1
    return data


def read_bytes(uri: str | os.PathLike[str]) -> bytes:
    return _counted(backend_for(uri).read_bytes(str(uri)))


def read_text(uri: str | os.PathLike[str], encoding: str = "utf-8") -> str:
    return read_bytes(uri).decode(encoding)


def read_range(uri: str | os.PathLike[str], start: int, length: int) -> bytes:
    """``length`` bytes of ``uri`` from byte ``start`` (fewer at the end of the file): one ranged GET on S3.

    A body cut off mid-transfer is fetched again (up to ``max_attempts`` tries, as the requests themselves are);
    then :class:`StorageError` names the object and the range.
    """
    uri = str(uri)
    if start < 0 or length < 0:
        raise ValueError(f"read_range({uri!r}, {start}, {length}): start and length must be >= 0")
    if length == 0:
        return b""
    return _counted(backend_for(uri).read_range(uri, start, length))


def read_tail(uri: str | os.PathLike[str], length: int) -> tuple[bytes, int]:
    """``(the last length bytes of uri (all of it when shorter), its size)``: one suffix-ranged GET on S3."""
    uri = str(uri)
    if length < 1:
        raise ValueError(f"read_tail({uri!r}, {length}): length must be >= 1")
    data, total = backend_for(uri).read_tail(uri, length)
    return _counted(data), total


def write_bytes(uri: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``uri`` atomically (parent directories are created)."""
    backend_for(uri).write_bytes(str(uri), data)


def write_text(uri: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    write_bytes(uri, text.encode(encoding))


def delete(uri: str | os.PathLike[str]) -> None:
    """Delete a file/object if it exists."""
    backend_for(uri).delete(str(uri))


def remove_folder(uri: str | os.PathLike[str]) -> None:
    """Remove what is left of the directory ``uri`` once its files are deleted (empty folders, temporary files);
    an object store has no folders, so there it does nothing."""
    backend_for(uri).remove_folder(str(uri))


class AppendLog:
    """A text file that grows by lines (a metrics log). Where the storage appends (local files), each line is
    appended in place; elsewhere (an object store has no appends) the lines are held here and the whole file is
    rewritten atomically at each one, which suits files of a few thousand lines."""

    def __init__(self, uri: str | os.PathLike[str]) -> None:
        self.uri = str(uri)
        self._backend = backend_for(self.uri)
        self._lines: list[str] = []
        if not self._backend.appends and exists(self.uri):
            self._lines = read_text(self.uri).splitlines()

    def append(self, line: str) -> None:
        """Add ``line`` (without its newline) at the end of the file."""
        if self._backend.appends:
            self._backend.append_bytes(self.uri, (line + "\n").encode("utf-8"))
            return
        self._lines.append(line)
        write_text(self.uri, "\n".join(self._lines) + "\n")

    def replace(self, lines: Iterable[str]) -> None:
        """Make ``lines`` the whole file, atomically."""
        kept = list(lines)
        write_text(self.uri, "".join(f"{line}\n" for line in kept))
        if not self._backend.appends:
            self._lines = kept


# --------------------------------------------------------------------------- files


def upload(local_path: str | os.PathLike[str], uri: str | os.PathLike[str]) -> None:
    """Copy a local file to ``uri`` atomically (S3: transfer manager, multipart when large)."""
    backend_for(uri).upload(str(local_path), str(uri))


def download(uri: str | os.PathLike[str], local_path: str | os.PathLike[str]) -> str:
    """Copy ``uri`` to ``local_path`` atomically; returns ``local_path``."""
    uri, local_path = str(uri), str(local_path)
    with atomic_local(local_path) as tmp:
        backend_for(uri).download(uri, tmp)
    return local_path


def copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Copy one file/object to another place, atomically at the destination (S3 to S3: a server-side copy,
    multipart when large; across two backends: an upload of a local file, a download to one, else the bytes)."""
    src, dst = str(src), str(dst)
    source, target = backend_for(src), backend_for(dst)
    if source is target:
        source.copy_within(src, dst)
    elif (src_path := source.local_path(src)) is not None:
        target.upload(src_path, dst)
    elif (dst_path := target.local_path(dst)) is not None:
        download(src, dst_path)
    else:
        target.write_bytes(dst, source.read_bytes(src))


def refuse_links(root: str | os.PathLike[str], what: str, depth: int = 0) -> None:
    """Refuse a local ``root`` (a frames store, an index, a model directory, a checkpoint) that holds a symbolic link
    anywhere below it, to a file or a directory, whether it points inside or out: vlp's steps never write one, so a
    link is a file replaced after the fact, and reading through it would read whatever it names. ``root`` itself may
    be a link (it is the caller's own argument). A root that does not exist passes (the caller says what is missing).
    An object store has no links: a key is read as itself, and readers take only the key names their writer makes.
    ``depth`` (0: no limit) bounds the search to the entries at most that many levels below ``root``.

    Raises:
        LinkError: naming ``what``, the link (relative to ``root``) and where it points.
    """
    path = local_path(root)
    if path is not None:
        refuse_links_below(path, what, depth)


@contextlib.contextmanager
def local_copy(uri: str | os.PathLike[str], suffix: str = "") -> Iterator[str]:
    """A local path holding ``uri``'s bytes for the duration of the block.

    Local files are used in place (no copy); other files are downloaded to a temporary file
    that is removed afterwards. Use this for libraries that need a real file (decord, PyAV).
    """
    uri = str(uri)
    if local_path(uri) is not None:
        yield uri
        return
    fd, tmp = tempfile.mkstemp(suffix=suffix or Path(uri).suffix, prefix="vlp-")
    os.close(fd)
    try:
        download(uri, tmp)
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
