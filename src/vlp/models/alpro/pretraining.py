"""ALPRO's pre-training hook (:class:`vlp.models.family.PretrainHook`): the frozen prompter and its prompt bank.

PEM (ALPRO §3.2.2) reads two inputs its DAG makes before ``vlp pretrain``: the prompter (a VTC-only dual encoder,
``vlp pretrain-prompter``) and the prompt bank of mined entities it embeds (``vlp build-prompt-bank``, made here by
:func:`build_bank`). :func:`checks` names what a run with given objectives reads, :func:`load` loads it into the
step context (:class:`PemContext`), and the step's report draws ALPRO Fig. 3 (:func:`pem_examples`). The model
shares the prompter's tokenizer, so that its entity labels and captions are cut into the same tokens.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vlp import losses, storage
from vlp.data.entities import ENTITIES_PARQUET, read_entities
from vlp.data.frames import FrameStore
from vlp.data.video_text import VideoTextDataset
from vlp.models import directory
from vlp.models.alpro.figure import pem_figure
from vlp.models.alpro.model import AlproConfig, PemContext, prompter_features
from vlp.models.alpro.prompts import BANK_FILE, ENTITIES_FILE, PromptBank, build_prompt_bank
from vlp.models.family import InputCheck, PretrainExtras

log = logging.getLogger("vlp")
PROMPTER = "prompter"  # the model.json kind of a prompter (ALPRO's Kinds.prompter)
PEM_EXAMPLES = "pem_examples"  # the pretrain output's folder of Fig. 3 figures


def checks(inputs: Mapping[str, str], terms: Sequence[str]) -> list[InputCheck]:
    """The prompter, always, and the prompt bank's two files when PEM is among ``terms``."""
    prompter, bank = inputs.get("prompter", ""), inputs.get("bank", "")
    if not prompter:
        raise ValueError("alpro pre-training needs a prompter (--prompter): run `vlp pretrain-prompter` first")
    found = [InputCheck("--prompter", prompter, (PROMPTER,))]
    if "pem" in terms:
        if not bank:
            raise ValueError("alpro pre-training with PEM needs the prompter's prompt bank (--prompt-bank): run "
                             "`vlp build-prompt-bank` first")  # fmt: skip
        remedy = f"run `vlp build-prompt-bank --out {bank}` first (--prompt-bank is its output)"
        found += [InputCheck("--prompt-bank", storage.join(bank, f), remedy=remedy) for f in (BANK_FILE, ENTITIES_FILE)]
    elif bank:
        log.warning("pretrain: PEM is off (model.losses = %s); the prompt bank %r is not read", list(terms), bank)
    return found


def load_prompter(prompter_dir: str) -> tuple[Any, Any, Any]:
    """(frozen :class:`DualEncoder` in eval mode, its tokenizer, its AlproConfig) from a prompter output."""
    prompter, tok, info = directory.load(prompter_dir, (PROMPTER,))
    return prompter.requires_grad_(False), tok, info.config


def load(inputs: Mapping[str, str], terms: Sequence[str], device: Any) -> PretrainExtras:
    """The prompter's tokenizer and, with PEM, the prompter on ``device`` beside its bank (:class:`PemContext`)."""
    prompter, tok, _ = load_prompter(inputs["prompter"])
    lineage = {"prompter": inputs["prompter"]}
    if "pem" not in terms:
        return PretrainExtras(tokenizer=tok, lineage=lineage)
    bank = PromptBank.load(inputs["bank"])

    def report(dataset: str, frames: str | FrameStore, out: str, cfg: Any, model_config: Any) -> dict[str, Any]:
        path = storage.join(out, PEM_EXAMPLES)
        return {PEM_EXAMPLES: pem_examples(dataset, frames, prompter, bank, path, cfg, model_config)}

    prompter = prompter.to(device)
    return PretrainExtras(
        context=PemContext(prompter, bank.video, bank.image),
        tokenizer=tok,
        entities=list(bank.entities),
        lineage=lineage,
        report=report,
    )


