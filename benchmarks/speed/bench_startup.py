"""Benchmark: start-up, from a process's start to its first work, of ``vlp search``, ``vlp serve`` and the main job.

- ``search``: ``vlp search --index I "<query>" --json`` as a whole process (interpreter, imports, the model and the
  index opened, one query answered), for each family's index, the families alternated over ``--repeat`` rounds.
- ``serve``: ``vlp serve --index I --port 0`` from its spawn to its ``listening`` line, and to its first answer to
  ``GET /api/search``; then SIGTERM.
- ``imports``: ``python -X importtime -m vlp.cli search ...`` on the first family's index: the ten top-level
  packages that took longest to import (the modules' own import times added up by package), and the sum of all.
- ``steps``: the main job's DAG (``pipelines.local_run``, the virtualenv runner, KFP's cache off) on ``--config``,
  twice: each task's start-up is the ``start-up`` line its step prints when its work begins
  (:meth:`components._runtime.Step.run`: process start to that line, Python's start, the imports, the config and
  the tracking run included); the second run, under ``PYTHONPROFILEIMPORTTIME``, adds up what each task's process
  imported wherever it did (a step that imports torch inside its work pays it after its start-up line).

The indexes are of random-init retrieval models (tiny sizes) over the tiny synthetic world (``configs/tiny.yaml``),
built once under ``--root`` and reused. ``--tree DIR`` runs the commands from another checkout (a ``git worktree`` of
an older commit: its ``src``, ``components`` and ``pipelines``): a before/after table from one script, on one
machine. The steps' start-up line came with this benchmark; to time an older commit's steps, apply its commit there.
Start-up times depend on the machine's load and its disk cache; compare rows measured in one run, the first
(cold) round apart.

    .venv/bin/python benchmarks/speed/bench_startup.py                         # search, serve, imports: ~2 min
    .venv/bin/python benchmarks/speed/bench_startup.py --what steps            # the main job's tasks: ~3 min
    .venv/bin/python benchmarks/speed/bench_startup.py --tree /tmp/before      # an older commit's commands
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common

ROOT = common.ROOT
TINY = ROOT / "configs" / "tiny.yaml"
FAMILIES = ("ts2net", "alpro", "albef")
QUERY = "a red circle moves left"
SEARCH = ["retrieval.num_workers=0"]  # the query's clip loader on the searching thread (one process measured)
LISTENING = re.compile(r"vlp serve: listening on (http://\S+)")
STARTUP = re.compile(r"^\s*\S+: start-up ([0-9.]+) s\b")  # components._runtime.Step.run's line
TASK = re.compile(r"^\[[0-9:]+\] (\S+) (started|done in ([0-9.]+) s|.*)$")  # pipelines.local_talk's task lines
TOP_IMPORT = re.compile(r"^\s*import time:\s+\d+ \|\s+(\d+) \| \S")  # an import at the top of a tree


def build_indexes(root: Path, families: list[str]) -> dict[str, str]:
    """``{family: index}``: the tiny world, and for each family a random-init retrieval model and its index, under
    ``root`` (reused when there)."""
    import torch

    from vlp.config import load_config
    from vlp.data import manifest
    from vlp.models import directory, family
    from vlp.models.tokenizer import train_wordpiece
    from vlp.settings import ModelConfig, RetrievalConfig
    from vlp.steps.index import index_clips
    from vlp.weights import save_model_weights

    cfg = load_config(TINY, SEARCH)
    world = common.build_world(str(root / "world"), cfg)
    made = {}
    for name in families:
        out = root / name
        index = str(out / "index")
        if not (out / "ready").exists():
            rows = manifest.read(world["dataset"], manifest.CAPTIONS, manifest.CAPTION_SCHEMA).to_pylist()
            tok = train_wordpiece([r["caption"] for r in rows], vocab_size=300)
            fam = family.get(name)
            section = ModelConfig(family=name, preset="tiny", img_size=32, num_frames=2, max_len=24, embed_dim=16)
            mcfg = fam.config(section, len(tok), 4 if "bank" in family.spec(name).pretrain_inputs else 0)
            mcfg = fam.prepare(fam.task_config(mcfg, "retrieval", RetrievalConfig(num_frames=2, max_len=24)), 2, 4)
            torch.manual_seed(0)
            model = fam.build(fam.kinds.retrieval, mcfg)
            weights = save_model_weights(str(out / "model" / "weights"), model)
            directory.save(str(out / "model"), kind=fam.kinds.retrieval, config=mcfg, checkpoint=weights,
                           tokenizer=tok, steps=0)  # fmt: skip
            index_clips(str(out / "model"), world["frames"], index, cfg)
            (out / "ready").write_text("", encoding="utf-8")
        made[name] = index
    return made


def environment(tree: Path) -> dict[str, str]:
    """The commands' environment: the checkout ``tree``'s code first on the path, one torch thread, no tracking
    server."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(tree / "src"), str(tree)]))
    for name in ("MLFLOW_TRACKING_URI", "VLP_SERVE_TOKEN"):
        env.pop(name, None)
    return env


