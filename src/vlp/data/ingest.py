"""Ingest (to be implemented)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IngestConfig:
    format: str = "auto"


def ingest(source: str, out: str, cfg: IngestConfig) -> dict:
    raise NotImplementedError
