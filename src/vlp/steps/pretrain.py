"""Steps: ``pretrain_prompter`` -> ``build_prompt_bank`` -> ``pretrain``.

``pretrain`` trains any family that pre-trains. What it reads besides the pairs (``FamilySpec.pretrain_inputs``, the
prepared inputs its spec declares: ALPRO's prompter and prompt bank) the family's own hook checks and opens
(:class:`vlp.models.family.PretrainHook`); ALPRO's hook builds the prompt bank too. ``pretrain_prompter`` trains a
family's prompter kind (``Kinds.prompter``) with VTC alone.

Every output is a model directory (:mod:`vlp.models.directory`): ``model.json``, the tokenizer every later
model shares, and the checkpoints. Weights are safetensors written by :mod:`vlp.train.checkpoint`; nothing is
pickled.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from vlp import distributed, storage
from vlp.config import Config
from vlp.data.entities import ENTITIES_PARQUET
from vlp.data.frames import FrameStore
from vlp.data.loader import ResumableSampler, training_batches
from vlp.data.video_text import ClipRandAugment, VideoTextDataset, collate_video_text, pair_groups
from vlp.distributed import device
from vlp.inputs import ModelInput, check_inputs
from vlp.models import directory
from vlp.models.family import (
    Family,
    FamilySpec,
    PretrainBatch,
    PretrainExtras,
    StepContext,
    TextVocab,
    randaug_ops,
    spec,
    specs,
)
from vlp.settings import ModelConfig
from vlp.steps.common import (
    FamilyStep,
    StepResult,
    family_of,
    planned_vocab_size,
    run_step,
    seed_model_init,
    step_tokenizer,
    train_model,
    train_summary,
)

log = logging.getLogger("vlp")


# --------------------------------------------------------------------------- building blocks


def model_config(
    model: ModelConfig, vocab_size: int, num_entities: int, losses: list[str], fam: Family | None = None
) -> Any:
    """The model config of ``model.family`` (``fam`` when the caller has it) for ``model`` with these ``losses``
    (the prompter's: VTC only)."""
    fam = fam if fam is not None else family_of(model)
    return fam.config(replace(model, losses=list(losses)), vocab_size, num_entities)


def _dataset(cfg: Config, dataset: str, frames: str | FrameStore, pixels: Any) -> VideoTextDataset:
    """The training pairs, normalised with ``pixels``' (a model config's) ``pixel_mean`` / ``pixel_std``."""
    p = cfg.pretrain
    return VideoTextDataset(
        frames,
        dataset,
        split="train",
        num_frames=cfg.model.num_frames,
        mode=p.sample_mode,
        augment=ClipRandAugment(ops=randaug_ops(p.randaug_ops, cfg.model.family)) if p.randaug else None,
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
    items = len(ResumableSampler(len(data), seed=cfg.pretrain.seed))  # items per rank per epoch
    batch = min(cfg.pretrain.batch_size, items)
    return batch, items // batch  # VideoTextDataset refuses a split without pairs: items >= 1


def _checked_data(
    cfg: Config, fam: Family, dataset: str, frames: str | FrameStore, terms: list[str]
) -> VideoTextDataset:
    """The training pairs, read before a step writes its tokenizer, with the model section and the batch shape
    checked by the family (its config built once with :func:`planned_vocab_size`) and ``pretrain.group_by`` against
    the pairs, so that a setting that cannot work fails before anything is written."""
    dry = model_config(cfg.model, planned_vocab_size(cfg.model), 0, terms, fam)
    data = _dataset(cfg, dataset, frames, dry)  # the pixel statistics do not depend on the vocabulary
    batch, per_epoch = _batch_shape(cfg, data)
    fam.prepare(dry, per_epoch, batch * distributed.world_size())
    if cfg.pretrain.group_by:
        pair_groups(cfg.pretrain.group_by, dataset, data.pairs)  # a type no clip has is refused
    return data


def pretrain_batch(
    data: VideoTextDataset, tok: Any, max_len: int, clip_index: dict[str, int], indices: list[int]
) -> PretrainBatch:
    """The training batch of pairs ``indices`` (run in a loader worker): clips, captions cut to ``max_len`` tokens,
    which items are images, and each clip's index (``data.clip_index()``)."""
    items = collate_video_text([data[i] for i in indices])
    enc = tok(items["text"], padding="max_length", truncation=True, max_length=max_len)
    is_image = torch.tensor([data.media.get(v) == "image" for v in items["video_id"]])
    ids, mask = torch.tensor(enc["input_ids"]), torch.tensor(enc["attention_mask"])
    clips = torch.tensor([clip_index[v] for v in items["video_id"]])
    return PretrainBatch(items["video"], ids, mask, is_image, clips)


def _batches(cfg: Config, dataset: str, data: VideoTextDataset, tokenizer: Any) -> Any:
    """Resumable batches of :class:`PretrainBatch` over ``data``, the training pairs of ``dataset``."""
    p = cfg.pretrain
    batch, _ = _batch_shape(cfg, data)
    groups = pair_groups(p.group_by, dataset, data.pairs) if p.group_by else None
    fetch = partial(pretrain_batch, data, tokenizer, cfg.model.max_len, data.clip_index())
    return training_batches(p, data, fetch, batch, groups=groups, group_fraction=p.group_fraction,
                            group_epochs=p.group_epochs)  # fmt: skip


# --------------------------------------------------------------------------- steps


def pretrain_prompter(dataset: str, frames: str, out: str, cfg: Config) -> StepResult:
    """Train the prompter: a video-text dual encoder with VTC only (ALPRO §3.2.2)."""
    return run_step("pretrain_prompter", out, cfg, "pretrain", partial(_pretrain_prompter, dataset, frames, out, cfg))


def _pretrain_prompter(dataset: str, frames: str, out: str, cfg: Config) -> StepResult:
    distributed.init_from_env()
    fam = family_of(cfg.model)
    if not fam.kinds.prompter:
        raise ValueError(f"model family {fam.name!r} has no prompter (only ALPRO's PEM uses one)")
    store = check_inputs(dataset, frames).store
    data = _checked_data(cfg, fam, dataset, store, ["vtc"])
    tok = step_tokenizer(cfg, dataset, out)
    model_cfg = model_config(cfg.model, len(tok), 0, ["vtc"], fam)
    seed_model_init(cfg.pretrain.seed)
    model = fam.build(fam.kinds.prompter, model_cfg).to(device())
    ctx = StepContext(gather=distributed.all_gather_with_grad, rank=distributed.rank())
    batches = _batches(cfg, dataset, data, tok)
    result = train_model(model, FamilyStep(fam, ctx), batches, cfg, out, "pretrain_prompter", tokenizer=tok,
                         lr_groups=fam.lr_groups)  # fmt: skip
    directory.save(out, kind=fam.kinds.prompter, config=model_cfg, checkpoint=result.checkpoint, steps=result.step)
    return train_summary(result) | {"clips_skipped": data.skipped}


def build_prompt_bank(prompter_dir: str, entities_dir: str, out: str, cfg: Config) -> StepResult:
    """The prompt bank a family's pre-training reads (``pretrain_inputs`` has ``"bank"``: ALPRO's PEM), made by its
    hook from a prompter and the mined entities."""
    work = partial(_build_prompt_bank, prompter_dir, entities_dir, out, cfg)
    return run_step("build_prompt_bank", out, cfg, "model", work)


def _build_prompt_bank(prompter_dir: str, entities_dir: str, out: str, cfg: Config) -> StepResult:
    one = spec(cfg.model.family)
    hook = one.load_pretraining()
    build = getattr(hook, "build_bank", None)  # only a family whose pre-training reads a prompt bank has one
    if build is None or "bank" not in one.pretrain_inputs:
        raise ValueError(f"model family {one.name!r} pre-trains without a prompt bank (only ALPRO's PEM uses one)")
    entities = storage.join(entities_dir, ENTITIES_PARQUET)
    remedy = f"run `vlp mine-entities --out {entities_dir}` first (--entities is its output)"
    prompter = ModelInput("--prompter", prompter_dir, (one.family().kinds.prompter,))
    check_inputs(models=[prompter], files=[(entities, remedy)])  # both, before the prompter is loaded
    return build(prompter_dir, entities_dir, out, cfg)


def pretrain(dataset: str, frames: str, out: str, cfg: Config, inputs: Mapping[str, str] | None = None) -> StepResult:
    """Pre-train a model of ``model.family`` with the enabled ``model.losses`` (ALPRO: VTC + PEM + MLM + VTM, from
    a prompter and its prompt bank; ALBEF: ITC + MLM + ITM with momentum distillation, from the pairs alone).

    ``inputs`` names what the family's pre-training reads besides the pairs, by the names its spec declares
    (``FamilySpec.pretrain_inputs``; ALPRO: ``{"prompter": ..., "bank": ...}``); ``""`` or absent = not given. A name
    no registered family declares is an error; one that only another family reads is ignored with a warning.
    """
    given = dict(inputs or {})
    known = {one.name for spec_ in specs().values() for one in spec_.prepared if one.flag}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"pretrain: no model family reads the inputs {unknown}; known: {sorted(known)}")
    return run_step("pretrain", out, cfg, "pretrain", partial(_pretrain, dataset, frames, given, out, cfg))


def opened_inputs(
    one: FamilySpec, inputs: Mapping[str, str], terms: list[str], dataset: str, frames: str
) -> tuple[FrameStore, PretrainExtras]:
    """Check the pairs, the frames and what the family's pre-training reads besides them (its hook names each
    input, :class:`vlp.models.family.PretrainHook`), then open the latter on the training device."""
    hook = one.load_pretraining()
    found = hook.checks(inputs, terms) if hook is not None else []
    ignored = {k: v for k, v in inputs.items() if v and k not in one.pretrain_inputs}
    if ignored:
        log.warning("pretrain: model family %s reads none of %s; ignoring them", one.name, ignored)
    store = check_inputs(
        dataset,
        frames,
        models=[ModelInput(c.flag, c.uri, c.kinds) for c in found if c.kinds],
        files=[(c.uri, c.remedy) for c in found if not c.kinds],
    ).store
    return store, hook.load(inputs, terms, device()) if hook is not None else PretrainExtras()


def _pretrain(dataset: str, frames: str, inputs: Mapping[str, str], out: str, cfg: Config) -> StepResult:
    distributed.init_from_env()
    one = spec(cfg.model.family)
    fam = one.family()
    if not one.pretrains:
        raise ValueError(
            f"{fam.name} is not pre-trained: it fine-tunes from its named weights (model.preset / video_init); "
            "run finetune-retrieval without --pretrained (the vlp-retrieval DAG)"
        )
    terms = list(cfg.model.losses or fam.default_losses)
    store, extras = opened_inputs(one, inputs, terms, dataset, frames)
    data, tok = None, extras.tokenizer
    if tok is None:  # the step's own tokenizer: a setting that cannot work fails before it is written
        data = _checked_data(cfg, fam, dataset, store, terms)
        tok = step_tokenizer(cfg, dataset, out)
    model_cfg = model_config(cfg.model, len(tok), len(extras.entities), terms, fam)
    data = data if data is not None else _dataset(cfg, dataset, store, model_cfg)
    batches = _batches(cfg, dataset, data, tok)
    world = distributed.world_size()
    model_cfg = fam.prepare(model_cfg, len(batches.sampler) // batches.batch_size, batches.batch_size * world)
    seed_model_init(cfg.pretrain.seed)
    model = fam.build(fam.kinds.pretrained, model_cfg).to(device())
    ctx = StepContext(
        vocab=TextVocab.of(tok),
        gather=distributed.all_gather_with_grad,
        gather_nograd=distributed.all_gather_no_grad,
        rank=distributed.rank(),
        world=world,
        extra=extras.context,
    )
    result = train_model(model, FamilyStep(fam, ctx), batches, cfg, out, "pretrain", tokenizer=tok,
                         lr_groups=fam.lr_groups)  # fmt: skip
    directory.save(out, kind=fam.kinds.pretrained, config=model_cfg, checkpoint=result.checkpoint, tokenizer=tok,
                   lineage=extras.lineage or {"dataset": dataset}, steps=result.step,
                   entities=extras.entities)  # fmt: skip
    summary = train_summary(result) | {"clips_skipped": data.skipped}
    if extras.report is not None and distributed.rank() == 0:
        summary |= extras.report(dataset, store, out, cfg, model_cfg)
    return summary
