"""Released ALBEF weights -> a vlp :class:`vlp.models.albef.model.Albef`: every key mapped or explained, every shape
checked.

Two formats are read (key layouts written down from the reference code, see
``tests/fixtures/albef_parity/README.md``); both are a state dict, usually wrapped as ``{"model": ...}``:

- ``albef``: salesforce/ALBEF's files. Pre-trained ``ALBEF_4M.pth`` / ``ALBEF.pth`` (``models/model_pretrain.py``:
  ``visual_encoder.*``, ``text_encoder.bert.*`` with token-type embeddings, the MLM head ``text_encoder.cls.*``,
  ``vision_proj``, ``text_proj``, ``itm_head``, ``temp``, the momentum copies ``*_m.*`` and the queues
  ``image_queue`` / ``text_queue`` / ``queue_ptr``); fine-tuned retrieval (``models/model_retrieval.py``:
  ``text_encoder.*`` without ``bert.``, no MLM head, plus ``idx_queue``).
- ``lavis``: salesforce/LAVIS's ``AlbefPretrain`` / ``AlbefRetrieval`` (``lavis.models.albef_models``): the same
  names, but its BERT (``med_config_albef.json``: ``add_type_embeddings: false``) has **no token-type
  embeddings**. vlp's text tower always adds row 0 of its token-type table, so a LAVIS import gets a zero table
  (the same numbers). This is also why the official pre-trained files do not reproduce their own numbers in
  LAVIS (LAVIS issue #203): LAVIS drops their trained token-type row.

The architecture is read from the shapes (widths, depths, patch and image size, vocabulary, text positions,
projection size, queue length); the BERT layers that fuse are those with ``crossattention`` weights. What
shapes cannot tell (attention heads) comes from the caller, width / 64 by default (ViT-B/16, BERT-base: 12).
Files are read with ``torch.load(weights_only=True)`` or safetensors only (:func:`read_checkpoint`).
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
    read_checkpoint,
)
from vlp.rng import seed_everything

__all__ = [
    "FORMATS",
    "KINDS",
    "detect_format",
    "detect_kind",
    "import_state",
    "infer_config",
    "map_state_dict",
    "read_checkpoint",
    "recognizes",
]

TOKENIZER = "bert-base-uncased"  # the released weights' (BERT-base's WordPiece)
FORMATS = ("albef", "lavis")
KINDS = ("albef", "albef_retrieval")
_TOWERS = (("", "online."), ("_m", "momentum."))

# Source keys with no place in a vlp ALBEF, and why (first match wins).
_IGNORED = [
    (r"(^|\.)embeddings\.position_ids$", "BERT's position-index buffer: rebuilt, not learnt"),
    (r"(^|\.)embeddings\.token_type_ids$", "BERT's token-type buffer: rebuilt, not learnt"),
    (r"^text_encoder(_m)?\.(bert\.)?pooler\.", "BERT's pooler: unused by ALBEF"),
    (r"^visual_encoder(_m)?\.head\.", "the ViT's ImageNet classifier: unused by ALBEF"),
    (
        r"^text_encoder(_m)?\.cls\.predictions\.decoder\.",
        "MLM decoder: tied to the word embeddings and the MLM bias (checked equal)",
    ),
]


def import_state(state: Mapping[str, Tensor], options: ImportOptions) -> Imported:
    """An ALBEF file mapped onto the vlp model of its kind (format and kind read from the keys unless chosen); the
    fusion split is read from the cross-attention keys (``options.fusion_layers`` is not used)."""
    # here: asking every importer whether it recognises a file (--family auto) must not build every family's model code
    from vlp.models.albef.model import FAMILY

    fmt = detect_format(state) if options.fmt == "auto" else options.fmt
    kind = detect_kind(state) if options.kind == "auto" else options.kind
    if fmt not in FORMATS or kind not in KINDS:
        raise ValueError(f"an ALBEF checkpoint's format must be one of {FORMATS} or auto, its kind one of {KINDS} or "
                         f"auto; got {options.fmt!r} / {options.kind!r}")  # fmt: skip
    if options.answers:
        raise ValueError("--answers is for ALPRO QA checkpoints; an ALBEF import builds no QA model")
    config = infer_config(state, kind, video_heads=options.video_heads, text_heads=options.text_heads,
                          num_frames=options.num_frames, max_len=options.max_len)  # fmt: skip
    seed_everything(0)
    model = FAMILY.build(kind, config)
    weights, report = map_state_dict(state, model.state_dict(), kind, fmt, config.text.text_layers)
    return Imported(fmt, kind, config, weights, report)


def recognizes(state: Mapping[str, Tensor]) -> bool:
    """Whether the keys look like ALBEF's (a ViT directly under ``visual_encoder.``, BERT under ``text_encoder.``);
    ALPRO's TimeSformer sits under ``visual_encoder.model.``."""
    return "visual_encoder.cls_token" in state and any(k.startswith("text_encoder.") for k in state)


