"""ALBEF's entry in the family registry and its own ``model.albef`` config section (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vlp.models.spec import FamilySpec, Kinds, Size, VTMSettings
from vlp.ranges import SHARE, at_least, ranged


@dataclass
class AlbefSettings(VTMSettings):
    """``model.albef``: the momentum model, its queues and distillation, where ITM's negatives come from, and how
    a clip's frames reach the fusion encoder (ALBEF is an image model: vlp feeds it frames)."""

    momentum: float = ranged(0.995, SHARE)
    queue_size: int = ranged(65536, at_least(0, " (0 = in-batch ITC only)"))  # a multiple of the global batch
    distill: bool = True  # momentum distillation (MoD)
    alpha: float = ranged(0.4, SHARE)
    # -1 = one epoch of training batches (ALBEF); 0 = alpha from the first step
    alpha_ramp_steps: int = ranged(-1, at_least(-1, " (-1 = one epoch, 0 = none)"))
    itm_negatives_from: Literal["global", "local"] = "global"  # paper: the batch; released code: the local batch
    temporal: Literal["concat", "mean"] = "concat"  # frame tokens the fusion sees: all frames', or their mean


# ALBEF's RandAugment op lists: the paper removes colour changes (§3.5: captions name colours), the released code
# (``dataset/randaugment.py`` via ``RandomAugment(2, 7, augs=[...])``) keeps four colour ops. timm has no Identity:
# the released list's Identity is left out. The paper's is the family's default.
RANDAUG = (
    ("albef_paper", ("ShearX", "ShearY", "TranslateXRel", "TranslateYRel", "Rotate")),
    ("albef_code", ("AutoContrast", "Equalize", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel",
                    "TranslateYRel", "Rotate")),
)  # fmt: skip

# Its sizes, model.preset's values: the frame ViT's (video) and the BERT's (text, split into text and fusion layers)
# dimensions, and the weights each starts from ("" = random init). The model section gives the frame side, the
# frames, the text length and the tokenizer's vocabulary.
SIZES = {
    "tiny": Size(  # seconds on a CPU (tests)
        video={"patch_size": 8, "width": 64, "depth": 2, "heads": 2},
        text={"width": 64, "text_layers": 2, "fusion_layers": 2, "heads": 4, "intermediate": 256, "max_positions": 64},
    ),
    "small": Size(  # CPU runs
        video={"patch_size": 16, "width": 256, "depth": 4, "heads": 4},
        text={"width": 256, "text_layers": 2, "fusion_layers": 2, "heads": 4, "intermediate": 1024,
              "max_positions": 64},
    ),
    "small-pretrained": Size(  # all-MiniLM-L6-v2 (installed): layers 1-3 text, 4-6 fusion (cross-attention: random)
        video={"patch_size": 16, "width": 384, "depth": 4, "heads": 6},
        text={"text_layers": 3},
        weights=("", "all-MiniLM-L6-v2"),
        text_from_weights=True,
        fine_patch=(64, 8),  # a 4 x 4 grid at the main job's 32 px
    ),
    "paper": Size(  # ViT-B/16 from DeiT ImageNet-1k (§3.1), BERT-base split 6 + 6
        video={"patch_size": 16, "width": 768, "depth": 12, "heads": 12},
        text={"width": 768, "text_layers": 6, "fusion_layers": 6, "heads": 12, "intermediate": 3072},
        weights=("deit_base_patch16_224.fb_in1k", "bert-base-uncased"),
    ),
}  # fmt: skip

# The model.json kinds of its models (the family object's too: vlp.models.albef.model)
KINDS = Kinds(pretrained="albef", retrieval="albef_retrieval", qa="albef_qa")

SPEC = FamilySpec(
    name="albef",
    title="ALBEF",
    paper="arXiv 2107.07651",
    settings=AlbefSettings,
    load="vlp.models.albef.model:FAMILY",
    importer="vlp.models.albef.importer",
    pretrains=True,
    randaug=RANDAUG,
    kinds=KINDS,
    sizes=SIZES,
)
