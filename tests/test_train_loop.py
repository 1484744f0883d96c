"""Training machinery: AdamW groups and schedule, clipping, accumulation, checkpoints, exact resume."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import random
import re
import socket
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from vlp import distributed, storage
from vlp.data.loader import ResumableSampler, SamplerBatches
from vlp.train.checkpoint import (
    MODEL_FILE,
    OPTIM_FILE,
    STATE_FILE,
    CheckpointError,
    capture_rng_state,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from vlp.train.loop import TrainConfig, train
from vlp.train.optim import (
    OptimConfig,
    build_optimizer,
    build_scheduler,
    clip_gradients,
    linear_warmup_decay,
    split_decay_params,
)

# --------------------------------------------------------------------------- fixtures


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread for the module


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.special = nn.Parameter(torch.randn(3, 3))
        self.other = nn.Parameter(torch.randn(3, 3))

    def no_weight_decay(self) -> set[str]:
        return {"special"}


class ZooModel(nn.Module):
    """One parameter of every kind the decay split distinguishes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.pos_embed = nn.Parameter(torch.randn(1, 4, 3))
        self.proj = nn.Linear(3, 3)
        self.norm = nn.LayerNorm(3)
        self.log_temp = nn.Parameter(torch.tensor(0.5))
        self.block = Block()
        self.frozen = nn.Linear(3, 3)
        self.frozen.requires_grad_(False)


class TinyMLP(nn.Module):
    """Linear -> LayerNorm -> GELU -> Dropout -> Linear, plus a tied output head and a buffer."""

    def __init__(self, dropout: float = 0.3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(4, 16)
        self.norm = nn.LayerNorm(16)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3, bias=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: Tensor) -> Tensor:  # (B, 4) -> (B, 3)
        self.calls += 1
        h = self.drop(torch.nn.functional.gelu(self.norm(self.fc1(x))))  # (B, 16)
        return self.head(torch.tanh(self.fc2(h)))


def make_data(n: int = 10, seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)


def make_loader(x: Tensor, y: Tensor, batch_size: int, seed: int = 7, shuffle: bool = True) -> SamplerBatches:
    sampler = ResumableSampler(len(x), seed=seed, shuffle=shuffle, rank=0, world_size=1)
    return SamplerBatches(sampler, lambda idx: {"x": x[idx], "y": y[idx]}, batch_size, drop_last=True)


def ce_step(model: nn.Module, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    logits = model(batch["x"])  # (B, 3)
    loss = nn.functional.cross_entropy(logits, batch["y"])
    return {"loss": loss, "loss_ce": loss.detach(), "temp": torch.tensor(0.07)}


class ListLogger:
    def __init__(self) -> None:
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.params: list[dict[str, Any]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.metrics.append((step, dict(metrics)))

    def log_params(self, params: dict[str, Any]) -> None:
        self.params.append(params)


def cfg_for(out_dir: Path | str, **kw: Any) -> TrainConfig:
    base = dict(out_dir=str(out_dir), max_steps=8, grad_accum=2, log_every=1, ckpt_every=3, keep_last=2, seed=3)
    return TrainConfig(**(base | kw | {"progress": False}))


OPT = OptimConfig(lr=1e-2, weight_decay=0.1, warmup_steps=2, grad_clip=1.0)

# --------------------------------------------------------------------------- schedule


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        ("one_based", [0.5, 1.0, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8, 0.0]),
        ("zero_based", [0.0, 0.5, 1.0, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8]),
    ],
)
def test_lr_schedule_hand_values(index: str, expected: list[float]) -> None:
    # T = 10 updates, W = int(0.2 * 10) = 2; f(s) = s / 2 for s < 2 else (10 - s) / 8
    opt = torch.optim.AdamW([nn.Parameter(torch.zeros(2))], lr=2.0)
    sched = build_scheduler(opt, OptimConfig(lr=2.0, warmup_ratio=0.2, schedule_index=index), total_steps=10)
    used = []
    for _ in range(10):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert used == pytest.approx([2.0 * e for e in expected])


def test_warmup_length_truncates_like_the_alpro_code_and_is_validated() -> None:
    assert linear_warmup_decay(1, int(0.05 * 30), 30) == pytest.approx(1.0)  # W = int(1.5) = 1
    assert linear_warmup_decay(0, 0, 4) == 1.0 and linear_warmup_decay(4, 0, 4) == 0.0
    opt = torch.optim.AdamW([nn.Parameter(torch.zeros(1))])
    with pytest.raises(ValueError, match="longer than the run"):
        build_scheduler(opt, OptimConfig(warmup_steps=11), total_steps=10)
    with pytest.raises(ValueError, match="betas"):
        OptimConfig(betas=(0.9, 1.0))


def test_albefs_schedule_warms_up_from_a_floor_and_decays_along_a_cosine() -> None:
    """lr 1e-4: warm-up from 1e-5 over 4 updates, cosine down to 1e-5 at update 12 (one-based, as the loop)."""
    opt = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=1e-4)
    cfg = OptimConfig(lr=1e-4, warmup_steps=4, schedule="cosine", min_lr_ratio=0.1, warmup_start_ratio=0.1)
    sched = build_scheduler(opt, cfg, total_steps=12)
    used = []
    for _ in range(12):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    warm = [1e-4 * (0.1 + 0.9 * s / 4) for s in (1, 2, 3)]
    cosine = [1e-5 + 9e-5 * 0.5 * (1 + math.cos(math.pi * (s - 4) / 8)) for s in range(4, 13)]
    assert used == pytest.approx(warm + cosine)
    assert used[3] == pytest.approx(1e-4) and used[-1] == pytest.approx(1e-5)
    with pytest.raises(ValueError, match="cosine"):
        OptimConfig(schedule="step")


# --------------------------------------------------------------------------- weight decay


def test_decay_split_by_kind() -> None:
    decay, no_decay = split_decay_params(ZooModel(), OptimConfig().no_decay_keywords)
    assert decay == ["embed.weight", "proj.weight", "block.other"]
    assert set(no_decay) == {"pos_embed", "proj.bias", "norm.weight", "norm.bias", "log_temp", "block.special"}


def _zero_grad_step(model: nn.Module, cfg: OptimConfig) -> dict[str, Tensor]:
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, cfg)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # Adam part of the update is exactly 0: only decay moves weights
    opt.step()
    return before


def test_weight_decay_applied_only_to_decay_params() -> None:
    model = ZooModel()
    before = _zero_grad_step(model, OptimConfig(lr=0.1, weight_decay=0.5))
    decay, _ = split_decay_params(model, OptimConfig().no_decay_keywords)
    for name, p in model.named_parameters():
        factor = 1 - 0.1 * 0.5 if name in decay else 1.0  # decoupled decay: p <- p (1 - lr wd)
        torch.testing.assert_close(p.detach(), before[name] * factor, rtol=0, atol=1e-7, msg=name)


