"""``compile: true`` (issue 27): every transformer block compiled in place with ``torch.compile``.

A stack of two dropout blocks trains through :func:`vlp.train.loop.train` compiled and eagerly: the same dropout
masks and losses to rounding, the same state dict keys, a batch of another size at each epoch's end, and a killed
compiled run that resumes bit-identical to a straight compiled one. Where the tool chain is broken (a C++ compiler
that does not exist) it warns and trains eagerly, bit for bit. The tiny ALPRO retrieval model (real TimeSformer,
text and fusion blocks) trains to the eager losses, and ``evaluate-retrieval`` scores as it does eagerly.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from vlp.data.loader import ResumableSampler, SamplerBatches
from vlp.train.loop import BLOCK_NAME, COMPILE_RECOMPILE_LIMIT, TrainConfig, compile_blocks, train
from vlp.train.optim import OptimConfig

sys.path.insert(0, str(Path(__file__).parent))

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread for the module

OPT = OptimConfig(lr=1e-2, warmup_steps=1)


class DropBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.drop(nn.functional.gelu(self.fc(x)))


class Stack(nn.Module):
    """Embedding -> two :class:`DropBlock` at ``layers.<i>`` -> head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(4, 16)
        self.layers = nn.ModuleList([DropBlock(), DropBlock()])
        self.head = nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def step(model: nn.Module, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    return {"loss": nn.functional.cross_entropy(model(batch["x"]), batch["y"])}


class Killed(RuntimeError):
    pass


def run(out: Path, compile: bool, kill_at: int | None = None) -> tuple[nn.Module, list[float]]:
    """8 updates over 10 items in batches of 3 (each epoch ends with a batch of 1), dropout 0.3 in each block."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 4, generator=g), torch.randint(0, 3, (10,), generator=g)
    sampler = ResumableSampler(10, seed=7, rank=0, world_size=1)
    data = SamplerBatches(sampler, lambda idx: {"x": x[idx], "y": y[idx]}, 3)
    calls = {"n": 0}

    def step_fn(model: nn.Module, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        if calls["n"] == kill_at:
            raise Killed
        calls["n"] += 1
        return step(model, batch)

    cfg = TrainConfig(out_dir=str(out), max_steps=8, log_every=1, ckpt_every=3, seed=3, progress=False, compile=compile)
    model = Stack()
    train(model, step_fn, data, cfg, OPT)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return model, [line["train/loss"] for line in lines if "train/loss" in line]


def test_compiled_blocks_train_as_eager_ones_and_resume_exactly(tmp_path: Path) -> None:
    eager, eager_losses = run(tmp_path / "eager", compile=False)
    compiled, losses = run(tmp_path / "compiled", compile=True)
    assert [n for n, m in compiled.named_modules() if getattr(m, "_compiled_call_impl", None)] == [
        "layers.0",
        "layers.1",
    ]
    assert list(compiled.state_dict()) == list(eager.state_dict())  # no _orig_mod: checkpoints do not change
    # the same dropout masks (other masks would move a loss by far more than rounding)
    assert losses == pytest.approx(eager_losses, rel=1e-5)
    for (name, a), b in zip(eager.state_dict().items(), compiled.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
    with pytest.raises(Killed):
        run(tmp_path / "killed", compile=True, kill_at=5)
    resumed, _ = run(tmp_path / "killed", compile=True)
    for (name, a), b in zip(compiled.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_without_a_working_tool_chain_it_warns_and_trains_eagerly(tmp_path: Path) -> None:
    """A process whose C++ compiler does not exist (``CXX``, no cached kernels): one warning naming why, and the
    eager run's losses and weights, bit for bit."""
    script = f"""
import hashlib, json, sys, warnings
import torch
torch.set_num_threads(1)
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_compile import run
from pathlib import Path
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model, losses = run(Path({str(tmp_path / "broken")!r}), compile=True)
digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in model.state_dict().values())).hexdigest()
compiled = [n for n, m in model.named_modules() if getattr(m, "_compiled_call_impl", None)]
print(json.dumps({{"losses": losses, "sha": digest, "compiled": compiled,
                  "warnings": [str(w.message) for w in caught if "compile" in str(w.message)]}}))
"""
    env = os.environ | {"CXX": "/nonexistent/c++", "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "OMP_NUM_THREADS": "1",
                        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["compiled"] == []
    assert len(got["warnings"]) == 1
    assert re.fullmatch(r"compile requested but torch\.compile does not work here \(InvalidCxxCompiler: No working "
                        r"C\+\+ compiler found in .*/nonexistent/c\+\+.*\); training runs eagerly",
                        got["warnings"][0]), got["warnings"][0]  # fmt: skip
    eager, eager_losses = run(tmp_path / "eager", compile=False)
    assert got["losses"] == eager_losses
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in eager.state_dict().values())).hexdigest()
    assert got["sha"] == digest


