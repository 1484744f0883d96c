"""Atomic, resumable training checkpoints that never need unpickling to load.

A checkpoint is a directory ``<root>/step-000100/`` (local path or ``s3://`` URI) holding:

``model.safetensors``        the model ``state_dict`` (parameters and persistent buffers).
``optimizer.safetensors``    every tensor of the optimiser state (``state.<param id>.<key>``); the rest
                             of ``optimizer.state_dict()`` (param groups, non-tensor state values) is
                             JSON in the file's safetensors metadata under ``"structure"``.
``rng-rank00000.safetensors`` one per rank: torch CPU (and current CUDA device) generator states (uint8);
                             Python's ``random`` and NumPy's global state as JSON in the metadata.
``state.json``               step, scheduler state, data position, world size, caller's ``extra``.

Every file is written through :func:`vlp.storage.write_bytes` (atomic on both backends) and
``state.json`` is written *last*: a directory counts as a checkpoint only when it has one, so a
save interrupted half-way is invisible to :func:`latest_checkpoint`. Loading reads JSON and
safetensors only (no ``torch.load``, no ``pickle``), so a checkpoint from an untrusted bucket
cannot run code. Tuples survive the JSON round trip (encoded as ``{"__tuple__": [...]}``), so
a restored optimiser state dict equals the saved one.

Under DDP every rank calls :func:`save_rank_rng` for its own generator states, the ranks meet at
a barrier, then rank 0 alone calls :func:`save_checkpoint` (model and optimiser are identical on
every rank). The training loop in :mod:`vlp.train.loop` does exactly that.
"""

from __future__ import annotations

import json
import math
import random
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from safetensors.torch import save as st_save
from torch import Tensor, nn

from vlp import storage
from vlp.weights import (  # the weights file is shared with model directories; re-exported for the loop's callers
    MODEL_FILE,
    CheckpointError,
    DamagedCheckpointError,
    load_model_weights,
    load_pretrained_weights,
    read_model_weights,
    read_safetensors,
    save_model_weights,
    tensors_for_safetensors,
    unwrap,
)

__all__ = [
    "FORMAT",
    "MODEL_FILE",
    "OPTIM_FILE",
    "STATE_FILE",
    "CheckpointError",
    "DamagedCheckpointError",
    "LoadedCheckpoint",
    "NonFiniteCheckpointError",
    "RngState",
    "all_finite",
    "capture_rng_state",
    "checkpoint_dir",
    "checkpoint_step",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_model_weights",
    "load_pretrained_weights",
    "nonfinite_names",
    "prune_checkpoints",
    "read_model_weights",
    "read_state",
    "refuse_output_links",
    "restore_rng_state",
    "rng_file",
    "save_checkpoint",
    "save_model_weights",
    "save_rank_rng",
]

FORMAT = "vlp-checkpoint-v1"
STATE_FILE = "state.json"
OPTIM_FILE = "optimizer.safetensors"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_KERNEL_KEYS = ("foreach", "fused", "capturable", "differentiable")  # how an optimiser runs, not what it holds


class NonFiniteCheckpointError(DamagedCheckpointError):
    """A checkpoint's weights or optimiser state hold a NaN or an infinity (the message names the file and tensors):
    no run can continue from it, so it is skipped or refused as a damaged file is."""


@dataclass
class RngState:
    """Every global random generator a training step may draw from."""

    python: Any  # random.getstate(): (version, tuple of 625 ints, gauss_next)
    numpy: Any  # np.random.get_state(): ("MT19937", uint32 array (624,), pos, has_gauss, cached_gaussian)
    torch_cpu: Tensor  # (N,) uint8
    torch_cuda: list[Tensor] = field(default_factory=list)  # [] or [(N,) uint8] of the current CUDA device


@dataclass
class LoadedCheckpoint:
    """What :func:`load_checkpoint` found besides the objects it restored in place."""

    uri: str
    step: int
    data_state: Any
    extra: dict[str, Any]
    world_size: int


def checkpoint_dir(root: str, step: int) -> str:
    """``<root>/step-000123`` (zero-padded to 6 digits so names sort by step)."""
    return storage.join(root, f"step-{step:06d}")


