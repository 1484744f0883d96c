"""Shared fixtures: a real S3-speaking server on loopback, real mp4 files, a small synthetic world."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from common import png_header, put  # noqa: F401 (the tests take them from here; the fault battery shares them)
from vlp import storage

ACCESS_KEY = "vlp-test-access"
SECRET_KEY = "vlp-test-secret"

# The tests of bf16 on the CPU (cpu_bf16, eval_precision=bf16) run on every CPU, slowly where it has no bf16; the
# refusal a user gets there is tests/test_cpu_bf16.py's (vlp.distributed.require_cpu_bf16). Subprocesses inherit it.
os.environ.setdefault("VLP_ALLOW_SLOW_BF16", "1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a module's tests (``pytest.mark.usefixtures("one_thread")``): tiny ops run many times
    slower with intra-op threads competing for 2 busy cores. The count is restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of an S3 server process on 127.0.0.1 for the whole session.

    ``VLP_TEST_S3_ENDPOINT`` points the tests at an already running server (e.g. Ceph RGW);
    otherwise moto's standalone server is started as a separate process and stopped afterwards.
    """
    external = os.environ.get("VLP_TEST_S3_ENDPOINT")
    if external:
        yield external
        return
    exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"moto_server exited: {log.read_text()}") from None
            time.sleep(0.1)
    else:
        proc.kill()
        raise RuntimeError("moto_server did not start within 30 s")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def s3_config(s3_endpoint: str) -> Iterator[storage.StorageConfig]:
    """Storage configured for the test server (restored to defaults afterwards)."""
    cfg = storage.StorageConfig(endpoint_url=s3_endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)
    storage.configure(cfg)
    yield cfg
    storage.configure(storage.StorageConfig())


@pytest.fixture
def s3_bucket(s3_config: storage.StorageConfig) -> str:
    """A fresh, empty bucket; returns ``s3://<bucket>``."""
    name = f"vlp-{uuid.uuid4().hex[:12]}"
    storage.client().create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """AWS_* environment for subprocesses (the CLI) talking to the test server."""
    env = {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def write_mp4(path: str | Path, num_frames: int = 24, fps: int = 12, size: tuple[int, int] = (64, 48)) -> Path:
    """Write a real h264 mp4 whose frame ``i`` is filled with grey level ``(i * 10) % 250``.

    The constant grey level makes decoded frames identifiable: ``frame.mean() ~= (i * 10) % 250``.
    """
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    width, height = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("h264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"g": "6"}  # a keyframe every 6 frames, so sparse reads really seek
        for i in range(num_frames):
            img = np.full((height, width, 3), (i * 10) % 250, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def clip_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """One real 2 s h264 mp4 (24 frames at 12 fps, 64x48), copied wherever a good clip is needed."""
    return write_mp4(tmp_path_factory.mktemp("clip") / "clip.mp4").read_bytes()


@pytest.fixture
def mp4_factory(tmp_path: Path):
    """``mp4_factory(name, **kw)`` -> path of a real mp4 under ``tmp_path`` (see :func:`write_mp4`)."""

    def make(name: str = "clip.mp4", **kwargs) -> Path:
        return write_mp4(tmp_path / name, **kwargs)

    return make


# Each test file's seconds in a whole run (scripts/test_durations.py writes it from pytest's --durations=0 report;
# docs/guides/testing.md says how). The longest files run first: `make test` hands whole files to two workers
# (pytest-xdist `--dist loadfile --no-loadscope-reorder`), so a long file started last would leave one worker idle
# while the other finishes it.
DURATIONS = Path(__file__).with_name("durations.json")


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Sort ``items`` (in place) by their file's ``seconds``, longest first; the files ``seconds`` lacks go last in
    the order they came. The sort is stable, so a file's tests keep their order."""
    items.sort(key=lambda item: (item.path.name not in seconds, -seconds.get(item.path.name, 0.0)))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that talks to the S3 server ``s3`` (on Ceph RGW in `make test TEST_S3=rgw`, `make test-s3`),
    and run the longest files first (:data:`DURATIONS`, :func:`longest_first`)."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "s3_endpoint" in getattr(item, "fixturenames", ()) or params.get("root") == "s3":
            item.add_marker(pytest.mark.s3)
    longest_first(items, json.loads(DURATIONS.read_text(encoding="utf-8")))


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The synthetic world at tests/../configs/tiny.yaml sizes, ingested and frame-extracted, built once.

    Returns the URIs ``{"raw", "dataset", "frames"}`` (local directories; treat them as read-only).
    """
    from vlp.config import load_config
    from vlp.steps.extract_frames import extract_frames
    from vlp.steps.ingest import ingest
    from vlp.steps.synth import synth

    root = tmp_path_factory.mktemp("tiny_world")
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml")
    uris = {name: str(root / name) for name in ("raw", "dataset", "frames")}
    synth(uris["raw"], cfg)
    ingest(uris["raw"], uris["dataset"], cfg)
    extract_frames(uris["dataset"], uris["frames"], cfg)
    return uris


# --------------------------------------------------------------------------- figures against their baselines


def split_rows(dataset: str, table: str, split: str = "test") -> list[dict]:
    """The rows of ``dataset``'s manifest ``table`` (``manifest.CAPTIONS`` or ``manifest.QA``) in ``split``, read
    from its Parquet file: what a test computes a figure's baseline from, independently of the evaluate step."""
    from vlp.data import manifest

    schema = {manifest.CAPTIONS: manifest.CAPTION_SCHEMA, manifest.QA: manifest.QA_SCHEMA}[table]
    return [row for row in manifest.read(dataset, table, schema).to_pylist() if row["split"] == split]


def majority_share(answers: list[str]) -> float:
    """The share of the most common (normalised) answer: what always giving that answer scores."""
    from collections import Counter

    from vlp.data.video_text import normalize_answer

    counts = Counter(normalize_answer(a) for a in answers)
    return max(counts.values()) / len(answers)


def clearly_above(p: float, n: int, alpha: float = 1e-3) -> float:
    """The bar for "clearly above" a predictor that gets each of ``n`` items right with probability ``p``
    (chance, a constant answer): the smallest share ``k / n`` it reaches with probability below ``alpha``
    (the exact binomial tail ``P(X >= k)``)."""
    from math import comb

    tail = 1.0  # P(X >= k), from k = 0 up
    for k in range(n + 1):
        if tail < alpha:
            return k / n
        tail -= comb(n, k) * p**k * (1 - p) ** (n - k)
    return 1.0
