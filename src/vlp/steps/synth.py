"""Step: write the synthetic video world (media + manifests) to ``out``."""

from __future__ import annotations

from vlp.config import Config
from vlp.data.synth import generate
from vlp.steps.common import StepResult, run_step


def synth(out: str, cfg: Config) -> StepResult:
    """Write the synthetic world (the ``synth`` section) to ``out``."""
    return run_step("synth", out, cfg, "synth", lambda: generate(out, cfg.synth))
