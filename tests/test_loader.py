"""Loader workers with an exact position, and the shard-order sampler (vlp.data.loader)."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import multiprocessing
import multiprocessing.resource_sharer
import os
import pickle
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from test_train_loop import OPT, TinyMLP, ce_step, cfg_for, make_data
from vlp.data.loader import (
    BatchIndices,
    ResumableSampler,
    SamplerBatches,
    ShardOrderSampler,
    _quiet_when_the_trainer_hangs_up,
    pin,
)
from vlp.train.loop import TrainingInterrupted, train

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread for the module


def children() -> set[int]:
    """The pids of this process's live children (``/proc``; else those multiprocessing started)."""
    found = glob.glob(f"/proc/{os.getpid()}/task/*/children")
    if not found:
        return {p.pid for p in multiprocessing.active_children()}
    multiprocessing.active_children()  # reaps the finished ones multiprocessing started
    pids: set[int] = set()
    for path in found:
        with contextlib.suppress(OSError):
            pids |= {int(p) for p in Path(path).read_text().split()}
    return pids


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail (TimeoutError in the main thread) instead of hanging when the block takes longer than ``seconds``."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    before = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


# --------------------------------------------------------------------------- shard order

SHARDS = np.random.default_rng(0).integers(0, 7, size=24)  # 24 items in 7 shards, interleaved by item number


