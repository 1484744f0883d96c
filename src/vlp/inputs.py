"""A step's or a query's inputs, checked before anything expensive is loaded: the dataset, its split, the frames
store, the model directories and other files (:func:`check_inputs`), and a directory a query reads
(:func:`check_input_dir`); and a step's output, checked before the step starts (:func:`check_output`). A missing or
unusable input is a :class:`StepInputError`, an output that cannot be written a :class:`StepOutputError`; each
message is one line that names the path and says what to do, and the CLI prints it and exits 2.

The steps and serving (``vlp index``, ``answer``) both check their inputs here, below the steps (ARCHITECTURE.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from vlp import storage
from vlp.data import manifest
from vlp.data.frames import FrameStore
from vlp.models import directory

log = logging.getLogger("vlp")


class StepInputError(ValueError):
    """A step's input (dataset, split, frames, model directory) is missing or unusable. The message is one line
    that names the input, what is missing and what to do; the CLI prints it and exits 2."""


class StepOutputError(ValueError):
    """A step's output cannot be written where it is named (a file, under a file, a link to nothing, a directory
    this process may not write). The message is one line that names the path and what to do; the CLI prints it
    and exits 2."""


class ModelInput(NamedTuple):
    """A model directory a step reads: the argument that names it (``--model``), its URI, and the kinds it may hold
    (or a function that lists them: it imports every model family, which a data error need not wait for); with
    ``needs``, what the step needs of the model's family, checked before its kind (e.g.
    :func:`vlp.models.family.qa_of`: a family without a QA model is refused with a message that says so, not as
    a model of another kind)."""

    flag: str
    uri: str
    kinds: tuple[str, ...] | Callable[[], tuple[str, ...]]
    needs: Callable[[Any], object] | None = None


@dataclass(frozen=True)
class StepInputs:
    """What :func:`check_inputs` opened, for the step to use instead of opening it again.

    Attributes:
        store: the frames store (a :class:`vlp.data.frames.FrameStore`), or None when the step reads no frames.
        models: the :class:`vlp.models.directory.ModelDir` of each :class:`ModelInput`, in order (no weights).
        pairs: rows of the split whose clip has frames (captions or questions); 0 when no split was checked.
    """

    store: Any  # the frames store when frames were given, else None (a step that reads frames always gives them)
    models: tuple[Any, ...]
    pairs: int


_TEXTS = {manifest.CAPTIONS: ("captions", "caption pairs"), manifest.QA: ("questions", "question-answer pairs")}


def check_inputs(
    dataset: str = "",
    frames: str = "",
    *,
    table: str = manifest.CAPTIONS,
    split: str = "train",
    setting: str = "",
    models: Sequence[ModelInput] = (),
    files: Sequence[tuple[str, str]] = (),
) -> StepInputs:
    """Check a step's inputs cheaply, before it loads a model or a tokenizer or builds anything expensive.

    Stats first: the dataset has ``videos.parquet`` and ``table`` (``captions.parquet`` or ``qa.parquet``);
    ``frames`` has ``index.parquet``; each model directory has ``model.json``; each ``(uri, remedy)`` of
    ``files`` exists. Then small reads: the frame index and the ``video_id`` / ``split`` columns of ``table``
    (``split`` must have at least one row whose clip has frames; clips without frames are counted and logged),
    and last each ``model.json`` (a kind in its ``kinds``, and the weights it names exist). No frame is decoded
    and no weight is read.

    Args:
        dataset: the ingested dataset directory ("" = the step reads none).
        frames: the extract-frames output ("" = none).
        table: the table of the step's pairs (``manifest.CAPTIONS`` or ``manifest.QA``).
        split: the split the step reads.
        setting: the config key that chose ``split`` (``retrieval.split``), named in the error; "" for training.
        models: the model directories the step reads.
        files: other files the step needs, each with what to do when it is missing.

    Returns:
        The opened frames store and model descriptions, for the step to reuse.

    Raises:
        StepInputError: an input is missing or has nothing the step can use; the message says which and what to do.
        ValueError: a model directory holds another kind of model (:func:`vlp.models.directory.describe`).
    """
    if dataset:
        _check_dataset(dataset, table)
    if frames and not storage.exists(storage.join(frames, "index.parquet")):
        raise StepInputError(
            f"{storage.join(frames, 'index.parquet')} does not exist: run `vlp extract-frames --dataset {dataset} "
            f"--out {frames}` first (--frames is its output)"
        )
    for arg in models:
        _check_model_exists(arg)
    for uri, remedy in files:
        if not storage.exists(uri):
            raise StepInputError(f"{uri} does not exist: {remedy}")
    store, pairs = None, 0
    if frames:
        store = FrameStore(frames, cache_shards=64)  # what VideoTextDataset opens; the step hands this one on
    if dataset and store is not None:
        pairs = _usable_pairs(dataset, store, table, split, setting)
    return StepInputs(store, tuple(_describe_model(arg) for arg in models), pairs)


def _check_dataset(dataset: str, table: str) -> None:
    if not storage.exists(dataset):
        raise StepInputError(f"the dataset {dataset} (--dataset) does not exist: pass the output of `vlp ingest`")
    for name in (manifest.VIDEOS, table):
        if not storage.exists(storage.join(dataset, name)):
            raise StepInputError(
                f"the dataset {dataset} (--dataset) has no {name}: pass the output of `vlp ingest` (it writes "
                f"{manifest.VIDEOS}, {manifest.CAPTIONS} and {manifest.QA})"
            )


def _kinds(arg: ModelInput) -> tuple[str, ...]:
    return arg.kinds() if callable(arg.kinds) else arg.kinds


def _check_model_exists(arg: ModelInput) -> None:
    """Refuse a model directory that is not there or has no ``model.json`` (two stats)."""

    what = ""
    if not storage.exists(arg.uri):
        what = "does not exist"
    elif not storage.exists(storage.join(arg.uri, directory.MODEL_JSON)):
        what = f"has no {directory.MODEL_JSON}, so it is not a finished model directory"
    if what:
        makers = dict.fromkeys(f"`{directory.made_by(k)}`" for k in _kinds(arg) if directory.made_by(k))
        wanted = " or ".join(makers) or "a training step"
        raise StepInputError(
            f"{arg.flag} {arg.uri} {what}: pass the output of {wanted} (or of `vlp import-checkpoint`)"
        )


def _describe_model(arg: ModelInput) -> Any:
    """The :class:`ModelDir` of ``arg`` (its ``model.json`` read and checked, the family's ``needs`` first) once
    the weights it names exist."""
    from vlp.weights import MODEL_FILE  # here: checking a step's inputs must not import torch

    if arg.needs is not None:
        arg.needs(directory.describe(arg.uri).family)
    info = directory.describe(arg.uri, _kinds(arg))
    if not storage.exists(storage.join(info.checkpoint, MODEL_FILE)):
        raise StepInputError(
            f"{arg.flag} {arg.uri}: {directory.MODEL_JSON} names the checkpoint {info.checkpoint}, which has no "
            f"{MODEL_FILE}: copy the whole model directory"
        )
    return info


def _usable_pairs(dataset: str, store: FrameStore, table: str, split: str, setting: str) -> int:
    """Rows of ``split`` in ``table`` whose clip is in ``store``; refuses a split without any."""
    import pyarrow as pa
    import pyarrow.compute as pc

    uri = storage.join(dataset, table)
    try:
        rows = storage.read_parquet(uri, columns=["video_id", "split"])  # not the texts: a fraction of the file
    except pa.ArrowInvalid:
        raise manifest.ManifestError(f"{uri} has no video_id or split column: re-run `vlp ingest`") from None
    texts, pairs = _TEXTS.get(table, ("rows", "pairs"))
    ids = rows.filter(pc.equal(rows["split"], split))["video_id"]
    if len(ids) == 0:
        counts = rows["split"].value_counts().to_pylist()
        found = ", ".join(f"{c['values']} {c['counts']}" for c in counts) or "none at all"
        fix = (
            f"set {setting} to one of those"
            if setting
            else f"this step trains on the train split: ingest {texts} in it"
        )
        raise StepInputError(f"the {split} split of {dataset} has no {texts} (its {texts} by split: {found}); {fix}")
    videos = pc.unique(ids).to_pylist()
    covered = [v for v, row in zip(videos, store.positions(videos).tolist(), strict=True) if row >= 0]
    extract = f"re-run `vlp extract-frames --dataset {dataset} --out {store.out}`"
    if not covered:
        check = f"check {setting} or " if setting else "are --frames from this dataset? "
        raise StepInputError(
            f"the {split} split of {dataset} has no {pairs} with frames (0 of {len(videos)} {split} videos are in "
            f"{store.out}); {check}{extract}"
        )
    if len(covered) < len(videos):
        without = sorted(set(videos) - set(covered))
        named = ", ".join(repr(v) for v in without[:5]) + (f" and {len(without) - 5} more" if len(without) > 5 else "")
        log.warning("%d of %d %s videos of %s have no frames in %s (rejected by extract-frames? its rejects.parquet "
                    "says why): %s; their %s are left out", len(without), len(videos), split, dataset, store.out,
                    named, texts)  # fmt: skip
    usable = int(pc.sum(pc.is_in(ids, value_set=pa.array(covered, ids.type))).as_py())
    log.info("inputs: %d %s %s of %d videos with frames", usable, split, pairs, len(covered))
    return usable


OUTPUT_LINK_DEPTH = 2  # the levels of an output searched for links before a step writes (check_output)


def check_output(uri: str) -> None:
    """Refuse an output a step could not write, before the step reads or writes anything.

    A local output is a directory, or does not exist yet and is made below the nearest directory above it that
    does; that directory (the output's own, or the one it is made in) must be writable by this process. Like the
    outputs a later step reads back (:func:`vlp.storage.refuse_links`), the output holds no symbolic link where a
    step writes through a name: its own entries and those of the folders in it (``parts/<part>/``,
    ``checkpoints/step-N``, ``shards/*``, ``videos/<xx>``, ``metrics.jsonl``): a link there would lead the step's
    writes anywhere, and its readers would refuse it afterwards. Deeper files are not listed (a fetch output holds
    millions): each is written by an atomic rename, which replaces a link rather than writing through it, and their
    readers refuse links. ``uri`` itself may be a link to a directory (the caller's own argument, as for the
    readers). An ``s3://`` prefix is left to the store: object storage has no directories, and a missing bucket or a
    refused write is the step's storage error.

    Raises:
        StepOutputError: ``uri`` is a file, lies under a file or a link to nothing, or cannot be written.
        vlp.storage.LinkError: ``uri`` holds a symbolic link.
    """
    if storage.local_path(uri) is None:  # an object store has no directories
        return
    problem = _unwritable(uri)
    if problem:
        raise StepOutputError(f"the output {uri} {problem}")
    storage.refuse_links(uri, "output", depth=OUTPUT_LINK_DEPTH)


def _unwritable(path: str) -> str:
    """Why the local directory ``path`` cannot be written or made (the end of a sentence that names it), or ""."""
    here = os.path.normpath(path)
    while not os.path.lexists(here):  # up to the nearest path that exists: the output, or a directory above it
        up = os.path.dirname(here) or os.curdir
        if up == here:
            break
        here = up
    mine = here == os.path.normpath(path)
    where = "" if mine else f"lies under {here}, which "
    if os.path.islink(here) and not os.path.exists(here):
        fix = "remove the link or pass another directory"
        return f"{where}is a symbolic link to {os.readlink(here)}, which does not exist: {fix}"
    if not os.path.isdir(here):
        what = "a file" if os.path.isfile(here) else "not a directory"
        fix = "pass a directory, or move the file away" if mine else "pass a path under a directory"
        return f"{where}is {what}: {fix}"
    if not os.access(here, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):  # as open()
        subject = "is a directory this user" if mine else f"is made in {here}, which this user"
        return f"{subject} may not write: pass a directory it can write to, or change its permissions"
    return ""


def check_input_dir(uri: str, flag: str, remedy: str) -> None:
    """Refuse a local ``uri`` that a query reads as a directory (``--index``, ``--model``, ``--frames``) when it is
    a file or anything else but a directory; a missing one is left to its reader, which says what to make.

    Raises:
        StepInputError: ``uri`` exists and is not a directory; the message names ``flag`` and ``remedy``.
    """
    if storage.local_path(uri) is not None and os.path.lexists(uri) and not os.path.isdir(uri):
        what = "a file" if os.path.isfile(uri) else "not a directory"
        raise StepInputError(f"{flag} {uri} is {what}, not a directory: {remedy}")
