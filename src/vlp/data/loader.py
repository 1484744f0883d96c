"""Training and evaluation batches with an exact position: the samplers, the loader workers, and the loaders the
steps build from a config section.

:class:`ResumableSampler` (one global permutation per epoch, optionally in groups) and :class:`ShardOrderSampler`
(shard by shard, a shuffle buffer within) know where they are, so a resumed run draws exactly the batches an
uninterrupted one would; :class:`SamplerBatches` builds each batch with ``fetch(indices)`` in loader workers (or on
the calling thread) and keeps that position across worker restarts. :func:`training_batches` and
:func:`ordered_batches` give a step its loader from a section's settings (``order``, ``shuffle_buffer``,
``num_workers``, ``prefetch``). Nothing here trains: the loop (:mod:`vlp.train.loop`) saves and restores the
position with its checkpoints, the evaluations and the clip index read batches in order.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import signal
import sys
import time
import traceback
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from vlp import distributed
from vlp.distributed import device

# --------------------------------------------------------------------------- batches of tensors


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


# --------------------------------------------------------------------------- the steps' loaders


def training_batches(
    section: Any,
    data: Any,
    fetch: Callable[[Any], Any],
    batch_size: int,
    *,
    groups: Any = None,
    group_fraction: float = 1.0,
    group_epochs: int = 0,
) -> Any:
    """Resumable training batches of ``fetch(indices)`` over ``data``'s pairs, with the loader settings of a
    training ``section`` (``pretrain``, ``retrieval``, ``qa``): the epoch order (``order``, ``shuffle_buffer``;
    ``groups`` for grouped batches, global order only), ``num_workers`` loader processes with ``prefetch``
    batches each, and pinned memory on CUDA. ``data``'s epoch is set to the batch's before ``fetch`` runs (in
    whichever process runs it), and ``fetch`` must build every item from its index and that epoch alone, so that
    the batches are the same with any number of workers."""

    def fetch_epoch(indices: Any) -> Any:  # each epoch draws new frames and augmentations, in whichever process
        data.set_epoch(indices.epoch)
        return fetch(indices)

    if section.order == "shards":
        if groups is not None:
            raise ValueError("grouped batches (pretrain.group_by) need pretrain.order=global")
        shards = data.store.shard_of([video_id for video_id, _ in data.pairs])
        sampler: Any = ShardOrderSampler(shards, seed=section.seed, shuffle_buffer=section.shuffle_buffer)
    else:
        sampler = ResumableSampler(
            len(data), seed=section.seed, groups=groups, group_batch=batch_size if groups is not None else 0,
            group_fraction=group_fraction, group_epochs=group_epochs,
        )  # fmt: skip
    return _loader(sampler, fetch_epoch, batch_size, section, drop_last=True)


def ordered_batches(count: int, build: Callable[[Any], Any], batch_size: int, section: Any) -> Any:
    """``build(indices)`` for consecutive chunks of ``range(count)``, in order (the last one short), built by the
    ``section``'s loader workers ahead of the caller: the evaluation loops. Iterate it once."""
    sampler = ResumableSampler(count, shuffle=False, rank=0, world_size=1)
    batches = _loader(sampler, build, batch_size, section, drop_last=False)
    try:
        yield from batches
    finally:
        batches.close()


def _loader(sampler: Any, fetch: Callable[[Any], Any], batch_size: int, section: Any, *, drop_last: bool) -> Any:
    if section.num_workers > 0:  # the tokenizers' thread pool does not survive a fork: keep it single-threaded
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return SamplerBatches(
        sampler, fetch, batch_size, drop_last=drop_last, num_workers=section.num_workers, prefetch=section.prefetch,
        pin_memory=device().type == "cuda",
    )  # fmt: skip
