"""Retrieval metrics against hand-computed rankings, and top-k VTM re-ranking against full N x N scoring."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from vlp.eval import retrieval
from vlp.eval.retrieval import (
    candidate_pairs,
    full_rerank,
    ranks_t2v,
    ranks_v2t,
    retrieval_metrics,
    topk_rerank,
)

INF = float("inf")


def _t(rows: list[list[float]]) -> Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def _idx(values: list[int]) -> Tensor:
    return torch.tensor(values, dtype=torch.long)


# ---------------------------------------------------------------- ranks and metrics, computed by hand


def test_t2v_ranks_hand_computed_with_pessimistic_ties() -> None:
    scores = _t(
        [
            [0.9, 0.1, 0.5],  # correct v0 = 0.9, nothing higher            -> rank 1
            [0.4, 0.4, 0.2],  # correct v1 = 0.4 ties v0                     -> rank 2 (tie counts against it)
            [0.7, 0.8, 0.3],  # correct v2 = 0.3, v0 and v1 higher           -> rank 3
            [1.0, 1.0, 1.0],  # constant row, correct v1                     -> rank 3 = V, never 1
        ]
    )
    assert ranks_t2v(scores, _idx([0, 1, 2, 1])).tolist() == [1, 2, 3, 3]


def test_t2v_ranks_with_minus_inf() -> None:
    scores = _t([[-INF, -INF, 0.0], [-INF, -INF, 0.0]])
    # row 0: correct v0 = -inf, every candidate is >= -inf -> rank 3; row 1: correct v2 = 0.0 alone on top -> 1
    assert ranks_t2v(scores, _idx([0, 2])).tolist() == [3, 1]


def test_multiple_captions_per_video_hand_computed() -> None:
    scores = _t(
        [
            [0.2, 0.9],  # t0 -> v0
            [0.8, 0.1],  # t1 -> v0
            [0.5, 0.3],  # t2 -> v1
            [0.9, 0.6],  # t3 -> v1
        ]
    )
    text_video = _idx([0, 0, 1, 1])
    # t2v: t0: {0.2, 0.9} >= 0.2 -> 2; t1: only 0.8 -> 1; t2: {0.5, 0.3} -> 2; t3: {0.9, 0.6} -> 2
    assert ranks_t2v(scores, text_video).tolist() == [2, 1, 2, 2]
    # v2t: column v0 = [0.2, 0.8, 0.5, 0.9]; best own caption t1 = 0.8, beaten by t3 (0.9) -> 2
    #      column v1 = [0.9, 0.1, 0.3, 0.6]; best own caption t3 = 0.6, beaten by t0 (0.9) -> 2
    assert ranks_v2t(scores, text_video).tolist() == [2, 2]
    m = retrieval_metrics(scores, text_video)
    # t2v ranks [2, 1, 2, 2]: R@1 = 1/4, R@5 = R@10 = 4/4, MdR = median(1, 2, 2, 2) = 2, MnR = 7/4
    assert (m["t2v_r1"], m["t2v_r5"], m["t2v_r10"], m["t2v_medr"], m["t2v_meanr"]) == (25.0, 100.0, 100.0, 2.0, 1.75)
    # v2t ranks [2, 2]
    assert (m["v2t_r1"], m["v2t_r5"], m["v2t_r10"], m["v2t_medr"], m["v2t_meanr"]) == (0.0, 100.0, 100.0, 2.0, 2.0)
    assert m["rsum"] == 25 + 100 + 100 + 0 + 100 + 100
    assert all(type(v) is float for v in m.values())


def test_v2t_own_captions_tied_on_top_still_rank_one() -> None:
    scores = _t([[0.7, 0.0], [0.7, 0.0], [0.1, 0.5]])  # t0, t1 -> v0; t2 -> v1
    # v0: its two captions tie at 0.7 on top; the only other text (t2) has 0.1 -> rank 1
    # v1: own caption t2 = 0.5; t0 and t1 have 0.0 -> rank 1
    assert ranks_v2t(scores, _idx([0, 0, 1])).tolist() == [1, 1]


def test_constant_scorer_gets_the_worst_ranks() -> None:
    text_video = _idx([0, 0, 1, 2, 2, 2])  # T = 6, V = 3
    scores = torch.zeros(6, 3)
    assert ranks_t2v(scores, text_video).tolist() == [3] * 6
    # worst case: all texts of other videos come first -> rank = 1 + (T - own captions)
    assert ranks_v2t(scores, text_video).tolist() == [1 + 4, 1 + 5, 1 + 3]
    m = retrieval_metrics(scores, text_video)
    assert m["t2v_r1"] == 0.0 and m["v2t_r1"] == 0.0


def test_median_of_an_even_count_is_the_mean_of_the_two_middle_ranks() -> None:
    # text i has exactly i wrong videos above its correct one (0.5), so t2v ranks are [1, 2, 3, 4]
    scores = torch.zeros(4, 4)
    for i in range(4):
        scores[i, i] = 0.5
        wrong = [j for j in range(4) if j != i][:i]
        scores[i, wrong] = 1.0
    text_video = torch.arange(4)
    assert ranks_t2v(scores, text_video).tolist() == [1, 2, 3, 4]
    m = retrieval_metrics(scores, text_video)
    assert m["t2v_medr"] == 2.5  # (2 + 3) / 2; torch.median would say 2
    assert m["t2v_meanr"] == 2.5
    assert m["t2v_r1"] == 25.0


def test_odd_median_and_recall_cutoffs() -> None:
    ranks = torch.tensor([1, 5, 6, 10, 11])
    out = retrieval.rank_summary(ranks, "x")
    # R@1 = 1/5, R@5 = 2/5, R@10 = 4/5, MdR = 6, MnR = 33/5
    assert out == {"x_r1": 20.0, "x_r5": 40.0, "x_r10": 80.0, "x_medr": 6.0, "x_meanr": 6.6}


def _v2t_reference(scores: Tensor, text_video: Tensor) -> list[int]:
    """Loop version of the documented rule: 1 + texts of other videos scoring >= the best own caption."""
    out = []
    for v in range(scores.shape[1]):
        own = [t for t in range(scores.shape[0]) if int(text_video[t]) == v]
        best = max(float(scores[t, v]) for t in own)
        others = [t for t in range(scores.shape[0]) if int(text_video[t]) != v]
        out.append(1 + sum(float(scores[t, v]) >= best for t in others))
    return out


@pytest.mark.parametrize("chunk", [1, 3, 1024])
def test_v2t_matches_a_loop_reference_on_random_tied_scores(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retrieval, "_CHUNK", chunk)
    g = torch.Generator().manual_seed(0)
    text_video = torch.cat([torch.arange(7), torch.randint(0, 7, (11,), generator=g)])  # every video captioned
    scores = torch.randint(0, 4, (18, 7), generator=g).float()  # few distinct values: many ties
    scores[0, 3] = -INF
    assert ranks_v2t(scores, text_video).tolist() == _v2t_reference(scores, text_video)


def test_rank_input_errors_word_for_word() -> None:
    message = r"^scores must be a \(T, V\) matrix \(row = text, column = video\), got \(3,\)$"
    with pytest.raises(ValueError, match=message):
        ranks_t2v(torch.zeros(3), _idx([0, 1, 2]))
    for dtype in (torch.bool, torch.float32):
        with pytest.raises(ValueError, match=rf"^text_video must hold integer video indices, got dtype {dtype}$"):
            ranks_t2v(torch.zeros(2, 2), torch.tensor([0, 1]).to(dtype))
    with pytest.raises(ValueError, match=r"^scores contain NaN; use -inf for pairs that were not scored$"):
        ranks_t2v(_t([[float("nan"), 0.0]]), _idx([0]))


def test_rank_input_errors() -> None:
    with pytest.raises(ValueError, match="no caption"):
        ranks_v2t(torch.zeros(2, 3), _idx([0, 1]))
    message = (
        r"^12 video\(s\) have no caption, so video->text retrieval is undefined for them \(first indices: "
        r"\[1, 2, 3, 4, 5, 6, 7, 8, 9, 10\]\); drop those columns or add their captions$"
    )
    with pytest.raises(ValueError, match=message):  # videos 1 to 12 of 14 have none: the first ten are named
        ranks_v2t(torch.zeros(2, 14), _idx([0, 13]))
    with pytest.raises(ValueError, match="NaN"):
        ranks_t2v(_t([[float("nan"), 0.0]]), _idx([0]))
    with pytest.raises(ValueError, match="one video index per score row"):
        ranks_t2v(torch.zeros(3, 2), _idx([0, 1]))
    with pytest.raises(ValueError, match="outside"):
        ranks_t2v(torch.zeros(2, 2), _idx([0, 2]))
    with pytest.raises(ValueError, match=r"^no ranks to summarise: the evaluation set is empty$"):
        retrieval.rank_summary(torch.zeros(0, dtype=torch.long), "t2v")


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
def test_video_indices_of_any_integer_dtype_rank_alike(dtype):
    """Narrow integer indices (a uint8 column from parquet) rank as int64 ones do, in both directions."""
    from vlp.eval.retrieval import ranks_v2t

    scores = torch.rand(6, 3, generator=torch.Generator().manual_seed(2))
    text_video = _idx([0, 1, 2, 0, 1, 2])
    assert torch.equal(ranks_t2v(scores, text_video.to(dtype)), ranks_t2v(scores, text_video))
    assert torch.equal(ranks_v2t(scores, text_video.to(dtype)), ranks_v2t(scores, text_video))


# ---------------------------------------------------------------- top-k re-ranking


class RecordingScorer:
    """A real (tiny, fixed) VTM-like head over per-item features that records every pair it is asked to score."""

    def __init__(self, n_texts: int, n_videos: int, dim: int = 8, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.text = torch.randn(n_texts, dim, generator=g)
        self.video = torch.randn(n_videos, dim, generator=g)
        torch.manual_seed(seed)
        self.head = nn.Sequential(nn.Linear(2 * dim, 16), nn.GELU(), nn.Linear(16, 2)).eval()
        self.calls: list[tuple[list[int], list[int]]] = []

    def __call__(self, text_idx: Tensor, video_idx: Tensor) -> Tensor:
        self.calls.append((text_idx.tolist(), video_idx.tolist()))
        return self.head(torch.cat([self.text[text_idx], self.video[video_idx]], dim=1))  # (P, 2)

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return [p for t, v in self.calls for p in zip(t, v, strict=True)]


def _sim(n_texts: int, n_videos: int, seed: int = 1) -> Tensor:
    return torch.randn(n_texts, n_videos, generator=torch.Generator().manual_seed(seed))  # distinct values


@pytest.mark.parametrize(("n_texts", "n_videos", "batch_size"), [(6, 6, 4), (9, 5, 7), (4, 11, 1)])
@pytest.mark.parametrize("rule", ["match", "match_plus_sim"])
def test_topk_with_k_covering_all_pairs_equals_full_scoring_exactly(
    n_texts: int, n_videos: int, batch_size: int, rule: str
) -> None:
    sim = _sim(n_texts, n_videos)
    k = max(n_texts, n_videos)
    top = topk_rerank(sim, k, RecordingScorer(n_texts, n_videos), batch_size, rule)
    full = full_rerank(sim, RecordingScorer(n_texts, n_videos), batch_size, rule)
    assert torch.equal(top.scores, full.scores)
    assert top.num_pairs == full.num_pairs == n_texts * n_videos
    assert torch.isfinite(top.scores).all()
    # and the full scoring is what one batch of all pairs gives (up to float rounding of batch composition)
    scorer = RecordingScorer(n_texts, n_videos)
    t, v = torch.meshgrid(torch.arange(n_texts), torch.arange(n_videos), indexing="ij")
    logits = scorer(t.flatten(), v.flatten()).view(n_texts, n_videos, 2)
    expected = logits.softmax(-1)[..., 1] if rule == "match" else logits[..., 1] + sim
    torch.testing.assert_close(full.scores, expected.detach())


def _brute_force_candidates(sim: Tensor, k: int) -> set[tuple[int, int]]:
    n_texts, n_videos = sim.shape
    pairs = set()
    for t in range(n_texts):
        order = sorted(range(n_videos), key=lambda v: -float(sim[t, v]))
        pairs |= {(t, v) for v in order[:k]}
    for v in range(n_videos):
        order = sorted(range(n_texts), key=lambda t: -float(sim[t, v]))
        pairs |= {(t, v) for t in order[:k]}
    return pairs


@pytest.mark.parametrize("k", [1, 2, 3])
def test_each_candidate_pair_is_scored_exactly_once(k: int) -> None:
    n_texts, n_videos, batch_size = 10, 7, 4
    sim = _sim(n_texts, n_videos, seed=3)
    scorer = RecordingScorer(n_texts, n_videos)
    out = topk_rerank(sim, k, scorer, batch_size)
    expected = _brute_force_candidates(sim, k)
    assert len(scorer.pairs) == len(set(scorer.pairs)), "a pair was scored twice"
    assert set(scorer.pairs) == expected
    assert out.num_pairs == len(expected) < n_texts * n_videos
    assert len(scorer.calls) == math.ceil(len(expected) / batch_size)
    assert all(len(t) <= batch_size for t, _ in scorer.calls)
    scored = torch.isfinite(out.scores)
    assert {tuple(p) for p in scored.nonzero().tolist()} == expected
    assert (out.scores[~scored] == -INF).all()


def test_candidate_pairs_are_the_union_in_row_major_order() -> None:
    sim = _t([[0.9, 0.1, 0.0], [0.8, 0.7, 0.2]])
    # k=1: text0 -> v0, text1 -> v0; v0 -> t0, v1 -> t1, v2 -> t1. Union, row-major: (0,0) (1,0) (1,1) (1,2)
    t, v = candidate_pairs(sim, 1)
    assert list(zip(t.tolist(), v.tolist(), strict=True)) == [(0, 0), (1, 0), (1, 1), (1, 2)]


def test_score_rules_by_hand() -> None:
    sim = _t([[0.9, 0.1], [0.2, 0.8]])
    fixed = {(0, 0): (0.0, 2.0), (1, 1): (1.0, 1.0), (0, 1): (3.0, 0.0), (1, 0): (0.0, 0.0)}

    def scorer(t: Tensor, v: Tensor) -> Tensor:
        return torch.tensor([fixed[(a, b)] for a, b in zip(t.tolist(), v.tolist(), strict=True)])

    # k=1: only the diagonal is a candidate in both directions
    match = topk_rerank(sim, 1, scorer, batch_size=8, rule="match")
    assert match.num_pairs == 2
    torch.testing.assert_close(match.scores[0, 0], torch.tensor(1 / (1 + math.exp(-2.0))))  # softmax([0, 2])[1]
    torch.testing.assert_close(match.scores[1, 1], torch.tensor(0.5))  # softmax([1, 1])[1]
    assert match.scores[0, 1] == -INF and match.scores[1, 0] == -INF
    plus = topk_rerank(sim, 1, scorer, batch_size=8, rule="match_plus_sim")
    torch.testing.assert_close(plus.scores.diagonal(), torch.tensor([2.0 + 0.9, 1.0 + 0.8]))


def test_correct_pair_outside_the_candidates_ranks_last() -> None:
    sim = _t([[0.9, 0.6, 0.1], [0.8, 0.5, 0.1], [0.1, 0.2, 0.9]])
    out = topk_rerank(sim, 1, lambda t, v: torch.zeros(t.numel(), 2), batch_size=4)
    # (t1, v1) is no candidate at k=1: t1's top video is v0 (0.8) and v1's top text is t0 (0.6) ...
    ranks = ranks_t2v(out.scores, _idx([0, 1, 2]))
    assert ranks[1] == 3  # ... so its score is -inf and it ranks last, not first


def test_rerank_validation() -> None:
    sim = _sim(3, 3)

    def scorer(t: Tensor, v: Tensor) -> Tensor:
        return torch.zeros(t.numel(), 2)

    with pytest.raises(ValueError, match="k must be"):
        topk_rerank(sim, 0, scorer, 4)
    with pytest.raises(ValueError, match="unknown score rule"):
        topk_rerank(sim, 2, scorer, 4, rule="itc")
    with pytest.raises(ValueError, match="batch_size"):
        topk_rerank(sim, 2, scorer, 0)
    with pytest.raises(ValueError, match=r"\(T, V\)"):
        topk_rerank(torch.zeros(3), 2, scorer, 4)
    with pytest.raises(ValueError, match=r"\(P, 2\)"):
        topk_rerank(sim, 2, lambda t, v: torch.zeros(t.numel()), 4)
    for width, rows in [(3, 0), (2, 1)]:  # a wrong width with the right row count, and the other way round
        with pytest.raises(ValueError, match=r"^pair_scores must return VTM logits of shape \(P, 2\) = \(\d+, 2\)"):
            topk_rerank(sim, 2, lambda t, v, w=width, r=rows: torch.zeros(t.numel() + r, w), 4)
    for size in (True, 2.0):  # a bool is an int to Python, not a batch size
        with pytest.raises(
            ValueError, match=rf"^batch_size must be an int >= 1 \(pairs per scorer call\), got {size}$"
        ):
            topk_rerank(sim, 2, scorer, size)


def test_chance_levels_are_what_random_rankings_score():
    from vlp.eval.retrieval import chance_metrics

    one = chance_metrics(torch.arange(100), 100)
    assert (one["chance_t2v_r1"], one["chance_t2v_r10"], one["chance_t2v_medr"]) == (1.0, 10.0, 50.5)
    assert one["chance_v2t_r1"] == pytest.approx(1.0) and one["chance_v2t_meanr"] == pytest.approx(50.5)
    two = torch.arange(50).repeat_interleave(2)  # two captions per clip: video->text chance is higher
    chance = chance_metrics(two, 50)
    assert chance["chance_v2t_r1"] == pytest.approx(2.0) and chance["chance_v2t_meanr"] == pytest.approx(101 / 3)
    gen, trials, mean = torch.Generator().manual_seed(0), 300, {}
    for _ in range(trials):
        for key, value in retrieval_metrics(torch.rand(100, 50, generator=gen), two).items():
            mean[key] = mean.get(key, 0.0) + value / trials
    for key in ("t2v_r1", "t2v_r5", "t2v_r10", "v2t_r1", "v2t_r5", "v2t_r10", "t2v_meanr", "v2t_meanr"):
        assert mean[key] == pytest.approx(chance[f"chance_{key}"], rel=0.08, abs=0.4), key
    message = "^no texts or no videos: chance is undefined for an empty evaluation set$"
    for texts, videos in ((torch.zeros(0, dtype=torch.long), 3), (torch.zeros(2, dtype=torch.long), 0)):
        with pytest.raises(ValueError, match=message):
            chance_metrics(texts, videos)
    single = chance_metrics(torch.zeros(3, dtype=torch.long), 1)  # one clip: every ranking finds it first
    assert single["chance_t2v_r1"] == 100.0 and single["chance_v2t_r1"] == 100.0
    # a clip without captions still counts: its best caption is never found, and (T + 1) / 1 is its mean rank
    gap = chance_metrics(torch.tensor([0, 0, 1]), 3)
    assert gap["chance_v2t_meanr"] == pytest.approx(((3 + 1) / 3 + (3 + 1) / 2 + (3 + 1) / 1) / 3)
    # video->text MdR: per clip, the least k with P(best rank > k) <= 1/2, then the median over clips. One caption
    # among T: its rank is uniform on 1..T, so k = T/2 for even T; three of four: P(rank > 1) = 1/4, k = 1
    assert one["chance_v2t_medr"] == 50.0 and chance_metrics(torch.tensor([0, 1]), 2)["chance_v2t_medr"] == 1.0
    assert chance_metrics(torch.tensor([0, 0, 0, 1]), 2)["chance_v2t_medr"] == 1.5  # clips: 1 (3 of 4) and 2 (1 of 4)


def test_heldout_vtm_scores_each_text_with_its_hardest_negatives():
    from vlp.eval.retrieval import VTM_PRIOR_LOSS, heldout_vtm

    text_video = _idx([0, 0, 1, 2])  # texts 0 and 1 describe the same clip: never each other's negative
    sim = _t([[0.9, 0.8, 0.1], [0.99, 0.2, 0.6], [0.95, 0.5, 0.3], [0.1, 0.4, 0.2]])  # text 1 tops clip 0: no negative
    seen: list[tuple[int, int]] = []

    def oracle(t: Tensor, v: Tensor) -> Tensor:
        seen.extend(zip(t.tolist(), v.tolist(), strict=True))
        match = (text_video[t] == v).float() * 10 - 5  # +5 for a true pair, -5 otherwise
        return torch.stack([-match, match], dim=1)

    m = heldout_vtm(sim, text_video, oracle, batch_size=5)
    # positives; the video each text ranks highest among other clips; for each text's clip, the highest text
    # of another clip (clip 0: text 2 at 0.95; clip 1: text 0 at 0.8; clip 2: text 1 at 0.6)
    assert seen == [(0, 0), (1, 0), (2, 1), (3, 2), (0, 1), (1, 2), (2, 0), (3, 1), (2, 0), (2, 0), (0, 1), (1, 2)]
    assert (m["vtm_pos_acc"], m["vtm_neg_acc"]) == (100.0, 100.0)
    assert m["vtm_loss"] == pytest.approx(math.log1p(math.exp(-10)), rel=1e-3)  # float32 logits
    assert m["vtm_loss_prior"] == pytest.approx(-(math.log(1 / 3) + 2 * math.log(2 / 3)) / 3)
    prior = heldout_vtm(sim, text_video, lambda t, v: torch.log(torch.tensor([[2 / 3, 1 / 3]])).expand(t.numel(), 2), 2)
    assert prior["vtm_loss"] == pytest.approx(VTM_PRIOR_LOSS) and prior["vtm_pos_acc"] == 0.0
    assert heldout_vtm(sim[:, :1], _idx([0, 0, 0, 0]), oracle, 4) == {}  # one clip: no negative exists
    with pytest.raises(ValueError, match=r"\(P, 2\)"):
        heldout_vtm(sim, text_video, lambda t, v: torch.zeros(t.numel()), 4)


def test_rescoring_uses_the_other_queries_as_computed_by_hand():
    from vlp.eval.retrieval import rescore, rescored_metrics

    sim = torch.tensor([[0.9, 0.8], [0.85, 0.1], [0.2, 0.3]])  # 3 texts x 2 videos
    e = torch.exp(10 * sim)
    inverted = e / e.sum(dim=0, keepdim=True)
    torch.testing.assert_close(rescore(sim, "inverted_softmax", 10.0), inverted)
    torch.testing.assert_close(rescore(sim, "dual_softmax", 10.0), sim * inverted)
    torch.testing.assert_close(rescore(sim, "dual_softmax", 10.0, dim=1), sim * torch.softmax(10 * sim, dim=1))
    assert torch.equal(rescore(sim, "none"), sim)
    # text 0 prefers video 0 (0.9 > 0.8), but video 0 is also text 1's best match: the prior moves text 0 to video 1
    text_video = torch.tensor([1, 0, 1])
    plain, dual = retrieval_metrics(sim, text_video), rescored_metrics(sim, text_video, "dual_softmax", 10.0)
    assert plain["t2v_r1"] == pytest.approx(200 / 3) and dual["t2v_r1"] == 100.0
    assert dual["rsum"] == pytest.approx(sum(dual[f"{d}_r{k}"] for d in ("t2v", "v2t") for k in (1, 5, 10)))
    with pytest.raises(ValueError, match="rescore must be one of"):
        rescore(sim, "qb_norm")
    torch.testing.assert_close(rescore(sim, "inverted_softmax"), torch.softmax(100 * sim.double(), 0).float())
    gentle = sim * torch.softmax(0.5 * sim.double(), 0).float()  # any scale > 0 is taken, 0.5 too
    torch.testing.assert_close(rescore(sim, "dual_softmax", 0.5), gentle)
    with pytest.raises(ValueError, match=r"with scale > 0, got 'dual_softmax' / 0\.0$"):
        rescore(sim, "dual_softmax", 0.0)


def test_rescored_metrics_rank_each_direction_on_its_own_normalisation():
    """Text -> video ranks the matrix normalised over the texts, video -> text over the videos, both at the given
    scale (default 100); ``rescored`` says whether a rule was applied. The matrices are ones where the scale or
    the direction changes a figure (found by a search over small integer grids)."""
    from vlp.eval.retrieval import rescore, rescored_metrics

    text_video = torch.tensor([0, 1, 2, 0, 1, 2])
    sim = torch.tensor([[2, 23, 69], [58, 80, 93], [45, 24, 18], [74, 21, 70], [75, 81, 46], [9, 33, 77]]) / 100
    default = rescored_metrics(sim, text_video, "inverted_softmax")
    assert default == rescored_metrics(sim, text_video, "inverted_softmax", 100.0)
    assert default["t2v_r1"] != rescored_metrics(sim, text_video, "inverted_softmax", 101.0)["t2v_r1"]
    sim = torch.tensor([[94, 33, 26], [19, 91, 54], [24, 41, 69], [69, 49, 80], [81, 12, 63], [60, 95, 85]]) / 100
    for scale in (10.0, 100.0):
        got = rescored_metrics(sim, text_video, "dual_softmax", scale)
        t2v = retrieval_metrics(rescore(sim, "dual_softmax", scale, dim=0), text_video)
        v2t = retrieval_metrics(rescore(sim, "dual_softmax", scale, dim=1), text_video)
        assert {k: v for k, v in got.items() if k.startswith("t2v_")} == {k: t2v[k] for k in t2v if k[:4] == "t2v_"}
        assert {k: v for k, v in got.items() if k.startswith("v2t_")} == {k: v2t[k] for k in v2t if k[:4] == "v2t_"}
        assert got["rescored"] == 1.0
    at_10, at_100 = (rescored_metrics(sim, text_video, "dual_softmax", s) for s in (10.0, 100.0))
    assert at_10["v2t_r1"] != at_100["v2t_r1"]  # the scale reaches the video -> text direction too
    over_texts = retrieval_metrics(rescore(sim, "dual_softmax", 10.0, dim=0), text_video)
    assert over_texts["v2t_r1"] != at_10["v2t_r1"]  # and that direction normalises over the videos
    plain = rescored_metrics(sim, text_video, "none")
    assert plain["rescored"] == 0.0 and plain["t2v_r1"] == retrieval_metrics(sim, text_video)["t2v_r1"]
