"""Evaluation's metrics: retrieval ranks and recall, top-k VTM re-ranking, QA accuracy. Pure functions (no files,
no drawing); :mod:`vlp.report` renders them."""

from vlp.eval.qa import answer_type_map, build_answer_vocab, normalize_answer, qa_metrics
from vlp.eval.retrieval import (
    Reranked,
    candidate_pairs,
    full_rerank,
    rank_summary,
    ranks_t2v,
    ranks_v2t,
    retrieval_metrics,
    topk_rerank,
)

__all__ = [
    "Reranked",
    "answer_type_map",
    "build_answer_vocab",
    "candidate_pairs",
    "full_rerank",
    "normalize_answer",
    "qa_metrics",
    "rank_summary",
    "ranks_t2v",
    "ranks_v2t",
    "retrieval_metrics",
    "topk_rerank",
]
