"""Step: ``import-checkpoint``, released ALPRO, ALBEF or TS2-Net weights -> a vlp model directory.

The output is what ``finetune-*`` and ``evaluate-*`` accept (:mod:`vlp.models.directory`): ``model.json``
(kind, config read from the shapes, lineage: the file and its SHA-256), ``tokenizer/``, ``weights/`` and, for
QA, ``answers.json``; plus ``import_report.json``, which lists every source key that has no place in the model
and why. See :mod:`vlp.models.import_alpro`, :mod:`vlp.models.import_albef` and :mod:`vlp.models.import_ts2net` for
the formats.
"""

from __future__ import annotations

import json
import logging
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
    """

    def _import_ts2net(state: dict[str, Any], sha: str) -> StepResult:
        from vlp.models import import_ts2net

        if kind not in ("auto", "ts2net_retrieval") or fmt not in ("auto", "ts2net") or answers:
            raise ValueError("a TS2-Net checkpoint is a retrieval model (kind ts2net_retrieval, format ts2net); it "
                             "has no answers")  # fmt: skip
        model_cfg, weights, report = import_ts2net.build(state, num_frames=num_frames)
        return _write("ts2net", "ts2net_retrieval", model_cfg, weights, report, sha, None)

    def _import_albef(state: dict[str, Any], sha: str) -> StepResult:
        from vlp.models import albef, import_albef

        chosen_fmt = import_albef.detect_format(state) if fmt == "auto" else fmt
        chosen_kind = import_albef.detect_kind(state) if kind == "auto" else kind
        if chosen_fmt not in import_albef.FORMATS or chosen_kind not in import_albef.KINDS:
            raise ValueError(
                f"an ALBEF checkpoint's format must be one of {import_albef.FORMATS} or auto, its kind one of "
                f"{import_albef.KINDS} or auto; got {fmt!r} / {kind!r}"
            )
        if answers:
            raise ValueError("--answers is for ALPRO QA checkpoints; an ALBEF import builds no QA model")
        model_cfg = import_albef.infer_config(
            state, chosen_kind, video_heads=video_heads, text_heads=text_heads, num_frames=num_frames, max_len=max_len
        )
        seed_model_init(0)
        model = albef.FAMILY.build(chosen_kind, model_cfg)
        weights, report = import_albef.map_state_dict(
            state, model.state_dict(), chosen_kind, chosen_fmt, model_cfg.text.text_layers
        )
        return _write(chosen_fmt, chosen_kind, model_cfg, weights, report, sha, None)

    def _write(
        chosen_fmt: str, chosen_kind: str, model_cfg: Any, weights: Any, report: Any, sha: str, answer_list: Any
    ) -> StepResult:
        from vlp.models.tokenizer import load_tokenizer
        from vlp.train.checkpoint import save_model_weights

        source_tok = tokenizer or (CLIP_TOKENIZER if chosen_fmt == "ts2net" else "bert-base-uncased")
        tok = load_tokenizer(source_tok)
        directory.check_vocab(tok, model_cfg, repr(source_tok))
        ckpt = save_model_weights(storage.join(out, WEIGHTS_DIR), weights)  # every model key, as mapped
        lineage = {"imported_from": source, "sha256": sha, "format": chosen_fmt, "tokenizer": source_tok}
        directory.save(
            out,
            kind=chosen_kind,
            config=model_cfg,
            checkpoint=ckpt,
            tokenizer=tok,
            answers=answer_list,
            lineage=lineage,
            steps=0,
            max_len=model_cfg.text.max_len,
            entities=[],
        )
        summary = report.summary()
        storage.write_text(storage.join(out, REPORT_FILE), json.dumps(summary, indent=2, sort_keys=True) + "\n")
        unmapped = sum(group["keys"] for group in summary["unmapped"])
        log.info(
            "import_checkpoint: %s (%s, %s) -> %s: %d tensors mapped, %d unmapped (see %s)",
            source, chosen_fmt, chosen_kind, out, summary["mapped"], unmapped, REPORT_FILE,
        )  # fmt: skip
        result: dict[str, Any] = {"import": summary, "sha256": sha, "model_kind": chosen_kind}
        if answer_list is not None:
            result["answers"] = len(answer_list)
        return result

    def work() -> StepResult:
        from vlp.models import alpro, import_albef, import_ts2net
        from vlp.models import import_alpro as imp

        state, sha = imp.read_checkpoint(source)
        if family not in ("auto", "alpro", "albef", "ts2net"):
            raise ValueError(f"family must be alpro, albef, ts2net or auto, got {family!r}")
        if family == "ts2net" or (family == "auto" and import_ts2net.is_ts2net(state)):
            return _import_ts2net(state, sha)
        if family == "albef" or (family == "auto" and import_albef.is_albef(state)):
            return _import_albef(state, sha)
        chosen_fmt = imp.detect_format(state) if fmt == "auto" else fmt
        chosen_kind = imp.detect_kind(state) if kind == "auto" else kind
        if chosen_fmt not in imp.FORMATS or chosen_kind not in imp.KINDS:
            raise ValueError(f"format must be one of {imp.FORMATS} or auto, kind one of {imp.KINDS} or auto")
        model_cfg = imp.infer_config(
            state,
            chosen_kind,
            video_heads=video_heads,
            text_heads=text_heads,
            fusion_layers=fusion_layers,
            max_len=max_len,
        )
        answer_list = None
        if chosen_kind == "alpro_qa":
            if not answers:
                raise ValueError("a QA checkpoint needs its answer vocabulary: pass --answers (train_ans2label.json)")
            answer_list = read_answers(answers, int(state["classifier.2.weight"].shape[0]))
        seed_model_init(0)  # the parts a file lacks (LAVIS QA's unused projections) start the same every import
        model = alpro.FAMILY.build(chosen_kind, model_cfg, len(answer_list or []))
        weights, report = imp.map_state_dict(
            state, model.state_dict(), chosen_kind, chosen_fmt, model_cfg.text.text_layers
        )
        return _write(chosen_fmt, chosen_kind, model_cfg, weights, report, sha, answer_list)

    return run_step("import_checkpoint", out, cfg, "model", work)
