"""Mutation testing of the modules where a silent error costs most: how many small wrong changes the tests catch.

``make mutation`` (not part of CI: hours on 2 cores) runs mutmut over the modules in :data:`TARGETS`: it
writes every mutant of their functions (a flipped comparison, an off-by-one constant, a dropped argument, ...) and
runs, for each, the tests that call the mutated function (mutmut maps functions to tests in one traced run first),
fastest first, stopping at the first failure. A mutant no test fails on *survived*: either the tests miss a wrong
change there, or the mutant is *equivalent* (it computes the same thing, e.g. a changed default that every caller
overrides). Equivalent mutants are listed with the reason in ``scripts/mutation_equivalent.toml``; an entry whose
mutant no longer has the recorded change is stale and counts as a survivor again.

The tests run are the files that import the modules themselves (``scripts/testmap.py --direct``; ``--wide``: every
file whose imports reach them), without the ones marked ``slow`` and the chart/image checks: a score is a lower
bound on what ``make test`` catches.

    python scripts/mutation.py                         # every target, results into docs/results/mutation.md
    python scripts/mutation.py --only losses eval.qa   # some targets (the report then shows only those)
    python scripts/mutation.py --resume                # go on with an interrupted run (mutmut keeps each result)
    python scripts/mutation.py --report-only           # rewrite the report from the last run
    python scripts/mutation.py --names FILE            # only the mutants FILE names (e.g. the last survivors)
    python scripts/mutation.py --names FILE --base OLD.json  # ... scored together with an earlier run (--save)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import tomllib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import testmap

ROOT = testmap.ROOT
WORK = Path(os.environ.get("VLP_MUTATION_WORK", ROOT / ".cache" / "mutation"))  # mutmut's working copy
REPORT = ROOT / "docs" / "results" / "mutation.md"
EQUIVALENT = ROOT / "scripts" / "mutation_equivalent.toml"
MARKER = "<!-- Everything below is written by scripts/mutation.py; edit above this line. -->"

# target name -> the files mutated (paths from the repository root)
TARGETS: dict[str, list[str]] = {
    "losses": sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src/vlp/losses").glob("*.py")),
    "eval.retrieval": ["src/vlp/eval/retrieval.py"],
    "eval.qa": ["src/vlp/eval/qa.py"],
    "data.ingest.validate": ["src/vlp/data/ingest/validate.py"],
    "data.sampling": ["src/vlp/data/sampling.py"],
    "train.checkpoint": ["src/vlp/train/checkpoint.py"],
    "weights": ["src/vlp/weights.py"],
    "index.query": ["src/vlp/index/query.py"],
}
# The module whose importers are a target's tests, where it is not the target itself: validate is reached through
# its package (vlp.data.ingest re-exports what the tests call).
TESTED_THROUGH = {"data.ingest.validate": "vlp.data.ingest"}
# Not run under mutation (besides the tests marked slow): the chart and image checks (make chart-test runs them), and
# the tests that cannot run twice in one process (mutmut runs every test once in its own process before it forks
# the mutants' runs from it).
EXCLUDED_TESTS = {
    "tests/test_chart.py": "make chart-test runs it (helm)",
    "tests/test_docker.py": "make chart-test runs it",
    "tests/test_entities.py": "checks that spaCy's vocabulary is fresh in the test process, so a second run fails",
}
# What the mutants' copy of the repository holds besides the mutated files (tests/ and pyproject.toml are added).
COPIED = [
    "src",
    "configs",
    "components",
    "pipelines",
    "docs",
    "helm",
    "docker",
    "mk",
    "requirements",
    "scripts",
    "benchmarks",
    "Makefile",
    "README.md",
    "ARCHITECTURE.md",
]


def target_of(mutant: str) -> str:
    """``vlp.eval.qa.x_qa_metrics__mutmut_3`` -> ``eval.qa``; ``vlp.losses.mlm.x_...`` -> ``losses``."""
    module = mutant.split(".x_")[0].split(".xǁ")[0]
    for name in sorted(TARGETS, key=len, reverse=True):
        if module == f"vlp.{name}" or module.startswith(f"vlp.{name}."):
            return name
    raise ValueError(f"mutant {mutant} is in none of {sorted(TARGETS)}")


def selected_tests(targets: list[str], wide: bool = False) -> list[str]:
    """The test files that import a target (or its package, :data:`TESTED_THROUGH`) themselves; ``wide``: every
    file whose imports reach it (``scripts/testmap.py`` without ``--direct``: several times the run time)."""
    files: dict[str, None] = {}
    for name in targets:
        for path in testmap.touching(TESTED_THROUGH.get(name, f"vlp.{name}"), direct=not wide):
            rel = str(path.relative_to(ROOT))
            if rel not in EXCLUDED_TESTS:
                files[rel] = None
    return sorted(files)


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def prepare(targets: list[str], wide: bool) -> list[str]:
    """A fresh scratch copy in :data:`WORK` with the mutmut and pytest settings for ``targets``."""
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    for name in [*COPIED, "tests"]:
        (WORK / name).symlink_to(ROOT / name)
    pytest_ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    tests = selected_tests(targets, wide)
    sources = [s for t in targets for s in TARGETS[t]]
    (WORK / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\n"
        f"testpaths = {_toml_list(pytest_ini['testpaths'])}\n"
        f"pythonpath = {_toml_list(pytest_ini['pythonpath'])}\n"
        f"addopts = {json.dumps(pytest_ini['addopts'] + ' -p no:cacheprovider')}\n"
        f"markers = {_toml_list(pytest_ini['markers'])}\n\n"
        "[tool.mutmut]\n"
        f"source_paths = {_toml_list(sources)}\n"
        f"also_copy = {_toml_list([c for c in COPIED if (ROOT / c).exists()])}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list([*tests, '-m', 'not slow and not gpu'])}\n"
        + _importlinter_tables()  # the layer contracts, which tests read
    )
    return tests


def _importlinter_tables() -> str:
    """The ``[tool.importlinter]`` tables of the repository's pyproject.toml, as they are written there."""
    lines, keep = (ROOT / "pyproject.toml").read_text().splitlines(), []
    inside = False
    for line in lines:
        if line.startswith("["):
            inside = line.strip("[] ").startswith("tool.importlinter")
        if inside:
            keep.append(line)
    return "\n" + "\n".join(keep) + "\n"


