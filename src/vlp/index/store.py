"""The clip table of an index (see :mod:`vlp.index` for what it stores and why) and the checks that keep one
index to one model, one frames store, one sampling and one precision."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast

import numpy as np
import pyarrow as pa

from vlp import storage

TABLE = "clips"
META_KEY = b"vlp.index"
FORMAT = 1
# An ANN search walks the HNSW graphs with a candidate list of ANN_EF entries (at least n * REFINE_FACTOR, which
# LanceDB requires) and re-scores REFINE_FACTOR times the n rows it returns on the stored float32 vectors. Chosen
# with benchmarks/search/bench_index.py at 100,000 clips (docs/guides/search.md, "Measured"): LanceDB's default
# list (about 1.5 * n * refine) gave recall@10 0.92 on clustered data where 1,000 gave 0.98 at p50 < 50 ms; a larger
# refine factor costs time without raising recall once the list is that long.
ANN_EF = 1000
REFINE_FACTOR = 2
_HASH_CHUNK = 8 << 20


@dataclass(frozen=True)
class IndexInfo:
    """How an index's rows were made (the table's ``vlp.index`` metadata).

    Attributes:
        model: the model directory the clips were encoded with (search loads it).
        fingerprint: ``{"family", "kind", "weights_sha256"}`` of that model (:func:`fingerprint`).
        frames: the extract-frames output the clips were read from (the exact stage reads it again when the
            tokens are not stored).
        dim: the size of ``vector``.
        token_shape: ``[N, C]``, a clip's ``Encoded.tokens`` shape.
        tokens_stored: whether the ``tokens`` column holds them (``N * C <= index.max_token_floats`` when the
            index was made).
        sampling: ``{"num_frames", "eval_mode", "seed", "precision"}``, the ``retrieval`` keys the clips were
            sampled with (``seed`` matters only for a random ``eval_mode``) and the ``eval_precision`` they were
            encoded in (absent in an index made before the key: fp32). Search encodes queries in that precision.
        format: this module's :data:`FORMAT`.
    """

    model: str
    fingerprint: dict[str, str]
    frames: str
    dim: int
    token_shape: list[int]
    tokens_stored: bool
    sampling: dict[str, Any]
    format: int = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> IndexInfo:
        try:
            data = json.loads(text)
            if data.get("format") != FORMAT:
                raise ValueError(f"{where}: index format {data.get('format')!r}; this vlp reads format {FORMAT}")
            return cls(**data)
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{where}: its vlp.index metadata is not an index description ({exc})") from None


def weights_sha256(uri: str) -> str:
    """SHA-256 of a file, local or ``s3://``, read in 8 MiB ranges."""
    digest, start = hashlib.sha256(), 0
    while True:
        chunk = storage.read_range(uri, start, _HASH_CHUNK)
        digest.update(chunk)
        start += len(chunk)
        if len(chunk) < _HASH_CHUNK:
            return digest.hexdigest()


def fingerprint(info: Any) -> dict[str, str]:
    """What makes a model's vectors comparable with another's: its family, kind and the SHA-256 of its weights
    (``info`` is a :class:`vlp.models.directory.ModelDir`). A copy of a model directory has the same fingerprint."""
    from vlp.weights import MODEL_FILE  # here: opening an index must not import torch

    sha = weights_sha256(storage.join(info.checkpoint, MODEL_FILE))
    return {"family": info.family.name, "kind": info.kind, "weights_sha256": sha}


def sampling(section: Any) -> dict[str, Any]:
    """How ``evaluate-retrieval`` samples and encodes a clip under the ``retrieval`` config ``section``."""
    return {
        "num_frames": section.num_frames, "eval_mode": section.eval_mode, "seed": section.seed,
        "precision": section.eval_precision,
    }  # fmt: skip


def precision_of(sample: dict[str, Any]) -> Literal["fp32", "bf16"]:
    """The ``eval_precision`` an index's clips were encoded in (an index from before the key existed: fp32).

    Raises:
        ValueError: the index records a precision this version does not know.
    """
    found = sample.get("precision", "fp32")
    if found not in ("fp32", "bf16"):
        raise ValueError(f"the index records eval_precision {found!r}; this version of vlp encodes in fp32 or bf16")
    return cast(Literal["fp32", "bf16"], found)


def _model_words(fp: dict[str, str]) -> str:
    return f"a {fp['family']} {fp['kind']} model, weights sha256 {fp['weights_sha256'][:12]}"


