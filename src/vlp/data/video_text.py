"""Training-time video-text pairs: stored frames -> sampled, augmented, normalised clip tensors.

One item is one (clip, caption) pair of a split. Its randomness (which stored frames the ``rand`` /
``headtail`` samplers pick, the augmentation) comes from a generator seeded by
``(seed, epoch, index)``, so an item is the same whichever data-loader worker builds it and a resumed
run sees exactly the batches it would have seen.

Augmentation follows ALPRO's *temporally consistent* RandAugment (ALPRO code:
``TemporalConsistentRandomAugment(N=2, M=5, ...)`` in ``src/datasets/randaugment.py``): the same ops
with the same magnitudes are applied to every frame of a clip. We build it from timm's RandAugment
and replay one seeded random state per frame. Each model family lists its op sets in its spec
(``FamilySpec.randaug``, :func:`vlp.models.family.randaug_ops`); ALPRO's leaves out the released
``HorizontalFlip``: captions of the synthetic world (and of real data) say "to the left", which a
flip would make false.

Still images (``media == "image"``) are repeated into static clips, as ALPRO does with CC3M.

A damaged clip in training (a JPEG that does not decode, :class:`vlp.data.frames.CorruptClipError`) is skipped:
the item is replaced by the next pair whose clip reads (the same one in whichever process builds it), the skip is
logged with its reason and counted (:attr:`VideoTextDataset.skipped`, shared by forked loader workers), and once an
epoch's worth of draws has been made, more than ``max_bad_share`` of them skipped fails the step, naming the shards.
Evaluation (``max_bad_share=0``) never substitutes: a damaged test clip fails the step, naming it.
"""

from __future__ import annotations

import logging
import mmap
import os
import random
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow.compute as pc
import torch
import torch.nn.functional as F
from PIL import Image

from vlp.data import manifest
from vlp.data.frames import CorruptClipError, FrameStore
from vlp.data.sampling import MODES, sample_indices

log = logging.getLogger(__name__)
SUBSTITUTES = 8  # pairs tried after a damaged one before the item fails
IMAGENET_INCEPTION_MEAN = (0.5, 0.5, 0.5)  # timm's ImageNet-21k ViT-B/16 (the paper's visual init)
IMAGENET_INCEPTION_STD = (0.5, 0.5, 0.5)
# OpenAI CLIP's pixel statistics: TS2-Net's CLIP towers; the released ALPRO and ALBEF configs normalise with them too
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def timm_auto_augment() -> Any:
    """timm's ``timm.data.auto_augment`` module (RandAugment), loaded from its file on its own: importing it through
    the package runs ``timm/__init__``, which imports timm's layers and models (about 1 s of every training step's
    start-up, ``torch._dynamo`` included) for a module that needs only PIL and numpy. Where that file cannot load
    on its own (a timm whose module imports more of timm), it is imported through the package."""
    import importlib.util
    import sys

    name = "vlp_timm_auto_augment"
    if name in sys.modules:
        return sys.modules[name]
    found = importlib.util.find_spec("timm")  # finds the package without running its __init__
    locations = list(found.submodule_search_locations or []) if found is not None else []
    path = os.path.join(locations[0], "data", "auto_augment.py") if locations else ""
    spec = importlib.util.spec_from_file_location(name, path) if os.path.isfile(path) else None
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError:  # it imports more of timm now
            pass
        else:
            sys.modules[name] = module
            return module
    import timm.data.auto_augment

    return timm.data.auto_augment


class ClipRandAugment:
    """RandAugment with one random draw per clip, applied identically to every frame.

    Args:
        num_ops: ops per clip (ALPRO: N=2).
        magnitude: op strength 0-10 (ALPRO: M=5).
        ops: timm RandAugment op names: a family's list (:func:`vlp.models.family.randaug_ops`).
    """

    def __init__(self, ops: Sequence[str], num_ops: int = 2, magnitude: int = 5) -> None:
        rand_augment_transform = timm_auto_augment().rand_augment_transform
        if not ops:
            raise ValueError("RandAugment needs at least one op")
        if num_ops < 1 or not 0 <= magnitude <= 10:
            raise ValueError(f"RandAugment needs num_ops >= 1 and magnitude in 0..10, got {num_ops}, {magnitude}")
        self.transform = rand_augment_transform(f"rand-m{magnitude}-n{num_ops}", transforms=list(ops))

    def __call__(self, frames: Sequence[Image.Image], seed: int) -> list[Image.Image]:
        """Augment ``frames`` (one clip) with the ops drawn from ``seed``; global RNG states are restored."""
        py_state, np_state = random.getstate(), np.random.get_state()
        try:
            out = []
            for frame in frames:
                random.seed(seed)  # timm draws op probabilities/magnitudes from `random` ...
                np.random.seed(seed % 2**32)  # ... and the op choice from numpy's global generator
                out.append(self.transform(frame))
            return out
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