def test_a_block_run_in_more_variants_than_torchs_default_limit_stays_compiled() -> None:
    """Grad on / off x train / eval x fp32 / bf16 is 8 variants of one block, torch's default recompile limit; an
    evaluation batch of another size is a ninth. Past the limit Dynamo would run the block eagerly (and log it)."""
    import logging

    from torch._dynamo.utils import counters

    assert COMPILE_RECOMPILE_LIMIT > 9
    torch._dynamo.reset()  # DropBlock.forward's entries from the tests before: each variant must compile here
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("torch._dynamo")
    logger.addHandler(handler)
    graphs = counters["stats"]["unique_graphs"]
    model = Stack()
    try:
        compile_blocks(model)
        for bf16 in (False, True):
            for training in (False, True):
                for grad in (False, True):
                    model.train(training)
                    with torch.set_grad_enabled(grad), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                        model(torch.randn(3, 4))
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            model(torch.randn(5, 4))
    finally:
        logger.removeHandler(handler)
    assert not [m for m in messages if "recompile_limit" in m]
    assert counters["stats"]["unique_graphs"] - graphs >= 9  # each variant compiled, none left to eager


def test_a_model_without_blocks_warns(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match=r"has no transformer block to compile; training runs eagerly"):
        assert compile_blocks(nn.Sequential(nn.Linear(2, 2))) == 0
    assert BLOCK_NAME.search("dual.video.blocks.11") and BLOCK_NAME.search("clip.text_model.encoder.layers.0")
    assert not BLOCK_NAME.search("dual.video.blocks") and not BLOCK_NAME.search("fusion.layers.0.attn")


@pytest.mark.slow
def test_the_tiny_alpro_model_compiles_and_trains_to_the_eager_losses(tmp_path: Path) -> None:
    """The real blocks (TimeSformer, text, fusion): three updates compiled give the eager losses (to 1e-5) and
    weights (to 1e-3 after Adam's three updates at lr 1e-3)."""
    from test_family_contract import BATCH, CAPTIONS, batch_of, build, step_context
    from vlp.models import family
    from vlp.models.tokenizer import train_wordpiece

    tok = train_wordpiece(CAPTIONS * 4, vocab_size=60)
    fam = family.get("alpro")

    def fit(out: str, compile: bool) -> tuple[dict[str, Any], list[float]]:
        _, model = build("alpro", "retrieval", tok)
        ctx = step_context(tok, "alpro", "retrieval")
        sampler = ResumableSampler(len(CAPTIONS), seed=7, rank=0, world_size=1)
        data = SamplerBatches(sampler, lambda idx: batch_of(tok, list(idx), seed=idx.epoch + 3), BATCH)
        cfg = TrainConfig(out_dir=str(tmp_path / out), max_steps=3, log_every=1, seed=5, progress=False,
                          compile=compile)  # fmt: skip
        train(model, lambda m, b: fam.train_step(m, b, ctx), data, cfg, OptimConfig(lr=1e-3))
        lines = [json.loads(line) for line in (tmp_path / out / "metrics.jsonl").read_text().splitlines()]
        return model.state_dict(), [line["train/loss"] for line in lines if "train/loss" in line]

    eager, eager_losses = fit("eager", False)
    compiled, losses = fit("compiled", True)
    assert len(losses) == 3 and losses == pytest.approx(eager_losses, rel=1e-5)
    assert list(compiled) == list(eager)
    far = [k for k in eager if not torch.allclose(eager[k].float(), compiled[k].float(), rtol=1e-3, atol=1e-3)]
    assert far == []

    # evaluation: the encoders and the fused pass of evaluate-retrieval, compiled (no-grad graphs) and eager
    from vlp.inference import encode_texts, pair_scorer

    _, model = build("alpro", "retrieval", tok)
    model.eval()
    clips = batch_of(tok, range(4)).video

    def scores() -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            videos = fam.encode_video(model, clips)
        texts = encode_texts(fam, model, tok, CAPTIONS[:3], 12, 4)
        sim = fam.similarity(model, texts, videos)
        return sim, pair_scorer(fam, model, texts, videos)(torch.tensor([0, 1, 2]), torch.tensor([3, 0, 1]))

    want = scores()
    assert compile_blocks(model, "evaluation") == 6
    got = scores()
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
