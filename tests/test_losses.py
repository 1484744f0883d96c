"""ALPRO objectives: VTC, VTM hard negatives, MLM masking, PEM boxes/labels/pooling/loss."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vlp.losses.contrastive import clamp_temperature, vtc_logits, vtc_loss
from vlp.losses.entity import (
    Box,
    box_token_mask,
    crop_frames,
    pem_keep_mask,
    pem_loss,
    pool_box_tokens,
    pseudo_labels,
    sample_pem_box,
    sample_pem_boxes,
)
from vlp.losses.matching import (
    hard_negative_weights,
    sample_hard_negatives,
    vtm_labels,
    vtm_loss,
    vtm_pair_indices,
)
from vlp.losses.mlm import IGNORE_INDEX, mask_tokens, mlm_loss

# ----------------------------------------------------------------------------------------------- VTC


def naive_vtc(video: torch.Tensor, text: torch.Tensor, temp: float) -> torch.Tensor:
    """Eq. 2-3 written out with explicit sums over j, one row at a time."""
    b = video.shape[0]
    total_v2t, total_t2v = 0.0, 0.0
    for i in range(b):
        s_v = torch.stack([video[i] @ text[j] for j in range(b)]) / temp
        s_t = torch.stack([text[i] @ video[j] for j in range(b)]) / temp
        total_v2t = total_v2t - torch.log(torch.exp(s_v[i]) / torch.exp(s_v).sum())
        total_t2v = total_t2v - torch.log(torch.exp(s_t[i]) / torch.exp(s_t).sum())
    return (total_v2t / b + total_t2v / b) / 2


def test_vtc_hand_computed_3x3() -> None:
    # videos e1, e2, e3; texts e1, e2, (e2 + e3)/sqrt(2); temperature 0.5 doubles the cosines.
    r = 1 / math.sqrt(2)
    video = torch.eye(3, dtype=torch.float64)
    text = torch.tensor([[1, 0, 0], [0, 1, 0], [0, r, r]], dtype=torch.float64)
    e2, es = math.exp(2), math.exp(math.sqrt(2))
    v2t = [math.log((e2 + 2) / e2), math.log((1 + e2 + es) / e2), math.log((2 + es) / es)]
    t2v = [math.log((e2 + 2) / e2), math.log((e2 + 2) / e2), math.log((1 + 2 * es) / es)]
    expected = (sum(v2t) / 3 + sum(t2v) / 3) / 2
    assert vtc_loss(video, text, 0.5).item() == pytest.approx(expected, rel=1e-12)


def test_vtc_matches_naive_reference_in_value_and_gradient() -> None:
    g = torch.Generator().manual_seed(0)
    v = F.normalize(torch.randn(5, 7, generator=g, dtype=torch.float64), dim=-1).requires_grad_()
    t = F.normalize(torch.randn(5, 7, generator=g, dtype=torch.float64), dim=-1).requires_grad_()
    fast = vtc_loss(v, t, 0.07)
    gv, gt = torch.autograd.grad(fast, (v, t))
    ref = naive_vtc(v, t, 0.07)
    rv, rt = torch.autograd.grad(ref, (v, t))
    torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gv, rv, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gt, rt, rtol=1e-10, atol=1e-12)


def test_vtc_rank_offset_with_a_simulated_gather() -> None:
    """Two 'ranks' each hold half the batch; their mean loss is the full-batch loss."""
    g = torch.Generator().manual_seed(1)
    v = F.normalize(torch.randn(6, 4, generator=g, dtype=torch.float64), dim=-1)
    t = F.normalize(torch.randn(6, 4, generator=g, dtype=torch.float64), dim=-1)
    full = vtc_loss(v, t, 0.1)
    halves = [slice(0, 3), slice(3, 6)]
    losses = []
    for rank, mine in enumerate(halves):
        other = halves[1 - rank]

        def gather(x, mine=mine, other=other):
            parts = {mine.start: x, other.start: (v if x.data_ptr() == v[mine].data_ptr() else t)[other]}
            return torch.cat([parts[0], parts[3]])

        vm, tm = v[mine], t[mine]
        logits_v2t, _ = vtc_logits(vm, tm, 0.1, gather=gather)
        assert logits_v2t.shape == (3, 6)
        losses.append(vtc_loss(vm, tm, 0.1, gather=gather, rank=rank))
    torch.testing.assert_close((losses[0] + losses[1]) / 2, full)
    # the wrong rank puts the positives at the other rank's columns and changes the loss
    wrong = vtc_loss(v[3:], t[3:], 0.1, gather=gather, rank=0)
    assert abs(wrong.item() - losses[1].item()) > 0.1
    with pytest.raises(ValueError, match="rank=2"):
        vtc_loss(v[:3], t[:3], 0.1, gather=lambda x: torch.cat([x, x]), rank=2)


def test_vtc_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"\(B, D\)"):
        vtc_loss(torch.randn(3, 4), torch.randn(2, 4), 0.07)


def test_clamp_temperature_in_place_and_still_learnable() -> None:
    for start, expected in [(1e-5, 0.001), (0.9, 0.5), (0.07, 0.07)]:
        temp = torch.nn.Parameter(torch.tensor(start))
        out = clamp_temperature(temp)
        assert out is temp and temp.requires_grad
        assert temp.item() == pytest.approx(expected)
    for lo, hi in [(0.5, 0.1), (0.2, 0.2)]:  # equal bounds are refused too: a temperature that cannot learn
        with pytest.raises(ValueError, match=rf"^temperature bounds must satisfy lo < hi, got lo={lo}, hi={hi}$"):
            clamp_temperature(torch.tensor(0.1), lo, hi)


# ----------------------------------------------------------------------------------------------- VTM


@pytest.mark.parametrize("scale", [1.0, 1000.0])
def test_hard_negatives_never_pick_the_positive(scale: float) -> None:
    for seed in range(300):
        g = torch.Generator().manual_seed(seed)
        b = 2 + seed % 7
        sim = torch.randn(b, b, generator=g) + 5 * torch.eye(b)  # the positive is the best match
        neg_t, neg_v = sample_hard_negatives(sim * scale, sim.t() * scale, generator=g)
        ar = torch.arange(b)
        assert neg_t.shape == neg_v.shape == (b,) and neg_t.dtype == torch.long
        assert (neg_t != ar).all() and (neg_v != ar).all()
        assert ((neg_t >= 0) & (neg_t < b)).all()


def test_hard_negatives_near_one_hot_pick_the_only_hard_one() -> None:
    # Temperature 0.001 makes the softmax over negatives one-hot on the hardest one.
    sim = torch.tensor([[1.0, 0.9, 0.1], [0.2, 1.0, 0.8], [0.7, 0.1, 1.0]]) / 0.001
    for seed in range(20):
        neg_t, neg_v = sample_hard_negatives(sim, sim.t(), generator=torch.Generator().manual_seed(seed))
        assert neg_t.tolist() == [1, 2, 0]
        assert neg_v.tolist() == [2, 0, 1]
    w = hard_negative_weights(sim)
    assert torch.isfinite(w).all() and (w.diagonal() == 0).all()
    torch.testing.assert_close(w.sum(1), torch.ones(3))


def test_hard_negative_frequencies_follow_the_softmax() -> None:
    sim = torch.tensor(
        [[3.0, 1.0, 0.0, -1.0], [0.5, 2.0, 1.5, 0.0], [0.0, 0.0, 0.0, 0.0], [2.0, -1.0, 0.3, 1.0]], dtype=torch.float64
    )
    expected = np.zeros((4, 4))
    for i in range(4):
        e = np.exp(sim[i].numpy())
        e[i] = 0.0
        expected[i] = e / e.sum()
    g = torch.Generator().manual_seed(123)
    n = 2500
    counts_t, counts_v = np.zeros((4, 4)), np.zeros((4, 4))
    for _ in range(n):
        neg_t, neg_v = sample_hard_negatives(sim, sim, generator=g)
        counts_t[np.arange(4), neg_t.numpy()] += 1
        counts_v[np.arange(4), neg_v.numpy()] += 1
    for counts in (counts_t, counts_v):
        assert (counts.diagonal() == 0).all()
        off = ~np.eye(4, dtype=bool)
        chi2 = (((counts - n * expected) ** 2)[off] / (n * expected)[off]).sum()
        assert chi2 < 26.1, f"chi-square {chi2:.1f} over 8 degrees of freedom (p=0.001 critical value 26.1)"


def test_hard_negatives_reproducible_and_errors() -> None:
    sim = torch.randn(6, 6, generator=torch.Generator().manual_seed(0))
    a = sample_hard_negatives(sim, sim.t(), generator=torch.Generator().manual_seed(5))
    b = sample_hard_negatives(sim, sim.t(), generator=torch.Generator().manual_seed(5))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="at least 2"):
        sample_hard_negatives(torch.zeros(1, 1), torch.zeros(1, 1))
    with pytest.raises(ValueError, match="square"):
        sample_hard_negatives(torch.zeros(2, 4), torch.zeros(2, 4))


def test_vtm_labels_pairs_and_loss_value() -> None:
    assert vtm_labels(3).tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 0]
    text_idx, video_idx = vtm_pair_indices(torch.tensor([1, 0]), torch.tensor([1, 0]))
    assert text_idx.tolist() == [0, 1, 0, 1, 1, 0]
    assert video_idx.tolist() == [0, 1, 1, 0, 0, 1]
    ln3 = math.log(3)
    logits = torch.tensor([[0.0, ln3], [ln3, 0.0], [0.0, 0.0]], requires_grad=True)
    loss = vtm_loss(logits)
    assert loss.item() == pytest.approx((2 * math.log(4 / 3) + math.log(2)) / 3, rel=1e-6)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="3B"):
        vtm_loss(torch.zeros(4, 2))


@pytest.mark.gpu
def test_losses_do_not_sync_on_cuda() -> None:
    """Sampling negatives and every loss (forward and backward) run without a device-to-host sync."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    b, m = 64, 10
    v = F.normalize(torch.randn(b, 16, device=dev), dim=-1).requires_grad_()
    t = F.normalize(torch.randn(b, 16, device=dev), dim=-1).requires_grad_()
    vtm_logits = torch.randn(3 * b, 2, device=dev, requires_grad=True)
    mlm_logits = torch.randn(b, 8, 50, device=dev, requires_grad=True)
    labels = torch.randint(0, 50, (b, 8), device=dev).masked_fill(torch.rand(b, 8, device=dev) > 0.15, IGNORE_INDEX)
    tokens = torch.randn(b, 16, 32, device=dev, requires_grad=True)
    token_mask = torch.rand(b, 16, device=dev) > 0.5
    pem_logits = torch.randn(b, m, device=dev, requires_grad=True)
    prompts = F.normalize(torch.randn(m, 16, device=dev), dim=-1)

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        logits_v2t, logits_t2v = vtc_logits(v, t, 0.07)
        neg_t, neg_v = sample_hard_negatives(logits_v2t, logits_t2v, generator=g)
        q = pseudo_labels(v.detach(), prompts, 0.07)
        keep = pem_keep_mask(q, "paper") | pem_keep_mask(q, "official_code")
        pooled = pool_box_tokens(tokens, token_mask)
        total = vtc_loss(v, t, 0.07) + vtm_loss(vtm_logits) + mlm_loss(mlm_logits, labels)
        total = total + pem_loss(pem_logits + pooled.sum(), q, keep)
        total.backward()
        return neg_t, neg_v

    step()  # warm-up: lazy initialisation may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        neg_t, neg_v = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ar = torch.arange(b, device=dev)
    assert neg_t.is_cuda and (neg_t != ar).all() and (neg_v != ar).all()
    assert torch.isfinite(v.grad).all() and torch.isfinite(tokens.grad).all()


