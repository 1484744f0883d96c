"""bf16 on the CPU only where it is no slower than fp32 (vlp.distributed.probe_cpu_bf16, require_cpu_bf16): the
probe times a bf16 and an fp32 matmul once per machine and caches the figures in a JSON file keyed by the CPU and
torch; where bf16 is slower, a training step's ``cpu_bf16`` and an evaluation's ``eval_precision=bf16`` refuse
before any work, in one line naming the figures and what to set (exit 2 from the CLI). ``VLP_CPU_BF16=fast|slow``
gives the verdict without timing; ``VLP_ALLOW_SLOW_BF16=1`` runs bf16 anyway (the test session sets it, so that the
bf16 tests run on every CPU; the tests here unset it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from test_train_loop import TinyMLP, ce_step, cfg_for, make_data, make_loader
from vlp import distributed, inference
from vlp.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
ALBEF = ["model.family=albef", "model.albef.queue_size=8", "model.albef.momentum=0.9"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory as ``$XDG_CACHE_HOME``, as a new process sees it (nothing probed yet); bf16 not
    allowed regardless, the verdict not forced."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(distributed, "_PROBED", {})
    monkeypatch.delenv(distributed.ALLOW_SLOW_BF16, raising=False)
    monkeypatch.delenv(distributed.CPU_BF16, raising=False)
    return tmp_path / "cache"


@pytest.fixture
def timed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes the probe times, in order (the real timing runs)."""
    sizes: list[int] = []
    real = distributed._time_matmuls

    def spy(size: int) -> tuple[float, float]:
        sizes.append(size)
        return real(size)

    monkeypatch.setattr(distributed, "_time_matmuls", spy)
    return sizes


def new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget this process's verdict, as the next process starts without it."""
    monkeypatch.setattr(distributed, "_PROBED", {})


def cache_file() -> Path:
    path = distributed._cache_path(distributed._probe_key())
    assert path is not None
    return path


def test_the_probe_times_bf16_against_fp32_once_and_keeps_the_figures(cache: Path, timed: list[int]) -> None:
    probe = distributed.probe_cpu_bf16()
    assert probe.source == "measured" and probe.size in distributed.PROBE_SIZES and timed[0] == 128
    assert timed == list(distributed.PROBE_SIZES[: len(timed)]) and probe.size == timed[-1]
    assert probe.bf16_s > 0 and probe.fp32_s > 0 and probe.fast == (probe.ratio <= distributed.MAX_BF16_RATIO)
    stored = json.loads(Path(probe.path).read_text())
    assert Path(probe.path) == cache_file() and Path(probe.path).parent == cache / "vlp"
    assert stored == {"key": distributed._probe_key(), "size": probe.size, "bf16_s": probe.bf16_s,
                      "fp32_s": probe.fp32_s}  # fmt: skip
    if torch.backends.cpu.get_cpu_capability() == "AVX2" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert not probe.fast and probe.size == 128, probe  # torch's plain bf16 loops: far slower, seen at 128
    count = len(timed)
    assert distributed.probe_cpu_bf16() is probe and len(timed) == count  # once per process