def _text_prefix(state: Mapping[str, Tensor], suffix: str = "") -> str:
    for prefix in (f"text_encoder{suffix}.bert.", f"text_encoder{suffix}."):
        if f"{prefix}embeddings.word_embeddings.weight" in state:
            return prefix
    raise CheckpointFormatError(
        f"no BERT embeddings under text_encoder{suffix}.[bert.]embeddings.word_embeddings.weight"
    )


def detect_format(state: Mapping[str, Tensor]) -> str:
    """``albef`` (the release: BERT with token-type embeddings) or ``lavis`` (none)."""
    if not recognizes(state):
        raise CheckpointFormatError(
            "not an ALBEF checkpoint: expected visual_encoder.cls_token and text_encoder.* keys, found e.g. "
            f"{sorted(state)[:5]}"
        )
    return "albef" if f"{_text_prefix(state)}embeddings.token_type_embeddings.weight" in state else "lavis"


def detect_kind(state: Mapping[str, Tensor]) -> str:
    """``albef`` (pre-trained: an MLM head) or ``albef_retrieval``."""
    return "albef" if any(k.startswith("text_encoder.cls.") for k in state) else "albef_retrieval"


def _count(state: Mapping[str, Tensor], pattern: str) -> set[int]:
    found = {int(m.group(1)) for k in state if (m := re.match(pattern, k))}
    if found != set(range(len(found))):
        raise CheckpointFormatError(f"layer indices of {pattern!r} are not 0..n-1: {sorted(found)}")
    return found


def fusion_start(state: Mapping[str, Tensor]) -> tuple[int, int]:
    """``(first fusion layer, BERT layers)``: the layers with ``crossattention`` weights must be the last ones."""
    t = re.escape(_text_prefix(state))
    layers = len(_count(state, rf"^{t}encoder\.layer\.(\d+)\."))
    cross = sorted(
        {int(m.group(1)) for k in state if (m := re.match(rf"^{t}encoder\.layer\.(\d+)\.crossattention\.", k))}
    )
    if not cross or cross != list(range(cross[0], layers)) or cross[0] == 0:
        raise CheckpointFormatError(
            f"ALBEF's multimodal layers are the last BERT layers with cross-attention; this file has cross-attention "
            f"in layers {cross} of {layers}"
        )
    return cross[0], layers


