"""Step: validate and probe a raw dataset into the manifest schema, with rejects."""

from __future__ import annotations

from vlp.config import Config
from vlp.data.ingest import ingest as _ingest
from vlp.steps.common import StepResult, run_step


def ingest(source: str, out: str, cfg: Config) -> StepResult:
    return run_step("ingest", out, cfg, "ingest", lambda: _ingest(source, out, cfg.ingest))