def test_the_next_process_reads_the_cache_and_times_nothing(
    cache: Path, timed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = distributed.probe_cpu_bf16()
    count = len(timed)
    new_process(monkeypatch)
    again = distributed.probe_cpu_bf16()
    assert again.source == "cached" and len(timed) == count
    assert (again.fast, again.size, again.bf16_s, again.fp32_s, again.path) == (
        first.fast, first.size, first.bf16_s, first.fp32_s, first.path
    )  # fmt: skip
    child = "from vlp import distributed as d; p = d.probe_cpu_bf16(); print(p.source, p.bf16_s, p.fp32_s)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["cached", str(first.bf16_s), str(first.fp32_s)], out.stderr[-2000:]


DAMAGE = ["", "{", "[]", "not json \x00", '{"key": {}, "size": 512, "bf16_s": 1, "fp32_s": 1}', "other key",
          "negative", "zero"]  # fmt: skip


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_or_foreign_cache_file_is_measured_again(
    cache: Path, timed: list[int], monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    path = cache_file()
    good = {"key": distributed._probe_key(), "size": 512, "bf16_s": 1e-3, "fp32_s": 2e-3}
    fakes = {
        "other key": {**good, "key": {**good["key"], "cpu": "another CPU"}},
        "negative": {**good, "bf16_s": -1.0},
        "zero": {**good, "fp32_s": 0},
    }
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(fakes[damage]) if damage in fakes else damage)
    probe = distributed.probe_cpu_bf16()
    assert probe.source == "measured" and timed, probe
    stored = json.loads(path.read_text())  # rewritten with this measurement
    assert stored["key"] == good["key"] and stored["bf16_s"] == probe.bf16_s and stored["fp32_s"] == probe.fp32_s
    new_process(monkeypatch)
    assert distributed.probe_cpu_bf16().source == "cached"


def test_another_torch_or_cpu_is_measured_again_beside_the_old_file(
    cache: Path, timed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = distributed.probe_cpu_bf16()
    old = Path(first.path).read_text()
    count = len(timed)
    new_process(monkeypatch)
    monkeypatch.setattr(torch, "__version__", "0.0.1+another")
    upgraded = distributed.probe_cpu_bf16()
    assert upgraded.source == "measured" and len(timed) > count and upgraded.path != first.path
    assert json.loads(Path(upgraded.path).read_text())["key"]["torch"] == "0.0.1+another"
    new_process(monkeypatch)
    monkeypatch.setattr(distributed, "_cpu_identity", lambda: ("another CPU", ["fpu", "sse2"]))
    moved = distributed.probe_cpu_bf16()
    assert moved.source == "measured" and moved.path not in (first.path, upgraded.path)
    assert Path(first.path).read_text() == old  # each key keeps its own file
    assert len(list((cache / "vlp").iterdir())) == 3


def test_a_cache_that_cannot_be_written_costs_a_measurement_not_the_step(
    tmp_path: Path, cache: Path, timed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # its vlp/ cannot be made (root or not)
    probe = distributed.probe_cpu_bf16()
    assert probe.source == "measured" and probe.path.startswith(str(blocker))
    count = len(timed)
    new_process(monkeypatch)
    assert distributed.probe_cpu_bf16().source == "measured" and len(timed) > count
    assert blocker.read_text() == "" and not list(tmp_path.glob("**/*.tmp"))


@pytest.mark.parametrize(
    ("figures", "sizes", "fast"),
    [
        ({128: (2e-3, 1e-4)}, [128], False),  # 20x at the small size: no larger matmul (an AVX2-only CPU)
        ({128: (4e-4, 1e-4), 512: (4e-3, 1e-3)}, [128, 512], False),  # 4x: oneDNN on AVX-512 without bf16
        ({128: (2e-4, 1e-4), 512: (5.5e-4, 1e-3)}, [128, 512], True),  # 0.55x: avx512_bf16 / AMX
        ({128: (1e-4, 1e-4), 512: (1e-3, 1e-3)}, [128, 512], True),  # parity: not slower
    ],
)
def test_the_verdict_follows_the_figures_and_the_small_size_can_decide_alone(
    cache: Path, monkeypatch: pytest.MonkeyPatch, figures: dict[int, tuple[float, float]], sizes: list[int], fast: bool
) -> None:
    seen: list[tuple[int, int]] = []

    def fake(size: int) -> tuple[float, float]:
        seen.append((size, torch.get_num_threads()))
        return figures[size]

    threads = torch.get_num_threads()
    monkeypatch.setattr(distributed, "_time_matmuls", fake)
    probe = distributed.probe_cpu_bf16()
    assert [s for s, _ in seen] == sizes and all(n == 1 for _, n in seen) and torch.get_num_threads() == threads
    assert (probe.fast, probe.size, (probe.bf16_s, probe.fp32_s)) == (fast, sizes[-1], figures[sizes[-1]])


@pytest.mark.parametrize("verdict", ["fast", "slow"])
def test_the_verdict_can_be_set_without_timing(
    cache: Path, timed: list[int], monkeypatch: pytest.MonkeyPatch, verdict: str
) -> None:
    monkeypatch.setenv(distributed.CPU_BF16, verdict)
    probe = distributed.probe_cpu_bf16()
    assert (probe.fast, probe.source, timed) == (verdict == "fast", "forced", []) and not cache.exists()
    assert distributed.cpu_bf16_support()[1].endswith(f"VLP_CPU_BF16={verdict} says so (nothing measured)")
    monkeypatch.setenv(distributed.CPU_BF16, "yes")
    with pytest.raises(ValueError, match=r"^VLP_CPU_BF16 must be fast or slow \(or unset, to measure\), got 'yes'$"):
        distributed.probe_cpu_bf16()


def slow_figures_cached() -> Path:
    """A cache file that says bf16 takes 4.1 times fp32's time here (an AVX-512 CPU without bf16 instructions)."""
    path = cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": distributed._probe_key(), "size": 512, "bf16_s": 4.1e-3, "fp32_s": 1e-3}))
    return path


def test_training_with_cpu_bf16_is_refused_with_the_figures_before_the_first_step(
    tmp_path: Path, cache: Path, timed: list[int]
) -> None:
    path = slow_figures_cached()
    x, y = make_data(8)
    model = TinyMLP(dropout=0.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(distributed.SlowCpuBf16Error) as refused:
        train(model, ce_step, make_loader(x, y, 4), cfg_for(tmp_path, max_steps=2, cpu_bf16=True))
    assert str(refused.value) == (
        "cpu_bf16=true asks for bf16 on this CPU, where bf16 matmuls are slower than fp32: a 512 x 512 matmul on one "
        f"thread takes 4.1 ms in bf16 against 1 ms in fp32, 4.10x as long; delete {path} to measure again; set "
        "cpu_bf16=false in the step's section (pretrain, retrieval, qa) (or VLP_ALLOW_SLOW_BF16=1 to run it anyway)"
    )
    assert isinstance(refused.value, ValueError) and timed == []  # the cached figures, nothing timed
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # not one update
    assert not (tmp_path / "checkpoints").exists()
    train(model, ce_step, make_loader(x, y, 4), cfg_for(tmp_path / "fp32", max_steps=1))  # fp32 runs


def test_an_evaluation_in_bf16_is_refused_and_fp32_is_not(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slow_figures_cached()
    with pytest.raises(distributed.SlowCpuBf16Error, match=r"^eval_precision=bf16 asks for bf16 on this CPU, wh"):
        inference.autocast("bf16")
    with inference.autocast("fp32"):
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("setting", [(distributed.ALLOW_SLOW_BF16, "1"), (distributed.CPU_BF16, "fast")])
def test_bf16_runs_when_allowed_or_said_fast(
    tmp_path: Path, cache: Path, timed: list[int], monkeypatch: pytest.MonkeyPatch, setting: tuple[str, str]
) -> None:
    slow_figures_cached()
    monkeypatch.setenv(*setting)
    with inference.autocast("bf16"):
        assert torch.is_autocast_enabled("cpu")
    x, y = make_data(8)
    train(TinyMLP(dropout=0.0), ce_step, make_loader(x, y, 4), cfg_for(tmp_path, max_steps=1, cpu_bf16=True))
    assert timed == []


def test_the_cli_refuses_a_bf16_step_on_a_slow_cpu_with_one_line_and_exit_2(
    tiny_world: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != distributed.ALLOW_SLOW_BF16}
    env.update(PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", **{distributed.CPU_BF16: "slow"})
    out = tmp_path / "pretrained"
    cmd = [sys.executable, "-m", "vlp.cli", "pretrain", "--model", "albef", "--dataset", tiny_world["dataset"],
           "--frames", tiny_world["frames"], "--out", str(out), "--config", str(TINY), *ALBEF,
           "pretrain.max_steps=2", "pretrain.cpu_bf16=true"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if " INFO " not in line]
    assert (done.returncode, done.stdout) == (2, ""), done.stderr[-3000:]
    assert lines == [
        "vlp pretrain: error: cpu_bf16=true asks for bf16 on this CPU, where bf16 matmuls are slower than fp32: "
        "VLP_CPU_BF16=slow says so (nothing measured); set cpu_bf16=false in the step's section (pretrain, "
        "retrieval, qa) (or VLP_ALLOW_SLOW_BF16=1 to run it anyway)"
    ], done.stderr[-3000:]
    assert not (out / "checkpoints").exists() and not (out / "model.json").exists()


def test_the_probe_costs_a_fraction_of_a_second(cache: Path) -> None:
    start = time.perf_counter()
    distributed.probe_cpu_bf16()
    assert time.perf_counter() - start < 2.0  # 0.01-0.1 s measured; headroom for a loaded machine
