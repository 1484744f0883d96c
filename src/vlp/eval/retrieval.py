"""Text-video retrieval metrics and top-k re-ranking with the VTM head. Pure functions, no model inside.

Conventions used throughout:

* A score matrix is ``(T, V)``: row = text (query for text->video), column = video. Higher is better.
  ``-inf`` is allowed (a pair that was never scored); ``NaN`` is rejected.
* ``text_video[t]`` is the index of the video that text ``t`` describes (several texts may share a video).
* Ranks are 1-based and **pessimistic on ties**: the rank of the correct item is the number of candidates
  whose score is ``>=`` the correct score, the correct one included. A constant scorer therefore gets rank
  ``V`` (the worst), never 1, and a re-ranked matrix padded with ``-inf`` cannot rank an unscored correct
  pair above anything.
* Median rank is the numpy median: for an even number of ranks, the mean of the two middle values
  (as ``np.median``, which CLIP4Clip/Frozen-style retrieval evaluation uses), so it can end in ``.5``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "RULES",
    "Reranked",
    "candidate_pairs",
    "chance_metrics",
    "full_rerank",
    "heldout_vtm",
    "rank_summary",
    "ranks_t2v",
    "ranks_v2t",
    "retrieval_metrics",
    "topk_rerank",
]

PairScorer = Callable[[Tensor, Tensor], Tensor]
"""``pair_scores(text_idx (P,), video_idx (P,)) -> VTM logits (P, 2)``; column 1 = "match"."""

RULES = ("match", "match_plus_sim")  # retrieval.score_rule: how a re-ranked pair is scored
RECALL_AT = (1, 5, 10)
_CHUNK = 1024  # rows per block in ranks_v2t, bounds memory at _CHUNK * T scores


def _check_inputs(scores: Tensor, text_video: Tensor) -> None:
    if scores.ndim != 2:
        raise ValueError(f"scores must be a (T, V) matrix (row = text, column = video), got {tuple(scores.shape)}")
    n_texts, n_videos = scores.shape
    if text_video.ndim != 1 or text_video.shape[0] != n_texts:
        raise ValueError(
            f"text_video must be a (T,) index vector with T = {n_texts} (one video index per score row), "
            f"got shape {tuple(text_video.shape)}"
        )
    if text_video.dtype.is_floating_point or text_video.dtype == torch.bool:
        raise ValueError(f"text_video must hold integer video indices, got dtype {text_video.dtype}")
    if n_texts and (int(text_video.min()) < 0 or int(text_video.max()) >= n_videos):
        raise ValueError(f"text_video holds video indices outside [0, {n_videos}); check the text->video mapping")
    if torch.isnan(scores).any():
        raise ValueError("scores contain NaN; use -inf for pairs that were not scored")


def ranks_t2v(scores: Tensor, text_video: Tensor) -> Tensor:
    """1-based rank of the correct video for every text query (pessimistic ties).

    Args:
        scores: ``(T, V)`` text-video scores, higher = better match; ``-inf`` allowed.
        text_video: ``(T,)`` int index of the correct video of each text.

    Returns:
        ``(T,)`` int64 ranks in ``[1, V]``: the number of videos scoring ``>=`` the correct one for that text,
        the correct one included (so ties count against the query; a constant row gets rank ``V``).

    Raises:
        ValueError: for a non-2-D matrix, a mismatched or out-of-range ``text_video``, or NaN scores.
    """
    _check_inputs(scores, text_video)
    text_video = text_video.to(device=scores.device, dtype=torch.long)
    correct = scores.gather(1, text_video[:, None])  # (T, 1)
    return (scores >= correct).sum(dim=1).long()  # (T,)


def ranks_v2t(scores: Tensor, text_video: Tensor) -> Tensor:
    """1-based rank of the best-ranked caption of every video, ranked within the video's column of texts.

    A caption ``t`` of video ``v`` is ranked in column ``v`` against the texts that do **not** describe ``v``:
    ``rank(t) = 1 + #{u : text_video[u] != v, scores[u, v] >= scores[t, v]}``, and the video's rank is the
    minimum over its captions. This is the pessimistic-tie rule with several correct items: the first correct
    caption appears at that position under the worst tie-breaking. For distinct scores it equals counting all
    texts ``>=`` the caption; it differs only when two captions of the same video tie exactly, which then
    still gives rank 1 when both are on top (counting own captions would give 2 and miss a correct retrieval).

    Args:
        scores: ``(T, V)`` text-video scores, higher = better; ``-inf`` allowed.
        text_video: ``(T,)`` int index of the video of each text; every video needs at least one text.

    Returns:
        ``(V,)`` int64 ranks in ``[1, T]``.

    Raises:
        ValueError: for bad shapes or NaN (as :func:`ranks_t2v`) or a video without any caption.
    """
    _check_inputs(scores, text_video)
    n_texts, n_videos = scores.shape
    text_video = text_video.to(device=scores.device, dtype=torch.long)
    captions_per_video = torch.bincount(text_video, minlength=n_videos)
    if (captions_per_video == 0).any():
        missing = torch.nonzero(captions_per_video == 0).flatten().tolist()
        raise ValueError(
            f"{len(missing)} video(s) have no caption, so video->text retrieval is undefined for them "
            f"(first indices: {missing[:10]}); drop those columns or add their captions"
        )
    correct = scores.gather(1, text_video[:, None]).squeeze(1)  # (T,)
    caption_ranks = torch.empty(n_texts, dtype=torch.long, device=scores.device)
    columns = scores.t()  # (V, T)
    for start in range(0, n_texts, _CHUNK):
        own_video = text_video[start : start + _CHUNK]  # (C,)
        cols = columns[own_video]  # (C, T): each caption's video column over all texts
        other = own_video[:, None] != text_video[None, :]  # (C, T): texts of a different video
        beats = (cols >= correct[start : start + _CHUNK, None]) & other  # (C, T)
        caption_ranks[start : start + _CHUNK] = 1 + beats.sum(dim=1)
    best = torch.full((n_videos,), n_texts, dtype=torch.long, device=scores.device)
    return best.scatter_reduce(0, text_video, caption_ranks, reduce="amin", include_self=False)


def rank_summary(ranks: Tensor, prefix: str) -> dict[str, float]:
    """R@1/5/10 (percent, 0-100), median rank (numpy median) and mean rank of 1-based ``ranks``.

    Args:
        ranks: ``(N,)`` 1-based integer ranks, ``N >= 1``.
        prefix: key prefix, e.g. ``"t2v"`` gives ``t2v_r1 ... t2v_meanr``.

    Returns:
        ``{prefix_r1, prefix_r5, prefix_r10, prefix_medr, prefix_meanr}`` as plain floats.
    """
    if ranks.numel() == 0:
        raise ValueError("no ranks to summarise: the evaluation set is empty")
    ranks = ranks.detach().cpu().double()
    out = {f"{prefix}_r{k}": float((ranks <= k).double().mean() * 100.0) for k in RECALL_AT}
    out[f"{prefix}_medr"] = float(np.median(ranks.numpy()))  # even N: mean of the two middle ranks
    out[f"{prefix}_meanr"] = float(ranks.mean())
    return out


def retrieval_metrics(scores: Tensor, text_video: Tensor) -> dict[str, float]:
    """Text->video and video->text retrieval metrics of one score matrix.

    Args:
        scores: ``(T, V)`` text-video scores (similarities, VTM scores, or a re-ranked matrix with ``-inf``).
        text_video: ``(T,)`` int index of each text's video; several texts per video are allowed.

    Returns:
        ``t2v_r1, t2v_r5, t2v_r10, t2v_medr, t2v_meanr``, the same five for ``v2t_``, and ``rsum`` (the sum of
        the six recalls). Recalls in percent; ranks 1-based with pessimistic ties (see the module docstring).
    """
    out = rank_summary(ranks_t2v(scores, text_video), "t2v")
    out.update(rank_summary(ranks_v2t(scores, text_video), "v2t"))
    out["rsum"] = sum(out[f"{d}_r{k}"] for d in ("t2v", "v2t") for k in RECALL_AT)
    return out


RESCORE_RULES = ("none", "dual_softmax", "inverted_softmax")


def rescore(scores: Tensor, rule: str, scale: float = 100.0, dim: int = 0) -> Tensor:
    """Test-time re-scoring of a ``(T, V)`` similarity matrix with the statistics of the evaluated set itself.

    - ``dual_softmax`` (CAMoE's DSL at inference): ``s * softmax(scale * s)`` over ``dim``, the other queries'
      scores of the same candidate acting as a prior;
    - ``inverted_softmax`` (Smith et al. 2017, QB-Norm's inverted softmax with the test queries as the bank):
      ``exp(scale * s) / sum over dim of exp(scale * s)``.

    ``dim=0`` normalises over the texts (for text -> video ranking), ``dim=1`` over the videos (video -> text).
    Both need every query at once: they are not available to a single query at serving time, and a figure with
    them is not comparable with one without (TS2-Net reports them apart, its Table 6).
    """
    if rule == "none":
        return scores
    if rule not in RESCORE_RULES or scale <= 0:
        raise ValueError(f"rescore must be one of {RESCORE_RULES} with scale > 0, got {rule!r} / {scale}")
    weights = torch.softmax(scale * scores.double(), dim=dim)
    return (scores.double() * weights if rule == "dual_softmax" else weights).to(scores.dtype)


def rescored_metrics(sim: Tensor, text_video: Tensor, rule: str, scale: float = 100.0) -> dict[str, float]:
    """:func:`retrieval_metrics` with each direction ranked on its own :func:`rescore` of ``sim``, and
    ``rescored: 1.0``, which records that these figures rank a re-scored matrix, not ``sim`` itself (the reports
    read it: :func:`vlp.report.ranking_is_similarity`)."""
    t2v = retrieval_metrics(rescore(sim, rule, scale, dim=0), text_video)
    v2t = retrieval_metrics(rescore(sim, rule, scale, dim=1), text_video)
    out = {k: v for k, v in t2v.items() if k.startswith("t2v_")}
    out |= {k: v for k, v in v2t.items() if k.startswith("v2t_")}
    out["rsum"] = sum(out[f"{d}_r{k}"] for d in ("t2v", "v2t") for k in RECALL_AT)
    out["rescored"] = 1.0 if rule != "none" else 0.0
    return out


def chance_metrics(text_video: Tensor, num_videos: int) -> dict[str, float]:
    """What a uniformly random ranking scores on this evaluation set (the level every figure must beat).

    Text->video: each text's video is one of ``V``, so R@k = 100 min(k, V) / V and the expected rank is
    (V + 1) / 2 (median and mean). Video->text, for a video with ``c`` of the ``T`` captions: its best caption
    rank is <= k with probability 1 - C(T - c, k) / C(T, k); R@k is that averaged over the videos, MdR the median
    over videos of each video's median best rank, and MnR the mean of (T + 1) / (c + 1). A constant scorer does
    worse than this (ties count against the query: rank V).

    Returns:
        ``chance_t2v_{r1,r5,r10,medr,meanr}`` and ``chance_v2t_...`` (percent for recalls).
    """
    text_video = text_video.detach().cpu().long()
    n_texts = int(text_video.numel())
    if n_texts == 0 or num_videos < 1:
        raise ValueError("no texts or no videos: chance is undefined for an empty evaluation set")
    out = {f"chance_t2v_r{k}": 100.0 * min(k, num_videos) / num_videos for k in RECALL_AT}
    out["chance_t2v_medr"] = out["chance_t2v_meanr"] = (num_videos + 1) / 2
    counts = torch.bincount(text_video, minlength=num_videos).tolist()
    recall = {k: 0.0 for k in RECALL_AT}
    medians, means = [], []
    cache: dict[int, tuple[np.ndarray, float]] = {}
    for c in counts:
        if c not in cache:  # P(best rank > k) for k = 0..T: prod_{i<k} (T - c - i) / (T - i)
            i = np.arange(n_texts, dtype=np.float64)
            above = np.concatenate([[1.0], np.cumprod(np.clip(n_texts - c - i, 0, None) / (n_texts - i))])
            cache[c] = (above, float(np.argmax(above <= 0.5)))
        above, median = cache[c]
        for k in RECALL_AT:
            recall[k] += 1.0 - float(above[min(k, n_texts)])
        medians.append(median)
        means.append((n_texts + 1) / (c + 1))
    out.update({f"chance_v2t_r{k}": 100.0 * recall[k] / num_videos for k in RECALL_AT})
    out["chance_v2t_medr"] = float(np.median(medians))
    out["chance_v2t_meanr"] = float(np.mean(means))
    return out


class Reranked(NamedTuple):
    """Result of :func:`topk_rerank` / :func:`full_rerank`."""

    scores: Tensor  # (T, V) float32; scored pairs hold their score, all others -inf
    num_pairs: int  # unique (text, video) pairs sent to the scorer, each exactly once; calls = ceil(P / batch_size)


def candidate_pairs(sim: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Union of every text's top-k videos and every video's top-k texts by ``sim``, without duplicates.

    Args:
        sim: ``(T, V)`` unimodal similarity (row = text).
        k: candidates per query, ``>= 1``; clipped to ``V`` for texts and ``T`` for videos.

    Returns:
        ``(text_idx, video_idx)``, both ``(P,)`` int64 on ``sim``'s device, sorted by ``t * V + v``
        (row-major), each pair once. With ``k >= max(T, V)`` this is every pair in row-major order.
    """
    if sim.ndim != 2 or 0 in sim.shape:
        raise ValueError(f"sim must be a non-empty (T, V) matrix, got {tuple(sim.shape)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1 (candidates per query), got {k!r}")
    n_texts, n_videos = sim.shape
    t2v = sim.topk(min(k, n_videos), dim=1).indices  # (T, kv): videos of each text
    v2t = sim.topk(min(k, n_texts), dim=0).indices  # (kt, V): texts of each video
    rows = torch.arange(n_texts, device=sim.device)[:, None]
    cols = torch.arange(n_videos, device=sim.device)[None, :]
    keys = torch.cat([(rows * n_videos + t2v).flatten(), (v2t * n_videos + cols).flatten()])
    keys = torch.unique(keys)  # sorted ascending
    return keys // n_videos, keys % n_videos


def _apply_rule(logits: Tensor, sim_pairs: Tensor, rule: str) -> Tensor:
    if logits.ndim != 2 or logits.shape[1] != 2 or logits.shape[0] != sim_pairs.shape[0]:
        raise ValueError(
            f"pair_scores must return VTM logits of shape (P, 2) = ({sim_pairs.shape[0]}, 2) for P pairs, "
            f"got {tuple(logits.shape)}"
        )
    logits = logits.float()
    if rule == "match":
        return logits.softmax(dim=1)[:, 1]
    return logits[:, 1] + sim_pairs.float()


def _score_pairs(
    sim: Tensor, text_idx: Tensor, video_idx: Tensor, pair_scores: PairScorer, batch_size: int, rule: str
) -> Reranked:
    if rule not in RULES:
        raise ValueError(f"unknown score rule {rule!r}; choose one of {RULES}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1 (pairs per scorer call), got {batch_size!r}")
    out = torch.full(sim.shape, float("-inf"), dtype=torch.float32, device=sim.device)  # (T, V)
    for start in range(0, text_idx.numel(), batch_size):
        t, v = text_idx[start : start + batch_size], video_idx[start : start + batch_size]
        logits = pair_scores(t, v).to(sim.device)  # (P, 2)
        out[t, v] = _apply_rule(logits, sim[t, v], rule)
    return Reranked(out, int(text_idx.numel()))


@torch.no_grad()
def topk_rerank(sim: Tensor, k: int, pair_scores: PairScorer, batch_size: int, rule: str = "match") -> Reranked:
    """Re-rank the contrastive top-k candidates of both directions with the VTM head, each pair scored once.

    Candidates are the union of every text's top-``k`` videos and every video's top-``k`` texts by ``sim``
    (:func:`candidate_pairs`); one score matrix serves both directions, so a pair both directions need is
    fused once. Pairs are scored in row-major order in batches of at most ``batch_size``.

    Score rules:

    * ``"match"``: ``softmax(logits)[:, 1]``, the VTM match probability (ALPRO's released evaluation).
    * ``"match_plus_sim"``: ``logits[:, 1] + sim[t, v]``, the raw match logit plus the similarity of that pair
      as given (LAVIS ``AlproRetrieval.compute_sim_matrix`` adds the plain cosine similarity of the normalised
      projected [CLS] features, not divided by the temperature; pass that matrix as ``sim`` to match it).
      LAVIS fills non-candidates with -100; here they are ``-inf``.

    Every non-candidate pair is ``-inf``, so with the pessimistic tie rule an unscored correct pair ranks last.
    With ``k >= max(T, V)`` every pair is a candidate and the result equals :func:`full_rerank` exactly (same
    pairs, same order, same batches).

    Args:
        sim: ``(T, V)`` unimodal similarity (row = text).
        k: candidates per query, ``>= 1``.
        pair_scores: ``pair_scores(text_idx (P,), video_idx (P,)) -> (P, 2)`` VTM logits (column 1 = match);
            the indices live on ``sim``'s device.
        batch_size: most pairs per ``pair_scores`` call.
        rule: ``"match"`` or ``"match_plus_sim"``.

    Returns:
        :class:`Reranked` ``(scores (T, V) float32, num_pairs)``, a named 2-tuple.

    Raises:
        ValueError: for ``k < 1``, ``batch_size < 1``, an unknown ``rule``, a bad ``sim`` or bad logits shape.
    """
    if rule not in RULES:
        raise ValueError(f"unknown score rule {rule!r}; choose one of {RULES}")
    text_idx, video_idx = candidate_pairs(sim, k)
    return _score_pairs(sim, text_idx, video_idx, pair_scores, batch_size, rule)


@torch.no_grad()
def full_rerank(sim: Tensor, pair_scores: PairScorer, batch_size: int, rule: str = "match") -> Reranked:
    """Score all ``T * V`` pairs with the VTM head (the released ALPRO code's N x N evaluation).

    Same rules, order and batching as :func:`topk_rerank`; built from ``arange`` instead of ``topk``, as the
    reference that ``k >= max(T, V)`` must reproduce.
    """
    if sim.ndim != 2 or 0 in sim.shape:
        raise ValueError(f"sim must be a non-empty (T, V) matrix, got {tuple(sim.shape)}")
    n_texts, n_videos = sim.shape
    text_idx = torch.arange(n_texts, device=sim.device).repeat_interleave(n_videos)
    video_idx = torch.arange(n_videos, device=sim.device).repeat(n_texts)
    return _score_pairs(sim, text_idx, video_idx, pair_scores, batch_size, rule)


VTM_PRIOR_LOSS = float(np.log(3.0) - (2.0 / 3.0) * np.log(2.0))
"""Cross-entropy of a head that predicts the 1:2 label prior for every pair (0.6365): VTM's trivial baseline."""


@torch.no_grad()
def heldout_vtm(sim: Tensor, text_video: Tensor, pair_scores: PairScorer, batch_size: int) -> dict[str, float]:
    """The VTM head on held-out pairs, laid out as in training: per text one positive and two hard negatives.

    For text ``t`` of video ``v``: the positive ``(t, v)``; the video negative, the video other than ``v`` that
    ``sim`` ranks highest for ``t``; the text negative, the text of another video that ``sim`` ranks highest
    for ``v`` (ALPRO's hard negatives, drawn by argmax instead of sampled, so the figure is deterministic;
    texts of the same clip are never negatives). The ``3T`` pairs keep training's 1:2 ratio, so the loss
    compares directly with the training curve and with :data:`VTM_PRIOR_LOSS`.

    Returns:
        ``vtm_loss`` (mean cross-entropy), ``vtm_loss_prior`` (the prior's), ``vtm_pos_acc`` /
        ``vtm_neg_acc`` (% of positives / negatives the head's argmax gets right); ``{}`` with fewer than two
        videos (no negative exists).
    """
    _check_inputs(sim, text_video)
    n_texts, n_videos = sim.shape
    if n_videos < 2:
        return {}
    text_video = text_video.to(sim.device)
    own = torch.nn.functional.one_hot(text_video, n_videos).bool()  # (T, V): text t describes video v
    neg_video = sim.masked_fill(own, float("-inf")).argmax(dim=1)  # (T,)
    neg_text = sim.masked_fill(own, float("-inf")).argmax(dim=0)[text_video]  # (T,): hardest text of the video
    ar = torch.arange(n_texts, device=sim.device)
    text_idx = torch.cat([ar, ar, neg_text])
    video_idx = torch.cat([text_video, neg_video, text_video])
    logits = torch.cat(
        [
            pair_scores(text_idx[i : i + batch_size], video_idx[i : i + batch_size]).float().cpu()
            for i in range(0, text_idx.numel(), batch_size)
        ]
    )  # (3T, 2)
    if logits.shape != (3 * n_texts, 2):
        raise ValueError(f"pair_scores must return (P, 2) VTM logits, got {tuple(logits.shape)} in all")
    labels = (torch.arange(3 * n_texts) < n_texts).long()
    right = logits.argmax(dim=1) == labels
    return {
        "vtm_loss": float(torch.nn.functional.cross_entropy(logits, labels)),
        "vtm_loss_prior": VTM_PRIOR_LOSS,
        "vtm_pos_acc": 100.0 * float(right[:n_texts].float().mean()),
        "vtm_neg_acc": 100.0 * float(right[n_texts:].float().mean()),
    }