def check_compatible(found: IndexInfo, model: str, fp: dict[str, str], frames: str, sample: dict[str, Any],
                     where: str) -> None:  # fmt: skip
    """Refuse to add clips to the index ``where`` (described by ``found``) that another model, another frames store
    or another sampling would encode: their vectors would not compare with the rows there.

    Raises:
        ValueError: naming what differs and what to do.
    """
    if found.fingerprint != fp:
        raise ValueError(
            f"the index {where} was built by another model: {found.model} ({_model_words(found.fingerprint)}); "
            f"--model {model} is {_model_words(fp)}, whose vectors do not compare with those: index into a new "
            f"--out, or pass --model {found.model}"
        )
    if found.frames.rstrip("/") != frames.rstrip("/"):
        raise ValueError(
            f"the index {where} holds clips of the frames {found.frames}, not of --frames {frames}: index other "
            f"frames into a new --out, or pass --frames {found.frames}"
        )
    keys = ["num_frames", "eval_mode"] + (["seed"] if found.sampling.get("eval_mode") != "uniform" else [])
    if any(found.sampling.get(k) != sample.get(k) for k in keys):
        was = ", ".join(f"retrieval.{k}={found.sampling.get(k)}" for k in keys)
        now = ", ".join(f"retrieval.{k}={sample.get(k)}" for k in keys)
        raise ValueError(
            f"the index {where} sampled its clips with {was}; this config samples them with {now}: set those keys "
            "back, or index into a new --out"
        )
    if precision_of(found.sampling) != precision_of(sample):
        raise ValueError(
            f"the index {where} encoded its clips with retrieval.eval_precision={precision_of(found.sampling)}; "
            f"this config encodes them with retrieval.eval_precision={precision_of(sample)}: set it back, or index "
            "into a new --out"
        )


def _connect(uri: str) -> Any:
    # index_stats without the IVF centroids (unindexed_rows needs counts only): Lance's coming default, which it
    # otherwise warns about on stderr at every call
    os.environ.setdefault("LANCE_INCLUDE_VECTOR_CENTROIDS", "false")
    import lancedb

    return lancedb.connect(uri, storage_options=storage.library_options(uri))


