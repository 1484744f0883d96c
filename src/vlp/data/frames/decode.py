"""Decoding one video into the JPEG frames a shard stores: the decoder chain and the sparse PyAV reader.

See "Decoding" in :mod:`vlp.data.frames`. :func:`_extract_video` is what a worker process runs per video.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from vlp import storage
from vlp.data import video
from vlp.data.frames.plan import FramesConfig, _VideoResult, _VideoTask, stored_indices

_KEEP_PACKETS_BYTES = 256 * 1024 * 1024  # read_sparse holds the packets of files up to this size in memory

# --------------------------------------------------------------------------- one video (runs in a worker)


def _extract_video(task: _VideoTask, cfg: FramesConfig) -> _VideoResult:
    """Decode, resize and JPEG-encode the stored frames of one video; any decode failure is a reject.

    Storage errors other than a missing object propagate: a transient outage must not become a
    permanent reject baked into a completed shard.
    """
    if task.problem:
        return _VideoResult(task.video_id, reject=task.problem)
    if task.media == "image":
        indices, fps = [0], 0.0
    elif task.num_frames < 1 or task.fps <= 0:
        return _VideoResult(task.video_id, reject=f"manifest says {task.num_frames} frames at {task.fps} fps")
    else:
        indices, fps = stored_indices(task.num_frames, cfg.num_frames), task.fps
    try:
        with storage.local_copy(task.uri) as local:
            if not os.path.exists(local):
                raise FileNotFoundError(local)
            problem = video.limits_problem(local, video.DecodeLimits(cfg.max_pixels, cfg.max_bytes), "frames.")
            if problem:
                return _VideoResult(task.video_id, reject=problem)
            frames = (
                video.read_image(local)[None] if task.media == "image" else decode_frames(local, indices, cfg.decoder)
            )
        rows = []
        for slot, (index, frame) in enumerate(zip(indices, frames, strict=True)):
            jpeg, width, height = encode_frame(frame, cfg.size, cfg.resize, cfg.jpeg_quality)
            rows.append((slot, index, index / fps if fps else 0.0, width, height, jpeg))
    except FileNotFoundError as exc:
        return _VideoResult(task.video_id, reject=f"missing file: {video.short_reason(exc, 200)}")
    except storage.StorageError:
        raise
    except Exception as exc:  # decord, PyAV and PIL raise many types; all mean "this file is bad"
        return _VideoResult(task.video_id, reject=video.short_reason(exc, 200))
    return _VideoResult(task.video_id, rows=rows)


def encode_frame(frame: np.ndarray, size: int, resize: str, quality: int) -> tuple[bytes, int, int]:
    """Resize an RGB frame ``(H, W, 3)`` uint8 and JPEG-encode it; returns ``(jpeg, width, height)``.

    ``stretch`` resizes to ``size x size`` ignoring the aspect ratio (as ALPRO); ``short_side_crop``
    scales the short side to ``size`` and crops the centre square. PIL bilinear with antialiasing.
    """
    from PIL import Image

    img = Image.fromarray(frame)
    if resize == "short_side_crop":
        w, h = img.size
        scale = size / min(w, h)
        nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
        left, top = (nw - size) // 2, (nh - size) // 2
        img = img.resize((nw, nh), Image.Resampling.BILINEAR).crop((left, top, left + size, top + size))
    else:
        img = img.resize((size, size), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue(), img.width, img.height


def decode_frames(path: str, indices: Sequence[int], decoder: str = "sparse") -> np.ndarray:
    """Frames ``indices`` of local video ``path`` as ``(N, H, W, 3)`` uint8 RGB.

    ``decoder="sparse"`` tries :func:`read_sparse` first, then decord, then sequential PyAV;
    ``"decord"`` starts at decord; ``"pyav"`` uses sequential PyAV only.
    """
    readers = {"sparse": read_sparse, **video.BACKENDS}
    return video.read_with_fallbacks(path, indices, [(name, readers[name]) for name in _DECODER_CHAINS[decoder]])


_DECODER_CHAINS = {"sparse": ("sparse", "decord", "pyav"), "decord": ("decord", "pyav"), "pyav": ("pyav",)}


# --------------------------------------------------------------------------- the sparse PyAV reader


def packet_plan(pts: Sequence[int], keyframe: Sequence[bool], wanted: Iterable[int]) -> tuple[list[bool], set[int]]:
    """Which packets (in decode order) must reach the decoder to output display frames ``wanted``.

    Display index ``i`` is the packet with the ``i``-th smallest pts. A GOP runs from a keyframe to the
    next one (in decode order); within it, packets after the last wanted one are not needed. A GOP with
    no wanted frame is skipped entirely - unless the next GOP has a wanted *leading* picture (pts before
    its keyframe's, an open GOP), which may reference this GOP, in which case all of it is kept.

    Returns:
        ``(send, wanted_pts)``: a mask over packets and the pts values of the wanted frames.
    """
    order = sorted(pts)
    if len(set(order)) != len(order):
        raise video.VideoError("packets with duplicate pts: cannot map frames to indices")
    wanted_pts = {order[i] for i in wanted}
    starts = [i for i, key in enumerate(keyframe) if key]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    gops = list(zip(starts, [*starts[1:], len(pts)], strict=True))
    send = [False] * len(pts)
    for g, (a, b) in enumerate(gops):
        last = max((j for j in range(a, b) if pts[j] in wanted_pts), default=-1)
        if g + 1 < len(gops):
            na, nb = gops[g + 1]
            if any(pts[j] in wanted_pts and pts[j] < pts[na] for j in range(na, nb)):
                last = b - 1
        for j in range(a, last + 1):
            send[j] = True
    return send, wanted_pts


def read_sparse(path: str, indices: Sequence[int]) -> np.ndarray:
    """Decode only what frames ``indices`` need (see :func:`packet_plan`) -> ``(N, H, W, 3)`` uint8 RGB.

    A demux pass reads packet timestamps and keyframe flags (no decoding); the planned packets then
    go to a single-threaded decoder that discards unwanted non-reference frames and stops once every
    wanted frame is out. Files up to ``_KEEP_PACKETS_BYTES`` keep their packets in memory between the
    two steps; larger files are demuxed a second time instead.
    """
    import av

    keep = os.path.getsize(path) <= _KEEP_PACKETS_BYTES
    with av.open(path) as container:
        stream = container.streams.video[0]
        demuxed = (p for p in container.demux(stream) if p.size)
        packets = list(demuxed) if keep else None
        meta = [(p.pts, p.is_keyframe) for p in (packets if packets is not None else demuxed)]
        if not meta or any(p is None for p, _ in meta):
            raise video.VideoError("no packets with timestamps")
        bad = [i for i in indices if not 0 <= i < len(meta)]
        if bad:
            raise video.VideoError(f"frame indices {bad[:5]} out of range for {len(meta)} frames")
        pts = [p for p, _ in meta if p is not None]  # all of them (checked above)
        send, wanted_pts = packet_plan(pts, [k for _, k in meta], indices)
        if packets is not None:
            got = _decode_planned(stream.codec_context, packets, send, wanted_pts)
    if packets is None:
        with av.open(path) as container:
            stream = container.streams.video[0]
            got = _decode_planned(
                stream.codec_context, (p for p in container.demux(stream) if p.size), send, wanted_pts
            )
    order = sorted(pts)
    missing = [i for i in indices if order[i] not in got]
    if missing:
        raise video.VideoError(f"frames {missing[:5]} were not produced by the decoder")
    return np.stack([got[order[i]] for i in indices])


def _decode_planned(
    codec: Any, packets: Iterable[Any], send: list[bool], wanted_pts: set[int]
) -> dict[int, np.ndarray]:
    """Feed the packets marked in ``send`` to ``codec``; return the wanted frames as RGB arrays by pts."""
    from av.video.reformatter import VideoReformatter

    codec.thread_count = 1
    rgb = VideoReformatter()  # one SwsContext for all frames: frame.to_ndarray(format=) builds one per frame
    got: dict[int, np.ndarray] = {}

    def keep(frames: Iterable[Any]) -> None:
        for frame in frames:
            if frame.pts in wanted_pts:
                got[frame.pts] = rgb.reformat(frame, format="rgb24").to_ndarray()

    for packet, needed in zip(packets, send, strict=False):
        if needed:
            codec.skip_frame = "DEFAULT" if packet.pts in wanted_pts else "NONREF"
            keep(codec.decode(packet))
            if len(got) == len(wanted_pts):
                return got
    keep(codec.decode(None))  # flush the frames the decoder still holds back for reordering
    return got
