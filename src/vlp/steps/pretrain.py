"""Steps: ``pretrain_prompter`` -> ``build_prompt_bank`` -> ``pretrain`` (ALPRO).

Every output is a model directory (:mod:`vlp.models.directory`): ``model.json``, the tokenizer every later
model shares, and the checkpoints. Weights are safetensors written by :mod:`vlp.train.checkpoint`; nothing is
pickled.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from vlp import storage
from vlp.config import Config
from vlp.data.frames import FrameStore
from vlp.data.video_text import RANDAUG_OPS, ClipRandAugment, VideoTextDataset, collate_video_text, pair_groups
from vlp.models import directory
from vlp.steps.common import (
    ModelInput,
    StepResult,
    check_inputs,
    device,
    family_of,
    run_step,
    seed_model_init,
    step_tokenizer,
    train_model,
    train_summary,
    training_batches,
)
from vlp.train.settings import ModelConfig

log = logging.getLogger("vlp")


# --------------------------------------------------------------------------- building blocks


def model_config(model: ModelConfig, vocab_size: int, num_entities: int, losses: list[str]) -> Any:
    """The family's model config for ``model`` with these ``losses`` (the prompter's: VTC only)."""
    return family_of(model).config(replace(model, losses=list(losses)), vocab_size, num_entities)


def _dataset(cfg: Config, dataset: str, frames: str | FrameStore, pixels: Any) -> VideoTextDataset:
    """The training pairs, normalised with ``pixels``' (a model config's) ``pixel_mean`` / ``pixel_std``."""
    p = cfg.pretrain
    return VideoTextDataset(
        frames,
        dataset,
        split="train",
        num_frames=cfg.model.num_frames,
        mode=p.sample_mode,
        augment=ClipRandAugment(ops=RANDAUG_OPS[p.randaug_ops]) if p.randaug else None,
        crop_scale=p.crop_scale,
        hflip=p.hflip,
        caption_clean=p.caption_clean,
        seed=p.seed,
        max_bad_share=p.max_bad_share,
        size=cfg.model.img_size,
        mean=pixels.pixel_mean,
        std=pixels.pixel_std,
    )


def _batch_shape(cfg: Config, data: VideoTextDataset) -> tuple[int, int]:
    """``(clips per batch, batches per epoch)`` on this rank: the batch is cut to the items a rank has."""
    from vlp.train.loop import ResumableSampler

    items = len(ResumableSampler(len(data), seed=cfg.pretrain.seed))  # items per rank per epoch
    batch = min(cfg.pretrain.batch_size, items)
    return batch, items // batch  # VideoTextDataset refuses a split without pairs: items >= 1


def _checked_data(cfg: Config, dataset: str, frames: str | FrameStore, terms: list[str]) -> VideoTextDataset:
    """The training pairs, read before a step writes its tokenizer, with the model section and the batch shape
    checked by the family (its config built once with the configured vocabulary size) and ``pretrain.group_by``
    against the pairs, so that a setting that cannot work fails before anything is written."""
    from vlp.train import distributed

    fam = family_of(cfg.model)
    dry = model_config(cfg.model, cfg.model.vocab_size, 0, terms)
    data = _dataset(cfg, dataset, frames, dry)  # the pixel statistics do not depend on the vocabulary
    batch, per_epoch = _batch_shape(cfg, data)
    fam.prepare(dry, per_epoch, batch * distributed.world_size())
    if cfg.pretrain.group_by:
        pair_groups(cfg.pretrain.group_by, dataset, data.pairs)  # a type no clip has is refused
    return data


def _batches(cfg: Config, dataset: str, data: VideoTextDataset, tokenizer: Any) -> Any:
    """Resumable batches of :class:`PretrainBatch` over ``data``, the training pairs of ``dataset``."""
    from vlp.models.family import PretrainBatch

    def fetch(indices: Any) -> PretrainBatch:
        items = collate_video_text([data[i] for i in indices])
        enc = tokenizer(items["text"], padding="max_length", truncation=True, max_length=cfg.model.max_len)
        is_image = torch.tensor([data.media.get(v) == "image" for v in items["video_id"]])
        ids, mask = torch.tensor(enc["input_ids"]), torch.tensor(enc["attention_mask"])
        clips = torch.tensor([clip_index[v] for v in items["video_id"]])
        return PretrainBatch(items["video"], ids, mask, is_image, clips)

    clip_index = data.clip_index()
    p = cfg.pretrain
    batch, _ = _batch_shape(cfg, data)
    groups = pair_groups(p.group_by, dataset, data.pairs) if p.group_by else None
    return training_batches(p, data, fetch, batch, groups=groups, group_fraction=p.group_fraction,
                            group_epochs=p.group_epochs)  # fmt: skip


def load_prompter(prompter_dir: str) -> tuple[Any, Any, Any]:
    """(frozen :class:`DualEncoder` in eval mode, its tokenizer, its AlproConfig) from a prompter output."""
    prompter, tok, info = directory.load(prompter_dir, ("prompter",))
    return prompter.requires_grad_(False), tok, info.config


# --------------------------------------------------------------------------- steps


def pretrain_prompter(dataset: str, frames: str, out: str, cfg: Config) -> StepResult:
    """Train the prompter: a video-text dual encoder with VTC only (ALPRO §3.2.2)."""

    def work() -> StepResult:
        from vlp.models.family import StepContext
        from vlp.train import distributed

        distributed.init_from_env()
        fam = family_of(cfg.model)
        if not fam.kinds.prompter:
            raise ValueError(f"model family {fam.name!r} has no prompter (only ALPRO's PEM uses one)")
        store = check_inputs(dataset, frames).store
        data = _checked_data(cfg, dataset, store, ["vtc"])
        tok = step_tokenizer(cfg, dataset, out)
        model_cfg = model_config(cfg.model, len(tok), 0, ["vtc"])
        seed_model_init(cfg.pretrain.seed)
        model = fam.build(fam.kinds.prompter, model_cfg).to(device())
        ctx = StepContext(gather=distributed.all_gather_with_grad, rank=distributed.rank())
        batches = _batches(cfg, dataset, data, tok)
        step_fn = lambda m, b: fam.train_step(m, b, ctx)  # noqa: E731
        result = train_model(
            model, step_fn, batches, cfg, out, "pretrain_prompter", tokenizer=tok, lr_groups=fam.lr_groups
        )
        directory.save(out, kind=fam.kinds.prompter, config=model_cfg, checkpoint=result.checkpoint, steps=result.step)
        return train_summary(result) | {"clips_skipped": data.skipped}

    return run_step("pretrain_prompter", out, cfg, "pretrain", work)


def build_prompt_bank(prompter_dir: str, entities_dir: str, out: str, cfg: Config) -> StepResult:
    """Embed 12 video + 12 image templates x the top-M mined entities with the frozen prompter."""

    def work() -> StepResult:
        from vlp.models.alpro.prompts import build_prompt_bank as build

        fam = family_of(cfg.model)
        if not fam.kinds.prompter:
            raise ValueError(f"model family {fam.name!r} has no prompt bank (only ALPRO's PEM uses one)")
        own = cfg.model.own()
        entities_uri = storage.join(entities_dir, "entities.parquet")
        remedy = f"run `vlp mine-entities --out {entities_dir}` first (--entities is its output)"
        check_inputs(models=[ModelInput("--prompter", prompter_dir, ("prompter",))], files=[(entities_uri, remedy)])
        table = storage.read_parquet(entities_uri)  # a few hundred rows: read before the prompter is loaded
        entities = table.sort_by("rank")["entity"].to_pylist()[: own.num_entities]
        if not entities:
            raise ValueError(f"{entities_uri} lists no entities: run `vlp mine-entities` first")
        prompter, tok, _ = load_prompter(prompter_dir)

        def encode(prompts: list[str]) -> torch.Tensor:
            enc = tok(prompts, padding=True, truncation=True, max_length=cfg.model.max_len, return_tensors="pt")
            return prompter.encode_text(enc["input_ids"], enc["attention_mask"])[0]

        bank = build(encode, entities, renormalize=own.bank_renormalize, ensemble_templates=own.prompt_ensemble)
        bank.save(out)
        return {"entities": len(entities), "renormalize": bank.renormalize, "dim": int(bank.video.shape[1])}

    return run_step("build_prompt_bank", out, cfg, "model", work)


def pretrain(dataset: str, frames: str, prompter_dir: str, bank_dir: str, out: str, cfg: Config) -> StepResult:
    """Pre-train a model of ``model.family`` with the enabled ``model.losses`` (ALPRO: VTC + PEM + MLM + VTM, from
    a prompter and its prompt bank; ALBEF: ITC + MLM + ITM with momentum distillation, no prompter: pass ``""``)."""

    def work() -> StepResult:
        from vlp.models.family import StepContext, TextVocab, spec
        from vlp.train import distributed

        distributed.init_from_env()
        fam = family_of(cfg.model)
        if not spec(fam.name).pretrains:
            raise ValueError(
                f"{fam.name} is not pre-trained: it fine-tunes from its named weights (model.preset / video_init); "
                "run finetune-retrieval without --pretrained (the vlp-retrieval DAG)"
            )
        terms = list(cfg.model.losses or fam.default_losses)
        if fam.kinds.prompter and not prompter_dir:
            raise ValueError(f"{fam.name} pre-training needs a prompter (--prompter) and its prompt bank")
        if fam.kinds.prompter and "pem" in terms and not bank_dir:
            raise ValueError(f"{fam.name} pre-training with PEM needs the prompter's prompt bank (--prompt-bank): run "
                             "`vlp build-prompt-bank` first")  # fmt: skip
        store = check_inputs(dataset, frames, **_prompter_inputs(fam, prompter_dir, bank_dir, terms)).store
        prompter = bank = data = None
        if fam.kinds.prompter:
            prompter, tok, _ = load_prompter(prompter_dir)
            if "pem" in terms:
                from vlp.models.alpro.prompts import PromptBank

                bank = PromptBank.load(bank_dir)
        else:
            if prompter_dir or bank_dir:
                log.warning("pretrain: model family %s uses no prompter or prompt bank; ignoring %r and %r",
                            fam.name, prompter_dir, bank_dir)  # fmt: skip
            data = _checked_data(cfg, dataset, store, terms)
            tok = step_tokenizer(cfg, dataset, out)
        num_entities = len(bank.entities) if bank is not None else 0
        model_cfg = model_config(cfg.model, len(tok), num_entities, terms)
        data = data if data is not None else _dataset(cfg, dataset, store, model_cfg)
        batches = _batches(cfg, dataset, data, tok)
        world = distributed.world_size()
        model_cfg = fam.prepare(model_cfg, len(batches.sampler) // batches.batch_size, batches.batch_size * world)
        where = device()
        seed_model_init(cfg.pretrain.seed)
        model = fam.build(fam.kinds.pretrained, model_cfg).to(where)
        extra = None
        if prompter is not None and bank is not None:  # a bank is only loaded beside a prompter
            from vlp.models.alpro.model import PemContext

            extra = PemContext(prompter.to(where), bank.video, bank.image)
        ctx = StepContext(
            vocab=TextVocab.of(tok),
            gather=distributed.all_gather_with_grad,
            gather_nograd=distributed.all_gather_no_grad,
            rank=distributed.rank(),
            world=world,
            extra=extra,
        )

        def step_fn(m: torch.nn.Module, batch: Any) -> Any:
            return fam.train_step(m, batch, ctx)

        result = train_model(model, step_fn, batches, cfg, out, "pretrain", tokenizer=tok, lr_groups=fam.lr_groups)
        directory.save(
            out,
            kind=fam.kinds.pretrained,
            config=model_cfg,
            checkpoint=result.checkpoint,
            tokenizer=tok,
            lineage={"prompter": prompter_dir} if prompter_dir and fam.kinds.prompter else {"dataset": dataset},
            steps=result.step,
            entities=bank.entities if bank is not None else [],
        )
        figures = []
        if bank is not None and distributed.rank() == 0:
            figures = pem_examples(dataset, store, prompter, bank, storage.join(out, PEM_EXAMPLES), cfg, model_cfg)
        return train_summary(result) | {"pem_examples": figures, "clips_skipped": data.skipped}

    return run_step("pretrain", out, cfg, "pretrain", work)


def _prompter_inputs(fam: Any, prompter_dir: str, bank_dir: str, terms: list[str]) -> dict[str, Any]:
    """The prompter and prompt bank :func:`check_inputs` checks for ``pretrain`` (none for a family without)."""
    if not fam.kinds.prompter:
        return {}
    from vlp.models.alpro.prompts import BANK_FILE, ENTITIES_FILE

    remedy = f"run `vlp build-prompt-bank --out {bank_dir}` first (--prompt-bank is its output)"
    bank = [(storage.join(bank_dir, name), remedy) for name in (BANK_FILE, ENTITIES_FILE)] if "pem" in terms else []
    return {"models": [ModelInput("--prompter", prompter_dir, (fam.kinds.prompter,))], "files": bank}


PEM_EXAMPLES = "pem_examples"


@torch.no_grad()
def pem_examples(
    dataset: str,
    frames: str | FrameStore,
    prompter: Any,
    bank: Any,
    out: str,
    cfg: Config,
    pixels: Any,
    n: int = 4,
    seed: int = 0,
) -> list[str]:
    """ALPRO Fig. 3 for ``n`` clips: a random PEM box on the frames and the frozen prompter's top-5 entities.

    Clips come from the test split (the training split when there is none); the box is drawn like PEM's
    (:func:`vlp.losses.sample_pem_boxes`); clips are normalised with ``pixels``' (the model config's) statistics.
    Writes ``<out>/<video_id>.png`` and ``<out>/README.md``.
    """
    import tempfile
    from pathlib import Path

    from vlp import losses
    from vlp.eval.report import pem_figure

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
            black = -(data.mean / data.std).flatten()  # a black pixel in the clip's normalisation
            crop = losses.entity.crop_frames(clip, boxes.pixel_boxes, mode=cfg.model.own().pem_crop, fill=black)
            feat, _ = prompter.encode_video(crop)
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
