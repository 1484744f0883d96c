"""Step: ``import-checkpoint``, released ALPRO, ALBEF or TS2-Net weights -> a vlp model directory.

The output is what ``finetune-*`` and ``evaluate-*`` accept (:mod:`vlp.models.directory`): ``model.json``
(kind, config read from the shapes, lineage: the file and its SHA-256), ``tokenizer/``, ``weights/`` and, for
QA, ``answers.json``; plus ``import_report.json``, which lists every source key that has no place in the model
and why. Each family's ``importer`` module (:mod:`vlp.models.alpro.importer`, :mod:`vlp.models.albef.importer`,
:mod:`vlp.models.ts2net.importer`) describes its formats.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

from vlp import storage
from vlp.config import Config
from vlp.models import directory
from vlp.models.family import specs
from vlp.models.importing import CheckpointFormatError, Imported, ImportOptions, read_checkpoint
from vlp.models.tokenizer import load_tokenizer
from vlp.steps.common import StepResult, run_step
from vlp.weights import save_model_weights

log = logging.getLogger("vlp")
REPORT_FILE = "import_report.json"
WEIGHTS_DIR = "weights"


def import_checkpoint(
    source: str,
    out: str,
    cfg: Config,
    *,
    fmt: str = "auto",
    kind: str = "auto",
    tokenizer: str = "",
    answers: str = "",
    video_heads: int = 0,
    text_heads: int = 0,
    fusion_layers: int = 0,
    max_len: int = 40,
    family: str = "auto",
    num_frames: int = 4,
) -> StepResult:
    """Turn a released checkpoint of a registered family (ALPRO, ALBEF, TS2-Net: salesforce/ALPRO,
    salesforce/ALBEF, LAVIS, yuqi657/ts2_net) into a vlp model directory at ``out``.

    Args:
        source: the checkpoint file (local or ``s3://``; ``.pt``/``.pth``/``.bin`` or ``.safetensors``).
        out: the model directory to write.
        cfg: the config (storage settings).
        fmt, kind: the key layout and the ``model.json`` kind, each one of the family importer's ``FORMATS`` /
            ``KINDS`` or ``auto`` (read from the keys; ALPRO: classifier -> QA, PEM head or prompter ->
            pre-trained, else retrieval, and ``prompter`` builds the pre-trained file's frozen prompter).
        tokenizer: the tokenizer the weights were trained with: a hub name or local / ``s3://`` directory
            (``""``: the importer's ``TOKENIZER``, ``bert-base-uncased`` for ALPRO / ALBEF, CLIP's for TS2-Net).
        answers: QA only: the answer vocabulary (JSON list, or ALPRO's ``{answer: label}``).
        video_heads, text_heads: attention heads; 0 = width / 64 (12 for ALPRO's ViT-B and BERT-base).
        fusion_layers: BERT layers that fuse; 0 = half (ALPRO: 6 of 12; ALBEF reads it from the keys).
        max_len: text length the fine-tuning and evaluation steps use by default (released configs: 40).
        family: a registered family with an importer, or ``auto``: the one whose importer recognises the keys
            (a TimeSformer under ``visual_encoder.model.`` is ALPRO's, a ViT directly under ``visual_encoder.``
            ALBEF's, OpenAI's CLIP under ``clip.`` TS2-Net's).
        num_frames: frames per clip the model is built for (ALBEF: its zero time embedding; TS2-Net: its clips).

    Raises:
        CheckpointFormatError: a file that is not a checkpoint of tensors (damaged, random bytes, a header that
            declares more than the file holds, a pickle of other objects) or whose tensors do not fit the model
            their names suggest; one line that names ``source``. Nothing is unpickled but tensors.
    """
    options = ImportOptions(fmt, kind, answers, video_heads, text_heads, fusion_layers, max_len, num_frames)
    work = partial(_import_checkpoint, source, out, options, tokenizer, family)
    return run_step("import_checkpoint", out, cfg, "model", work)


def _import_checkpoint(source: str, out: str, options: ImportOptions, tokenizer: str, family: str) -> StepResult:
    importers = {name: spec.load_importer() for name, spec in specs().items() if spec.importer}
    if family != "auto" and family not in importers:
        raise ValueError(f"family must be one of {sorted(importers)} or auto, got {family!r}")
    state, sha = read_checkpoint(source)
    importer = importers[family if family != "auto" else _recognize(source, state, importers)]
    return _write(source, out, sha, _map(source, state, importer, options), tokenizer or importer.TOKENIZER)


def _recognize(source: str, state: dict[str, Any], importers: dict[str, Any]) -> str:
    """The one family whose importer recognises ``state``'s keys (``--family auto``)."""
    found = [name for name, importer in importers.items() if importer.recognizes(state)]
    if len(found) == 1:
        return found[0]
    what = f"the keys of several families ({', '.join(found)})" if found else "no model family's keys"
    raise CheckpointFormatError(
        f"{source} has {what} (e.g. {sorted(state)[:5]}): pass --family, one of {sorted(importers)}"
    )


def _map(source: str, state: dict[str, Any], importer: Any, options: ImportOptions) -> Imported:
    """``state`` mapped by its family's importer; a file whose tensors do not fit is a one-line
    :class:`CheckpointFormatError` that names ``source``.
    """
    try:
        return importer.import_state(state, options)
    except CheckpointFormatError as exc:
        if source in str(exc):
            raise
        raise CheckpointFormatError(f"{source}: {exc}") from exc
    except (KeyError, IndexError, RuntimeError, TypeError) as exc:  # a tensor missing, or not of the shape read
        log.debug("import_checkpoint: %s does not fit", source, exc_info=True)
        what = f"it lacks {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        raise CheckpointFormatError(
            f"{source}: its tensors do not form the model their names suggest ({what[:300]}); check --family, "
            "--format and --kind, or that the file is complete"
        ) from exc


def _write(source: str, out: str, sha: str, mapped: Imported, source_tok: str) -> StepResult:
    """Save ``mapped`` with its tokenizer (``source_tok``) as a model directory at ``out``, and the import report
    beside it."""

    tok = load_tokenizer(source_tok)
    directory.check_vocab(tok, mapped.config, repr(source_tok))
    ckpt = save_model_weights(storage.join(out, WEIGHTS_DIR), mapped.weights)  # every model key, as mapped
    lineage = {"imported_from": source, "sha256": sha, "format": mapped.fmt, "tokenizer": source_tok}
    directory.save(
        out,
        kind=mapped.kind,
        config=mapped.config,
        checkpoint=ckpt,
        tokenizer=tok,
        answers=mapped.answers,
        lineage=lineage,
        steps=0,
        max_len=mapped.config.text.max_len,
        entities=[],
    )
    summary = mapped.report.summary()
    storage.write_text(storage.join(out, REPORT_FILE), json.dumps(summary, indent=2, sort_keys=True) + "\n")
    unmapped = sum(group["keys"] for group in summary["unmapped"])
    log.info(
        "import_checkpoint: %s (%s, %s) -> %s: %d tensors mapped, %d unmapped (see %s)",
        source, mapped.fmt, mapped.kind, out, summary["mapped"], unmapped, REPORT_FILE,
    )  # fmt: skip
    result: dict[str, Any] = {"import": summary, "sha256": sha, "model_kind": mapped.kind}
    if mapped.answers is not None:
        result["answers"] = len(mapped.answers)
    return result
