"""Video probing and sparse frame reading: decord first, PyAV when decord fails on a file.

Both functions take a *local* path (use :func:`vlp.storage.local_copy` for ``s3://``).
Errors are :class:`VideoError` with a short reason that ends up in a rejects manifest.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


class VideoError(RuntimeError):
    """A file could not be probed or decoded. ``str(exc)`` is a one-line reason."""


@dataclass(frozen=True)
class VideoInfo:
    num_frames: int
    fps: float
    duration_s: float
    width: int
    height: int
    backend: str  # "decord" | "pyav" | "pil"


def is_image(path: str) -> bool:
    return path.lower().endswith(IMAGE_SUFFIXES)


def probe(path: str) -> VideoInfo:
    """Measure a video (or still image) and prove it decodes: first and last frame are decoded."""
    if not os.path.exists(path):
        raise VideoError(f"missing file: {path}")
    if os.path.getsize(path) == 0:
        raise VideoError("empty file (0 bytes)")
    if is_image(path):
        return _probe_image(path)
    try:
        return _probe_decord(path)
    except Exception as decord_exc:  # decord raises its own DECORDError and RuntimeError
        try:
            return _probe_pyav(path)
        except Exception as av_exc:
            raise VideoError(f"not decodable: decord: {_short(decord_exc)}; pyav: {_short(av_exc)}") from av_exc


def read_frames(path: str, indices: Sequence[int], *, backend: str = "auto") -> np.ndarray:
    """Decode only frames ``indices`` of ``path`` -> uint8 array ``(N, H, W, 3)`` RGB, in the given order.

    ``backend``: ``"auto"`` (decord, PyAV on failure), ``"decord"`` or ``"pyav"``.
    """
    if not len(indices):
        raise ValueError("read_frames needs at least one frame index")
    if is_image(path):
        img = _read_image(path)
        return np.stack([img for _ in indices])
    if backend in ("auto", "decord"):
        try:
            return _read_decord(path, indices)
        except Exception as exc:
            if backend == "decord":
                raise VideoError(f"decord: {_short(exc)}") from exc
            decord_error = exc
    try:
        return _read_pyav(path, indices)
    except Exception as exc:
        prefix = f"decord: {_short(decord_error)}; " if backend == "auto" else ""
        raise VideoError(f"{prefix}pyav: {_short(exc)}") from exc


# --------------------------------------------------------------------------- backends


def _probe_decord(path: str) -> VideoInfo:
    import decord

    vr = decord.VideoReader(path, num_threads=1)
    n = len(vr)
    if n <= 0:
        raise VideoError("no frames")
    first = vr[0].asnumpy()
    vr[n - 1].asnumpy()  # a truncated stream fails here, not at training time
    fps = float(vr.get_avg_fps())
    height, width = first.shape[:2]
    return VideoInfo(n, fps, n / fps if fps > 0 else 0.0, int(width), int(height), "decord")


def _probe_pyav(path: str) -> VideoInfo:
    import av

    with av.open(path) as container:
        if not container.streams.video:
            raise VideoError("no video stream")
        stream = container.streams.video[0]
        fps = float(stream.average_rate or stream.guessed_rate or 0.0)
        n, width, height = 0, 0, 0
        for frame in container.decode(stream):
            if n == 0:
                width, height = frame.width, frame.height
            n += 1
    if n == 0:
        raise VideoError("no decodable frames")
    return VideoInfo(n, fps, n / fps if fps > 0 else 0.0, width, height, "pyav")


def _probe_image(path: str) -> VideoInfo:
    try:
        img = _read_image(path)
    except Exception as exc:
        raise VideoError(f"not a decodable image: {_short(exc)}") from exc
    return VideoInfo(1, 0.0, 0.0, img.shape[1], img.shape[0], "pil")


def _read_image(path: str) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def _read_decord(path: str, indices: Sequence[int]) -> np.ndarray:
    import decord

    vr = decord.VideoReader(path, num_threads=1)
    n = len(vr)
    bad = [i for i in indices if not 0 <= i < n]
    if bad:
        raise VideoError(f"frame indices {bad[:5]} out of range for {n} frames")
    return vr.get_batch(list(indices)).asnumpy()


def _read_pyav(path: str, indices: Sequence[int]) -> np.ndarray:
    """Sequential decode that converts only the wanted frames (PyAV seeks are not frame-exact)."""
    import av

    wanted = sorted(set(int(i) for i in indices))
    got: dict[int, np.ndarray] = {}
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1  # single-threaded, so worker processes scale
        for i, frame in enumerate(container.decode(stream)):
            if i in wanted:
                got[i] = frame.to_ndarray(format="rgb24")
                if len(got) == len(wanted):
                    break
    missing = [i for i in wanted if i not in got]
    if missing:
        raise VideoError(f"frames {missing[:5]} not found (video has fewer frames)")
    return np.stack([got[int(i)] for i in indices])


def _short(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
