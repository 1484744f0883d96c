"""An offline Hugging Face hub cache built at test time: hub downloads by name without any network.

The layout is huggingface_hub's (``<cache>/models--<org>--<name>/refs/<branch>`` holding a commit sha,
``snapshots/<sha>/<files>``); :func:`offline_hub` points ``HF_HOME`` / ``HF_HUB_CACHE`` at a fresh one and sets
``HF_HUB_OFFLINE=1``, so a name that is not in it fails at once instead of reaching for the network.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest


def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A new empty hub cache under ``tmp_path``, made the process's cache, with the hub offline; returns it."""
    home = tmp_path / "hf-home"
    cache = home / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def commit_sha(label: str) -> str:
    """A 40-hex commit sha derived from ``label`` (distinct labels, distinct commits)."""
    return hashlib.sha1(label.encode()).hexdigest()


def add_snapshot(cache: Path, repo: str, source: Path, *, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """Put every file of the directory ``source`` into ``cache`` as commit ``commit`` of the hub model ``repo``,
    with each branch of ``refs`` pointing at it; returns the snapshot folder."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for path in sorted(source.iterdir()):
        if path.is_file():
            shutil.copyfile(path, snapshot / path.name)
    for ref in refs:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return snapshot
