"""Video probing and sparse frame reading: decord first, PyAV when decord fails on a file.

Every function takes a *local* path (use :func:`vlp.storage.local_copy` for ``s3://``).
Errors are :class:`VideoError` with a short reason that ends up in a rejects manifest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
MIN_VIDEO_FRAMES = 2  # fewer decoded frames is a still image, whatever the container says


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


@dataclass(frozen=True)
class DecodeLimits:
    """What a file may declare before anything decodes it (0 = no limit for that measure)."""

    max_pixels: int = 8192 * 4320  # width x height of one frame (8K); a 16000 x 16000 frame is 256 Mpx
    max_bytes: int = 4 << 30  # file size
    max_duration_s: float = 0.0  # container duration (ingest passes its max_duration_s)


def limits_problem(path: str, limits: DecodeLimits, section: str = "") -> str | None:
    """Why ``path`` must not be decoded, from its size and container header alone (no frame is decoded).

    ``section`` prefixes the limit's name in the reason (``"ingest."`` -> ``ingest.max_pixels=...``). A file
    whose header cannot be read returns None: the decoders then reject it with their own reason.
    """
    size = os.path.getsize(path)
    if limits.max_bytes and size > limits.max_bytes:
        return f"too large: {size} bytes > {section}max_bytes={limits.max_bytes}"
    try:
        width, height, duration = _declared(path)
    except Exception as exc:
        if type(exc).__name__ == "DecompressionBombError":  # PIL refuses the header itself
            return f"too large: {short_reason(exc)}"
        return None
    if limits.max_pixels and width * height > limits.max_pixels:
        pixels = f"{width}x{height} = {width * height} pixels a frame"
        return f"too large: {pixels} > {section}max_pixels={limits.max_pixels}"
    if limits.max_duration_s and duration > limits.max_duration_s:  # as the container declares it
        return f"too long: {duration:.3f} s > {section}max_duration_s={limits.max_duration_s}"
    return None


def _declared(path: str) -> tuple[int, int, float]:
    """(width, height, duration in s) as the file's header states them."""
    if is_image(path):
        from PIL import Image

        with Image.open(path) as img:  # reads the header only
            return img.width, img.height, 0.0
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        else:
            duration = (container.duration or 0) / 1e6  # AV_TIME_BASE
        return int(width), int(height), duration


# ffmpeg demuxers that read one still image (or a numbered image sequence), not a video container.
_IMAGE_DEMUXERS = ("image2",)
_IMAGE_DEMUXER_SUFFIX = "_pipe"  # png_pipe, jpeg_pipe, bmp_pipe, webp_pipe, tiff_pipe, ...


def probe(path: str) -> VideoInfo:
    """Measure a video (or still image) and prove it decodes: first and last frame are decoded.

    What a file is comes from its bytes, not its name: a file named as a video must be a video container
    (a PNG renamed ``.mp4`` is refused, see :func:`container_problem`) and decode to at least
    :data:`MIN_VIDEO_FRAMES` frames over a positive duration, whatever the container (a one-frame GIF or mp4 is
    refused; an animated GIF is a video); a file with an image suffix (:data:`IMAGE_SUFFIXES`) must be an image Pillow
    decodes, and is a *still image*: one frame, no fps.
    """
    if not os.path.exists(path):
        raise VideoError(f"missing file: {path}")
    if os.path.getsize(path) == 0:
        raise VideoError("empty file (0 bytes)")
    if is_image(path):
        return _probe_image(path)
    problem = container_problem(path)
    if problem:
        raise VideoError(problem)
    try:
        info = _probe_decord(path)
    except Exception as decord_exc:  # decord raises its own DECORDError and RuntimeError
        try:
            info = _probe_pyav(path)
        except Exception as av_exc:
            raise VideoError(
                f"not decodable: decord: {short_reason(decord_exc)}; pyav: {short_reason(av_exc)}"
            ) from av_exc
    if info.num_frames < MIN_VIDEO_FRAMES or not info.duration_s > 0:
        frames = f"{info.num_frames} frame{'s' if info.num_frames != 1 else ''}"
        raise VideoError(
            f"not a video: {what_it_is(path)}, {frames} and {info.duration_s:g} s; a video has at least "
            f"{MIN_VIDEO_FRAMES} frames and a positive duration (a still image needs an image suffix {IMAGE_SUFFIXES})"
        )
    return info