# ----------------------------------------------------------------------------------------------- MLM

CLS, SEP, PAD, MASK = 101, 102, 0, 103
SPECIALS = (CLS, SEP, PAD, MASK)


def _caption_batch(b: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (b, length), generator=g)
    lengths = torch.randint(length // 2, length - 1, (b,), generator=g)
    ids[:, 0] = CLS
    for i, n in enumerate(lengths.tolist()):
        ids[i, n] = SEP
        ids[i, n + 1 :] = PAD
    return ids


def test_mask_tokens_rates_specials_and_labels() -> None:
    vocab = 30522
    ids = _caption_batch(2000, 40, vocab)
    before = ids.clone()
    masked, labels = mask_tokens(
        ids, vocab_size=vocab, mask_token_id=MASK, special_ids=SPECIALS, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(ids, before), "input must not be modified"
    special = torch.isin(ids, torch.tensor(SPECIALS))
    selected = labels != IGNORE_INDEX
    # specials are never selected nor changed; labels hold the original id exactly where selected
    assert not selected[special].any()
    assert torch.equal(masked[special], ids[special])
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(masked[~selected], ids[~selected])
    rate = selected.sum().item() / (~special).sum().item()
    assert abs(rate - 0.15) < 0.005
    n_sel = selected.sum().item()
    to_mask = (masked == MASK) & selected
    changed = (masked != ids) & (masked != MASK) & selected
    kept = (masked == ids) & selected
    assert abs(to_mask.sum().item() / n_sel - 0.8) < 0.01
    assert abs(changed.sum().item() / n_sel - 0.1) < 0.01
    assert abs(kept.sum().item() / n_sel - 0.1) < 0.01


def test_mask_tokens_special_mask_and_random_exclusion() -> None:
    ids = torch.randint(5, 10, (400, 30), generator=torch.Generator().manual_seed(1))
    pad_mask = torch.zeros_like(ids, dtype=torch.bool)
    pad_mask[:, 20:] = True  # e.g. attention_mask == 0
    _, labels = mask_tokens(ids, vocab_size=10, mask_token_id=4, special_mask=pad_mask, prob=0.5)
    assert (labels[:, 20:] == IGNORE_INDEX).all() and (labels[:, :20] != IGNORE_INDEX).any()
    # tiny vocabulary: the default random draw hits special ids, the excluding one never does
    specials = (0, 1, 2, 3)
    kw = dict(vocab_size=10, mask_token_id=4, special_ids=specials, prob=1.0, mask_frac=0.0, random_frac=1.0)
    default, _ = mask_tokens(ids, generator=torch.Generator().manual_seed(2), **kw)
    excl, _ = mask_tokens(ids, random_excludes_special=True, generator=torch.Generator().manual_seed(2), **kw)
    assert torch.isin(default, torch.tensor([*specials, 4])).any()
    assert not torch.isin(excl, torch.tensor([*specials, 4])).any()
    with pytest.raises(ValueError, match=r"with sum <= 1; got prob=0.15, mask_frac=0.9, random_frac=0.2"):
        mask_tokens(ids, vocab_size=10, mask_token_id=4, mask_frac=0.9, random_frac=0.2)
    with pytest.raises(ValueError, match=r"\(B, L\)"):
        mask_tokens(ids[0], vocab_size=10, mask_token_id=4)
    # seeded, the excluding draw is reproducible too; a 0/1 integer special mask is a mask like a bool one
    again, _ = mask_tokens(ids, random_excludes_special=True, generator=torch.Generator().manual_seed(2), **kw)
    assert torch.equal(again, excl)
    as_bool = mask_tokens(
        ids, vocab_size=10, mask_token_id=4, special_mask=pad_mask, prob=0.5, generator=torch.Generator().manual_seed(3)
    )
    as_int = mask_tokens(
        ids,
        vocab_size=10,
        mask_token_id=4,
        special_mask=pad_mask.long(),
        prob=0.5,
        generator=torch.Generator().manual_seed(3),
    )
    assert all(torch.equal(a, b) for a, b in zip(as_bool, as_int, strict=True))
    message = re.escape("special_mask must match input_ids (400, 30), got (400, 29)")
    with pytest.raises(ValueError, match=f"^{message}$"):
        mask_tokens(ids, vocab_size=10, mask_token_id=4, special_mask=pad_mask[:, 1:])
    for edge in ({"prob": 0.0}, {"random_frac": 0.0}, {"mask_frac": 0.0, "random_frac": 1.0}):  # allowed ends
        mask_tokens(ids, vocab_size=10, mask_token_id=4, **edge)
    none, labels = mask_tokens(ids, vocab_size=10, mask_token_id=4, prob=0.0)
    assert torch.equal(none, ids) and (labels == IGNORE_INDEX).all()
    narrow, _ = mask_tokens(ids.int(), vocab_size=10, mask_token_id=4, prob=1.0, mask_frac=0.0, random_frac=1.0)
    assert narrow.dtype == torch.int32  # random replacements keep the ids' dtype
    for bad in ({"prob": 1.5}, {"mask_frac": -0.1}, {"random_frac": -0.1}):  # each one alone is refused
        with pytest.raises(ValueError, match="with sum <= 1"):
            mask_tokens(ids, vocab_size=10, mask_token_id=4, **bad)


def test_mlm_loss_value_and_empty_selection() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g, requires_grad=True)
    labels = torch.full((2, 5), IGNORE_INDEX)
    labels[0, 1], labels[1, 3], labels[1, 4] = 7, 2, 0
    loss = mlm_loss(logits, labels)
    logp = F.log_softmax(logits, dim=-1)
    expected = -(logp[0, 1, 7] + logp[1, 3, 2] + logp[1, 4, 0]) / 3
    torch.testing.assert_close(loss, expected)
    none = mlm_loss(logits, torch.full((2, 5), IGNORE_INDEX))
    (grad,) = torch.autograd.grad(none, logits)
    assert none.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))


