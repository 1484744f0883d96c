"""Evaluation: retrieval metrics and top-k VTM re-ranking, QA accuracy, the verdicts against chance and the
majority baseline, and the report files. Pure functions."""

from vlp.eval.qa import answer_type_map, build_answer_vocab, normalize_answer, qa_metrics
from vlp.eval.report import (
    headline_table,
    pem_figure,
    qa_report,
    rank_histogram,
    ranking_is_similarity,
    retrieval_report,
    verdict,
)
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
    "headline_table",
    "normalize_answer",
    "pem_figure",
    "qa_metrics",
    "qa_report",
    "rank_histogram",
    "rank_summary",
    "ranking_is_similarity",
    "ranks_t2v",
    "ranks_v2t",
    "retrieval_metrics",
    "retrieval_report",
    "topk_rerank",
    "verdict",
]