def checkpoint_step(uri: str) -> int:
    """The step of checkpoint directory ``uri`` (``.../step-000123`` -> 123).

    Raises:
        CheckpointError: ``uri`` is not named like a checkpoint directory.
    """
    match = _STEP_DIR.match(str(uri).rstrip("/").rsplit("/", 1)[-1])
    if match is None:
        raise CheckpointError(f"{uri} is not a checkpoint directory (expected a name like step-000123)")
    return int(match.group(1))


def rng_file(rank: int) -> str:
    """File name of rank ``rank``'s generator states inside a checkpoint directory."""
    return f"rng-rank{rank:05d}.safetensors"


# --------------------------------------------------------------------------- what may be read and written


def all_finite(tensors: Iterable[Tensor]) -> Tensor:
    """0-d bool tensor, True when no floating tensor of ``tensors`` holds a NaN or an infinity (False: one may).

    One reduction per call on CUDA (``torch._foreach_norm`` with ``ord=inf``, one fused kernel: a NaN or an infinity
    survives a max of ``|x|`` and no finite value overflows it). On the CPU, where that runs tensor by tensor with a
    scalar kernel, one vectorised sum per tensor instead: a NaN or an infinity survives a sum, but finite values
    summing past the float range read False too, so a False is confirmed with :func:`nonfinite_names`. The result
    stays on the tensors' device: the caller decides when to wait for it.
    """
    floats = [t for t in tensors if t.is_floating_point()]
    if not floats:
        return torch.tensor(True)
    with torch.no_grad():
        if floats[0].device.type == "cuda":
            peaks = torch.stack(torch._foreach_norm(floats, math.inf))  # (N,)
        else:
            peaks = torch.stack([t.sum() for t in floats])  # (N,)
        return peaks.isfinite().all()


def nonfinite_names(tensors: Mapping[str, Tensor]) -> list[str]:
    """The names of the floating tensors that hold a NaN or an infinity (exact, one tensor at a time: to confirm and
    say which, once :func:`all_finite` said that some may)."""
    return [name for name, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def _refuse_nonfinite(uri: str, tensors: Mapping[str, Tensor]) -> None:
    """Raise :class:`NonFiniteCheckpointError` when a floating tensor of ``tensors`` (read from file ``uri``) holds
    a NaN or an infinity."""
    bad = [] if bool(all_finite(tensors.values())) else nonfinite_names(tensors)
    if not bad:
        return
    shown = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "")
    raise NonFiniteCheckpointError(
        f"{uri} holds NaN or infinite values in {len(bad)} of {len(tensors)} tensors ({shown}): no run can continue "
        "from it"
    )


def refuse_output_links(out_dir: str) -> None:
    """Refuse a training output ``out_dir`` that holds a symbolic link anywhere below it: ``checkpoints/`` itself,
    a checkpoint's directory or any file in it, ``metrics.jsonl``. The readers of a model directory refuse one
    (:func:`vlp.storage.refuse_links`), so the loop applies that same rule before it reads a checkpoint to resume
    and before it writes one: it never reads or writes through a link, so nothing lands outside ``out_dir``.
    ``out_dir`` itself may be a link (the caller's own argument); on S3 there are no links.

    Raises:
        LinkError: naming the link and where it points.
    """
    storage.refuse_links(out_dir, "training output")


# --------------------------------------------------------------------------- RNG