def test_zero_weight_decay_is_one_group_without_decay_as_the_released_alpro_code() -> None:
    model = ZooModel()
    cfg = OptimConfig(lr=0.1, weight_decay=0.0)  # the released ALPRO code: no decay, one group
    opt = build_optimizer(model, cfg)
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["weight_decay"] == 0.0
    assert opt.param_groups[0]["betas"] == (0.9, 0.98)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for p in opt.param_groups[0]["params"]} == trainable  # frozen ones left out, all others in
    before = _zero_grad_step(model, cfg)
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name


@pytest.mark.parametrize(("adamw", "kernels"), [("foreach", (True, None)), ("fused", (None, True)),
                                                 ("loop", (False, None))])  # fmt: skip
def test_adamw_runs_the_configured_kernels_also_after_a_resume(tmp_path: Path, adamw: str, kernels: tuple) -> None:
    """``adamw`` picks AdamW's kernels; resuming from a checkpoint another kernel wrote keeps this run's choice
    (a checkpoint's param groups carry ``foreach`` / ``fused``, which ``load_state_dict`` would bring back) and its
    moments. A bad name is a clear error."""
    x, y = make_data(8)
    other = "loop" if adamw != "loop" else "fused"
    train(TinyMLP(dropout=0.0), ce_step, make_loader(x, y, 4), cfg_for(tmp_path, max_steps=1), OptimConfig(adamw=other))
    fresh = TinyMLP(dropout=0.0, seed=1)
    opt = build_optimizer(fresh, OptimConfig(adamw=adamw))
    assert [(g["foreach"], g["fused"]) for g in opt.param_groups] == [kernels] * len(opt.param_groups)
    load_checkpoint(latest_checkpoint(str(tmp_path / "checkpoints")), fresh, opt, restore_rng=False)
    assert [(g["foreach"], g["fused"]) for g in opt.param_groups] == [kernels] * len(opt.param_groups)
    assert opt.state and all(float(s["step"]) == 1.0 for s in opt.state.values())  # the moments were restored
    with pytest.raises(ValueError, match=r"adamw must be one of \['foreach', 'fused', 'loop'\], got 'apex'"):
        OptimConfig(adamw="apex")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- clipping and accumulation


def test_clip_gradients_caps_the_global_norm() -> None:
    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(1))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])  # global norm 5
    assert clip_gradients([a, b], None).item() == pytest.approx(5.0)
    assert torch.equal(a.grad, torch.tensor([3.0, 0.0]))
    assert clip_gradients([a, b], 1.0).item() == pytest.approx(5.0)
    assert torch.cat([a.grad, b.grad]).norm().item() == pytest.approx(1.0, rel=1e-5)
    torch.testing.assert_close(a.grad, torch.tensor([0.6, 0.0]), rtol=1e-5, atol=0)


def test_loop_clips_before_the_optimizer_sees_the_gradient(tmp_path: Path) -> None:
    x, y = make_data(8)
    model, logger = TinyMLP(dropout=0.0), ListLogger()
    cfg = cfg_for(tmp_path, max_steps=1, grad_accum=1)
    train(model, ce_step, make_loader(x, y, 4), cfg, OptimConfig(grad_clip=1e-3), metrics_logger=logger)
    assert logger.metrics[0][1]["train/grad_norm"] > 1e-2  # pre-clip norm is logged
    fresh = TinyMLP(dropout=0.0, seed=1)
    opt = build_optimizer(fresh, OptimConfig())
    load_checkpoint(latest_checkpoint(str(tmp_path / "checkpoints")), fresh, opt, restore_rng=False)
    # after one update exp_avg = (1 - beta1) * clipped grad, so its global norm is (1 - 0.9) * 1e-3
    norm = torch.stack([s["exp_avg"].norm() for s in opt.state.values()]).norm()
    assert norm.item() == pytest.approx(0.1 * 1e-3, rel=1e-4)


def test_grad_accumulation_equals_one_big_batch(tmp_path: Path) -> None:
    x, y = make_data(12, dtype=torch.float64)
    results = {}
    for accum, batch in [(1, 6), (3, 2)]:
        model, logger = TinyMLP(dropout=0.0).double(), ListLogger()
        cfg = cfg_for(tmp_path / f"a{accum}", max_steps=3, grad_accum=accum, ckpt_every=0)
        train(model, ce_step, make_loader(x, y, batch), cfg, OPT, metrics_logger=logger)
        results[accum] = (model, logger.metrics)
    (big, big_log), (small, small_log) = results[1], results[3]
    for (name, p), q in zip(big.named_parameters(), small.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12, msg=name)
    for (_, m_big), (_, m_small) in zip(big_log, small_log, strict=True):
        assert m_small["train/grad_norm"] == pytest.approx(m_big["train/grad_norm"], rel=1e-12)
        assert m_small["train/loss"] == pytest.approx(m_big["train/loss"], rel=1e-12)
    assert big_log[0][1]["train/grad_norm"] != pytest.approx(big_log[1][1]["train/grad_norm"])  # not trivial


def test_loop_logs_scheduled_lr_and_every_named_value(tmp_path: Path) -> None:
    x, y = make_data(10)
    logger = ListLogger()
    cfg = cfg_for(tmp_path, max_steps=4, grad_accum=1, log_every=2)
    train(TinyMLP(), ce_step, make_loader(x, y, 3), cfg, OptimConfig(lr=1.0, warmup_steps=2), metrics_logger=logger)
    assert [s for s, _ in logger.metrics] == [2, 4]
    # one_based: update u uses f(u): u=2 -> (4-2)/2 = 1.0, u=4 -> 0.0
    assert [m["train/lr"] for _, m in logger.metrics] == pytest.approx([1.0, 0.0])
    m = logger.metrics[0][1]
    assert m["train/temp"] == pytest.approx(0.07) and m["train/loss"] == pytest.approx(m["train/loss_ce"])
    assert m["train/clips_per_s"] > 0 and m["train/peak_rss_mb"] > 0
    assert logger.params and logger.params[0]["optim"]["lr"] == 1.0


def test_step_fn_without_loss_and_bad_config_fail_clearly(tmp_path: Path) -> None:
    x, y = make_data(6)
    with pytest.raises(KeyError, match="'loss' entry"):
        train(TinyMLP(), lambda m, b: {"ce": m(b["x"]).sum()}, make_loader(x, y, 2), cfg_for(tmp_path))
    with pytest.raises(TypeError, match="'loss' must be a tensor"):
        train(TinyMLP(), lambda m, b: {"loss": 1.0}, make_loader(x, y, 2), cfg_for(tmp_path / "float"))
    with pytest.raises(ValueError, match="out_dir is required"):
        TrainConfig()
    with pytest.raises(ValueError, match="grad_accum must be >= 1"):
        TrainConfig(out_dir="x", grad_accum=0)


# --------------------------------------------------------------------------- sampler


