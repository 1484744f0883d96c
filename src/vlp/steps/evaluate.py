"""Evaluation steps: ``evaluate-retrieval`` (fine-tuned or zero-shot) and ``evaluate-qa``.

Retrieval scoring (ALPRO §4.1, made cheaper): unimodal features of every text and clip are computed
once; the contrastive similarity picks each query's top-``retrieval.rerank_k`` candidates in both directions;
the matching head (ALPRO's VTM) re-scores only the union of those pairs, each fused once
(:func:`vlp.eval.retrieval.topk_rerank`). ``rerank_k`` >= the number of items reproduces the released code's full
N x N scoring exactly. Zero-shot evaluation is this step on a ``pretrain`` output.

Outputs: ``metrics.json`` (flat floats), ``report.md`` + ``report.html``, and ``ranks.parquet``
(retrieval) or ``predictions.parquet`` (QA).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import torch

from vlp import storage
from vlp.config import Config
from vlp.data import manifest
from vlp.data.loader import ordered_batches
from vlp.data.video_text import VideoQADataset, normalize_answer
from vlp.distributed import device
from vlp.eval.qa import majority_answer, qa_baselines, qa_metrics
from vlp.eval.retrieval import (
    chance_metrics,
    heldout_vtm,
    ranks_t2v,
    rescore,
    rescored_metrics,
    retrieval_metrics,
    topk_rerank,
)
from vlp.inference import (
    answer_probabilities,
    qa_kinds,
    question_tokens,
    retrieval_kinds,
    text_length,
)
from vlp.inference import encode_clips as _encode_clips
from vlp.inference import encode_texts as _encode_texts
from vlp.inference import pair_scorer as _pair_scorer
from vlp.inference import progress as _progress
from vlp.inference import thumbnail as _thumbnail
from vlp.inputs import ModelInput, check_inputs
from vlp.models import family
from vlp.report import qa_report, retrieval_report
from vlp.steps.common import StepResult, run_step
from vlp.steps.finetune import retrieval_data, task_data
from vlp.train.loop import compile_blocks

if TYPE_CHECKING:
    from vlp.models.family import AnswersQuestions

log = logging.getLogger("vlp")
METRICS_FILE = "metrics.json"


def _write_outputs(out: str, metrics: dict[str, float], table: pa.Table, table_name: str, report: Callable) -> None:
    """metrics.json + the Parquet table + report.md/.html (rendered locally, then copied to ``out``)."""
    storage.write_text(storage.join(out, METRICS_FILE), json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    storage.write_parquet(storage.join(out, table_name), table)
    with tempfile.TemporaryDirectory(prefix="vlp-report-") as tmp:
        for path in report(tmp):
            storage.upload(str(path), storage.join(out, Path(path).relative_to(tmp).as_posix()))


def evaluate_retrieval(dataset: str, frames: str, model: str, out: str, cfg: Config) -> StepResult:
    """Text->video and video->text retrieval metrics of a pre-trained (zero-shot) or fine-tuned model."""
    work = partial(_evaluate_retrieval, dataset, frames, model, out, cfg)
    return run_step("evaluate_retrieval", out, cfg, "retrieval", work)


@dataclass
class _Scored:
    """A retrieval evaluation's figures and what its outputs are made from."""

    metrics: dict[str, float]
    scores: torch.Tensor  # (texts, clips): the final ranking's scores, text->video
    text_video: torch.Tensor  # (texts,): each text's clip, an index into video_ids
    video_ids: list[str]
    pairs: int  # pairs the pair scorer re-scored


def _evaluate_retrieval(dataset: str, frames: str, model: str, out: str, cfg: Config) -> StepResult:
    rc = cfg.retrieval
    models = [ModelInput("--model", model, retrieval_kinds)]
    inputs = check_inputs(dataset, frames, split=rc.split, setting="retrieval.split", models=models)
    info = inputs.models[0]
    data = retrieval_data(cfg, dataset, inputs.store, info.config, rc.split, training=False)
    net = info.load(device())
    if rc.compile:
        compile_blocks(net, "evaluate-retrieval")
    scored = _score_retrieval(cfg, info, net, data)
    metrics = scored.metrics
    table, examples = _ranks_table(data, scored.scores, scored.text_video, scored.video_ids, rc.report_examples)
    report = partial(_retrieval_report, metrics, ranks_t2v(scored.scores, scored.text_video), examples)
    _write_outputs(out, metrics, table, "ranks.parquet", report)
    warnings = _retrieval_warnings(metrics, scored.pairs)
    _log_retrieval(metrics, "zero-shot" if info.kind == info.family.kinds.pretrained else "fine-tuned")
    return {"metrics": metrics, "model": model, "model_kind": info.kind, "split": rc.split, "warnings": warnings}


