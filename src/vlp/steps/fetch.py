"""Step: a URL list -> its videos in object storage (or a folder), as a raw dataset ``vlp ingest`` reads; or one
fan-out part of it, or the merge of the parts (:mod:`vlp.data.fetch`)."""

from __future__ import annotations

from vlp.config import Config
from vlp.data.fetch import fetch_part as _fetch_part
from vlp.data.fetch import merge as _merge
from vlp.data.fetch import part_dir
from vlp.inputs import check_output
from vlp.steps.common import StepResult, run_step


def fetch(source: str, out: str, cfg: Config) -> StepResult:
    """Every row of the list at ``source`` fetched into ``out`` (one part), then merged."""
    fetch_part(source, out, cfg, 0, 1)
    return fetch_merge(source, out, cfg, 1)


def fetch_part(source: str, out: str, cfg: Config, index: int, count: int) -> StepResult:
    """Part ``index`` of ``count`` of the list, into ``out`` (its summary in the part's folder)."""
    check_output(out)  # the part writes OUT/videos too, not only its own folder (which run_step checks)
    where = part_dir(out, index, count)
    return run_step("fetch", where, cfg, "fetch", lambda: _fetch_part(source, out, cfg.fetch, index, count))


def fetch_merge(source: str, out: str, cfg: Config, count: int) -> StepResult:
    """The ``count`` finished parts of ``out`` gathered into its raw dataset."""
    return run_step("fetch", out, cfg, "fetch", lambda: _merge(source, out, cfg.fetch, count))