# ----------------------------------------------------------------------------------------------- PEM


@pytest.mark.parametrize("grid", [(14, 14), (7, 7), (4, 4), (6, 10), (3, 3)])
@pytest.mark.parametrize("ratio_dist", ["uniform", "log_uniform"])
def test_pem_box_geometry(grid: tuple[int, int], ratio_dist: str) -> None:
    gh, gw = grid
    out = sample_pem_boxes(
        3000, gh, gw, patch_size=16, ratio_dist=ratio_dist, generator=torch.Generator().manual_seed(0)
    )
    top, left, h, w = out.boxes.unbind(1)
    frac = (h * w).double() / (gh * gw)
    aspect = h.double() / w.double()
    assert (frac >= 0.3 - 1e-9).all() and (frac <= 0.5 + 1e-9).all()
    assert (aspect >= 0.3 - 1e-9).all() and (aspect <= 1 / 0.3 + 1e-9).all()
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= gh).all() and (left + w <= gw).all()
    assert torch.equal(out.pixel_boxes, out.boxes * 16)
    assert out.token_mask.shape == (3000, gh * gw) and out.token_mask.dtype == torch.bool
    assert torch.equal(out.token_mask.sum(1), h * w)
    # every placement is reachable: boxes touch all four borders somewhere in the sample
    assert top.min() == 0 and left.min() == 0 and (top + h).max() == gh and (left + w).max() == gw


