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
from dataclasses import dataclass
from typing import Any

from vlp import storage
from vlp.config import Config
from vlp.models import directory
from vlp.steps.common import StepResult, run_step, seed_model_init

log = logging.getLogger("vlp")
REPORT_FILE = "import_report.json"
CLIP_TOKENIZER = "openai/clip-vit-base-patch32"  # TS2-Net's (CLIP's BPE; ViT-B/16 shares it)
WEIGHTS_DIR = "weights"


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
    """Turn an ALPRO or ALBEF (salesforce/ALPRO, salesforce/ALBEF or LAVIS) checkpoint into a vlp model directory
    at ``out``.

    Args:
        source: the checkpoint file (local or ``s3://``; ``.pt``/``.pth``/``.bin`` or ``.safetensors``).
        out: the model directory to write.
        cfg: the config (storage settings).
        fmt: ``alpro``, ``lavis`` or ``auto`` (from the key layout).
        kind: ``alpro`` (pre-trained), ``alpro_retrieval``, ``alpro_qa``, ``prompter`` (the pre-trained file's
            frozen prompter) or ``auto`` (classifier -> QA; PEM head or prompter -> pre-trained; else retrieval).
        tokenizer: the tokenizer the weights were trained with: a hub name or local / ``s3://`` directory
            (``""``: the family's, ``bert-base-uncased`` for ALPRO / ALBEF, CLIP's for TS2-Net).
        answers: QA only: the answer vocabulary (JSON list, or ALPRO's ``{answer: label}``).
        video_heads, text_heads: attention heads; 0 = width / 64 (12 for ALPRO's ViT-B and BERT-base).
        fusion_layers: BERT layers that fuse; 0 = half (ALPRO: 6 of 12).
        max_len: text length the fine-tuning and evaluation steps use by default (released configs: 40).
        family: ``alpro``, ``albef``, ``ts2net`` or ``auto`` (from the keys: a ViT directly under
            ``visual_encoder.`` is ALBEF's, OpenAI's CLIP under ``clip.`` TS2-Net's). For ALBEF, ``fmt`` is
            ``albef`` / ``lavis`` / ``auto`` and ``kind`` ``albef`` (pre-trained, with the MLM head) /
            ``albef_retrieval`` / ``auto``; the fusion split is read from the cross-attention keys
            (``fusion_layers`` is ignored). TS2-Net: ``ts2net_retrieval`` only, shapes and rules from the keys.
        num_frames: ALBEF: frames per clip its (zero) time embedding is sized for; TS2-Net: frames per clip.

    Raises:
        CheckpointFormatError: a file that is not a checkpoint of tensors (damaged, random bytes, a header that
            declares more than the file holds, a pickle of other objects) or whose tensors do not fit the model
            their names suggest; one line that names ``source``. Nothing is unpickled but tensors.
    """
    opts = _Options(fmt, kind, tokenizer, answers, video_heads, text_heads, fusion_layers, max_len, family, num_frames)

    def work() -> StepResult:
        from vlp.models.alpro.importer import read_checkpoint

        if family not in ("auto", "alpro", "albef", "ts2net"):
            raise ValueError(f"family must be alpro, albef, ts2net or auto, got {family!r}")
        state, sha = read_checkpoint(source)
        return _write(source, out, sha, _map(source, state, opts), opts)

    return run_step("import_checkpoint", out, cfg, "model", work)


@dataclass(frozen=True)
class _Options:
    """The choices of :func:`import_checkpoint` (see its arguments)."""

    fmt: str
    kind: str
    tokenizer: str
    answers: str
    video_heads: int
    text_heads: int
    fusion_layers: int
    max_len: int
    family: str
    num_frames: int


@dataclass
class _Mapped:
    """A checkpoint mapped onto a vlp model: what :func:`_write` saves."""

    fmt: str
    kind: str
    config: Any
    weights: dict[str, Any]
    report: Any
    answers: list[str] | None = None


def _map(source: str, state: dict[str, Any], opts: _Options) -> _Mapped:
    """``state`` mapped by its family's importer; a file whose tensors do not fit is a one-line
    :class:`CheckpointFormatError` that names ``source``.
    """
    from vlp.models.albef import importer as import_albef
    from vlp.models.alpro.importer import CheckpointFormatError
    from vlp.models.ts2net import importer as import_ts2net

    try:
        if opts.family == "ts2net" or (opts.family == "auto" and import_ts2net.is_ts2net(state)):
            return _map_ts2net(state, opts)
        if opts.family == "albef" or (opts.family == "auto" and import_albef.is_albef(state)):
            return _map_albef(state, opts)
        return _map_alpro(state, opts)
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