def infer_config(
    state: Mapping[str, Tensor],
    kind: str,
    *,
    video_heads: int = 0,
    text_heads: int = 0,
    num_frames: int = 1,
    max_len: int = 30,
) -> Any:
    """The :class:`vlp.models.albef.towers.AlbefConfig` the shapes of ``state`` describe.

    Args:
        state: the source state dict.
        kind: ``albef`` (pre-trained: ITC + MLM + ITM) or ``albef_retrieval`` (ITC + ITM, the same-clip rule of
            ALBEF's retrieval fine-tuning).
        video_heads, text_heads: attention heads; 0 = width / 64.
        num_frames: frames per clip the time embedding is sized for (it starts at zero: an image is a 1-frame clip).
        max_len: text length for fine-tuning and evaluation (ALBEF: 30).
    """
    # here (with the two below): the model code loads once a file is known to be ALBEF's (--family auto asks all)
    from vlp.models.albef.towers import AlbefConfig
    from vlp.models.layers.vit import FrameViTConfig
    from vlp.models.text import TextConfig

    def shape(key: str) -> tuple[int, ...]:
        if key not in state:
            raise CheckpointFormatError(f"the checkpoint has no {key!r}, which a {kind!r} model needs")
        return tuple(state[key].shape)

    v, t = "visual_encoder.", _text_prefix(state)
    width, patch = shape(f"{v}cls_token")[-1], shape(f"{v}patch_embed.proj.weight")[-1]
    positions_v = shape(f"{v}pos_embed")[1]
    grid = round((positions_v - 1) ** 0.5)
    if grid * grid + 1 != positions_v:
        raise CheckpointFormatError(f"{v}pos_embed {shape(f'{v}pos_embed')} is not 1 + a square patch grid")
    video = FrameViTConfig(
        img_size=grid * patch,
        patch_size=patch,
        num_frames=num_frames,
        width=width,
        depth=len(_count(state, rf"^{re.escape(v)}blocks\.(\d+)\.")),
        heads=video_heads or max(1, width // 64),
        mlp_ratio=shape(f"{v}blocks.0.mlp.fc1.weight")[0] / width,
    )
    vocab, text_width = shape(f"{t}embeddings.word_embeddings.weight")
    first, layers = fusion_start(state)
    positions = shape(f"{t}embeddings.position_embeddings.weight")[0]
    types = f"{t}embeddings.token_type_embeddings.weight"
    text = TextConfig(
        vocab_size=vocab,
        width=text_width,
        text_layers=first,
        fusion_layers=layers - first,
        heads=text_heads or max(1, text_width // 64),
        intermediate=shape(f"{t}encoder.layer.0.intermediate.dense.weight")[0],
        max_len=min(max_len, positions),
        max_positions=positions,
        type_vocab_size=shape(types)[0] if types in state else 2,
    )
    if kind not in KINDS:
        raise CheckpointFormatError(f"kind must be one of {KINDS}, got {kind!r}")
    losses = ("itc", "mlm", "itm") if kind == "albef" else ("itc", "itm")
    return AlbefConfig(
        video,
        text,
        embed_dim=shape("vision_proj.weight")[0],
        queue_size=shape("image_queue")[1] if "image_queue" in state else 0,
        losses=losses,
        same_video="positive" if kind == "albef_retrieval" else "negative",
        pixel_mean=CLIP_MEAN,
        pixel_std=CLIP_STD,
    )


def _rules(state: Mapping[str, Tensor], text_layers: int) -> list[tuple[re.Pattern[str], Any]]:
    """``(source regex, vlp key builder)`` for the online and the momentum tower, then the shared parts."""
    rules: list[tuple[str, Any]] = []
    for suffix, tower in _TOWERS:
        try:
            t = re.escape(_text_prefix(state, suffix))
        except CheckpointFormatError:
            t = re.escape(f"text_encoder{suffix}.")  # no such tower in the file: its keys (if any) fail loudly

        def layer(m: re.Match[str], tower: str = tower) -> str:
            i, rest = int(m.group(1)), m.group(2)
            if i < text_layers:
                return f"{tower}text.layers.{i}.{rest}"
            return f"{tower}fusion.layers.{i - text_layers}.{rest}"

        rules += [
            (rf"^visual_encoder{suffix}\.(?!head\.)(.+)$", lambda m, tw=tower: f"{tw}visual.{m.group(1)}"),
            (
                rf"^{t}embeddings\.(?!position_ids$|token_type_ids$)(.+)$",
                lambda m, tw=tower: f"{tw}text.embeddings.{m.group(1)}",
            ),
            (rf"^{t}encoder\.layer\.(\d+)\.(.+)$", layer),
            (rf"^vision_proj{suffix}\.(.+)$", lambda m, tw=tower: f"{tw}vision_proj.{m.group(1)}"),
            (rf"^text_proj{suffix}\.(.+)$", lambda m, tw=tower: f"{tw}text_proj.{m.group(1)}"),
            (
                rf"^text_encoder{suffix}\.cls\.predictions\.transform\.(.+)$",
                lambda m, tw=tower: f"{tw}mlm_head.transform.{m.group(1)}",
            ),
            (rf"^text_encoder{suffix}\.cls\.predictions\.bias$", lambda m, tw=tower: f"{tw}mlm_head.bias"),
        ]
    rules += [
        (r"^itm_head\.(.+)$", lambda m: f"itm_head.{m.group(1)}"),
        (r"^(temp|image_queue|text_queue|idx_queue|queue_ptr)$", lambda m: m.group(1)),
    ]
    return [(re.compile(p), to) for p, to in rules]


def _convert(name: str, value: Tensor, target: Tensor) -> Tensor:
    """The file's tensor in the target's layout: ALBEF's ``queue_ptr`` is ``(1,)`` and ``idx_queue`` ``(1, M)``
    with -100 for "no id" (vlp: ``()``, ``(M,)``, -1); everything else as stored, in the target's dtype."""
    if name in ("queue_ptr", "idx_queue") and value.dim() == target.dim() + 1 and value.shape[0] == 1:
        value = value[0]
    if name == "idx_queue":
        value = torch.where(value < 0, torch.full_like(value, -1), value)
    return value.detach().to(target.dtype).clone()


def _filled(name: str, fmt: str) -> str | None:
    """Why a model key the file lacks may start at zero without changing any output (None: it may not)."""
    if re.match(r"^(online|momentum)\.visual\.time_embed$", name):
        return "the frame time embedding (vlp's, for clips): zero, so an image is encoded exactly as ALBEF does"
    if fmt == "lavis" and re.match(r"^(online|momentum)\.text\.embeddings\.token_type_embeddings\.weight$", name):
        return "LAVIS's ALBEF BERT has no token-type embeddings: a zero table adds nothing, as LAVIS"
    if name == "steps":
        return "vlp's training-forward counter (alpha's ramp): starts at 0"
    if name == "idx_queue":
        return "the clip-id queue (a pre-trained ALBEF has none): every entry -1, no id"
    return None


def map_state_dict(
    state: Mapping[str, Tensor], target: Mapping[str, Tensor], kind: str, fmt: str, text_layers: int
) -> tuple[dict[str, Tensor], ImportReport]:
    """Source tensors renamed to ``target``'s keys (an :class:`~vlp.models.albef.model.Albef`'s ``state_dict()``).

    Every source key is mapped, a checked tied copy (the MLM decoders) or listed in the report's ``unmapped``
    with its reason; every target key is filled with the right shape. Target keys the file lacks are allowed
    only where zero / the fresh value is exactly what the reference computes (``kept_init``: the time embedding,
    LAVIS's absent token types, the step counter, a pre-trained file's clip-id queue). A file without momentum
    weights gets a copy of the online ones (as ALBEF's ``copy_params``), listed in ``kept_init``.

    Raises:
        CheckpointFormatError: unknown source keys, target keys the file lacks, shape mismatches (all listed), or
            a tied copy that differs.
    """
    rules = _rules(state, text_layers)
    report = ImportReport(format=fmt, kind=kind)
    out: dict[str, Tensor] = {}
    unknown, shapes = [], []
    for key, value in state.items():
        name = next((to(m) for pattern, to in rules if (m := pattern.match(key))), None)
        if name is None or name not in target:
            why = _why_unmapped(key, name, target)
            if why is None:
                unknown.append(key)
            else:
                report.unmapped[key] = why
            continue
        converted = _convert(name, value, target[name])
        if tuple(converted.shape) != tuple(target[name].shape):
            shapes.append(f"{key} {tuple(value.shape)} -> {name} {tuple(target[name].shape)}")
            continue
        out[name] = converted
        report.mapped[name] = key
    _check_ties(state, report)
    if not any(k.startswith("momentum.") for k in out):  # no momentum model in the file: start it as a copy
        for name in target:
            online = "online." + name.removeprefix("momentum.")
            if name.startswith("momentum.") and online in out:
                out[name] = out[online].clone()
                report.kept_init.append(f"{name} (copy of {online}: the file has no momentum model)")
    for name in sorted(set(target) - set(out)):
        if _filled(name, fmt) is not None:
            out[name] = torch.zeros_like(target[name]) - (1 if name == "idx_queue" else 0)
            report.kept_init.append(f"{name} ({_filled(name, fmt)})")
    missing = sorted(set(target) - set(out))
    check_mapping(fmt, kind, unknown, missing, shapes)
    return out, report


def _why_unmapped(key: str, name: str | None, target: Mapping[str, Tensor]) -> str | None:
    """Why a source key has no place in the model, or None when it is unexplained (an error)."""
    for pattern, why in _IGNORED:
        if re.search(pattern, key):
            return why
    if name is None:
        return None
    part = ".".join(name.split(".")[:2]) + "." if name.startswith(("online.", "momentum.")) else name.split(".")[0]
    if any(k.startswith(part) or k == part for k in target):
        return None  # the model has this part: the key is misspelt or from another architecture
    if ".mlm_head." in name:
        return "the MLM head: a retrieval model has none (it ranks with ITC + ITM)"
    return None


def _check_ties(state: Mapping[str, Tensor], report: ImportReport) -> None:
    """The MLM decoders are tied to the word embeddings (and their bias to the head's); vlp stores one copy."""
    for suffix, _ in _TOWERS:
        try:
            prefix = _text_prefix(state, suffix)
        except CheckpointFormatError:
            continue
        head = f"text_encoder{suffix}.cls.predictions."
        for copy, owner in (
            (f"{head}decoder.weight", f"{prefix}embeddings.word_embeddings.weight"),
            (f"{head}decoder.bias", f"{head}bias"),
        ):
            if copy in state and owner in state:
                if not torch.equal(state[copy], state[owner]):
                    raise CheckpointFormatError(
                        f"{copy} differs from {owner}: vlp's MLM head is tied and cannot hold both"
                    )
                report.checked_ties.append(f"{copy} == {owner}")
