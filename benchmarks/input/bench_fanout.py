"""extract_frames in one pod vs fanned out into parts, as DAGs under kfp.local (SubprocessRunner): wall time of
the frame phase, and what each task costs beyond its step's own work (the per-pod overhead).

The world is the main job's (``configs/pipeline-local.yaml``: 400 clips, 8 frames of 32 px, 64 clips a shard),
synthesised and ingested once; each DAG is a pointer to that dataset, then the frame step(s) as ``pipelines/fanout.py``
wires them. The rounds alternate the two DAGs. A task's wall time is from kfp.local's
"Executing task" to its "finished" log record; its work is the ``seconds`` its step wrote in ``summary.json``.
kfp.local runs the parts of a ParallelFor side by side (at most ``--parallelism``), so on a machine with few
cores the fan-out can only show its overhead, not a speed-up; the merged frame stores are checked byte-equal.

    python benchmarks/input/bench_fanout.py [--parts 4] [--rounds 2] [--workers 1] [--out runs/bench-fanout]

``--clips N`` synthesises N clips instead (a smoke run); a world already in ``--out`` is used as it is.
"""

import argparse
import dataclasses
import json
import logging
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
from common import ROOT as REPO

sys.path.insert(0, str(REPO))  # components/ and pipelines/, the repo's top-level packages (and the tasks' too:)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))

from kfp import dsl, local

from components import data
from pipelines import fanout
from pipelines.config import CONFIG_DIR, FanOut, configure, load
from pipelines.local_run import list_outputs

CONFIG = str(REPO / "configs" / "pipeline-local.yaml")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EVENT = re.compile(r"^(Executing task|Task) '([^']+)'( finished)?")


class Events(logging.Filter):
    """kfp.local's task start/finish log records, with their times (a filter on the root logger: kfp.local
    replaces the root logger's handlers while it runs, not its filters)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[float, str, str]] = []

    def filter(self, record: logging.LogRecord) -> bool:
        match = _EVENT.match(_ANSI.sub("", record.getMessage()))
        if match and (match.group(1) == "Executing task" or match.group(3)):
            self.records.append((record.created, match.group(2), "start" if match.group(3) is None else "end"))
        return True

    def walls(self) -> dict[str, list[float]]:
        """Task name -> wall times, pairing each name's starts and ends in order."""
        starts: dict[str, list[float]] = {}
        walls: dict[str, list[float]] = {}
        for when, name, kind in self.records:
            if kind == "start":
                starts.setdefault(name, []).append(when)
            else:
                walls.setdefault(name, []).append(when - starts[name].pop(0))
        return walls


def frames_dag(parts: int, parallelism: int, workers: int) -> Any:
    cfg = dataclasses.replace(load(CONFIG_DIR / "local.yaml"), fanout=FanOut(parts=parts, parallelism=parallelism))

    @dsl.pipeline(name=f"bench-frames-{parts}")
    def pipeline(dataset_uri: str) -> None:
        stored = {"config": CONFIG, "overrides": [f"frames.workers={workers}"], "data_root": ""}
        ds = configure(data.synth(**stored, source_uri=dataset_uri), cfg, "synth").outputs["raw"]
        if parts == 1:
            configure(data.extract_frames(dataset=ds, **stored), cfg, "extract_frames")
            return
        fanout.extract_frames(cfg, ds, stored, parts, fanout.plan(cfg, parts))

    return pipeline


def step_seconds(run_root: Path) -> dict[str, list[float]]:
    """Task name -> the ``seconds`` of every summary.json its outputs hold."""
    found: dict[str, list[float]] = {}
    for summary in run_root.rglob("summary.json"):
        task = summary.parents[1].name
        found.setdefault(task, []).append(json.loads(summary.read_text())["seconds"])
    return found


def run_once(root: Path, parts: int, args: argparse.Namespace, dataset: str) -> dict[str, Any]:
    events = Events()
    logging.getLogger().addFilter(events)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    before = set(root.glob("*"))
    start = time.perf_counter()
    try:
        frames_dag(parts, args.parallelism, args.workers)(dataset_uri=dataset)
    finally:
        logging.getLogger().removeFilter(events)
    total = time.perf_counter() - start
    (run_root,) = set(root.glob("*")) - before
    walls, work = events.walls(), step_seconds(run_root)
    frame_tasks = ["extract-frames"] if parts == 1 else ["plan-parts", "extract-frames-part", "extract-frames-merge"]
    first = min(t for t, name, kind in events.records if kind == "start" and name in frame_tasks)
    last = max(t for t, name, kind in events.records if kind == "end" and name in frame_tasks)
    outputs = list_outputs(run_root)
    store = outputs["extract-frames" if parts == 1 else "extract-frames-merge"]["frames"]
    return {"parts": parts, "dag_s": total, "frames_phase_s": last - first, "walls": walls, "work": work,
            "store": store}  # fmt: skip


def contents(uri: str) -> dict[str, bytes]:
    return {str(p.relative_to(uri)): p.read_bytes() for p in Path(uri).rglob("*") if p.is_file()
            and p.name != "summary.json"}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="frames.workers in every pod")
    parser.add_argument("--out", default="runs/bench-fanout")
    parser.add_argument("--clips", type=int, default=0, help="clips in the world (0 = the config's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    from vlp.config import load_config
    from vlp.steps.ingest import ingest
    from vlp.steps.synth import synth

    raw, dataset = out / "raw", out / "dataset"
    cfg = load_config(CONFIG, [f"synth.num_videos={args.clips}"] if args.clips else [])
    if not (dataset / "videos.parquet").is_file():
        synth(str(raw), cfg)
        ingest(str(raw), str(dataset), cfg)
    results: dict[int, list[dict[str, Any]]] = {1: [], args.parts: []}
    for _ in range(args.rounds):
        for parts in (1, args.parts):
            results[parts].append(run_once(out / "kfp", parts, args, str(dataset)))
    stores = [contents(r["store"]) for rs in results.values() for r in rs]
    assert all(s == stores[0] for s in stores), "the frame stores differ"
    say = sys.__stdout__.write  # kfp.local leaves print indented
    say(f"\n{os.cpu_count()} CPU cores, {args.rounds} rounds; {len(stores)} frame stores, all byte-identical "
        f"({len(stores[0])} files)\n\n")  # fmt: skip
    say("| DAG | frame phase (median) | task | tasks | wall each (median) | step work each | overhead each |\n")
    say("|---|---|---|---|---|---|---|\n")
    for parts, runs in results.items():
        phase = statistics.median(r["frames_phase_s"] for r in runs)
        label = "one pod" if parts == 1 else f"{parts} parts"
        for task in sorted({t for r in runs for t in r["walls"]} - {"synth"}):
            walls = [w for r in runs for w in r["walls"].get(task, [])]
            work = [w for r in runs for w in r["work"].get(task, [])]
            wall = statistics.median(walls)
            done = statistics.median(work) if work else 0.0
            say(f"| {label} | {phase:.1f} s | {task} | {len(walls) // len(runs)} | {wall:.2f} s | "
                f"{done:.2f} s | {wall - done:.2f} s |\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
