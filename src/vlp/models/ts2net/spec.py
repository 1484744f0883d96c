"""TS2-Net's entry in the family registry and its own ``model.ts2net`` config section (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vlp.models.spec import FamilySpec, Kinds, Size
from vlp.ranges import SHARE, above, at_least, ranged


@dataclass
class TS2NetSettings:
    """``model.ts2net``: CLIP's patch (paper preset: ViT-B/32 or /16), token shift, token selection, frame
    aggregation and the frame score; defaults are the released code's where it differs from the paper."""

    clip_patch: Literal[32, 16] = 32
    shift_mode: Literal["code", "paper", "channel", "none"] = "code"  # token positions by stride / by ratio
    shift_last: int = ranged(2, at_least(0))  # shift in the last N vision blocks (paper: blocks 11-12)
    shift_ratio: float = ranged(0.25, SHARE)  # shift_mode=paper: share of patch tokens moved
    select: Literal["code", "paper", "none"] = "code"  # code: [CLS] + top-3 patches, tanh; paper: top-4, softmax
    select_k: int = ranged(0, at_least(0, " (0 = the rule's)"))  # 0 = the rule's
    select_eval: Literal["hard", "noise"] = "hard"  # inference: hard top-k, or the 500 noisy draws (code)
    select_backward: Literal["full", "code"] = "full"  # perturbed top-k gradient: Jacobian, or the code's diagonal
    # frame aggregator blocks (code: 4, from CLIP's text blocks); 0 = none
    aggregator_layers: int = ranged(4, at_least(0, " (0 = none)"))
    # its position embeddings (code: CLIP's 77); frames x tokens per frame must fit
    aggregator_positions: int = ranged(77, at_least(1))
    # its LayerNorms' eps: the code's 1e-12 (modules/module_cross.py's blocks take modules/until_module.py's
    # LayerNorm); transformers' CLIPEncoderLayer has CLIP's 1e-5 (a model.json without the key loads with 1e-5)
    aggregator_ln_eps: float = ranged(1e-12, above(0))
    frame_pool: Literal["weighted", "mean"] = "weighted"  # softmax(lambda * s)-weighted frames, or mean-pooled
    frame_lambda: float = 4.0
    frame_norm: Literal["l2", "none"] = "l2"  # code: s / ||s|| over frames before the softmax; paper: none


HUB = {32: "openai/clip-vit-base-patch32", 16: "openai/clip-vit-base-patch16"}  # OpenAI's CLIP by patch

# Its sizes, model.preset's values: CLIP's vision (video) and text towers' dimensions, and the weights each starts
# from ("" = random init). The model section gives the frame side, the frames and the text length unless a size
# fixes them; a size that starts from OpenAI's CLIP takes model.ts2net.clip_patch's ViT-B/32 or B/16.
SIZES = {
    "tiny": Size(  # seconds on a CPU (tests)
        video={"patch_size": 8, "width": 64, "layers": 2, "heads": 2},
        text={"width": 64, "layers": 2, "heads": 2},
    ),
    "small": Size(  # CPU runs
        video={"patch_size": 16, "width": 256, "layers": 4, "heads": 4},
        text={"width": 256, "layers": 4, "heads": 4},
    ),
    "paper": Size(  # CLIP ViT-B/32 at 224 px, its 77 text positions and 512-d projections
        video={"img_size": 224, "patch_size": 32, "width": 768, "layers": 12, "heads": 12},
        text={"max_len": 77, "width": 512, "layers": 12, "heads": 8},
        weights=(HUB[32], HUB[32]),
        embed_dim=512,
    ),
}

# The model.json kinds of its models (the family object's too: vlp.models.ts2net.model)
KINDS = Kinds(pretrained="ts2net_clip", retrieval="ts2net_retrieval", qa="")

SPEC = FamilySpec(
    name="ts2net",
    title="TS2-Net",
    paper="arXiv 2207.07852",
    settings=TS2NetSettings,
    load="vlp.models.ts2net.model:FAMILY",
    importer="vlp.models.ts2net.importer",
    pretrains=False,
    tasks=("retrieval",),  # text-video retrieval only: no QA model
    kinds=KINDS,
    sizes=SIZES,
)
