"""Step: sparse frame extraction of an ingested dataset into Parquet shards of JPEGs (or one fan-out part of it)."""

from __future__ import annotations

from collections.abc import Sequence

from vlp.config import Config
from vlp.data.frames import extract, extract_part, merge_parts
from vlp.steps.common import StepResult, run_step


def extract_frames(dataset: str, out: str, cfg: Config, parts: Sequence[str] = ()) -> StepResult:
    """Frames of ``dataset`` under ``out``; with ``parts`` (every :func:`extract_frames_part` output), a merge."""
    if parts:
        return run_step("extract_frames", out, cfg, "frames", lambda: merge_parts(dataset, parts, out, cfg.frames))
    return run_step("extract_frames", out, cfg, "frames", lambda: extract(dataset, out, cfg.frames))


def extract_frames_part(dataset: str, out: str, cfg: Config, index: int, count: int) -> StepResult:
    """Part ``index`` of ``count`` of the frame shards, under ``out`` (no index: the merge writes it)."""
    return run_step("extract_frames", out, cfg, "frames", lambda: extract_part(dataset, out, cfg.frames, index, count))
