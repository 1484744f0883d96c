"""The KServe model of ``vlp serve``: an index's :class:`vlp.index.query.Searcher` behind the Open Inference
Protocol (v2) and KServe's v1 protocol.

v2 request: an input tensor ``text`` (``BYTES``, shape ``[n]``: one query each, at most :data:`MAX_QUERIES`) and
the request parameter ``k`` (hits per query, 1..1000, default 10). Response: three tensors of shape ``[n, m]``, row
``i`` the hits of query ``i`` best first, ``m = min(k, clips in the index)``: ``video_id`` (``BYTES``), ``score``
(``FP32``, the re-ranking score; NaN for a hit past ``retrieval.rerank_k``, which has none: JSON has no NaN, so a
JSON response carries ``null`` there and a binary one the NaN) and ``similarity`` (``FP32``). v1 request:
``{"instances": [{"text": ..., "k": ...}, ...]}`` (``k`` optional); response ``{"predictions": [[hit, ...], ...]}``
with :meth:`vlp.index.query.Hit.as_dict` hits.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import numpy as np

from vlp.config import Config
from vlp.index.query import Hit, Searcher
from vlp.serve.sdk import InferOutput, InferRequest, InferResponse, InvalidInput, Model
from vlp.text import checked_text

NAME = "vlp-search"
DEFAULT_K = 10
MAX_QUERIES = 64  # texts in one inference request
INPUT = {"name": "text", "datatype": "BYTES", "shape": [-1]}  # the one v2 input tensor, as the metadata declares it

T = TypeVar("T")


class Answerer(Protocol):
    """What ``POST /api/answer`` asks: any object with this method (a QA model loaded once).

    ``answer`` returns the ``k`` most probable answers to ``question`` about the clip ``video_id``, most probable
    first, each ``{"answer": str, "probability": float}``; it raises ``KeyError`` for a clip it does not know and
    ``ValueError`` for a question or ``k`` it refuses.
    """

    def answer(self, video_id: str, question: str, k: int) -> list[dict[str, Any]]: ...


class SearchModel(Model):
    """``vlp serve``'s KServe model: :meth:`load` opens the index and its model once; :meth:`predict` answers v2
    and v1 inference requests (see the module's docstring). Searches, and any other model call passed to
    :meth:`run`, run one at a time on a worker thread, so the event loop keeps answering health checks."""

    def __init__(self, index: str, cfg: Config, name: str = NAME) -> None:
        super().__init__(name)
        self.index_uri, self.cfg = index, cfg
        self.searcher: Searcher | None = None
        self._lock = threading.Lock()

    def load(self) -> bool:
        """Open the index and load the model that built it (:class:`Searcher`'s errors propagate)."""
        self.searcher = Searcher(self.index_uri, self.cfg)
        self.ready = True
        return self.ready

    def get_input_types(self) -> list[dict[str, Any]]:
        return [dict(INPUT)]

    def get_output_types(self) -> list[dict[str, Any]]:
        return [
            {"name": "video_id", "datatype": "BYTES", "shape": [-1, -1]},
            {"name": "score", "datatype": "FP32", "shape": [-1, -1]},
            {"name": "similarity", "datatype": "FP32", "shape": [-1, -1]},
        ]

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread, one such call at a time."""

        def exclusive() -> T:
            with self._lock:
                return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(None, exclusive)

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """The hits of each query, as :meth:`Searcher.search` ranks them.

        Raises:
            ValueError: a query that is empty, not valid UTF-8 or too long (:func:`vlp.text.checked_text`), too many
                queries, or ``k`` outside 1..1000.
        """
        if self.searcher is None:
            raise RuntimeError("the model is not loaded: call load() first")
        if not queries or len(queries) > MAX_QUERIES:
            raise ValueError(f"expected 1..{MAX_QUERIES} texts, got {len(queries)}")
        for query in queries:
            checked_text(query, "query", self.cfg.index.max_text_chars)
        searcher = self.searcher
        return await self.run(lambda: [searcher.search(q, k) for q in queries])

    async def predict(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        try:
            if isinstance(payload, InferRequest):
                queries, k = _v2_queries(payload)
                return _v2_response(payload, self.name, await self.search(queries, k))
            if isinstance(payload, dict) and isinstance(payload.get("instances"), list):
                return {"predictions": await self._v1(payload["instances"])}
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        raise InvalidInput('expected a v2 inference request, or a v1 body {"instances": [{"text": ..., "k": ...}]}')

    async def _v1(self, instances: list[Any]) -> list[list[dict[str, Any]]]:
        if not instances or len(instances) > MAX_QUERIES:
            raise ValueError(f"expected 1..{MAX_QUERIES} instances, got {len(instances)}")
        out = []
        for instance in instances:
            if not isinstance(instance, dict) or not isinstance(instance.get("text"), str):
                raise ValueError('each instance must be an object {"text": str, "k": int (optional)}')
            hits = await self.search([instance["text"]], instance.get("k", DEFAULT_K))
            out.append([hit.as_dict() for hit in hits[0]])
        return out


def _v2_queries(request: Any) -> tuple[list[str], int]:
    """The query texts and ``k`` of a v2 request, its inputs checked against what the model's metadata declares
    (:data:`INPUT`: one tensor ``text``, ``BYTES``, of rank 1 and at least one element)."""
    names = [i.name for i in request.inputs]
    if "text" not in names:
        raise ValueError('expected an input tensor "text" (BYTES, shape [n]: one query each)')
    if names != ["text"]:
        raise ValueError(f'expected one input tensor, "text" (BYTES, shape [n]); got {len(names)}: {names}')
    text = request.inputs[0]
    if text.datatype != INPUT["datatype"]:
        raise ValueError(f'the input "text" must be BYTES, got {text.datatype}')
    shape = list(text.shape)
    if len(shape) != 1 or isinstance(shape[0], bool) or not isinstance(shape[0], int) or shape[0] < 1:
        raise ValueError(f'the input "text" must have shape [n], n >= 1 (one query each); got {shape}')
    try:
        values = text.as_numpy().reshape(-1).tolist()
    except ValueError:
        raise ValueError(f'the input "text" does not hold as many texts as its shape {text.shape} says') from None
    if len(values) != shape[0]:
        raise ValueError(f'the input "text" does not hold as many texts as its shape {text.shape} says')
    queries = []
    for value in values:
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError('the input "text" holds bytes that are not UTF-8') from None
        if not isinstance(value, str):
            raise ValueError(f'the input "text" must hold strings, got {type(value).__name__}')
        queries.append(value)
    params = request.parameters or {}
    return queries, params.get("k", DEFAULT_K)


def _v2_response(request: Any, name: str, hits: list[list[Hit]]) -> Any:
    """The ``[n, m]`` output tensors of ``hits`` (a shorter row is padded with ``""`` and NaN)."""
    n, m = len(hits), max(len(row) for row in hits)
    ids = np.full((n, m), "", dtype=object)
    score = np.full((n, m), np.nan, dtype=np.float32)
    similarity = np.full((n, m), np.nan, dtype=np.float32)
    for i, row in enumerate(hits):
        for j, hit in enumerate(row):
            ids[i, j] = hit.video_id
            score[i, j] = np.nan if hit.score is None else hit.score
            similarity[i, j] = hit.similarity
    outputs = [
        InferOutput("video_id", [n, m], "BYTES", ids),
        InferOutput("score", [n, m], "FP32", score),
        InferOutput("similarity", [n, m], "FP32", similarity),
    ]
    return InferResponse(
        response_id=request.id or str(uuid.uuid4()),
        model_name=name,
        infer_outputs=outputs,
        use_binary_outputs=request.use_binary_outputs,
        requested_outputs=request.request_outputs,
    )