def test_sampler_epochs_shards_and_resume() -> None:
    s = ResumableSampler(10, seed=5, rank=0, world_size=1)
    e0, e1 = list(s), list(s)
    assert sorted(e0) == list(range(10)) and sorted(e1) == list(range(10)) and e0 != e1
    assert e0 == list(ResumableSampler(10, seed=5, rank=0, world_size=1))  # seeded, not global-RNG driven
    shards = [list(ResumableSampler(10, seed=5, rank=r, world_size=3)) for r in range(3)]
    assert all(len(sh) == 4 for sh in shards)
    padded = [*s.epoch_indices(0), *s.epoch_indices(0)[:2]]  # 10 -> 12 by wrapping around, DistributedSampler-style
    assert shards == [[int(i) for i in padded[r::3]] for r in range(3)]
    it = iter(s)  # epoch 2
    head = [next(it) for _ in range(4)]
    state = json.loads(json.dumps(s.state_dict()))
    rest = list(it) + list(s)
    t = ResumableSampler(10, seed=5, rank=0, world_size=1)
    t.load_state_dict(state)
    assert state["epoch"] == 2 and state["position"] == 4 and len(head) == 4
    assert list(t) + list(t) == rest
    with pytest.raises(ValueError, match="same data and seed"):
        ResumableSampler(11, seed=5, rank=0, world_size=1).load_state_dict(state)