def _score_retrieval(cfg: Config, info: Any, net: Any, data: Any) -> _Scored:
    """Every text against every clip of ``data`` by the model's similarity, then (a family with a pair scorer)
    the top ``retrieval.rerank_k`` re-ranked; the metrics of both rankings, held-out VTM and chance beside them."""
    rc, fam, tok = cfg.retrieval, info.family, info.text_ids()
    video_ids = sorted({v for v, _ in data.pairs})
    position = {v: i for i, v in enumerate(video_ids)}
    texts = [t for _, t in data.pairs]
    text_video = torch.tensor([position[v] for v, _ in data.pairs])
    videos = _encode_clips(fam, net, data, video_ids, rc.eval_batch_size, cfg)
    length = text_length(rc, info.config)
    encoded = _encode_texts(fam, net, tok, texts, length, rc.eval_batch_size, rc.eval_precision)
    sim = fam.similarity(net, encoded, videos)  # (T, V)
    pair_scorer = family.pair_scorer_of(fam, net)
    if pair_scorer is not None and rc.rescore != "none":
        raise ValueError(f"retrieval.rescore={rc.rescore} re-scores a similarity ranking; {info.uri} re-ranks with "
                         "its pair scorer (set retrieval.rescore=none)")  # fmt: skip
    scorer = None
    if pair_scorer is None:  # a dot-product family, or trained without VTM: the similarity ranking is final
        log.info("evaluate_retrieval: %s ranks by its similarity (no pair scorer to re-rank with)", info.uri)
        scores, pairs = rescore(sim, rc.rescore, rc.rescore_scale), 0  # the t2v direction's, for the report
    else:
        scorer = _pair_scorer(pair_scorer, net, encoded, videos, rc.eval_precision)
        scores, pairs = topk_rerank(sim, rc.rerank_k, scorer, batch_size=rc.eval_batch_size, rule=rc.score_rule)
    if rc.rescore != "none":  # each direction re-scored over its own queries; the plain ranking stays as vtc_*
        metrics = rescored_metrics(sim, text_video, rc.rescore, rc.rescore_scale)
    else:
        metrics = retrieval_metrics(scores, text_video)
    metrics.update({f"vtc_{k}": v for k, v in retrieval_metrics(sim, text_video).items()})
    if scorer is not None:  # the pair scorer on held-out hard negatives, against the label prior
        metrics.update(heldout_vtm(sim, text_video, scorer, rc.eval_batch_size))
    metrics.update(chance_metrics(text_video, len(video_ids)))
    metrics.update(num_texts=float(len(texts)), num_videos=float(len(video_ids)), pairs_scored=float(pairs))
    return _Scored(metrics, scores, text_video, video_ids, pairs)


def _retrieval_report(metrics: dict[str, float], ranks: torch.Tensor, examples: list, tmp: str) -> list[str]:
    return retrieval_report(metrics, ranks, examples, tmp)


def _retrieval_warnings(metrics: dict[str, float], pairs: int) -> list[str]:
    """What the step's summary warns of: VTM re-ranking that made the ranking worse."""
    if not pairs or metrics["t2v_r1"] >= metrics["vtc_t2v_r1"]:
        return []
    warning = (
        f"VTM re-ranking lowers text->video R@1 below the contrastive ranking it re-ranks "
        f"({metrics['t2v_r1']:.1f} vs vtc_t2v_r1 {metrics['vtc_t2v_r1']:.1f}): the VTM head has not learnt "
        "to match (see benchmarks/probes/vtm_probe.py); retrieval.score_rule=match_plus_sim keeps the similarity"
    )
    log.warning("evaluate_retrieval: %s", warning)
    return [warning]


def _log_retrieval(metrics: dict[str, float], kind: str) -> None:
    log.info(
        "evaluate_retrieval (%s): t2v R@1 %.1f (VTC only %.1f, chance %.1f), v2t R@1 %.1f (chance %.1f)",
        kind, metrics["t2v_r1"], metrics["vtc_t2v_r1"], metrics["chance_t2v_r1"], metrics["v2t_r1"],
        metrics["chance_v2t_r1"],
    )  # fmt: skip
    if "vtm_loss" in metrics:
        log.info(
            "evaluate_retrieval: held-out VTM loss %.3f (label prior %.3f), positives %.0f%% / hard negatives "
            "%.0f%% right", metrics["vtm_loss"], metrics["vtm_loss_prior"], metrics["vtm_pos_acc"],
            metrics["vtm_neg_acc"],
        )  # fmt: skip


