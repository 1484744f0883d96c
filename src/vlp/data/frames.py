"""Frame extraction (to be implemented)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FramesConfig:
    num_frames: int = 16


def extract(dataset: str, out: str, cfg: FramesConfig) -> dict:
    raise NotImplementedError
