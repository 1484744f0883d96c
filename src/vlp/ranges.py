"""Value ranges of config keys: ``(is the value fine, what it must be)`` pairs that :func:`vlp.config.validate`
checks, e.g. ``at_least(1)`` -> ``pretrain.batch_size=0 must be >= 1``. A module of its own so that config sections
anywhere (a model family's ``spec``) declare their ranges without importing :mod:`vlp.config`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Range = tuple[Callable[[Any], bool], str]  # (is the value fine, what it must be)


def at_least(low: float, note: str = "") -> Range:
    return (lambda v: v >= low), f">= {low}{note}"


def above(low: float, note: str = "") -> Range:
    return (lambda v: v > low), f"> {low}{note}"


def within(low: float, high: float) -> Range:
    return (lambda v: low <= v <= high), f"in [{low}, {high}]"


COUNT, SIZE, RATE, SHARE = at_least(1), at_least(0), above(0), within(0, 1)
