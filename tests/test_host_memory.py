"""``freed_memory``: with ``keep`` (the training sections' default) glibc serves the next step's tensors from the
memory the process freed, with no page fault, and no trained value changes; ``release`` leaves glibc's defaults.

The setting holds for the rest of a process, so each run here is its own process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from vlp import host_memory
from vlp.host_memory import apply_freed_memory
from vlp.train.loop import TrainConfig

# Three updates of an MLP through vlp's training loop with freed_memory from argv, then the weights' digest and the
# median minor page faults of seven steps of large temporaries (64 MiB each): what the setting left the process with.
# The median, as with ``keep`` glibc's heap can still grow once: seen in 3 runs of about 40, 16,384 faults in one step
# of five and none in the others (why it grew was not found).
SCRIPT = textwrap.dedent(
    """
    import hashlib, json, resource, sys
    import torch
    import torch.nn.functional as F
    from torch import nn
    from vlp.train.loop import TrainConfig, train
    from vlp.train.optim import OptimConfig

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    data = [(torch.randn(512, 256), torch.randn(512, 256)) for _ in range(3)]
    cfg = TrainConfig(out_dir=sys.argv[2], max_steps=3, log_every=1, progress=False, freed_memory=sys.argv[1])
    train(model, lambda m, b: {"loss": F.mse_loss(m(b[0]), b[1])}, data, cfg, OptimConfig(lr=1e-3))
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()

    def step():
        x = torch.ones(16 << 20)
        for _ in range(6):
            x = x * 2 + 1
        return float(x[0])

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    step(); step()
    per_step = []
    for _ in range(7):
        before = faults()
        step()
        per_step.append(faults() - before)
    print(json.dumps({"digest": digest, "faults_per_step": sorted(per_step)[3], "each": per_step}))
    """
)


def _run(choice: str, out: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, choice, out], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(host_memory._glibc() is None, reason="the C library is not glibc: freed_memory does nothing")
def test_kept_memory_is_not_mapped_again_and_changes_no_trained_byte(tmp_path):
    """The loop applies its config's choice: after training with ``keep`` the process allocates its temporaries
    with no page fault in a typical step (the median of seven), with ``release`` the kernel maps them in again at
    every step (64 MiB each: 16,384 faults with 4 KiB pages, still hundreds a step with 2 MiB ones); the trained
    weights are the same bytes."""
    kept, released = _run("keep", str(tmp_path / "keep")), _run("release", str(tmp_path / "release"))
    assert kept["faults_per_step"] <= 16, kept
    assert released["faults_per_step"] >= 128, released
    assert kept["digest"] == released["digest"]


def test_freed_memory_takes_its_two_values_only(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"freed_memory must be one of \['keep', 'release'\], got 'jemalloc'"):
        apply_freed_memory("jemalloc")
    with pytest.raises(ValueError, match=r"TrainConfig\.freed_memory must be one of"):
        TrainConfig(out_dir=str(tmp_path), freed_memory="jemalloc")
    # off glibc nothing is called and "keep" says it did not take effect
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))
    host_memory._glibc.cache_clear()
    try:
        assert apply_freed_memory("keep") is False
        assert apply_freed_memory("release") is False
    finally:
        host_memory._glibc.cache_clear()


def test_the_config_loader_refuses_another_value():
    from vlp.config import load_config

    with pytest.raises(Exception, match="freed_memory"):
        load_config(None, ["pretrain.freed_memory=jemalloc"])
    assert load_config(None, []).pretrain.freed_memory == "keep"
