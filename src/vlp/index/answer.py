"""``vlp answer``: a QA fine-tuned model's most probable answers to a question about one clip, as ``evaluate-qa``
predicts them (docs/guides/search.md).

The clip
--------
Either a video id of a frames store (an extract-frames output, or the one a ``vlp index`` output names), or a video
file (local or ``s3://``). A stored clip is read as ``evaluate-qa`` reads a question's clip: the ``qa`` section's
eval sampler (``qa.num_frames``, ``qa.eval_mode``) over the stored frames, no augmentation, the model's frame size
and pixel normalisation (:meth:`vlp.data.video_text.VideoTextDataset.clip`). A video file is first made into the
frames extract-frames would store for it under the config's ``frames`` section, by the project's own code:
probed as ``vlp ingest`` probes a file (its size, declared frame size and duration checked against the
``ingest`` limits before anything decodes it), then decoded, resized and JPEG-encoded as extract-frames does
(checked against the ``frames`` limits), each in a worker process that is killed past ``ingest.timeout_s`` /
``frames.timeout_s`` (:mod:`vlp.data.isolate`), so a hostile or broken file is a :class:`ClipError` naming it,
never a crash. Those frames are then sampled as a stored clip is: with the ``frames`` section extract-frames ran
with, a file gives the frames its stored clip has, and the same answers.

With a random ``qa.eval_mode`` (``rand``, ``headtail``) ``evaluate-qa`` draws a clip's frames from a generator seeded
by the question's row in its split, which a single question does not have; here the generator is seeded by
``(qa.seed, 0)`` and the frames can differ from the evaluation's (a warning says so). The default ``uniform``
draws nothing.

What the probability is
-----------------------
An answer's probability is the softmax over the model's answer vocabulary of the family's ``qa_logits``, computed
by the function ``evaluate-qa`` predicts with (:func:`vlp.inference.answer_probabilities`), in the same
``qa.eval_precision``: the first answer is the evaluation's prediction for that clip and question, its probability
the evaluation's ``confidence``.

- ALPRO classifies: ``qa_logits`` are its answer classifier's logits, and the probability is the classifier's
  probability of the answer.
- ALBEF generates: its answer decoder ranks only the ``answer_topk`` answers (the model's, set from
  ``qa.answer_topk`` when it was fine-tuned) whose first token it finds likeliest, each scored by that first
  token's log-probability plus the answer's log-likelihood (the first token counted twice, as ALBEF's
  ``rank_answer``); the others score ``-inf``. The probability is the softmax of those scores over the ranked
  answers: a normalised ranking score, proportional to ``p(first token)^2 * p(rest | first token)``, not the
  decoder's probability of generating the answer. Answers it did not rank have probability 0 and are not listed.
"""

from __future__ import annotations

import functools
import io
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from vlp import storage
from vlp.config import Config, check_sampled_frames, validate
from vlp.data import video
from vlp.data.frames import FrameStore
from vlp.data.frames.decode import _extract_video
from vlp.data.frames.plan import _VideoTask
from vlp.data.ingest.probe import _probe_one
from vlp.data.isolate import isolated_map
from vlp.data.video_text import VideoTextDataset
from vlp.distributed import device
from vlp.index.query import MAX_K
from vlp.index.store import ClipIndex
from vlp.inference import answer_probabilities, qa_kinds, question_tokens, text_length
from vlp.inputs import ModelInput, StepInputError, check_inputs
from vlp.models import family
from vlp.text import checked_text

log = logging.getLogger("vlp")


class ClipError(ValueError):
    """A video file that cannot be answered about (missing, too large, not a video, not decodable, or its decoder
    crashed or hung). The message is one line that starts with the file's URI; the CLI prints it and exits 2."""