def capture_rng_state() -> RngState:
    """Snapshot Python's, NumPy's, torch's CPU and (when CUDA is in use) the current CUDA device's generators.

    Only the current device is captured (under torchrun each rank drives ``cuda:local_rank``), and
    only when CUDA is already initialised, so a CPU run never creates CUDA contexts.
    """
    cuda = [torch.cuda.get_rng_state()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return RngState(random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)


def restore_rng_state(state: RngState) -> None:
    """Put every global generator back to ``state`` (the CUDA one into the current device, if any)."""
    random.setstate(state.python)
    np.random.set_state(state.numpy)
    torch.set_rng_state(state.torch_cpu)
    if state.torch_cuda:
        if torch.cuda.is_available():
            torch.cuda.set_rng_state(state.torch_cuda[0])
        else:
            warnings.warn("the checkpoint holds a CUDA RNG state but CUDA is not available; not restored", stacklevel=2)


def _encode_rng(state: RngState) -> bytes:
    version, mt, gauss = state.python
    name, keys, pos, has_gauss, cached = state.numpy
    generators = {
        "python": [version, list(mt), gauss],
        "numpy": [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
    }
    # one metadata entry: safetensors writes several in hash order, which made equal states differ in bytes
    meta = {"generators": json.dumps(generators, sort_keys=True)}
    tensors = {"torch_cpu": state.torch_cpu.cpu()} | {
        f"torch_cuda.{i}": t.cpu() for i, t in enumerate(state.torch_cuda)
    }
    return st_save(tensors, metadata=meta)


def _decode_rng(uri: str) -> RngState:
    tensors, meta = read_safetensors(uri)
    try:
        generators = (
            json.loads(meta["generators"])
            if "generators" in meta
            else {k: json.loads(meta[k]) for k in ("python", "numpy")}
        )  # older files
        version, mt, gauss = generators["python"]
        name, keys, pos, has_gauss, cached = generators["numpy"]
    except (KeyError, ValueError) as exc:
        raise DamagedCheckpointError(f"{uri}: no readable Python/NumPy generator state ({exc!r})") from exc
    n_cuda = sum(k.startswith("torch_cuda.") for k in tensors)
    return RngState(
        python=(version, tuple(mt), gauss),
        numpy=(name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached),
        torch_cpu=tensors["torch_cpu"],
        torch_cuda=[tensors[f"torch_cuda.{i}"] for i in range(n_cuda)],
    )


# --------------------------------------------------------------------------- JSON / safetensors helpers


def _to_json(obj: Any, where: str) -> Any:
    """JSON-able copy of ``obj``; tuples become ``{"__tuple__": [...]}``; anything else exotic is an error."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tuple):
        return {"__tuple__": [_to_json(v, where) for v in obj]}
    if isinstance(obj, list):
        return [_to_json(v, where) for v in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise CheckpointError(f"{where}: dict keys must be strings to store as JSON, got {list(obj)[:5]}")
        return {k: _to_json(v, where) for k, v in obj.items()}
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return obj.item()
    raise CheckpointError(f"{where}: cannot store a {type(obj).__name__} as JSON ({obj!r:.80})")


def _from_json(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_from_json(v) for v in obj]
    if isinstance(obj, dict):
        if set(obj) == {"__tuple__"}:
            return tuple(_from_json(v) for v in obj["__tuple__"])
        return {k: _from_json(v) for k, v in obj.items()}
    return obj


# --------------------------------------------------------------------------- optimiser state


def _encode_optimizer(state_dict: dict[str, Any]) -> bytes:
    tensors: dict[str, Tensor] = {}
    per_param = []
    for pid, values in state_dict["state"].items():
        entry: dict[str, Any] = {"id": int(pid), "tensors": {}, "values": {}}
        for key, value in values.items():
            if isinstance(value, Tensor):
                name = f"state.{pid}.{key}"
                tensors[name] = value
                entry["tensors"][key] = name
            else:
                entry["values"][key] = value
        per_param.append(entry)
    structure = {"state": per_param, "param_groups": state_dict["param_groups"]}
    meta = {"structure": json.dumps(_to_json(structure, "optimizer state"))}
    return st_save(tensors_for_safetensors(tensors, "optimizer state"), metadata=meta)


def _decode_optimizer(uri: str) -> dict[str, Any]:
    tensors, meta = read_safetensors(uri)
    try:
        structure = _from_json(json.loads(meta["structure"]))
    except (KeyError, ValueError) as exc:
        raise DamagedCheckpointError(f"{uri}: no readable optimiser structure ({exc!r})") from exc
    state: dict[int, dict[str, Any]] = {}
    for entry in structure["state"]:
        values = dict(entry["values"])
        values.update({key: tensors[name] for key, name in entry["tensors"].items()})
        state[entry["id"]] = values
    return {"state": state, "param_groups": structure["param_groups"]}


# --------------------------------------------------------------------------- save


def save_rank_rng(root: str, step: int, rank: int, rng_state: RngState | None = None) -> str:
    """Write rank ``rank``'s generator states into the checkpoint directory of ``step``; returns the file URI."""
    uri = storage.join(checkpoint_dir(root, step), rng_file(rank))
    storage.write_bytes(uri, _encode_rng(rng_state if rng_state is not None else capture_rng_state()))
    return uri


def save_checkpoint(
    root: str,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    rng_state: RngState | None = None,
    data_state: Any = None,
    extra: dict[str, Any] | None = None,
    *,
    world_size: int = 1,
    keep_last: int | None = None,
) -> str:
    """Write the checkpoint of ``step`` under ``root`` (local or ``s3://``); ``state.json`` goes last.

    Args:
        root: Directory holding the ``step-NNNNNN/`` checkpoints.
        step: Number of optimiser updates done.
        model: The model (a DDP wrapper is unwrapped).
        optimizer: Its optimiser, or None.
        scheduler: Its LR scheduler, or None; the state must be JSON-able (true for LambdaLR over
            :class:`vlp.train.optim.LinearWarmupDecay`).
        rng_state: Rank 0's generator states; None captures them now.
        data_state: JSON-able data position (e.g. ``ResumableSampler.state_dict()``).
        extra: JSON-able caller data (config, metrics, ...).
        world_size: Number of ranks whose ``rng-rank*`` files belong to this checkpoint (ranks > 0
            write theirs with :func:`save_rank_rng` *before* this call).
        keep_last: When set, delete all but the newest ``keep_last`` checkpoints afterwards.

    Returns:
        The checkpoint directory URI.
    """
    ckpt = checkpoint_dir(root, step)
    storage.delete(storage.join(ckpt, STATE_FILE))  # one of this step already there (skipped on resume): not counted
    state_dict = unwrap(model).state_dict()
    storage.write_bytes(storage.join(ckpt, MODEL_FILE), st_save(tensors_for_safetensors(state_dict, "model")))
    if optimizer is not None:
        storage.write_bytes(storage.join(ckpt, OPTIM_FILE), _encode_optimizer(optimizer.state_dict()))
    save_rank_rng(root, step, 0, rng_state)
    state = {
        "format": FORMAT,
        "step": int(step),
        "world_size": int(world_size),
        "has_optimizer": optimizer is not None,
        "scheduler": _to_json(scheduler.state_dict(), "scheduler state") if scheduler is not None else None,
        "data": _to_json(data_state, "data state"),
        "extra": _to_json(extra or {}, "extra"),
    }
    storage.write_text(storage.join(ckpt, STATE_FILE), json.dumps(state, indent=1))
    if keep_last is not None:
        prune_checkpoints(root, keep_last)
    return ckpt


# --------------------------------------------------------------------------- find / prune


def _scan(root: str) -> dict[int, tuple[str, bool]]:
    """``{step: (directory URI, complete)}`` for every ``step-N/`` directory directly under ``root``."""
    root = str(root)
    found: dict[int, tuple[str, bool]] = {}
    for uri in storage.list_files(root):
        parts = storage.relative(uri, root).split("/")
        match = _STEP_DIR.match(parts[0]) if len(parts) == 2 else None
        if match is None:
            continue
        step = int(match.group(1))
        complete = found.get(step, ("", False))[1] or parts[1] == STATE_FILE
        found[step] = (storage.join(root, parts[0]), complete)
    return found


def list_checkpoints(root: str) -> list[tuple[int, str]]:
    """Complete checkpoints under ``root`` as ``(step, directory URI)``, oldest first."""
    return sorted((step, uri) for step, (uri, complete) in _scan(root).items() if complete)


def latest_checkpoint(root: str) -> str | None:
    """URI of the newest *complete* checkpoint under ``root`` (one with ``state.json``), or None."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def _delete_dir(uri: str) -> None:
    files = storage.list_files(uri)
    state = [f for f in files if f.endswith("/" + STATE_FILE)]
    for f in state + [f for f in files if f not in state]:  # state.json first: it stops counting at once
        storage.delete(f)
    storage.remove_folder(uri)


def prune_checkpoints(root: str, keep_last: int) -> list[str]:
    """Delete all but the newest ``keep_last`` complete checkpoints, and incomplete ones older than them.

    Returns:
        The deleted directory URIs.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    scanned = _scan(root)
    complete = sorted(step for step, (_, ok) in scanned.items() if ok)
    if not complete:
        return []
    kept = set(complete[-keep_last:])
    oldest_kept = min(kept)
    doomed = [uri for step, (uri, ok) in sorted(scanned.items()) if step not in kept and (ok or step < oldest_kept)]
    for uri in doomed:
        _delete_dir(uri)
    return doomed


# --------------------------------------------------------------------------- load


def read_state(uri: str) -> dict[str, Any]:
    """The parsed ``state.json`` of checkpoint directory ``uri``."""
    file_uri = storage.join(uri, STATE_FILE)
    try:
        state = json.loads(storage.read_text(file_uri))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{uri} is not a complete checkpoint (no {STATE_FILE})") from exc
    except ValueError as exc:  # truncated or garbled JSON (UnicodeDecodeError is a ValueError too)
        raise DamagedCheckpointError(f"{file_uri} is damaged: {exc}") from exc
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{uri}: unknown checkpoint format {state.get('format')!r}, expected {FORMAT!r}")
    return state


def load_checkpoint(
    uri: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    *,
    rank: int = 0,
    restore_rng: bool = True,
) -> LoadedCheckpoint:
    """Restore model, optimiser, scheduler and this rank's RNG from checkpoint directory ``uri``.

    Only JSON and safetensors are read; nothing is unpickled. When the checkpoint has no RNG file
    for ``rank`` (it was written by fewer ranks), rank 0's states are used and a warning is issued:
    the run continues, but not bit-exactly.

    Args:
        uri: A checkpoint directory (see :func:`latest_checkpoint`).
        model: Receives the weights (strict: every key must match; a DDP wrapper is unwrapped).
        optimizer: Receives the optimiser state when given (same parameter groups as at save time).
        scheduler: Receives the scheduler state when given.
        rank: Whose ``rng-rank*`` file to restore.
        restore_rng: Set the global generators (False: leave them, e.g. for evaluation).

    Returns:
        The step, data position and ``extra`` recorded at save time.

    Raises:
        DamagedCheckpointError: a file of ``uri`` is missing, truncated or unreadable (nothing was restored).
        NonFiniteCheckpointError: the weights or the optimiser state hold a NaN or an infinity (nothing was restored).
        CheckpointError: if ``uri`` is not a complete checkpoint or does not fit the objects.
        LinkError: ``uri`` holds a symbolic link (:func:`vlp.storage.refuse_links`).
    """
    storage.refuse_links(uri, "checkpoint")
    state = read_state(uri)
    # read and check every file before anything is restored: a damaged file leaves the objects untouched
    weights, _ = read_safetensors(storage.join(uri, MODEL_FILE))
    _refuse_nonfinite(storage.join(uri, MODEL_FILE), weights)
    optim_state = None
    if optimizer is not None:
        if not state.get("has_optimizer", True):
            raise CheckpointError(f"{uri} holds no optimiser state")
        optim_state = _decode_optimizer(storage.join(uri, OPTIM_FILE))
        tensors = {f"state.{pid}.{k}": v for pid, values in optim_state["state"].items() for k, v in values.items()
                   if isinstance(v, Tensor)}  # fmt: skip
        _refuse_nonfinite(storage.join(uri, OPTIM_FILE), tensors)
    rng = _load_rng(uri, rank, int(state["world_size"])) if restore_rng else None
    try:
        unwrap(model).load_state_dict(weights)
    except RuntimeError as exc:
        raise CheckpointError(f"{uri}: weights do not fit the model: {exc}") from exc
    if optimizer is not None and optim_state is not None:  # read above whenever an optimizer is given
        # which kernels run the update is this run's choice (``adamw``), not state: a checkpoint's groups would
        # bring back the kernels of the run that wrote it
        kernels = [{k: g[k] for k in _KERNEL_KEYS if k in g} for g in optimizer.param_groups]
        try:
            optimizer.load_state_dict(optim_state)
        except ValueError as exc:
            raise CheckpointError(f"{uri}: optimiser state does not fit: {exc}") from exc
        for group, chosen in zip(optimizer.param_groups, kernels, strict=True):
            group.update(chosen)
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(_from_json(state["scheduler"]))
    if rng is not None:
        restore_rng_state(rng)
    return LoadedCheckpoint(
        uri, int(state["step"]), _from_json(state["data"]), _from_json(state["extra"]), state["world_size"]
    )


def _load_rng(uri: str, rank: int, world_size: int) -> RngState:
    if rank >= world_size:
        warnings.warn(f"{uri} was written by {world_size} rank(s); rank {rank} resumes with rank 0's RNG", stacklevel=3)
        rank = 0
    return _decode_rng(storage.join(uri, rng_file(rank)))
