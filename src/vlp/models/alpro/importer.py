"""Released ALPRO weights -> vlp ALPRO modules: every key mapped or explained, every shape checked.

Two formats are read (key layouts written down from the reference code, see
``tests/fixtures/alpro_parity/README.md``):

- ``alpro``: salesforce/ALPRO's files. Pre-trained ``alpro_pretrained_ckpt.pt`` (``AlproForPretrain``:
  ``visual_encoder.model.*``, ``text_encoder.bert.*``, the MLM head ``text_encoder.cls.*``, ``vision_proj``,
  ``text_proj``, ``itm_head``, ``temp``, the PEM head ``mpm_head`` and the whole frozen ``prompter.*``);
  fine-tuned retrieval (the same minus ``prompter``/``mpm_head``); fine-tuned QA
  (``AlproForSequenceClassification``: ``text_encoder.*`` without ``bert.``, no MLM head, ``classifier``).
  A plain state dict.
- ``lavis``: salesforce/LAVIS's ``AlproRetrieval`` / ``AlproQA`` (``text_encoder.*`` without ``bert.``, no MLM
  head, no ViT classifier head), usually wrapped as ``{"model": state_dict, ...}``.

The architecture is read from the shapes (widths, depths, patch size, frame size, frames, vocabulary, text
positions, projection size, PEM entities, answers); what shapes cannot tell (attention heads, where BERT splits
into text and fusion layers) comes from the caller, with ALPRO's values as defaults (head width 64, the second
half of BERT fuses). Files are read with ``torch.load(weights_only=True)`` or safetensors: nothing but tensors
and plain containers is unpickled (:func:`read_checkpoint`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from vlp.data.video_text import CLIP_MEAN, CLIP_STD
from vlp.models.importing import (
    CheckpointFormatError,
    Imported,
    ImportOptions,
    ImportReport,
    check_mapping,
    read_answers,
)
from vlp.rng import seed_everything

TOKENIZER = "bert-base-uncased"  # the released weights' (BERT-base's WordPiece)
FORMATS = ("alpro", "lavis")
KINDS = ("prompter", "alpro", "alpro_retrieval", "alpro_qa")

# Source keys with no place in a vlp model, and why (first match wins).
_IGNORED = [
    (r"^prompter\.", "the frozen prompter (PEM's teacher in pre-training); import it with kind=prompter"),
    (
        r"(^|\.)visual_encoder\.model\.head\.",
        "the TimeSformer's Kinetics-400 classifier: unused by every ALPRO forward",
    ),
    (r"(^|\.)embeddings\.position_ids$", "BERT's position-index buffer: rebuilt, not learnt"),
    (r"(^|\.)embeddings\.token_type_ids$", "BERT's token-type buffer: rebuilt, not learnt"),
    (r"(^|\.)text_encoder\.(bert\.)?pooler\.", "BERT's pooler: unused by ALPRO"),
]


def recognizes(state: Mapping[str, Tensor]) -> bool:
    """Whether the keys are ALPRO's: a TimeSformer under ``visual_encoder.model.`` and BERT under ``text_encoder.``
    (ALBEF's ViT sits directly under ``visual_encoder.``)."""
    return any(k.startswith("visual_encoder.model.") for k in state) and any(
        k.startswith("text_encoder.") for k in state
    )


def import_state(state: Mapping[str, Tensor], options: ImportOptions) -> Imported:
    """An ALPRO file mapped onto the vlp model of its kind (format and kind read from the keys unless chosen)."""
    # here: asking every importer whether it recognises a file (--family auto) must not build every family's model code
    from vlp.models.alpro.model import FAMILY

    fmt = detect_format(state) if options.fmt == "auto" else options.fmt
    kind = detect_kind(state) if options.kind == "auto" else options.kind
    if fmt not in FORMATS or kind not in KINDS:
        raise ValueError(f"an ALPRO checkpoint's format must be one of {FORMATS} or auto, its kind one of {KINDS} or "
                         f"auto; got {options.fmt!r} / {options.kind!r}")  # fmt: skip
    config = infer_config(state, kind, video_heads=options.video_heads, text_heads=options.text_heads,
                          fusion_layers=options.fusion_layers, max_len=options.max_len)  # fmt: skip
    answers = None
    if kind == "alpro_qa":
        if not options.answers:
            raise ValueError("a QA checkpoint needs its answer vocabulary: pass --answers (train_ans2label.json)")
        answers = read_answers(options.answers, int(state["classifier.2.weight"].shape[0]))
    seed_everything(0)  # the parts a file lacks (LAVIS QA's unused projections) start the same every import
    model = FAMILY.build(kind, config, len(answers or []))
    weights, report = map_state_dict(state, model.state_dict(), kind, fmt, config.text.text_layers)
    return Imported(fmt, kind, config, weights, report, answers)


def detect_format(state: Mapping[str, Tensor]) -> str:
    """``alpro`` or ``lavis`` from the key layout (the ALPRO release keeps ``bert.`` or a classifier next to a
    ViT head; LAVIS drops both ``bert.`` and the ViT head)."""
    keys = list(state)
    if not any(k.startswith("visual_encoder.model.") for k in keys) or not any(
        k.startswith("text_encoder.") for k in keys
    ):
        raise CheckpointFormatError(
            "not an ALPRO checkpoint: expected visual_encoder.model.* and text_encoder.* keys, found e.g. "
            f"{sorted(keys)[:5]}"
        )
    if any(k.startswith(("text_encoder.bert.", "prompter.", "mpm_head.", "visual_encoder.model.head.")) for k in keys):
        return "alpro"
    return "lavis"


def detect_kind(state: Mapping[str, Tensor]) -> str:
    """``alpro_qa`` (a classifier), ``alpro`` (pre-trained: a PEM head or prompter), else ``alpro_retrieval``."""
    keys = list(state)
    if any(k.startswith("classifier.") for k in keys):
        return "alpro_qa"
    if any(k.startswith(("mpm_head.", "prompter.")) for k in keys):
        return "alpro"
    return "alpro_retrieval"


def _text_prefix(state: Mapping[str, Tensor], root: str) -> str:
    """``<root>text_encoder.bert.`` or ``<root>text_encoder.`` (whichever holds BERT's embeddings)."""
    for prefix in (f"{root}text_encoder.bert.", f"{root}text_encoder."):
        if f"{prefix}embeddings.word_embeddings.weight" in state:
            return prefix
    raise CheckpointFormatError(f"no BERT embeddings under {root}text_encoder.[bert.]embeddings.word_embeddings.weight")


def _count(state: Mapping[str, Tensor], pattern: str) -> int:
    found = {int(m.group(1)) for k in state if (m := re.match(pattern, k))}
    if found != set(range(len(found))):
        raise CheckpointFormatError(f"layer indices of {pattern!r} are not 0..n-1: {sorted(found)}")
    return len(found)


def infer_config(
    state: Mapping[str, Tensor],
    kind: str,
    *,
    video_heads: int = 0,
    text_heads: int = 0,
    fusion_layers: int = 0,
    max_len: int = 40,
) -> Any:
    """The :class:`vlp.models.alpro.model.AlproConfig` the shapes of ``state`` describe.

    Args:
        state: the source state dict.
        kind: what to build (see :data:`KINDS`); ``prompter`` reads the ``prompter.*`` sub-model.
        video_heads, text_heads: attention heads; 0 = width / 64 (ViT-B/16 and BERT-base: 12).
        fusion_layers: BERT layers that fuse; 0 = half of them (ALPRO: layers 7-12 of 12).
        max_len: text length for fine-tuning and evaluation (the released configs: 40).
    """
    # here (with the two below): the model code loads once a file is known to be ALPRO's (--family auto asks all)
    from vlp.models.alpro.model import LOSS_TERMS, AlproConfig
    from vlp.models.layers.timesformer import TimeSformerConfig
    from vlp.models.text import TextConfig

    root = "prompter." if kind == "prompter" else ""
    v, t = f"{root}visual_encoder.model.", _text_prefix(state, root)

    def shape(key: str) -> tuple[int, ...]:
        if key not in state:
            raise CheckpointFormatError(f"the checkpoint has no {key!r}, which a {kind!r} model needs")
        return tuple(state[key].shape)

    width, patch = shape(f"{v}cls_token")[-1], shape(f"{v}patch_embed.proj.weight")[-1]
    grid = round((shape(f"{v}pos_embed")[1] - 1) ** 0.5)
    if grid * grid + 1 != shape(f"{v}pos_embed")[1]:
        raise CheckpointFormatError(f"{v}pos_embed {shape(f'{v}pos_embed')} is not 1 + a square patch grid")
    video = TimeSformerConfig(
        img_size=grid * patch,
        patch_size=patch,
        num_frames=shape(f"{v}time_embed")[1],
        width=width,
        depth=_count(state, rf"^{re.escape(v)}blocks\.(\d+)\."),
        heads=video_heads or max(1, width // 64),
        mlp_ratio=shape(f"{v}blocks.0.mlp.fc1.weight")[0] / width,
    )
    vocab, text_width = shape(f"{t}embeddings.word_embeddings.weight")
    layers = _count(state, rf"^{re.escape(t)}encoder\.layer\.(\d+)\.")
    fusion = fusion_layers or layers // 2
    if not 0 <= fusion < layers:
        raise CheckpointFormatError(f"fusion_layers={fusion} must leave text layers among the {layers} BERT layers")
    positions = shape(f"{t}embeddings.position_embeddings.weight")[0]
    text = TextConfig(
        vocab_size=vocab,
        width=text_width,
        text_layers=layers - fusion,
        fusion_layers=fusion,
        heads=text_heads or max(1, text_width // 64),
        intermediate=shape(f"{t}encoder.layer.0.intermediate.dense.weight")[0],
        max_len=min(max_len, positions),
        max_positions=positions,
        type_vocab_size=shape(f"{t}embeddings.token_type_embeddings.weight")[0],
    )
    losses: tuple[str, ...]
    entities = 0
    if kind in ("prompter", "alpro_qa"):
        losses = ("vtc",)
    else:
        # a part counts as present when any of its keys is (a damaged key then fails loudly in the mapping)
        has = {
            term: any(k.startswith(prefix) for k in state)
            for term, prefix in (("pem", "mpm_head."), ("mlm", "text_encoder.cls."), ("vtm", "itm_head."))
        }
        if kind == "alpro_retrieval":
            has["pem"] = has["mlm"] = False  # a retrieval model ranks with VTC + VTM only
        losses = tuple(term for term in LOSS_TERMS if term == "vtc" or has.get(term))
        entities = shape("mpm_head.2.weight")[0] if has["pem"] else 0
    # LAVIS's AlproQA has no VTC projections (a QA model never uses them): they keep ALPRO's size, at init
    proj = f"{root}vision_proj.weight"
    embed_dim = 256 if kind == "alpro_qa" and proj not in state else shape(proj)[0]
    return AlproConfig(
        video,
        text,
        embed_dim=embed_dim,
        num_entities=entities,
        losses=losses,
        pixel_mean=CLIP_MEAN,  # the released configs' (config_release/*.json: img_pixel_mean/std)
        pixel_std=CLIP_STD,
    )


def _rules(kind: str, text_prefix: str, text_layers: int) -> list[tuple[str, Any]]:
    """``(source regex, vlp key template or callable)``, tried in order, for one kind."""
    root = "prompter." if kind == "prompter" else ""
    dual = "" if kind == "prompter" else "dual."
    t, v = re.escape(text_prefix), re.escape(f"{root}visual_encoder.model.")

    def layer(m: re.Match[str]) -> str:
        i, rest = int(m.group(1)), m.group(2)
        if i < text_layers:
            return f"{dual}text.layers.{i}.{rest}"
        if kind == "prompter":
            return ""  # a dual encoder has no fusion: the caller reports these as unmapped
        return f"fusion.layers.{i - text_layers}.{rest}"

    rules: list[tuple[str, Any]] = [
        (rf"^{v}(?!head\.)(.+)$", lambda m: f"{dual}video.{m.group(1)}"),
        (rf"^{t}embeddings\.(?!position_ids$|token_type_ids$)(.+)$", lambda m: f"{dual}text.embeddings.{m.group(1)}"),
        (rf"^{t}encoder\.layer\.(\d+)\.(.+)$", layer),
        (rf"^{re.escape(root)}vision_proj\.(.+)$", lambda m: f"{dual}video_proj.{m.group(1)}"),
        (rf"^{re.escape(root)}text_proj\.(.+)$", lambda m: f"{dual}text_proj.{m.group(1)}"),
        (rf"^{re.escape(root)}temp$", lambda m: f"{dual}temp"),
    ]
    if kind != "prompter":
        rules += [
            (r"^itm_head\.(.+)$", lambda m: f"vtm_head.{m.group(1)}"),
            (r"^mpm_head\.([02]\..+)$", lambda m: f"pem_head.{m.group(1)}"),
            (r"^classifier\.([02]\..+)$", lambda m: f"classifier.{m.group(1)}"),
            (r"^text_encoder\.cls\.predictions\.transform\.(.+)$", lambda m: f"mlm_head.transform.{m.group(1)}"),
            (r"^text_encoder\.cls\.predictions\.bias$", lambda m: "mlm_head.bias"),
        ]
    return rules


_UNUSED_BY_QA = ("dual.video_proj.", "dual.text_proj.", "dual.temp")


def map_state_dict(
    state: Mapping[str, Tensor], target: Mapping[str, Tensor], kind: str, fmt: str, text_layers: int
) -> tuple[dict[str, Tensor], ImportReport]:
    """Source tensors renamed to ``target``'s keys (a vlp module's ``state_dict()``), float32.

    Every target key must be filled with the right shape (a QA model's unused VTC projections and temperature
    may be absent, as in LAVIS's ``AlproQA``: they keep ``target``'s values, listed in ``kept_init``); every
    source key is mapped, a checked tied copy
    (the MLM decoder), or listed in the report's ``unmapped`` with its reason. A source key that fits no rule
    and no known reason is an error: nothing is dropped silently.

    Raises:
        CheckpointFormatError: unknown source keys, target keys the file lacks, or shape mismatches (all listed).
    """
    root = "prompter." if kind == "prompter" else ""
    prefix = _text_prefix(state, root)
    rules = [(re.compile(p), to) for p, to in _rules(kind, prefix, text_layers)]
    report = ImportReport(format=fmt, kind=kind)
    out: dict[str, Tensor] = {}
    unknown, shapes = [], []
    for key, value in state.items():
        name = None
        for pattern, to in rules:
            if m := pattern.match(key):
                name = to(m)
                break
        if name is None or name == "" or name not in target:
            # a name for a part the model has (a misspelt key, say) is an error; only absent parts are explained
            why = None if name and _has_part(target, name) else _why_unmapped(key, kind, name)
            if why is None:
                unknown.append(key)
            else:
                report.unmapped[key] = why
            continue
        if tuple(value.shape) != tuple(target[name].shape):
            shapes.append(f"{key} {tuple(value.shape)} -> {name} {tuple(target[name].shape)}")
            continue
        out[name] = value.detach().to(torch.float32).clone()
        report.mapped[name] = key
    _check_ties(state, root, prefix, report)
    missing = sorted(set(target) - set(out))
    if kind == "alpro_qa":  # the VTC projections and temperature of a QA model: unused, so kept at their init
        report.kept_init = [k for k in missing if k.startswith(_UNUSED_BY_QA)]
        out |= {k: target[k].detach().clone() for k in report.kept_init}
        missing = [k for k in missing if k not in report.kept_init]
    check_mapping(fmt, kind, unknown, missing, shapes)
    return out, report


def _has_part(target: Mapping[str, Tensor], name: str) -> bool:
    """Whether ``target`` has the module ``name`` belongs to (``vtm_head`` for ``vtm_head.weight``)."""
    parts = name.split(".")
    module = ".".join(parts[:2] if parts[0] == "dual" else parts[:1]) + "."
    return any(k == name or k.startswith(module) for k in target)


def _why_unmapped(key: str, kind: str, name: str | None) -> str | None:
    """Why a source key has no place in a ``kind`` model, or None when it is unexplained (an error)."""
    for pattern, why in _IGNORED:
        if re.search(pattern, key):
            if kind == "prompter" and pattern == _IGNORED[0][0]:
                continue  # importing the prompter: its keys are not ignored wholesale
            return why
    if re.match(r"^(prompter\.)?text_encoder\.cls\.predictions\.decoder\.", key) and (
        key.startswith("prompter.") == (kind == "prompter")
    ):
        return "MLM decoder: tied to the word embeddings and the MLM bias (checked equal)"
    if name == "":
        return "a fusion layer: the prompter is a dual encoder and has none"
    if kind == "prompter":
        if key.startswith("prompter."):
            return "unused by a prompter (trained with VTC only): its MLM / VTM heads and prompt embeddings"
        return "part of ALPRO, not of its prompter"
    unused = {
        "mpm_head.": "the PEM head: only pre-training uses it",
        "text_encoder.cls.": "the MLM head: a fine-tuned model has none",
        "itm_head.": "the VTM head: a QA model has none",
        "vision_proj.": "a VTC projection: a QA model has none",
        "text_proj.": "a VTC projection: a QA model has none",
        "temp": "the VTC temperature: a QA model has none",
    }
    for start, why in unused.items():
        if key.startswith(start) and name is not None:
            return why
    if key.startswith("classifier.") and name is not None:
        return "the QA classifier: only a QA model has one"
    return None


def _check_ties(state: Mapping[str, Tensor], root: str, prefix: str, report: ImportReport) -> None:
    """The MLM decoder is tied to the word embeddings (and its bias to the head's); vlp stores one copy, so the
    file's copies must be equal, or the import would change the model."""
    pairs = [
        (f"{root}text_encoder.cls.predictions.decoder.weight", f"{prefix}embeddings.word_embeddings.weight"),
        (f"{root}text_encoder.cls.predictions.decoder.bias", f"{root}text_encoder.cls.predictions.bias"),
    ]
    for copy, owner in pairs:
        if copy in state and owner in state:
            if not torch.equal(state[copy], state[owner]):
                raise CheckpointFormatError(f"{copy} differs from {owner}: vlp's MLM head is tied and cannot hold both")
            report.checked_ties.append(f"{copy} == {owner}")
