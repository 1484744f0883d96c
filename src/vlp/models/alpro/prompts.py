"""ALPRO's prompt bank: 12 templates x M entities, ensembled per entity, saved with its entity list.

The prompter's frozen text tower embeds every ``template.format(entity)``; the bank holds, for each
entity, the mean of its normalised template embeddings (prompt ensembling, paper §4.5 / Table 5).

Whether to re-normalise that mean is a choice the paper leaves open (``renormalize``):

- ``False`` (default, the released code, ``alpro_models.py`` around the prompt-feature averaging):
  the mean is kept as is. Its norm shrinks when templates disagree, which scales that entity's
  logits down — entities whose templates agree get sharper pseudo-labels.
- ``True``: every entity embedding is put back on the unit sphere (CLIP-style ensembling), so all
  entities compete on cosine similarity alone.

Prompts are laid out template-major, as in ALPRO's ``setup_text_prompts``: all entities for
template 0, then all for template 1, ... (row ``t * M + m``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import Tensor

from vlp import storage

VIDEO_TEMPLATES: tuple[str, ...] = tuple(
    f"A {noun} of {article} {{}}."
    for noun in ("footage", "video", "portrait", "video footage")
    for article in ("a", "the", "one")
)
IMAGE_TEMPLATES: tuple[str, ...] = tuple(
    f"A {noun} of {article} {{}}."
    for noun in ("photo", "picture", "good photo", "good picture")
    for article in ("a", "the", "one")
)
SINGLE_TEMPLATES = ("A video of a {}.", "A photo of a {}.")  # without ensembling (ALPRO Table 5)
BANK_FILE = "prompt_bank.safetensors"
ENTITIES_FILE = "prompt_bank.json"


def build_prompts(entities: Sequence[str], templates: Sequence[str] = VIDEO_TEMPLATES) -> list[str]:
    """Every template filled with every entity, template-major (row ``t * M + m``)."""
    if not entities:
        raise ValueError("the prompt bank needs at least one entity")
    return [template.format(entity) for template in templates for entity in entities]


def ensemble(embeddings: Tensor, num_templates: int, *, renormalize: bool = False) -> Tensor:
    """``(T*M, D)`` template-major prompt embeddings -> ``(M, D)`` per-entity mean of the normalised rows."""
    if embeddings.ndim != 2 or embeddings.shape[0] % num_templates:
        raise ValueError(f"expected ({num_templates} * M, D) embeddings, got {tuple(embeddings.shape)}")
    per_template = F.normalize(embeddings, dim=-1).view(num_templates, -1, embeddings.shape[-1])  # (T, M, D)
    mean = per_template.mean(dim=0)  # (M, D)
    return F.normalize(mean, dim=-1) if renormalize else mean


@dataclass
class PromptBank:
    """Entity embeddings ``(M, D)`` and the entity list (row order) they belong to."""

    entities: list[str]
    video: Tensor  # (M, D) from the video templates
    image: Tensor  # (M, D) from the image templates (for still-image crops)
    renormalize: bool

    def save(self, out: str) -> None:
        """Write ``prompt_bank.safetensors`` + ``prompt_bank.json`` under ``out`` (local or s3://)."""
        tensors = {"video": self.video.detach().cpu().contiguous(), "image": self.image.detach().cpu().contiguous()}
        storage.write_bytes(storage.join(out, BANK_FILE), save_safetensors(tensors))
        meta = {"entities": self.entities, "renormalize": self.renormalize, "dim": int(self.video.shape[1])}
        storage.write_text(storage.join(out, ENTITIES_FILE), json.dumps(meta, indent=1) + "\n")

    @classmethod
    def load(cls, out: str) -> PromptBank:
        """Read a bank written by :meth:`save`; checks that the entity list matches the tensors."""
        meta = json.loads(storage.read_text(storage.join(out, ENTITIES_FILE)))
        tensors = load_safetensors(storage.read_bytes(storage.join(out, BANK_FILE)))
        bank = cls(meta["entities"], tensors["video"], tensors["image"], bool(meta["renormalize"]))
        if bank.video.shape[0] != len(bank.entities) or bank.image.shape != bank.video.shape:
            raise ValueError(
                f"{out}: prompt bank tensors {tuple(bank.video.shape)} do not match {len(bank.entities)} entities"
            )
        return bank


@torch.no_grad()
def build_prompt_bank(
    encode_text: Callable[[list[str]], Tensor],
    entities: Sequence[str],
    *,
    renormalize: bool = False,
    batch_size: int = 256,
    ensemble_templates: bool = True,
) -> PromptBank:
    """Embed the 12 video and 12 image templates for ``entities`` with ``encode_text`` and ensemble them.

    Args:
        encode_text: the frozen prompter's text side: list of prompts -> ``(N, D)`` embeddings.
        entities: the mined vocabulary, in its rank order (row ``m`` of the bank is ``entities[m]``).
        renormalize: re-normalise each entity's mean embedding (see the module docstring).
        batch_size: prompts per ``encode_text`` call.
        ensemble_templates: False keeps one template per branch, ``SINGLE_TEMPLATES`` ("A video of a {}." /
            "A photo of a {}."): the "w/o ensembling" row of ALPRO Table 5.
    """
    banks = []
    groups = (VIDEO_TEMPLATES, IMAGE_TEMPLATES) if ensemble_templates else tuple((t,) for t in SINGLE_TEMPLATES)
    for templates in groups:
        prompts = build_prompts(entities, templates)
        embeds = torch.cat([encode_text(prompts[i : i + batch_size]) for i in range(0, len(prompts), batch_size)])
        banks.append(ensemble(embeds.float(), len(templates), renormalize=renormalize))
    return PromptBank(list(entities), banks[0], banks[1], renormalize)