def run(max_children: int, names: Sequence[str] = ()) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TERM": "dumb"}
    log = WORK / "mutmut.log"
    mutmut = Path(sys.executable).with_name("mutmut")
    print(f"mutation: mutmut run in {WORK} (log: {log})", flush=True)
    stop = threading.Event()
    watchdog = threading.Thread(target=_kill_idle_mutants, args=(stop,), daemon=True)
    watchdog.start()
    try:
        with open(log, "wb") as fh:
            proc = subprocess.run(
                [str(mutmut), "run", "--max-children", str(max_children), *names],
                cwd=WORK,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
    finally:
        stop.set()
    tail = log.read_bytes()[-3000:].decode(errors="replace").split("\r")[-1]
    print(tail.strip()[-600:])
    return proc.returncode


IDLE_S = 120  # seconds a mutant's run may sit nearly idle (CPU under a quarter of its age) before it is killed


def _cpu_and_age(pid: str) -> tuple[float, float]:
    """(CPU seconds used, seconds since start) of process ``pid``, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return (int(fields[11]) + int(fields[12])) / ticks, uptime - int(fields[19]) / ticks


def idle_mutants() -> list[str]:
    """The pids of mutant runs (``mutmut: <name>`` processes) older than IDLE_S that used under a quarter of their
    age in CPU time: hung, e.g. on a lock a test's library held when mutmut forked (LanceDB warns of this)."""
    idle = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if not (proc / "cmdline").read_bytes().startswith(b"mutmut: vlp."):
                continue
            cpu, age = _cpu_and_age(proc.name)
        except OSError:  # gone meanwhile
            continue
        if age > IDLE_S and cpu < 0.25 * age:
            idle.append(proc.name)
    return idle


def _kill_idle_mutants(stop: threading.Event) -> None:
    """Kill hung mutant runs every 30 s until ``stop``: mutmut then records the signal, which the report counts as
    inconclusive (a survivor), not as a kill; without this, a hung run would stall the whole run."""
    while not stop.wait(30):
        for pid in idle_mutants():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
                print(f"mutation: killed mutant run {pid}: idle for over {IDLE_S} s", flush=True)


def results() -> dict[str, str]:
    """mutant name -> mutmut's status, from the .meta files of the last run."""
    from mutmut.stats import status_by_exit_code

    statuses: dict[str, str] = {}
    for meta in (WORK / "mutants").rglob("*.py.meta"):
        for key, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            statuses[key] = status_by_exit_code[code]
    return statuses


def merged(base: dict[str, str], new: dict[str, str]) -> dict[str, str]:
    """An earlier run's statuses, with those of the mutants a later run reached replaced by the later result."""
    unrun = ("not checked", "check was interrupted by user")
    return {**base, **{k: v for k, v in new.items() if v not in unrun or k not in base}}


def diff(mutant: str) -> str:
    """The changed lines of a mutant (``-`` original, ``+`` mutant), from ``mutmut show``."""
    out = subprocess.run(
        [str(Path(sys.executable).with_name("mutmut")), "show", mutant],
        cwd=WORK,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return "\n".join(line for line in out.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---")))


def load_equivalent() -> dict[str, dict[str, str]]:
    if not EQUIVALENT.exists():
        return {}
    return tomllib.loads(EQUIVALENT.read_text())


def report(tests: list[str], statuses: dict[str, str], elapsed: float | None) -> str:
    from importlib.metadata import version

    equivalent = load_equivalent()
    rows = []
    survivors: dict[str, list[tuple[str, str]]] = {}
    stale = []
    for name in TARGETS:
        mine = {k: v for k, v in statuses.items() if target_of(k) == name}
        if not mine:
            continue
        counts = Counter(mine.values())
        eq = 0
        for key, status in sorted(mine.items()):
            if status in ("survived", "no tests", "suspicious", "segfault"):  # a kill by a signal proves nothing
                change = diff(key)
                entry = equivalent.get(key)
                if entry is not None and entry.get("change", "").strip() == change.strip():
                    eq += 1
                    continue
                if entry is not None:
                    stale.append(key)
                survivors.setdefault(name, []).append((key, f"{status}\n{change}"))
        caught = counts["killed"] + counts["timeout"]
        unrun = counts["not checked"] + counts["check was interrupted by user"]
        scored = len(mine) - eq - unrun
        score = f"{caught / scored:.1%}" if scored else "-"
        rows.append(
            f"| `{name}` | {len(mine)} | {unrun} | {counts['killed']} | {counts['timeout']} "
            f"| {eq} | {len(survivors.get(name, []))} | {score} |"
        )
    lines = [
        MARKER,
        "",
        "## Last run",
        "",
        f"{dt.date.today().isoformat()}, mutmut {version('mutmut')}"
        + (f", {elapsed / 60:.0f} min" if elapsed else "")
        + f', `python scripts/mutation.py`; tests: `-m "not slow and not gpu"` over {len(tests)} files: '
        + ", ".join(Path(t).name for t in tests)
        + ".",
        "",
        "| module | mutants | not run | killed | timeout | equivalent | survived | score |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "Score: (killed + timeout) / (mutants - not run - equivalent). *survived* counts the mutants no test failed"
        " on, those of functions no selected test calls, and those whose run a signal ended (SIGKILL or SIGSEGV:"
        " inconclusive); *not run*: an interrupted run had not reached them.",
    ]
    if stale:
        lines += [
            "",
            "Stale entries in scripts/mutation_equivalent.toml (the mutant changed): "
            + ", ".join(f"`{s}`" for s in stale),
        ]
    for name, items in survivors.items():
        lines += ["", f"### Survivors in `{name}`", ""]
        for key, text in items:
            status, _, change = text.partition("\n")
            lines += [f"- `{key}` ({status})", "", "  ```diff", *[f"  {x}" for x in change.splitlines()], "  ```"]
    return "\n".join(lines) + "\n"


def write_report(text: str) -> None:
    head = REPORT.read_text().split(MARKER)[0] if REPORT.exists() else "# Mutation testing\n\n"
    REPORT.write_text(head.rstrip() + "\n\n" + text)
    print(f"mutation: report in {REPORT.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(TARGETS), help="some targets only")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--report-only", action="store_true", help="rewrite docs/results/mutation.md from the last run")
    parser.add_argument("--wide", action="store_true", help="every test file whose imports reach a target")
    parser.add_argument("--resume", action="store_true", help="go on with the last run (its mutants and tests)")
    parser.add_argument("--names", type=Path, help="run only the mutants named in this file (one per line)")
    parser.add_argument("--save", type=Path, help="also write every mutant's status to this JSON file")
    parser.add_argument(
        "--base", type=Path, help="statuses of an earlier run (its --save file): what this run ran replaces theirs"
    )
    args = parser.parse_args(argv)
    targets = args.only or list(TARGETS)
    elapsed = None
    if args.report_only or args.resume:
        tests = json.loads((WORK / "tests.json").read_text())
    else:
        tests = prepare(targets, args.wide)
        (WORK / "tests.json").write_text(json.dumps(tests))
    if not args.report_only:
        start = dt.datetime.now()
        names = args.names.read_text().split() if args.names else []
        rc = run(args.max_children, names)
        elapsed = (dt.datetime.now() - start).total_seconds()
        if rc != 0:
            print(f"mutation: mutmut exited {rc}; see {WORK / 'mutmut.log'}", file=sys.stderr)
            return rc
        if args.resume:
            elapsed = None  # the time of the runs before this one is not known here
    statuses = results()
    if args.base:
        statuses = merged(json.loads(args.base.read_text()), statuses)
    if args.save:
        args.save.write_text(json.dumps(statuses, indent=0, sort_keys=True))
    write_report(report(tests, statuses, elapsed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
