"""What an extract-frames output holds: file names, the Parquet schemas, the shard-name rule.

Shared by the writer (:mod:`vlp.data.frames.write`) and the reader (:mod:`vlp.data.frames.store`); the layout
itself is described in :mod:`vlp.data.frames`.
"""

from __future__ import annotations

import re

import pyarrow as pa

SHARDS_DIR = "shards"
INDEX = "index.parquet"
PART = "part.json"  # what one fan-out part wrote (extract_part), read by merge_parts
FORMAT_VERSION = 2  # bump when the bytes written for the same inputs and settings change (2: a row group per clip)
_META_KEY = b"vlp.frames"
_SHARD_RE = re.compile(r"^shard-\d{5,}-[0-9a-f]{8}\.parquet$")

FRAME_SCHEMA = pa.schema(
    [
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("slot", pa.int32(), nullable=False),  # 0..k-1 in temporal order
        pa.field("frame_index", pa.int64(), nullable=False),  # index of the frame in the source clip
        pa.field("timestamp_s", pa.float64(), nullable=False),  # frame_index / fps (0.0 for stills)
        pa.field("width", pa.int32(), nullable=False),
        pa.field("height", pa.int32(), nullable=False),
        pa.field("jpeg", pa.binary(), nullable=False),
    ]
)

INDEX_SCHEMA = pa.schema(
    [
        pa.field("video_id", pa.string(), nullable=False),
        pa.field("shard", pa.string(), nullable=False),  # relative to the output directory
        pa.field("num_stored", pa.int64(), nullable=False),  # frames stored for the video
        pa.field("num_frames", pa.int64(), nullable=False),  # frames in the source clip (1 for stills)
        pa.field("fps", pa.float64(), nullable=False),  # source frame rate (0.0 for stills)
        pa.field("row_group", pa.int32(), nullable=False),  # the video's row group in its shard
        pa.field("footer_bytes", pa.int32(), nullable=False),  # the shard's footer + 8: what reading it costs
    ]
)
# An index written before row groups per clip (FORMAT_VERSION 1) lacks the last two columns; FrameStore reads its
# shards whole instead. Re-running extract-frames on such an output rewrites it in the current format.
_INDEX_V1_COLUMNS = ("video_id", "shard", "num_stored", "num_frames", "fps")
_V1_SCHEMA = pa.schema([INDEX_SCHEMA.field(name) for name in _INDEX_V1_COLUMNS])


def _is_shard_name(name: str) -> bool:
    """True for ``shards/shard-NNNNN-<hash8>.parquet``, the only names an index may point at."""
    folder, _, base = name.partition("/")
    return folder == SHARDS_DIR and _SHARD_RE.match(base) is not None and "\n" not in base