def test_pem_box_ratio_distributions_differ_as_documented() -> None:
    def tall_share(dist: str) -> float:
        b = sample_pem_boxes(4000, 14, 14, ratio_dist=dist, generator=torch.Generator().manual_seed(3)).boxes
        return (b[:, 2] > b[:, 3]).double().mean().item() / max((b[:, 2] < b[:, 3]).double().mean().item(), 1e-9)

    assert tall_share("uniform") > 2.0  # uniform r = h/w in [0.3, 3.33] favours tall boxes
    assert 0.75 < tall_share("log_uniform") < 1.33


def test_pem_box_fallbacks_and_single_box() -> None:
    # one try per clip on a 2x2 grid: many rows go through the fallback, all still valid (1x2 or 2x1)
    out = sample_pem_boxes(500, 2, 2, max_tries=1, generator=torch.Generator().manual_seed(0))
    assert set(map(tuple, out.boxes[:, 2:].tolist())) == {(1, 2), (2, 1)}
    # a 1x1 grid cannot satisfy the area range; the nearest size (the whole frame) is returned
    assert sample_pem_box(1, 1) == Box(0, 0, 1, 1)
    box = sample_pem_box(14, 14, generator=torch.Generator().manual_seed(7))
    assert isinstance(box, Box) and 0.3 <= box.area / 196 <= 0.5
    assert box.to_pixels(16) == Box(box.top * 16, box.left * 16, box.height * 16, box.width * 16)
    with pytest.raises(ValueError, match="area"):
        sample_pem_boxes(2, 4, 4, area=(0.6, 0.5))
    with pytest.raises(ValueError, match="ratio_dist"):
        sample_pem_boxes(2, 4, 4, ratio_dist="gauss")


def _nearest_sizes_by_loops(grid_h: int, grid_w: int, area: tuple, ratio: tuple) -> set[tuple[int, int]]:
    """Every [h, w] on the grid inside both ranges; if none is, the ones nearest to them (the distance of the
    area share to its range plus that of log(h / w) to log of the ratio range, ties within 1e-9)."""
    sizes = [(h, w) for h in range(1, grid_h + 1) for w in range(1, grid_w + 1)]
    eps = 1e-9

    def inside(h: int, w: int) -> bool:
        frac, aspect = h * w / (grid_h * grid_w), h / w
        return area[0] - eps <= frac <= area[1] + eps and ratio[0] - eps <= aspect <= ratio[1] + eps

    valid = {s for s in sizes if inside(*s)}
    if valid:
        return valid

    def gap(h: int, w: int) -> float:
        frac, log_aspect = h * w / (grid_h * grid_w), math.log(h / w)
        lo, hi = math.log(ratio[0]), math.log(ratio[1])
        return max(area[0] - frac, 0) + max(frac - area[1], 0) + max(lo - log_aspect, 0) + max(log_aspect - hi, 0)

    best = min(gap(*s) for s in sizes)
    return {s for s in sizes if gap(*s) <= best + eps}