@dataclass(frozen=True)
class Answer:
    """One answer: its 1-based ``rank`` and ``probability`` (see the module docstring for what it is per family)."""

    rank: int
    answer: str
    probability: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Clips(VideoTextDataset):
    """Clips of ``store`` read as ``evaluate-qa`` reads a question's clip: :meth:`VideoTextDataset.clip` with the
    ``qa`` section's eval sampler, no augmentation, at the model's frame size and pixel normalisation (the evaluation
    arguments :func:`vlp.steps.finetune.task_data` passes). Without a dataset's ``media`` column a still image is one
    stored frame, which the sampler stretches over every slot: the frames the dataset's image rule repeats."""

    def __init__(self, store: Any, section: Any, model_cfg: Any) -> None:  # a FrameStore, or a video file's frames
        self.store, self.media, self.pairs = store, {}, []
        self.num_frames, self.mode, self.seed = section.num_frames, section.eval_mode, section.seed
        self.augment, self.crop_scale, self.hflip, self.caption_clean = None, (), False, False
        self.size = model_cfg.video.img_size
        self.mean = torch.tensor(model_cfg.pixel_mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(model_cfg.pixel_std, dtype=torch.float32).view(1, 3, 1, 1)
        self.epoch, self.max_bad_share = 0, 0.0

    def read(self, video_id: str) -> torch.Tensor:
        """``video_id``'s ``(T, 3, H, W)`` clip, its frames drawn (for a random sampler) from ``(seed, 0)``."""
        return self.clip(video_id, np.random.default_rng([self.seed, 0]))


class _FileFrames:
    """The JPEG frames extract-frames would store for one file, read back as :class:`vlp.data.frames.FrameStore`
    reads a clip's frames (what :meth:`VideoTextDataset.clip` asks of a store)."""

    def __init__(self, jpegs: Sequence[bytes]) -> None:
        self.jpegs = list(jpegs)

    def num_stored(self, video_id: str) -> int:
        return len(self.jpegs)

    def load(self, video_id: str, slots: Sequence[int]) -> np.ndarray:
        from PIL import Image

        return np.stack([np.asarray(Image.open(io.BytesIO(self.jpegs[s])).convert("RGB")) for s in slots])


@dataclass(frozen=True)
class _Failed:
    reason: str


def _isolated(fn: Callable[[Any], Any], item: Any, timeout_s: float) -> Any:
    """``fn(item)`` in a worker process (:func:`vlp.data.isolate.isolated_map`): a :class:`_Failed` when the worker
    crashed or ran past ``timeout_s`` (0: no limit)."""
    [result] = isolated_map(fn, [item], workers=1, timeout_s=timeout_s, on_failure=lambda _, why: _Failed(why))
    return result


def stored_frames(uri: str, cfg: Config) -> list[bytes]:
    """The JPEG frames extract-frames would store for the video (or still image) file ``uri`` under ``cfg.frames``,
    after ``vlp ingest``'s probe under ``cfg.ingest`` (see the module docstring).

    Raises:
        ClipError: the file is missing, breaks a limit, is not a video, does not decode, or its decoder crashed or
            ran past its timeout; the message names the file.
        storage.StorageError: the object store failed (not the file).
    """

    def one_line(text: str) -> str:
        return " ".join(text.split())

    if not storage.exists(uri):
        raise ClipError(f"{uri}: no such file (without --frames or --index the clip is a video file)")
    ic, fc = cfg.ingest, cfg.frames
    limits = video.DecodeLimits(ic.max_pixels, ic.max_bytes, ic.max_duration_s)
    probed = _isolated(functools.partial(_probe_one, limits=limits), uri, ic.timeout_s)
    if isinstance(probed, _Failed):
        raise ClipError(f"{uri}: the probe {probed.reason} (ingest.timeout_s={ic.timeout_s:g})")
    measures, reason = probed
    if reason:
        raise ClipError(f"{uri}: {one_line(reason)}")
    media = "image" if video.is_image(uri) else "video"
    task = _VideoTask(os.path.basename(uri), uri, media, int(measures["num_frames"]), float(measures["fps"]))
    result = _isolated(functools.partial(_extract_video, cfg=fc), task, fc.timeout_s)
    if isinstance(result, _Failed):
        raise ClipError(f"{uri}: the decoder {result.reason} (frames.timeout_s={fc.timeout_s:g})")
    if result.reject:
        raise ClipError(f"{uri}: {one_line(result.reject)}")
    return [row[-1] for row in result.rows]


class Answerer:
    """A QA fine-tuned model, loaded once, that answers any number of questions about clips.

    Args:
        model: a ``vlp finetune-qa`` output (or an imported QA model).
        cfg: the config ``evaluate-qa`` runs with (its ``qa`` section samples the clip and cuts the question; a
            video file is read under its ``ingest`` and ``frames`` sections).
        frames: an extract-frames output: clips are its video ids. ``""``: see ``index``.
        index: a ``vlp index`` output: clips are video ids of the frames store it names. Neither: clips are video
            files.

    Raises:
        StepInputError: the model directory or the frames store is missing.
        FileNotFoundError: there is no index at ``index``.
        ValueError: the model is not a QA model (a retrieval or pre-trained one, or of a family without QA: the
            message names what to pass instead), or both ``frames`` and ``index`` are given.
    """

    def __init__(self, model: str, cfg: Config, frames: str = "", index: str = "") -> None:

        if frames and index:
            raise ValueError("give --frames or --index, not both: an index names its frames store")
        validate(cfg)
        check_sampled_frames(cfg, "qa")
        storage.configure(cfg.storage)
        if cfg.qa.eval_mode != "uniform":
            log.warning("answer: qa.eval_mode=%s draws a clip's frames from (qa.seed, 0); evaluate-qa draws them "
                        "from the question's row, so the frames can differ", cfg.qa.eval_mode)  # fmt: skip

        def needs_qa(fam: Any) -> object:
            try:
                return family.qa_of(fam)
            except ValueError as exc:
                raise ValueError(f"--model {model}: {exc}; `vlp answer` takes a `vlp finetune-qa` output") from None

        if index:
            frames = ClipIndex.open(index).info.frames
            where = f"the frames store {frames} that the index {index} names"
        else:
            where = f"--frames {frames}"
        info = check_inputs(models=[ModelInput("--model", model, qa_kinds, needs=needs_qa)]).models[0]
        self.store = None
        if frames:
            if not storage.exists(storage.join(frames, "index.parquet")):
                raise StepInputError(f"{where} has no index.parquet: pass an extract-frames output")
            self.store = FrameStore(frames, cache_shards=8)
        self.cfg, self.frames, self.model = cfg, frames, model
        self.fam = family.qa_of(info.family)
        self.net, self.tok, self.answers = info.load(device()), info.text_ids(), info.answers()
        self.length = text_length(cfg.qa, info.config)
        self.model_cfg = info.config

    def clip(self, clip: str) -> torch.Tensor:
        """The ``(T, 3, H, W)`` clip ``evaluate-qa`` would feed the model: ``clip`` is a video id of the frames store
        when there is one, else a video file.

        Raises:
            ValueError: the frames store has no clip ``clip`` (or its frames are damaged:
                :class:`vlp.data.frames.CorruptClipError`).
            ClipError: the video file cannot be read (see :func:`stored_frames`).
        """
        if self.store is None:
            return _Clips(_FileFrames(stored_frames(clip, self.cfg)), self.cfg.qa, self.model_cfg).read(clip)
        if clip not in self.store:
            raise ValueError(f"the frames store {self.frames} has no clip {clip!r}: pass one of its video ids")
        return _Clips(self.store, self.cfg.qa, self.model_cfg).read(clip)

    @torch.no_grad()
    def answer_clip(self, video: torch.Tensor, question: str, k: int = 5) -> list[Answer]:
        """The ``k`` most probable answers (fewer when fewer have a probability above 0) to ``question`` about the
        ``(T, 3, H, W)`` clip ``video``, most probable first (ties in vocabulary order).

        Raises:
            ValueError: a question that is empty, not valid UTF-8 or over ``index.max_text_chars`` characters
                (:class:`vlp.text.TextError`), or ``k`` outside ``1..MAX_K``.
        """
        checked_text(question, "question", self.cfg.index.max_text_chars)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ValueError(f"k must be an integer in 1..{MAX_K}, got {k!r}")
        enc = question_tokens(self.tok, [question], self.length)
        ids, mask, precision = enc["input_ids"], enc["attention_mask"], self.cfg.qa.eval_precision
        probs = answer_probabilities(self.fam, self.net, video[None], ids, mask, precision)[0]
        values, order = torch.sort(probs, descending=True, stable=True)
        return [
            Answer(rank, self.answers[int(i)], float(p))
            for rank, (p, i) in enumerate(zip(values[:k].tolist(), order[:k].tolist(), strict=True), start=1)
            if p > 0
        ]

    def answer(self, clip: str, question: str, k: int = 5) -> list[Answer]:
        """:meth:`answer_clip` of :meth:`clip`; the question is checked before the clip is read."""
        checked_text(question, "question", self.cfg.index.max_text_chars)
        return self.answer_clip(self.clip(clip), question, k)


def answer(
    model: str, clip: str, question: str, k: int, cfg: Config, frames: str = "", index: str = ""
) -> list[Answer]:
    """:meth:`Answerer.answer` once (the model loaded for this question alone; the question checked before it is)."""
    checked_text(question, "question", cfg.index.max_text_chars)
    return Answerer(model, cfg, frames=frames, index=index).answer(clip, question, k)
