"""Temporal samplers: pure integer maths, checked exhaustively on small sizes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from vlp.data.sampling import MODES, sample_indices, segment_bounds

SIZES = [(n, k) for n, k in itertools.product([1, 2, 3, 5, 8, 16, 17, 31, 100, 301], [1, 2, 3, 4, 8, 16])]


@pytest.mark.parametrize(("n", "k"), SIZES)
def test_segment_bounds_tile_the_clip(n, k):
    bounds = segment_bounds(n, k)
    assert len(bounds) == k
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    lengths = [end - start for start, end in bounds]
    assert max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("n", "k"), SIZES)
def test_every_mode_gives_k_sorted_indices_in_range(mode, n, k):
    idx = sample_indices(n, k, mode, rng=np.random.default_rng(n * 100 + k))
    assert len(idx) == k
    assert all(isinstance(i, int) and 0 <= i < n for i in idx)
    assert idx == sorted(idx)
    if n >= k:  # enough frames: no frame is used twice
        assert len(set(idx)) == k


@pytest.mark.parametrize("mode", ["rand", "uniform"])
@pytest.mark.parametrize(("n", "k"), [(n, k) for n, k in SIZES if n >= k])
def test_rand_and_uniform_take_one_frame_per_segment(mode, n, k):
    idx = sample_indices(n, k, mode, rng=7)
    for i, (start, end) in zip(idx, segment_bounds(n, k), strict=True):
        assert start <= i < end


def test_uniform_is_the_middle_of_each_segment_and_deterministic():
    idx = sample_indices(300, 16, "uniform")
    assert idx == [9, 27, 46, 65, 84, 102, 121, 140, 159, 177, 196, 215, 234, 252, 271, 290]
    assert idx == sample_indices(300, 16, "uniform", rng=123) == sample_indices(300, 16)
    assert sample_indices(10, 1, "uniform") == [5]


def test_uniform_covers_the_end_of_the_clip_unlike_alpro_integer_arange():
    # ALPRO: np.arange(0, 300, 300 / 16, dtype=int) -> step truncated to 18, last index 270.
    assert np.arange(0, 300, 300 / 16, dtype=int)[-1] == 270
    assert sample_indices(300, 16, "uniform")[-1] >= 281  # inside the last segment [281, 300)


@pytest.mark.parametrize("mode", ["rand", "headtail"])
def test_rng_reproducibility(mode):
    a = sample_indices(1000, 8, mode, rng=np.random.default_rng(3))
    b = sample_indices(1000, 8, mode, rng=np.random.default_rng(3))
    assert a == b
    assert a == sample_indices(1000, 8, mode, rng=3)  # an int seed is the same as default_rng(seed)
    draws = {tuple(sample_indices(1000, 8, mode, rng=seed)) for seed in range(20)}
    assert len(draws) > 15  # different seeds really give different samples


@pytest.mark.parametrize("mode", ["rand", "headtail"])
def test_a_shared_generator_advances_and_replays(mode):
    """Calls sharing one generator draw on from where the last call stopped: five calls give five different
    samples (a sampler that copies or reseeds the generator repeats one), and the same five again from a
    generator with the same seed (a sampler that ignores it and draws fresh entropy does not)."""
    rng, replay = np.random.default_rng(0), np.random.default_rng(0)
    draws = [sample_indices(1000, 4, mode, rng) for _ in range(5)]
    assert draws == [sample_indices(1000, 4, mode, replay) for _ in range(5)]
    assert len({tuple(d) for d in draws}) == 5


def test_rand_draws_one_integer_per_segment_from_the_given_generator():
    """The documented draw: ``rng.integers(start, end)`` for each segment in turn, nothing else from ``rng``."""
    rng, replay = np.random.default_rng(0), np.random.default_rng(0)
    draws = [sample_indices(1000, 4, "rand", rng) for _ in range(3)]
    expected = [[int(replay.integers(a, b)) for a, b in segment_bounds(1000, 4)] for _ in range(3)]
    assert draws == expected
    assert rng.integers(1 << 30) == replay.integers(1 << 30)  # the two generators are at the same state


def test_rand_reaches_every_frame_of_a_segment():
    rng = np.random.default_rng(0)
    seen = [set() for _ in range(4)]
    for _ in range(400):
        for s, i in enumerate(sample_indices(20, 4, "rand", rng)):
            seen[s].add(i)
    assert seen == [set(range(a, b)) for a, b in segment_bounds(20, 4)]


@pytest.mark.parametrize(("n", "k"), [(100, 4), (100, 5), (9, 8), (2, 2), (301, 16), (7, 1)])
def test_headtail_splits_frames_between_the_two_halves(n, k):
    for seed in range(10):
        idx = sample_indices(n, k, "headtail", rng=seed)
        head, tail = idx[: k // 2], idx[k // 2 :]
        assert len(tail) == k - k // 2  # the odd frame goes to the tail (ALPRO would drop it)
        assert all(i < n // 2 for i in head) and all(n // 2 <= i < n for i in tail)
        assert head == sorted(head) and tail == sorted(tail)
        assert len(set(idx)) == k


@pytest.mark.parametrize("mode", MODES)
def test_fewer_frames_than_requested_are_stretched_deterministically(mode):
    assert sample_indices(3, 8, mode, rng=1) == [0, 0, 0, 1, 1, 1, 2, 2]
    assert sample_indices(3, 8, mode, rng=2) == sample_indices(3, 8, mode)
    assert sample_indices(1, 4, mode) == [0, 0, 0, 0]  # a still image, repeated
    idx = sample_indices(5, 16, mode)
    assert set(idx) == set(range(5)) and idx == sorted(idx)


@pytest.mark.parametrize(
    ("args", "message"),
    [((10, 4, "random"), "unknown frame sampling mode"), ((0, 4), "num_available"), ((10, 0), "num_frames")],
)
def test_bad_arguments_raise_with_a_clear_message(args, message):
    with pytest.raises(ValueError, match=message):
        sample_indices(*args)