@pytest.mark.parametrize(
    ("grid", "area", "ratio"),
    [
        ((4, 6), (0.3, 0.5), (0.3, 1 / 0.3)),  # sizes in range: all of them are options
        ((3, 5), (0.95, 1.0), (2.0, 3.0)),  # only the whole grid has the area, at the wrong aspect
        ((5, 3), (0.05, 0.1), (0.2, 0.3)),  # small and wide on a tall grid: nothing fits
        ((2, 7), (0.5, 0.6), (1.5, 2.0)),  # tall boxes on a wide, short grid
        ((1, 1), (0.3, 0.5), (0.3, 1 / 0.3)),  # the whole frame is the only size
        # two sizes, each outside one range: the nearer wins, the area's gap and the ratio's added (1x1 here)
        ((1, 2), (0.3, 0.81), (0.16, 0.88)),  # 1x1: ratio 1 over 0.88; 1x2: area 1 over 0.81
        ((2, 1), (0.25, 0.75), (1.07, 2.07)),  # 1x1: ratio 1 under 1.07; 2x1: area 1 over 0.75
    ],
)
def test_pem_fallback_sizes_are_the_nearest_grid_sizes(grid: tuple, area: tuple, ratio: tuple) -> None:
    from vlp.losses.entity import _fallback_sizes

    got = _fallback_sizes(*grid, area, ratio)
    assert got.dtype == torch.int64 and got.ndim == 2 and got.shape[1] == 2
    assert set(map(tuple, got.tolist())) == _nearest_sizes_by_loops(*grid, area, ratio)
    assert got.shape[0] == len(_nearest_sizes_by_loops(*grid, area, ratio))  # each size once


def test_pem_box_ranges_are_checked_at_their_bounds() -> None:
    """The ranges' ends are allowed (a box of exactly the area or ratio bound, one size only), one step past is
    refused with a message that names the range."""
    gen = torch.Generator().manual_seed(0)
    for area, ratio in [((0.25, 0.25), (1.0, 1.0)), ((0.25, 1.0), (0.5, 2.0))]:  # lo == hi (2x2 only); hi == 1
        boxes = sample_pem_boxes(4, 4, 4, area=area, ratio=ratio, generator=gen).boxes
        frac, aspect = boxes[:, 2] * boxes[:, 3] / 16, boxes[:, 2] / boxes[:, 3]
        assert bool(((frac >= area[0]) & (frac <= area[1]) & (aspect >= ratio[0]) & (aspect <= ratio[1])).all())
    area_msg = r"^area must satisfy 0 < lo <= hi <= 1 \(fractions of the frame\), got "
    for area in [(0.0, 0.5), (0.5, 0.4), (0.3, 1.01)]:
        with pytest.raises(ValueError, match=area_msg + re.escape(str(area)) + "$"):
            sample_pem_boxes(2, 4, 4, area=area)
    for ratio in [(0.0, 1.0), (2.0, 1.0)]:
        with pytest.raises(ValueError, match=r"^ratio \(height / width\) must satisfy 0 < lo <= hi, got "):
            sample_pem_boxes(2, 4, 4, ratio=ratio)
    for grid in [(0, 4), (4, 0)]:
        with pytest.raises(ValueError, match=f"^grid must be at least 1x1, got {grid[0]}x{grid[1]}$"):
            sample_pem_boxes(2, *grid)


def test_pem_valid_sizes_include_both_ends_of_each_range() -> None:
    from vlp.losses.entity import _valid_sizes

    h, w = torch.tensor([2, 2, 4, 1, 4, 3]), torch.tensor([2, 4, 2, 4, 1, 3])
    # on 4x4 with area [0.25, 0.5] and ratio [0.5, 2]: 2x2 is the lowest area, 2x4 the highest area and lowest
    # ratio, 4x2 the highest ratio; 1x4 (ratio 0.25), 4x1 (ratio 4) and 3x3 (area 0.5625) are outside
    assert _valid_sizes(h, w, 4, 4, (0.25, 0.5), (0.5, 2.0)).tolist() == [True, True, True, False, False, False]
    # one column wide: h / w is h (2x1 on a 2x1 grid has ratio 2, inside [1.5, 2])
    assert _valid_sizes(torch.tensor([2, 1]), torch.tensor([1, 1]), 2, 1, (0.5, 1.0), (1.5, 2.0)).tolist() == [
        True,
        False,
    ]


def test_box_token_mask_row_major() -> None:
    mask = box_token_mask(torch.tensor([[1, 2, 2, 1]]), 3, 4)
    expected = torch.zeros(3, 4, dtype=torch.bool)
    expected[1:3, 2:3] = True
    assert torch.equal(mask[0], expected.reshape(-1))
    assert mask[0].nonzero().squeeze(1).tolist() == [6, 10]


