"""What every step does around its work: storage set-up, timing, the summary file."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from vlp import __version__, storage
from vlp.config import Config, to_dict
from vlp.data import manifest

StepResult = dict[str, Any]
log = logging.getLogger("vlp")


def run_step(name: str, out: str, cfg: Config, section: str, work: Callable[[], StepResult]) -> StepResult:
    """Configure storage, run ``work``, write ``<out>/summary.json``; return the summary.

    The summary records the step's own config ``section`` (never ``storage``: it may hold keys).
    """
    storage.configure(cfg.storage)
    start = time.perf_counter()
    log.info("%s -> %s", name, out)
    result = work()
    summary = {"step": name, "vlp_version": __version__, "out": out, **result}
    summary["seconds"] = round(time.perf_counter() - start, 3)
    summary["config"] = {section: to_dict(getattr(cfg, section))}
    if os.environ.get("RANK", "0") == "0":  # under torchrun only rank 0 writes the step's files
        storage.write_text(storage.join(out, manifest.SUMMARY), json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary
