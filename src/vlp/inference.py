"""What answering a query needs, below the steps: the evaluation steps and serving (``vlp index``, ``search``,
``answer``, ``serve``) both run it, so a search scores a query exactly as ``evaluate-retrieval`` does and an answer
is what ``evaluate-qa`` predicts, while serving imports no step (ARCHITECTURE.md).

- Encoding: clips sampled with the eval sampler and encoded by the family's ``encode_video``
  (:func:`encode_clips`; a frames store's clips without a dataset: :class:`StoreClips`), texts tokenised to a
  fixed length and encoded by ``encode_text`` (:func:`encode_texts`, :func:`text_length`), the family's fused
  pair scorer over encoded rows (:func:`pair_scorer`), a clip's thumbnail (its middle stored frame).
- Answers: the questions' tokens and the softmax over a QA model's answers (:func:`answer_probabilities`).
- Which model kinds each use reads (:func:`retrieval_kinds`, :func:`qa_kinds`, :func:`starts`).

Every forward runs in the section's ``eval_precision``: fp32, or under bf16 autocast (:func:`autocast`), whose
features are returned as fp32.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch

from vlp import registry
from vlp.config import Config
from vlp.data.frames import FrameStore
from vlp.data.loader import ordered_batches
from vlp.data.video_text import VideoTextDataset
from vlp.distributed import device, require_cpu_bf16
from vlp.models.family import Encoded, Family

if TYPE_CHECKING:
    from vlp.models.family import AnswersQuestions
    from vlp.settings import FinetuneConfig

log = logging.getLogger("vlp")

Precision = Literal["fp32", "bf16"]


def autocast(precision: Precision) -> contextlib.AbstractContextManager:
    """The forwards of an evaluation in ``precision``: ``bf16`` runs them under bf16 autocast on this step's device
    (the weights stay fp32), ``fp32`` changes nothing.

    Raises:
        ValueError: another precision.
    """
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"eval_precision must be fp32 or bf16, got {precision!r}")
    where = device().type
    if precision == "bf16" and where == "cpu":
        require_cpu_bf16("eval_precision=bf16", "eval_precision=fp32 (retrieval.eval_precision, qa.eval_precision)")
    return torch.autocast(where, dtype=torch.bfloat16, enabled=precision == "bf16")


def progress(show: bool, iterable: Any, desc: str, total: int) -> Any:
    """A tqdm bar over the batches on a terminal; nothing in a log, where a bar is only noise."""
    import sys

    if not show or not sys.stderr.isatty():
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, unit="batch", leave=False)


@torch.no_grad()
def encode_clips(fam: Family, model: Any, data: Any, video_ids: list[str], batch: int, cfg: Config) -> Any:
    """The family's :class:`vlp.models.family.Encoded` of every clip (on the CPU), sampled with the eval sampler.

    ``data`` gives ``clip(video_id, rng)`` and ``seed`` (a :class:`vlp.data.video_text.VideoTextDataset`); every
    clip draws from a generator seeded by ``(data.seed, 0)`` alone, so a clip encodes the same in any batch. The
    forwards run in ``cfg.retrieval.eval_precision``."""
    import numpy as np

    def build(indices: Any) -> torch.Tensor:  # in a loader worker: each clip from its id and the seed alone
        return torch.stack([data.clip(video_ids[i], np.random.default_rng([data.seed, 0])) for i in indices])

    feats, tokens, where = [], [], device()
    batches = ordered_batches(len(video_ids), build, batch, cfg.retrieval)
    for clips in progress(cfg.retrieval.progress, batches, "clips", -(-len(video_ids) // batch)):
        with autocast(cfg.retrieval.eval_precision):
            enc = fam.encode_video(model, clips.to(where))
        feats.append(enc.feat.float().cpu())
        tokens.append(enc.tokens.float().cpu())
    return Encoded(torch.cat(feats), torch.cat(tokens))


@torch.no_grad()
def encode_texts(
    fam: Family, model: Any, tok: Any, texts: list[str], length: int, batch: int, precision: Precision = "fp32"
) -> Any:
    """The family's :class:`vlp.models.family.Encoded` of every text (on the CPU), encoded in ``precision``."""
    feats, tokens, masks, where = [], [], [], device()
    for i in range(0, len(texts), batch):
        enc = tok(texts[i : i + batch], padding="max_length", truncation=True, max_length=length, return_tensors="pt")
        with autocast(precision):
            out = fam.encode_text(model, enc["input_ids"].to(where), enc["attention_mask"].to(where))
        if out.mask is None:
            raise TypeError(f"{fam.name}'s encode_text returned no mask (a text's Encoded has one: the contract)")
        feats.append(out.feat.float().cpu())
        tokens.append(out.tokens.float().cpu())
        masks.append(out.mask.cpu())
    return Encoded(torch.cat(feats), torch.cat(tokens), torch.cat(masks))