def what_it_is(path: str) -> str:
    """What the file at ``path`` is by its bytes, for a reject reason: ``a GIF image``, ``an animated WEBP image of 5
    frames`` (Pillow's format name), ``a h264 stream in ffmpeg's mov,mp4,m4a,3gp,3g2,mj2 container``, or ``a file
    neither Pillow nor ffmpeg reads``."""
    try:
        from PIL import Image

        with Image.open(path) as img:  # identifies by magic bytes, whatever the name; reads the header only
            kind, frames = img.format or "unknown", int(getattr(img, "n_frames", 1))
        if frames > 1:
            return f"an animated {kind} image of {frames} frames"
        return f"{'an' if kind[:1] in 'AEIOU' else 'a'} {kind} image"
    except Exception:  # Pillow does not know it: ask ffmpeg
        pass
    try:
        import av

        with av.open(path) as container:
            codecs = [s.codec_context.name for s in container.streams.video]
            where = f"ffmpeg's {container.format.name} container"
    except Exception:
        return "a file neither Pillow nor ffmpeg reads"
    return f"a {codecs[0]} stream in {where}" if codecs else f"no video stream in {where}"


def container_problem(path: str) -> str | None:
    """Why ``path``, named as a video, is not one: ffmpeg reads it with an image demuxer (a still image under a
    video name). None when it is a video container, or when the header cannot be read at all (the decoders then
    give their own reason)."""
    try:
        import av

        with av.open(path) as container:
            names = container.format.name.split(",")
            codecs = [s.codec_context.name for s in container.streams.video]
    except Exception:
        return None
    if any(n in _IMAGE_DEMUXERS or n.endswith(_IMAGE_DEMUXER_SUFFIX) for n in names):
        codec = codecs[0] if codecs else "no codec"
        what = what_it_is(path)
        if what.startswith("an animated "):  # ffmpeg's image demuxers read one picture of it, not its animation
            return (
                f"not a video: {what} under a video name (read by ffmpeg's {container.format.name} demuxer as one "
                "still picture); convert it to a video container (mp4, webm) to use its frames"
            )
        return (
            f"not a video: a still image ({codec}, read by ffmpeg's {container.format.name} demuxer) under a video "
            f"name; give it an image suffix {IMAGE_SUFFIXES} to use it as a one-frame clip"
        )
    return None


def read_with_fallbacks(path: str, indices: Sequence[int], readers: Sequence[tuple[str, Reader]]) -> np.ndarray:
    """The frames from the first of ``readers`` (``(name, reader)`` pairs) that succeeds.

    Raises:
        VideoError: every reader failed; the message is ``"<name>: <reason>; <name>: <reason>..."``.
    """
    errors: list[str] = []
    last: Exception | None = None
    for name, reader in readers:
        try:
            return reader(path, indices)
        except Exception as exc:  # decord, PyAV and PIL raise many types; all mean "try the next one"
            errors.append(f"{name}: {short_reason(exc)}")
            last = exc
    raise VideoError("; ".join(errors)) from last


def short_reason(exc: BaseException, limit: int = 160) -> str:
    """``exc`` as one line of at most ``limit`` characters (its type name when it has no message)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_image(path: str) -> np.ndarray:
    """A still image as uint8 ``(H, W, 3)`` RGB."""
    from PIL import Image

    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


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
        img = read_image(path)
    except Exception as exc:
        raise VideoError(f"not a decodable image: {short_reason(exc)}") from exc
    return VideoInfo(1, 0.0, 0.0, img.shape[1], img.shape[0], "pil")


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

    wanted = {int(i) for i in indices}
    got: dict[int, np.ndarray] = {}
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1  # single-threaded, so worker processes scale
        for i, frame in enumerate(container.decode(stream)):
            if i in wanted:
                got[i] = frame.to_ndarray(format="rgb24")
                if len(got) == len(wanted):
                    break
    missing = sorted(wanted - got.keys())
    if missing:
        raise VideoError(f"frames {missing[:5]} not found (video has fewer frames)")
    return np.stack([got[int(i)] for i in indices])


Reader = Callable[[str, Sequence[int]], np.ndarray]  # (local path, frame indices) -> (N, H, W, 3) uint8 RGB
BACKENDS: dict[str, Reader] = {"decord": _read_decord, "pyav": _read_pyav}
