"""Released TS2-Net weights (yuqi657/ts2_net) -> a vlp :class:`vlp.models.ts2net.model.TS2Net`: every key mapped or
explained, every shape checked.

The released code saves ``model.state_dict()`` of its ``CLIP4Clip`` class (``modules/modeling.py``; key layout
written down in ``tests/fixtures/ts2net_parity/README.md``): OpenAI's CLIP under ``clip.`` (``visual.conv1``,
``visual.transformer.resblocks.{i}.{ln_1, attn.in_proj_*, attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj}``, ``visual.proj``
as a ``(C, D)`` matrix, ``transformer.resblocks.{i}`` for text, ``token_embedding``, ``positional_embedding``,
``ln_final``, ``text_projection``, ``logit_scale``), the shifted blocks' attention one level down
(``attn.net.*``, the ``PatchShiftModule`` wrapper), the token selector ``visual_token_selector.score_predictor.*``,
the frame aggregator ``transformerClip.resblocks.{i}.*`` and its ``frame_position_embeddings``. vlp keeps
transformers' CLIP names: the fused ``in_proj`` weights are split into ``q_proj`` / ``k_proj`` / ``v_proj`` and the
projection matrices transposed into ``Linear`` weights.

The architecture is read from the shapes; the shifted blocks from the ``attn.net.`` keys (the code's rule:
stride ``(N + 1) // 7``), the selector's presence (the code's [CLS] + top-3, tanh) and the aggregator's depth.
Attention heads are width / 64, as the code computes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from vlp.models.importing import (
    CheckpointFormatError,
    Imported,
    ImportOptions,
    ImportReport,
    check_mapping,
    read_checkpoint,
)

__all__ = ["FORMATS", "KINDS", "import_state", "infer_config", "map_state_dict", "read_checkpoint", "recognizes"]

TOKENIZER = "openai/clip-vit-base-patch32"  # CLIP's BPE (ViT-B/16 shares it)
FORMATS = ("ts2net",)
KINDS = ("ts2net_retrieval",)
_IGNORED = [
    (r"^visual_prompt_encoder\.", "VideoPromptEncoder: built by the released model, never called in its forward"),
    (r"^text_token_selector\.", "TextTokenSelection: built, but its call is commented out in the released code"),
    (r"^clip\.(input_resolution|context_length|vocab_size)$", "CLIP's size constants, not weights"),
]
_BLOCK = {
    "ln_1": "layer_norm1",
    "ln_2": "layer_norm2",
    "attn.out_proj": "self_attn.out_proj",
    "mlp.c_fc": "mlp.fc1",
    "mlp.c_proj": "mlp.fc2",
}


def recognizes(state: Mapping[str, Tensor]) -> bool:
    """Whether ``state`` is a released TS2-Net / CLIP4Clip model (OpenAI's CLIP under ``clip.``)."""
    return "clip.visual.conv1.weight" in state and "clip.token_embedding.weight" in state


def _blocks(state: Mapping[str, Tensor], prefix: str) -> list[int]:
    found = {int(m.group(1)) for k in state if (m := re.match(rf"{re.escape(prefix)}(\d+)\.", k))}
    return sorted(found)


def infer_config(state: Mapping[str, Tensor], *, num_frames: int = 12, max_len: int = 32) -> Any:
    """The :class:`~vlp.models.ts2net.model.TS2NetConfig` a released state dict implies (``num_frames``: clips in
    training; ``max_len``: unused by the sizes, the text positions come from the file)."""
    # here: the model code loads only once a file is known to be TS2-Net's (--family auto asks every importer)
    from vlp.models.ts2net.model import ClipTextConfig, ClipVisionConfig, TS2NetConfig

    if not recognizes(state):
        raise CheckpointFormatError("not a TS2-Net checkpoint: no clip.visual.conv1.weight / clip.token_embedding")
    conv = state["clip.visual.conv1.weight"]
    width, patch = int(conv.shape[0]), int(conv.shape[-1])
    grid = round((state["clip.visual.positional_embedding"].shape[0] - 1) ** 0.5)
    vision_blocks = _blocks(state, "clip.visual.transformer.resblocks.")
    shifted = sorted(
        {
            int(m.group(1))
            for k in state
            if (m := re.match(r"clip\.visual\.transformer\.resblocks\.(\d+)\.attn\.net\.", k))
        }
    )
    if shifted and shifted != vision_blocks[len(vision_blocks) - len(shifted) :]:
        raise CheckpointFormatError(f"the shifted blocks {shifted} are not the last ones of {len(vision_blocks)}")
    text_width = int(state["clip.ln_final.weight"].shape[0])
    video = ClipVisionConfig(img_size=patch * grid, patch_size=patch, width=width, layers=len(vision_blocks),
                             heads=max(1, width // 64), num_frames=num_frames)  # fmt: skip
    text_layers = len(_blocks(state, "clip.transformer.resblocks."))
    text = ClipTextConfig(vocab_size=int(state["clip.token_embedding.weight"].shape[0]),
                          max_len=int(state["clip.positional_embedding"].shape[0]), width=text_width,
                          layers=text_layers, heads=max(1, text_width // 64))  # fmt: skip
    aggregator = len(_blocks(state, "transformerClip.resblocks."))
    positions = state.get("frame_position_embeddings.weight")
    return TS2NetConfig(
        video,
        text,
        embed_dim=int(state["clip.text_projection"].shape[1]),
        shift_mode="code" if shifted else "none",
        shift_last=len(shifted),
        select="code" if any(k.startswith("visual_token_selector.") for k in state) else "none",
        aggregator_layers=aggregator,
        aggregator_positions=int(positions.shape[0]) if positions is not None and aggregator else 77,
        frame_norm="l2",
    )


def _block_rules(source: str, target: str) -> list[tuple[re.Pattern[str], Any]]:
    """Rules for the OpenAI residual blocks under ``source`` -> transformers' CLIP layers under ``target``."""
    src = re.escape(source)
    rules: list[tuple[re.Pattern[str], Any]] = [
        (re.compile(rf"^{src}(\d+)\.attn\.(?:net\.)?in_proj_(weight|bias)$"),
         lambda m: f"{target}{m.group(1)}.self_attn.in_proj_{m.group(2)}"),  # split in map_state_dict
    ]  # fmt: skip
    for theirs, ours in _BLOCK.items():
        t = re.escape(theirs).replace(r"attn\.", r"attn\.(?:net\.)?")
        rules.append((re.compile(rf"^{src}(\d+)\.{t}\.(weight|bias)$"),
                      lambda m, ours=ours: f"{target}{m.group(1)}.{ours}.{m.group(2)}"))  # fmt: skip
    return rules


def _rules() -> list[tuple[re.Pattern[str], Any]]:
    fixed = {
        "clip.visual.conv1.weight": "clip.vision_model.embeddings.patch_embedding.weight",
        "clip.visual.class_embedding": "clip.vision_model.embeddings.class_embedding",
        "clip.visual.positional_embedding": "clip.vision_model.embeddings.position_embedding.weight",
        "clip.visual.ln_pre.weight": "clip.vision_model.pre_layrnorm.weight",
        "clip.visual.ln_pre.bias": "clip.vision_model.pre_layrnorm.bias",
        "clip.visual.ln_post.weight": "clip.vision_model.post_layernorm.weight",
        "clip.visual.ln_post.bias": "clip.vision_model.post_layernorm.bias",
        "clip.visual.proj": "clip.visual_projection.weight",
        "clip.token_embedding.weight": "clip.text_model.embeddings.token_embedding.weight",
        "clip.positional_embedding": "clip.text_model.embeddings.position_embedding.weight",
        "clip.ln_final.weight": "clip.text_model.final_layer_norm.weight",
        "clip.ln_final.bias": "clip.text_model.final_layer_norm.bias",
        "clip.text_projection": "clip.text_projection.weight",
        "clip.logit_scale": "clip.logit_scale",
        "frame_position_embeddings.weight": "aggregator.positions.weight",
        "visual_token_selector.score_predictor.in_conv.0.weight": "selector.reduce.0.weight",
        "visual_token_selector.score_predictor.in_conv.0.bias": "selector.reduce.0.bias",
        "visual_token_selector.score_predictor.in_conv.1.weight": "selector.reduce.1.weight",
        "visual_token_selector.score_predictor.out_conv.0.weight": "selector.score.0.weight",
        "visual_token_selector.score_predictor.out_conv.2.weight": "selector.score.2.weight",
    }
    rules = [(re.compile(f"^{re.escape(k)}$"), lambda m, v=v: v) for k, v in fixed.items()]
    rules += _block_rules("clip.visual.transformer.resblocks.", "clip.vision_model.encoder.layers.")
    rules += _block_rules("clip.transformer.resblocks.", "clip.text_model.encoder.layers.")
    rules += _block_rules("transformerClip.resblocks.", "aggregator.layers.")
    return rules


def map_state_dict(state: Mapping[str, Tensor], target: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], ImportReport]:
    """Source tensors renamed, split and transposed to ``target``'s keys (a :class:`TS2Net`'s ``state_dict()``).

    Raises:
        CheckpointFormatError: unknown source keys, target keys the file lacks, or shape mismatches (all listed).
    """
    rules = _rules()
    report = ImportReport(format="ts2net", kind="ts2net_retrieval")
    out: dict[str, Tensor] = {}
    unknown: list[str] = []
    shapes: list[str] = []
    for key, value in state.items():
        if any(re.search(pattern, key) for pattern, _ in _IGNORED):
            report.unmapped[key] = next(why for pattern, why in _IGNORED if re.search(pattern, key))
            continue
        name = next((to(m) for pattern, to in rules if (m := pattern.match(key))), None)
        if name is None:
            unknown.append(key)
            continue
        value = value.float() if value.is_floating_point() else value
        if ".self_attn.in_proj_" in name:  # OpenAI's fused q, k, v -> three Linear layers
            base, leaf = name.rsplit(".in_proj_", 1)
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0), strict=True):
                _put(out, report, shapes, target, f"{base}.{part}.{leaf}", chunk.contiguous(), key)
            continue
        if name in ("clip.visual_projection.weight", "clip.text_projection.weight"):
            value = value.t().contiguous()  # x @ proj  ==  Linear(weight=proj.T)
        _put(out, report, shapes, target, name, value, key)
    missing = sorted(set(target) - set(out))
    check_mapping("ts2net", "ts2net_retrieval", unknown, missing, shapes)
    return out, report


def _put(out: dict, report: ImportReport, shapes: list, target: Mapping, name: str, value: Tensor, key: str) -> None:
    if name not in target:
        shapes.append(f"{key} -> {name} (not in the configured model)")
    elif tuple(value.shape) != tuple(target[name].shape):
        shapes.append(f"{key} {tuple(value.shape)} -> {name} {tuple(target[name].shape)}")
    else:
        out[name] = value.to(target[name].dtype)
        report.mapped[name] = key


def build(state: Mapping[str, Tensor], *, num_frames: int = 12) -> tuple[Any, dict[str, Tensor], ImportReport]:
    """``(config, weights, report)`` of a released state dict, the weights checked against a built model."""
    # here: the model code loads only once a file is known to be TS2-Net's (--family auto asks every importer)
    from vlp.models.ts2net.model import TS2Net

    cfg = infer_config(state, num_frames=num_frames)
    torch.manual_seed(0)
    weights, report = map_state_dict(state, TS2Net(cfg).state_dict())
    return cfg, weights, report


def import_state(state: Mapping[str, Tensor], options: ImportOptions) -> Imported:
    """A released TS2-Net file mapped onto a ``ts2net_retrieval`` model (shapes and rules from the keys)."""
    if options.kind not in ("auto", *KINDS) or options.fmt not in ("auto", *FORMATS) or options.answers:
        raise ValueError("a TS2-Net checkpoint is a retrieval model (kind ts2net_retrieval, format ts2net); it "
                         "has no answers")  # fmt: skip
    config, weights, report = build(state, num_frames=options.num_frames)
    return Imported("ts2net", "ts2net_retrieval", config, weights, report)
