"""Step: validate and probe a raw dataset into the manifest schema, with rejects (or one fan-out part of it)."""

from __future__ import annotations

from collections.abc import Sequence

from vlp.config import Config
from vlp.data.ingest import ingest as _ingest
from vlp.data.ingest import probe_part
from vlp.steps.common import StepResult, run_step


def ingest(source: str, out: str, cfg: Config, probes: Sequence[str] = ()) -> StepResult:
    """The dataset of ``source`` under ``out``; with ``probes`` (every :func:`ingest_part` output), a merge."""
    return run_step("ingest", out, cfg, "ingest", lambda: _ingest(source, out, cfg.ingest, probes=probes))


def ingest_part(source: str, out: str, cfg: Config, index: int, count: int) -> StepResult:
    """Part ``index`` of ``count`` of ingest's probing, into ``out/probes.parquet``."""
    return run_step("ingest", out, cfg, "ingest", lambda: probe_part(source, out, cfg.ingest, index, count))
