"""The backend interface, the process-wide settings and the registry that picks a backend by a URI's scheme.

This module is the one place in vlp that reads a scheme: everything above asks :func:`backend_for` (through the
functions of :mod:`vlp.storage`) for what it needs, never whether a URI is ``s3://``.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vlp.ranges import COUNT, ranged


@dataclass
class StorageConfig:
    """Object-store connection. Empty strings mean: use the AWS environment / defaults."""

    endpoint_url: str = ""  # e.g. http://127.0.0.1:9000; else AWS_ENDPOINT_URL[_S3] or AWS
    region: str = ""  # else AWS_REGION / AWS_DEFAULT_REGION, else us-east-1
    access_key_id: str = ""  # prefer the environment or an IAM role over putting keys in files
    secret_access_key: str = ""
    addressing_style: str = "path"  # "path" works on every S3-compatible server; "virtual" for AWS
    multipart_threshold_mb: int = ranged(64, COUNT)  # files larger than this go through multipart upload
    multipart_chunk_mb: int = ranged(16, COUNT)
    max_concurrency: int = ranged(4, COUNT)
    # tries per request (botocore "standard" retries: 5xx, throttling, connection errors)
    max_attempts: int = ranged(5, COUNT)


class StorageError(OSError):
    """A storage operation failed; the message names the URI."""


class Backend:
    """One kind of storage (local files, an object store, ...): what every URI of its scheme is read and written by.

    A backend implements the six operations marked *required*; every other method is a capability with a default
    built from them, which a backend overrides where it does better (a ranged GET, a server-side copy) or where
    the default's answer is not its own (a local path). Writes are atomic: a reader never sees half a file.
    """

    appends: bool = False  # True when append_bytes adds to a file in place (else AppendLog rewrites it whole)

    def exists(self, uri: str) -> bool:
        """Required: ``uri`` is an existing file, or a non-empty directory/prefix."""
        raise NotImplementedError

    def list_files(self, uri: str, suffix: str, recursive: bool) -> list[str]:
        """Required: sorted URIs of the files under ``uri`` ending in ``suffix`` (no temporary files)."""
        raise NotImplementedError

    def size(self, uri: str) -> int:
        """Required: bytes of the file ``uri``; FileNotFoundError naming it when there is none."""
        raise NotImplementedError

    def read_bytes(self, uri: str) -> bytes:
        """Required: the whole file; FileNotFoundError naming it when there is none."""
        raise NotImplementedError

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Required: replace ``uri`` by ``data`` atomically (parents are made where the storage has them)."""
        raise NotImplementedError

    def delete(self, uri: str) -> None:
        """Required: delete a file if it exists."""
        raise NotImplementedError

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (fewer at the end); the default reads the whole file."""
        return self.read_bytes(uri)[start : start + length]

    def read_tail(self, uri: str, length: int) -> tuple[bytes, int]:
        """``(the last length bytes, the file's size)``; the default reads the whole file."""
        data = self.read_bytes(uri)
        return data[-length:], len(data)

    def append_bytes(self, uri: str, data: bytes) -> None:
        """Add ``data`` to the end of ``uri`` in place; only where :attr:`appends` is True."""
        raise StorageError(f"cannot append to {uri}: this storage has no appends (use vlp.storage.AppendLog)")

    def local_path(self, uri: str) -> str | None:
        """A path on this machine that *is* ``uri`` (what is written through it is written to ``uri``), else None."""
        return None

    def download(self, uri: str, local_path: str) -> None:
        """Write ``uri``'s bytes to the local file ``local_path`` (a temporary file: the caller renames it)."""
        Path(local_path).write_bytes(self.read_bytes(uri))

    def upload(self, local_path: str, uri: str) -> None:
        """Copy the local file ``local_path`` to ``uri`` atomically."""
        self.write_bytes(uri, Path(local_path).read_bytes())

    def copy_within(self, src: str, dst: str) -> None:
        """Copy one file of this backend to another place of it, atomically at ``dst``."""
        self.write_bytes(dst, self.read_bytes(src))

    def remove_folder(self, uri: str) -> None:
        """Remove what is left of folder ``uri`` once its files are deleted; a store of keys has none: nothing."""

    def absolute(self, uri: str) -> str:
        """``uri`` independent of the working directory; a URI with a scheme is already (less a trailing ``/``)."""
        return uri.rstrip("/")

    def canonical(self, uri: str) -> str:
        """One spelling per place (local: links resolved); by default :meth:`absolute`."""
        return self.absolute(uri)

    def normalize(self, uri: str) -> str:
        """One spelling without reading the storage (local ``./a`` -> ``a``); a key is its own spelling."""
        return uri

    def is_absolute(self, uri: str) -> bool:
        """``uri`` names a place by itself, not relative to a directory: any URI with a scheme does."""
        return True

    def parent(self, uri: str) -> str:
        """The folder ``uri`` lies in."""
        return uri.rsplit("/", 1)[0]

    def relative(self, uri: str, root: str) -> str:
        """``uri`` (listed under ``root``) relative to ``root``."""
        return uri.removeprefix(root.rstrip("/") + "/")

    def is_below(self, root: str, uri: str) -> bool:
        """``uri`` lies strictly inside ``root``: under its prefix, with no ``..`` segment (harmless to a store of
        keys, but it would climb out of a local directory once the key becomes a file name)."""
        prefix = root.rstrip("/") + "/"
        return uri.startswith(prefix) and ".." not in uri[len(prefix) :].split("/")

    def library_options(self) -> dict[str, str] | None:
        """The connection as the ``storage_options`` of a library that opens this URI itself (LanceDB), or None."""
        return None

    def configure(self, cfg: StorageConfig) -> None:
        """New process-wide settings: drop what was made from the old ones (connections)."""


# --------------------------------------------------------------------------- settings and registry

_lock = threading.Lock()
_config = StorageConfig()
_BACKENDS: dict[str, Backend] = {}  # scheme -> backend; "" holds local paths (and URIs of no registered scheme)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def configure(cfg: StorageConfig) -> None:
    """Set the process-wide storage settings (call once at step start-up)."""
    global _config
    with _lock:
        _config = cfg
        backends = list(_BACKENDS.values())
    for backend in backends:
        backend.configure(cfg)


def current_config() -> StorageConfig:
    """The process-wide storage settings (what a worker process is configured with)."""
    return _config


def register(scheme: str, backend: Backend) -> None:
    """Make ``backend`` the storage of every ``<scheme>://...`` URI (``""``: local paths), in this process: a forked
    worker inherits it, a spawned one imports :mod:`vlp.storage` afresh and needs its own call.

    Raises:
        ValueError: ``scheme`` is not a URI scheme (a letter, then letters, digits, ``+``, ``-`` or ``.``).
    """
    if scheme and not _SCHEME.fullmatch(scheme + "://"):
        raise ValueError(f"storage scheme {scheme!r}: expected a letter, then letters, digits, '+', '-' or '.'")
    with _lock:
        _BACKENDS[scheme] = backend


def unregister(scheme: str) -> None:
    """Forget the backend of ``scheme`` (its URIs read as local paths again, as before :func:`register`)."""
    if not scheme:
        raise ValueError("the local backend (scheme '') cannot be unregistered")
    with _lock:
        _BACKENDS.pop(scheme, None)


def backend_for(uri: str | os.PathLike[str]) -> Backend:
    """The backend of ``uri``'s scheme; a URI without a registered scheme is a local path."""
    match = _SCHEME.match(str(uri))
    backend = _BACKENDS.get(match.group(1)) if match else None
    return backend if backend is not None else _BACKENDS[""]


# --------------------------------------------------------------------------- local temporary files

TMP_MARK = ".vlp-tmp-"


def is_tmp(name: str) -> bool:
    """A temporary file of :func:`atomic_local` (listings skip it)."""
    return TMP_MARK in name


@contextlib.contextmanager
def atomic_local(path: str) -> Iterator[str]:
    """Yield a temporary path next to local ``path``; rename it over ``path`` on success."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}{TMP_MARK}")
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
