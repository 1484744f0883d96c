"""Sparse frame extraction: an ingested dataset -> Parquet shards of JPEG frames + an index.

What is stored, and why it is enough
------------------------------------
For every clip we store ``num_frames`` (default 16) frames chosen with the deterministic ``uniform``
rule of :mod:`vlp.data.sampling` over the *whole* clip (the middle frame of each of 16 equal
segments), or every frame when the clip is shorter. Still images (``media == "image"``) store their
one image; the loader repeats it. Each row keeps the source frame index and its nominal timestamp
(``frame_index / fps``).

Training-time samplers (``rand``, ``headtail``, ``uniform``) then run over the *stored* frames.
16 is the most any configuration we reproduce samples per clip (ALPRO: 4 frames in pre-training,
8 or 16 in fine-tuning), so ``uniform`` with k in {1, 2, 4, 8, 16} returns evenly spread stored frames
and, for clips of at least 16 frames, no loader asks for more frames than are stored. What this gives up: ``rand`` and
``headtail`` pick among 16 fixed candidates instead of every frame of the clip, so temporal jitter
(the augmentation) is coarser - 4 frames drawn from 4 stored frames per segment rather than from
~n/4 - and a k-frame ``uniform`` grid lands on the nearest stored frames, up to half a stored segment
away from where it would fall in the full clip. Re-extract with a larger ``num_frames`` if that
matters (shard names change with the settings, so nothing stale is reused).

Output layout (``out`` is a local directory or an ``s3://`` prefix)
------------------------------------------------------------------
``shards/shard-00003-<hash8>.parquet``  rows :data:`FRAME_SCHEMA` for ``videos_per_shard`` videos
(sorted by ``video_id``); the hash covers those videos (id, path, probe numbers) and the extraction
settings. The shard's Parquet key-value metadata carries, as JSON, the per-video counts and the
shard's rejects, so one atomic write records everything about the shard.
``index.parquet``  :data:`INDEX_SCHEMA`, one row per stored video.
``rejects.parquet``  ``manifest.REJECT_SCHEMA`` rows with ``stage="extract_frames"``.

Idempotency: a re-run plans the same shard names, skips every shard that exists (a shard exists only
once completely written: writes are atomic), rewrites the index and rejects from the shards'
metadata when anything changed, and deletes shard files of an older plan (other settings or inputs).
Outputs of a re-run are byte-identical.

Fan-out (:func:`extract_part`, :func:`merge_parts`): on a cluster, pod ``i`` of ``n`` writes the contiguous run of
planned shards that :func:`vlp.data.manifest.part_range` gives it (and ``part.json`` naming them) into its own
output; a merge copies every planned shard from the parts and finishes as a re-run of :func:`extract` that finds
all shards present, so the merged output is byte-identical to one pod's. A part re-run skips its finished shards,
as :func:`extract` does.

Decoding
--------
The default ``decoder="sparse"`` reads with PyAV and plans at the packet level: whole GOPs that hold
no wanted frame are never sent to the decoder, decoding stops after the last wanted frame of a GOP,
non-reference frames that are not wanted are discarded by the decoder unread (``skip_frame=NONREF``),
and only wanted frames are converted to RGB (through one shared SwsContext). It returns the same
pixels as decord (checked in the tests); in ``benchmarks/input/bench_extract.py`` (10 s, 30 fps clips) it
used ~2x less CPU than decord ``get_batch``, which cost about as much as decoding every frame. When it
fails on a file, decord then sequential PyAV are tried (:func:`decode_frames`, through
:func:`vlp.data.video.read_with_fallbacks`); a file all of them fail on becomes a reject whose reason
names each decoder's error. Decoders run single-threaded so that worker processes scale.

Before any decoding a file's size and the frame size its header declares are checked against
``frames.max_bytes`` / ``frames.max_pixels``; with ``workers >= 2`` each file is decoded in a worker
process (:mod:`vlp.data.isolate`), and a file whose decoder crashes its worker or runs past
``frames.timeout_s`` becomes a reject, so one hostile file never fails the step or its reruns.

Where the code lives
--------------------
:mod:`~vlp.data.frames.plan` (the settings, :class:`FramesConfig`, and the plan: videos grouped into content-named
shards, :func:`stored_indices`), :mod:`~vlp.data.frames.write` (the step: :func:`extract`, :func:`extract_part`,
:func:`merge_parts`, writing shards, the index and the rejects), :mod:`~vlp.data.frames.decode` (one video to JPEG
frames: :func:`decode_frames`, :func:`read_sparse`, :func:`packet_plan`, :func:`encode_frame`),
:mod:`~vlp.data.frames.store` (reading back: :class:`FrameStore`) and :mod:`~vlp.data.frames.layout` (file names
and schemas both sides share). Everything named here is importable from :mod:`vlp.data.frames` itself.
"""

from vlp.data.frames.decode import decode_frames, encode_frame, packet_plan, read_sparse
from vlp.data.frames.layout import FORMAT_VERSION as FORMAT_VERSION
from vlp.data.frames.layout import FRAME_SCHEMA, INDEX, INDEX_SCHEMA
from vlp.data.frames.layout import PART as PART
from vlp.data.frames.layout import SHARDS_DIR as SHARDS_DIR
from vlp.data.frames.plan import FramesConfig, stored_indices
from vlp.data.frames.plan import _plan_shards as _plan_shards
from vlp.data.frames.store import CorruptClipError, FrameStore, load_video_frames
from vlp.data.frames.write import extract
from vlp.data.frames.write import extract_part as extract_part
from vlp.data.frames.write import merge_parts as merge_parts

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
