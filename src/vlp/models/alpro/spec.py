"""ALPRO's entry in the family registry and its own ``model.alpro`` config section (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from vlp.ranges import Range, at_least
from vlp.registry import FamilySpec, Kinds, Prepared
from vlp.settings import VTMSettings


@dataclass
class AlproSettings(VTMSettings):
    """``model.alpro``: PEM (its pseudo-labels, the prompter's input, the prompt bank) and VTM's rules."""

    pem_rule: Literal["paper", "official_code"] = "paper"  # PEM pseudo-label discard rule
    pem_crop: Literal["resize", "zero_outside"] = "resize"  # prompter input: real crop, or black outside (code)
    # The frozen prompter's cost (about a tenth of a paper-size pre-training step on a CPU, docs/results/speed.md):
    # the side in pixels of the crop it sees (0 = the model's frame size, as paper and code; pem_crop=resize only)
    # and the precision of its forward (bf16 = autocast even where training runs in fp32).
    pem_prompter_size: int = 0
    pem_prompter_precision: Literal["fp32", "bf16"] = "fp32"
    same_video_vtm: Literal["draw", "exclude"] = "draw"  # another caption of the clip: a drawable VTM negative or not
    # VTM's fused pass: the last fusion layer at every position (released code) or at [CLS] alone, the only token VTM
    # reads; the same scores to float rounding, not the same bits. Pre-training with PEM fuses every position anyway.
    vtm_fusion: Literal["all", "cls"] = "all"
    bank_renormalize: bool = False  # re-normalise each entity's ensembled prompt embedding (code: False)
    prompt_ensemble: bool = True  # 12 templates per entity (paper); False = one template (Table 5 ablation)
    num_entities: int = 1000  # prompt-bank size M: the top-M mined entities (fewer if fewer were mined)

    RANGES: ClassVar[dict[str, Range]] = {
        **VTMSettings.RANGES,
        "num_entities": at_least(1),
        "pem_prompter_size": at_least(0),
    }


# ALPRO's RandAugment op list (``TemporalConsistentRandomAugment`` in its ``src/datasets/randaugment.py``) without
# HorizontalFlip, which would make "to the left" captions false, and Identity (timm has none; p=0.5 per op already
# leaves frames untouched); timm's TranslateX/YRel are its relative translations.
RANDAUG = (("alpro", ("Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel",
                      "Rotate")),)  # fmt: skip

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
        Prepared("entities", "mine_entities", "components.data:mine_entities", reads=("dataset",)),
        Prepared(
            "prompter",
            "pretrain_prompter",
            "components.training:pretrain_prompter",
            flag="--prompter",
            help="pretrain-prompter output",
            trains=True,
        ),
        Prepared(
            "bank",
            "build_prompt_bank",
            "components.training:build_prompt_bank",
            reads=("prompter", "entities"),
            flag="--prompt-bank",
            help="build-prompt-bank output, read with PEM",
            title="prompt bank",
        ),
    ),
    randaug=RANDAUG,
    kinds=KINDS,
)
