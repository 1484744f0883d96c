"""Kill a training CLI with SIGKILL after a checkpoint, rerun it, and compare with an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

TIMING = ("train/clips_per_s", "train/peak_rss_mb", "train/peak_mem_mb")


def metrics_by_step(out: Path) -> dict[int, dict]:
    """Every step's line of ``<out>/metrics.jsonl``, timing figures dropped; asserts that the file holds each step
    once, in order (a resume rewinds it to its checkpoint before logging the steps after it again)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows if "step" in row]
    assert steps == sorted(set(steps)), f"{out}/metrics.jsonl repeats or reorders steps: {steps}"
    return {row["step"]: {k: v for k, v in row.items() if k not in TIMING} for row in rows if "step" in row}


def kill_then_rerun(cmd: Callable[[Path], list[str]], root: Path, kill_after: int, last: int) -> dict:
    """Run ``cmd(root / "straight")`` to the end; start ``cmd(root / "killed")``, SIGKILL it once its step
    ``kill_after`` checkpoint is complete, rerun it to the end. Asserts the rerun resumed, that the final
    checkpoint's weights, optimiser and RNG files are byte-identical and that the metrics match; returns the
    rerun's summary."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight, killed = root / "straight", root / "killed"
    subprocess.run(cmd(straight), check=True, capture_output=True, timeout=300, env=env)
    proc = subprocess.Popen(cmd(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 300
    while not (killed / "checkpoints" / f"step-{kill_after:06d}" / "state.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the checkpoint to kill at"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "model.json").exists(), "killed before the end"
    done = subprocess.run(cmd(killed), capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["resumed_from_step"] >= kill_after and summary["steps"] == last
    final = Path("checkpoints") / f"step-{last:06d}"
    for name in ("model.safetensors", "optimizer.safetensors", "rng-rank00000.safetensors"):
        assert (killed / final / name).read_bytes() == (straight / final / name).read_bytes(), name
    assert metrics_by_step(killed) == metrics_by_step(straight)
    return summary
