"""Every script under ``benchmarks/`` runs at its smallest size and prints what it promises (a smoke test each).

A refactor of vlp or of ``benchmarks/common.py`` must not break a benchmark silently: each test below runs one
script's command line (its own smallest flags or presets) and checks the table or JSON it prints, and for the
scripts that need what this machine lacks (LAVIS's venv, a finished main job with its MLflow registry) the part that
runs without it (arguments, the refusal naming what is missing). The figures are not checked against a baseline:
timings on a busy 2-core machine are noise; the parity differences and the fault battery's verdicts are.

How the scripts run: as ``python benchmarks/<group>/<script>.py ARGS`` would, each in its own process (its own
``__main__``, ``sys.argv``, ``sys.path[0]`` = its folder, working directory and output), but forked from a server
process that imported torch and vlp once (:data:`PRELOAD`): a fresh interpreter per script would spend most of the
file's time importing them again. :func:`test_a_script_runs_from_a_plain_interpreter_in_any_folder` runs scripts the
plain way, from another folder.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import re
import runpy
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.relative_to(BENCH).as_posix() for p in BENCH.glob("*/*.py"))
PRELOAD = ["numpy", "torch", "transformers", "vlp.models.alpro.model", "vlp.models.albef.model",
           "vlp.models.ts2net.model", "vlp.models.tokenizer", "vlp.steps.pretrain", "vlp.steps.finetune",
           "vlp.steps.evaluate", "vlp.steps.import_checkpoint", "vlp.steps.synth", "vlp.steps.ingest",
           "vlp.steps.extract_frames", "vlp.steps.mine_entities", "vlp.cli", "spacy"]  # fmt: skip

# The server: reads one JSON job a line, forks a child per job that runs the script as `python script args` would,
# answers {"rc": exit code} (or "timeout") on the stdout it had at start (imports printing land on stderr).
SERVER = r"""
import atexit, json, os, runpy, signal, sys, time, traceback

reply = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
for name in sys.argv[1:]:
    try:
        __import__(name)
    except Exception:  # the scripts that import it fail on their own, each with its traceback
        traceback.print_exc()
