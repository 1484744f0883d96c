"""Reading the frames back: :class:`FrameStore`, what training code reads an extract-frames output with."""

from __future__ import annotations

import collections
import io
import itertools
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from vlp import storage
from vlp.data import manifest, video
from vlp.data.frames.layout import (
    _INDEX_V1_COLUMNS,
    _META_KEY,
    _V1_SCHEMA,
    INDEX,
    INDEX_SCHEMA,
    SHARDS_DIR,
    _is_shard_name,
)
from vlp.data.sampling import sample_indices


class CorruptClipError(ValueError):
    """A stored clip that cannot be decoded (a damaged JPEG, or a row group that is not the clip's)."""


class FrameStore:
    """Read access to an extract-frames output for training code.

    ``FrameStore(out).load(video_id)`` -> ``(k, H, W, 3)`` uint8 RGB, frames in temporal order.

    What a clip costs: shards hold one row group per clip (``FORMAT_VERSION`` 2), so a clip is one ranged read of
    its row group's column chunks (the frames' JPEG bytes plus about a hundred bytes), after the shard's footer
    (about 460 bytes per clip of the shard; its exact size is in the index, so it too is one read). Footers are
    cached (the ``cache_footers`` most recently used shards): reading the clips of a shard one after another reads
    its footer once. An output written before row groups per clip (its index lacks ``row_group``) is read a whole
    shard at a time into a cache of ``cache_shards`` shards, as vlp did then; re-running ``extract-frames`` on it
    rewrites it in the current format.

    The index is held as NumPy arrays (no Python object per clip): the sorted ids as fixed-width bytes, the shard
    as a code into the list of shard names, and the counts; ``bytes_per_clip`` says what that costs. Forked
    loader workers share those pages instead of copying them.
    """

    def __init__(self, out: str, cache_shards: int = 2, cache_footers: int = 1024) -> None:
        self.out = out
        storage.refuse_links(out, "frames store")
        uri = storage.join(out, INDEX)
        if not storage.exists(uri):
            raise FileNotFoundError(f"{uri} does not exist: run `vlp extract-frames --out {out}` first")
        table = storage.read_parquet(uri)
        missing = [c for c in _INDEX_V1_COLUMNS if c not in table.column_names]
        if missing:
            raise manifest.ManifestError(f"{uri}: missing column(s) {missing}; has {table.column_names}")
        self._load_index(uri, table)
        self._footers: collections.OrderedDict[str, tuple[storage.ParquetFooter, dict[int, str]]] = (
            collections.OrderedDict()
        )
        self._cache: collections.OrderedDict[str, tuple[pa.Table, dict[str, tuple[int, int]]]] = (
            collections.OrderedDict()
        )
        self._cache_shards, self._cache_footers = max(1, cache_shards), max(1, cache_footers)

    def _load_index(self, uri: str, table: pa.Table) -> None:
        has_groups = "row_group" in table.column_names and "footer_bytes" in table.column_names
        table = manifest.check_schema(table, INDEX_SCHEMA if has_groups else _V1_SCHEMA, uri)
        ids = np.array([v.encode() for v in table.column("video_id").to_pylist()], dtype=bytes)
        if len(ids) == 0:
            ids = np.zeros(0, dtype="S1")
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        if len(ids) > 1 and (ids[1:] == ids[:-1]).any():
            dupe = ids[1:][ids[1:] == ids[:-1]][0].decode()
            raise manifest.ManifestError(f"{uri}: video {dupe!r} is listed twice")
        codes = table.column("shard").dictionary_encode().combine_chunks()
        self._shard_names: list[str] = codes.dictionary.to_pylist()
        bad = next((name for name in self._shard_names if not _is_shard_name(name)), None)
        if bad is not None:  # the index names files relative to `out`: only names extract-frames writes
            raise manifest.ManifestError(
                f"{uri}: {bad!r} is not a shard name ({SHARDS_DIR}/shard-NNNNN-<hash>.parquet)"
            )

        def column(name: str, dtype: Any) -> np.ndarray:
            return table.column(name).to_numpy().astype(dtype, copy=False)[order]

        self._ids = ids
        self._shard = codes.indices.to_numpy().astype(np.int32)[order]
        self._num_stored = column("num_stored", np.int32)
        self._num_frames = column("num_frames", np.int64)
        self._fps = column("fps", np.float64)
        n = len(ids)
        self._row_group = column("row_group", np.int32) if has_groups else np.full(n, -1, np.int32)
        self._footer_bytes = column("footer_bytes", np.int32) if has_groups else np.zeros(n, np.int32)

    @property
    def bytes_per_clip(self) -> float:
        """Memory the index takes per stored clip, in bytes (its arrays; the shard names are counted too)."""
        arrays = (self._ids, self._shard, self._num_stored, self._num_frames, self._fps, self._row_group,
                  self._footer_bytes)  # fmt: skip
        names = sum(len(name) + 56 for name in self._shard_names)  # a Python str's header is about 56 bytes
        return (sum(a.nbytes for a in arrays) + names) / max(1, len(self))

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, video_id: object) -> bool:
        return isinstance(video_id, str) and self._find(video_id) >= 0

    @property
    def video_ids(self) -> list[str]:
        """Ids of the stored videos, sorted (by their UTF-8 bytes)."""
        return [v.decode() for v in self._ids]

    def positions(self, video_ids: Sequence[str]) -> np.ndarray:
        """Each id's row in the store's sorted index (-1 where it has no frames): int64, one lookup for all."""
        keys = np.array([v.encode() for v in video_ids], dtype=bytes) if len(video_ids) else np.zeros(0, "S1")
        if len(self._ids) == 0:
            return np.full(len(keys), -1, np.int64)
        at = np.searchsorted(self._ids, keys).clip(0, len(self._ids) - 1)
        return np.where(self._ids[at] == keys, at, -1).astype(np.int64)

    def _find(self, video_id: str) -> int:
        key = video_id.encode()
        at = int(np.searchsorted(self._ids, key))
        return at if at < len(self._ids) and self._ids[at] == key else -1

    def _row(self, video_id: str) -> int:
        row = self._find(video_id)
        if row < 0:
            raise KeyError(f"video {video_id!r} is not in {self.out}/{INDEX} (rejected, or not in the dataset)")
        return row

    def info(self, video_id: str) -> dict[str, Any]:
        """The index row of ``video_id``: shard, num_stored, num_frames, fps, row_group (-1: read the shard whole)."""
        row = self._row(video_id)
        return {
            "video_id": video_id,
            "shard": self._shard_names[self._shard[row]],
            "num_stored": int(self._num_stored[row]),
            "num_frames": int(self._num_frames[row]),
            "fps": float(self._fps[row]),
            "row_group": int(self._row_group[row]),
        }

    def num_stored(self, video_id: str) -> int:
        """Frames stored for ``video_id``."""
        return int(self._num_stored[self._row(video_id)])

    def shard_of(self, video_ids: Sequence[str]) -> np.ndarray:
        """The shard number (a code, equal for clips of one shard) of each of ``video_ids``: int64."""
        rows = self.positions(video_ids)
        if (rows < 0).any():
            raise KeyError(f"video {video_ids[int(np.argmax(rows < 0))]!r} is not in {self.out}/{INDEX}")
        return self._shard[rows].astype(np.int64)

    def rows(self, video_id: str, columns: Sequence[str] | None = None) -> pa.Table:
        """The :data:`~vlp.data.frames.FRAME_SCHEMA` rows of ``video_id`` (``columns`` of them), ordered by slot."""
        row = self._row(video_id)
        shard = self._shard_names[self._shard[row]]
        group = int(self._row_group[row])
        if group < 0:  # an output written before row groups per clip
            table, spans = self._shard_table(shard)
            start, length = spans[video_id]
            rows = table.slice(start, length)
            return rows if columns is None else rows.select(list(columns))
        uri = storage.join(self.out, shard)
        footer, owners = self._footer(uri, int(self._footer_bytes[row]))
        rows = storage.read_row_groups(uri, [group], None if columns is None else list(columns), footer=footer)
        if rows.num_rows != self._num_stored[row] or owners.get(group) != video_id:  # the shard's own record
            raise CorruptClipError(
                f"{uri}: row group {group} does not hold the {self._num_stored[row]} frames of video {video_id!r} "
                f"the index says it does (the index and the shard disagree: re-run extract-frames)"
            )
        return rows

    def load(self, video_id: str, slots: Sequence[int] | None = None) -> np.ndarray:
        """Decoded frames of ``video_id`` (all stored, or ``slots`` in that order) -> ``(k, H, W, 3)`` uint8.

        Raises:
            CorruptClipError: a chosen frame's JPEG does not decode; the message names the clip, shard and slot.
        """
        from PIL import Image

        jpegs = self.rows(video_id, ["jpeg"]).column("jpeg").to_pylist()
        chosen = range(len(jpegs)) if slots is None else slots
        frames = []
        for slot in chosen:
            try:
                frames.append(np.asarray(Image.open(io.BytesIO(jpegs[slot])).convert("RGB")))
            except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError ... for damaged data
                shard = self._shard_names[self._shard[self._row(video_id)]]
                why = video.short_reason(exc, 120)
                raise CorruptClipError(
                    f"video {video_id!r} ({shard}, slot {slot}): its JPEG does not decode: {why}"
                ) from exc
        return np.stack(frames)

    def sample(self, video_id: str, num_frames: int, mode: str = "uniform", rng: Any = None) -> np.ndarray:
        """``num_frames`` stored frames chosen by sampler ``mode`` (see :mod:`vlp.data.sampling`)."""
        return self.load(video_id, sample_indices(self.num_stored(video_id), num_frames, mode, rng))

    def _footer(self, uri: str, footer_bytes: int) -> tuple[storage.ParquetFooter, dict[int, str]]:
        """A shard's footer and the video of each row group (from its ``vlp.frames`` metadata), cached."""
        if uri in self._footers:
            self._footers.move_to_end(uri)
            return self._footers[uri]
        footer = storage.parquet_footer(uri, tail=footer_bytes or storage.FOOTER_GUESS)
        raw = (footer.metadata.metadata or {}).get(_META_KEY)
        videos = json.loads(raw)["videos"] if raw else []
        owners = {int(v["row_group"]): v["video_id"] for v in videos if "row_group" in v}
        self._footers[uri] = (footer, owners)
        while len(self._footers) > self._cache_footers:
            self._footers.popitem(last=False)
        return footer, owners

    def _shard_table(self, shard: str) -> tuple[pa.Table, dict[str, tuple[int, int]]]:
        if shard in self._cache:
            self._cache.move_to_end(shard)
            return self._cache[shard]
        table = storage.read_parquet(storage.join(self.out, shard))
        ids = table.column("video_id").to_pylist()
        spans: dict[str, tuple[int, int]] = {}
        for vid, group in itertools.groupby(range(len(ids)), key=ids.__getitem__):
            members = list(group)
            spans[vid] = (members[0], len(members))
        self._cache[shard] = (table, spans)
        while len(self._cache) > self._cache_shards:
            self._cache.popitem(last=False)
        return self._cache[shard]


def load_video_frames(out: str, video_id: str) -> np.ndarray:
    """All stored frames of one video -> ``(k, H, W, 3)`` uint8 RGB.

    Opens the index on every call; use :class:`FrameStore` when reading many videos.
    """
    return FrameStore(out, cache_shards=1).load(video_id)