@pytest.mark.parametrize("world_size", [1, 2])
def test_grouped_sampler_batches_share_a_group_and_cover_the_epoch(world_size: int) -> None:
    groups = np.array([i % 3 for i in range(40)] + [-1] * 5)  # groups of 14, 13, 13 items and 5 ungrouped
    batch = 4
    samplers = [
        ResumableSampler(45, seed=3, rank=r, world_size=world_size, groups=groups, group_batch=batch)
        for r in range(world_size)
    ]
    for epoch in range(2):
        streams = [[int(i) for i in s.epoch_indices(epoch)] for s in samplers]
        everything = [i for stream in streams for i in stream]
        assert set(everything) == set(range(45)), "every item once per epoch, grouped or not"
        assert len(everything) - len(set(everything)) < world_size  # only DistributedSampler-style padding
        run = batch * world_size  # the k-th micro-batch of every rank together: one run
        runs = [[i for st in streams for i in st[k * batch : (k + 1) * batch]] for k in range(len(streams[0]) // batch)]
        assert all(len(r) == run for r in runs)
        pure = [r for r in runs if len({groups[i] for i in r}) == 1 and groups[r[0]] >= 0]
        for g, n in zip(range(3), (14, 13, 13), strict=True):  # each group fills n // run pure runs at least
            assert sum(len(r) for r in pure if groups[r[0]] == g) >= n // run * run, (g, runs)
    plain = [int(i) for i in ResumableSampler(45, seed=3, rank=0, world_size=1).epoch_indices(0)]
    assert [int(i) for i in samplers[0].epoch_indices(0)] != plain


def test_group_fraction_and_group_epochs_blend_grouped_and_random_batches() -> None:
    groups = np.arange(400) % 4  # 4 groups of 100: 20 runs of 5 each when every run is grouped

    def pure_runs(fraction: float) -> int:
        s = ResumableSampler(400, seed=2, rank=0, world_size=1, groups=groups, group_batch=5, group_fraction=fraction)
        order = s.epoch_indices(0)
        assert sorted(order.tolist()) == list(range(400))
        return sum(len(set(groups[order[b : b + 5]].tolist())) == 1 for b in range(0, 400, 5))

    assert pure_runs(1.0) == 80
    assert 24 <= pure_runs(0.5) <= 56  # binomial(80, 0.5) runs stay grouped, plus rare chance ones
    assert pure_runs(0.0) <= 5  # random batches: 4 ** -4 of the runs are pure by chance
    curriculum = ResumableSampler(400, seed=2, rank=0, world_size=1, groups=groups, group_batch=5, group_epochs=1)
    first, second = curriculum.epoch_indices(0), curriculum.epoch_indices(1)
    assert sum(len(set(groups[first[b : b + 5]].tolist())) == 1 for b in range(0, 400, 5)) == 80
    assert second.tolist() == ResumableSampler(400, seed=2, rank=0, world_size=1).epoch_indices(1).tolist()
    with pytest.raises(ValueError, match="group_fraction"):
        ResumableSampler(400, seed=2, groups=groups, group_batch=5, group_fraction=1.5, rank=0, world_size=1)
    with pytest.raises(ValueError, match="group_epochs"):
        ResumableSampler(400, seed=2, groups=groups, group_batch=5, group_epochs=-1, rank=0, world_size=1)


def test_grouped_sampler_resumes_exactly_and_refuses_another_grouping() -> None:
    groups = np.arange(30) % 2
    s = ResumableSampler(30, seed=1, rank=0, world_size=1, groups=groups, group_batch=5)
    it = iter(s)
    head = [next(it) for _ in range(7)]
    state = json.loads(json.dumps(s.state_dict()))
    rest = list(it) + list(s)
    t = ResumableSampler(30, seed=1, rank=0, world_size=1, groups=groups, group_batch=5)
    t.load_state_dict(state)
    assert len(head) == 7 and list(t) + list(t) == rest
    with pytest.raises(ValueError, match="another batch grouping"):
        ResumableSampler(30, seed=1, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(ValueError, match="another batch grouping"):
        ResumableSampler(30, seed=1, rank=0, world_size=1, groups=groups, group_batch=6).load_state_dict(state)
    with pytest.raises(ValueError, match="another batch grouping"):
        ResumableSampler(
            30, seed=1, rank=0, world_size=1, groups=groups, group_batch=5, group_fraction=0.5
        ).load_state_dict(state)
    with pytest.raises(ValueError, match="one group per item"):
        ResumableSampler(30, seed=1, groups=groups[:-1], group_batch=5, rank=0, world_size=1)
    with pytest.raises(ValueError, match="group_batch >= 1 and shuffle"):
        ResumableSampler(30, seed=1, groups=groups, group_batch=5, shuffle=False, rank=0, world_size=1)


# --------------------------------------------------------------------------- checkpoints


def _trained(tmp_path: Path, steps: int = 2) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    model = TinyMLP()
    opt = build_optimizer(model, OPT)
    sched = build_scheduler(opt, OPT, total_steps=10)
    x, y = make_data(6)
    for _ in range(steps):
        ce_step(model, {"x": x, "y": y})["loss"].backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return model, opt, sched


def _assert_state_equal(a: Any, b: Any) -> None:
    if isinstance(a, Tensor):
        assert isinstance(b, Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _assert_state_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for u, v in zip(a, b, strict=True):
            _assert_state_equal(u, v)
    else:
        assert a == b


def test_checkpoint_round_trip_is_bit_identical(tmp_path: Path) -> None:
    model, opt, sched = _trained(tmp_path)
    root = str(tmp_path / "ckpt")
    rng = capture_rng_state()
    uri = save_checkpoint(root, 2, model, opt, sched, rng, {"epoch": 1, "pos": (3, 4)}, {"note": "x"})
    after_save = (torch.rand(3), np.random.rand(3), random.random())
    fresh = TinyMLP(seed=9)
    opt2 = build_optimizer(fresh, OPT)
    sched2 = build_scheduler(opt2, OPT, total_steps=10)
    torch.manual_seed(1234)
    loaded = load_checkpoint(uri, fresh, opt2, sched2)
    after_load = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(after_save[0], after_load[0]) and np.array_equal(after_save[1], after_load[1])
    assert after_save[2] == after_load[2]
    _assert_state_equal(model.state_dict(), fresh.state_dict())
    _assert_state_equal(opt.state_dict(), opt2.state_dict())
    _assert_state_equal(sched.state_dict(), sched2.state_dict())
    assert loaded.step == 2 and loaded.data_state == {"epoch": 1, "pos": (3, 4)} and loaded.extra == {"note": "x"}


def test_tied_weights_are_saved(tmp_path: Path) -> None:
    model = TinyMLP()
    model.head.weight = model.fc2.weight  # (16, 16) tied; head now maps 16 -> 16
    uri = save_checkpoint(str(tmp_path), 1, model, None, None)
    fresh = TinyMLP(seed=4)
    fresh.head.weight = fresh.fc2.weight
    load_checkpoint(uri, fresh, restore_rng=False)
    assert torch.equal(fresh.fc2.weight, model.fc2.weight) and fresh.head.weight is fresh.fc2.weight


def test_partial_checkpoints_are_ignored_and_old_ones_pruned(tmp_path: Path) -> None:
    model = TinyMLP()
    root = str(tmp_path)
    for step in (1, 2, 3):
        save_checkpoint(root, step, model, None, None, keep_last=2)
    assert [s for s, _ in list_checkpoints(root)] == [2, 3]
    assert not (tmp_path / "step-000001").exists()
    save_checkpoint(root, 4, model, None, None)
    (tmp_path / "step-000004" / STATE_FILE).unlink()  # killed before state.json was written
    (tmp_path / "step-000005").mkdir()
    (tmp_path / "step-000005" / MODEL_FILE).write_bytes(b"half")
    assert latest_checkpoint(root) == str(tmp_path / "step-000003")
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(str(tmp_path / "step-000004"), model)
    assert latest_checkpoint(str(tmp_path / "nothing-here")) is None


def test_checkpoints_hold_no_pickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt, sched = _trained(tmp_path)
    uri = save_checkpoint(str(tmp_path / "c"), 2, model, opt, sched)
    files = sorted(Path(uri).iterdir())
    assert {f.name for f in files} == {MODEL_FILE, OPTIM_FILE, STATE_FILE, "rng-rank00000.safetensors"}
    for f in files:
        data = f.read_bytes()
        assert not data.startswith((b"\x80", b"PK")), f"{f.name} looks like a pickle / torch zip"
        if f.suffix == ".safetensors":
            (n,) = struct.unpack("<Q", data[:8])
            assert isinstance(json.loads(data[8 : 8 + n]), dict)
        else:
            json.loads(data)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("checkpoint loading must not unpickle")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    fresh = TinyMLP(seed=2)
    opt2 = build_optimizer(fresh, OPT)
    load_checkpoint(uri, fresh, opt2, build_scheduler(opt2, OPT, 10))
    assert torch.equal(fresh.fc1.weight, model.fc1.weight)


# --------------------------------------------------------------------------- kill and resume


class Killed(RuntimeError):
    pass


def killing(step_fn: Any, at_call: int) -> Any:
    calls = {"n": 0}

    def wrapped(model: nn.Module, batch: Any) -> Any:
        if calls["n"] == at_call:
            raise Killed(f"killed at micro-step {at_call}")
        calls["n"] += 1
        return step_fn(model, batch)

    return wrapped


def run_straight(out_dir: str | Path, seed: int = 3) -> nn.Module:
    x, y = make_data(10)
    model = TinyMLP()
    train(model, ce_step, make_loader(x, y, 3), cfg_for(out_dir, seed=seed), OPT, metrics_logger=ListLogger())
    return model


def run_killed_then_resumed(out_dir: str, kill_at: int) -> tuple[nn.Module, Any]:
    x, y = make_data(10)
    with pytest.raises(Killed):
        train(TinyMLP(), killing(ce_step, kill_at), make_loader(x, y, 3), cfg_for(out_dir), OPT)
    torch.manual_seed(999)  # a "new process": different global RNG, fresh model, sampler and optimiser
    model = TinyMLP(seed=5)
    result = train(model, ce_step, make_loader(x, y, 3), cfg_for(out_dir), OPT)
    return model, result


@pytest.fixture(scope="module")
def straight_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, nn.Module]:
    """8 uninterrupted updates, for seed 3 (the reference) and seed 4 (to show dropout RNG matters)."""
    return {seed: run_straight(tmp_path_factory.mktemp(f"straight{seed}"), seed=seed) for seed in (3, 4)}


@pytest.mark.parametrize(("kill_at", "resumed_step"), [(7, 3), (12, 6)])
def test_kill_and_resume_matches_straight_run(
    tmp_path: Path, straight_runs: dict[int, nn.Module], kill_at: int, resumed_step: int
) -> None:
    # 8 updates x 2 micro-batches of 3 over 10 items (3 batches/epoch): 5+ shuffled epochs, dropout 0.3
    straight = straight_runs[3]
    resumed, result = run_killed_then_resumed(str(tmp_path / "killed"), kill_at)
    assert result.start_step == resumed_step and result.resumed_from.endswith(f"step-{resumed_step:06d}")
    assert result.step == 8
    for (name, p), q in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert not torch.equal(straight.fc1.weight, straight_runs[4].fc1.weight)  # the dropout RNG matters
    assert [s for s, _ in list_checkpoints(str(tmp_path / "killed" / "checkpoints"))] == [6, 8]


def test_kill_and_resume_on_s3(s3_bucket: str, straight_runs: dict[int, nn.Module]) -> None:
    out = f"{s3_bucket}/runs/r1"
    resumed, result = run_killed_then_resumed(out, kill_at=12)
    assert result.resumed_from == f"{out}/checkpoints/step-000006"
    for p, q in zip(straight_runs[3].parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p, q)
    assert [s for s, _ in list_checkpoints(f"{out}/checkpoints")] == [6, 8]
    storage.delete(f"{out}/checkpoints/step-000008/{STATE_FILE}")
    assert latest_checkpoint(f"{out}/checkpoints") == f"{out}/checkpoints/step-000006"
    lines = [json.loads(s) for s in storage.read_text(f"{out}/metrics.jsonl").splitlines()]
    assert lines[0]["params"]["train"]["max_steps"] == 8 and lines[-1]["step"] == 8


TIMING = ("train/clips_per_s", "train/peak_rss_mb")


def _metric_lines(out: str) -> tuple[list[dict], list[dict]]:
    """``(params lines, step lines)`` of ``<out>/metrics.jsonl`` as written, timing figures dropped."""
    lines = [json.loads(s) for s in storage.read_text(f"{out}/metrics.jsonl").splitlines()]
    steps = [{k: v for k, v in line.items() if k not in TIMING} for line in lines if "step" in line]
    return [line for line in lines if "params" in line], steps


@pytest.mark.parametrize("where", ["local", "s3"])
def test_metrics_jsonl_holds_each_step_once_after_kill_and_resume(tmp_path: Path, request, where: str) -> None:
    root = request.getfixturevalue("s3_bucket") + "/jsonl" if where == "s3" else str(tmp_path)
    x, y = make_data(10)
    train(TinyMLP(), ce_step, make_loader(x, y, 3), cfg_for(f"{root}/straight"), OPT)
    out = f"{root}/killed"
    with pytest.raises(Killed):  # updates 1..5 logged, checkpoint at 3: a resume runs 4 and 5 again
        train(TinyMLP(), killing(ce_step, 10), make_loader(x, y, 3), cfg_for(out), OPT)
    assert [line["step"] for line in _metric_lines(out)[1]] == [1, 2, 3, 4, 5]
    if where == "local":  # and the kill cut a line short
        with open(f"{out}/metrics.jsonl", "a", encoding="utf-8") as fh:
            fh.write('{"step": 6, "train/lo')
    result = train(TinyMLP(seed=5), ce_step, make_loader(x, y, 3), cfg_for(out), OPT)
    assert result.start_step == 3
    params, steps = _metric_lines(out)
    assert [line["step"] for line in steps] == list(range(1, 9)), "each step once, in order"
    assert len(params) == 1 and params[0]["params"]["train"]["out_dir"] == out
    assert steps == _metric_lines(f"{root}/straight")[1], "the same curves as an uninterrupted run's"


def test_training_from_the_start_empties_a_stale_metrics_file(tmp_path: Path) -> None:
    x, y = make_data(10)
    with pytest.raises(Killed):  # killed before its first checkpoint: a rerun starts over
        train(TinyMLP(), killing(ce_step, 4), make_loader(x, y, 3), cfg_for(tmp_path), OPT)
    train(TinyMLP(), ce_step, make_loader(x, y, 3), cfg_for(tmp_path), OPT)
    params, steps = _metric_lines(str(tmp_path))
    assert len(params) == 1 and [line["step"] for line in steps] == list(range(1, 9))


@pytest.mark.parametrize("damaged", [MODEL_FILE, OPTIM_FILE, "rng-rank00000.safetensors", STATE_FILE])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(
    tmp_path: Path, straight_runs: dict[int, nn.Module], damaged: str
) -> None:
    out = tmp_path / "killed"
    x, y = make_data(10)
    with pytest.raises(Killed):  # checkpoints at 3 and 6, killed during update 7
        train(TinyMLP(), killing(ce_step, 12), make_loader(x, y, 3), cfg_for(out), OPT)
    bad = out / "checkpoints" / "step-000006" / damaged
    bad.write_bytes(bad.read_bytes()[: len(bad.read_bytes()) // 2])  # truncated, as by a full disk or a copy
    model = TinyMLP(seed=5)
    with pytest.warns(UserWarning, match=rf"damaged checkpoint: {re.escape(str(bad))}.*; resumed from .*step-000003$"):
        result = train(model, ce_step, make_loader(x, y, 3), cfg_for(out), OPT)
    assert result.start_step == 3 and result.step == 8
    for (name, p), q in zip(straight_runs[3].state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_every_checkpoint_damaged_is_an_error_naming_the_files(tmp_path: Path) -> None:
    from vlp.weights import DamagedCheckpointError, load_model_weights

    model, optimizer, scheduler = _trained(tmp_path, steps=2)
    root = str(tmp_path / "checkpoints")  # where train(out_dir=tmp_path) looks
    for step in (1, 2):
        save_checkpoint(root, step, model, optimizer, scheduler)
        (Path(root) / f"step-{step:06d}" / MODEL_FILE).write_bytes(b"\x00" * 4)
    every = r"step-000002/model.safetensors: too short .*step-000001"
    with pytest.raises(DamagedCheckpointError, match=every):
        train(TinyMLP(), ce_step, make_loader(*make_data(10), 3), TrainConfig(out_dir=str(tmp_path)), OPT)
    with pytest.raises(DamagedCheckpointError, match=r"step-000001/model.safetensors: too short"):
        load_model_weights(f"{root}/step-000001", model)
    (Path(root) / "step-000001" / MODEL_FILE).unlink()
    with pytest.raises(DamagedCheckpointError, match=r"step-000001/model.safetensors is missing"):
        load_checkpoint(f"{root}/step-000001", model)


# --------------------------------------------------------------------------- two ranks (gloo)


def _ddp_worker(rank: int, port: int, root: str, kill: bool) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(1)
    distributed.init_from_env("gloo")
    try:
        x, y = make_data(10)

        def loader() -> SamplerBatches:  # each rank reads its half of every epoch
            return SamplerBatches(ResumableSampler(10, seed=7), lambda idx: {"x": x[idx], "y": y[idx]}, 2)

        if kill:
            with contextlib.suppress(Killed):
                train(TinyMLP(), killing(ce_step, 12), loader(), cfg_for(root), OPT, metrics_logger=ListLogger())
            torch.manual_seed(99)
        model = TinyMLP(seed=5 if kill else 0)
        result = train(model, ce_step, loader(), cfg_for(root), OPT, metrics_logger=ListLogger())
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, os.path.join(root, f"final-{rank}-start{result.start_step}.safetensors"))
    finally:
        distributed.cleanup()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_rank_gloo_kill_and_resume(tmp_path: Path) -> None:
    import torch._dynamo  # DDP imports it lazily (~7 s): once here, not in every forked child

    # fork is fast, but once autograd has run where CUDA is available it refuses to fork: spawn there
    method = "spawn" if torch.cuda.is_available() else "fork"
    for name, kill in (("straight", False), ("killed", True)):
        root = str(tmp_path / name)
        mp.start_processes(_ddp_worker, args=(_free_port(), root, kill), nprocs=2, join=True, start_method=method)
    files = {f.name for f in (tmp_path / "killed" / "checkpoints" / "step-000008").iterdir()}
    assert {"rng-rank00000.safetensors", "rng-rank00001.safetensors", STATE_FILE} <= files
    for rank in range(2):
        straight = load_file(str(tmp_path / "straight" / f"final-{rank}-start0.safetensors"))
        resumed = load_file(str(tmp_path / "killed" / f"final-{rank}-start6.safetensors"))
        assert all(torch.equal(straight[k], resumed[k]) for k in straight), f"rank {rank} diverged after resume"
    rank0, rank1 = (load_file(str(tmp_path / "straight" / f"final-{r}-start0.safetensors")) for r in range(2))
    assert rank0.keys() == rank1.keys() and all(torch.equal(rank0[k], rank1[k]) for k in rank0), "DDP kept step"


def test_fusion_lr_mult_scales_the_fusion_and_heads_through_the_schedule() -> None:
    from vlp.train.optim import build_scheduler

    model = nn.ModuleDict({"dual": nn.Linear(4, 4), "fusion": nn.Linear(4, 4), "vtm_head": nn.Linear(4, 2)})
    cfg = OptimConfig(lr=1e-4, fusion_lr_mult=10.0, warmup_ratio=0.5, fusion_prefixes=("fusion.", "vtm_head."))
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg, total_steps=10)
    names = {id(p): n for n, p in model.named_parameters()}
    for _ in range(3):
        opt.step()
        sched.step()
        lrs = {names[id(p)]: g["lr"] for g in opt.param_groups for p in g["params"]}
        assert lrs["fusion.weight"] == pytest.approx(10 * lrs["dual.weight"]) and lrs["dual.weight"] > 0
        assert lrs["vtm_head.bias"] == pytest.approx(lrs["fusion.weight"])
    assert len(build_optimizer(model, OptimConfig(lr=1e-4)).param_groups) == 2  # factor 1: groups as before
    with pytest.raises(ValueError, match="fusion_lr_mult"):
        OptimConfig(fusion_lr_mult=0.0)


def test_backbone_lr_mult_slows_the_backbone_beside_new_modules_and_composes_with_decay_groups() -> None:
    from vlp.train.optim import build_scheduler

    model = nn.ModuleDict({"clip": nn.Linear(4, 4), "selector": nn.Linear(4, 4)})
    cfg = OptimConfig(lr=1e-4, backbone_lr_mult=1e-3, warmup_ratio=0.1, betas=(0.9, 0.98), eps=1e-6,
                      backbone_prefixes=("clip.",))  # fmt: skip
    opt = build_optimizer(model, cfg)
    assert len(opt.param_groups) == 4 and all(g["eps"] == 1e-6 for g in opt.param_groups)  # (decay, no) x 2
    names = {id(p): n for n, p in model.named_parameters()}
    sched = build_scheduler(opt, cfg, total_steps=10)
    for _ in range(5):
        opt.step()
        sched.step()
        lrs = {names[id(p)]: g["lr"] for g in opt.param_groups for p in g["params"]}
        assert lrs["clip.weight"] == pytest.approx(1e-3 * lrs["selector.weight"]) and lrs["selector.weight"] > 0
        assert lrs["clip.bias"] == pytest.approx(lrs["clip.weight"])
    decay = {names[id(p)]: g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert decay["clip.weight"] > 0 and decay["clip.bias"] == 0


@pytest.mark.parametrize(
    ("uri", "step"),
    [("runs/a/step-000123", 123), ("runs/a/step-000123/", 123), ("s3://b/run/ckpt/step-7", 7), ("step-0", 0)],
)
def test_checkpoint_step_reads_the_directory_name(uri: str, step: int) -> None:
    from vlp.train.checkpoint import checkpoint_step

    assert checkpoint_step(uri) == step


@pytest.mark.parametrize(
    "uri", ["runs/step-000123/model", "runs/a/step-", "runs/a/step-12x", "runs/step-12X", "step-000123/x/"]
)
def test_checkpoint_step_refuses_any_other_name(uri: str) -> None:
    from vlp.train.checkpoint import checkpoint_step

    message = rf"^{re.escape(uri)} is not a checkpoint directory \(expected a name like step-000123\)$"
    with pytest.raises(CheckpointError, match=message):
        checkpoint_step(uri)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_pruning_deletes_every_file_of_an_old_checkpoint_state_first(
    where: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """keep_last=1 leaves the newest checkpoint whole and nothing of the others, on disk and in a bucket; each old
    one loses its state.json before any other file (a reader that lists checkpoints stops counting it at once)."""
    from vlp.train import checkpoint

    root = request.getfixturevalue("s3_bucket") + "/ckpt" if where == "s3" else str(tmp_path / "ckpt")
    model = nn.Linear(3, 2)
    for step in (1, 2, 3):
        save_checkpoint(root, step, model, None, None)
    deleted: list[str] = []
    real_delete = storage.delete
    monkeypatch.setattr(storage, "delete", lambda uri: (deleted.append(uri), real_delete(uri))[1])
    gone = checkpoint.prune_checkpoints(root, keep_last=1)
    assert sorted(gone) == [checkpoint.checkpoint_dir(root, 1), checkpoint.checkpoint_dir(root, 2)]
    assert {f.rsplit("/", 2)[-2] for f in storage.list_files(root)} == {"step-000003"}
    for ckpt in gone:
        mine = [f for f in deleted if f.startswith(ckpt + "/")]
        assert mine and mine[0].endswith("/" + STATE_FILE) and len(mine) >= 3  # model, rng, state
    if where == "local":
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000003"]
    assert [s for s, _ in list_checkpoints(root)] == [3]
    # the weights read back are the model's
    weights = checkpoint.read_model_weights(checkpoint.checkpoint_dir(root, 3))
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


def test_pruning_removes_incomplete_checkpoints_older_than_the_kept_ones_only(tmp_path: Path) -> None:
    """A directory without state.json is a save that died (older than what is kept: deleted) or one being written
    (newer than the oldest kept: left alone); keep_last below 1 is refused, naming it."""
    from vlp.train import checkpoint

    root = str(tmp_path / "ckpt")
    model = nn.Linear(3, 2)
    for step in (1, 2, 3, 4, 5):
        save_checkpoint(root, step, model, None, None)
    for step in (1, 4):  # died mid-save (step 1) and being written now (step 4)
        storage.delete(storage.join(checkpoint.checkpoint_dir(root, step), STATE_FILE))
    gone = checkpoint.prune_checkpoints(root, keep_last=2)  # keeps 3 and 5, the newest complete ones
    assert gone == [checkpoint.checkpoint_dir(root, 1), checkpoint.checkpoint_dir(root, 2)]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000003", "step-000004", "step-000005"]
    for keep in (0, -1):
        with pytest.raises(ValueError, match=rf"^keep_last must be >= 1, got {keep}$"):
            checkpoint.prune_checkpoints(root, keep_last=keep)


def test_rng_state_round_trips_through_its_file_in_every_format(tmp_path: Path) -> None:
    """A state written and read back is the state (NumPy's keys as uint32, the CUDA states in order); files of the
    older layout (one metadata entry per library) read the same; a file without them is named as damaged."""
    import json

    from safetensors.torch import save as st_save

    from vlp.train import checkpoint

    state = capture_rng_state()
    state.torch_cuda = [torch.arange(4, dtype=torch.uint8), torch.arange(4, 8, dtype=torch.uint8)]
    uri = str(tmp_path / "rng.safetensors")
    storage.write_bytes(uri, checkpoint._encode_rng(state))
    back = checkpoint._decode_rng(uri)
    assert back.python == state.python and back.numpy[0] == state.numpy[0] and back.numpy[2:] == state.numpy[2:]
    assert back.numpy[1].dtype == np.uint32 and np.array_equal(back.numpy[1], state.numpy[1])
    assert torch.equal(back.torch_cpu, state.torch_cpu)
    assert [t.tolist() for t in back.torch_cuda] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    written = safe_open_metadata(uri)["generators"]
    generators = json.loads(written)
    # canonical JSON (sorted keys): the same states give the same bytes however the dict was built
    assert written == json.dumps(generators, sort_keys=True) and list(generators) == ["numpy", "python"]
    old = str(tmp_path / "old.safetensors")  # the layout before one metadata entry
    meta = {k: json.dumps(v) for k, v in generators.items()}
    storage.write_bytes(old, st_save({"torch_cpu": state.torch_cpu}, metadata=meta))
    again = checkpoint._decode_rng(old)
    assert again.python == state.python and np.array_equal(again.numpy[1], state.numpy[1]) and again.torch_cuda == []
    damaged = str(tmp_path / "damaged.safetensors")
    storage.write_bytes(damaged, st_save({"torch_cpu": state.torch_cpu}, metadata={"python": meta["python"]}))
    message = rf"^{re.escape(damaged)}: no readable Python/NumPy generator state \(KeyError\('numpy'\)\)$"
    with pytest.raises(checkpoint.DamagedCheckpointError, match=message):
        checkpoint._decode_rng(damaged)


def safe_open_metadata(uri: str) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(uri, framework="pt") as fh:
        return fh.metadata()


def test_restoring_a_cuda_rng_state_without_cuda_warns_at_the_caller() -> None:
    from vlp.train.checkpoint import restore_rng_state

    state = capture_rng_state()
    state.torch_cuda = [torch.zeros(16, dtype=torch.uint8)]
    message = "^the checkpoint holds a CUDA RNG state but CUDA is not available; not restored$"
    with pytest.warns(UserWarning, match=message) as caught:
        restore_rng_state(state)
    # stacklevel: the caller's line, not the library's nor pytest's (the test's own file, unless a tool such as
    # mutmut wraps the function in a frame of its own)
    assert Path(caught[0].filename).name not in {"checkpoint.py", "python.py"}, caught[0].filename


def test_a_rank_the_checkpoint_lacks_resumes_with_rank_0s_rng_and_says_so(tmp_path: Path) -> None:
    model = nn.Linear(2, 2)
    torch.manual_seed(123)
    uri = save_checkpoint(str(tmp_path), 1, model, None, None, world_size=1)
    expected = torch.rand(3)  # what rank 0's generator gives next after the save
    torch.manual_seed(0)
    message = re.escape(f"{uri} was written by 1 rank(s); rank 1 resumes with rank 0's RNG")
    with pytest.warns(UserWarning, match=f"^{message}$") as caught:
        load_checkpoint(uri, nn.Linear(2, 2), rank=1)
    assert Path(caught[0].filename).name not in {"checkpoint.py", "python.py"}, caught[0].filename  # its caller
    assert torch.equal(torch.rand(3), expected)


def test_load_checkpoint_states_what_it_cannot_restore_and_returns_where_it_read(tmp_path: Path) -> None:
    """Errors name the checkpoint and what does not fit, word for word; a checkpoint of an older layout without
    has_optimizer is taken to hold one; restore_rng=False leaves the generators alone; the result names the
    checkpoint and its world size; rank 0 (the default) restores without a warning."""
    import json
    import warnings

    from vlp.train import checkpoint

    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    uri = save_checkpoint(str(tmp_path / "a"), 4, model, opt, None, world_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_checkpoint(uri, nn.Linear(3, 2), torch.optim.SGD(nn.Linear(3, 2).parameters(), lr=0.1))
    assert (loaded.uri, loaded.step, loaded.world_size) == (uri, 4, 1)

    target = nn.Linear(3, 2)  # (its initialisation draws from the generator)
    torch.manual_seed(7)
    before = torch.get_rng_state()
    load_checkpoint(uri, target, restore_rng=False)
    assert torch.equal(torch.get_rng_state(), before)

    with pytest.raises(CheckpointError, match=rf"^{re.escape(uri)}: weights do not fit the model: "):
        load_checkpoint(uri, nn.Linear(4, 2))
    two_groups = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias]}], lr=0.1)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(uri)}: optimiser state does not fit: "):
        load_checkpoint(uri, nn.Linear(3, 2), two_groups)

    bare = save_checkpoint(str(tmp_path / "b"), 1, model, None, None)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(bare)} holds no optimiser state$"):
        load_checkpoint(bare, nn.Linear(3, 2), torch.optim.SGD(nn.Linear(3, 2).parameters(), lr=0.1))
    state_file = Path(uri) / STATE_FILE
    state = json.loads(state_file.read_text())
    del state["has_optimizer"]  # the layout before the flag: the optimiser file is there, and is read
    state_file.write_text(json.dumps(state))
    fresh = nn.Linear(3, 2)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    load_checkpoint(uri, fresh, fresh_opt)
    assert torch.equal(fresh_opt.state[fresh.weight]["momentum_buffer"], opt.state[model.weight]["momentum_buffer"])

    state["format"] = "vlp-checkpoint-0"
    state_file.write_text(json.dumps(state))
    message = f"{uri}: unknown checkpoint format 'vlp-checkpoint-0', expected {checkpoint.FORMAT!r}"
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        load_checkpoint(uri, nn.Linear(3, 2))


def test_an_optimiser_file_without_its_structure_is_named_as_damaged(tmp_path: Path) -> None:
    from safetensors.torch import save as st_save

    from vlp.train import checkpoint

    uri = str(tmp_path / OPTIM_FILE)
    storage.write_bytes(uri, st_save({"x": torch.zeros(1)}, metadata={"other": "1"}))
    with pytest.raises(
        checkpoint.DamagedCheckpointError,
        match=rf"^{re.escape(uri)}: no readable optimiser structure \(KeyError\('structure'\)\)$",
    ):
        checkpoint._decode_optimizer(uri)


def test_optimiser_state_values_that_are_not_tensors_round_trip_and_exotic_ones_are_named(tmp_path: Path) -> None:
    """An optimiser may keep plain numbers beside its tensors (LBFGS: ``func_evals``, ``n_iter``): they come back
    as they were. A value JSON cannot hold is refused before anything is written, naming the optimiser state."""
    from vlp.train import checkpoint

    state = {
        "state": {0: {"n_iter": 3, "prev_loss": 0.25, "d": torch.arange(3.0)}, 1: {"flag": True}},
        "param_groups": [{"lr": 0.1, "betas": (0.9, 0.98), "params": [0, 1]}],
    }
    uri = str(tmp_path / OPTIM_FILE)
    storage.write_bytes(uri, checkpoint._encode_optimizer(state))
    back = checkpoint._decode_optimizer(uri)
    assert (
        back["state"][0]["n_iter"] == 3 and back["state"][0]["prev_loss"] == 0.25 and back["state"][1] == {"flag": True}
    )
    assert torch.equal(back["state"][0]["d"], torch.arange(3.0)) and back["param_groups"] == state["param_groups"]
    state["state"][1]["flag"] = {1, 2}
    with pytest.raises(CheckpointError, match=r"^optimizer state: cannot store a set as JSON \(\{1, 2\}\)$"):
        checkpoint._encode_optimizer(state)


def test_pretrained_weights_that_do_not_fit_are_listed_eight_at_most(tmp_path: Path) -> None:
    from vlp.weights import load_pretrained_weights

    saved = nn.Sequential(*[nn.Linear(2, 2) for _ in range(9)])
    uri = save_checkpoint(str(tmp_path), 1, saved, None, None)

    def error(model: nn.Module) -> str:
        with pytest.raises(CheckpointError) as caught:
            load_pretrained_weights(uri, model)
        return str(caught.value)

    def names(first: int, last: int) -> list[str]:
        return [f"{i}.{p}" for i in range(first, last) for p in ("weight", "bias")]

    # 4 more layers: 8 missing, all listed; 5 more: 10 missing, the first 8 then "..."
    assert error(nn.Sequential(*[nn.Linear(2, 2) for _ in range(13)])) == (
        f"{uri}: weights do not fit the model: missing {names(9, 13)}, shape mismatches []"
    )
    assert error(nn.Sequential(*[nn.Linear(2, 2) for _ in range(14)])) == (
        f"{uri}: weights do not fit the model: missing {names(9, 13)}..., shape mismatches []"
    )
    nine = nn.Sequential(*[nn.Linear(2, 2) for _ in range(13)], nn.Linear(2, 2, bias=False))  # 9 missing
    assert error(nine).endswith(f"missing {names(9, 13)}..., shape mismatches []")
    mismatches = [
        f"{i}.{p}: {(2, 2) if p == 'weight' else (2,)} vs {(3, 3) if p == 'weight' else (3,)}"
        for i in range(4)
        for p in ("weight", "bias")
    ]
    assert error(nn.Sequential(*[nn.Linear(3, 3) for _ in range(9)])) == (
        f"{uri}: weights do not fit the model: missing [], shape mismatches {mismatches}"
    )
    eight = nn.Sequential(*[nn.Linear(2, 2) for _ in range(8)])
    assert load_pretrained_weights(uri, eight) == ["8.bias", "8.weight"]
    assert all(torch.equal(value, saved.state_dict()[name]) for name, value in eight.state_dict().items())


def test_a_state_entry_that_is_not_a_tensor_is_named(tmp_path: Path) -> None:
    from vlp.weights import save_model_weights

    class WithExtra(nn.Linear):
        def get_extra_state(self) -> dict:
            return {"note": 1}

        def set_extra_state(self, state: dict) -> None:
            pass

    with pytest.raises(CheckpointError, match=r"^model: entry '_extra_state' is a dict, not a tensor$"):
        save_model_weights(str(tmp_path), WithExtra(2, 2))


def test_a_checkpoint_holds_the_given_generators_its_world_and_names_what_json_cannot_hold(tmp_path: Path) -> None:
    """The RNG file holds the states handed in (not the ones current when saving), state.json says one rank by
    default and is indented for a reader; a value that is not JSON (or a state entry that is not a tensor) is
    refused naming the part it is in."""
    from vlp.train import checkpoint

    torch.manual_seed(1)
    given = capture_rng_state()
    torch.rand(5)  # the current state moves on
    root = str(tmp_path / "ckpt")
    uri = save_checkpoint(root, 1, nn.Linear(2, 2), None, None, rng_state=given)
    assert torch.equal(checkpoint._decode_rng(storage.join(uri, checkpoint.rng_file(0))).torch_cpu, given.torch_cpu)
    rank_uri = checkpoint.save_rank_rng(root, 1, 1, given)
    assert torch.equal(checkpoint._decode_rng(rank_uri).torch_cpu, given.torch_cpu)
    text = storage.read_text(storage.join(uri, STATE_FILE))
    assert json.loads(text)["world_size"] == 1 and text.startswith('{\n "format": ')

    class Scheduler:
        def state_dict(self) -> dict:
            return {"when": {1, 2}}

    linear = nn.Linear(2, 2)
    for kwargs, where in [
        ({"scheduler": Scheduler()}, "scheduler state"),
        ({"data_state": {"order": {3}}}, "data state"),
        ({"extra": {"seen": {4}}}, "extra"),
    ]:
        args = {"scheduler": None} | kwargs
        with pytest.raises(CheckpointError, match=rf"^{where}: cannot store a set as JSON "):
            save_checkpoint(str(tmp_path / where.replace(" ", "_")), 1, linear, None, **args)

    class WithExtra(nn.Linear):
        def get_extra_state(self) -> dict:
            return {"note": 1}

    with pytest.raises(CheckpointError, match=r"^model: entry '_extra_state' is a dict, not a tensor$"):
        save_checkpoint(str(tmp_path / "extra_state"), 1, WithExtra(2, 2), None, None)


def test_checkpoints_are_found_under_any_spelling_of_the_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step directories right under the root, whatever else is there (a file before them, a stray file named like
    a step, a deeper file, a file listed after state.json), with the root written with a trailing slash, ending in
    an X, with a doubled slash or a "." inside, as "./root", or as "." (storage lists the current directory's files
    without a prefix)."""
    from vlp.train import checkpoint

    root = tmp_path / "CKPT_X"
    model = nn.Linear(2, 2)
    for step in (1, 2):
        save_checkpoint(str(root), step, model, None, None)
    (root / "README.txt").write_text("notes")  # listed before the step directories
    (root / "step-000003").write_text("not a directory")
    (root / "step-000004" / "logs").mkdir(parents=True)
    (root / "step-000004" / "logs" / "run.txt").write_text("deeper than a checkpoint's files")
    (root / "step-000002" / "zz-notes.txt").write_text("listed after state.json")
    doubled = str(tmp_path) + "//CKPT_X"  # pathlib lists it as .../CKPT_X: compared as a path, it is the same root
    for spelling in (str(root), str(root) + "/", doubled, str(tmp_path / "." / "CKPT_X")):
        assert [s for s, _ in list_checkpoints(spelling)] == [1, 2], spelling
    assert latest_checkpoint(doubled) == doubled + "/step-000002"
    monkeypatch.chdir(root)
    assert checkpoint._scan(".") == {1: ("./step-000001", True), 2: ("./step-000002", True)}
    monkeypatch.chdir(tmp_path)  # a relative root spelled ./CKPT_X (resuming with --ckpt ./ckpt found nothing)
    assert [s for s, _ in list_checkpoints("./CKPT_X")] == [1, 2]
    assert checkpoint.prune_checkpoints("./CKPT_X//", keep_last=1) == ["./CKPT_X/step-000001"]
    message = r"^extra: dict keys must be strings to store as JSON, got \[0, 1, 2, 3, 4\]$"
    with pytest.raises(CheckpointError, match=message):
        save_checkpoint(str(tmp_path / "keys"), 1, model, None, None, extra={"table": {i: i for i in range(6)}})
    with pytest.raises(CheckpointError, match=r"^extra: cannot store a set as JSON \(\{2\}\)$"):
        save_checkpoint(str(tmp_path / "tuple"), 1, model, None, None, extra={"pair": (1, {2})})