class DrawCounts:
    """(skipped, drawn) counts that a process and its forked loader workers add to and all read.

    One anonymous shared mapping (``mmap(-1, ...)`` is ``MAP_SHARED | MAP_ANONYMOUS``, inherited by ``fork``) with
    a slot per process: the main process writes slot 0, loader worker ``k`` slot ``k + 1``, and a total is the sum
    of the slots. No lock and no file: ``multiprocessing.Array`` needs a writable ``/dev/shm`` for its heap and its
    lock, which a container may not have (a step without loader workers must run there)."""

    SLOTS = 256  # loader workers per process, and then some (4 KiB)

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, self.SLOTS * 2 * 8)
        self._slots = np.frombuffer(self._map, dtype=np.int64).reshape(self.SLOTS, 2)

    def add(self, skipped: bool) -> tuple[int, int]:
        """Count one draw of this process; returns the (skipped, drawn) totals over all processes."""
        info = torch.utils.data.get_worker_info()
        k = 0 if info is None else 1 + info.id
        if k >= self.SLOTS:
            raise ValueError(f"at most {self.SLOTS - 1} loader workers share a dataset's counts, got worker {k - 1}")
        self._slots[k] += (int(skipped), 1)
        return self.totals()

    def totals(self) -> tuple[int, int]:
        skipped, drawn = self._slots.sum(axis=0).tolist()
        return int(skipped), int(drawn)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("DrawCounts is shared by fork, not by pickling (a spawned loader worker cannot add to it)")


