"""Temporal frame samplers: which frame indices of a clip a model sees. Pure integer maths, no decoding.

``sample_indices(num_available, num_frames, mode, rng)`` returns ``num_frames`` indices into
``range(num_available)``, sorted ascending. The same function serves two places: frame extraction
(``uniform`` over the whole video decides which frames are stored) and training-time loaders
(any mode, over the stored frames).

Segments
--------
``rand`` and ``uniform`` split ``range(num_available)`` into ``num_frames`` contiguous, disjoint
segments with integer bounds ``[i * n // k, (i + 1) * n // k)``; every segment is non-empty when
``n >= k`` and segment lengths differ by at most one.

Modes, and how they relate to the ALPRO code (``src/datasets/dataset_base.py``,
``_load_video_from_path_decord`` in salesforce/ALPRO)
----------------------------------------------------------------------------------------------
``rand``      one uniformly random frame inside each segment (TSN-style). *Deviation:* ALPRO's
              ``rand`` draws ``num_frames`` distinct frames from the whole clip without replacement
              (``random.sample``), so its frames can bunch up and leave long stretches unseen; ours
              keeps the same marginal coverage but guarantees one frame per segment, which is what
              ALPRO's ``nlvl_rand`` (a perturbed uniform grid) aims at too.
``uniform``   the middle frame of each segment; deterministic. *Deviation:* ALPRO's ``uniform``
              takes segment *starts* via ``np.arange(0, n, n / k, dtype=int)``, and NumPy's integer
              ``arange`` truncates the step (300 frames, k=16: step 18, not 18.75), so the last frames
              of a clip are never sampled. Middles are symmetric and cover the whole clip.
``headtail``  ``num_frames // 2`` distinct random frames from the first half ``[0, n // 2)`` and the
              rest from the second half ``[n // 2, n)``, each half sorted; this follows ALPRO
              (``random.sample`` per half). *Deviation:* for odd ``num_frames`` ALPRO returns one frame
              too few (``k // 2`` per half); we give the extra frame to the second half.

Fewer frames than requested (``num_available < num_frames``, e.g. a 3-frame clip or a still image)
--------------------------------------------------------------------------------------------------
ALPRO's ``random.sample`` raises and the sample is dropped. We instead stretch the available frames
over the requested slots, deterministically and in every mode: slot ``i`` gets frame
``i * num_available // num_frames``. Every available frame appears, in temporal order, each repeated
``num_frames / num_available`` times (+-1); a still image (``num_available == 1``) becomes ``num_frames``
copies of itself, which is how ALBEF-style image data is fed to a video model.
"""

from __future__ import annotations

import itertools
from typing import Literal

import numpy as np

SamplingMode = Literal["rand", "uniform", "headtail"]
MODES: tuple[str, ...] = ("rand", "uniform", "headtail")


def segment_bounds(num_available: int, num_segments: int) -> list[tuple[int, int]]:
    """Half-open bounds ``[start, end)`` of ``num_segments`` contiguous segments covering ``range(num_available)``.

    Args:
        num_available: Number of frames to split (>= 1).
        num_segments: Number of segments (>= 1). Segments are empty when ``num_available < num_segments``.

    Returns:
        ``num_segments`` pairs; consecutive pairs share their boundary and lengths differ by at most one.
    """
    _check_counts(num_available, num_segments)
    edges = [(i * num_available) // num_segments for i in range(num_segments + 1)]
    return list(itertools.pairwise(edges))


def sample_indices(
    num_available: int,
    num_frames: int,
    mode: str = "uniform",
    rng: np.random.Generator | int | None = None,
) -> list[int]:
    """Choose ``num_frames`` sorted frame indices in ``range(num_available)`` with sampler ``mode``.

    Args:
        num_available: Frames the clip has (or frames stored for it), >= 1.
        num_frames: Frames the model wants, >= 1.
        mode: ``"rand"``, ``"uniform"`` or ``"headtail"`` (see the module docstring).
        rng: Randomness for ``rand`` and ``headtail``: a ``numpy.random.Generator``, an int seed, or
            ``None`` for fresh OS entropy. Ignored by ``uniform`` and when ``num_available < num_frames``.

    Returns:
        A list of ``num_frames`` ints, ascending (non-decreasing when frames had to be repeated).

    Raises:
        ValueError: on an unknown mode or a count below 1.
    """
    if mode not in MODES:
        raise ValueError(f"unknown frame sampling mode {mode!r}; use one of {list(MODES)}")
    _check_counts(num_available, num_frames)
    if num_available < num_frames:
        return [(i * num_available) // num_frames for i in range(num_frames)]
    if mode == "uniform":
        return [start + (end - start) // 2 for start, end in segment_bounds(num_available, num_frames)]
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    if mode == "rand":
        return [int(gen.integers(start, end)) for start, end in segment_bounds(num_available, num_frames)]
    half = num_available // 2
    num_head = num_frames // 2
    head = gen.choice(half, size=num_head, replace=False) if num_head else np.empty(0, np.int64)
    tail = half + gen.choice(num_available - half, size=num_frames - num_head, replace=False)
    return [int(i) for i in np.sort(head)] + [int(i) for i in np.sort(tail)]


def _check_counts(num_available: int, num_frames: int) -> None:
    if int(num_available) != num_available or num_available < 1:
        raise ValueError(f"num_available must be an integer >= 1, got {num_available!r} (is the clip empty?)")
    if int(num_frames) != num_frames or num_frames < 1:
        raise ValueError(f"num_frames must be an integer >= 1, got {num_frames!r}")
