"""``vlp search``: the clips of an index that best match a text, scored as ``evaluate-retrieval`` scores them.

Two stages. The first ranks every row by the dot product of the query's feature with the clip's ``vector`` and
keeps ``max(k, index.candidates)`` candidates (exactly, or through the ANN index of a large index). The exact
stage scores the candidates with the family's ``similarity`` (TS2-Net: its frame score over the clip's frame
features) and, for a model that re-ranks (ALPRO's VTM, ALBEF's ITM), fuses the query with each of its top
``retrieval.rerank_k`` candidates by similarity and scores the pair with ``retrieval.score_rule``, through
:func:`vlp.eval.retrieval.topk_rerank` as the evaluation does. Hits are ordered by that score; candidates past
``rerank_k`` follow in similarity order and have no score. ``retrieval.rescore`` is not applied: it normalises
over every query of a test set at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from vlp import storage
from vlp.config import Config, validate
from vlp.data.frames import FrameStore
from vlp.distributed import device
from vlp.eval.retrieval import topk_rerank
from vlp.index.store import ClipIndex, fingerprint, precision_of
from vlp.inference import StoreClips, encode_clips, encode_texts, pair_scorer, retrieval_kinds, text_length
from vlp.models import directory
from vlp.models.family import Encoded, pair_scorer_of
from vlp.text import checked_text

MAX_K = 1000


@dataclass(frozen=True)
class Hit:
    """One clip a search returns: its 1-based ``rank``, ``score`` (the re-ranking score, or the similarity for a
    model that does not re-rank; None past ``retrieval.rerank_k``) and ``similarity`` (the family's unimodal
    score)."""

    rank: int
    video_id: str
    score: float | None
    similarity: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Searcher:
    """An index with the model that built it, loaded once, for any number of queries.

    ``model``, when given, is a copy of that model (an MLflow artifact, a moved directory) to load instead of the
    directory the index names; either way its weights must be the ones the index was built with.

    Raises:
        FileNotFoundError: there is no index at ``index``, or its model directory is gone.
        ValueError: the model directory holds other weights than the index was built with.
    """

    def __init__(self, index: str, cfg: Config, model: str = "") -> None:

        validate(cfg)
        storage.configure(cfg.storage)
        self.cfg, self.index = cfg, ClipIndex.open(index)
        built = self.index.info
        where = model or built.model
        self.info = directory.describe(where, retrieval_kinds())
        if fingerprint(self.info) != built.fingerprint:
            raise ValueError(
                f"the model directory {where} holds other weights than the ones the index {index} was built "
                "with: rebuild the index into a new --out with `vlp index`"
            )
        self.net, self.tok, self.fam = self.info.load(device()), self.info.text_ids(), self.info.family
        self.length = text_length(cfg.retrieval, self.info.config)
        # the index's precision, not this config's: a query scores as evaluate-retrieval scored the index's clips
        self.precision = precision_of(built.sampling)
        self._clips: Any = None  # the index's frames store, read as the index read it (:meth:`_tokens`)

    @torch.no_grad()
    def search(self, query: str, k: int = 10) -> list[Hit]:
        """The ``k`` best clips for ``query``, best first.

        Raises:
            ValueError: a query that is empty, not valid UTF-8 or over ``index.max_text_chars`` characters
                (:class:`vlp.text.TextError`), or ``k`` outside ``1..MAX_K``.
        """

        checked_text(query, "query", self.cfg.index.max_text_chars)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ValueError(f"k must be an integer in 1..{MAX_K}, got {k!r}")
        rc, fam, net, precision = self.cfg.retrieval, self.fam, self.net, self.precision
        text = encode_texts(fam, net, self.tok, [query], self.length, rc.eval_batch_size, precision)
        ids, vectors, tokens = self.index.nearest(text.feat[0].numpy(), max(k, self.cfg.index.candidates))
        if not ids:
            return []
        clips = Encoded(torch.from_numpy(vectors), self._tokens(ids, tokens))
        sim = fam.similarity(net, text, clips).float().cpu()  # (1, C)
        score = sim[0].clone()
        fused_pass = pair_scorer_of(fam, net)  # None: the similarity ranking is final
        if fused_pass is not None:
            top = sim[0].topk(min(rc.rerank_k, len(ids))).indices
            scorer = pair_scorer(fused_pass, net, text, Encoded(clips.feat[top], clips.tokens[top]), precision)
            fused = topk_rerank(sim[:, top], len(top), scorer, batch_size=rc.eval_batch_size, rule=rc.score_rule)
            score = torch.full_like(score, float("-inf"))
            score[top] = fused.scores[0]
        order = sorted(range(len(ids)), key=lambda i: (-float(score[i]), -float(sim[0, i])))[:k]
        return [
            Hit(rank, ids[i], float(score[i]) if torch.isfinite(score[i]) else None, float(sim[0, i]))
            for rank, i in enumerate(order, start=1)
        ]

    def _tokens(self, ids: list[str], stored: Any) -> torch.Tensor:
        """The candidates' token features: the stored ones, or encoded again from the frames as the index did, on
        this thread: loader workers for a query's few candidates would cost more to start than they save, and a
        server would fork itself, LanceDB's runtime and all, on every query."""
        if stored is not None:
            return torch.from_numpy(stored)

        built = self.index.info
        if self._clips is None:  # opened once: its index read and its check for links are not repeated per query
            self._clips = StoreClips(FrameStore(built.frames, cache_shards=64), built.sampling, self.info.config)
        data = self._clips
        here = replace(self.cfg, retrieval=replace(self.cfg.retrieval, num_workers=0, eval_precision=self.precision))
        enc = encode_clips(self.fam, self.net, data, ids, self.cfg.retrieval.eval_batch_size, here)
        return enc.tokens


def search(index: str, query: str, k: int, cfg: Config) -> list[Hit]:
    """:meth:`Searcher.search` once (the model loaded for this query alone; the query checked before it is)."""
    checked_text(query, "query", cfg.index.max_text_chars)
    return Searcher(index, cfg).search(query, k)