def _map_ts2net(state: dict[str, Any], opts: _Options) -> _Mapped:
    from vlp.models.ts2net import importer as import_ts2net

    if opts.kind not in ("auto", "ts2net_retrieval") or opts.fmt not in ("auto", "ts2net") or opts.answers:
        raise ValueError("a TS2-Net checkpoint is a retrieval model (kind ts2net_retrieval, format ts2net); it "
                         "has no answers")  # fmt: skip
    model_cfg, weights, report = import_ts2net.build(state, num_frames=opts.num_frames)
    return _Mapped("ts2net", "ts2net_retrieval", model_cfg, weights, report)


def _map_albef(state: dict[str, Any], opts: _Options) -> _Mapped:
    from vlp.models.albef import importer as import_albef
    from vlp.models.albef import model as albef

    chosen_fmt = import_albef.detect_format(state) if opts.fmt == "auto" else opts.fmt
    chosen_kind = import_albef.detect_kind(state) if opts.kind == "auto" else opts.kind
    if chosen_fmt not in import_albef.FORMATS or chosen_kind not in import_albef.KINDS:
        raise ValueError(
            f"an ALBEF checkpoint's format must be one of {import_albef.FORMATS} or auto, its kind one of "
            f"{import_albef.KINDS} or auto; got {opts.fmt!r} / {opts.kind!r}"
        )
    if opts.answers:
        raise ValueError("--answers is for ALPRO QA checkpoints; an ALBEF import builds no QA model")
    model_cfg = import_albef.infer_config(
        state,
        chosen_kind,
        video_heads=opts.video_heads,
        text_heads=opts.text_heads,
        num_frames=opts.num_frames,
        max_len=opts.max_len,
    )
    seed_model_init(0)
    model = albef.FAMILY.build(chosen_kind, model_cfg)
    weights, report = import_albef.map_state_dict(
        state, model.state_dict(), chosen_kind, chosen_fmt, model_cfg.text.text_layers
    )
    return _Mapped(chosen_fmt, chosen_kind, model_cfg, weights, report)


def _map_alpro(state: dict[str, Any], opts: _Options) -> _Mapped:
    from vlp.models.alpro import importer as imp
    from vlp.models.alpro import model as alpro

    chosen_fmt = imp.detect_format(state) if opts.fmt == "auto" else opts.fmt
    chosen_kind = imp.detect_kind(state) if opts.kind == "auto" else opts.kind
    if chosen_fmt not in imp.FORMATS or chosen_kind not in imp.KINDS:
        raise ValueError(f"format must be one of {imp.FORMATS} or auto, kind one of {imp.KINDS} or auto")
    model_cfg = imp.infer_config(
        state,
        chosen_kind,
        video_heads=opts.video_heads,
        text_heads=opts.text_heads,
        fusion_layers=opts.fusion_layers,
        max_len=opts.max_len,
    )
    answer_list = None
    if chosen_kind == "alpro_qa":
        if not opts.answers:
            raise ValueError("a QA checkpoint needs its answer vocabulary: pass --answers (train_ans2label.json)")
        answer_list = read_answers(opts.answers, int(state["classifier.2.weight"].shape[0]))
    seed_model_init(0)  # the parts a file lacks (LAVIS QA's unused projections) start the same every import
    model = alpro.FAMILY.build(chosen_kind, model_cfg, len(answer_list or []))
    weights, report = imp.map_state_dict(state, model.state_dict(), chosen_kind, chosen_fmt, model_cfg.text.text_layers)
    return _Mapped(chosen_fmt, chosen_kind, model_cfg, weights, report, answer_list)


def _write(source: str, out: str, sha: str, mapped: _Mapped, opts: _Options) -> StepResult:
    """Save ``mapped`` with its tokenizer as a model directory at ``out``, and the import report beside it."""
    from vlp.models.tokenizer import load_tokenizer
    from vlp.train.checkpoint import save_model_weights

    source_tok = opts.tokenizer or (CLIP_TOKENIZER if mapped.fmt == "ts2net" else "bert-base-uncased")
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