def test_crop_frames_both_modes() -> None:
    h, w = 32, 48
    rows = torch.arange(h, dtype=torch.float32)[:, None].expand(h, w)
    cols = torch.arange(w, dtype=torch.float32)[None, :].expand(h, w)
    frames = torch.stack([rows, cols, rows * 100 + cols])[None, None].repeat(2, 3, 1, 1, 1)  # (2, 3, 3, H, W)
    frames[1] += 7.0
    boxes = torch.tensor([[8, 16, 16, 24], [0, 0, 32, 48]])
    zeroed = crop_frames(frames, boxes, mode="zero_outside")
    assert torch.equal(zeroed[0, :, :, 8:24, 16:40], frames[0, :, :, 8:24, 16:40])
    assert zeroed[0].abs().sum() == zeroed[0, :, :, 8:24, 16:40].abs().sum()
    assert torch.equal(zeroed[1], frames[1])
    # the code blacks out raw pixels: on normalised frames that is -mean/std per channel, not 0 (grey)
    black = torch.tensor([-1.0, -2.0, -3.0])
    filled = crop_frames(frames, boxes, mode="zero_outside", fill=black)
    assert torch.equal(filled[0, :, :, 8:24, 16:40], frames[0, :, :, 8:24, 16:40])
    outside = torch.ones(h, w, dtype=torch.bool)
    outside[8:24, 16:40] = False
    assert torch.equal(filled[0][:, :, outside], black.view(1, 3, 1).expand(3, 3, int(outside.sum())))
    # resizing to the box's own size samples exactly the box pixels; the full box is the identity
    same = crop_frames(frames[:1], boxes[:1], size=(16, 24))
    torch.testing.assert_close(same[0], frames[0, :, :, 8:24, 16:40], atol=1e-3, rtol=1e-5)
    full = crop_frames(frames[1:], boxes[1:])
    torch.testing.assert_close(full, frames[1:], atol=1e-3, rtol=1e-5)
    # stretched (16x24 box -> 32x48) or squeezed, it equals F.interpolate of the cropped pixels
    for size in [(32, 48), (5, 7)]:
        got = crop_frames(frames, boxes, size=size)
        for i, (t0, l0, bh, bw) in enumerate(boxes.tolist()):
            crop = frames[i, :, :, t0 : t0 + bh, l0 : l0 + bw]
            ref = F.interpolate(crop, size=size, mode="bilinear", align_corners=False)
            torch.testing.assert_close(got[i], ref, atol=1e-3, rtol=1e-5)
    assert got.shape == (2, 3, 3, 5, 7)
    with pytest.raises(ValueError, match="mode"):
        crop_frames(frames, boxes, mode="blur")
    # double frames stay double in both modes, and give the same crops
    for mode in ("resize", "zero_outside"):
        wide = crop_frames(frames.double(), boxes, mode=mode, size=(5, 7) if mode == "resize" else None)
        assert wide.dtype == torch.float64
        narrow = crop_frames(frames, boxes, mode=mode, size=(5, 7) if mode == "resize" else None)
        torch.testing.assert_close(wide, narrow.double(), atol=1e-3, rtol=1e-5)
    # in double precision the whole computation is double: equal to F.interpolate of the crop far below float32's
    # resolution, and grid_sample is told its corner convention (no warning about the default)
    odd = torch.tensor([[3, 5, 13, 29], [1, 2, 30, 45]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = crop_frames(frames.double() * 1.001, odd, size=(11, 17))
    for i, (t0, l0, bh, bw) in enumerate(odd.tolist()):
        crop = frames[i, :, :, t0 : t0 + bh, l0 : l0 + bw].double() * 1.001
        ref = F.interpolate(crop, size=(11, 17), mode="bilinear", align_corners=False)
        torch.testing.assert_close(got[i], ref, atol=1e-9, rtol=1e-12)
    message = r"^expected frames \(B, T, C, H, W\) and boxes \(B, 4\), got \(2, 3, 3, 32, 48\), \(2, 3\)$"
    with pytest.raises(ValueError, match=message):  # the boxes alone are wrong
        crop_frames(frames, boxes[:, :3])
    with pytest.raises(ValueError, match=r"got \(3, 3, 32, 48\), \(2, 4\)$"):  # the frames alone
        crop_frames(frames[0], boxes)


def test_pseudo_labels_hand_value_and_no_grad() -> None:
    crop = torch.tensor([[1.0, 0.0]], requires_grad=True)
    prompts = torch.tensor([[1.0, 0.0], [0.0, 1.0], [r := 1 / math.sqrt(2), r]])
    q = pseudo_labels(crop, prompts, 0.5)
    e = [math.exp(2), 1.0, math.exp(2 * r)]
    torch.testing.assert_close(q, torch.tensor([[v / sum(e) for v in e]]))
    assert not q.requires_grad


def test_pem_keep_mask_both_rules() -> None:
    pseudo = torch.tensor(
        [
            [0.90, 0.02, 0.02, 0.02, 0.02, 0.02],  # top idx 0, confident
            [0.17, 0.17, 0.16, 0.18, 0.16, 0.16],  # top idx 3, unsure
            [0.06, 0.06, 0.06, 0.06, 0.06, 0.70],  # top idx 5, confident
            [0.18, 0.17, 0.17, 0.16, 0.16, 0.16],  # top idx 0, unsure
        ]
    )
    assert pem_keep_mask(pseudo, "paper").tolist() == [True, False, True, False]
    assert pem_keep_mask(pseudo, "official_code").tolist() == [False, True, True, False]
    # official rule is literal: a threshold of 3.5 drops the crops whose argmax index is 0..3
    assert pem_keep_mask(pseudo, "official_code", threshold=3.5).tolist() == [False, False, True, False]
    with pytest.raises(ValueError, match="rule"):
        pem_keep_mask(pseudo, "other")


def test_pool_box_tokens_hand_mean() -> None:
    tokens = torch.randn(3, 6, 4, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 0, 1, 0, 0, 1], [0] * 6, [1] * 6], dtype=torch.bool)
    pooled = pool_box_tokens(tokens, mask)
    torch.testing.assert_close(pooled[0], (tokens[0, 0] + tokens[0, 2] + tokens[0, 5]) / 3)
    torch.testing.assert_close(pooled[1], torch.zeros(4))
    torch.testing.assert_close(pooled[2], tokens[2].mean(0))
    with pytest.raises(ValueError, match=r"token_mask \(3, 5\) does not match tokens"):
        pool_box_tokens(tokens, mask[:, :5])


def test_pem_loss_hand_value_gradient_and_none_kept() -> None:
    ln3 = math.log(3)
    logits = torch.tensor([[0.0, ln3], [50.0, -50.0], [ln3, 0.0]], requires_grad=True)  # p0 = [1/4, 3/4]
    pseudo = torch.tensor([[0.5, 0.5], [0.0, 1.0], [0.25, 0.75]])
    keep = torch.tensor([True, False, True])
    loss = pem_loss(logits, pseudo, keep)
    ce0 = -(0.5 * math.log(0.25) + 0.5 * math.log(0.75))
    ce2 = -(0.25 * math.log(0.75) + 0.75 * math.log(0.25))
    assert loss.item() == pytest.approx((ce0 + ce2) / 2, rel=1e-6)
    loss.backward()
    p = torch.softmax(logits.detach(), 1)
    expected_grad = (p - pseudo) / 2
    expected_grad[1] = 0
    torch.testing.assert_close(logits.grad, expected_grad)
    logits.grad = None
    none = pem_loss(logits, pseudo, torch.zeros(3, dtype=torch.bool))
    none.backward()
    assert none.item() == 0.0 and none.requires_grad and torch.equal(logits.grad, torch.zeros(3, 2))


