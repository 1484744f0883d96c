"""``vlp index``: encode the clips of a frames store (or of one split of a dataset) that an index lacks, and add
them (see :mod:`vlp.index` for what a row holds)."""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace
from functools import partial
from typing import Any

from vlp.config import Config, check_sampled_frames
from vlp.data.frames import FrameStore
from vlp.distributed import device
from vlp.index.store import ClipIndex, IndexInfo, check_compatible, fingerprint, sampling
from vlp.inference import StoreClips, encode_clips, retrieval_kinds, thumbnail
from vlp.inputs import ModelInput, StepInputError, check_inputs
from vlp.models.directory import ModelDir
from vlp.steps.common import StepResult, run_step
from vlp.steps.finetune import retrieval_data

log = logging.getLogger("vlp")
CHUNK = 512  # clips encoded and added at a time: an interrupted run keeps every chunk it added
# What LanceDB warns when a process that has used it forks (the loader workers). Its at-fork hook resets its runtime
# in the child, and the risk it names (a lock held mid-operation at fork time) does not arise here: every LanceDB
# call is synchronous and has returned before the loader forks, and the workers only read frames.
FORKED = "lancedb fork support is experimental"


def clip_source(cfg: Config, store: FrameStore, model_cfg: Any, dataset: str, split: str) -> tuple[Any, list[str]]:
    """``(clip reader, sorted clip ids)``: the clips of ``split`` of ``dataset`` as ``evaluate-retrieval`` reads them
    (:func:`vlp.steps.finetune.retrieval_data`), or, without a dataset, every clip of ``store``."""
    if not dataset:
        clips = StoreClips(store, sampling(cfg.retrieval), model_cfg)
        return clips, [video_id for video_id, _ in clips.pairs]
    data = retrieval_data(cfg, dataset, store, model_cfg, split, training=False)
    return data, sorted({video_id for video_id, _ in data.pairs})


def ann_update(index: ClipIndex, total: int, rebuild_share: float) -> str:
    """Bring the ANN index of ``index`` (``total`` rows) up to date: ``"built"`` when there was none or the rows it
    does not cover are at least ``rebuild_share`` of the table, ``"extended"`` when there are fewer (added to it as
    it is: :meth:`ClipIndex.extend_ann`), ``"current"`` when it covers every row."""
    if not index.has_ann():
        index.build_ann()
        log.info("index: built the ANN index over %d clips", total)
        return "built"
    new = index.unindexed_rows()
    if new == 0:
        return "current"
    if new >= rebuild_share * total:
        index.build_ann()
        log.info("index: built the ANN index again over %d clips (%d of them new: index.ann_rebuild_share %g)",
                 total, new, rebuild_share)  # fmt: skip
        return "built"
    index.extend_ann()
    log.info("index: added %d clips to the ANN index (%d clips)", new, total)
    return "extended"


def index_clips(model: str, frames: str, out: str, cfg: Config, dataset: str = "", split: str = "") -> StepResult:
    """Add to the index ``out`` (made if missing) the clips of ``frames`` it lacks, encoded by ``model`` as
    ``evaluate-retrieval`` encodes them; with ``dataset``, only the clips of its ``split`` (default
    ``retrieval.split``). From ``index.ann_min_rows`` rows on, the index has an ANN index too, kept up to date by
    :func:`ann_update` (the summary's ``ann_index`` says what it did).

    Raises:
        StepInputError: an input is missing, or ``split`` is given without ``dataset``.
        ValueError: ``out`` holds an index of another model, other frames or another sampling.
    """

    work = partial(_index_clips, model, frames, out, cfg, dataset, split)
    return run_step("index", out, cfg, "index", work)


def _index_clips(model: str, frames: str, out: str, cfg: Config, dataset: str, split: str) -> StepResult:
    if split and not dataset:
        raise StepInputError(f"--split {split} picks the clips of a dataset's split: pass --dataset too")
    check_sampled_frames(cfg, "retrieval")
    chosen = split or cfg.retrieval.split
    setting = "--split" if split else "retrieval.split"
    models = [ModelInput("--model", model, retrieval_kinds)]
    inputs = check_inputs(dataset, frames, split=chosen, setting=setting, models=models)
    info, store = inputs.models[0], inputs.store
    fp, sample = fingerprint(info), sampling(cfg.retrieval)
    index = ClipIndex.open(out) if ClipIndex.exists(out) else None
    if index is not None:  # before anything is loaded: a wrong model fails at once
        check_compatible(index.info, model, fp, frames, sample, out)
    data, wanted = clip_source(cfg, store, info.config, dataset, chosen)
    have = index.video_ids() if index is not None else set()
    todo = [video_id for video_id in wanted if video_id not in have]
    log.info("index: %d clips to add, %d of %d already in %s", len(todo), len(wanted) - len(todo), len(wanted), out)
    added = 0
    if todo:
        made = IndexInfo(model, fp, frames, 0, [], False, sample)  # its width and token shape: from the first chunk
        index, added = add_clips(index, out, made, cfg, info, data, store, todo)
    total = index.count() if index is not None else 0
    ann = total >= cfg.index.ann_min_rows
    done = ann_update(index, total, cfg.index.ann_rebuild_share) if index is not None and ann else None
    return {
        "index": out, "model": model, "frames": frames, "dataset": dataset or None,
        "split": chosen if dataset else None, "added": added, "skipped": len(wanted) - added,
        "total": total, "tokens_stored": index.info.tokens_stored if index is not None else None, "ann": ann,
        "ann_index": done,
    }  # fmt: skip


def add_clips(
    index: ClipIndex | None,
    out: str,
    made: IndexInfo,
    cfg: Config,
    info: ModelDir,
    data: Any,
    store: FrameStore,
    todo: list[str],
) -> tuple[ClipIndex, int]:
    """Encode the clips ``todo`` with the model ``info`` names, :data:`CHUNK` at a time, and add each chunk to
    ``index`` (created at ``out`` from ``made`` with the first chunk's shapes when None); returns the index and the
    rows added. An interrupted run keeps every chunk it added."""
    net, fam, added = info.load(device()), info.family, 0
    for start in range(0, len(todo), CHUNK):
        ids = todo[start : start + CHUNK]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", FORKED, RuntimeWarning)
            enc = encode_clips(fam, net, data, ids, cfg.retrieval.eval_batch_size, cfg)
        if index is None:
            shape = list(enc.tokens.shape[1:])
            stored = shape[0] * shape[1] <= cfg.index.max_token_floats
            index = ClipIndex.create(out, replace(made, dim=int(enc.feat.shape[1]), token_shape=shape,
                                                  tokens_stored=stored))  # fmt: skip
            check_compatible(index.info, made.model, made.fingerprint, made.frames, made.sampling, out)  # a rival's?
        added += index.add(ids, enc.feat.numpy(), enc.tokens.numpy(), [thumbnail(store, v) for v in ids])
        log.info("index: encoded %d of %d clips", min(start + CHUNK, len(todo)), len(todo))
    assert index is not None  # todo is not empty
    return index, added