def _ranks_table(data: Any, scores: Any, text_video: Any, video_ids: list[str], n_examples: int) -> tuple[Any, list]:
    """Per-text rank table, and the report's example queries with their top-5 clips (middle-frame thumbnails)."""
    ranks = ranks_t2v(scores, text_video)
    top5 = scores.topk(min(5, scores.shape[1]), dim=1)
    table = pa.table(
        {
            "video_id": [v for v, _ in data.pairs],
            "text": [t for _, t in data.pairs],
            "t2v_rank": ranks.tolist(),
            "top5": [[video_ids[j] for j in row] for row in top5.indices.tolist()],
        }
    )
    examples = []
    step = max(1, len(data.pairs) // max(1, n_examples))
    for i in range(0, len(data.pairs), step)[:n_examples]:
        row = [(video_ids[j], float(s), _thumbnail(data.store, video_ids[j])) for j, s in
               zip(top5.indices[i].tolist(), top5.values[i].tolist(), strict=True)]  # fmt: skip
        examples.append({"query": data.pairs[i][1], "correct_video": data.pairs[i][0], "top5": row})
    return table, examples


def evaluate_qa(dataset: str, frames: str, model: str, out: str, cfg: Config) -> StepResult:
    """Open-ended QA accuracy (overall, per answer type; out-of-vocabulary answers count as wrong) of a QA
    fine-tuned model; a model of a family without a QA model is refused (:func:`vlp.models.family.qa_of`)."""
    return run_step("evaluate_qa", out, cfg, "qa", partial(_evaluate_qa, dataset, frames, model, out, cfg))


def _evaluate_qa(dataset: str, frames: str, model: str, out: str, cfg: Config) -> StepResult:
    qc = cfg.qa
    models = [ModelInput("--model", model, qa_kinds, needs=family.qa_of)]
    inputs = check_inputs(dataset, frames, table=manifest.QA, split=qc.split, setting="qa.split", models=models)
    info = inputs.models[0]
    answers, model_cfg = info.answers(), info.config
    data = task_data(VideoQADataset, qc, dataset, inputs.store, model_cfg, qc.split, training=False)
    net, tok = info.load(device()), info.text_ids()
    if qc.compile:
        compile_blocks(net, "evaluate-qa")
    length = text_length(qc, model_cfg)
    preds, confidence = _predict_qa(family.qa_of(info.family), net, tok, data, length, qc.eval_batch_size, cfg)
    predicted = [answers[i] for i in preds]
    gold = [_norm(r["answer"]) for r in data.qa]
    types = [r["answer_type"] for r in data.qa]
    metrics = qa_metrics(predicted, gold, types, answers)
    majority, source = _majority(dataset, answers)
    metrics.update(qa_baselines(gold, answers, majority))
    table = _predictions_table(data.qa, gold, predicted, confidence, set(answers))
    flat = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
    _write_outputs(out, flat, table, "predictions.parquet", partial(_qa_report, metrics, majority))
    log.info(
        "evaluate_qa: accuracy %.1f%% on %d questions (majority answer %r: %.1f%%, chance %.1f%%)",
        100 * flat["accuracy"], len(gold), majority, 100 * flat["majority_accuracy"], 100 * flat["chance_accuracy"],
    )  # fmt: skip
    baseline = {"majority_answer": majority, "majority_from": source}
    return {"metrics": flat, "model": model, "split": qc.split, "baseline": baseline}


def _predictions_table(
    qa: list[dict[str, Any]], gold: list[str], predicted: list[str], confidence: list[float], vocab: set[str]
) -> pa.Table:
    """``predictions.parquet``: each question with its gold and predicted answer, confidence, and whether the gold
    answer is in the model's vocabulary."""
    return pa.table(
        {
            "qa_id": [r["qa_id"] for r in qa],
            "video_id": [r["video_id"] for r in qa],
            "question": [r["question"] for r in qa],
            "answer": gold,
            "answer_type": [r["answer_type"] for r in qa],
            "prediction": predicted,
            "confidence": confidence,
            "correct": [p == g for p, g in zip(predicted, gold, strict=True)],
            "in_vocab": [g in vocab for g in gold],
        }
    )


def _qa_report(metrics: dict[str, Any], majority: str, tmp: str) -> list[str]:
    return qa_report(metrics, tmp, majority_answer=majority)


def _majority(dataset: str, answers: list[str]) -> tuple[str, str]:
    """The majority-answer baseline's guess: the most frequent answer of the dataset's training questions, or,
    without any, the fine-tuning vocabulary's first (``finetune-qa`` orders it by training frequency)."""
    qa = manifest.read(dataset, manifest.QA, manifest.QA_SCHEMA)
    train = [a for a, split in zip(qa["answer"].to_pylist(), qa["split"].to_pylist(), strict=True) if split == "train"]
    if train:
        return majority_answer(train), "train split"
    return answers[0], "answer vocabulary"


def _norm(answer: str) -> str:
    return normalize_answer(answer)


@torch.no_grad()
def _predict_qa(
    fam: AnswersQuestions, net: Any, tok: Any, data: Any, length: int, batch: int, cfg: Config
) -> tuple[list[int], list[float]]:
    def build(indices: Any) -> dict[str, torch.Tensor]:  # in a loader worker
        items = [data[i] for i in indices]
        enc = question_tokens(tok, [it["text"] for it in items], length)
        return {"video": torch.stack([it["video"] for it in items]), **enc}

    preds, conf = [], []
    batches = ordered_batches(len(data), build, batch, cfg.qa)
    for got in _progress(cfg.qa.progress, batches, "questions", -(-len(data) // batch)):
        probs = answer_probabilities(
            fam, net, got["video"], got["input_ids"], got["attention_mask"], cfg.qa.eval_precision
        )
        best = probs.max(-1)
        preds += best.indices.tolist()
        conf += best.values.tolist()
    return preds, conf
