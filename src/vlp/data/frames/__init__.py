"""Sparse frame extraction (moving into a package: everything is still in :mod:`vlp.data.frames.write`)."""

from vlp.data.frames.write import (
    FRAME_SCHEMA,
    INDEX,
    INDEX_SCHEMA,
    CorruptClipError,
    FramesConfig,
    FrameStore,
    decode_frames,
    encode_frame,
    extract,
    load_video_frames,
    packet_plan,
    read_sparse,
    stored_indices,
)
from vlp.data.frames.write import (
    _plan_shards as _plan_shards,
)
from vlp.data.frames.write import (
    extract_part as extract_part,
)
from vlp.data.frames.write import (
    merge_parts as merge_parts,
)

__all__ = [
    "FRAME_SCHEMA",
    "INDEX",
    "INDEX_SCHEMA",
    "CorruptClipError",
    "FrameStore",
    "FramesConfig",
    "decode_frames",
    "encode_frame",
    "extract",
    "load_video_frames",
    "packet_plan",
    "read_sparse",
    "stored_indices",
]
