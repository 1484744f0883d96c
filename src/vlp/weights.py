"""Model weights as safetensors: the one file a model directory and every checkpoint share.

A checkpoint directory (:mod:`vlp.train.checkpoint`) and a model directory (:mod:`vlp.models.directory`) both hold
their weights as ``model.safetensors``: the ``state_dict`` of the model (parameters and persistent buffers), read
with ``safetensors`` alone, so a file from an untrusted bucket cannot run code. This module reads and writes that
file and nothing else; it sits below the models (which start from pre-trained weights) and the serving code (which
loads a model directory), so neither needs the training code. Paths are local or ``s3://`` (:mod:`vlp.storage`).
"""

from __future__ import annotations

import json
import struct
from typing import Any

from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor, nn

from vlp import storage

MODEL_FILE = "model.safetensors"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, malformed or does not fit the objects it is loaded into."""


class DamagedCheckpointError(CheckpointError):
    """A file of a checkpoint is missing, truncated or unreadable (the message names it)."""


def safetensors_metadata(data: bytes, uri: str) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors blob (8-byte little-endian header length, then JSON)."""
    if len(data) < 8:
        raise DamagedCheckpointError(f"{uri}: too short to be a safetensors file ({len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + n])
    except ValueError as exc:
        raise DamagedCheckpointError(f"{uri}: not a safetensors file ({exc})") from exc
    return header.get("__metadata__", {}) or {}


def read_safetensors(uri: str) -> tuple[dict[str, Tensor], dict[str, str]]:
    """``(tensors, metadata)`` of the safetensors file ``uri``; any defect is a DamagedCheckpointError naming it."""
    try:
        data = storage.read_bytes(uri)
    except FileNotFoundError as exc:
        raise DamagedCheckpointError(f"{uri} is missing") from exc
    meta = safetensors_metadata(data, uri)
    try:
        return st_load(data), meta
    except Exception as exc:  # safetensors raises its own SafetensorError (truncated data, bad offsets)
        raise DamagedCheckpointError(f"{uri} is damaged ({len(data)} bytes): {exc}") from exc


def tensors_for_safetensors(state: dict[str, Any], where: str) -> dict[str, Tensor]:
    """Detached CPU tensors; storages shared between entries (tied weights) or views are copied."""
    out: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, t in state.items():
        if not isinstance(t, Tensor):
            raise CheckpointError(f"{where}: entry {name!r} is a {type(t).__name__}, not a tensor")
        t = t.detach().cpu()
        storage_ = t.untyped_storage()
        ptr = storage_.data_ptr()
        if ptr in seen or storage_.nbytes() != t.numel() * t.element_size() or not t.is_contiguous():
            t = t.contiguous().clone()
        seen.add(ptr)
        out[name] = t
    return out


def unwrap(model: nn.Module) -> nn.Module:
    """The model a DistributedDataParallel wrapper holds (any other module as it is)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def save_model_weights(uri: str, model: nn.Module | dict[str, Tensor]) -> str:
    """Write only ``<uri>/model.safetensors`` (a model, or its state dict): weights without a training state,
    e.g. an imported checkpoint. :func:`load_model_weights` reads it; there is nothing to resume from."""
    state = model if isinstance(model, dict) else unwrap(model).state_dict()
    storage.write_bytes(storage.join(uri, MODEL_FILE), st_save(tensors_for_safetensors(state, "model")))
    return uri


def load_model_weights(uri: str, model: nn.Module, *, strict: bool = True) -> None:
    """Load only the model weights of checkpoint directory ``uri`` (e.g. for evaluation or fine-tuning)."""
    tensors, _ = read_safetensors(storage.join(uri, MODEL_FILE))
    try:
        unwrap(model).load_state_dict(tensors, strict=strict)
    except RuntimeError as exc:
        raise CheckpointError(f"{uri}: weights do not fit the model: {exc}") from exc


def read_model_weights(uri: str) -> dict[str, Tensor]:
    """The tensors of checkpoint directory ``uri``'s ``model.safetensors`` (CPU), by name."""
    return read_safetensors(storage.join(uri, MODEL_FILE))[0]


def load_pretrained_weights(uri: str, model: nn.Module, *, allow_missing: tuple[str, ...] = ()) -> list[str]:
    """Start ``model`` from checkpoint directory ``uri`` of a related model (pre-trained -> fine-tuned).

    Every parameter/buffer of ``model`` must come from the checkpoint with the same shape, except those
    under the ``allow_missing`` name prefixes (new heads), which keep their initialisation. Checkpoint
    entries the model has no place for (heads of the pre-training objectives) are skipped.

    Returns:
        The skipped checkpoint entry names, sorted.
    """
    tensors, _ = read_safetensors(storage.join(uri, MODEL_FILE))
    target = unwrap(model).state_dict()
    missing = [k for k in target if k not in tensors and not k.startswith(allow_missing)]
    shapes = [f"{k}: {tuple(tensors[k].shape)} vs {tuple(v.shape)}" for k, v in target.items()
              if k in tensors and tensors[k].shape != v.shape]  # fmt: skip
    if missing or shapes:
        raise CheckpointError(
            f"{uri}: weights do not fit the model: missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
            f"shape mismatches {shapes[:8]}"
        )
    unwrap(model).load_state_dict({k: v for k, v in tensors.items() if k in target}, strict=False)
    return sorted(k for k in tensors if k not in target)