def test_negative_modes_and_excluded_pairs() -> None:
    from vlp.losses.matching import hard_negative_weights, sample_hard_negatives

    b = 6
    sim = torch.zeros(b, b)
    sim[:, 1] = 50.0  # item 1 is everyone's hardest negative
    same = torch.zeros(b, b, dtype=torch.bool)
    same[0, 1] = same[1, 0] = True  # items 0 and 1 are two captions of one clip
    w = hard_negative_weights(sim, exclude=same)
    assert w[0, 1] == 0 and w[0, 0] == 0 and w[2, 1] > 0.99  # row 0 may not draw its clip's other caption
    gen = torch.Generator().manual_seed(0)
    draws = {mode: [] for mode in ("hard", "uniform", "mixed")}
    for mode in draws:
        for _ in range(300):
            t, v = sample_hard_negatives(sim, sim.t(), gen, mode=mode, exclude=same)
            assert (t != torch.arange(b)).all() and (v != torch.arange(b)).all()
            assert t[0] != 1 and v[0] != 1 and t[1] != 0 and v[1] != 0  # never the same clip
            draws[mode].append(t[2].item())
    share = {mode: sum(x == 1 for x in xs) / len(xs) for mode, xs in draws.items()}
    assert share["hard"] > 0.99 and 0.1 < share["uniform"] < 0.3 and 0.45 < share["mixed"] < 0.75, share
    everything = ~torch.eye(b, dtype=torch.bool)  # a row with nothing left keeps every other item
    assert torch.allclose(hard_negative_weights(torch.zeros(b, b), exclude=everything).sum(1), torch.ones(b))
    with pytest.raises(ValueError, match="mode"):
        sample_hard_negatives(sim, sim.t(), mode="hardest")


def test_vtc_with_same_clip_positives_is_albefs_soft_target() -> None:
    gen = torch.Generator().manual_seed(3)
    v = F.normalize(torch.randn(4, 8, generator=gen), dim=-1)
    t = F.normalize(torch.randn(4, 8, generator=gen), dim=-1)
    eye = torch.eye(4, dtype=torch.bool)
    assert torch.allclose(vtc_loss(v, t, 0.1, positives=eye), vtc_loss(v, t, 0.1))
    ids = torch.tensor([0, 0, 1, 2])  # rows 0 and 1 caption the same clip
    same = ids[:, None] == ids[None, :]
    logits_v2t, logits_t2v = vtc_logits(v, t, 0.1)
    target = same.float() / same.sum(1, keepdim=True)
    manual = -(target * logits_v2t.log_softmax(1)).sum(1).mean() - (target * logits_t2v.log_softmax(1)).sum(1).mean()
    assert torch.allclose(vtc_loss(v, t, 0.1, positives=same), manual / 2)
    assert not torch.allclose(vtc_loss(v, t, 0.1, positives=same), vtc_loss(v, t, 0.1))
    with pytest.raises(ValueError, match="own pair"):
        vtc_loss(v, t, 0.1, positives=torch.zeros(4, 4, dtype=torch.bool))


# ------------------------------------------------------------------- PEM: exact draws, bounds, defaults


def _draw_sizes_by_hand(batch, grid_h, grid_w, area, ratio, dist, tries, gen):
    """The size draw written out with the same generator calls: ``tries`` candidates (area share, ratio) per
    clip, the first valid one kept; a clip with none takes a uniform pick among the nearest sizes."""
    n = grid_h * grid_w
    a = area[0] + (area[1] - area[0]) * torch.rand(batch, tries, generator=gen, dtype=torch.float64)
    u = torch.rand(batch, tries, generator=gen, dtype=torch.float64)
    lo, hi = ratio
    r = lo + (hi - lo) * u if dist == "uniform" else torch.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * u)
    out, missing = [], []
    for i in range(batch):
        for k in range(tries):
            h, w = (
                round(math.sqrt(a[i, k].item() * n * r[i, k].item())),
                round(math.sqrt(a[i, k].item() * n / r[i, k].item())),
            )
            frac, aspect = h * w / n, h / max(w, 1)
            if (
                1 <= h <= grid_h
                and 1 <= w <= grid_w
                and area[0] - 1e-9 <= frac <= area[1] + 1e-9
                and lo - 1e-9 <= aspect <= hi + 1e-9
            ):
                out.append((h, w))
                break
        else:
            out.append(None)
            missing.append(i)
    if missing:
        options = sorted(_nearest_sizes_by_loops(grid_h, grid_w, area, ratio))
        pick = torch.randint(len(options), (len(missing),), generator=gen)
        for i, p in zip(missing, pick.tolist(), strict=True):
            out[i] = options[p]
    return out


@pytest.mark.parametrize("dist", ["uniform", "log_uniform"])
@pytest.mark.parametrize(("grid", "tries"), [((14, 14), 3), ((4, 6), 1), ((2, 2), 1)])
def test_pem_box_sizes_are_the_documented_draws(dist: str, grid: tuple, tries: int) -> None:
    """Seeded, the sizes are exactly the first valid candidate of each clip's draws, or a pick among the nearest
    sizes (the fallback) from the same generator: the ratio law, the bounds and the pick are all pinned."""
    from vlp.losses.entity import _draw_sizes

    area, ratio = (0.3, 0.5), (0.3, 1 / 0.3)
    got = _draw_sizes(300, *grid, area, ratio, dist, tries, torch.Generator().manual_seed(5))
    want = _draw_sizes_by_hand(300, *grid, area, ratio, dist, tries, torch.Generator().manual_seed(5))
    assert list(map(tuple, got.tolist())) == want


