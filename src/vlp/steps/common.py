"""What every step does around its work (storage set-up, timing, the summary file), the check of its inputs before
it loads anything expensive, and what the training steps share: seeding, the device, the training loop with its
loggers, the summary of a training run."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from vlp import __version__, storage
from vlp.config import Config, check_sampled_frames, to_dict, validate
from vlp.data import manifest

StepResult = dict[str, Any]
log = logging.getLogger("vlp")


def run_step(name: str, out: str, cfg: Config, section: str, work: Callable[[], StepResult]) -> StepResult:
    """Configure storage, run ``work``, write ``<out>/summary.json``; return the summary.

    The summary records the step's own config ``section`` (never ``storage``: it may hold keys). The whole config is
    validated first (:func:`vlp.config.validate`), so a value out of range fails before the step writes anything,
    whether ``cfg`` came from :func:`vlp.config.load_config` or was built in code.
    """
    validate(cfg)
    check_sampled_frames(cfg, section)
    storage.configure(cfg.storage)
    start = time.perf_counter()
    log.info("%s -> %s", name, out)
    result = work()
    summary = {"step": name, "vlp_version": __version__, "out": out, **result}
    summary["seconds"] = round(time.perf_counter() - start, 3)
    summary["config"] = {section: to_dict(getattr(cfg, section))}
    if os.environ.get("RANK", "0") == "0":  # under torchrun only rank 0 writes the step's files
        storage.write_text(storage.join(out, manifest.SUMMARY), json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


# --------------------------------------------------------------------------- step inputs


class StepInputError(ValueError):
    """A step's input (dataset, split, frames, model directory) is missing or unusable. The message is one line
    that names the input, what is missing and what to do; the CLI prints it and exits 2."""


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

    store: Any
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
        from vlp.data.frames import FrameStore

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
    from vlp.models import directory

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
    from vlp.models import directory
    from vlp.train.checkpoint import MODEL_FILE

    if arg.needs is not None:
        arg.needs(directory.describe(arg.uri).family)
    info = directory.describe(arg.uri, _kinds(arg))
    if not storage.exists(storage.join(info.checkpoint, MODEL_FILE)):
        raise StepInputError(
            f"{arg.flag} {arg.uri}: {directory.MODEL_JSON} names the checkpoint {info.checkpoint}, which has no "
            f"{MODEL_FILE}: copy the whole model directory"
        )
    return info


def _usable_pairs(dataset: str, store: Any, table: str, split: str, setting: str) -> int:
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


# --------------------------------------------------------------------------- model family and tokenizer


def family_of(model: Any) -> Any:
    """The :class:`vlp.models.family.Family` a ``model`` config section names (``model.family``)."""
    from vlp.models import family

    return family.get(model.family)


def resolved_inits(model: Any) -> tuple[str, str]:
    """``(video, text)`` weight sources of ``model``: its family's preset's unless set; ``""`` = random init."""
    return family_of(model).weights(model)


def tokenizer_source(model: Any) -> str:
    """Where the tokenizer comes from: a dir / hub name, or ``""`` = train WordPiece on the training captions.

    By default a model whose text weights are loaded uses their tokenizer (BERT's vocabulary must match
    BERT's embeddings); one with random text weights trains WordPiece.
    """
    if model.tokenizer == "wordpiece":
        return ""
    return model.tokenizer or resolved_inits(model)[1]


def planned_vocab_size(model: Any) -> int:
    """The vocabulary size a step's tokenizer will have, known before the tokenizer is loaded or trained: the text
    weights' own (their local directory's ``config.json``) where the tokenizer is theirs, else ``model.vocab_size``
    (WordPiece's size, and the size the steps' checks assume for a named tokenizer they have not loaded yet)."""
    source = tokenizer_source(model)
    if source and not model.tokenizer and os.path.isdir(source):
        config_file = os.path.join(source, "config.json")
        if os.path.isfile(config_file):
            with open(config_file, encoding="utf-8") as f:
                vocab = json.load(f).get("vocab_size")
            if isinstance(vocab, int) and vocab > 0:
                return vocab
    return int(model.vocab_size)


def tokenizer_revision(model: Any) -> str:
    """The hub revision of :func:`tokenizer_source`: ``model.tokenizer_revision`` for a named tokenizer, else (the
    text weights' own tokenizer) ``model.text_init_revision``, so pinned weights never get a tokenizer of another
    commit."""
    return model.tokenizer_revision if model.tokenizer else model.text_init_revision


def step_tokenizer(cfg: Config, dataset: str, out: str) -> Any:
    """The tokenizer of ``out``: the one saved there by an earlier run, else :func:`tokenizer_source`'s (the
    configured one, or the text weights' own), else WordPiece trained on the training captions; saved under
    ``<out>/tokenizer`` once.

    A rerun or resume into ``out`` reuses the saved tokenizer, so token ids never change under trained weights.

    Raises:
        ValueError: the configured tokenizer is not the one ``out`` was trained with.
        PretrainedUnavailableError: a named tokenizer is neither local nor reachable (the message says how to
            provide it).
    """
    from vlp import distributed
    from vlp.models import directory
    from vlp.models.tokenizer import load_tokenizer, save_tokenizer, tokenizer_digest, train_wordpiece

    saved, source = storage.join(out, directory.TOKENIZER_DIR), tokenizer_source(cfg.model)
    if storage.exists(storage.join(saved, "tokenizer.json")):
        tok = load_tokenizer(saved)
        if source and tokenizer_digest(load_tokenizer(source, tokenizer_revision(cfg.model))) != tokenizer_digest(tok):
            raise ValueError(
                f"the tokenizer {source!r} (model.tokenizer / model.text_init) differs from the one {saved} was "
                "trained with; use another output directory for another tokenizer"
            )
        log.info("reusing the tokenizer saved in %s", saved)
        return tok
    if source:
        tok = load_tokenizer(source, tokenizer_revision(cfg.model))
    else:
        captions = manifest.read(dataset, manifest.CAPTIONS, manifest.CAPTION_SCHEMA)
        pairs = zip(captions["caption"].to_pylist(), captions["split"].to_pylist(), strict=True)
        train = [caption for caption, split in pairs if split == "train"]
        tok = train_wordpiece(train, vocab_size=cfg.model.vocab_size, max_len=cfg.model.max_len)
    if distributed.rank() == 0:
        save_tokenizer(tok, saved)
    return tok


def seed_model_init(seed: int) -> None:
    """Seed every global generator before a model is built, so its random initial weights follow the seed.

    The same on every rank (DDP also broadcasts rank 0's weights); :func:`vlp.train.loop.train` re-seeds
    with ``seed + rank`` for the training steps.
    """
    from vlp.train.loop import seed_everything

    seed_everything(seed)


def train_model(
    model: Any,
    step_fn: Any,
    data: Any,
    config: Config,
    out: str,
    name: str,
    section: Any = None,
    *,
    tokenizer: Any,
    lr_groups: Any = None,
) -> Any:
    """Run the shared loop; metrics go to ``<out>/metrics.jsonl`` and, when configured, to MLflow (rank 0).

    ``section`` holds the optimisation settings (default ``config.pretrain``; fine-tuning passes its own), as is;
    ``lr_groups`` (the family's :class:`vlp.models.family.LrGroups`) says which parameters its ``fusion_lr_mult``
    and ``backbone_lr_mult`` scale.
    The checkpoints record ``tokenizer``'s digest, and a resume with another tokenizer is refused.
    The MLflow run is ``out``'s (:class:`vlp.tracking.MlflowLogger` with ``out``): a resume, or a rerun of a
    finished step, continues the run an earlier call opened, sends it what it lacks of ``metrics.jsonl`` and
    ends it with this call's status, so an outage that outlasted the step is made good by the rerun.
    """
    from vlp import distributed
    from vlp.models.tokenizer import tokenizer_digest
    from vlp.tracking import MlflowLogger, MultiLogger
    from vlp.train.loop import JsonlMetricsLogger, TrainConfig, train
    from vlp.train.optim import OptimConfig

    cfg = config.pretrain if section is None else section
    train_cfg = TrainConfig.of(cfg, out, name)  # name: what the progress, interruption and resume lines call it
    groups = {} if lr_groups is None else {"fusion_prefixes": lr_groups.fusion, "backbone_prefixes": lr_groups.backbone}
    optim = OptimConfig.of(cfg, **groups)
    logger, mlflow_run = None, None
    if distributed.rank() == 0:
        loggers: list[Any] = [JsonlMetricsLogger(storage.join(out, "metrics.jsonl"))]
        if config.tracking.tracking_uri:
            tags = {"vlp.step": name, "vlp.out": out}
            mlflow_run = MlflowLogger(config.tracking, run_name=name, tags=tags, out=out)
            loggers.append(mlflow_run)
        logger = MultiLogger(loggers)
    identity = {"tokenizer_sha256": tokenizer_digest(tokenizer)}
    try:
        result = train(model, step_fn, data, train_cfg, optim, metrics_logger=logger, identity=identity)
    except BaseException:
        if mlflow_run is not None:
            mlflow_run.close("FAILED")  # never raises: the training error is the one that propagates
        raise
    if mlflow_run is not None:
        result.tracking = mlflow_run.close()
    return result


def train_summary(result: Any) -> dict[str, Any]:
    """The summary entries of a training step: steps, checkpoint, metrics, and whether and where it resumed.

    ``skipped`` is true when the output was already trained to the end (a rerun): nothing was trained, every
    output stays as it was, and ``metrics`` are those the finished run logged last (``tracking`` then says
    whether the output's MLflow run has caught up).
    """
    return {
        "steps": result.step,
        "checkpoint": result.checkpoint,
        "metrics": result.last_metrics,
        "resumed_from_step": result.start_step if result.resumed_from else None,
        "skipped": result.resumed_from is not None and result.start_step == result.step,
        **({"tracking": result.tracking} if result.tracking else {}),
    }
