"""Fine-tuning steps: ``finetune-retrieval`` (ALPRO: VTC + VTM) and ``finetune-qa`` (ALPRO: answer classifier).

The model's family (:mod:`vlp.models.family`, read from the starting model directory) builds the model, its
fine-tuning config and its step function. Both start from a ``pretrain`` output (or a ``finetune-*`` output,
to continue), use the shared training loop (AdamW, warm-up + linear decay, clipping, accumulation, DDP under
``torchrun``, exact resume) and write the same model directory as pre-training (:mod:`vlp.models.directory`)
+ ``metrics.jsonl``.
The video tower keeps the pre-trained frame count in its config; clips with another frame count (8 or 16
here, 4 in pre-training) use the interpolated time embedding (:mod:`vlp.models.layers.timesformer`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from vlp import distributed
from vlp.config import Config
from vlp.data import manifest
from vlp.data.frames import FrameStore
from vlp.data.loader import training_batches
from vlp.data.video_text import (
    ClipRandAugment,
    VideoQADataset,
    VideoTextDataset,
    collate_video_text,
    normalize_answer,
)
from vlp.distributed import device
from vlp.eval.qa import build_answer_vocab
from vlp.inference import starts, text_length
from vlp.inputs import ModelInput, check_inputs
from vlp.models import directory, family
from vlp.models.family import Family, PretrainBatch, StepContext, TextVocab, randaug_ops
from vlp.settings import FinetuneConfig
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


def with_max_steps(section: FinetuneConfig, num_items: int) -> FinetuneConfig:
    """``section`` with ``max_steps`` set from ``epochs`` when it is 0 (per-process items, drop-last batches)."""
    if section.max_steps > 0:
        return section

    per_rank = num_items // distributed.world_size()
    updates_per_epoch = max(1, per_rank // section.batch_size // section.grad_accum)
    return dataclasses.replace(section, max_steps=max(1, math.ceil(section.epochs * updates_per_epoch)))


def task_data(
    cls: type,
    section: FinetuneConfig,
    dataset: str,
    frames: str | FrameStore,
    model_cfg: Any,
    split: str,
    family: str = "",
    *,
    training: bool,
) -> Any:
    """``cls`` (a :class:`VideoTextDataset`) over ``split`` with the task's frames (an extract-frames output, or
    its open store), at the model's frame size and pixel normalisation. ``training``: the training sampler and
    augmentation (``family``, the model's, picks the RandAugment ops when ``section.randaug_ops`` is ``""``); else
    the eval sampler, no augmentation and no bad clips allowed, whatever the split is called (an evaluation or an
    index of the train split reads it as evaluate-retrieval reads the test split)."""
    augment = ClipRandAugment(ops=randaug_ops(section.randaug_ops, family)) if section.randaug and training else None
    return cls(
        frames,
        dataset,
        split=split,
        num_frames=section.num_frames,
        mode=section.sample_mode if training else section.eval_mode,
        augment=augment,
        crop_scale=section.crop_scale if training else (),
        hflip=section.hflip and training,
        caption_clean=section.caption_clean,
        seed=section.seed,
        max_bad_share=section.max_bad_share if training else 0.0,
        size=model_cfg.video.img_size,
        mean=model_cfg.pixel_mean,
        std=model_cfg.pixel_std,
    )


def _paragraphs(data: VideoTextDataset) -> None:
    """DiDeMo-style paragraph retrieval: one text per video, its captions joined in manifest order."""
    texts: dict[str, list[str]] = {}
    for video_id, caption in data.pairs:
        texts.setdefault(video_id, []).append(caption.strip())
    data.pairs = [(video_id, " ".join(parts)) for video_id, parts in texts.items()]


def retrieval_data(
    cfg: Config, dataset: str, frames: str | FrameStore, model_cfg: Any, split: str, family: str = "", *, training: bool
) -> VideoTextDataset:
    """(clip, caption) pairs for retrieval (:func:`task_data`); one paragraph per clip when ``retrieval.paragraph``."""
    data = task_data(VideoTextDataset, cfg.retrieval, dataset, frames, model_cfg, split, family, training=training)
    if cfg.retrieval.paragraph:
        _paragraphs(data)
    return data


def _batches(data: Any, section: FinetuneConfig, fetch: Any) -> Any:
    """Resumable training batches of ``fetch`` over ``data`` (the batch cut to the pairs a rank has)."""
    per_rank = -(-len(data) // distributed.world_size())
    return training_batches(section, data, fetch, min(section.batch_size, per_rank))


def _epoch_shape(batches: Any) -> tuple[int, int]:
    """(batches per epoch on this rank, global batch) of resumable batches: what ``family.prepare`` needs."""
    return max(1, len(batches.sampler) // batches.batch_size), batches.batch_size * distributed.world_size()


def _checked_data(cfg: Config, dataset: str, frames: FrameStore, fam: Family) -> VideoTextDataset:
    """The retrieval training pairs of a model started from the ``model`` section, read before the step writes its
    tokenizer, with the model and ``retrieval`` sections and the batch shape checked by the family (its config
    built once with :func:`planned_vocab_size`), so that a setting that cannot work fails before anything is
    written."""
    dry = fam.task_config(fam.config(cfg.model, planned_vocab_size(cfg.model)), "retrieval", cfg.retrieval)
    # the frame size and the pixel statistics do not depend on the vocabulary
    data = retrieval_data(cfg, dataset, frames, dry, "train", fam.name, training=True)
    fam.prepare(dry, *_epoch_shape(_batches(data, with_max_steps(cfg.retrieval, len(data)), None)))
    return data


def finetune_retrieval(dataset: str, frames: str, pretrained: str, out: str, cfg: Config) -> StepResult:
    """Fine-tune a model for text-video retrieval with the ``retrieval.losses``, contrastive and matching (ALPRO:
    VTC + VTM; ALBEF: ITC + ITM; TS2-Net: its frame-score contrastive loss only).

    ``pretrained`` is a pre-trained (or retrieval) model directory, or ``""`` to start from the ``model`` section
    instead: the family's weights by name or path (TS2-Net: CLIP), or random init where the preset names none;
    the tokenizer is then the weights' own, or WordPiece trained on the training captions.
    """
    work = partial(_finetune_retrieval, dataset, frames, pretrained, out, cfg)
    return run_step("finetune_retrieval", out, cfg, "retrieval", work)


@dataclass
class RetrievalStart:
    """Where ``finetune-retrieval`` starts: the family, its retrieval config (before ``prepare``), the tokenizer, the
    weights (a checkpoint directory; ``""`` = the ``model`` section's named weights or random init), the lineage
    ``model.json`` records, and the training pairs."""

    fam: Family
    model_cfg: Any
    tok: Any
    checkpoint: str
    lineage: dict[str, str]
    data: VideoTextDataset


def retrieval_start(dataset: str, frames: str, pretrained: str, out: str, cfg: Config) -> RetrievalStart:
    """Check the inputs, then open the starting model directory, or (no ``pretrained``) check the ``model`` section
    against the training pairs and make the step's tokenizer in ``out``."""
    models = [ModelInput("--pretrained", pretrained, starts)] if pretrained else []
    inputs = check_inputs(dataset, frames, models=models)
    data = None
    if pretrained:
        start = inputs.models[0]
        fam, base, tok, checkpoint = start.family, start.config, start.tokenizer(), start.checkpoint
        lineage = {"pretrained": pretrained}
    else:
        fam = family_of(cfg.model)
        data = _checked_data(cfg, dataset, inputs.store, fam)
        tok = step_tokenizer(cfg, dataset, out)
        base, checkpoint = fam.config(cfg.model, len(tok)), ""
        video_init, text_init = fam.weights(cfg.model)
        lineage = {"dataset": dataset, "video_init": video_init or "random", "text_init": text_init or "random"}
    model_cfg = fam.task_config(base, "retrieval", cfg.retrieval)
    if data is None:
        data = retrieval_data(cfg, dataset, inputs.store, model_cfg, "train", fam.name, training=True)
    return RetrievalStart(fam, model_cfg, tok, checkpoint, lineage, data)


def retrieval_batch(
    data: VideoTextDataset, tok: Any, length: int, clip_index: dict[str, int], indices: list[int]
) -> PretrainBatch:
    """The training batch of pairs ``indices`` (run in a loader worker): clips, captions cut to ``length`` tokens,
    and each clip's index (``data.clip_index()``), which tells the contrastive loss two captions of one clip apart
    from two clips."""
    items = collate_video_text([data[i] for i in indices])
    enc = tok(items["text"], padding="max_length", truncation=True, max_length=length)
    clips = torch.tensor([clip_index[v] for v in items["video_id"]])
    ids, mask = torch.tensor(enc["input_ids"]), torch.tensor(enc["attention_mask"])
    return PretrainBatch(items["video"], ids, mask, video_index=clips)


def _finetune_retrieval(dataset: str, frames: str, pretrained: str, out: str, cfg: Config) -> StepResult:
    distributed.init_from_env()
    start = retrieval_start(dataset, frames, pretrained, out, cfg)
    fam, tok, data = start.fam, start.tok, start.data
    length = text_length(cfg.retrieval, start.model_cfg)
    section = with_max_steps(cfg.retrieval, len(data))
    batches = _batches(data, section, partial(retrieval_batch, data, tok, length, data.clip_index()))
    model_cfg = fam.prepare(start.model_cfg, *_epoch_shape(batches))
    seed_model_init(cfg.retrieval.seed)
    model = fam.build(fam.kinds.retrieval, model_cfg)  # loads the section's named weights when starting anew
    if start.checkpoint:
        skipped = fam.init_from(model, start.checkpoint, "retrieval")
        log.info("finetune_retrieval: started from %s (skipped %d head tensors)", pretrained, len(skipped))
    else:
        log.info("finetune_retrieval: started from the model section (%s weights: video %s, text %s)",
                 fam.name, start.lineage["video_init"], start.lineage["text_init"])  # fmt: skip
    model.to(device())
    ctx = StepContext(
        vocab=TextVocab.of(tok) if tok.mask_token_id is not None else None,  # CLIP's tokenizer has no [MASK]
        gather=distributed.all_gather_with_grad,
        gather_nograd=distributed.all_gather_no_grad,
        rank=distributed.rank(),
        world=distributed.world_size(),
    )
    result = train_model(model, FamilyStep(fam, ctx), batches, cfg, out, "finetune_retrieval", section, tokenizer=tok,
                         lr_groups=fam.lr_groups)  # fmt: skip
    directory.save(out, kind=fam.kinds.retrieval, config=model_cfg, checkpoint=result.checkpoint, tokenizer=tok,
                   lineage=start.lineage, steps=result.step, max_len=length, task="retrieval")  # fmt: skip
    return train_summary(result) | {"clips_skipped": data.skipped}


def finetune_qa(dataset: str, frames: str, pretrained: str, out: str, cfg: Config) -> StepResult:
    """Fine-tune a pre-trained model for open-ended QA over the ``qa.answer_vocab`` most frequent answers (ALPRO: a
    classifier's cross-entropy; ALBEF: an answer decoder that ranks them). A model of a family without a QA model
    (:func:`vlp.models.family.qa_of`) is refused before a model is loaded or anything is written."""
    return run_step("finetune_qa", out, cfg, "qa", partial(_finetune_qa, dataset, frames, pretrained, out, cfg))


def qa_training_data(data: VideoQADataset, vocab_size: int) -> tuple[list[str], int]:
    """The answer vocabulary (the ``vocab_size`` most frequent training answers, normalised) and the number of
    training questions; the questions whose answer is outside it are dropped from ``data`` (nothing to learn)."""
    answers = build_answer_vocab([normalize_answer(row["answer"]) for row in data.qa], vocab_size)
    index = set(answers)
    total = len(data.qa)
    keep = [i for i, row in enumerate(data.qa) if normalize_answer(row["answer"]) in index]
    if not keep:
        raise ValueError(f"none of the {total} training answers is in the {len(answers)}-answer vocabulary")
    data.qa, data.pairs = [data.qa[i] for i in keep], [data.pairs[i] for i in keep]
    log.info("finetune_qa: %d answers cover %d of %d training questions", len(answers), len(keep), total)
    return answers, total


def qa_batch(
    data: VideoQADataset, tok: Any, length: int, index: dict[str, int], indices: list[int]
) -> dict[str, torch.Tensor]:
    """The training batch of questions ``indices`` (run in a loader worker): clips, questions cut to ``length``
    tokens, and each answer's index in the vocabulary (``index``)."""
    items = [data[i] for i in indices]
    enc = tok([it["text"] for it in items], padding="max_length", truncation=True, max_length=length)
    return {
        "video": torch.stack([it["video"] for it in items]),
        "input_ids": torch.tensor(enc["input_ids"]),
        "attention_mask": torch.tensor(enc["attention_mask"]),
        "label": torch.tensor([index[it["answer"]] for it in items]),
    }


def _finetune_qa(dataset: str, frames: str, pretrained: str, out: str, cfg: Config) -> StepResult:
    distributed.init_from_env()
    start_model = ModelInput("--pretrained", pretrained, starts, needs=family.qa_of)  # a family with QA only
    inputs = check_inputs(dataset, frames, table=manifest.QA, models=[start_model])
    start = inputs.models[0]
    fam = family.qa_of(start.family)
    model_cfg = fam.task_config(start.config, "qa", cfg.qa)  # the towers and the fusion; no pre-training heads
    data = task_data(VideoQADataset, cfg.qa, dataset, inputs.store, model_cfg, "train", fam.name, training=True)
    answers, total = qa_training_data(data, cfg.qa.answer_vocab)
    section = with_max_steps(cfg.qa, len(data))
    tok = start.tokenizer()
    length = text_length(cfg.qa, model_cfg)
    index = {answer: i for i, answer in enumerate(answers)}
    batches = _batches(data, section, partial(qa_batch, data, tok, length, index))
    model_cfg = fam.prepare(model_cfg, *_epoch_shape(batches))  # per forward, as the model counts them
    seed_model_init(cfg.qa.seed)
    model = fam.build(fam.kinds.qa, model_cfg, len(answers))
    fam.init_from(model, start.checkpoint, "qa")
    fam.set_answers(model, answers, tok)
    model.to(device())
    ctx = StepContext(vocab=TextVocab.of(tok), rank=distributed.rank(), world=distributed.world_size())
    result = train_model(model, FamilyStep(fam, ctx, "qa_step"), batches, cfg, out, "finetune_qa", section,
                         tokenizer=tok, lr_groups=fam.lr_groups)  # fmt: skip
    directory.save(out, kind=fam.kinds.qa, config=model_cfg, checkpoint=result.checkpoint, tokenizer=tok,
                   answers=answers, lineage={"pretrained": pretrained}, steps=result.step, max_len=length,
                   task="qa")  # fmt: skip
    return train_summary(result) | {
        "clips_skipped": data.skipped,
        "answers": len(answers),
        "train_answer_coverage": round(len(data.qa) / total, 4),
    }
