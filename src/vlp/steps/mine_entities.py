"""Step: mine the entity vocabulary (top-M caption nouns) of an ingested dataset."""

from __future__ import annotations

from vlp.config import Config
from vlp.data.entities import mine
from vlp.steps.common import StepResult, run_step


def mine_entities(dataset: str, out: str, cfg: Config) -> StepResult:
    """Mine ``dataset``'s top-M caption nouns (the ``entities`` section) into ``out``."""
    return run_step("mine_entities", out, cfg, "entities", lambda: mine(dataset, out, cfg.entities))