def search_command(index: str) -> list[str]:
    return [sys.executable, "-m", "vlp.cli", "search", "--index", index, "--json", "--config", str(TINY), QUERY,
            *SEARCH]  # fmt: skip


def time_search(index: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(search_command(index), env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0 or not json.loads(done.stdout):
        raise SystemExit(f"vlp search on {index} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds


def time_serve(index: str, env: dict[str, str], log: Path) -> tuple[float, float]:
    """Seconds from spawning ``vlp serve`` to its listening line, and to its first search answer."""
    cmd = [sys.executable, "-m", "vlp.cli", "serve", "--index", index, "--port", "0", "--config", str(TINY), *SEARCH]
    start = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        while not (found := LISTENING.search(log.read_text(encoding="utf-8", errors="replace"))):
            if proc.poll() is not None or time.perf_counter() - start > 120:
                raise SystemExit(f"vlp serve did not listen:\n{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.01)
        listening = time.perf_counter() - start
        url = f"{found[1]}/api/search?" + urllib.parse.urlencode({"q": QUERY, "k": 3})
        with urllib.request.urlopen(url, timeout=60) as answer:
            hits = json.loads(answer.read())
        if not hits.get("hits"):
            raise SystemExit(f"vlp serve answered without hits: {hits}")
        return listening, time.perf_counter() - start
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def import_times(index: str, env: dict[str, str]) -> list[tuple[str, float]]:
    """``(top-level package, seconds)`` of ``vlp search`` under ``python -X importtime``: each module's own import
    time (its ``self`` column) added to its top-level package, largest first."""
    done = subprocess.run([sys.executable, "-X", "importtime", *search_command(index)[1:]], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    totals: dict[str, float] = {}
    for line in done.stderr.splitlines():
        found = re.match(r"import time:\s+(\d+) \|\s+\d+ \| *(\S+)$", line)
        if found:
            top = found[2].split(".")[0]
            totals[top] = totals.get(top, 0.0) + int(found[1]) / 1e6
    return sorted(totals.items(), key=lambda kv: -kv[1])


def run_steps(
    tree: Path, pipeline: str, config: str, out: Path, env: dict[str, str], imports: bool
) -> dict[str, dict[str, float]]:
    """The main job's DAG on ``config``: ``{task: {"startup": s, "wall": s}}`` from each step's start-up line and
    the run's end line of the task; with ``imports``, under ``PYTHONPROFILEIMPORTTIME`` and ``{"imports": s}``
    instead: what the task's process spent importing, wherever the imports happened (its top-level imports'
    cumulative times added up)."""
    cmd = [sys.executable, "-m", "pipelines.local_run", "--pipeline", pipeline, "--step-config", config, "--out",
           str(out), "--no-cache"]  # fmt: skip
    run_env = dict(env, PYTHONPROFILEIMPORTTIME="1") if imports else env
    done = subprocess.run(cmd, env=run_env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the main job failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    tasks: dict[str, dict[str, float]] = {}
    task = ""
    for line in done.stdout.splitlines():
        if found := TASK.match(line):
            task = found[1]
            if found[2] == "started":
                tasks[task] = {"imports": 0.0} if imports else {}
            elif found[3]:
                tasks[task]["wall"] = float(found[3])
        elif task and (found := STARTUP.match(line)):
            tasks[task]["startup"] = float(found[1])
        elif task and imports and (found := TOP_IMPORT.match(line)):
            tasks[task]["imports"] += int(found[1]) / 1e6
    return tasks


def cells(values: list[float]) -> str:
    return f"{min(values):6.2f} {statistics.median(values):6.2f} {max(values):6.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", default="search,serve,imports", help="comma-separated: search, serve, imports, steps")
    parser.add_argument("--families", default=",".join(FAMILIES), help="the indexes' families, comma-separated")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of each timing (the families alternated)")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose code the commands run")
    parser.add_argument("--root", type=Path, default=ROOT / ".cache" / "bench-startup", help="where the indexes live")
    parser.add_argument("--config", default="configs/tiny.yaml", help="the main job's step config (--what steps)")
    parser.add_argument("--pipeline", default="pretrain", help="the DAG --what steps runs (pipelines.local_run's)")
    parser.add_argument("--no-imports", action="store_true", help="--what steps without the importtime run")
    args = parser.parse_args()
    what, families = args.what.split(","), args.families.split(",")
    tree = args.tree.resolve()
    env = environment(tree)
    probe = subprocess.run([sys.executable, "-c", "import vlp; print(vlp.__file__)"], env=env, capture_output=True,
                           text=True, check=True).stdout.strip()  # fmt: skip
    print(f"commands run {probe}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs", flush=True)
    indexes = build_indexes(args.root, families) if {"search", "serve", "imports"} & set(what) else {}
    if "search" in what or "serve" in what:
        search: dict[str, list[float]] = {f: [] for f in families}
        ready: dict[str, list[float]] = {f: [] for f in families}
        first: dict[str, list[float]] = {f: [] for f in families}
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.repeat):
                for name in families:
                    if "search" in what:
                        search[name].append(time_search(indexes[name], env))
                    if "serve" in what:
                        listening, answered = time_serve(indexes[name], env, Path(tmp) / "serve.log")
                        ready[name].append(listening)
                        first[name].append(answered)
        print(f"\n{'command (seconds: min median max)':<40} " + " ".join(f"{f:>20}" for f in families))
        rows = [("vlp search, whole process", search), ("vlp serve, listening", ready),
                ("vlp serve, first answer", first)]  # fmt: skip
        for label, table in rows:
            if all(table.values()):
                print(f"{label:<40} " + " ".join(f"{cells(table[f]):>20}" for f in families))
    if "imports" in what:
        ranked = import_times(indexes[families[0]], env)
        print(f"\npython -X importtime, vlp search ({families[0]} index): top ten of "
              f"{sum(s for _, s in ranked):.2f} s of imports")  # fmt: skip
        for name, seconds in ranked[:10]:
            print(f"  {name:<28} {seconds:6.2f} s")
    if "steps" in what:
        with tempfile.TemporaryDirectory() as tmp:
            plain = run_steps(tree, args.pipeline, args.config, Path(tmp) / "plain", env, imports=False)
            profiled = {} if args.no_imports else run_steps(tree, args.pipeline, args.config, Path(tmp) / "imports",
                                                                env, imports=True)  # fmt: skip
        rows = [(task, got) for task, got in plain.items() if "startup" in got]
        if not rows:
            raise SystemExit("no step printed a start-up line (a commit before the line was added?)")
        print(
            f"\nthe {args.pipeline} DAG on {args.config}, each task (seconds): start-up = process start to its step's "
            "work; "
            "imports = all its process imported (a second run, under -X importtime); task = the task's wall time"
        )
        print(f"  {'task':<24} {'start-up':>9} {'imports':>8} {'task':>7}")
        for task, got in rows:
            imported = profiled.get(task, {}).get("imports", float("nan"))
            print(f"  {task:<24} {got['startup']:9.2f} {imported:8.2f} {got.get('wall', float('nan')):7.2f}")
        print(
            f"  {'sum over ' + str(len(rows)) + ' steps':<24} {sum(g['startup'] for _, g in rows):9.2f} "
            f"{sum(profiled.get(t, {}).get('imports', 0.0) for t, _ in rows):8.2f} "
            f"{sum(g.get('wall', 0.0) for _, g in rows):7.2f}"
        )


if __name__ == "__main__":
    main()
