"""What importing released weights shares across families: reading a checkpoint file safely, the report of what
was mapped, and the importer interface ``vlp import-checkpoint`` calls.

A family that imports released checkpoints names its importer module in its spec (``FamilySpec.importer``); the
module provides:

- ``TOKENIZER``: the tokenizer the released weights were trained with (a hub name), unless ``--tokenizer`` says;
- ``FORMATS`` and ``KINDS``: the key layouts it reads and the ``model.json`` kinds it builds;
- ``recognizes(state) -> bool``: whether a state dict's keys are this family's (``--family auto``);
- ``import_state(state, options) -> Imported``: the model config read from the shapes, the mapped weights and
  the :class:`ImportReport`.

Files are read with ``torch.load(weights_only=True)`` or safetensors: nothing but tensors and plain containers is
unpickled (:func:`read_checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from vlp import storage


@dataclass(frozen=True)
class ImportOptions:
    """What the user chose (``vlp import-checkpoint``'s options; ``auto`` = read from the keys)."""

    fmt: str = "auto"  # a key layout of the importer's FORMATS
    kind: str = "auto"  # a model.json kind of the importer's KINDS
    answers: str = ""  # QA: the answer vocabulary file (a JSON list, or ALPRO's {answer: label})
    video_heads: int = 0  # attention heads (0 = width / 64)
    text_heads: int = 0
    fusion_layers: int = 0  # BERT layers that fuse (0 = the importer's rule)
    max_len: int = 40  # text positions the later steps use by default
    num_frames: int = 4  # frames per clip the model is built for


@dataclass
class Imported:
    """A checkpoint mapped onto a vlp model: what ``vlp import-checkpoint`` saves."""

    fmt: str
    kind: str
    config: Any
    weights: dict[str, Any]
    report: ImportReport
    answers: list[str] | None = None


class Importer(Protocol):
    """A family's importer module (see the module docstring)."""

    TOKENIZER: str
    FORMATS: tuple[str, ...]
    KINDS: tuple[str, ...]

    def recognizes(self, state: Mapping[str, Tensor]) -> bool: ...

    def import_state(self, state: Mapping[str, Tensor], options: ImportOptions) -> Imported: ...


def read_answers(uri: str, num_classes: int) -> list[str]:
    """The answer of each classifier row: a JSON list, or ALPRO's ``{answer: label}`` (``train_ans2label.json``).

    The released QA models have more rows than answers (the classifier size is ``max(#answers, 1500)``); the
    extra rows become ``[unused answer N]`` placeholders that no gold answer equals.

    Raises:
        ValueError: not a list / mapping, labels not ``0..n-1``, or more answers than classifier rows.
    """
    data = json.loads(storage.read_text(uri))
    if isinstance(data, dict):
        by_label = {int(v): str(k) for k, v in data.items()}
        if sorted(by_label) != list(range(len(data))):
            raise ValueError(f"{uri}: the labels of the answer mapping must be 0..{len(data) - 1} without gaps")
        answers = [by_label[i] for i in range(len(data))]
    elif isinstance(data, list) and all(isinstance(a, str) for a in data):
        answers = list(data)
    else:
        raise ValueError(f"{uri}: expected a JSON list of answers or an {{answer: label}} mapping")
    if len(answers) > num_classes:
        raise ValueError(f"{uri} lists {len(answers)} answers; the checkpoint's classifier has {num_classes} rows")
    return answers + [f"[unused answer {i}]" for i in range(len(answers), num_classes)]


class CheckpointFormatError(ValueError):
    """The file is not a checkpoint an importer can map (the message says what does not fit)."""


@dataclass
class ImportReport:
    """What a family's ``map_state_dict`` did."""

    format: str
    kind: str
    mapped: dict[str, str] = field(default_factory=dict)  # vlp key -> source key
    unmapped: dict[str, str] = field(default_factory=dict)  # source key -> why it has no place
    checked_ties: list[str] = field(default_factory=list)  # tied copies verified equal
    kept_init: list[str] = field(default_factory=list)  # model keys the file lacks that the kind never uses

    def summary(self) -> dict[str, Any]:
        """JSON-able: counts, and the unmapped keys grouped by reason (with up to 3 examples each)."""
        by_reason: dict[str, list[str]] = {}
        for key, why in self.unmapped.items():
            by_reason.setdefault(why, []).append(key)
        return {
            "format": self.format,
            "kind": self.kind,
            "mapped": len(self.mapped),
            "unmapped": [{"reason": r, "keys": len(k), "examples": sorted(k)[:3]} for r, k in by_reason.items()],
            "ties_checked": self.checked_ties,
            "kept_init": self.kept_init,
        }


def read_checkpoint(uri: str) -> tuple[dict[str, Tensor], str]:
    """``(state dict, SHA-256 of the file)``; a ``{"model": ...}`` / ``{"state_dict": ...}`` wrapper and DDP's
    ``module.`` prefix are removed; tensors only (other entries of a wrapper, e.g. an epoch, are dropped).

    ``.safetensors`` files are read with safetensors, anything else with torch's weights-only unpickler: no other
    object is ever rebuilt, and a file either loader refuses (damaged, truncated, random bytes, a header that
    declares more bytes than the file has, a pickle of arbitrary objects) is a one-line error naming the file.

    Raises:
        CheckpointFormatError: not a readable checkpoint, not a state dict, or it holds empty tensors (shapes
            that claim sizes the file does not hold).
    """
    with storage.local_copy(uri) as path:
        digest = _sha256(path)
        state = _load_safetensors(path, uri) if path.endswith(".safetensors") else _load_pickle(path, uri)
    for wrapper in ("model", "state_dict", "module"):
        if isinstance(state, Mapping) and isinstance(state.get(wrapper), Mapping):
            state = state[wrapper]
            break
    if not isinstance(state, Mapping) or not state:
        raise CheckpointFormatError(f"{uri}: expected a state dict (name -> tensor), got {type(state).__name__}")
    tensors = {str(k).removeprefix("module."): v for k, v in state.items() if isinstance(v, Tensor)}
    if not tensors:
        raise CheckpointFormatError(f"{uri}: the state dict holds no tensors")
    empty = sorted(k for k, v in tensors.items() if v.numel() == 0)
    if empty:  # a 0 in a shape lets a tiny file declare any other dimension, and so a model of any size
        raise CheckpointFormatError(
            f"{uri}: holds {len(empty)} empty tensor(s), e.g. {empty[:3]}; no model vlp imports has one: the file "
            "is damaged or not model weights"
        )
    return tensors, digest


def _load_safetensors(path: str, uri: str) -> Any:
    """The tensors of a ``.safetensors`` file. The header length it declares is checked against the file's size
    first; safetensors checks the header itself (JSON, dtypes, shapes, offsets) before it reads any tensor."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
    declared = int.from_bytes(head, "little")
    if len(head) < 8 or not 0 < declared <= size - 8:
        what = f"declares a {declared:,}-byte header in" if len(head) == 8 else "has no 8-byte header length in its"
        raise CheckpointFormatError(
            f"{uri}: not a safetensors file: it {what} {size:,} bytes; the file is damaged or another format "
            "(a .pt/.pth/.bin file is read as a PyTorch file)"
        )
    try:
        return load_file(path)
    except (SafetensorError, ValueError, OSError) as exc:  # a bad header: JSON, dtype, shapes, offsets
        raise CheckpointFormatError(
            f"{uri}: not a valid safetensors file ({_one_line(exc)}); it is damaged or was cut short: fetch it again"
        ) from exc


def _load_pickle(path: str, uri: str) -> Any:
    """A PyTorch file read with torch's weights-only unpickler: tensors and plain containers, nothing else."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError: random bytes, arbitrary objects; RuntimeError: a broken archive
        raise CheckpointFormatError(
            f"{uri}: not a PyTorch file of tensors only ({_unpickling_reason(exc)}); vlp reads tensors and plain "
            "containers, never other pickled objects: export the state dict's tensors (e.g. as .safetensors) "
            "from the file's source"
        ) from exc


_TORCH_ADVICE = ("weights_only", "trust", "Weights only load failed", "Check the documentation", "Please file")


def _unpickling_reason(exc: BaseException) -> str:
    """What torch's loader objected to, in one line, without its advice on loading the file unsafely."""
    text = str(exc).split("WeightsUnpickler error:", 1)[-1]
    sentences = [line.strip().split(". ")[0].rstrip(".") for line in text.splitlines() if line.strip()]
    facts = [s for s in sentences if not any(advice in s for advice in _TORCH_ADVICE)]
    return facts[0][:200] if facts else type(exc).__name__


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_mapping(fmt: str, kind: str, unknown: list[str], missing: list[str], shapes: list[str]) -> None:
    """One error that lists every source key with no place, every model key the file lacks, every bad shape."""
    if unknown or missing or shapes:
        raise CheckpointFormatError(
            f"this {fmt} checkpoint does not map onto a vlp {kind!r} model: "
            + "; ".join(
                part
                for part in (
                    f"{len(unknown)} unknown source keys {_few(unknown)}" if unknown else "",
                    f"{len(missing)} model keys the file lacks {_few(missing)}" if missing else "",
                    f"{len(shapes)} shape mismatches {_few(shapes)}" if shapes else "",
                )
                if part
            )
        )


def _few(items: list[str], n: int = 6) -> str:
    return str(sorted(items)[:n]) + (" ..." if len(items) > n else "")
