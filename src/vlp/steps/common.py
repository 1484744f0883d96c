"""What every step does around its work (storage set-up, timing, the summary file), and what the training steps
share: the model family and tokenizer, seeding a model's initialisation, the training loop with its loggers, the
summary of a training run. The check of a step's inputs, and of its output (every step's, in :func:`run_step`), is
:mod:`vlp.inputs`; the device is :func:`vlp.distributed.device`."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vlp import __version__, registry, storage
from vlp.config import Config, check_sampled_frames, to_dict, validate
from vlp.data import manifest
from vlp.inputs import check_output
from vlp.models import directory
from vlp.tracking import MlflowLogger, MultiLogger

if TYPE_CHECKING:
    import torch

    from vlp.models.family import Family, StepContext
    from vlp.settings import ModelConfig

StepResult = dict[str, Any]
log = logging.getLogger("vlp")


def run_step(name: str, out: str, cfg: Config, section: str, work: Callable[[], StepResult]) -> StepResult:
    """Configure storage, check ``out``, run ``work``, write ``<out>/summary.json``; return the summary.

    The summary records the step's own config ``section`` (never ``storage``: it may hold keys). The whole config is
    validated first (:func:`vlp.config.validate`), so a value out of range fails before the step writes anything,
    whether ``cfg`` came from :func:`vlp.config.load_config` or was built in code; then ``out``
    (:func:`vlp.inputs.check_output`), so an output that is a file, lies under one, holds a symbolic link or may
    not be written fails before the step reads its inputs.

    Raises:
        vlp.inputs.StepOutputError: ``out`` cannot be written (one line that names it and says what to do).
        vlp.storage.LinkError: ``out`` holds a symbolic link.
    """
    validate(cfg)
    check_sampled_frames(cfg, section)
    storage.configure(cfg.storage)
    check_output(out)
    start = time.perf_counter()
    log.info("%s -> %s", name, out)
    result = work()
    summary = {"step": name, "vlp_version": __version__, "out": out, **result}
    summary["seconds"] = round(time.perf_counter() - start, 3)
    summary["config"] = {section: to_dict(getattr(cfg, section))}
    if os.environ.get("RANK", "0") == "0":  # under torchrun only rank 0 writes the step's files
        storage.write_text(storage.join(out, manifest.SUMMARY), json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


# --------------------------------------------------------------------------- model family and tokenizer


def family_of(model: ModelConfig) -> Family:
    """The :class:`vlp.models.family.Family` a ``model`` config section names (``model.family``)."""

    return registry.get(model.family)


@dataclass(frozen=True)
class FamilyStep:
    """A family's training step as the training loop calls it, ``step(model, batch)``: ``fam.<method>(model, batch,
    ctx)`` (``train_step``, or ``qa_step`` for QA) with the step's context."""

    fam: Family
    ctx: StepContext
    method: str = "train_step"

    def __call__(self, model: torch.nn.Module, batch: Any) -> Any:
        return getattr(self.fam, self.method)(model, batch, self.ctx)


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
    # here (with what follows): the data steps (synth, ingest, extract-frames, ...) use this module, without torch
    from vlp import distributed
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
    # here: the data steps (synth, ingest, extract-frames, mine-entities) use this module and import no torch
    from vlp.rng import seed_everything

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
    # here (with what follows): the data steps (synth, ingest, extract-frames, ...) use this module, without torch
    from vlp import distributed
    from vlp.models.tokenizer import tokenizer_digest
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
