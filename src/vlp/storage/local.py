"""Local paths as a storage backend, and the checks that only local files need (links, paths that climb out)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from vlp.storage.base import Backend, StorageError, atomic_local, is_tmp


class LocalBackend(Backend):
    """Files on this machine: a write goes to a temporary file in the target directory and is renamed into place."""

    appends = True

    def exists(self, uri: str) -> bool:
        return os.path.exists(uri)

    def list_files(self, uri: str, suffix: str, recursive: bool) -> list[str]:
        root = Path(uri)
        if not root.is_dir():
            return []
        paths = root.rglob("*") if recursive else root.iterdir()
        return sorted(str(p) for p in paths if p.is_file() and p.name.endswith(suffix) and not is_tmp(p.name))

    def size(self, uri: str) -> int:
        return os.path.getsize(uri)

    def read_bytes(self, uri: str) -> bytes:
        try:
            return Path(uri).read_bytes()
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"no such file: {uri}") from exc

    def write_bytes(self, uri: str, data: bytes) -> None:
        with atomic_local(uri) as tmp:
            Path(tmp).write_bytes(data)

    def delete(self, uri: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(uri)

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        try:
            with open(uri, "rb") as fh:
                fh.seek(start)
                return fh.read(length)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"no such file: {uri}") from exc

    def read_tail(self, uri: str, length: int) -> tuple[bytes, int]:
        try:
            with open(uri, "rb") as fh:
                total = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, total - length))
                return fh.read(), total
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"no such file: {uri}") from exc

    def append_bytes(self, uri: str, data: bytes) -> None:
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
        with open(uri, "ab") as fh:
            fh.write(data)

    def local_path(self, uri: str) -> str | None:
        return uri

    def download(self, uri: str, local_path: str) -> None:
        try:
            shutil.copyfile(uri, local_path)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"no such file: {uri}") from exc

    def upload(self, local_path: str, uri: str) -> None:
        if os.path.abspath(local_path) == os.path.abspath(uri):
            return
        with atomic_local(uri) as tmp:
            shutil.copyfile(local_path, tmp)

    def copy_within(self, src: str, dst: str) -> None:
        self.upload(src, dst)

    def remove_folder(self, uri: str) -> None:
        shutil.rmtree(uri, ignore_errors=True)

    def absolute(self, uri: str) -> str:
        return os.path.abspath(uri)

    def canonical(self, uri: str) -> str:
        return os.path.realpath(uri)

    def normalize(self, uri: str) -> str:
        return os.path.normpath(uri)

    def is_absolute(self, uri: str) -> bool:
        return uri.startswith("/")

    def parent(self, uri: str) -> str:
        return os.path.dirname(uri)

    def relative(self, uri: str, root: str) -> str:
        # a listing spells paths as pathlib does (./ckpt and a//b become ckpt and a/b): compared as paths
        return Path(uri).relative_to(Path(root)).as_posix()

    def is_below(self, root: str, uri: str) -> bool:
        return is_below_local(root, uri)


def is_below_local(directory: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """True when local ``path`` lies strictly inside ``directory`` once ``..`` and symbolic links are resolved."""
    base, target = os.path.realpath(directory), os.path.realpath(path)
    return target != base and os.path.commonpath([base, target]) == base


class LinkError(ValueError):
    """A store or model directory holds a symbolic link: what vlp wrote there is never one, so a link is something
    put in afterwards that could lead reads anywhere on the machine."""


def refuse_links_below(root: str, what: str, depth: int = 0) -> None:
    """Refuse the local directory ``root`` when it holds a symbolic link (:func:`vlp.storage.refuse_links`); with a
    ``depth``, only ``root`` and the folders fewer than ``depth`` levels below it are listed."""
    pending = [(root, 0)]
    while pending:
        folder, level = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.is_symlink():
                where = os.path.relpath(entry.path, root)
                raise LinkError(
                    f"the {what} {root} holds a symbolic link, {where} -> {os.readlink(entry.path)}: vlp never "
                    f"writes one there, so it is refused (replace it with the file itself)"
                )
            if entry.is_dir(follow_symlinks=False) and (not depth or level + 1 < depth):
                pending.append((entry.path, level + 1))


def local_path_under(directory: str | os.PathLike[str], relative: str) -> str:
    """``directory/relative`` for a key-derived relative path, refusing one that climbs out (``..``, absolute).

    An S3 key may contain ``..`` segments; as a file name under a temporary directory it would escape it.
    """
    target = os.path.join(os.path.realpath(directory), relative)
    if os.path.isabs(relative) or not is_below_local(directory, target):
        raise StorageError(f"refusing the key-derived path {relative!r}: it leaves {directory}")
    return os.path.realpath(target)
