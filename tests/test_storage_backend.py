"""A third storage backend, added here through vlp.storage's public API alone: files held in a dict under ``mem://``.

The steps know nothing of it, yet synth -> ingest -> extract-frames run on it end to end and give the frames a local
directory gets; so a new backend (GCS, Azure, a mounted bucket) is one class and one :func:`vlp.storage.register`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from vlp import storage
from vlp.config import load_config
from vlp.data import manifest
from vlp.steps.extract_frames import extract_frames
from vlp.steps.ingest import ingest
from vlp.steps.synth import synth

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


class MemoryBackend(storage.Backend):
    """Files in a dict, keyed by URI: the six required operations and nothing else (no appends, no local path, no
    ranged reads of its own), so every capability the steps use comes from :class:`vlp.storage.Backend`'s defaults."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def exists(self, uri: str) -> bool:
        prefix = uri.rstrip("/") + "/"
        return uri in self.files or any(key.startswith(prefix) for key in self.files)

    def list_files(self, uri: str, suffix: str, recursive: bool) -> list[str]:
        prefix = uri.rstrip("/") + "/"
        below = [key for key in self.files if key.startswith(prefix) and key.endswith(suffix)]
        return sorted(key for key in below if recursive or "/" not in key[len(prefix) :])

    def size(self, uri: str) -> int:
        return len(self.read_bytes(uri))

    def read_bytes(self, uri: str) -> bytes:
        with self.lock:
            if uri not in self.files:
                raise FileNotFoundError(f"no such object: {uri}")
            return self.files[uri]

    def write_bytes(self, uri: str, data: bytes) -> None:
        with self.lock:
            self.files[uri] = bytes(data)

    def delete(self, uri: str) -> None:
        with self.lock:
            self.files.pop(uri, None)


@pytest.fixture
def mem() -> Iterator[MemoryBackend]:
    backend = MemoryBackend()
    storage.register("mem", backend)
    try:
        yield backend
    finally:
        storage.unregister("mem")


def test_the_scheme_picks_the_backend_and_the_capabilities_default(mem, tmp_path):
    storage.write_text("mem://b/a/x.txt", "hello")
    assert mem.files == {"mem://b/a/x.txt": b"hello"}
    assert storage.exists("mem://b/a") and not storage.exists("mem://b/z")
    assert storage.list_files("mem://b", ".txt") == ["mem://b/a/x.txt"]
    assert storage.read_range("mem://b/a/x.txt", 1, 3) == b"ell"
    assert storage.read_tail("mem://b/a/x.txt", 2) == (b"lo", 5)
    assert storage.local_path("mem://b/a/x.txt") is None and storage.is_absolute("mem://b/a/x.txt")
    with storage.local_copy("mem://b/a/x.txt") as path:
        assert Path(path).read_bytes() == b"hello" and path != "mem://b/a/x.txt"
    storage.copy("mem://b/a/x.txt", str(tmp_path / "x.txt"))
    storage.copy(str(tmp_path / "x.txt"), "mem://b/y.txt")
    assert mem.files["mem://b/y.txt"] == b"hello"
    assert storage.is_below("mem://b", "mem://b/a/x.txt") and not storage.is_below("mem://b", str(tmp_path))
    log = storage.AppendLog("mem://b/log.jsonl")
    log.append("1")
    log.append("2")
    assert storage.read_text("mem://b/log.jsonl") == "1\n2\n"
    assert not (Path.cwd() / "mem:").exists()  # nothing went to a local directory named after the scheme


def test_an_unregistered_scheme_reads_as_a_local_path_again(tmp_path):
    storage.register("mem", MemoryBackend())
    storage.unregister("mem")
    assert storage.local_path("mem://b/x") == "mem://b/x"
    with pytest.raises(ValueError, match="storage scheme"):
        storage.register("3d", MemoryBackend())


def _names(root: str) -> list[str]:
    """The files under ``root`` relative to it, a shard's hash of its inputs' URIs left out."""
    return sorted(re.sub(r"-[0-9a-f]{8}[.]parquet$", ".parquet", storage.relative(uri, root))
                  for uri in storage.list_files(root))  # fmt: skip


def _shards(frames: str) -> list[pa.Table]:
    """The frame shards of a frames store, in order."""
    return [storage.read_parquet(uri) for uri in storage.list_files(storage.join(frames, "shards"), ".parquet")]


def test_synth_ingest_and_extract_frames_run_on_a_backend_registered_here(mem, tmp_path):
    cfg = load_config(TINY, ["synth.num_videos=4", "synth.num_images=1"])
    for root in ("mem://world", str(tmp_path / "world")):
        synth(storage.join(root, "raw"), cfg)
        ingest(storage.join(root, "raw"), storage.join(root, "dataset"), cfg)
        done = extract_frames(storage.join(root, "dataset"), storage.join(root, "frames"), cfg)
        assert done["stored_videos"] == 5, done
    assert {key.split("/")[3] for key in mem.files} == {"raw", "dataset", "frames"}
    assert _names("mem://world") == _names(str(tmp_path / "world"))
    videos = manifest.read("mem://world/dataset", manifest.VIDEOS, manifest.VIDEO_SCHEMA)
    assert len(videos) == 5 and all(path.startswith("mem://world/raw/") for path in videos["path"].to_pylist())
    shards = _shards("mem://world/frames")
    assert shards and shards == _shards(str(tmp_path / "world" / "frames"))
