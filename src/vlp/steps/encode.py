"""The encoders of ``evaluate-retrieval``, shared with the clip index (:mod:`vlp.index`) so that both score a
query the same way: clips sampled with the eval sampler and encoded by the family's ``encode_video``, texts
tokenised to a fixed length and encoded by ``encode_text``, the family's fused pair scorer over encoded rows, and
a clip's thumbnail (its middle stored frame). Every forward runs in the section's ``eval_precision``: fp32, or
under bf16 autocast (:func:`autocast`), whose features are returned as fp32."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Literal

import torch

from vlp.config import Config
from vlp.data.loader import ordered_batches
from vlp.distributed import device

Precision = Literal["fp32", "bf16"]


def autocast(precision: Precision) -> contextlib.AbstractContextManager:
    """The forwards of an evaluation in ``precision``: ``bf16`` runs them under bf16 autocast on this step's device
    (the weights stay fp32), ``fp32`` changes nothing.

    Raises:
        ValueError: another precision.
    """
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"eval_precision must be fp32 or bf16, got {precision!r}")
    return torch.autocast(device().type, dtype=torch.bfloat16, enabled=precision == "bf16")


def progress(show: bool, iterable: Any, desc: str, total: int) -> Any:
    """A tqdm bar over the batches on a terminal; nothing in a log, where a bar is only noise."""
    import sys

    if not show or not sys.stderr.isatty():
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, unit="batch", leave=False)


@torch.no_grad()
def encode_clips(fam: Any, model: Any, data: Any, video_ids: list[str], batch: int, cfg: Config) -> Any:
    """The family's :class:`vlp.models.family.Encoded` of every clip (on the CPU), sampled with the eval sampler.

    ``data`` gives ``clip(video_id, rng)`` and ``seed`` (a :class:`vlp.data.video_text.VideoTextDataset`); every
    clip draws from a generator seeded by ``(data.seed, 0)`` alone, so a clip encodes the same in any batch. The
    forwards run in ``cfg.retrieval.eval_precision``."""
    import numpy as np

    from vlp.models.family import Encoded

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
    fam: Any, model: Any, tok: Any, texts: list[str], length: int, batch: int, precision: Precision = "fp32"
) -> Any:
    """The family's :class:`vlp.models.family.Encoded` of every text (on the CPU), encoded in ``precision``."""
    from vlp.models.family import Encoded

    feats, tokens, masks, where = [], [], [], device()
    for i in range(0, len(texts), batch):
        enc = tok(texts[i : i + batch], padding="max_length", truncation=True, max_length=length, return_tensors="pt")
        with autocast(precision):
            out = fam.encode_text(model, enc["input_ids"].to(where), enc["attention_mask"].to(where))
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


def thumbnail(store: Any, video_id: str) -> bytes:
    """The clip's middle stored frame in ``store`` (a :class:`vlp.data.frames.FrameStore`) as JPEG bytes."""
    import io

    from PIL import Image

    n = store.info(video_id)["num_stored"]
    frame = store.load(video_id, [n // 2])[0]
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="JPEG", quality=85)
    return buf.getvalue()