def runs_of(shards: np.ndarray) -> int:
    """How many stretches of equal consecutive values ``shards`` has."""
    return int(1 + np.count_nonzero(shards[1:] != shards[:-1]))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shard_order_epochs_are_permutations_cut_into_equal_contiguous_parts(world_size: int) -> None:
    samplers = [
        ShardOrderSampler(SHARDS, seed=5, shuffle_buffer=1, rank=r, world_size=world_size) for r in range(world_size)
    ]
    for epoch in range(3):
        parts = [s.epoch_indices(epoch) for s in samplers]
        assert {len(p) for p in parts} == {24 // world_size}
        assert sorted(np.concatenate(parts).tolist()) == list(range(24)), "every item once per epoch"
        for part in parts:  # buffer 1: the rank reads each of its shards in one go
            assert runs_of(SHARDS[part]) == len(set(SHARDS[part].tolist()))
        reads = sum(len(set(SHARDS[p].tolist())) for p in parts)
        assert reads <= 7 + world_size - 1, "a shard is read by one rank, or two where a part boundary cuts it"
    rng = np.random.default_rng([5, 0])  # the documented order, rebuilt by hand
    members = [np.flatnonzero(s == SHARDS) for s in np.unique(SHARDS)]
    expected = np.concatenate([rng.permutation(members[s]) for s in rng.permutation(len(members))])
    n = 24 // world_size
    assert [s.epoch_indices(0).tolist() for s in samplers] == [expected[r * n : (r + 1) * n].tolist() for r in
                                                               range(world_size)]  # fmt: skip


def test_shard_order_is_seeded_by_seed_and_epoch_and_pads_like_the_global_sampler() -> None:
    s = ShardOrderSampler(SHARDS, seed=5, shuffle_buffer=4, rank=0, world_size=1)
    e0, e1 = list(s), list(s)
    assert sorted(e0) == sorted(e1) == list(range(24)) and e0 != e1
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    assert e0 == list(ShardOrderSampler(SHARDS, seed=5, shuffle_buffer=4, rank=0, world_size=1))
    assert e0 != list(ShardOrderSampler(SHARDS, seed=6, shuffle_buffer=4, rank=0, world_size=1))
    padded = [ShardOrderSampler(SHARDS[:10], seed=1, rank=r, world_size=3) for r in range(3)]
    assert [len(p) for p in padded] == [4, 4, 4] and set(np.concatenate([p.epoch_indices(0) for p in padded])) == set(
        range(10)
    )
    dropped = [ShardOrderSampler(SHARDS[:10], seed=1, rank=r, world_size=3, drop_last=True) for r in range(3)]
    assert [len(p) for p in dropped] == [3, 3, 3] and len(
        set(np.concatenate([p.epoch_indices(0) for p in dropped]))
    ) == 9
    with pytest.raises(ValueError, match="shuffle_buffer must be >= 1"):
        ShardOrderSampler(SHARDS, shuffle_buffer=0, rank=0, world_size=1)
    with pytest.raises(ValueError, match="1-D array of shard numbers"):
        ShardOrderSampler([], rank=0, world_size=1)


def test_the_shuffle_buffer_bounds_how_far_an_item_moves_and_a_large_one_permutes_fully() -> None:
    shards = np.repeat(np.arange(20), 10)  # 200 items, 20 shards of 10
    base = ShardOrderSampler(shards, seed=2, shuffle_buffer=1, rank=0, world_size=1).epoch_indices(3)
    where = {int(item): k for k, item in enumerate(base)}  # position in the unbuffered order
    for size in (4, 16):
        order = ShardOrderSampler(shards, seed=2, shuffle_buffer=size, rank=0, world_size=1).epoch_indices(3)
        assert sorted(order.tolist()) == list(range(200)) and order.tolist() != base.tolist()
        assert all(where[int(item)] <= k + size - 1 for k, item in enumerate(order)), "no item comes early by > size"
        # shards mix at their boundaries, but a window of 4 switches shard far less often than a global permutation
        assert 20 < runs_of(shards[order]) < {4: 100, 16: 175}[size]
    full = ShardOrderSampler(shards, seed=2, shuffle_buffer=200, rank=0, world_size=1).epoch_indices(3)
    assert sorted(full.tolist()) == list(range(200)) and runs_of(shards[full]) > 150  # well mixed


def test_shard_order_resumes_mid_epoch_and_refuses_other_data_or_the_other_samplers_state() -> None:
    s = ShardOrderSampler(SHARDS, seed=5, shuffle_buffer=3, rank=0, world_size=1)
    list(s)
    it = iter(s)  # epoch 1
    head = [next(it) for _ in range(10)]
    state = json.loads(json.dumps(s.state_dict()))
    rest = list(it) + list(s)
    t = ShardOrderSampler(SHARDS, seed=5, shuffle_buffer=3, rank=0, world_size=1)
    t.load_state_dict(state)
    assert state["order"] == "shards" and (state["epoch"], state["position"]) == (1, 10) and len(head) == 10
    assert list(t) + list(t) == rest
    with pytest.raises(ValueError, match="same data and seed"):
        ShardOrderSampler(SHARDS, seed=6, shuffle_buffer=3, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(ValueError, match="other shards or another shuffle_buffer"):
        ShardOrderSampler((SHARDS + 1) % 7, seed=5, shuffle_buffer=3, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(ValueError, match="other shards or another shuffle_buffer"):
        ShardOrderSampler(SHARDS, seed=5, shuffle_buffer=4, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(ValueError, match=r"recorded by a ShardOrderSampler .* this is a ResumableSampler"):
        ResumableSampler(24, seed=5, rank=0, world_size=1).load_state_dict(state)
    global_state = ResumableSampler(24, seed=5, rank=0, world_size=1).state_dict()
    assert global_state["order"] == "global"
    old = {k: v for k, v in global_state.items() if k != "order"}  # a checkpoint from before "order" existed
    ResumableSampler(24, seed=5, rank=0, world_size=1).load_state_dict(old)
    for other in (global_state, old):
        with pytest.raises(ValueError, match=r"recorded by a ResumableSampler .* this is a ShardOrderSampler"):
            t.load_state_dict(other)
    two = ShardOrderSampler(SHARDS, seed=5, shuffle_buffer=3, rank=1, world_size=2)
    next(iter(two)), next(iter(two))
    with pytest.warns(UserWarning, match="world_size 2 with 1: position mapped by items consumed"):
        t.load_state_dict(two.state_dict())
    assert (t.epoch, t.position) == (0, 4)


# --------------------------------------------------------------------------- batches with workers


def epoch_fetch(indices: BatchIndices) -> dict[str, Tensor]:
    """A batch that depends only on (indices, epoch), as a fetch must for equal batches with any worker count."""
    assert isinstance(indices, BatchIndices) and isinstance(indices, list)
    return {"x": torch.tensor(indices, dtype=torch.float64) * 100 + indices.epoch, "pid": torch.tensor(os.getpid())}


def loader(num_workers: int, sampler: Any = None, fetch: Any = epoch_fetch, **kw: Any) -> SamplerBatches:
    sampler = sampler or ResumableSampler(40, seed=7, rank=0, world_size=1)
    return SamplerBatches(sampler, fetch, 3, num_workers=num_workers, **kw)  # 13 batches an epoch, 1 item dropped


def consume(batches: SamplerBatches, epochs: int) -> list[tuple[list[float], dict[str, Any]]]:
    """``epochs`` passes: each batch's values with the state right after it was handed out."""
    seen = []
    for _ in range(epochs):
        for batch in batches:
            seen.append((batch["x"].tolist(), batches.state_dict()))
    return seen


def test_batch_indices_are_a_list_with_an_epoch_that_pickles() -> None:
    b = BatchIndices([3, 1], epoch=2)
    c = pickle.loads(pickle.dumps(b))
    assert c == [3, 1] and c.epoch == 2 and isinstance(c, BatchIndices) and repr(c) == "BatchIndices([3, 1], epoch=2)"
    assert torch.arange(5)[c].tolist() == [3, 1]


@pytest.mark.parametrize("kind", ["global", "shards"])
def test_workers_hand_out_the_same_batches_and_states_as_no_workers(kind: str) -> None:
    def make(workers: int) -> SamplerBatches:
        sampler = (
            ResumableSampler(40, seed=7, rank=0, world_size=1)
            if kind == "global"
            else ShardOrderSampler(np.arange(40) // 6, seed=7, shuffle_buffer=5, rank=0, world_size=1)
        )
        return loader(workers, sampler, pin_memory=True)  # pinning is ignored without CUDA

    runs = {}
    for workers in (0, 1, 2):
        batches = make(workers)
        runs[workers] = consume(batches, 3)
        batches.close()
    assert runs[1] == runs[0] and runs[2] == runs[0]
    assert len(runs[0]) == 3 * 13
    order = make(0).sampler
    for epoch in range(3):  # the sampler's order in batches of 3, with the epoch each was drawn in
        expected = [100.0 * i + epoch for i in order.epoch_indices(epoch)[:39].tolist()]
        assert [v for x, _ in runs[0][13 * epoch : 13 * (epoch + 1)] for v in x] == expected
    assert [s["position"] for _, s in runs[2][:13]] == [3 * (k + 1) for k in range(13)]


def test_the_state_is_what_was_handed_out_not_what_workers_prefetched() -> None:
    batches = loader(2)
    it = iter(batches)
    first = next(it)
    assert batches.state_dict()["position"] == 3
    assert batches.sampler.position >= 3 * 4, "2 workers x 2 batches were asked for ahead"
    pids = {int(next(it)["pid"]) for _ in range(5)} | {int(first["pid"])}
    assert os.getpid() not in pids and len(pids) == 2, "fetched in the two workers"
    assert batches.state_dict()["position"] == 18
    batches.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_load_state_dict_then_iterate_equals_continuing(workers: int) -> None:
    batches = loader(workers)
    list(batches)
    it = iter(batches)  # epoch 1
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(batches.state_dict()))
    rest = [b["x"].tolist() for b in it] + [b["x"].tolist() for b in batches]
    batches.close()
    assert state["epoch"] == 1 and state["position"] == 15 and len(rest) == 8 + 13
    fresh = loader(workers)  # a new process after a resume
    fresh.load_state_dict(state)
    assert [b["x"].tolist() for b in fresh] + [b["x"].tolist() for b in fresh] == rest
    live = iter(fresh)  # epoch 3 running, its workers ahead ...
    next(live), next(live)
    fresh.load_state_dict(state)  # ... dropped: the live iteration stops and the next starts at the state
    assert list(live) == []
    assert [b["x"].tolist() for b in fresh] + [b["x"].tolist() for b in fresh] == rest
    stopped = iter(fresh)  # an iteration left early continues, in the next one, after what it handed out
    next(stopped)
    again = [b["x"].tolist() for b in fresh]
    assert again == [x for x, _ in consume(loader(0), 4)[13 * 3 + 1 :]], "epoch 3 after its first batch"
    fresh.close()


def test_an_early_stop_resumes_after_the_last_batch_handed_out() -> None:
    straight = [x for x, _ in consume(loader(0), 2)]
    batches = loader(2)
    it = iter(batches)
    got = [next(it)["x"].tolist() for _ in range(4)]  # the workers fetched further
    got += [b["x"].tolist() for b in batches]  # a new iteration: the rest of epoch 0, not what was prefetched
    got += [b["x"].tolist() for b in batches]
    batches.close()
    assert got == straight


def test_iterating_with_workers_draws_nothing_from_the_global_rngs() -> None:
    torch.manual_seed(11)
    np.random.seed(11)
    random.seed(11)
    before = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    batches = loader(2)
    consume(batches, 2)
    batches.close()
    after = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    assert torch.equal(before[0], after[0])
    assert all(np.array_equal(a, b) for a, b in zip(before[1], after[1], strict=True))
    assert before[2] == after[2]


def test_workers_leave_interruptions_to_the_trainer() -> None:
    """Ctrl-C and SIGTERM reach the whole process group: the workers ignore them (the trainer interrupts, then
    shuts them down), so a signal never shows up as a dead worker instead of the interruption."""
    before = children()
    batches = loader(2)
    got = iter(batches)
    first = [next(got), next(got)]  # one batch from each worker: both have run their init (which ignores signals)
    workers = children() - before
    for pid in workers:
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGINT)
    time.sleep(0.5)
    assert children() - before == workers, "the workers are still alive"
    rest = first + list(got)
    assert [b["x"].tolist() for b in rest] == [b["x"].tolist() for b in loader(0)]
    batches.close()
    assert not children() - before


def test_a_worker_drops_only_the_fd_handover_failure_of_a_trainer_that_hung_up() -> None:
    """After an interruption the trainer closes its end of a shared-memory handover; the worker's sharing thread
    then fails with an OSError and would print a traceback under the trainer's one-line message. The worker's
    excepthook drops exactly that failure and passes every other one on."""
    seen: list[type[BaseException]] = []
    hook = _quiet_when_the_trainer_hangs_up(lambda kind, error, tb: seen.append(kind))

    def raised_in(filename: str, error: BaseException) -> tuple[type[BaseException], BaseException, Any]:
        namespace: dict[str, Any] = {}
        exec(compile("def send(e):\n    raise e\n", filename, "exec"), namespace)
        try:
            namespace["send"](error)
        except BaseException as caught:
            return type(caught), caught, caught.__traceback__
        raise AssertionError("send did not raise")

    sharer = multiprocessing.resource_sharer.__file__
    hook(*raised_in(sharer, BrokenPipeError("peer closed")))
    hook(*raised_in(sharer, ConnectionResetError("reset")))
    assert seen == [], "the handover failures of a trainer that hung up are dropped"
    hook(*raised_in(sharer, ValueError("a bug in the handover")))
    hook(*raised_in("/elsewhere/worker.py", BrokenPipeError("another pipe")))
    assert seen == [ValueError, BrokenPipeError], "anything else reaches the fallback hook"


def test_workers_live_across_epochs_and_close_ends_them() -> None:
    before = children()
    batches = loader(2)
    list(batches)
    workers = children() - before
    assert len(workers) == 2
    list(batches), list(batches)
    assert children() - before == workers, "the next epochs use the same worker processes"
    batches.close()
    assert not children() & workers, "close() ends the workers"
    assert len(list(batches)) == 13 and len(children() - before) == 2, "a later iteration starts new ones"
    batches.close()
    assert not children() - before


def failing_fetch(indices: BatchIndices) -> Any:
    if 7 in indices:
        raise KeyError(f"no frames for item 7 (epoch {indices.epoch})")
    return epoch_fetch(indices)


def exiting_fetch(indices: BatchIndices) -> Any:
    if 7 in indices:
        os._exit(3)
    return epoch_fetch(indices)


def killed_fetch(indices: BatchIndices) -> Any:
    if 7 in indices:
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does
    return epoch_fetch(indices)


def test_an_exception_in_a_worker_reaches_the_consumer_with_its_type_and_message() -> None:
    before = children()
    batches = loader(2, fetch=failing_fetch)
    with deadline(30), pytest.raises(KeyError, match=r"no frames for item 7 \(epoch 0\)"):
        list(batches)
    batches.close()
    assert not children() - before


@pytest.mark.parametrize(("fetch", "how"), [(exiting_fetch, "exit code 3"), (killed_fetch, "signal|exit code -9")])
def test_a_worker_that_dies_fails_the_iteration_naming_it_within_seconds(fetch: Any, how: str) -> None:
    before = children()
    batches = loader(2, fetch=fetch)
    start = time.monotonic()
    with deadline(30), pytest.raises(RuntimeError, match=rf"DataLoader worker .*\(pid \d+\) .*({how})"):
        list(batches)
    assert time.monotonic() - start < 10
    batches.close()
    assert not children() - before


def slow_fetch(indices: BatchIndices) -> Any:
    if 7 in indices:
        time.sleep(2)
    return epoch_fetch(indices)


def test_a_worker_slower_than_the_timeout_fails_the_iteration_and_a_rerun_continues() -> None:
    batches = loader(1, fetch=slow_fetch, timeout_s=0.5)
    got = []
    start = time.monotonic()
    with deadline(30), pytest.raises(RuntimeError, match=r"timed out after 0.5 seconds"):
        for b in batches:
            got.append(b["x"].tolist())
    assert time.monotonic() - start < 5
    batches.fetch = epoch_fetch  # what a retry after a transient stall sees: the rest after the last batch handed out
    got += [b["x"].tolist() for b in batches]
    batches.close()
    assert got == [x for x, _ in consume(loader(0), 1)]


def test_worker_settings_are_checked() -> None:
    sampler = ResumableSampler(4, rank=0, world_size=1)
    for kw in ({"num_workers": -1}, {"prefetch": 0}, {"timeout_s": -1.0}):
        with pytest.raises(ValueError, match="num_workers >= 0, prefetch >= 1 and timeout_s >= 0"):
            SamplerBatches(sampler, epoch_fetch, 2, **kw)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="Linux: /dev/shm is where workers share")
def test_workers_without_writable_shared_memory_fail_saying_what_to_set(monkeypatch, tmp_path) -> None:
    import vlp.data.loader as loop

    monkeypatch.setattr(loop, "SHARED_MEMORY", str(tmp_path / "absent"))  # what a pod with a read-only /dev has
    sampler = ResumableSampler(4, rank=0, world_size=1)
    with pytest.raises(RuntimeError, match=r"num_workers=1: .*absent is not writable.*shm_size.*num_workers: 0"):
        next(iter(SamplerBatches(sampler, epoch_fetch, 2, num_workers=1)))
    assert next(iter(SamplerBatches(sampler, epoch_fetch, 2, num_workers=0))) is not None  # no workers: no shm


@dataclasses.dataclass
class Clips:
    video: Tensor
    ids: tuple[Tensor, list[Tensor]]


@pytest.mark.gpu
def test_pinned_batches_of_any_shape_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    batch = {"clips": Clips(torch.zeros(2, 3), (torch.ones(2), [torch.ones(1)])), "n": 3}
    pinned = pin(batch)
    assert pinned["clips"].video.is_pinned() and pinned["clips"].ids[0].is_pinned()
    assert pinned["clips"].ids[1][0].is_pinned() and pinned["n"] == 3 and not batch["clips"].video.is_pinned()

    def fetch(indices: BatchIndices) -> Clips:
        x = torch.tensor(indices, dtype=torch.float32)
        return Clips(x, (x + indices.epoch, [x * 2]))

    batches = loader(2, fetch=fetch, pin_memory=True)
    got = list(batches)
    batches.close()
    assert len(got) == 13 and all(b.video.is_pinned() and b.ids[1][0].is_pinned() for b in got)
    assert [b.video.tolist() for b in got] == [b.video.tolist() for b in loader(0, fetch=fetch)]


# --------------------------------------------------------------------------- train() with workers


def training_data(num_workers: int) -> SamplerBatches:
    x, y = make_data(22)
    sampler = ResumableSampler(22, seed=7, rank=0, world_size=1)
    return SamplerBatches(sampler, lambda idx: {"x": x[idx], "y": y[idx]}, 3, num_workers=num_workers)


def interrupting(at_call: int, spare: set[int]) -> Any:
    """``ce_step`` that sends a real SIGINT to this process and the loader's workers (its children but ``spare``, the
    ones it had before: servers other tests share), as Ctrl-C in a terminal does to the foreground process group, at
    micro-step ``at_call``."""
    calls = {"n": 0}

    def step(model: nn.Module, batch: Any) -> Any:
        if calls["n"] == at_call:
            for pid in children() - spare:
                os.kill(pid, signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # Python's handler raises KeyboardInterrupt here long before
        calls["n"] += 1
        return ce_step(model, batch)

    return step


def test_training_with_workers_is_bit_identical_to_without_and_resumes_exactly(tmp_path: Path) -> None:
    # 8 updates x 2 micro-batches of 3 over 22 items (7 batches an epoch): 2+ epochs, checkpoints mid-epoch;
    # dropout 0.3 draws from the global RNG, so a loader that touched it would change the weights
    before = children()
    models = {}
    for workers in (0, 2):
        models[workers] = TinyMLP()
        train(models[workers], ce_step, training_data(workers), cfg_for(tmp_path / f"w{workers}"), OPT)
        assert not children() - before, "train() closed the loader"
    straight = models[0].state_dict()
    assert all(torch.equal(straight[k], v) for k, v in models[2].state_dict().items())

    out = tmp_path / "interrupted"
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # even where SIGINT is ignored (background)
    try:
        with pytest.raises(TrainingInterrupted) as stopped:  # checkpoints at 3 and 6, Ctrl-C during update 8
            train(TinyMLP(), interrupting(14, before), training_data(2), cfg_for(out), OPT)
    finally:
        signal.signal(signal.SIGINT, handler)
    assert stopped.value.step == 7 and stopped.value.resume_step == 6 and stopped.value.signum == signal.SIGINT
    assert not children() - before, "no worker outlives an interrupted training"
    torch.manual_seed(999)  # a new process: another global RNG state, a fresh model and loader
    resumed = TinyMLP(seed=5)
    result = train(resumed, ce_step, training_data(2), cfg_for(out), OPT)
    assert result.start_step == 6 and result.step == 8
    assert all(torch.equal(straight[k], v) for k, v in resumed.state_dict().items())
    assert not torch.equal(straight["fc1.weight"], TinyMLP().state_dict()["fc1.weight"])  # it did train
    assert not children() - before