def pair_scorer(
    fam: Any, model: Any, texts: Any, videos: Any, precision: Precision = "fp32"
) -> Callable[[Any, Any], Any]:
    """``(text_idx, video_idx) -> (P, 2)`` fp32 match logits of the family's fused pass (a
    :class:`vlp.models.family.PairScorer`) over encoded rows, run in ``precision``."""
    where = device()

    @torch.no_grad()
    def score(t_idx: torch.Tensor, v_idx: torch.Tensor) -> torch.Tensor:
        t, m, v = texts.tokens[t_idx].to(where), texts.mask[t_idx].to(where), videos.tokens[v_idx].to(where)
        with autocast(precision):
            logits = fam.pair_logits(model, t, m, v)
        return logits.float().cpu()  # (P, 2)

    return score


def thumbnail(store: FrameStore, video_id: str) -> bytes:
    """The clip's middle stored frame in ``store`` (a :class:`vlp.data.frames.FrameStore`) as JPEG bytes."""
    import io

    from PIL import Image

    n = store.info(video_id)["num_stored"]
    frame = store.load(video_id, [n // 2])[0]
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


class StoreClips(VideoTextDataset):
    """Every clip of a frames store, without a dataset, read as ``evaluate-retrieval`` reads a split's clips:
    :meth:`VideoTextDataset.clip` with the eval sampler of the ``retrieval`` section and no augmentation, at the
    model's frame size and pixel normalisation.

    Without the dataset's ``media`` column a still image is sampled as a one-frame clip, which the sampler
    stretches over every slot: the same frames the dataset's image rule repeats (:mod:`vlp.data.sampling`).
    """

    def __init__(self, store: FrameStore, sample: dict[str, Any], model_cfg: Any) -> None:
        self.store, self.media = store, {}
        self.pairs = [(video_id, "") for video_id in store.video_ids]
        self.num_frames, self.mode, self.seed = sample["num_frames"], sample["eval_mode"], sample["seed"]
        self.augment, self.crop_scale, self.hflip, self.caption_clean = None, (), False, False
        self.size = model_cfg.video.img_size
        self.mean = torch.tensor(model_cfg.pixel_mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(model_cfg.pixel_std, dtype=torch.float32).view(1, 3, 1, 1)
        self.epoch, self.max_bad_share = 0, 0.0


# --------------------------------------------------------------------------- texts and answers


def text_length(section: FinetuneConfig, model_cfg: Any) -> int:
    """The configured text length, capped by the model's position embeddings (with a warning)."""
    if section.max_len > model_cfg.text.max_len:
        log.warning(
            "max_len=%d exceeds the model's %d text positions; texts are cut to %d tokens",
            section.max_len,
            model_cfg.text.max_len,
            model_cfg.text.max_len,
        )
    return min(section.max_len, model_cfg.text.max_len)


def question_tokens(tok: Any, questions: list[str], length: int) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` of ``questions`` as ``evaluate-qa`` feeds them to a model: padded (and
    cut) to ``length`` tokens."""
    return dict(tok(questions, padding="max_length", truncation=True, max_length=length, return_tensors="pt"))


@torch.no_grad()
def answer_probabilities(
    fam: AnswersQuestions,
    net: Any,
    video: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    precision: Precision = "fp32",
) -> torch.Tensor:
    """``(B, A)``, on the CPU: the softmax over the model's answer vocabulary of the family's ``qa_logits`` for each
    (clip, question) row, the forward run in ``precision`` and the softmax in fp32. ``evaluate-qa`` predicts a
    question's most probable answer, with that probability as its ``confidence``; an answer whose logit is ``-inf``
    (ALBEF: one its decoder did not rank) has probability 0."""
    where = device()
    with autocast(precision):
        logits = fam.qa_logits(net, video.to(where), input_ids.to(where), attention_mask.to(where))
    return logits.float().softmax(-1).cpu()


# --------------------------------------------------------------------------- which models


def starts() -> tuple[str, ...]:
    """What fine-tuning starts from: any family's pre-trained model, or a retrieval fine-tuned one (to continue,
    or as QA's start). A QA model's classifier is tied to its answer vocabulary: it is evaluated, not fine-tuned."""
    kinds = [registry.kinds(name) for name in registry.names()]  # from the specs: no family's model code imported
    return tuple(k for one in kinds for k in (one.pretrained, one.retrieval))


def retrieval_kinds() -> tuple[str, ...]:
    """What retrieval evaluates: any family's pretrain output (zero-shot) or retrieval fine-tuned model."""
    return starts()


def qa_kinds() -> tuple[str, ...]:
    """What QA evaluates: the QA fine-tuned model of any family that has one."""
    return tuple(one.qa for one in map(registry.kinds, registry.names()) if one.qa)  # qa: the answering families