def _escape(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class ClipIndex:
    """The ``clips`` table of the index at ``uri`` (a local directory or an ``s3://`` prefix)."""

    def __init__(self, uri: str, table: Any, info: IndexInfo) -> None:
        self.uri, self.table, self.info = uri, table, info
        self._ann: bool | None = None  # has_ann, asked of the table once (a listing per query, on S3 a request)

    @classmethod
    def exists(cls, uri: str) -> bool:
        """Whether ``uri`` holds an index (its ``clips`` table).

        Raises:
            StorageError: the object store cannot be listed (a missing bucket, bad credentials, no endpoint).
        """
        if storage.local_path(uri) is not None:
            return storage.exists(uri) and TABLE in _connect(uri).list_tables().tables
        try:
            return TABLE in _connect(uri).list_tables().tables
        except ValueError as exc:  # LanceDB reports the object store's errors as ValueError
            raise storage.StorageError(f"cannot list the index {uri}: {' '.join(str(exc).split())[:300]}") from None

    @classmethod
    def open(cls, uri: str) -> ClipIndex:
        """The index at ``uri``.

        Raises:
            FileNotFoundError: there is none.
            ValueError: its metadata is not this vlp's.
        """
        if not cls.exists(uri):
            raise FileNotFoundError(f"{uri} holds no clip index: make one with `vlp index --model M --frames F "
                                    f"--out {uri}`")  # fmt: skip
        storage.refuse_links(uri, "index")
        return cls._of(uri, _connect(uri).open_table(TABLE))

    @classmethod
    def _of(cls, uri: str, table: Any) -> ClipIndex:
        meta = (table.schema.metadata or {}).get(META_KEY)
        if meta is None:
            raise ValueError(f"{uri}: the {TABLE} table has no {META_KEY.decode()} metadata: not made by vlp index")
        return cls(uri, table, IndexInfo.from_json(meta.decode(), uri))

    @classmethod
    def create(cls, uri: str, info: IndexInfo) -> ClipIndex:
        """A new, empty index at ``uri`` described by ``info``; the index another writer made there meanwhile, if one
        did (its :attr:`info` may differ from ``info``: check it with :func:`check_compatible`)."""
        schema = pa.schema(
            [
                pa.field("video_id", pa.string(), nullable=False),
                pa.field("vector", pa.list_(pa.float32(), info.dim), nullable=False),
                pa.field("tokens", pa.list_(pa.float32())),
                pa.field("thumbnail", pa.binary()),
            ],
            metadata={META_KEY: info.to_json().encode()},
        )
        db = _connect(uri)
        try:
            table = db.create_table(TABLE, schema=schema)
        except ValueError as exc:  # LanceDB: "Table 'clips' already exists": another vlp index run made it first
            if "already exists" not in str(exc):
                raise
            return cls._of(uri, db.open_table(TABLE))
        return cls(uri, table, info)

    def count(self) -> int:
        return int(self.table.count_rows())

    def video_ids(self) -> set[str]:
        """The ids of every indexed clip."""
        ids = self.table.search().select(["video_id"]).limit(None).to_arrow()["video_id"]
        return set(ids.to_pylist())

    def add(self, video_ids: Sequence[str], feats: Any, tokens: Any, thumbnails: Sequence[bytes]) -> int:
        """Add the clips the table lacks (by ``video_id``): ``feats`` ``(B, dim)``, ``tokens`` ``(B, N, C)`` (stored
        when :attr:`IndexInfo.tokens_stored`), one JPEG each; every array is written as float32. Returns how many
        rows were added.

        A merge on ``video_id`` rather than an append: two ``vlp index`` runs writing one index at once (both listed
        the clips it lacked before either added any) each add a clip the other has not, and LanceDB retries a merge
        that conflicts with one committed meanwhile against the new table, so no clip is stored twice."""
        n = len(video_ids)
        feats = np.ascontiguousarray(np.asarray(feats, dtype=np.float32))
        if feats.shape != (n, self.info.dim):
            raise ValueError(f"expected {n} vectors of size {self.info.dim}, got {feats.shape}")
        if self.info.tokens_stored:
            flat = np.ascontiguousarray(np.asarray(tokens, dtype=np.float32)).reshape(n, -1)
            per = int(np.prod(self.info.token_shape))
            if flat.shape[1] != per:
                raise ValueError(f"expected tokens of shape {self.info.token_shape} per clip, got {tokens.shape}")
            token_col = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), per).cast(pa.list_(pa.float32()))
        else:
            token_col = pa.nulls(n, pa.list_(pa.float32()))
        rows = pa.table(
            {
                "video_id": pa.array(list(video_ids), pa.string()),
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(feats.ravel()), self.info.dim),
                "tokens": token_col,
                "thumbnail": pa.array(list(thumbnails), pa.binary()),
            },
            schema=self.table.schema,
        )
        done = self.table.merge_insert("video_id").when_not_matched_insert_all().execute(rows)
        return int(done.num_inserted_rows)

    def has_ann(self) -> bool:
        """Whether the table has an ANN index on ``vector``: asked once, then kept (:meth:`build_ann` sets it). An
        index another process builds later goes unnoticed by this handle, whose searches stay exact scans."""
        if self._ann is None:
            self._ann = any("vector" in idx.columns for idx in self.table.list_indices())
        return self._ann

    def build_ann(self) -> None:
        """(Re)build the approximate nearest-neighbour index on ``vector`` over every row: IVF partitions with an
        HNSW graph each over 8-bit quantised vectors, dot product (LanceDB picks the number of partitions)."""
        from lancedb.index import HnswSq

        self.table.create_index("vector", config=HnswSq(distance_type="dot"), replace=True)
        self._ann = True

    def unindexed_rows(self) -> int:
        """Rows the ANN index on ``vector`` does not cover (added since it was built or last extended); every row
        when there is none."""
        for idx in self.table.list_indices():
            if "vector" in idx.columns:
                stats = self.table.index_stats(idx.name)
                return self.count() if stats is None else int(stats.num_unindexed_rows)
        return self.count()

    def extend_ann(self) -> None:
        """Add the rows the ANN index does not cover to it, in its existing partitions with its existing quantiser
        (LanceDB's ``optimize``, which also merges small data files and drops table versions over a week old). Much
        cheaper than :meth:`build_ann`, but the partitions and the quantiser stay fitted to the rows it was built
        on: ``vlp index`` rebuilds once the rows added since reach ``index.ann_rebuild_share`` of the table."""
        self.table.optimize()

    def nearest(self, query: Any, n: int) -> tuple[list[str], np.ndarray, np.ndarray | None]:
        """The first stage: the ``n`` clips whose ``vector`` has the largest dot product with ``query``, best first:
        ``(ids, vectors (n, dim), tokens (n, N, C) or None when not stored)``. Exact over every row without an ANN
        index; with one, its candidates re-scored on the stored vectors (rows added since it was built are
        scanned exactly)."""
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        columns = ["video_id", "vector", *(["tokens"] if self.info.tokens_stored else []), "_distance"]
        search = self.table.search(q, vector_column_name="vector").distance_type("dot").limit(n).select(columns)
        if self.has_ann():
            search = search.ef(max(ANN_EF, n * REFINE_FACTOR)).refine_factor(REFINE_FACTOR)
        else:
            search = search.bypass_vector_index()
        got = search.to_arrow()
        ids = got["video_id"].to_pylist()
        vectors = _matrix(got["vector"], self.info.dim)
        tokens = None
        if self.info.tokens_stored:
            shape = self.info.token_shape
            tokens = _matrix(got["tokens"], int(np.prod(shape))).reshape(len(ids), *shape)
        return ids, vectors, tokens

    def thumbnail(self, video_id: str) -> bytes:
        """The stored JPEG of ``video_id``.

        Raises:
            KeyError: the clip is not indexed.
        """
        got = self.table.search().where(f"video_id = {_escape(video_id)}").select(["thumbnail"]).limit(1).to_arrow()
        if got.num_rows == 0:
            raise KeyError(f"{video_id!r} is not in the index {self.uri}")
        return bytes(got["thumbnail"][0].as_py())


def _matrix(column: Any, width: int) -> np.ndarray:
    """A list column of equal-length float rows as a ``(rows, width)`` float32 array."""
    values = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    flat = np.array(values.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)  # a writable copy
    return flat.reshape(len(values), width)
