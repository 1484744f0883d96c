"""The dataset: every item planned, rendered, encoded and described by worker processes, then the manifests."""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from vlp import storage
from vlp.data import manifest
from vlp.data.manifest import BOX_SCHEMA as BOX
from vlp.data.manifest import CAPTION_SCHEMA as CAPTION
from vlp.data.manifest import RAW_VIDEO_SCHEMA as RAW_VIDEO
from vlp.data.synth.encode import _save_jpeg, encode_mp4
from vlp.data.synth.language import captions_for, questions_for
from vlp.data.synth.plan import ItemPlan, assign_splits, item_rng, plan_item
from vlp.data.synth.render import render
from vlp.data.synth.world import SynthConfig
from vlp.signals import die_with_parent

# --------------------------------------------------------------------------- one item (runs in a worker)


@dataclass
class ItemResult:
    """What a worker hands back for one item: its plan, its media file and its text."""

    plan: ItemPlan
    local_path: str
    captions: list[str]
    qa: list[tuple[str, str, str]]
    boxes: np.ndarray  # (T, K, 4) float32


@dataclass(frozen=True)
class _Task:
    cfg: SynthConfig
    media: str
    index: int
    split: str
    tmp_dir: str = field(repr=False)


def _build_item(task: _Task) -> ItemResult:
    """Plan, render, encode and describe one item (runs in a worker process)."""
    cfg = task.cfg
    plan = plan_item(cfg, task.media, task.index, task.split)
    frames, boxes = render(plan, cfg.size, cfg.seed)
    local_path = os.path.join(task.tmp_dir, plan.rel_path)
    os.makedirs(os.path.dirname(local_path), exist_ok=True)
    if plan.media == "video":
        encode_mp4(frames, plan.fps, local_path, cfg.crf)
    else:
        _save_jpeg(frames[0], local_path, cfg.jpeg_quality)
    rng = item_rng(cfg.seed, plan.media, plan.index, 1)
    captions = captions_for(plan, cfg.captions_per_video, rng, cfg.color_mention)
    qa = questions_for(plan, cfg.qa_per_video, item_rng(cfg.seed, plan.media, plan.index, 2))
    return ItemResult(plan, local_path, captions, qa, boxes)


# --------------------------------------------------------------------------- the dataset


def _tasks(cfg: SynthConfig, tmp_dir: str) -> list[_Task]:
    tasks = []
    for media, n in (("video", cfg.num_videos), ("image", cfg.resolved_num_images())):
        splits = assign_splits(n, cfg.val_fraction, cfg.test_fraction, cfg.seed, media)
        tasks += [_Task(cfg, media, i, splits[i], tmp_dir) for i in range(n)]
    return tasks


def _run(tasks: list[_Task], workers: int) -> Iterator[ItemResult]:
    """Results in task order, from a pool of spawned processes (or in-process when workers == 1)."""
    if workers == 1 or len(tasks) <= 1:
        yield from map(_build_item, tasks)
        return
    chunk = max(1, min(8, len(tasks) // (4 * workers)))
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads (boto3)
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx, initializer=die_with_parent,
                             initargs=(os.getpid(),)) as pool:  # fmt: skip
        yield from pool.map(_build_item, tasks, chunksize=chunk)


class _Tables:
    """Row accumulators for the four manifests, filled in item order."""

    def __init__(self) -> None:
        self.videos: list[dict] = []
        self.captions: list[dict] = []
        self.qa: list[dict] = []
        self.boxes: dict[str, list] = {name: [] for name in manifest.BOX_SCHEMA.names}

    def add(self, item: ItemResult) -> None:
        p = item.plan
        vid, split = p.video_id, p.split
        self.videos.append({"video_id": vid, "path": p.rel_path, "split": split, "media": p.media, "source": "synth"})
        self.captions += [
            {"video_id": vid, "caption_id": f"{vid}-c{j}", "caption": text, "split": split}
            for j, text in enumerate(item.captions)
        ]
        self.qa += [
            {"video_id": vid, "qa_id": f"{vid}-q{j}", "question": q, "answer": a, "answer_type": kind, "split": split}
            for j, (q, a, kind) in enumerate(item.qa)
        ]
        t, k = item.boxes.shape[:2]  # rows are frame-major: (frame 0, entity 0), (frame 0, entity 1), ...
        columns = {
            "video_id": [vid] * (t * k),
            "frame_index": np.repeat(np.arange(t), k).tolist(),
            "entity_id": list(range(k)) * t,
            "name": [e.name for e in p.entities] * t,
            "shape": [e.shape for e in p.entities] * t,
            "color": [e.color for e in p.entities] * t,
            "size": [e.size for e in p.entities] * t,
        }
        flat = item.boxes.reshape(t * k, 4)
        columns |= {col: flat[:, i].tolist() for i, col in enumerate(("x0", "y0", "x1", "y1"))}
        for col, values in columns.items():
            self.boxes[col] += values

    def write(self, out: str) -> None:
        """Write the manifests; videos.parquet last, so its presence means the dataset is complete."""
        manifest.write(out, manifest.CAPTIONS, manifest.from_rows(self.captions, CAPTION), CAPTION)
        manifest.write(out, manifest.QA, manifest.from_rows(self.qa, manifest.QA_SCHEMA), manifest.QA_SCHEMA)
        manifest.write(out, manifest.BOXES, pa.table(self.boxes, schema=BOX), BOX)
        manifest.write(out, manifest.VIDEOS, manifest.from_rows(self.videos, RAW_VIDEO), RAW_VIDEO)


def generate(out: str, cfg: SynthConfig) -> dict:
    """Write the synthetic world to ``out`` (local directory or ``s3://`` prefix).

    Media are rendered into a local temporary directory by ``cfg.workers`` processes and copied
    to ``out`` with :func:`vlp.storage.upload`; the manifests are written last, so a dataset
    directory with a ``videos.parquet`` is complete. Workers are *spawned* processes, so a plain
    script that calls this with ``workers > 1`` needs the usual ``if __name__ == "__main__":`` guard.

    Args:
        out: dataset directory or ``s3://bucket/prefix``.
        cfg: the synth section of the config.

    Returns:
        Counts: ``{"videos", "images", "captions", "qa", "boxes", "splits": {"train", "val", "test"}}``;
        ``splits`` counts clips and stills together.

    Raises:
        ValueError: a config value is out of range (the message names the key).
    """
    cfg.validate()
    tables = _Tables()
    with tempfile.TemporaryDirectory(prefix="vlp-synth-") as tmp_dir:
        tasks = _tasks(cfg, tmp_dir)
        bar = tqdm(total=len(tasks), desc="synth", unit="item", file=sys.stderr, disable=not sys.stderr.isatty())
        with bar:
            for item in _run(tasks, cfg.workers):
                storage.upload(item.local_path, storage.join(out, item.plan.rel_path))
                os.remove(item.local_path)
                tables.add(item)
                bar.update()
    tables.write(out)
    splits = {s: sum(row["split"] == s for row in tables.videos) for s in manifest.SPLITS}
    return {
        "videos": cfg.num_videos,
        "images": cfg.resolved_num_images(),
        "captions": len(tables.captions),
        "qa": len(tables.qa),
        "boxes": len(tables.boxes["video_id"]),
        "splits": splits,
    }
