"""Value ranges of config keys, declared beside the key: ``batch_size: int = ranged(8, COUNT)`` makes a dataclass
field whose range :func:`vlp.config.validate` checks (``pretrain.batch_size=0 must be >= 1``). A range is a pair
``(is the value fine, what it must be)``. A module of its own, below every config section (a model family's
``spec`` too), so that a section declares its ranges without importing :mod:`vlp.config`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field, fields, is_dataclass
from typing import Any

Range = tuple[Callable[[Any], bool], str]  # (is the value fine, what it must be)
RANGE = "vlp.range"  # the key of a field's range in its metadata


def at_least(low: float, note: str = "") -> Range:
    return (lambda v: v >= low), f">= {low}{note}"


def above(low: float, note: str = "") -> Range:
    return (lambda v: v > low), f"> {low}{note}"


def within(low: float, high: float) -> Range:
    return (lambda v: low <= v <= high), f"in [{low}, {high}]"


COUNT, SIZE, RATE, SHARE = at_least(1), at_least(0), above(0), within(0, 1)
OFF = " (0 = off)"
TEXT = at_least(3, " ([CLS], a token and [SEP])")  # a text length in tokens
PIXELS = (lambda v: len(v) in (0, 3)), "[] (the family's) or 3 values, one per channel"
STD = (lambda v: len(v) in (0, 3) and all(x > 0 for x in v)), "[] (the family's) or 3 values > 0"
BETAS = (lambda v: len(v) == 2 and all(0 <= b < 1 for b in v)), "two values in [0, 1)"
CROP = (lambda v: not v or (len(v) == 2 and 0 < v[0] <= v[1] <= 1)), "[] or [lo, hi] with 0 < lo <= hi <= 1"


def ranged(default: Any, valid: Range) -> Any:
    """A config key's default with its range: a dataclass field. A mutable default is given as the function that
    makes it (``ranged(list, CROP)``, ``ranged(lambda: [0.9, 0.98], BETAS)``)."""
    if callable(default):
        return field(default_factory=default, metadata={RANGE: valid})
    return field(default=default, metadata={RANGE: valid})


def ranges_of(section: Any) -> dict[str, Range]:
    """The ranges a config section (a dataclass or one of its objects) declares, by key, its base classes' included:
    a subclass that gives a key a new default keeps the key's range unless it declares another."""
    cls = section if isinstance(section, type) else type(section)
    found: dict[str, Range] = {}
    for one in reversed(cls.__mro__):
        if is_dataclass(one):
            found |= {f.name: f.metadata[RANGE] for f in fields(one) if RANGE in f.metadata}
    return found
