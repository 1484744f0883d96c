"""The one training loop every model of vlp uses: generic over a model, a step function and a data source.

``train(model, step_fn, data, cfg, optim_cfg)`` runs ``cfg.max_steps`` optimiser updates. Each update
draws ``cfg.grad_accum`` micro-batches from ``data``, calls ``step_fn(model, batch)`` (which returns a
mapping of named scalars that must include ``"loss"``), back-propagates ``loss / grad_accum``, clips
the global gradient norm, steps AdamW and the LR schedule (:mod:`vlp.train.optim`). It checkpoints
every ``cfg.ckpt_every`` updates and at the end (:mod:`vlp.train.checkpoint`) and, with
``resume=True``, continues bit-exactly from the newest intact checkpoint in ``<out_dir>/checkpoints``
(a damaged one is skipped with a warning): model, optimiser, schedule, every global RNG and the data
position. Checkpoints record the caller's ``identity`` (e.g. the tokenizer's digest) and the last
logged metrics; a resume against another identity is refused.

Contract for ``step_fn``
    * it must run the model through ``model(...)`` (the forward of the possibly DDP-wrapped module),
      or DDP does not synchronise gradients; use :func:`unwrap` for other methods;
    * only ``"loss"`` is differentiated; every entry (e.g. ``"loss_vtc"``, ``"temp"``) is logged as
      ``train/<name>``, averaged over the micro-batches and steps since the last log and over ranks;
    * ``loss`` should be a mean over the micro-batch: then ``k`` equal micro-batches accumulate to the
      gradient of one ``k`` times larger batch.

Contract for ``data``
    An iterable of batches; iterating it again starts the next epoch (the loop keeps one iterator per
    epoch). For exact resume it also has ``state_dict()`` / ``load_state_dict()`` whose state is the
    position of the batches *handed out*, not of what a prefetching loader's workers fetched ahead:
    :class:`SamplerBatches` over a :class:`ResumableSampler` or :class:`ShardOrderSampler` does this, with
    or without worker processes (``num_workers``). If it has ``close()``, :func:`train` calls it when it
    ends, normally, interrupted or by an exception, so no worker process outlives the training.

Talking while it trains (rank 0, on stderr): a resume says ``resuming from step M (<checkpoint>)`` before the
first update; with ``cfg.progress`` a terminal gets a tqdm bar and anything else (a log file, a pipeline's
subprocess, CI) one plain line per logged interval (:func:`progress_line`); printing draws no random numbers, so
it never changes a run. An interruption (Ctrl-C, or a SIGTERM the CLI turns into one) during the updates is
re-raised as :class:`TrainingInterrupted`, which says the step reached and the newest checkpoint a rerun resumes
from; checkpoint files are written atomically with ``state.json`` last, so an interrupted save leaves no
checkpoint that counts.

Distributed: under ``torchrun`` (after :func:`vlp.train.distributed.init_from_env`) the model is wrapped
in DDP, non-final micro-steps run under ``no_sync()``, metrics are averaged over ranks and only rank 0
logs, shows progress and writes model/optimiser (every rank writes its own RNG file). The forward and the
loss run under bf16 autocast on CUDA when ``cfg.bf16`` is set, on the CPU when ``cfg.cpu_bf16`` is; the
backward and the optimiser keep fp32 weights and gradients.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import os
import random
import re
import resource
import signal
import sys
import time
import traceback
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from vlp import storage
from vlp.settings import LoopSettings
from vlp.train import distributed
from vlp.train.checkpoint import (
    STATE_FILE,
    CheckpointError,
    DamagedCheckpointError,
    checkpoint_step,
    list_checkpoints,
    load_checkpoint,
    read_state,
    save_checkpoint,
    save_rank_rng,
)
from vlp.train.optim import OptimConfig, build_optimizer, build_scheduler, clip_gradients

StepFn = Callable[[nn.Module, Any], Mapping[str, Tensor | float]]


# --------------------------------------------------------------------------- data position


SHARED_MEMORY = "/dev/shm"  # where Linux's multiprocessing locks and torch's shared tensors live

_ORDERS = {
    "global": "a ResumableSampler (one global permutation per epoch)",
    "shards": "a ShardOrderSampler (shard by shard)",
}


def _check_order(state: Mapping[str, Any], order: str) -> None:
    """Refuse a state written by the other kind of sampler (states without ``"order"`` are global ones)."""
    recorded = str(state.get("order", "global"))
    if recorded != order:
        raise ValueError(
            f"sampler state was recorded by {_ORDERS.get(recorded, repr(recorded))} but this is {_ORDERS[order]}; "
            "resume with the sampler the run was trained with"
        )


def _check_data(state: Mapping[str, Any], seed: int, num_items: int) -> None:
    if state["seed"] != seed or state["num_items"] != num_items:
        raise ValueError(
            f"sampler state is for seed={state['seed']}, num_items={state['num_items']} but this sampler has "
            f"seed={seed}, num_items={num_items}; resume with the same data and seed"
        )


def _mapped_position(state: Mapping[str, Any], world_size: int, length: int) -> int:
    """``state``'s position in this world size: mapped by items consumed (with a warning) when it differs."""
    position = int(state["position"])
    if state["world_size"] != world_size:
        warnings.warn(
            f"resuming a sampler of world_size {state['world_size']} with {world_size}: position mapped "
            "by items consumed, the sample order is not exact",
            stacklevel=3,
        )
        position = min(length, position * int(state["world_size"]) // world_size)
    return position


class _EpochPosition:
    """What both samplers share: the per-rank length and iteration from ``(epoch, position)``."""

    num_items: int
    world_size: int
    drop_last: bool
    epoch: int
    position: int

    def epoch_indices(self, epoch: int) -> np.ndarray:
        raise NotImplementedError

    def __len__(self) -> int:
        """Indices per rank per epoch."""
        if self.drop_last:
            return self.num_items // self.world_size
        return math.ceil(self.num_items / self.world_size)

    def __iter__(self) -> Iterator[int]:
        indices = self.epoch_indices(self.epoch)
        while self.position < len(indices):
            index = int(indices[self.position])
            self.position += 1  # before the yield: the state counts what has been handed out
            yield index
        self.epoch, self.position = self.epoch + 1, 0

    def _set_ranks(self, rank: int | None, world_size: int | None) -> None:
        self.rank = distributed.rank() if rank is None else rank
        self.world_size = distributed.world_size() if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        if self.drop_last and self.num_items < self.world_size:
            raise ValueError(
                f"drop_last with {self.num_items} items and {self.world_size} ranks leaves every rank empty"
            )
        self.epoch, self.position = 0, 0


class ResumableSampler(_EpochPosition):
    """Indices ``0..num_items-1`` in an epoch-seeded order, sharded over ranks, with a resumable position.

    Epoch ``e``'s order is ``numpy.random.default_rng([seed, e]).permutation(num_items)`` (or
    ``arange`` without shuffling): it depends only on ``(seed, e)``, never on global RNG state. With
    ``world_size > 1`` the order is padded by wrapping around (or truncated with ``drop_last``) to a
    multiple of ``world_size`` and rank ``r`` takes every ``world_size``-th index from ``r``, like
    ``torch.utils.data.DistributedSampler``. Iterating yields the rest of the current epoch from
    ``position`` and then moves to the next epoch; ``state_dict()`` at any moment describes exactly
    the indices handed out so far. Its state says ``"order": "global"``; :class:`ShardOrderSampler`'s
    state is refused (and this sampler's by it).

    Grouped batches (``groups`` and ``group_batch``): item ``i`` belongs to group ``groups[i]`` and every
    ``group_batch`` consecutive indices a rank yields (one micro-batch) come from one group, on every rank
    at once. The epoch's permutation is cut, group by group, into runs of ``group_batch * world_size``
    items and the runs are shuffled; the items of a group that do not fill a run, and items with a
    negative group, fill mixed runs that are shuffled in with the rest, so every item is still seen once
    per epoch. A contrastive loss then has to tell apart clips that share what the groups share (its
    in-batch negatives become hard ones). With ``group_fraction < 1`` each full run stays grouped with
    that probability and otherwise joins the mixed ones, so the batches are a blend. With
    ``group_epochs = n > 0`` only the first ``n`` epochs are grouped and later ones are plain random
    permutations (a curriculum: hard negatives first). Needs ``shuffle``.
    """

    def __init__(
        self,
        num_items: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        groups: np.ndarray | list[int] | None = None,
        group_batch: int = 0,
        group_fraction: float = 1.0,
        group_epochs: int = 0,
    ) -> None:
        if num_items < 1:
            raise ValueError(f"ResumableSampler needs num_items >= 1, got {num_items}")
        self.num_items, self.seed, self.shuffle, self.drop_last = num_items, seed, shuffle, drop_last
        self.groups = None if groups is None else np.asarray(groups, dtype=np.int64)
        self.group_batch, self.group_fraction, self.group_epochs = group_batch, group_fraction, group_epochs
        if group_epochs < 0:
            raise ValueError(f"group_epochs must be >= 0 (0 = every epoch), got {group_epochs}")
        if not 0.0 <= group_fraction <= 1.0:
            raise ValueError(f"group_fraction must be in [0, 1], got {group_fraction}")
        if self.groups is not None:
            if self.groups.shape != (num_items,):
                raise ValueError(f"groups has shape {self.groups.shape}; it needs one group per item ({num_items},)")
            if group_batch < 1 or not shuffle:
                raise ValueError(f"grouped batches need group_batch >= 1 and shuffle, got {group_batch}, {shuffle}")
        self._set_ranks(rank, world_size)

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """This rank's indices for ``epoch``, in order: ``(len(self),)`` int64."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.num_items) if self.shuffle else np.arange(self.num_items)
        if self.groups is not None and (self.group_epochs == 0 or epoch < self.group_epochs):
            order = self._grouped(order, rng)
        total = len(self) * self.world_size
        order = np.resize(order, total)  # wraps around when padding, truncates with drop_last
        return order[self.rank :: self.world_size]

    def _grouped(self, order: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``order`` rearranged into shuffled runs of ``group_batch * world_size`` items of one group each."""
        assert self.groups is not None
        run = self.group_batch * self.world_size
        runs, rest = [], [order[self.groups[order] < 0]]
        for g in np.unique(self.groups[self.groups >= 0]):
            members = order[self.groups[order] == g]  # in permutation order
            full = len(members) // run * run
            for chunk in np.split(members[:full], full // run) if full else []:
                if self.group_fraction >= 1.0 or rng.random() < self.group_fraction:
                    runs.append(chunk)
                else:
                    rest.append(chunk)
            rest.append(members[full:])
        mixed = rng.permutation(np.concatenate(rest))
        runs += [mixed[i : i + run] for i in range(0, len(mixed), run)]
        last = [r for r in runs if len(r) < run]  # at most one short run: it goes last, where drop_last cuts
        runs = [r for r in runs if len(r) == run]
        return np.concatenate([runs[i] for i in rng.permutation(len(runs))] + last)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position: epoch, index within the epoch, and what it is valid for."""
        return {
            "order": "global",
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_items": self.num_items,
            "world_size": self.world_size,
            "groups": self._groups_digest(),
        }

    def _groups_digest(self) -> int:
        """0 without groups, else a checksum of the grouping (a resume must use the same one)."""
        if self.groups is None:
            return 0
        setting = self.groups.tobytes() + repr((self.group_batch, self.group_fraction, self.group_epochs)).encode()
        return zlib.crc32(setting) or 1

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``. A different world size is mapped by items consumed (with a warning).

        Raises:
            ValueError: if ``state`` was recorded by a :class:`ShardOrderSampler`, or for another ``seed``,
                ``num_items`` (the data changed) or grouping.
        """
        _check_order(state, "global")
        _check_data(state, self.seed, self.num_items)
        if int(state.get("groups", 0)) != self._groups_digest():
            raise ValueError("sampler state was recorded with another batch grouping; resume with the same group_by")
        self.epoch, self.position = int(state["epoch"]), _mapped_position(state, self.world_size, len(self))


class ShardOrderSampler(_EpochPosition):
    """Indices ``0..len(shards)-1`` read shard by shard, each rank its own contiguous stretch, with a resumable
    position: the order for data stored in shards (tar files, chunked frame stores) that are cheap to read
    through and expensive to seek in.

    ``shards[i]`` is item ``i``'s shard number (several items may share a clip and a shard). Epoch ``e``'s order
    is a pure function of ``(seed, e, world_size, rank, shuffle_buffer, shards)``, never of global RNG state:

    * the shards (the distinct values of ``shards``) are put in a permutation drawn from
      ``numpy.random.default_rng([seed, e])``, and the items of each shard are permuted with the same
      generator and concatenated in that shard order;
    * the sequence is padded by wrapping around (or truncated with ``drop_last``) to ``len(self) * world_size``
      and cut into ``world_size`` contiguous equal parts; rank ``r`` takes part ``r``, so every rank has the same
      length and each shard is read by one rank (two where a part boundary cuts it);
    * within the rank, a bounded shuffle buffer of ``shuffle_buffer`` items (seeded by ``[seed, e, rank + 1]``)
      mixes neighbours: it is filled with the first items, then each incoming item replaces a random slot whose
      item is emitted, and at the end the rest of the buffer is emitted in a random order. ``shuffle_buffer=1``
      keeps the shard order (every shard's items contiguous); ``shuffle_buffer >= len(self)`` gives a full
      permutation of the rank's items.

    What this gives up against :class:`ResumableSampler`'s global permutation: a batch draws from a window of
    about ``shuffle_buffer`` consecutive items, i.e. from a few shards, so items of one shard (clips of one
    source, captions of one clip) meet in a batch more often than chance, and a rank sees only its part of the
    data in an epoch; each epoch still sees every item once (up to the padding or ``drop_last``), in a new order.

    The state (``state_dict()``) says ``"order": "shards"`` and records seed, ``num_items``, world size and a
    digest of ``shards`` and ``shuffle_buffer``; a :class:`ResumableSampler`'s state is refused, and so is this
    sampler's by it.
    """

    def __init__(
        self,
        shards: np.ndarray | list[int],
        *,
        seed: int = 0,
        shuffle_buffer: int = 1024,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        self.shards = np.asarray(shards, dtype=np.int64)
        if self.shards.ndim != 1 or len(self.shards) < 1:
            raise ValueError(
                f"ShardOrderSampler needs a 1-D array of shard numbers, one per item; got {self.shards.shape}"
            )
        if shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be >= 1 (1 = no shuffling within a rank), got {shuffle_buffer}")
        self.num_items, self.seed, self.shuffle_buffer, self.drop_last = (
            len(self.shards),
            seed,
            shuffle_buffer,
            drop_last,
        )
        by_shard = np.argsort(self.shards, kind="stable")
        _, starts = np.unique(self.shards[by_shard], return_index=True)
        self._members = np.split(by_shard, starts[1:])  # the items of each distinct shard, ascending
        self._set_ranks(rank, world_size)

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """This rank's indices for ``epoch``, in order: ``(len(self),)`` int64."""
        rng = np.random.default_rng([self.seed, epoch])
        sequence = np.concatenate([rng.permutation(self._members[s]) for s in rng.permutation(len(self._members))])
        n = len(self)
        part = np.resize(sequence, n * self.world_size)[self.rank * n : (self.rank + 1) * n]  # wraps or truncates
        return _buffer_shuffle(part, self.shuffle_buffer, np.random.default_rng([self.seed, epoch, self.rank + 1]))

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position: epoch, index within the epoch, and what it is valid for."""
        return {
            "order": "shards",
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_items": self.num_items,
            "world_size": self.world_size,
            "shards": self._digest(),
        }

    def _digest(self) -> int:
        return zlib.crc32(self.shards.tobytes() + repr(self.shuffle_buffer).encode())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``. A different world size is mapped by items consumed (with a warning).

        Raises:
            ValueError: if ``state`` was recorded by a :class:`ResumableSampler` (or has no ``"order"``), or for
                another ``seed``, ``num_items``, ``shards`` or ``shuffle_buffer``.
        """
        _check_order(state, "shards")
        _check_data(state, self.seed, self.num_items)
        if int(state["shards"]) != self._digest():
            raise ValueError(
                "sampler state was recorded with other shards or another shuffle_buffer; resume with the same data "
                "and shuffle_buffer"
            )
        self.epoch, self.position = int(state["epoch"]), _mapped_position(state, self.world_size, len(self))


def _buffer_shuffle(items: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``items`` through a shuffle buffer of ``size`` slots: each incoming item takes the slot of a random one
    that is emitted; what is left at the end is emitted in a random order."""
    buffer = items[:size].tolist()
    slots = rng.integers(0, len(buffer), size=max(len(items) - size, 0)).tolist()
    out = []
    for slot, item in zip(slots, items[size:].tolist(), strict=True):
        out.append(buffer[slot])
        buffer[slot] = item
    out.extend(buffer[i] for i in rng.permutation(len(buffer)))
    return np.asarray(out, dtype=np.int64)


class BatchIndices(list):
    """The item indices of one batch (a ``list`` of ``int``) with the epoch they were drawn in (``.epoch``).

    What :class:`SamplerBatches` hands its ``fetch``: code that treats it as a list keeps working, and a
    dataset with per-epoch randomness (frame choice, augmentation) reads ``.epoch`` instead of being told with
    ``set_epoch()`` (which never reaches a loader's worker processes). Pickles with its epoch.
    """

    def __init__(self, indices: Any = (), *, epoch: int = 0) -> None:
        super().__init__(indices)
        self.epoch = epoch

    def __repr__(self) -> str:
        return f"BatchIndices({list(self)!r}, epoch={self.epoch})"


class SamplerBatches:
    """Batches of ``fetch(indices)`` over a :class:`ResumableSampler` or :class:`ShardOrderSampler`, with a
    resumable position; optionally fetched by worker processes.

    ``indices`` is a :class:`BatchIndices` (a list of ints with ``.epoch``). Batches never straddle epochs;
    with ``drop_last`` the short tail of an epoch is skipped. Iterating yields the rest of the current epoch,
    and iterating again starts the next one.

    With ``num_workers == 0`` (the default) every batch is fetched in the calling thread when it is asked for,
    and the state is the sampler's. With ``num_workers > 0`` a ``torch.utils.data.DataLoader`` calls ``fetch``
    in that many worker processes, ``prefetch`` batches ahead per worker, handing batches out in the sampler's
    order (the workers are started the platform's default way: forked on Linux, where ``fetch`` may be a closure;
    elsewhere it must pickle); the workers live until :meth:`close` (iterating again
    for the next epoch starts no new process). Then:

    * ``state_dict()`` is the position of the batches *handed out* (each batch travels with the sampler's state
      after it), not of what the workers fetched ahead; ``load_state_dict()`` drops a live iteration and the
      next one continues from the loaded state;
    * the batches are the same as without workers when ``fetch`` depends only on ``indices`` and
      ``indices.epoch``; a worker's global RNGs are seeded by the loader, not the trainer, so ``fetch`` should
      draw its randomness from a generator seeded by (item, epoch);
    * iterating draws nothing from the global RNGs of this process (the loader gets its own generator, seeded
      with the sampler's seed);
    * an exception in ``fetch`` is raised here with its type and message (and the worker's traceback); a
      worker that dies raises ``RuntimeError`` naming its pid, from the iteration or, when torch's SIGCHLD
      handler notices first, from wherever the main thread is; with ``timeout_s > 0`` a batch that takes
      longer than that raises ``RuntimeError`` too; after any of these the workers are shut down and the next
      iteration starts new ones after the last batch handed out;
    * the workers ignore SIGINT and SIGTERM (a Ctrl-C or a pod's SIGTERM reaches the whole process group): the
      trainer handles the interruption and shuts them down;
    * workers need a writable ``/dev/shm`` (Linux): without one the first iteration raises ``RuntimeError``
      saying so, rather than a multiprocessing lock's ``OSError``;
    * ``pin_memory`` (CUDA only; ignored without CUDA) pins every tensor of a batch, whatever holds it (dicts,
      lists, tuples, dataclasses; see :func:`pin`), in the loader's pinning thread.
    """

    def __init__(
        self,
        sampler: ResumableSampler | ShardOrderSampler,
        fetch: Callable[[BatchIndices], Any],
        batch_size: int,
        *,
        drop_last: bool = True,
        num_workers: int = 0,
        prefetch: int = 2,
        pin_memory: bool = False,
        timeout_s: float = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_workers < 0 or prefetch < 1 or timeout_s < 0:
            raise ValueError(
                f"need num_workers >= 0, prefetch >= 1 and timeout_s >= 0 (0 = none), got {num_workers}, {prefetch}, "
                f"{timeout_s}"
            )
        self.sampler, self.fetch, self.batch_size, self.drop_last = sampler, fetch, batch_size, drop_last
        self.num_workers, self.prefetch, self.pin_memory, self.timeout_s = num_workers, prefetch, pin_memory, timeout_s
        self._loader: DataLoader | None = None
        self._state: dict[str, Any] | None = None  # the consumer's position while workers run ahead of the sampler
        self._generation = 0  # bumped by load_state_dict() and close(): an older live iteration stops

    def _keys(self, with_state: bool) -> Iterator[tuple[BatchIndices, dict[str, Any] | None]]:
        """The rest of the epoch's batches: ``(indices, the sampler's state after them or None)``."""
        buf, epoch = [], self.sampler.epoch
        for index in self.sampler:
            epoch = self.sampler.epoch  # the epoch being read (the sampler moves on after its last index)
            buf.append(index)
            if len(buf) == self.batch_size:
                yield BatchIndices(buf, epoch=epoch), self.sampler.state_dict() if with_state else None
                buf = []
        if buf and not self.drop_last:
            yield BatchIndices(buf, epoch=epoch), self.sampler.state_dict() if with_state else None

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers == 0:
            for indices, _ in self._keys(with_state=False):
                yield self.fetch(indices)
            return
        yield from self._from_workers()

    def _from_workers(self) -> Iterator[Any]:
        self._generation += 1
        generation = self._generation
        if self._state is None:
            self._state = self.sampler.state_dict()
        else:  # an earlier iteration stopped early: the workers had fetched ahead of what was handed out
            self.sampler.load_state_dict(self._state)
        if self._loader is None:
            self._loader = self._make_loader()
        batches = iter(self._loader)  # persistent workers: the same iterator, reset (what it prefetched dropped)
        while generation == self._generation:
            try:
                fetched = next(batches)
            except StopIteration:
                self._state = None  # the epoch is done and the sampler has moved to the next one
                return
            except BaseException as exc:
                try:  # a worker that died after sending a batch may surface as a broken connection: name it
                    dead = self._dead_workers(wait_s=2.0 if isinstance(exc, (OSError, EOFError)) else 0.0)
                finally:
                    self.close()  # at once: a dead worker must not make later SIGCHLDs raise; a rerun starts afresh
                if dead:
                    raise RuntimeError(f"{dead}; the batch it was fetching is lost") from exc
                raise
            self._state = fetched.state
            yield fetched.batch

    def _dead_workers(self, wait_s: float) -> str:
        """Which workers exited with an error (``""``: none), waiting up to ``wait_s`` for one to be seen dead."""
        workers = getattr(getattr(self._loader, "_iterator", None), "_workers", [])
        deadline = time.monotonic() + wait_s
        while True:
            dead = [
                f"DataLoader worker {i} (pid {w.pid}) exited unexpectedly with exit code {w.exitcode}"
                for i, w in enumerate(workers)
                if w.exitcode not in (None, 0)  # negative: killed by that signal
            ]
            if dead or time.monotonic() >= deadline:
                return ", ".join(dead)
            time.sleep(0.05)

    def _make_loader(self) -> DataLoader:
        if self.num_workers and sys.platform == "linux" and not os.access(SHARED_MEMORY, os.W_OK):
            raise RuntimeError(
                f"num_workers={self.num_workers}: loader workers hand batches over in shared memory, and "
                f"{SHARED_MEMORY} is not writable here; give the pod a memory-backed {SHARED_MEMORY} (shm_size in "
                "the pipeline config) or set num_workers: 0"
            )
        extra: dict[str, Any] = {"in_order": True} if "in_order" in inspect.signature(DataLoader).parameters else {}
        return DataLoader(
            _FetchDataset(self.fetch),
            batch_size=None,
            sampler=_BatchKeys(self),
            num_workers=self.num_workers,
            collate_fn=_as_is,
            pin_memory=self.pin_memory and torch.cuda.is_available(),
            timeout=self.timeout_s,
            persistent_workers=True,
            prefetch_factor=self.prefetch,
            generator=torch.Generator().manual_seed(self.sampler.seed),  # never the global RNG: runs stay exact
            worker_init_fn=_ignore_interruptions,
            **extra,
        )

    def state_dict(self) -> dict[str, Any]:
        """The position of the batches handed out (JSON-able; the sampler's state format)."""
        return dict(self._state) if self._state is not None else self.sampler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (a live iteration stops; the next one starts there)."""
        self.sampler.load_state_dict(state)
        self._state, self._generation = None, self._generation + 1

    def close(self) -> None:
        """Shut the worker processes down (if any); the position is kept and a later iteration starts new ones."""
        loader, self._loader = self._loader, None
        self._generation += 1
        iterator = getattr(loader, "_iterator", None)
        if iterator is None or not hasattr(iterator, "_shutdown_workers"):
            return
        if getattr(iterator, "_worker_pids_set", False):
            # torch's SIGCHLD handler raises for any registered worker that died, also while the others exit here
            torch.utils.data._utils.signal_handling._remove_worker_pids(id(iterator))
            iterator._worker_pids_set = False
        iterator._shutdown_workers()


class _BatchKeys:
    """The loader's sampler: one epoch of ``(indices, state after them)`` keys from a :class:`SamplerBatches`."""

    def __init__(self, batches: SamplerBatches) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[tuple[BatchIndices, dict[str, Any] | None]]:
        return self.batches._keys(with_state=True)


class _Fetched:
    """A worker's result: the batch and the sampler state after it; pinnable whatever the batch is."""

    def __init__(self, batch: Any, state: dict[str, Any]) -> None:
        self.batch, self.state = batch, state

    def pin_memory(self, device: Any = None) -> _Fetched:
        return _Fetched(pin(self.batch), self.state)


class _FetchDataset(Dataset):
    """What a worker runs: ``(indices, state)`` -> :class:`_Fetched` ``(fetch(indices), state)``."""

    def __init__(self, fetch: Callable[[BatchIndices], Any]) -> None:
        self.fetch = fetch

    def __getitem__(self, key: tuple[BatchIndices, dict[str, Any]]) -> _Fetched:
        indices, state = key
        return _Fetched(self.fetch(indices), state)


def _ignore_interruptions(worker_id: int) -> None:
    """In a loader worker: ignore SIGINT and SIGTERM. Ctrl-C and a pod's SIGTERM reach the whole process group; the
    trainer alone decides what an interruption means (its checkpoint, its message, its exit code) and shuts the
    workers down itself. Were the workers to die of the signal first, torch's SIGCHLD handler would report a
    worker failure instead of the interruption. A worker whose trainer is gone exits on its own (torch's
    watchdog notices the parent's death)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.excepthook = _quiet_when_the_trainer_hangs_up(sys.excepthook)


def _quiet_when_the_trainer_hangs_up(fallback: Any) -> Any:
    """A worker hands each batch's shared memory to the trainer as a file descriptor, from a thread of
    ``multiprocessing.resource_sharer``. A trainer interrupted mid-handover closes its end, the send fails with an
    ``OSError``, and that thread prints the traceback through ``sys.excepthook``: noise after an interruption the
    trainer reports in one line. Only that failure is dropped; anything else goes to ``fallback``."""

    def hook(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        frames = traceback.extract_tb(tb)
        if issubclass(kind, OSError) and any(f.filename.endswith("resource_sharer.py") for f in frames):
            return
        fallback(kind, error, tb)

    return hook


def _as_is(fetched: Any) -> Any:
    """The loader's ``collate_fn``: a batch is already made by ``fetch``."""
    return fetched


# --------------------------------------------------------------------------- metrics


class MetricsLogger(Protocol):
    """Where training metrics go (a JSONL file now; MLflow implements the same two methods)."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_params(self, params: dict[str, Any]) -> None: ...


class JsonlMetricsLogger:
    """One JSON object per line: ``{"step": s, "train/loss": ...}`` or ``{"params": {...}}``.

    Local files are appended to; on ``s3://`` (no appends) the whole file is rewritten atomically on
    every call, which is fine for the few thousand lines of a run. :func:`train` calls :meth:`rewind`
    before it logs, so the file holds each step once, also after a resume (read it with
    :func:`vlp.tracking.read_metrics`).
    """

    def __init__(self, uri: str) -> None:
        self.uri = str(uri)
        self._lines: list[str] = []
        if storage.is_s3(self.uri) and storage.exists(self.uri):
            self._lines = storage.read_text(self.uri).splitlines()

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True)
        if storage.is_s3(self.uri):
            self._lines.append(line)
            storage.write_text(self.uri, "\n".join(self._lines) + "\n")
            return
        Path(self.uri).parent.mkdir(parents=True, exist_ok=True)
        with open(self.uri, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._write({"step": int(step), **{k: float(v) for k, v in metrics.items()}})

    def log_params(self, params: dict[str, Any]) -> None:
        self._write({"params": json.loads(json.dumps(params, default=str))})

    def rewind(self, step: int) -> None:
        """Drop the lines of the steps after ``step``: a resume from checkpoint ``step`` logs them again.

        ``step == 0`` (training from the start) empties the file, params included. A line cut short by a
        kill is dropped too (it was being written after the last checkpoint).
        """
        if not storage.exists(self.uri):
            self._lines = []
            return
        kept = []
        for line in storage.read_text(self.uri).splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                record = json.loads(line)
                if (
                    step > 0
                    and isinstance(record, dict)
                    and ("params" in record or int(record.get("step", step + 1)) <= step)
                ):
                    kept.append(line)
        if storage.is_s3(self.uri):
            self._lines = kept
        storage.write_text(self.uri, "".join(f"{line}\n" for line in kept))  # atomic on both backends


# --------------------------------------------------------------------------- config and result


@dataclass
class TrainConfig(LoopSettings):
    """How long to train, how often to log and checkpoint (:class:`vlp.settings.LoopSettings`, a config
    section's part), where to write and what the run is called."""

    out_dir: str = ""  # local path or s3:// URI; checkpoints go to <out_dir>/checkpoints
    max_steps: int = 1000  # optimiser updates of the whole run (the LR schedule spans them)
    ckpt_every: int = 0  # updates between checkpoints; 0: only at the end
    name: str = "train"  # what the progress display calls the run (e.g. the step: "pretrain")

    @classmethod
    def of(cls, section: LoopSettings, out_dir: str, name: str = "train") -> TrainConfig:
        """The loop settings of a config section (any :class:`LoopSettings`, e.g. ``cfg.pretrain``) as they are."""
        return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(LoopSettings)}, out_dir=out_dir,
                   name=name)  # fmt: skip

    def __post_init__(self) -> None:
        if not self.out_dir:
            raise ValueError("TrainConfig.out_dir is required (a local directory or an s3:// URI)")
        for name in ("max_steps", "grad_accum", "log_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.ckpt_every < 0:
            raise ValueError(f"TrainConfig.ckpt_every must be >= 0 (0 = only at the end), got {self.ckpt_every}")


class TrainingInterrupted(KeyboardInterrupt):
    """:func:`train` was interrupted (Ctrl-C, or a signal turned into a ``KeyboardInterrupt``) during its updates.

    ``step`` is the optimiser updates done when it stopped; ``resume_step`` the step of the newest complete
    checkpoint under ``<out_dir>/checkpoints`` (0 when there is none), where a rerun resumes; ``signum`` the
    signal's number (the interrupting exception's ``signum`` attribute, else ``SIGINT``'s).
    """

    def __init__(self, step: int, resume_step: int, checkpoint: str | None, signum: int) -> None:
        super().__init__(f"interrupted at step {step}; a rerun resumes from step {resume_step}")
        self.step, self.resume_step, self.checkpoint, self.signum = step, resume_step, checkpoint, signum


@dataclass
class TrainResult:
    """What a call of :func:`train` did."""

    step: int  # optimiser updates done in total (== max_steps unless interrupted)
    start_step: int  # where this call started (> 0 after a resume)
    resumed_from: str | None  # checkpoint URI resumed from
    checkpoint: str | None  # last checkpoint written
    last_metrics: dict[str, float] = field(default_factory=dict)
    tracking: dict[str, Any] = field(default_factory=dict)  # set by callers that track: what reached MLflow


# --------------------------------------------------------------------------- helpers


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and CUDA) global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def move_to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor (inside dicts, lists, tuples, dataclasses) moved to ``device``."""
    return _map_tensors(batch, lambda t: t.to(device, non_blocking=True))


def pin(batch: Any) -> Any:
    """``batch`` with every tensor (inside dicts, lists, tuples, dataclasses) in pinned memory (needs CUDA)."""
    return _map_tensors(batch, lambda t: t.pin_memory())


def _map_tensors(batch: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(batch, Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: _map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_map_tensors(v, fn) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map_tensors(v, fn) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(
            batch, **{f.name: _map_tensors(getattr(batch, f.name), fn) for f in dataclasses.fields(batch) if f.init}
        )
    return batch


def batch_size_of(batch: Any) -> int:
    """Leading dimension of the first tensor found in ``batch`` (0 when there is none): the clip count."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    values: Any = ()
    if isinstance(batch, Mapping):
        values = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        values = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    for value in values:
        n = batch_size_of(value)
        if n:
            return n
    return 0


def _memory_metrics(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        return {"train/peak_mem_mb": torch.cuda.max_memory_allocated(device) / 2**20}
    return {"train/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # Linux: KiB


def enable_grad_checkpointing(model: nn.Module, enable: bool = True) -> int:
    """Recompute activations in the backward pass wherever ``model`` has a part that can: a transformers
    ``PreTrainedModel`` (``activation_checkpointing_enable``, non-reentrant), a timm-style ``set_grad_checkpointing``,
    or a tower with a ``grad_checkpointing`` switch (vlp's text, fusion and cross-attention stacks). The results
    and gradients do not change (the recomputation replays the RNG state); the memory of the activations does.
    ``enable=False`` turns it off again in the same parts.

    Returns:
        How many parts were switched; with none, a warning says training goes on without.
    """
    switched, inside = 0, set()
    for module in model.modules():
        if id(module) in inside:  # below a part already switched: it checkpoints its own layers
            continue
        hf_on = getattr(module, "activation_checkpointing_enable", None)
        hf_off = getattr(module, "activation_checkpointing_disable", None)
        timm = getattr(module, "set_grad_checkpointing", None)
        if callable(hf_on) and callable(hf_off):
            if enable:
                hf_on(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                hf_off()
        elif callable(timm):
            timm(enable)
        elif isinstance(getattr(module, "grad_checkpointing", None), bool):
            setattr(module, "grad_checkpointing", enable)  # noqa: B010 (an attribute mypy sees as a submodule)
        else:
            continue
        switched += 1
        inside |= {id(m) for m in module.modules()}
    if not switched and enable:
        warnings.warn(f"grad_checkpointing requested but no part of {type(model).__name__} can recompute its "
                      "activations; training without it", stacklevel=3)  # fmt: skip
    return switched


# a transformer block of any family: TimeSformer's and ViT's ``blocks.<i>``, the text / fusion / cross-attention
# stacks' and CLIP's ``layers.<i>``
BLOCK_NAME = re.compile(r"(^|\.)(blocks|layers)\.\d+$")


def compile_unavailable(device: torch.device) -> str:
    """Why ``torch.compile`` cannot run on ``device`` here ("" when it can): a small function is compiled and run,
    which needs the whole tool chain (Dynamo, Inductor, on the CPU a C++ compiler)."""
    try:
        probe = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2.0 + 1.0, dynamic=False)
        probe(torch.ones(8, device=device))
    except Exception as exc:
        cause = getattr(exc, "inner_exception", None) or exc  # Dynamo wraps the backend's error
        lines = [line for line in str(cause).splitlines() if line.strip()]
        said = lines[0].strip() if lines else ""
        name = type(cause).__name__
        return said if said.startswith(name) else f"{name}: {said}"
    return ""


COMPILE_RECOMPILE_LIMIT = 32  # compiled variants per block (grad mode x train/eval x batch sizes x precision)


def compile_blocks(model: nn.Module, what: str = "training") -> int:
    """Compile every transformer block of ``model`` in place with ``torch.compile`` (``nn.Module.compile``: the
    parameters, their names and the state dict stay as they are, so checkpoints and model directories do not
    change). One block at a time, not the whole step: the blocks of a stack share one compiled graph, so compiling
    costs a few graphs, and the losses, gathers and random draws between blocks run as they are. Dropout inside a
    block draws from torch's generator as the eager block does (Inductor's ``fallback_random``), so a seed gives
    the same masks and a resume stays exact. A batch of another size (an epoch's last) compiles once more, with
    the batch dimension dynamic. Each block may compile up to :data:`COMPILE_RECOMPILE_LIMIT` variants (torch's
    default, 8, is reached by a block that runs with and without gradients, in train and eval mode, at several
    batch sizes and in both precisions; past the limit Dynamo logs a warning and runs those calls eagerly).

    Where ``torch.compile`` cannot run (:func:`compile_unavailable`), a warning names why and ``model`` runs
    eagerly.

    Returns:
        How many blocks were compiled.
    """
    device = next(model.parameters()).device
    why = compile_unavailable(device)
    if why:
        warnings.warn(f"compile requested but torch.compile does not work here ({why}); {what} runs eagerly",
                      stacklevel=2)  # fmt: skip
        return 0
    import torch._inductor.config as inductor

    inductor.fallback_random = True
    compiled: list[str] = []
    for name, module in model.named_modules():
        if BLOCK_NAME.search(name) and not any(name.startswith(done + ".") for done in compiled):
            module.compile(recompile_limit=COMPILE_RECOMPILE_LIMIT)
            compiled.append(name)
    if not compiled:
        warnings.warn(f"compile requested but {type(model).__name__} has no transformer block to compile; {what} "
                      "runs eagerly", stacklevel=2)  # fmt: skip
    return len(compiled)


# --------------------------------------------------------------------------- the loop


class _Run:
    """State of one :func:`train` call; each method is one phase of an update."""

    def __init__(self, model: nn.Module, step_fn: StepFn, data: Any, cfg: TrainConfig, optim_cfg: OptimConfig) -> None:
        self.model, self.step_fn, self.data, self.cfg, self.optim_cfg = model, step_fn, data, cfg, optim_cfg
        self.rank, self.world = distributed.rank(), distributed.world_size()
        self.device = next(model.parameters()).device
        self.autocast = {"cpu": cfg.cpu_bf16, "cuda": cfg.bf16}.get(self.device.type, False)
        self.optimizer = build_optimizer(model, optim_cfg)
        self.scheduler = build_scheduler(self.optimizer, optim_cfg, cfg.max_steps)
        self.ckpt_root = storage.join(cfg.out_dir, "checkpoints")
        self.step, self.last_lr = 0, float("nan")
        self.iterator: Iterator[Any] | None = None
        self.identity: dict[str, str] = {}
        self.last_metrics: dict[str, float] = {}  # the newest logged metrics (restored on resume)
        self.sums: dict[str, Tensor] = {}
        self.window_micro, self.window_clips, self.window_start = 0, 0, time.perf_counter()

    def resume(self) -> str | None:
        """Load the newest intact checkpoint (all ranks), if any; returns its URI.

        A damaged checkpoint (a truncated or unreadable file) is skipped with a warning that names the file,
        and the previous one is tried; nothing is restored from a damaged one.

        Raises:
            CheckpointError: the checkpoint records another ``identity`` value (e.g. another tokenizer), or
                every checkpoint under ``<out_dir>/checkpoints`` is damaged.
        """
        found = [uri for _, uri in reversed(list_checkpoints(self.ckpt_root))]
        damaged: list[str] = []
        for uri in found:
            try:
                self._check_identity(uri, self.identity)
                loaded = load_checkpoint(uri, self.model, self.optimizer, self.scheduler, rank=self.rank)
            except DamagedCheckpointError as exc:
                damaged.append(str(exc))
                continue
            if damaged:
                bad = "; ".join(damaged)
                warnings.warn(f"skipped the damaged checkpoint: {bad}; resumed from {uri}", stacklevel=3)
            self._restore_position(uri, loaded)
            return uri
        if damaged:
            raise DamagedCheckpointError(
                f"every checkpoint under {self.ckpt_root} is damaged ({'; '.join(damaged)}); delete them to "
                "train from the start"
            )
        return None

    @staticmethod
    def _check_identity(uri: str, identity: Mapping[str, str]) -> None:
        recorded = read_state(uri)["extra"].get("identity", {})
        for key, value in identity.items():
            if key in recorded and recorded[key] != value:
                raise CheckpointError(
                    f"{storage.join(uri, STATE_FILE)} was trained with {key}={recorded[key]} but this run has "
                    f"{key}={value}; resuming would feed it other inputs. Restore what it was trained with, or "
                    "train into a new output directory"
                )

    def _restore_position(self, uri: str, loaded: Any) -> None:
        self.last_metrics = dict(loaded.extra.get("last_metrics", {}))
        if loaded.data_state is not None:
            if not hasattr(self.data, "load_state_dict"):
                raise ValueError(f"{uri} records a data position but the data source has no load_state_dict()")
            self.data.load_state_dict(loaded.data_state)
        elif hasattr(self.data, "load_state_dict"):
            warnings.warn(f"{uri} has no data position; the data restarts from its current state", stacklevel=4)
        self.step = loaded.step

    def next_batch(self) -> Any:
        """Next batch; a finished pass over ``data`` starts the next epoch."""
        for _ in range(2):
            if self.iterator is None:
                self.iterator = iter(self.data)
            try:
                return next(self.iterator)
            except StopIteration:
                self.iterator = None
        raise ValueError("the data source yielded no batch for a whole epoch (empty dataset, or batch > dataset?)")

    def update(self, ddp_model: nn.Module) -> Tensor:
        """One optimiser update over ``grad_accum`` micro-batches; returns the pre-clip gradient norm."""
        accum = self.cfg.grad_accum
        for micro in range(accum):
            batch = move_to_device(self.next_batch(), self.device)
            self.window_clips += batch_size_of(batch)
            # DDP all-reduces the gradients on the last micro-batch only
            ddp = ddp_model if isinstance(ddp_model, nn.parallel.DistributedDataParallel) else None
            with ddp.no_sync() if ddp is not None and micro < accum - 1 else contextlib.nullcontext():
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                    outputs = self.step_fn(ddp_model, batch)
                if "loss" not in outputs:
                    raise KeyError(f"step_fn must return a 'loss' entry; it returned {sorted(outputs)}")
                loss = outputs["loss"]
                if not isinstance(loss, Tensor):
                    raise TypeError(f"step_fn's 'loss' must be a tensor (it is backpropagated), got {type(loss)}")
                (loss / accum).backward()
            for key, value in outputs.items():
                value = torch.as_tensor(value).detach().to(self.device, torch.float64)  # exact sums for logging
                self.sums[key] = self.sums.get(key, 0) + value
            self.window_micro += 1
        grad_norm = clip_gradients(self.model.parameters(), self.optim_cfg.grad_clip)
        self.last_lr = float(self.scheduler.get_last_lr()[0])  # the lr this update uses
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return grad_norm

    def metrics(self, grad_norm: Tensor) -> dict[str, float]:
        """Window averages (over micro-batches and ranks), lr, grad norm, clips/s, memory; resets the window."""
        means = {f"train/{k}": distributed.all_reduce_mean(v / self.window_micro).item() for k, v in self.sums.items()}
        if not math.isfinite(means["train/loss"]):
            raise FloatingPointError(f"non-finite training loss {means['train/loss']} at step {self.step}")
        elapsed = max(time.perf_counter() - self.window_start, 1e-9)
        means |= {
            "train/lr": self.last_lr,
            "train/grad_norm": float(grad_norm),
            "train/clips_per_s": self.window_clips * self.world / elapsed,
        } | _memory_metrics(self.device)
        self.sums, self.window_micro, self.window_clips, self.window_start = {}, 0, 0, time.perf_counter()
        return means

    def checkpoint(self) -> str:
        """Every rank saves its RNG, then rank 0 the rest (``state.json`` last)."""
        if self.rank != 0:
            save_rank_rng(self.ckpt_root, self.step, self.rank)
        distributed.barrier()
        data_state = self.data.state_dict() if hasattr(self.data, "state_dict") else None
        extra = {
            "train_config": dataclasses.asdict(self.cfg),
            "optim_config": dataclasses.asdict(self.optim_cfg),
            "identity": self.identity,
            "last_metrics": self.last_metrics,
        }
        uri = ""
        if self.rank == 0:
            uri = save_checkpoint(
                self.ckpt_root, self.step, self.model, self.optimizer, self.scheduler, None, data_state, extra,
                world_size=self.world, keep_last=self.cfg.keep_last,
            )  # fmt: skip
        distributed.barrier()
        return uri


def train(
    model: nn.Module,
    step_fn: StepFn,
    data: Any,
    cfg: TrainConfig,
    optim_cfg: OptimConfig | None = None,
    *,
    metrics_logger: MetricsLogger | None = None,
    resume: bool = True,
    identity: Mapping[str, str] | None = None,
) -> TrainResult:
    """Train ``model`` for ``cfg.max_steps`` optimiser updates (see the module docstring for the contracts).

    Args:
        model: The unwrapped model, already on its device (``cuda:local_rank`` under torchrun).
        step_fn: ``step_fn(model, batch) -> {"loss": ..., other named scalars}``.
        data: Iterable of batches, ideally with ``state_dict()/load_state_dict()`` (exact resume).
        cfg: Loop settings.
        optim_cfg: AdamW / schedule / clipping settings (defaults: :class:`OptimConfig`).
        metrics_logger: Receives metrics on rank 0; default: JSONL at ``<out_dir>/metrics.jsonl``. One with a
            ``rewind(step)`` method is rewound to the step training starts from before anything is logged.
        resume: Continue from the newest complete checkpoint under ``<out_dir>/checkpoints`` if any.
        identity: What the weights are only valid with (e.g. ``{"tokenizer_sha256": ...}``): recorded in every
            checkpoint; a resume from a checkpoint that recorded another value raises ``CheckpointError``.

    Returns:
        :class:`TrainResult` with the final step, the checkpoints involved and the last logged metrics (after
        a resume that had nothing left to do: those recorded in the checkpoint).
    """
    optim_cfg = optim_cfg or OptimConfig()
    seed_everything(cfg.seed + distributed.rank())
    if cfg.grad_checkpointing:
        enable_grad_checkpointing(model)
    if cfg.compile:
        compile_blocks(model)
    run = _Run(model, step_fn, data, cfg, optim_cfg)
    run.identity = dict(identity or {})
    resumed_from = run.resume() if resume else None
    start = run.step
    logger = metrics_logger
    if logger is None and run.rank == 0:
        logger = JsonlMetricsLogger(storage.join(cfg.out_dir, "metrics.jsonl"))
    if logger is not None and run.rank == 0 and hasattr(logger, "rewind"):
        logger.rewind(start)  # the steps after the checkpoint are logged again below: keep each step once
    if logger is not None and run.rank == 0 and resumed_from is None:
        logger.log_params({"train": dataclasses.asdict(cfg), "optim": dataclasses.asdict(optim_cfg)})
    # no buffer broadcast: every rank keeps its buffers equal by construction (ALBEF's queues are written from
    # gathered features; 2 x 256 x 65,536 floats would be copied from rank 0 at every forward otherwise)
    ddp_model = distributed.wrap_ddp(model, broadcast_buffers=False)
    model.train()
    result = TrainResult(start, start, resumed_from, resumed_from, dict(run.last_metrics))
    if resumed_from is not None and run.rank == 0:
        said = "nothing left to train" if start >= cfg.max_steps else f"training to step {cfg.max_steps}"
        print(f"{cfg.name}: resuming from step {start} ({resumed_from}); {said}", file=sys.stderr, flush=True)
    progress = _Progress(cfg, start, run.rank)
    try:
        while run.step < cfg.max_steps:
            grad_norm = run.update(ddp_model)
            if run.step % cfg.log_every == 0 or run.step == cfg.max_steps:
                result.last_metrics = run.last_metrics = run.metrics(grad_norm)
                if logger is not None and run.rank == 0:
                    logger.log_metrics(result.last_metrics, run.step)
                progress.logged(run.step, result.last_metrics)
            if (cfg.ckpt_every and run.step % cfg.ckpt_every == 0) or run.step == cfg.max_steps:
                result.checkpoint = run.checkpoint() or result.checkpoint
            progress.update()
    except KeyboardInterrupt as exc:
        progress.close()
        resume_step, newest = _newest_checkpoint(run.ckpt_root, result.checkpoint)
        signum = int(getattr(exc, "signum", signal.SIGINT))
        raise TrainingInterrupted(run.step, resume_step, newest, signum) from exc
    finally:
        close = getattr(data, "close", None)
        if callable(close):
            close()  # e.g. SamplerBatches' worker processes: none outlives the training
    progress.close()
    result.step = run.step
    return result


def _newest_checkpoint(root: str, known: str | None) -> tuple[int, str | None]:
    """``(step, uri)`` of the newest complete checkpoint under ``root`` (``(0, None)``: none); when it cannot be
    listed, ``known`` (the one this run wrote or resumed from last)."""
    try:
        found = list_checkpoints(root)
    except Exception:  # e.g. an unreachable bucket: say what this run knows
        return (checkpoint_step(known), known) if known else (0, None)
    return found[-1] if found else (0, None)


def format_duration(seconds: float) -> str:
    """``512`` -> ``"8m32s"``, ``7384`` -> ``"2h03m"``, ``9.4`` -> ``"9s"``."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def progress_line(name: str, step: int, max_steps: int, metrics: Mapping[str, float], sec_per_step: float) -> str:
    """One log-friendly progress line, e.g. ``pretrain step 40/200 (20%) loss 2.3100 lr 1.0e-04 3.2 s/it eta
    8m32s`` (the loss and lr are the logged window's, s/it the mean wall time per update since the last line)."""
    parts = [f"{name} step {step}/{max_steps} ({100 * step // max_steps}%)"]
    if "train/loss" in metrics:
        parts.append(f"loss {metrics['train/loss']:.4f}")
    if "train/lr" in metrics:
        parts.append(f"lr {metrics['train/lr']:.1e}")
    parts.append(f"{sec_per_step:.3g} s/it eta {format_duration(sec_per_step * (max_steps - step))}")
    return " ".join(parts)


class _Progress:
    """Rank 0's progress display: a tqdm bar when stderr is a terminal, else :func:`progress_line` at every logged
    step; nothing with ``cfg.progress`` false or on other ranks."""

    def __init__(self, cfg: TrainConfig, start: int, rank: int) -> None:
        self.name, self.max_steps = cfg.name, cfg.max_steps
        show = cfg.progress and rank == 0
        self.lines = show and not _stderr_is_tty()
        self.bar = None
        if show and not self.lines:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=cfg.max_steps, initial=start, desc=cfg.name, unit="step")
        self.since_step, self.since = start, time.perf_counter()

    def logged(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{metrics['train/loss']:.4f}", refresh=False)
        if self.lines:
            now = time.perf_counter()
            per_step = (now - self.since) / max(step - self.since_step, 1)
            self.since_step, self.since = step, now
            print(progress_line(self.name, step, self.max_steps, metrics, per_step), file=sys.stderr, flush=True)

    def update(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