class VideoTextDataset(torch.utils.data.Dataset):
    """(clip, caption) pairs of one split, read from an extract-frames output.

    Args:
        frames: the ``vlp extract-frames`` output (URI) or an open :class:`FrameStore`.
        dataset: the ingested dataset directory (captions and videos manifests).
        split: "train", "val" or "test".
        num_frames: frames per clip given to the model (ALPRO: 4 in pre-training, 8/16 fine-tuning).
        mode: temporal sampler over the stored frames: "rand", "uniform" or "headtail".
        augment: a :class:`ClipRandAugment`, or None (evaluation).
        mean, std: per-channel normalisation of pixel values in [0, 1].
        seed: base seed of the per-item generators.
        size: resize clips to ``size x size`` (bilinear, antialiased) when the stored frames differ;
            None keeps the stored size.
        crop_scale: ``[lo, hi]``: a random resized crop per clip, the same box in every frame, covering a share
            of the frame drawn from ``[lo, hi]`` with aspect ratio in [3/4, 4/3] (torchvision's
            ``RandomResizedCrop``; ALBEF's code: 0.2-1.0 pre-training, 0.5-1.0 fine-tuning); ``()`` = none.
        hflip: flip each clip left-right with probability 0.5 (ALBEF's code; it makes "moves left" captions false).
        caption_clean: pass every caption through :func:`clean_caption` (ALBEF's code).
        max_bad_share: the share of clips drawn that may be damaged and skipped (see the module docstring);
            0 = none: a damaged clip raises :class:`vlp.data.frames.CorruptClipError`.
    """

    def __init__(
        self,
        frames: str | FrameStore,
        dataset: str,
        *,
        split: str = "train",
        num_frames: int = 4,
        mode: str = "rand",
        augment: ClipRandAugment | None = None,
        mean: Sequence[float] = IMAGENET_INCEPTION_MEAN,
        std: Sequence[float] = IMAGENET_INCEPTION_STD,
        seed: int = 0,
        size: int | None = None,
        crop_scale: Sequence[float] = (),
        hflip: bool = False,
        caption_clean: bool = False,
        max_bad_share: float = 0.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown sampling mode {mode!r}; use one of {list(MODES)}")
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {num_frames}")
        if crop_scale and (len(crop_scale) != 2 or not 0 < crop_scale[0] <= crop_scale[1] <= 1):
            raise ValueError(f"crop_scale must be [] or [lo, hi] with 0 < lo <= hi <= 1, got {list(crop_scale)}")
        self.crop_scale, self.hflip, self.caption_clean = tuple(crop_scale), hflip, caption_clean
        self.store = frames if isinstance(frames, FrameStore) else FrameStore(frames, cache_shards=64)
        videos = manifest.read(dataset, manifest.VIDEOS, manifest.VIDEO_SCHEMA)
        self.media = dict(zip(videos["video_id"].to_pylist(), videos["media"].to_pylist(), strict=True))
        self.pairs = self._read_pairs(dataset, split)
        self.num_frames, self.mode, self.augment, self.seed, self.size = num_frames, mode, augment, seed, size
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
        self.epoch = 0
        if not 0.0 <= max_bad_share <= 1.0:
            raise ValueError(f"max_bad_share must be in [0, 1], got {max_bad_share}")
        self.max_bad_share = max_bad_share
        self._counts = DrawCounts()
        self._bad_shards: dict[str, int] = {}  # this process's skips by shard, for the error message

    @property
    def skipped(self) -> int:
        """Damaged clips skipped so far, by this process and its forked loader workers."""
        return self._counts.totals()[0]

    def _read_pairs(self, dataset: str, split: str) -> list[tuple[str, str]]:
        """(video_id, caption) of ``split`` for the clips that have frames (extract-frames may reject some)."""
        captions = manifest.read(dataset, manifest.CAPTIONS, manifest.CAPTION_SCHEMA)
        rows = captions.filter(pc.equal(captions["split"], split))
        ids, texts = rows["video_id"].to_pylist(), rows["caption"].to_pylist()
        stored = self.store.positions(ids) >= 0  # one vectorised lookup, not one per caption
        pairs = [(v, c) for v, c, ok in zip(ids, texts, stored.tolist(), strict=True) if ok]
        if not pairs:
            raise ValueError(
                f"no (clip, caption) pairs for split {split!r} in {dataset} with frames in {self.store.out}"
            )
        return pairs

    def clip_index(self) -> dict[str, int]:
        """``{video_id: int}`` over the clips of :attr:`pairs` (sorted ids): two captions of one clip share it
        (``PretrainBatch.video_index``, for the same-clip rules of VTC and VTM)."""
        return {video_id: i for i, video_id in enumerate(sorted({v for v, _ in self.pairs}))}

    def set_epoch(self, epoch: int) -> None:
        """Items of a new epoch draw new frames and augmentations (deterministically)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self.max_bad_share <= 0:
            return self._item(index)
        failure: CorruptClipError | None = None
        for k in range(SUBSTITUTES + 1):
            j = (index + k) % len(self.pairs)
            try:
                item = self._item(j)
            except CorruptClipError as exc:
                shard = self.store.info(self.pairs[j][0])["shard"]
                self._bad_shards[shard] = self._bad_shards.get(shard, 0) + 1
                failure = failure or exc
                continue
            self._count(failure)
            return item
        shards = ", ".join(sorted(self._bad_shards))
        raise CorruptClipError(f"pair {index} and the {SUBSTITUTES} after it have damaged clips ({shards}): {failure}")

    def _item(self, index: int) -> dict[str, Any]:
        video_id, caption = self.pairs[index]
        rng = np.random.default_rng([self.seed, self.epoch, index])
        text = clean_caption(caption) if self.caption_clean else caption
        return {"video": self.clip(video_id, rng), "text": text, "video_id": video_id, "index": index}

    def _count(self, failure: CorruptClipError | None) -> None:
        """Count one draw (skipped when ``failure``); once a whole epoch's worth of draws has been counted, fail when
        more than ``max_bad_share`` of them were skipped."""
        skipped, drawn = self._counts.add(failure is not None)
        if failure is not None:
            log.warning(
                "skipped a damaged clip (%d of %d draws so far), took the next pair: %s", skipped, drawn, failure
            )
        if skipped and drawn >= len(self.pairs) and skipped > self.max_bad_share * drawn:
            shards = ", ".join(f"{name} ({n})" for name, n in sorted(self._bad_shards.items())) or "in other workers"
            raise CorruptClipError(
                f"{skipped} of {drawn} clips drawn were damaged, more than max_bad_share={self.max_bad_share:g} "
                f"allows; re-run extract-frames for the shards they came from: {shards}"
            )

    def clip(self, video_id: str, rng: np.random.Generator) -> torch.Tensor:
        """``video_id``'s sampled, augmented, resized, normalised ``(T, 3, H, W)`` clip, drawn from ``rng``."""
        if self.media.get(video_id) == "image":
            slots = [0] * self.num_frames  # a still repeated into a static clip
        else:
            slots = sample_indices(self.store.num_stored(video_id), self.num_frames, self.mode, rng)
        frames = self.store.load(video_id, slots)  # (T, H, W, 3) uint8
        if self.crop_scale:
            top, left, h, w = random_resized_box(frames.shape[1], frames.shape[2], self.crop_scale, rng)
            frames = frames[:, top : top + h, left : left + w]
        if self.hflip and rng.random() < 0.5:
            frames = frames[:, :, ::-1]
        frames = np.ascontiguousarray(frames)
        if self.augment is not None:
            pil = self.augment([Image.fromarray(f) for f in frames], seed=int(rng.integers(2**31)))
            frames = np.stack([np.asarray(p) for p in pil])
        video = torch.from_numpy(frames).permute(0, 3, 1, 2).float().div_(255)  # (T, 3, H, W)
        if self.size is not None and tuple(video.shape[-2:]) != (self.size, self.size):
            video = F.interpolate(video, size=(self.size, self.size), mode="bilinear", antialias=True)
        return (video - self.mean) / self.std


def clean_caption(text: str, max_words: int = 30) -> str:
    """ALBEF's caption cleaning (its ``pre_caption``): lower case, ``,.'!?"()*#:;~`` removed, ``-`` and ``/`` made
    spaces, runs of spaces collapsed, at most ``max_words`` words. The paper states none of it."""
    text = re.sub(r"[,.'!?\"()*#:;~]", "", text.lower()).replace("-", " ").replace("/", " ")
    words = re.sub(r"\s{2,}", " ", text).strip().split(" ")
    return " ".join(words[:max_words])


def random_resized_box(
    height: int,
    width: int,
    scale: Sequence[float],
    rng: np.random.Generator,
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of a random crop covering a share in ``scale`` of the frame with aspect ratio in
    ``ratio`` (torchvision ``RandomResizedCrop.get_params`` with its ratio (3/4, 4/3): ten tries, then the central
    crop of the nearest allowed ratio)."""
    area = height * width
    log_ratio = (np.log(ratio[0]), np.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = float(np.exp(rng.uniform(*log_ratio)))
        w, h = round(np.sqrt(target * aspect)), round(np.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    aspect = width / height
    if aspect < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif aspect > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class VideoQADataset(VideoTextDataset):
    """(clip, question, answer) triples of one split, read from the ingested ``qa.parquet``.

    Takes the arguments of :class:`VideoTextDataset`. Items carry ``text`` (the question), ``answer``
    (normalised: stripped, lower-case) and ``answer_type``; :attr:`pairs` lists ``(video_id, question)``.
    """

    def _read_pairs(self, dataset: str, split: str) -> list[tuple[str, str]]:
        qa = manifest.read(dataset, manifest.QA, manifest.QA_SCHEMA)
        rows = [r for r in qa.filter(pc.equal(qa["split"], split)).to_pylist() if r["video_id"] in self.store]
        if not rows:
            raise ValueError(f"no QA pairs for split {split!r} in {dataset} with frames in {self.store.out}")
        self.qa = rows
        return [(r["video_id"], r["question"]) for r in rows]

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = super().__getitem__(index)
        row = self.qa[item["index"]]  # a damaged clip's substitute brings its own question
        item.update(answer=normalize_answer(row["answer"]), answer_type=row["answer_type"], qa_id=row["qa_id"])
        return item


def pair_groups(group_by: str, dataset: str, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """One integer group per (clip, caption) pair, for grouped batches (``pretrain.group_by``).

    ``group_by = "qa:<answer_type>"`` groups clips by their answer to a question of that type (in the
    synthetic world ``qa:scene`` groups them by background). Clips with no such question get -1
    (ungrouped). Groups are numbered in sorted answer order.

    Raises:
        ValueError: for another spelling, or when no clip of ``pairs`` has an answer of that type.
    """
    kind, _, answer_type = group_by.partition(":")
    if kind != "qa" or not answer_type:
        raise ValueError(f"group_by={group_by!r}: use '' (random batches) or 'qa:<answer_type>', e.g. 'qa:scene'")
    qa = manifest.read(dataset, manifest.QA, manifest.QA_SCHEMA)
    qa = qa.filter(pc.equal(qa["answer_type"], answer_type))
    answer: dict[str, str] = {}
    for video_id, ans in zip(qa["video_id"].to_pylist(), qa["answer"].to_pylist(), strict=True):
        answer.setdefault(video_id, normalize_answer(ans))
    names = sorted({answer[v] for v, _ in pairs if v in answer})
    if not names:
        raise ValueError(f"group_by={group_by!r}: no clip of these pairs has a question of type {answer_type!r}")
    index = {name: i for i, name in enumerate(names)}
    return np.array([index[answer[v]] if v in answer else -1 for v, _ in pairs], dtype=np.int64)


def normalize_answer(answer: str) -> str:
    """The answer as compared and classified: stripped and lower-cased."""
    return answer.strip().lower()


def collate_video_text(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack clips to ``(B, T, 3, H, W)``; texts, ids and indices stay lists (tokenised by the model side)."""
    return {
        "video": torch.stack([it["video"] for it in items]),
        "text": [it["text"] for it in items],
        "video_id": [it["video_id"] for it in items],
        "index": torch.tensor([it["index"] for it in items]),
    }