def test_pem_boxes_are_reproducible_and_the_single_box_is_the_first_of_a_batch() -> None:
    for kwargs in ({}, {"area": (0.2, 0.4), "ratio": (0.5, 2.0), "ratio_dist": "log_uniform", "max_tries": 5}):
        one = sample_pem_box(14, 14, generator=torch.Generator().manual_seed(11), **kwargs)
        first = sample_pem_boxes(
            1, 14, 14, max_tries=kwargs.pop("max_tries", 64), generator=torch.Generator().manual_seed(11), **kwargs
        )
        assert tuple(first.boxes[0].tolist()) == (one.top, one.left, one.height, one.width)
    a, b = (sample_pem_boxes(500, 2, 2, max_tries=1, generator=torch.Generator().manual_seed(0)) for _ in range(2))
    assert torch.equal(a.boxes, b.boxes)  # the fallback's pick draws from the generator too
    out = sample_pem_boxes(3, 14, 14, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out.pixel_boxes, out.boxes * 16)  # the default patch size is 16 pixels
    assert Box(2, 3, 4, 5).to_pixels(16) == Box(32, 48, 64, 80)
    for batch, tries in ((0, 4), (4, 0)):
        with pytest.raises(ValueError, match=f"^batch_size and max_tries must be >= 1, got {batch} and {tries}$"):
            sample_pem_boxes(batch, 4, 4, max_tries=tries)


def test_pem_keep_mask_threshold_is_inclusive_in_both_rules() -> None:
    pseudo = torch.tensor([[0.25, 0.75], [0.75, 0.25], [0.5, 0.5]])
    assert pem_keep_mask(pseudo, threshold=0.75).tolist() == [True, True, False]  # default rule: the paper's
    assert pem_keep_mask(pseudo, "official_code", threshold=1.0).tolist() == [True, False, False]  # argmax >= 1
    with pytest.raises(ValueError, match="rule must be 'paper' or 'official_code', got 'code'"):
        pem_keep_mask(pseudo, "code")


def test_pem_loss_refuses_shapes_that_disagree_and_a_one_token_box_pools_that_token() -> None:
    logits, pseudo = torch.zeros(2, 3), torch.full((2, 3), 1 / 3)
    for bad in [
        (torch.zeros(2, 4), pseudo, torch.ones(2, dtype=torch.bool)),
        (logits, pseudo, torch.ones(3, dtype=torch.bool)),
    ]:
        shapes = ", ".join(str(tuple(t.shape)) for t in bad)
        with pytest.raises(ValueError, match=re.escape(f"expected logits/pseudo (B, M) and keep (B,), got {shapes}")):
            pem_loss(*bad)
    tokens = torch.arange(12.0).reshape(1, 4, 3)
    mask = torch.tensor([[False, False, True, False]])
    assert pool_box_tokens(tokens, mask).tolist() == [[6.0, 7.0, 8.0]]


def test_vtm_shapes_are_checked_with_their_messages() -> None:
    with pytest.raises(ValueError, match=r"^batch_size must be >= 1, got 0$"):
        vtm_labels(0)
    for bad in (torch.zeros(6, 3), torch.zeros(6)):  # two columns, and a matrix
        with pytest.raises(
            ValueError, match=rf"^VTM logits must be \(3B, 2\), got {re.escape(str(tuple(bad.shape)))}$"
        ):
            vtm_loss(bad)
    with pytest.raises(ValueError, match=r"^VTM logits need 3B rows \(B positives \+ 2B negatives\), got 7$"):
        vtm_loss(torch.zeros(7, 2))


def test_mlm_loss_of_one_masked_token_and_its_shape_error() -> None:
    logits = torch.zeros(1, 3, 4)
    logits[0, 1, 2] = math.log(3.0)  # p(2) = 3/6 at the one masked position
    labels = torch.tensor([[IGNORE_INDEX, 2, IGNORE_INDEX]])
    assert float(mlm_loss(logits, labels)) == pytest.approx(-math.log(0.5))
    message = re.escape("logits (B, L, V) (1, 3, 4) do not match labels (B, L) (1, 2)")
    with pytest.raises(ValueError, match=f"^{message}$"):
        mlm_loss(logits, labels[:, :2])


def test_mean_pool_scores_are_cosines() -> None:
    from vlp.losses.frames import mean_pool_scores

    text = F.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), dim=-1)
    frames = torch.tensor([[[3.0, 0.0], [3.0, 0.0]], [[0.0, 4.0], [2.0, 2.0]]])  # clip means (3, 0) and (1, 3)
    want = torch.tensor([[1.0, 1 / math.sqrt(10)], [0.0, 3 / math.sqrt(10)]])
    torch.testing.assert_close(mean_pool_scores(text, frames), want)


def test_hard_negative_exclusions_are_per_row_and_a_row_left_empty_keeps_every_other_item() -> None:
    sim = torch.zeros(3, 3)  # equal similarities: the weights are uniform over what a row may draw
    exclude = torch.tensor([[False, True, True], [False, False, False], [True, False, False]])
    # row 0 excludes both others: it falls back to them; row 1 excludes nothing; row 2 excludes item 0
    want = torch.tensor([[0.0, 0.5, 0.5], [0.5, 0.0, 0.5], [0.0, 1.0, 0.0]])
    torch.testing.assert_close(hard_negative_weights(sim, exclude=exclude), want)
    torch.testing.assert_close(hard_negative_weights(sim, exclude=exclude.long()), want)  # 0/1 works as bool
    with pytest.raises(ValueError, match=r"^exclude must be \(3, 3\), got \(3, 2\)$"):
        hard_negative_weights(sim, exclude=exclude[:, :2])