base_path = [p for p in sys.path if p not in ("", os.getcwd())]
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            fd = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            sys.stdout.reconfigure(line_buffering=True)
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            sys.argv = [job["script"], *job["argv"]]
            sys.path[:] = [os.path.dirname(job["script"]), *base_path]
            try:
                runpy.run_path(job["script"], run_name="__main__")
                code = 0
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(code)
    deadline = time.monotonic() + job["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            rc = "timeout"
            break
        time.sleep(0.02)
    reply.write(json.dumps({"rc": rc}) + "\n")
    reply.flush()
"""


@dataclass
class Run:
    rc: int | str
    out: str  # stdout and stderr together

    def check(self, rc: int = 0) -> str:
        assert self.rc == rc, f"exit {self.rc}, expected {rc}:\n{self.out[-6000:]}"
        return self.out


class Runner:
    """Runs benchmark scripts in children of one preloaded server process (module docstring)."""

    def __init__(self, work: Path) -> None:
        self.work, self.count = work, 0
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.log = work / "server.log"
        command = [sys.executable, "-c", SERVER, *PRELOAD]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                         cwd=work, env=self.env)  # fmt: skip

    def __call__(self, script: str, *args: str, timeout: float = 300, cwd: Path = ROOT) -> Run:
        self.count += 1
        out = self.work / f"run{self.count}-{Path(script).stem}.txt"
        job = {"script": str(BENCH / script), "argv": list(args), "out": str(out), "cwd": str(cwd),
               "env": self.env, "timeout": timeout}  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the script server died:\n{self.log.read_text(errors='replace')[-4000:]}")
        return Run(json.loads(line)["rc"], out.read_text(errors="replace") if out.exists() else "")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.kill()  # between jobs: nothing of a script's left to end (its process group is gone)
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    runner = Runner(tmp_path_factory.mktemp("bench-runs"))
    yield runner
    runner.close()


def numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text)]


def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table in ``text``: its rows' cells, the header first (the ``|---|`` line dropped)."""
    found: list[list[list[str]]] = []
    previous = False
    for line in text.splitlines():
        is_row = line.startswith("|")
        if is_row and not re.fullmatch(r"\|[-:|]+\|", line.strip()):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if previous:
                found[-1].append(cells)
            else:
                found.append([cells])
        previous = is_row
    return found


def table_rows(text: str, first: str) -> list[list[str]]:
    """The rows of every table in ``text`` (headers included) whose first cell is ``first``."""
    return [row for table in tables(text) for row in table if row[0] == first]


def table(text: str, header: str, last: str = "") -> list[list[str]]:
    """The rows (header left out) of the one table whose header's first cell is ``header`` (and last ``last``)."""
    [rows] = [t[1:] for t in tables(text) if t[0][0] == header and t[0][-1] == (last or t[0][-1])]
    return rows


def last_json(text: str) -> dict:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


# --------------------------------------------------------------------------- the rules of the folder


def test_every_script_has_a_smoke_test_and_a_row_in_the_readme():
    tests = {name for name in globals() if name.startswith("test_")}
    assert sorted(SMOKE) == SCRIPTS, "a script without a smoke test (or a smoke test of a script that is gone)"
    assert not {t for t in SMOKE.values() if t not in tests}, "SMOKE names a test that does not exist"
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    assert sorted(set(re.findall(r"benchmarks/(\w+/\w+\.py)", readme))) == SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_script_imports_only_common_and_never_tests(script):
    """No script imports another script or anything from tests/ (test helpers it needs live in common.py); the
    repo paths it puts on sys.path are benchmarks/ (for common.py) and the repo root (components/, pipelines/)."""
    tree = ast.parse((BENCH / script).read_text(encoding="utf-8"))
    siblings = {p.stem for p in BENCH.glob("*/*.py")}
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
    assert not imported & siblings, f"{script} imports another script: {sorted(imported & siblings)}"
    assert not imported & {"conftest", "faulty_servers"} and not any(m.startswith("test_") for m in imported)
    source = (BENCH / script).read_text(encoding="utf-8")
    assert not [line for line in source.splitlines() if "sys.path" in line and "tests" in line]


def test_a_script_runs_from_a_plain_interpreter_in_any_folder(tmp_path):
    """The command line of the README, from another folder: the script finds common.py by itself."""
    for script in ("speed/bench_vs_reference.py", "ablations/ablation.py"):
        done = subprocess.run([sys.executable, str(BENCH / script), "--help"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("usage:")


# --------------------------------------------------------------------------- speed


def test_bench_mfu(run, monkeypatch):
    out = run("speed/bench_mfu.py", "--preset", "tiny", "--steps", "1", "--warmup", "0", "--precision", "fp32",
              "--peak-size", "64", "--peak-repeat", "1", "--profile", "3").check()  # fmt: skip
    assert "GFLOP/step" in out and "MFU %" in out
    row = re.compile(r"^((ALPRO|ALBEF|TS2-Net) \S+).*\sfp32\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", re.M)
    rows = {m[1]: [float(x) for x in m.groups()[2:]] for m in row.finditer(out)}
    assert set(rows) == {"ALPRO retrieval", "ALPRO pre-training", "ALBEF pre-training", "TS2-Net retrieval"}, out
    assert all(gflop > 0 and ms > 0 for gflop, ms, _ in rows.values())
    assert out.count("% of the forward") >= 17  # the per-module split of each family
    assert re.search(r"^ALPRO pre-training \(vtc\+pem\+mlm\+vtm\)", out, re.M)
    assert re.search(r"^    prompter \(frozen\)\s+[\d.]+ GFLOP\s+[\d.]+% of the forward$", out, re.M), out
    # bench_vs_reference.py reads this table: its pattern must still find the ALPRO and ALBEF rows
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = runpy.run_path(str(BENCH / "speed/bench_vs_reference.py"))
    assert {m[1] for line in out.splitlines() if (m := script["ROW"].match(line.strip()))} == {"ALPRO", "ALBEF"}
    # --profile: each row's three costliest ops, as bench_vs_reference.py reads them (the first row's)
    profiles = re.findall(r"^Profile of one step, (.+) fp32 \([\d,]+ minor page faults\): op", out, re.M)
    assert len(profiles) == 4 and all(any(p.startswith(name) for name in rows) for p in profiles), out
    got = script["read_vlp"](out)
    assert got["gflop"] > 0 and got["peak"] > 0 and got["mfu"] > 0 and len(got["profile"]) == 3, got
    # an op's name may hold spaces (e.g. "autograd::engine::evaluate_function: TBackward0")
    ops = [re.match(r"^(\S.*?)\s+([\d.]+) ms\s+([\d.]+)%\s+(\d+) calls$", line) for line in got["profile"]]
    assert all(ops), got["profile"]
    shares = [float(m[3]) for m in ops if m]
    assert shares == sorted(shares, reverse=True) and sum(shares) <= 100.0
    out = run("speed/bench_mfu.py", "--preset", "tiny", "--family", "albef", "--steps", "1", "--warmup", "0",
              "--precision", "fp32", "--peak-size", "64", "--peak-repeat", "1", "--op-times", "3").check()  # fmt: skip
    # --op-times: one step's three costliest aten ops, timed around their calls, their shares of the ops' time
    head = re.search(r"^Op times of one step, ALBEF \S+ \S+ fp32 \(([\d.]+) s; its ops ([\d.]+) s; [\d,]+ minor page "
                     r"faults\)", out, re.M)  # fmt: skip
    assert head and 0 < float(head[2]) <= float(head[1]) + 0.01, out
    timed = re.findall(r"^  (\w+)\s+([\d.]+) ms\s+([\d.]+)%\s+(\d+) calls$", out[head.end() :], re.M)[:3]
    assert len(timed) == 3 and [float(s) for _, _, s, _ in timed] == sorted((float(s) for _, _, s, _ in timed),
                                                                               reverse=True), out  # fmt: skip
    assert "mm" in {op for op, *_ in timed} or "addmm" in {op for op, *_ in timed}, timed
    # ... and by what each op works on: every group, the shares adding up to the ops' time; ALBEF's moving average
    # runs in the forward, AdamW in the update, and fp32 casts no weight
    table = re.search(r"^Op times of one step by what the op works on, ALBEF \S+ \S+ fp32: group, time, share of the "
                      r"ops' time\n((?:  .+\n)+)", out, re.M)  # fmt: skip
    assert table, out
    groups = {g: (float(ms), float(share)) for g, ms, share in
              re.findall(r"^  (\S.*?)\s+([\d.]+) ms\s+([\d.]+)%$", table[1], re.M)}  # fmt: skip
    assert list(groups) == ["matmuls", "attention kernels", "per parameter: optimizer step, zero_grad",
                            "per parameter: in-place in the forward (EMA)", "per parameter: weight casts",
                            "per parameter: gradient casts", "everything else"], groups  # fmt: skip
    assert sum(share for _, share in groups.values()) == pytest.approx(100, abs=0.5), groups
    assert groups["matmuls"][0] > 0 and groups["per parameter: optimizer step, zero_grad"][0] > 0, groups
    assert groups["per parameter: in-place in the forward (EMA)"][0] > 0, groups
    assert groups["per parameter: weight casts"][0] == groups["per parameter: gradient casts"][0] == 0, groups
    assert re.search(r"^peak \(64\^2 matmul, best of 1 x 1\) fp32: [\d.]+ TFLOP/s$", out, re.M), out
    assert any(script["ROW"].match(line.strip()) for line in out.splitlines()), out
    assert "freed_memory: keep" in out  # the loop's default
    assert re.search(r"^  ALBEF pre-training \S+ fp32: first step [\d.]+ s, median [\d.]+ s, [\d,]+ minor page faults "
                     r"a timed step$", out, re.M), out  # fmt: skip


def test_bench_mfu_op_groups():
    """--op-times' groups of single ops: a weight's bf16 cast, its gradient's cast back, a parameter updated in place
    in the forward, the whole update phase, matmuls, and the rest."""
    import torch

    group = runpy.run_path(str(BENCH / "speed/bench_mfu.py"))["op_group"]
    weight, frozen = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5), requires_grad=False)
    params, shapes = {weight.data_ptr(), frozen.data_ptr()}, {(4, 3)}
    act, act16 = torch.randn(4, 3), torch.randn(4, 3, dtype=torch.bfloat16)
    cast16, cast32 = weight.detach().bfloat16(), act16.float()

    def of(name, args, out, phase):
        return group(name, args, out, phase, params, shapes)

    assert of("_to_copy", (weight,), cast16, "forward") == "per parameter: weight casts"
    assert of("_to_copy", (act,), act.bfloat16(), "forward") == "everything else"  # an activation's cast
    assert of("_to_copy", (act16,), cast32, "backward") == "per parameter: gradient casts"  # a weight's shape
    assert of("_to_copy", (act16[:2],), cast32[:2], "backward") == "everything else"  # no trainable shape
    assert of("_to_copy", (act16,), cast32, "forward") == "everything else"  # not a gradient
    assert of("mul_", (frozen, 0.995), frozen, "forward") == "per parameter: in-place in the forward (EMA)"
    assert of("mul_", (act, 2.0), act, "forward") == "everything else"
    assert of("mul", (act, 2.0), act, "update") == "per parameter: optimizer step, zero_grad"
    assert of("mm", (act, act.t()), act, "backward") == of("addmm", (act,), act, "forward") == "matmuls"
    assert of("_scaled_dot_product_flash_attention_for_cpu", (act,), act, "forward") == "attention kernels"


def test_bench_attention(run):
    out = run("speed/bench_attention.py", "--repeat", "1", "--threads", "1").check()
    rows = re.findall(r"^(.+?)\s+(fp32|bf16)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    precisions = {"fp32"} if "bf16 skipped: this CPU has" in out else {"fp32", "bf16"}
    assert {p for _, p, *_ in rows} >= precisions and len(rows) >= 7, out
    assert all(float(s) > 0 and float(e) > 0 and float(r) == pytest.approx(float(e) / float(s), abs=0.02)
               for _, _, s, e, r in rows), out  # fmt: skip


def test_bench_albef_queue(run):
    out = run("speed/bench_albef_queue.py", "--queue", "64", "--dim", "8", "--batch", "4", "--repeat", "2").check()
    rows = re.findall(r"^(float32|bfloat16)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(True|False)$", out, re.M)
    assert [r[0] for r in rows] == ["float32", "bfloat16"] and all(r[4] == "True" for r in rows), out
    assert all(float(c) > 0 and float(k) > 0 for _, c, k, _, _ in rows), out
    out = run("speed/bench_albef_queue.py", "--step", "--preset", "tiny", "--queue", "8", "--repeat", "2").check()
    steps = re.findall(r"^(fp32|bf16)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+, [\d.]+, [\d.]+\s+(\d+)$", out, re.M)
    assert [s[0] for s in steps] == ["fp32", "bf16"] and steps[0][4] == "1", out  # one rebuild: the first read


def test_bench_alpro_step(run):
    out = run("speed/bench_alpro_step.py", "--preset", "tiny", "--batch", "2", "--steps", "1").check()
    step = re.search(r"full step \(fwd\+bwd\+AdamW\):\s+([\d.]+) ms\s+([\d.]+) clips/s", out)
    assert step and float(step[2]) > 0, out
    assert re.search(r"prompter forward \(PEM\)\s+[\d.]+ ms", out) and "VTM negative sampling" in out


def test_bench_albef_step(run):
    got = last_json(run("speed/bench_albef_step.py", "--preset", "tiny", "--batch", "2", "--queue", "4", "--steps",
                        "1", "--warmup", "0", "--json").check())  # fmt: skip
    assert got["impl"] == "vlp" and got["queue"] == 4 and got["step_s_median"] > 0 and got["peak_mib"] > 0


def test_bench_adamw(run):
    out = run("speed/bench_adamw.py", "--preset", "tiny", "--rounds", "1", "--updates", "1").check()
    rows = {m[1]: float(m[3]) for m in re.finditer(r"^(loop|foreach|fused)\s+([\d.]+)\s+([\d.]+)x$", out, re.M)}
    assert set(rows) == {"loop", "foreach", "fused"} and rows["loop"] == 1.0, out


def test_bench_startup(run, tmp_path):
    """Search, serve and imports on one TS2-Net index, once; the steps of the retrieval DAG on the tiny config,
    without the importtime run: every row timed, every step's start-up line found."""
    out = run("speed/bench_startup.py", "--families", "ts2net", "--repeat", "1", "--root", str(tmp_path)).check()
    assert re.search(r"^commands run \S+/src/vlp/__init__\.py", out, re.M), out
    for label in ("vlp search, whole process", "vlp serve, listening", "vlp serve, first answer"):
        cells = re.search(rf"^{label}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
        assert cells and 0.3 < float(cells[1]) == float(cells[2]) == float(cells[3]) < 120, (label, out)
    ranked = re.findall(r"^  (\S+)\s+([\d.]+) s$", out.split("importtime")[1], re.M)
    assert len(ranked) == 10 and "torch" in dict(ranked), out
    assert [float(s) for _, s in ranked] == sorted((float(s) for _, s in ranked), reverse=True)
    out = run("speed/bench_startup.py", "--what", "steps", "--pipeline", "retrieval", "--no-imports").check()
    steps = re.findall(r"^  ([a-z-]+)\s+([\d.]+)\s+nan\s+([\d.]+)$", out, re.M)
    assert {"synth", "ingest", "extract-frames", "finetune-retrieval", "evaluate-retrieval"} <= {s for s, _, _ in steps}
    assert all(0 < float(start) < float(wall) for _, start, wall in steps), out


def test_bench_ts2net_selection(run):
    """What the driver runs in a process per setting, and the JSON keys it reads (the driver itself, which starts two
    fresh interpreters, is left to a real run: 10 s of imports here)."""
    args = ["--preset", "tiny", "--batch", "2", "--frames", "2", "--text-len", "4", "--draws", "2", "--steps", "1"]
    code = last_json(run("speed/bench_ts2net_selection.py", *args, "--one", "code", "--json").check())
    none = last_json(run("speed/bench_ts2net_selection.py", *args, "--one", "none", "--json").check())
    assert (code["select"], none["select"]) == ("code", "none")
    assert all(r["step_s"] > 0 and r["peak_mib"] > 0 and r["threads"] >= 1 for r in (code, none))
    assert code["selector_fwd_bwd_s"] > 0 and math.isnan(none["selector_fwd_bwd_s"])  # no selector without selection


def test_bench_eval_paper(run):
    """The JSON bench_vs_reference.py --eval reads: encode seconds, per k the re-rank seconds and pairs fused."""
    got = last_json(run("speed/bench_eval_paper.py", "--preset", "tiny", "--videos", "4", "--ks", "2", "--frames",
                        "2", "--eval-batch", "4").check())  # fmt: skip
    assert got["videos"] == 4 and got["encode_s"] > 0
    assert set(got["k"]) == {"2"} and got["k"]["2"]["fused_pairs"] > 0 and got["k"]["2"]["rerank_s"] >= 0


def test_bench_retrieval_eval(run, main_job, tmp_path):
    args = ["--model", main_job["alpro"], "--num-videos", "4", "--ks", "2", "--eval-batch-size", "8", "--num-frames",
            "2", "--world", str(tmp_path / "world"), "synth.workers=1", "ingest.workers=1", "frames.workers=1",
            "retrieval.num_workers=0"]  # fmt: skip
    out = run("speed/bench_retrieval_eval.py", *args).check()
    assert "built the world" in out
    rows = {r[0]: r for r in table(out, "k")}
    assert set(rows) == {"2", "4 (N x N)"}, out
    assert rows["4 (N x N)"][1] == "16" and rows["4 (N x N)"][8:10] == ["1.0x", "1.0x"]  # N x N: every pair, itself
    assert float(rows["2"][1]) < 16 and all(float(x) >= 0 for x in rows["2"][2:8])
    again = run("speed/bench_retrieval_eval.py", *args, "--rerank-only").check()
    assert "reusing the world" in again and "the same VTM logits under score rule" in again
    assert [r[0] for r in table(again, "k")] == ["2", "4 (N x N)"]


def test_bench_vs_reference(run, tmp_path):
    """Needs LAVIS's venv (scripts/reference-venv.sh): here its arguments and its refusal without the venv."""
    assert "--reference-python" in run("speed/bench_vs_reference.py", "--help").check()
    missing = tmp_path / "no-venv" / "python"
    out = run("speed/bench_vs_reference.py", "--reference-python", str(missing), "--rounds", "1").check(2)
    assert f"{missing} is missing: build it with scripts/reference-venv.sh" in out


def test_reference_step(run):
    """Runs only under LAVIS's venv: here its arguments and its one-line refusal without salesforce-lavis."""
    assert "--eval-videos" in run("speed/reference_step.py", "--help").check()
    assert "must be a multiple of --batch" in run("speed/reference_step.py", "--model", "albef_pretrain", "--queue",
                                                  "5", "--batch", "2").check(2)  # fmt: skip
    if importlib.util.find_spec("lavis") is not None:
        pytest.skip("salesforce-lavis is installed here: the refusal does not apply")
    out = run("speed/reference_step.py", "--model", "alpro_retrieval", "--steps", "1").check(1)
    assert "salesforce-lavis is not installed here" in out


# --------------------------------------------------------------------------- input


def test_bench_extract(run, tmp_path):
    out = run("input/bench_extract.py", "--clips", "2", "--distinct", "1", "--seconds", "1", "--fps", "8", "--width",
              "64", "--height", "48", "--num-frames", "2", "--size", "32", "--repeat", "1", "--max-workers", "1",
              "--workdir", str(tmp_path)).check()  # fmt: skip
    for name in ("baseline (decode all, PyAV)", "baseline, shared SwsContext", "extract sparse, 1 process",
                 "extract decord, 1 process"):  # fmt: skip
        row = re.search(rf"^{re.escape(name)}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+x", out, re.M)
        assert row and float(row[2]) > 0, out  # videos/s (a fast variant's wall seconds print as 0.00)
    assert re.search(r"CPU-time speedup of 'extract sparse, 1 process': [\d.]+x", out)


def test_bench_fanout(run, tmp_path):
    out = run("input/bench_fanout.py", "--clips", "8", "--parts", "2", "--parallelism", "2", "--rounds", "1",
              "--out", str(tmp_path)).check()  # fmt: skip
    assert "2 frame stores, all byte-identical" in out
    tasks = {(r[0], r[2]): r for r in table(out, "DAG")}
    wanted = {("one pod", "extract-frames"), ("2 parts", "extract-frames-part"), ("2 parts", "extract-frames-merge")}
    assert wanted <= set(tasks), out
    assert tasks[("2 parts", "extract-frames-part")][3] == "2"  # two parts, each its own task


def test_bench_fetch(run, tmp_path):
    out = run("input/bench_fetch.py", "--rows", "12", "--videos", "2", "--mb", "0.2", "--concurrency", "1", "4",
              "--out", str(tmp_path)).check()  # fmt: skip
    rows = {r[0]: r for r in tables(out)[0][1:]}
    assert set(rows) == {"1", "4"} and all(r[1] == "12" and float(r[4]) > 0 for r in rows.values()), out
    assert re.search(r"at fetch.per_host_rate=10 \(one host, as WebVid's\): 3 parts", out), out


def test_bench_entities(run):
    out = run("input/bench_entities.py", "--num-captions", "64", "--batch-size", "32", "--repeats", "1").check()
    assert re.search(r"noun counts identical: True \(\d+ distinct nouns", out), out
    assert re.search(r"speedup [\d.]+x", out)


def test_bench_input(run, tmp_path):
    bytes_ = run("input/bench_input.py", "bytes", "--root", str(tmp_path / "store"), "--shards", "4", "--clips", "2",
                 "--frames", "2", "--size", "8", "--draws", "8", "--shuffle-buffer", "4").check()  # fmt: skip
    rows = table_rows(bytes_, "bytes per clip, local disk")
    assert len(rows) == 4 and all(re.match(r"[\d.]+x the clips' bytes", r[2]) for r in rows), bytes_
    world = ["--world", str(tmp_path / "world"), "--videos", "4", "--batch", "2"]
    rate = run("input/bench_input.py", "rate", *world, "--workers", "0", "--batches", "2").check()
    assert len(table_rows(rate, "clips/s, loader workers")) == 2, rate
    assert len(table_rows(rate, "bytes per clip at 224 px")) == 3, rate
    overlap = run("input/bench_input.py", "overlap", *world, "--workers", "0", "--steps", "6").check()
    assert [r[1].split(" (")[0] for r in table_rows(overlap, "update time, overlap")] == [
        "batches built beforehand", "batches from the loader, 0 worker(s)"]  # fmt: skip
    gpu = run("input/bench_input.py", "gpu", "--preset", "tiny", "--clips-per-s-per-core", "30").check()
    assert len(table_rows(gpu, "cores to feed one GPU")) == 2 and table_rows(gpu, "ALPRO step FLOPs")


# --------------------------------------------------------------------------- search


def test_bench_index(run):
    out = run("search/bench_index.py", "--rows", "1000", "--queries", "10", "--warmup", "1", "--clusters", "20",
              "--grow", "200", "--no-faiss").check()  # fmt: skip  # exit 0: the exact scan's top-k is numpy's
    for variant in ("exact scan (nearest, no ANN)", "ANN nearest() [store.py]"):
        row = re.search(rf"^{re.escape(variant)}\s+\S+\s+[\d.]+\s+[\d.]+x\s+([\d.]+)\s+([\d.]+) (yes|no)$", out, re.M)
        assert row and 0 <= float(row[1]) <= 1, out
    assert re.search(r"exact scan vs numpy: top-10 same set 10/10", out)
    assert re.search(r"extend_ann: [\d.]+ s; build_ann over every row", out)


def test_bench_search_paths(run, tmp_path):
    """Needs a finished main job (make pipeline-run: its MLflow registry, index and frames) and chromium: here its
    arguments and its refusal of a folder that is not one."""
    assert "--no-page" in run("search/bench_search_paths.py", "--help").check()
    assert "has no mlflow.db" in run("search/bench_search_paths.py", "--run", str(tmp_path)).check(1)


# --------------------------------------------------------------------------- parity


@pytest.mark.parametrize("script", ["parity/alpro_parity.py", "parity/albef_parity.py"])
def test_alpro_and_albef_parity(run, script):
    out = run(script).check()
    rows = [line for line in out.splitlines() if re.match(r"\S+\.pt( \(\w+\))?\s+\w+\s+[\d.e+-]+\s+[\d.]+$", line)]
    assert len(rows) >= 10, out
    largest = re.search(r"largest difference: (\S+) \(test tolerance 1e-4\)", out)
    assert largest and float(largest[1]) < 1e-4


def test_ts2net_parity(run):
    out = run("parity/ts2net_parity.py").check()
    diffs = [float(x) for x in re.findall(r"max \|vlp - reference\| = (\S+)", out)]
    assert len(diffs) == 3 and max(diffs) < 1e-4, out


# --------------------------------------------------------------------------- ablations

ABLATION_KEYS = ["ft_t2v_r1", "ft_vtc_t2v_r1", "ft_t2v_r5", "ft_t2v_medr", "ft_vtc_t2v_medr", "ft_v2t_r1",
                 "ft_vtm_loss", "zs_t2v_r1", "qa_acc", "qa_majority", "pem_kept", "ft_itc_t2v_r1", "ft_itc_v2t_r1",
                 "ft_itc_t2v_medr", "ft_itm_loss", "zs_itc_t2v_r1", "ft_sim_t2v_r1", "ft_sim_t2v_r5", "ft_match_loss",
                 "match_prior", "zs_sim_t2v_r1", "prompter_s", "pretrain_s", "ret_ft_s", "qa_ft_s"]  # fmt: skip
ABLATION_ROWS = {
    "ablations/ablation.py": ["none", "mlm+vtm", "mlm+vtm+pem", "mlm+vtm+vtc", "all", "all, 1 template"],
    "ablations/ablation_albef.py": ["none", "mlm+itm", "itc+mlm+itm", "itc+mlm+itm_hard", "itc+mlm+itm_hard+mod"],
    "ablations/ablation_pretrained.py": ["tiny", "small-pretrained", "small-pretrained, 10 min"],
}


def write_results(script: str, out: Path) -> None:
    """Three seeds of every row, the metrics a line of seed, row and key apart: what a finished run leaves."""
    results = []
    for seed in range(3):
        for i, row in enumerate(ABLATION_ROWS[script]):
            metrics = {k: 10.0 + 3 * i + seed + j / 10 for j, k in enumerate(ABLATION_KEYS)}
            results.append({"seed": seed, "row": row, **metrics, "num_videos": 40, "num_texts": 200,
                            "chance_r1": 2.5, "chance_medr": 20.5, "total_s": 60.0, "threads": 1})  # fmt: skip
    if script == "ablations/ablation.py":  # one results.jsonl
        out.mkdir(parents=True)
        (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
        return
    (out / "results").mkdir(parents=True)
    for r in results:
        tag = re.sub(r"[^A-Za-z0-9]+", "_", r["row"]).strip("_")
        (out / "results" / f"seed{r['seed']}-{tag}.json").write_text(json.dumps(r) + "\n")


@pytest.mark.parametrize("script", sorted(ABLATION_ROWS))
def test_ablation_reports(run, script, tmp_path):
    """The report from a finished run's results of three seeds (``--report-only``: nothing trains)."""
    write_results(script, tmp_path / "out")
    report = tmp_path / "report.md"
    printed = run(script, "--out", str(tmp_path / "out"), "--report-only", "--report", str(report)).check()
    text = report.read_text(encoding="utf-8")
    assert text in printed
    assert f"`benchmarks/{script}" in text.splitlines()[2]  # "Generated by ...": the script's path
    rows = table(text, "row" if "pretrained" in script else "pre-training", last="n")
    assert [r[0] for r in rows] == ABLATION_ROWS[script], text
    assert all(r[-1] == "3" and re.fullmatch(r"[\d.]+ ± [\d.]+", r[1]) for r in rows)
    verdicts = [r[4] for r in table(text, "claim")]
    assert verdicts and set(verdicts) <= {"yes", "not resolved", "no (reversed)"}, text  # t tests over 3 seeds


ONE_STEP = ["--pretrain-steps", "1", "--finetune-steps", "1", "--qa-steps", "1"]
UNITS = {  # script -> (the row run for real, its step counts, the first header of its results table)
    "ablations/ablation.py": ("mlm+vtm", ONE_STEP, "pre-training"),
    "ablations/ablation_albef.py": ("itc+mlm+itm", ONE_STEP, "pre-training"),
    "ablations/ablation_pretrained.py": ("tiny", ONE_STEP, "row"),
    "ablations/ablation_ts2net.py": ("ts2net", ["--steps", "1"], "row"),
}


@pytest.fixture(scope="module")
def ablation_world(run, tmp_path_factory) -> Path:
    """The ablations' world at 12 clips (ALBEF's queue needs a batch of 32 training pairs), built by
    ablation_ts2net.py's first unit run; the other scripts' runs find it in their ``--out`` and build no other."""
    out = tmp_path_factory.mktemp("ablation-world")
    run("ablations/ablation_ts2net.py", "--out", str(out), "--clips", "12", "--steps", "1", "--rows", "no shift",
        "--seeds", "0", "--report", str(out / "report.md")).check()  # fmt: skip
    assert (out / "data" / "entities" / "summary.json").is_file()  # mined: what the ALPRO rows build banks from
    return out / "data"


@pytest.mark.parametrize("script", sorted(UNITS))
def test_ablation_units(run, script, ablation_world, tmp_path):
    """One unit for real, each step one update (pre-training, fine-tunings, evaluations), then its report."""
    row, steps, first = UNITS[script]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "data").symlink_to(ablation_world)
    report = tmp_path / "report.md"
    out = run(script, "--out", str(tmp_path / "out"), "--clips", "12", *steps, "--rows", row, "--seeds", "0",
              "--report", str(report)).check()  # fmt: skip
    unit = last_json(out)  # the unit's line, printed as it finished
    assert unit["seed"] == 0 and unit["row"] == row and unit["num_videos"] >= 1 and unit["total_s"] >= 0
    r1 = unit.get("ft_t2v_r1", unit.get("t2v_r1"))
    assert 0 <= r1 <= 100
    rows = {r[0]: r for r in table(report.read_text(encoding="utf-8"), first, last="n")}
    assert rows[row][-1] == "1" and re.fullmatch(r"[\d.]+", rows[row][1]), out  # one seed: the value, no spread
    others = [r for name, r in rows.items() if name != row]  # rows without results (pretrained: left out)
    assert all(r[-1] == "0" and r[1] == "–" for r in others) and (others or "pretrained" in script)


# --------------------------------------------------------------------------- probes


def test_measure_alpro(run, main_job):
    out = run("probes/measure_alpro.py", "--dataset", main_job["dataset"], "--frames", main_job["frames"],
              "--prompter", main_job["prompter"], "--bank", main_job["bank"], "--model", main_job["alpro"],
              "--crops", "1").check()  # fmt: skip
    for who in ("prompter untrained", "prompter trained  ", "alpro    untrained", "alpro    trained  "):
        assert re.search(rf"zero-shot t2v R@1  {who}:\s+[\d.]+%", out), out
    assert re.search(r"beats the shape-swapped one\s+[\d.]+% of \d+ times", out)
    assert re.search(r"^object-centred crop, top-1 of all entities names it\s+[\d.]+%\s+[\d.]+%\s+\d+$", out, re.M)


def test_vtm_probe(run, tmp_path):
    assert "hard_masked_mlm:neg=hard_masked,mlm=1" in run("probes/vtm_probe.py", "--runs").check()
    out = run("probes/vtm_probe.py", "--work", str(tmp_path), "--num-videos", "8", "--test-fraction", "0.5",
              "--captions", "1", "--vocab", "60", "--batch", "4", "--vtc-steps", "2", "--vtm-steps", "2", "--k", "2",
              "--workers", "1", "--runs", "u:neg=uniform").check()  # fmt: skip
    assert table_rows(out, "VTC-only dual encoder") and len(table_rows(out, "hard_masked")) == 1
    runs = table_rows(out, "u")
    assert len(runs) == 3 and runs[0][1:3] == ["probe", "uniform"], out  # losses, pair types, retrieval
    assert all(not math.isnan(x) for r in runs for x in numbers(" ".join(r[3:])))


# --------------------------------------------------------------------------- faults


def test_fault_battery(run, tmp_path):
    """The cases that exercise what common.py took over from the tests' helpers (mp4s, a PNG bomb header, hostile
    checkpoint files, the fault-injecting S3 proxy) and the one that imports pipelines/; the MLflow, kill, serve and
    exit-code cases take minutes."""
    cases = ["corrupt media", "oversize declared", "one id", "hostile checkpoint", "secret in the config", "S3"]
    out = run("faults/fault_battery.py", "--out", str(tmp_path), "--only", *cases).check()
    rows = table(out, "case")
    assert len(rows) == len(cases) + 1 and rows[-1][0] == "**total**", out
    for name, tried, handled, crashes, hangs, lost, *_ in rows:
        assert int(tried) > 0 and handled == tried and (crashes, hangs, lost) == ("0", "0", "0"), name


# --------------------------------------------------------------------------- a small main job, for the scripts of one

MAIN_JOB = """
import sys
from vlp.cli import main

root, config = sys.argv[1:]
settings = ["--config", config, "synth.num_images=0", "pretrain.max_steps=1"]
for argv in (  # make data, make pretrain
    ["data", "synth", "--out", f"{root}/raw"],
    ["ingest", "--source", f"{root}/raw", "--out", f"{root}/dataset"],
    ["extract-frames", "--dataset", f"{root}/dataset", "--out", f"{root}/frames"],
    ["mine-entities", "--dataset", f"{root}/dataset", "--out", f"{root}/entities"],
    ["pretrain-prompter", "--dataset", f"{root}/dataset", "--frames", f"{root}/frames", "--out", f"{root}/prompter"],
    ["build-prompt-bank", "--prompter", f"{root}/prompter", "--entities", f"{root}/entities", "--out", f"{root}/bank"],
    ["pretrain", "--model", "alpro", "--dataset", f"{root}/dataset", "--frames", f"{root}/frames", "--prompter",
     f"{root}/prompter", "--prompt-bank", f"{root}/bank", "--out", f"{root}/alpro"],
):
    if main([*argv, *settings]) != 0:
        sys.exit("vlp " + " ".join(argv) + " failed")
"""


@pytest.fixture(scope="module")
def main_job(run, tmp_path_factory) -> dict[str, str]:
    """The main job's outputs at configs/tiny.yaml sizes, one step each (`make data`, `make pretrain`): dataset,
    frames, prompter, prompt bank and the pre-trained ALPRO model (made by the script server: vlp is imported there)."""
    root = tmp_path_factory.mktemp("main-job")
    script = root / "main_job.py"
    script.write_text(textwrap.dedent(MAIN_JOB))
    run(str(script), str(root), str(ROOT / "configs" / "tiny.yaml")).check()
    return {k: str(root / k) for k in ("dataset", "frames", "prompter", "bank", "alpro")}


SMOKE = {  # script -> its smoke test (test_every_script_has_a_smoke_test_and_a_row_in_the_readme keeps it whole)
    "ablations/ablation.py": "test_ablation_units",
    "ablations/ablation_albef.py": "test_ablation_units",
    "ablations/ablation_pretrained.py": "test_ablation_units",
    "ablations/ablation_ts2net.py": "test_ablation_units",
    "faults/fault_battery.py": "test_fault_battery",
    "input/bench_entities.py": "test_bench_entities",
    "input/bench_extract.py": "test_bench_extract",
    "input/bench_fanout.py": "test_bench_fanout",
    "input/bench_fetch.py": "test_bench_fetch",
    "input/bench_input.py": "test_bench_input",
    "parity/albef_parity.py": "test_alpro_and_albef_parity",
    "parity/alpro_parity.py": "test_alpro_and_albef_parity",
    "parity/ts2net_parity.py": "test_ts2net_parity",
    "probes/measure_alpro.py": "test_measure_alpro",
    "probes/vtm_probe.py": "test_vtm_probe",
    "search/bench_index.py": "test_bench_index",
    "search/bench_search_paths.py": "test_bench_search_paths",
    "speed/bench_adamw.py": "test_bench_adamw",
    "speed/bench_albef_step.py": "test_bench_albef_step",
    "speed/bench_alpro_step.py": "test_bench_alpro_step",
    "speed/bench_albef_queue.py": "test_bench_albef_queue",
    "speed/bench_attention.py": "test_bench_attention",
    "speed/bench_eval_paper.py": "test_bench_eval_paper",
    "speed/bench_mfu.py": "test_bench_mfu",
    "speed/bench_retrieval_eval.py": "test_bench_retrieval_eval",
    "speed/bench_startup.py": "test_bench_startup",
    "speed/bench_ts2net_selection.py": "test_bench_ts2net_selection",
    "speed/bench_vs_reference.py": "test_bench_vs_reference",
    "speed/reference_step.py": "test_reference_step",
}
