"""The synthetic video world (to be implemented)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SynthConfig:
    num_videos: int = 40
    seed: int = 0
    size: int = 64


def generate(out: str, cfg: SynthConfig) -> dict:
    raise NotImplementedError
