"""Step: sparse frame extraction of an ingested dataset into Parquet shards of JPEGs."""

from __future__ import annotations

from vlp.config import Config
from vlp.data.frames import extract
from vlp.steps.common import StepResult, run_step


def extract_frames(dataset: str, out: str, cfg: Config) -> StepResult:
    return run_step("extract_frames", out, cfg, "frames", lambda: extract(dataset, out, cfg.frames))
