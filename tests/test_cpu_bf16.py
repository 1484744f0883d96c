"""bf16 on the CPU only where the CPU can do it (vlp.distributed.require_cpu_bf16): on a CPU without bf16
instructions or AVX-512 (faked here: this machine's CPU may have them), a training step's ``cpu_bf16`` and an
evaluation's ``eval_precision=bf16`` refuse before any work, in one line naming what the CPU has and what to set;
``VLP_ALLOW_SLOW_BF16=1`` runs them anyway (the test session sets it, so that the bf16 tests run on every CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from test_train_loop import TinyMLP, ce_step, cfg_for, make_data, make_loader
from vlp import distributed, inference
from vlp.train.loop import train

SLOW = (False, "no bf16 instructions and no AVX-512; torch's CPU capability AVX2")


@pytest.fixture
def avx2_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed, "cpu_bf16_support", lambda: SLOW)
    monkeypatch.delenv(distributed.ALLOW_SLOW_BF16, raising=False)


def test_training_with_cpu_bf16_is_refused_before_the_first_step(tmp_path: Path, avx2_only: None) -> None:
    x, y = make_data(8)
    model = TinyMLP(dropout=0.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError) as refused:
        train(model, ce_step, make_loader(x, y, 4), cfg_for(tmp_path, max_steps=2, cpu_bf16=True))
    message = str(refused.value)
    assert message.startswith("cpu_bf16=true asks for bf16 on this CPU, which has no bf16 instructions and no AVX-512")
    assert "torch's CPU capability AVX2" in message and "set cpu_bf16=false in the step's section" in message
    assert "VLP_ALLOW_SLOW_BF16=1" in message and "\n" not in message
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # not one update
    assert not (tmp_path / "checkpoints").exists()
    train(model, ce_step, make_loader(x, y, 4), cfg_for(tmp_path / "fp32", max_steps=1))  # fp32 runs


def test_an_evaluation_in_bf16_is_refused_and_fp32_is_not(avx2_only: None) -> None:
    with pytest.raises(RuntimeError, match=r"^eval_precision=bf16 asks for bf16 on this CPU, which has no bf16"):
        inference.autocast("bf16")
    with inference.autocast("fp32"):
        assert not torch.is_autocast_enabled("cpu")


def test_the_override_runs_bf16_anyway(tmp_path: Path, avx2_only: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(distributed.ALLOW_SLOW_BF16, "1")
    with inference.autocast("bf16"):
        assert torch.is_autocast_enabled("cpu")
    x, y = make_data(8)
    train(TinyMLP(dropout=0.0), ce_step, make_loader(x, y, 4), cfg_for(tmp_path, max_steps=1, cpu_bf16=True))


def test_what_this_cpu_has_is_read_from_its_flags() -> None:
    fast, what = distributed.cpu_bf16_support()
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    native = [f for f in distributed.BF16_FLAGS if f in flags]
    assert what.endswith(f"torch's CPU capability {torch.backends.cpu.get_cpu_capability()}")
    if native:
        assert fast and what.startswith(", ".join(native))
