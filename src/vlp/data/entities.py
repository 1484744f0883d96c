"""Entity vocabulary mining (to be implemented)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EntitiesConfig:
    top_m: int = 1000


def mine(dataset: str, out: str, cfg: EntitiesConfig) -> dict:
    raise NotImplementedError