def build_bank(prompter_dir: str, entities_dir: str, out: str, cfg: Any) -> dict[str, Any]:
    """Embed 12 video + 12 image templates x the top ``model.alpro.num_entities`` mined entities with the frozen
    prompter (``vlp build-prompt-bank``, which has checked both inputs before this call)."""
    own = cfg.model.own()
    entities_uri = storage.join(entities_dir, ENTITIES_PARQUET)
    entities = [name for name, _ in read_entities(entities_dir)][: own.num_entities]  # read before the prompter
    if not entities:
        raise ValueError(f"{entities_uri} lists no entities: run `vlp mine-entities` first")
    prompter, tok, _ = load_prompter(prompter_dir)

    def encode(prompts: list[str]) -> torch.Tensor:
        enc = tok(prompts, padding=True, truncation=True, max_length=cfg.model.max_len, return_tensors="pt")
        return prompter.encode_text(enc["input_ids"], enc["attention_mask"])[0]

    bank = build_prompt_bank(encode, entities, renormalize=own.bank_renormalize, ensemble_templates=own.prompt_ensemble)
    bank.save(out)
    return {"entities": len(entities), "renormalize": bank.renormalize, "dim": int(bank.video.shape[1])}


@torch.no_grad()
def pem_examples(
    dataset: str,
    frames: str | FrameStore,
    prompter: Any,
    bank: PromptBank,
    out: str,
    cfg: Any,
    pixels: AlproConfig,
    n: int = 4,
    seed: int = 0,
) -> list[str]:
    """ALPRO Fig. 3 for ``n`` clips: a random PEM box on the frames and the frozen prompter's top-5 entities.

    Clips come from the test split (the training split when there is none); the box is drawn like PEM's
    (:func:`vlp.losses.sample_pem_boxes`); clips are normalised with ``pixels``' (the pre-trained model's
    :class:`AlproConfig`) statistics, and the prompter sees each box as the step's PEM does
    (:func:`vlp.models.alpro.model.prompter_features`: the crop mode from that config).
    Writes ``<out>/<video_id>.png`` and ``<out>/README.md``; returns the figures' URIs.
    """
    size, patch = prompter.video.config.img_size, prompter.video.config.patch_size
    data = None
    for split in ("test", "train"):
        try:
            data = VideoTextDataset(
                frames,
                dataset,
                split=split,
                num_frames=cfg.model.num_frames,
                mode="uniform",
                mean=pixels.pixel_mean,
                std=pixels.pixel_std,
            )
            break
        except ValueError:
            continue
    clips = sorted({v for v, _ in data.pairs if data.media.get(v) == "video"})[:n] if data is not None else []
    gen, lines, written = torch.Generator().manual_seed(seed), ["# PEM examples (ALPRO Fig. 3)", ""], []
    with tempfile.TemporaryDirectory(prefix="vlp-pem-") as tmp:
        for video_id in clips:
            assert data is not None  # clips is empty without it
            n_stored = data.store.num_stored(video_id)
            slots = [round(i * (n_stored - 1) / max(1, cfg.model.num_frames - 1)) for i in range(cfg.model.num_frames)]
            raw = data.store.load(video_id, slots)  # (T, H, W, 3) uint8 at the stored size
            clip = torch.from_numpy(raw).permute(0, 3, 1, 2).float().div(255)
            clip = F.interpolate(clip, size=(size, size), mode="bilinear", antialias=True)
            clip = ((clip - data.mean) / data.std)[None].to(next(prompter.parameters()).device)  # (1, T, 3, S, S)
            boxes = losses.sample_pem_boxes(1, size // patch, size // patch, patch_size=patch, generator=gen)
            feat = prompter_features(pixels, prompter, clip, boxes.pixel_boxes)  # as the pre-training step's PEM
            probs = losses.pseudo_labels(feat, bank.video.to(feat), prompter.temperature())[0]
            top = probs.topk(min(5, len(bank.entities)))
            top5 = [
                (bank.entities[i], float(p)) for i, p in zip(top.indices.tolist(), top.values.tolist(), strict=True)
            ]
            t, left, h, w = (int(v) for v in boxes.pixel_boxes[0])
            sy, sx = raw.shape[1] / size, raw.shape[2] / size
            box = (left * sx, t * sy, (left + w) * sx, (t + h) * sy)
            name = f"{video_id}.png"
            pem_figure(raw, box, top5, Path(tmp) / name)
            storage.upload(str(Path(tmp) / name), storage.join(out, name))
            written.append(storage.join(out, name))
            lines += [f"## {video_id}", "", f"![{video_id}]({name})", "", "| entity | p |", "|---|---|"]
            lines += [f"| {e} | {p:.3f} |" for e, p in top5] + [""]
    if written:
        storage.write_text(storage.join(out, "README.md"), "\n".join(lines))
    return written
