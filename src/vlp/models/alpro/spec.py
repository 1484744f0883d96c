"""ALPRO's entry in the family registry and its own ``model.alpro`` config section (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vlp.models.spec import FamilySpec, Kinds, Prepared, Size, VTMSettings
from vlp.ranges import at_least, ranged


@dataclass
class AlproSettings(VTMSettings):
    """``model.alpro``: PEM (its pseudo-labels, the prompter's input, the prompt bank) and VTM's rules."""

    pem_rule: Literal["paper", "official_code"] = "paper"  # PEM pseudo-label discard rule
    pem_crop: Literal["resize", "zero_outside"] = "resize"  # prompter input: real crop, or black outside (code)
    same_video_vtm: Literal["draw", "exclude"] = "draw"  # another caption of the clip: a drawable VTM negative or not
    bank_renormalize: bool = False  # re-normalise each entity's ensembled prompt embedding (code: False)
    prompt_ensemble: bool = True  # 12 templates per entity (paper); False = one template (Table 5 ablation)
    # prompt-bank size M: the top-M mined entities (fewer if fewer were mined)
    num_entities: int = ranged(1000, at_least(1))


# ALPRO's RandAugment op list (``TemporalConsistentRandomAugment`` in its ``src/datasets/randaugment.py``) without
# HorizontalFlip, which would make "to the left" captions false, and Identity (timm has none; p=0.5 per op already
# leaves frames untouched); timm's TranslateX/YRel are its relative translations.
RANDAUG = (("alpro", ("Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel",
                      "Rotate")),)  # fmt: skip

# Its sizes, model.preset's values: the TimeSformer's (video) and the BERT's (text, split into text and fusion layers)
# dimensions, and the weights each starts from (ALPRO §3.4; "" = random init). The model section gives the frame
# side, the frames, the text length and the tokenizer's vocabulary.
SIZES = {
    "tiny": Size(  # seconds on a CPU (tests)
        video={"patch_size": 8, "width": 64, "depth": 2, "heads": 2, "drop_path": 0.0},
        text={"width": 64, "text_layers": 2, "fusion_layers": 2, "heads": 4, "intermediate": 256, "max_positions": 64},
    ),
    "small": Size(  # CPU runs
        video={"patch_size": 16, "width": 256, "depth": 4, "heads": 4, "drop_path": 0.0},
        text={"width": 256, "text_layers": 2, "fusion_layers": 2, "heads": 4, "intermediate": 1024,
              "max_positions": 64},
    ),
    "small-pretrained": Size(  # all-MiniLM-L6-v2 (installed, vlp.models.pretrained): layers 1-3 text, 4-6 fusion
        video={"patch_size": 16, "width": 384, "depth": 4, "heads": 6, "drop_path": 0.0},
        text={"text_layers": 3},
        weights=("", "all-MiniLM-L6-v2"),
        text_from_weights=True,
        fine_patch=(64, 8),  # a 4 x 4 grid at the main job's 32 px
    ),
    "paper": Size(  # TimeSformer-B/16 from ViT ImageNet-21k, BERT-base split 6 + 6
        video={"patch_size": 16, "width": 768, "depth": 12, "heads": 12, "drop_path": 0.1},
        text={"width": 768, "text_layers": 6, "fusion_layers": 6, "heads": 12, "intermediate": 3072},
        weights=("vit_base_patch16_224.orig_in21k", "bert-base-uncased"),
    ),
}  # fmt: skip

# The model.json kinds of its models (the family object's too: vlp.models.alpro.model)
KINDS = Kinds(pretrained="alpro", retrieval="alpro_retrieval", qa="alpro_qa", prompter="prompter")

SPEC = FamilySpec(
    name="alpro",
    title="ALPRO",
    paper="arXiv 2112.09583",
    settings=AlproSettings,
    load="vlp.models.alpro.model:FAMILY",
    importer="vlp.models.alpro.importer",
    pretraining="vlp.models.alpro.pretraining",
    pretrains=True,
    # PEM's inputs, made by the DAG before pre-training: the entities mined from the captions, the prompter
    # (VTC-only dual encoder) and its prompt bank of entity prompts; pre-training reads the last two
    prepared=(
        Prepared("entities", "mine_entities", reads=("dataset",)),
        Prepared(
            "prompter",
            "pretrain_prompter",
            flag="--prompter",
            help="pretrain-prompter output",
            trains=True,
        ),
        Prepared(
            "bank",
            "build_prompt_bank",
            reads=("prompter", "entities"),
            flag="--prompt-bank",
            help="build-prompt-bank output, read with PEM",
            title="prompt bank",
        ),
    ),
    randaug=RANDAUG,
    kinds=KINDS,
    sizes=SIZES,
)
