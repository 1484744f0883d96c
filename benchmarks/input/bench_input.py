"""Benchmark: can the training input path feed an accelerator? Bytes per clip, clips/s per worker, overlap.

Four measures, each printed as rows of one table with the command that gives them:

``bytes``    Bytes fetched from storage per clip read, divided by the clip's own bytes (its JPEGs), over a
             generated frame store of ``--shards`` shards (default 10,000) of tiny frames. *Before*: the
             layout vlp wrote until format 2 (a row group per shard, whole-shard reads into a 64-shard cache).
             *After*: a row group per clip, one ranged read per clip after its shard's footer (cached); read in
             a global random order and in the shard order of ``ShardOrderSampler`` with 1 and 4 readers (loader
             workers, each with its own cache). ``--root`` is a local directory or an ``s3://`` prefix (start the
             real S3 server with ``scripts/s3-server.sh start DIR`` and export what it prints).
``rate``     Clips/s of ``SamplerBatches`` with 0, 1, 2, ... loader workers building pre-training batches
             (4 frames at 224 px, ``rand`` sampler, temporally consistent RandAugment) and fine-tuning batches
             (8 frames), over a synthetic world extracted at 224 px.
``overlap``  Seconds per training update with batches from the loader against the same updates on batches built
             beforehand (a small CPU model whose update costs more than building its batch): with workers >= 1
             loading hides behind the update.
``gpu``      How many CPU cores feed one GPU: FLOPs of one ALPRO pre-training step at paper size (counted by
             ``torch.utils.flop_counter`` on this implementation, forward + backward, per clip), the clips/s an
             A100 / H100 gives at a stated model-FLOPs utilisation, and the cores that needs at the clips/s per
             worker of ``rate`` (``--preset tiny``: the same count on the tiny model, a smoke run).

    OMP_NUM_THREADS=1 python benchmarks/input/bench_input.py bytes --root /tmp/bench-input
    OMP_NUM_THREADS=1 python benchmarks/input/bench_input.py rate --workers 0 1 2
    OMP_NUM_THREADS=1 python benchmarks/input/bench_input.py overlap
    python benchmarks/input/bench_input.py gpu --clips-per-s-per-core 30
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vlp import storage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common

ROWS: list[tuple[str, str, str, str]] = []  # (measure, setting, figure, command)


def row(measure: str, setting: str, figure: str, command: str) -> None:
    ROWS.append((measure, setting, figure, command))
    print(f"{measure:<30} {setting:<52} {figure}", flush=True)


def print_table() -> None:
    print("\n| measure | setting | figure | command |\n|---|---|---|---|")
    for measure, setting, figure, command in ROWS:
        print(f"| {measure} | {setting} | {figure} | `{command}` |")


# --------------------------------------------------------------------------- 1. bytes per clip


def _jpeg_pool(size: int, count: int = 64) -> list[bytes]:
    """``count`` different JPEGs of ``size x size`` noise (JPEG at quality 90, as extract-frames writes)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def generate_store(root: str, shards: int, clips: int, frames: int, size: int) -> dict[str, int]:
    """Frame stores of ``shards`` shards of ``clips`` clips of ``frames`` tiny JPEGs under ``root/after`` (format 2,
    written by extract-frames' own shard writer) and ``root/before`` (the same rows, one row group per shard and
    an index without row groups, as vlp wrote before). Returns each clip's JPEG bytes by id."""
    import pyarrow.parquet as pq

    from vlp.data import frames as fr
    from vlp.data.frames import plan as fr_plan  # extract-frames' own shard plan and writer (private names)
    from vlp.data.frames import write as fr_write

    pool = _jpeg_pool(size)
    cfg = fr.FramesConfig(num_frames=frames, size=size)
    own: dict[str, int] = {}
    metas: dict[str, dict[str, Any]] = {}
    plans = []
    started = time.perf_counter()
    for s in range(shards):
        tasks, results = [], []
        for c in range(clips):
            video_id = f"clip{s:06d}{c:03d}"
            jpegs = [pool[(s * 7 + c * 3 + f) % len(pool)] for f in range(frames)]
            own[video_id] = sum(len(j) for j in jpegs)
            tasks.append(fr_plan._VideoTask(video_id, f"/media/{video_id}.mp4", "video", 300, 30.0))
            rows = [(f, f * 20, f * 20 / 30.0, size, size, j) for f, j in enumerate(jpegs)]
            results.append(fr_plan._VideoResult(video_id, rows=rows))
        plan = fr_plan._ShardPlan(s, f"{fr.SHARDS_DIR}/shard-{s:05d}-{s:08x}.parquet", tuple(tasks))
        plans.append(plan)
        metas[plan.name] = fr_write._write_shard(storage.join(root, "after"), plan, results, cfg)
        before = storage.read_parquet(storage.join(root, "after", plan.name))
        sink = io.BytesIO()
        pq.write_table(before, sink, compression={n: "zstd" for n in fr.FRAME_SCHEMA.names} | {"jpeg": "none"},
                       use_dictionary=["video_id"])  # fmt: skip
        storage.write_bytes(storage.join(root, "before", plan.name), sink.getvalue())
        if s % 1000 == 999:
            print(f"  generated {s + 1}/{shards} shards ({time.perf_counter() - started:.0f} s)", flush=True)
    index, _ = fr_write._collect(plans, storage.join(root, "after"), metas)
    names = [p.name for p in plans]
    meta = fr_write._index_meta(names)
    storage.write_parquet(storage.join(root, "after", fr.INDEX), index.replace_schema_metadata(meta))
    old = index.drop_columns(["row_group", "footer_bytes"])
    storage.write_parquet(storage.join(root, "before", fr.INDEX), old)
    storage.write_text(storage.join(root, "own.json"), json.dumps(own))
    return own


def _read(stores: list[Any], order: list[str], batch: int = 8) -> tuple[int, int]:
    """Read the clips of ``order`` (their JPEG rows), batch ``b`` by reader ``b % len(stores)``; returns the
    (bytes, requests) fetched from storage meanwhile."""
    storage.reset_read_stats()
    for b in range(0, len(order), batch):
        store = stores[(b // batch) % len(stores)]
        for video_id in order[b : b + batch]:
            store.rows(video_id, ["jpeg"])
    got = storage.read_stats()
    return got.bytes, got.requests


def bench_bytes(args: argparse.Namespace) -> None:
    from vlp.data.frames import FrameStore
    from vlp.data.loader import ShardOrderSampler

    root = args.root
    own_uri = storage.join(root, "own.json")
    if args.regenerate or not storage.exists(own_uri):
        print(f"generating {args.shards} shards x {args.clips} clips x {args.frames} frames of {args.size} px "
              f"under {root}", flush=True)  # fmt: skip
        own = generate_store(root, args.shards, args.clips, args.frames, args.size)
    else:
        own = json.loads(storage.read_text(own_uri))
    where = "S3 (" + (os.environ.get("AWS_ENDPOINT_URL") or "AWS") + ")" if storage.is_s3(root) else "local disk"
    command = f"bench_input.py bytes --root {root} --shards {args.shards} --clips {args.clips} --frames {args.frames}"
    ids = sorted(own)
    rng = np.random.default_rng(1)
    random_order = [ids[i] for i in rng.permutation(len(ids))[: args.draws]]
    shape = f"{args.shards} shards x {args.clips} clips x {args.frames} x {args.size}px JPEG, {args.draws} clips"

    def report(label: str, order: list[str], stores: list[Any]) -> None:
        fetched, requests = _read(stores, order)
        needed = sum(own[v] for v in order)
        figure = f"{fetched / needed:.2f}x the clips' bytes ({requests / len(order):.2f} requests/clip)"
        row(f"bytes per clip, {where}", f"{label}; {shape}", figure, command)

    report(
        "before: shard per read, 64-shard cache, random order",
        random_order,
        [FrameStore(storage.join(root, "before"), cache_shards=64)],
    )
    after = storage.join(root, "after")
    report("after: row group per clip, random order", random_order, [FrameStore(after)])
    store = FrameStore(after)
    shards = store.shard_of(ids)
    for readers in (1, 4):
        sampler = ShardOrderSampler(shards, seed=0, shuffle_buffer=args.shuffle_buffer, rank=0, world_size=1)
        order = [ids[i] for i in sampler.epoch_indices(0)[: args.draws]]
        report(f"after: shard order (buffer {args.shuffle_buffer}), {readers} reader(s)", order,
               [FrameStore(after) for _ in range(readers)])  # fmt: skip


# --------------------------------------------------------------------------- 2. clips/s per worker


def synthetic_world(root: Path, videos: int) -> tuple[str, str]:
    """The synthetic world (``videos`` clips of 16 frames at 224 px, and captions) ingested and extracted at 224 px
    under ``root``; built once and reused."""
    from vlp.config import load_config

    cfg = load_config(
        common.CONFIGS / "tiny.yaml",
        [f"synth.num_videos={videos}", "synth.num_images=0", "synth.size=224", "synth.min_fps=8",
         "synth.max_fps=8", "synth.min_duration_s=2.0", "synth.max_duration_s=2.0", "frames.size=224",
         "frames.num_frames=16", "frames.videos_per_shard=64", "synth.workers=2", "frames.workers=2"],
    )  # fmt: skip
    uris = common.build_world(str(root), cfg)
    return uris["dataset"], uris["frames"]


def _video_batches(dataset: str, frames: str, num_frames: int, batch: int, workers: int) -> Any:
    from vlp.data.loader import ResumableSampler, SamplerBatches
    from vlp.data.video_text import ClipRandAugment, VideoTextDataset, collate_video_text
    from vlp.models.family import randaug_ops

    data = VideoTextDataset(frames, dataset, split="train", num_frames=num_frames, mode="rand",
                            augment=ClipRandAugment(randaug_ops("", "alpro")), size=224)  # fmt: skip

    def fetch(indices: Any) -> Any:
        data.set_epoch(indices.epoch)
        return collate_video_text([data[i] for i in indices])["video"]

    return SamplerBatches(ResumableSampler(len(data), seed=0), fetch, batch, num_workers=workers, prefetch=2)


def _clips_per_s(batches: Any, count: int, warmup: int = 2) -> float:
    it = iter(batches)
    for _ in range(warmup):  # worker start-up and the first prefetch
        next(it)
    start, clips = time.perf_counter(), 0
    for _ in range(count):
        try:
            clips += len(next(it))
        except StopIteration:
            it = iter(batches)
            clips += len(next(it))
    seconds = time.perf_counter() - start
    batches.close()
    return clips / seconds


def clip_footprint(frames: str, clips_per_shard: int = 64, workers: int = 8) -> None:
    """What a 224 px clip costs to read, from the sizes of a real extract-frames output: its row group against its
    JPEGs, and its shard's footer per clip, turned into the cost per clip at WebVid scale (footers never cached in
    the global order; read once per worker per shard in the shard order)."""
    from vlp.data.frames import FRAME_SCHEMA, FrameStore

    store = FrameStore(frames)
    ids = store.video_ids
    shard = storage.join(frames, store.info(ids[0])["shard"])
    meta = storage.parquet_footer(shard).metadata
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    jpeg = FRAME_SCHEMA.get_field_index("jpeg")
    own = float(np.mean([g.column(jpeg).total_compressed_size for g in groups]))
    read = float(np.mean([sum(g.column(c).total_compressed_size for c in range(g.num_columns)) for g in groups]))
    footer = (meta.serialized_size + 8) / meta.num_row_groups
    command = "bench_input.py rate"
    row("bytes per clip at 224 px", f"16 frames, {len(ids)} clips of the synthetic world: JPEGs {own / 1e3:.0f} kB",
        f"row group {read / own:.3f}x the JPEGs, footer {footer:.0f} B per clip of its shard", command)  # fmt: skip
    row("bytes per clip at 224 px", f"computed: global order, {clips_per_shard}-clip shards, footer never cached",
        f"{(read + footer * clips_per_shard) / own:.2f}x the clip's bytes", command)  # fmt: skip
    row("bytes per clip at 224 px", f"computed: shard order, {workers} workers each reading each footer",
        f"{(read + footer * workers) / own:.3f}x the clip's bytes", command)  # fmt: skip


def bench_rate(args: argparse.Namespace) -> dict[int, float]:
    dataset, frames = synthetic_world(Path(args.world), args.videos)
    clip_footprint(frames)
    per_core = {}
    for num_frames, label in ((4, "pre-training 4 x 224, RandAugment"), (8, "fine-tuning 8 x 224, RandAugment")):
        rates: dict[int, float] = {}
        for workers in args.workers:
            rates[workers] = rate = _clips_per_s(
                _video_batches(dataset, frames, num_frames, args.batch, workers), args.batches
            )
            if workers == 0:
                figure = f"{rate:.1f} clips/s (on the training thread)"
            elif workers == 1 or 1 not in rates:
                ratio = f", {rate / rates[0]:.2f}x the training thread's" if 0 in rates else ""
                figure = f"{rate:.1f} clips/s{ratio}"
            else:
                figure = f"{rate:.1f} clips/s, {rate / (workers * rates[1]):.2f}x linear (of {workers} x 1 worker)"
            row("clips/s, loader workers", f"{label}, batch {args.batch}, {workers} worker(s)", figure,
                f"bench_input.py rate --workers {' '.join(map(str, args.workers))}")  # fmt: skip
        per_core[num_frames] = rates.get(1, rates.get(0, 0.0))
    return per_core


# --------------------------------------------------------------------------- 3. overlap


def bench_overlap(args: argparse.Namespace) -> None:
    import torch
    from torch import nn

    from vlp.train.loop import TrainConfig, train

    dataset, frames = synthetic_world(Path(args.world), args.videos)
    torch.manual_seed(0)

    def model() -> nn.Module:
        torch.manual_seed(0)  # a convolution stem: an update costs more than building its batch, few weights
        stem = [nn.Conv2d(3, 32, 7, stride=2, padding=3), nn.ReLU(), nn.Conv2d(32, 32, 3, stride=2, padding=1)]
        return nn.Sequential(*stem, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1))

    def step_fn(net: nn.Module, video: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": net(video.flatten(0, 1)).square().mean()}

    class Prebuilt:
        def __init__(self, batches: list[torch.Tensor]) -> None:
            self.batches = batches

        def __iter__(self) -> Any:
            return iter(self.batches)

    def seconds_per_update(data: Any) -> float:
        with tempfile.TemporaryDirectory() as out:
            cfg = TrainConfig(out_dir=out, max_steps=args.steps, log_every=5, progress=False)
            train(model(), step_fn, data, cfg)
            lines = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        rates = [x["train/clips_per_s"] for x in lines if "step" in x][1:]  # the first window holds the start-up
        return args.batch / float(np.mean(rates))

    source = _video_batches(dataset, frames, 4, args.batch, 0)
    prebuilt = Prebuilt([b for _, b in zip(range(args.steps), _cycle(source), strict=False)])
    base = seconds_per_update(prebuilt)
    command = f"bench_input.py overlap --steps {args.steps}"
    row("update time, overlap", f"batches built beforehand (batch {args.batch}, 4 x 224)", f"{base:.3f} s/update",
        command)  # fmt: skip
    for workers in args.workers:
        got = seconds_per_update(_video_batches(dataset, frames, 4, args.batch, workers))
        row("update time, overlap", f"batches from the loader, {workers} worker(s)",
            f"{got:.3f} s/update ({100 * (got / base - 1):+.1f}% against built beforehand)", command)  # fmt: skip


def _cycle(batches: Any) -> Any:
    while True:
        yield from batches


# --------------------------------------------------------------------------- 4. cores per GPU

# Dense bf16 tensor-core peaks from NVIDIA's data sheets (A100 SXM 80GB: 312 TFLOPS; H100 SXM: 989 TFLOPS).
GPU_PEAK_TFLOPS = {"A100 SXM (bf16 312 TFLOPS)": 312.0, "H100 SXM (bf16 989 TFLOPS)": 989.0}


def alpro_flops_per_clip(preset: str = "paper", num_frames: int = 4, batch: int = 2) -> float:
    """FLOPs of one ALPRO pre-training step (VTC + PEM + MLM + VTM, forward and backward) per clip at ``preset``
    size, counted by ``torch.utils.flop_counter`` on the CPU (random init; the count does not depend on the
    weights)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from vlp.models.alpro.model import Alpro, DualEncoder, PemContext, alpro_step
    from vlp.models.family import PretrainBatch, StepContext, TextVocab
    from vlp.models.tokenizer import train_wordpiece

    torch.manual_seed(0)
    captions = common.captions(200, 8)
    tok = train_wordpiece(captions, vocab_size=30522, max_len=30)
    cfg = common.alpro_config(preset, num_frames, 1000, len(tok))
    model = Alpro(cfg)
    prompter = DualEncoder(cfg.video, cfg.text, embed_dim=cfg.embed_dim, init_temp=0.07).eval().requires_grad_(False)
    bank = torch.nn.functional.normalize(torch.randn(1000, cfg.embed_dim), dim=-1)
    ctx = StepContext(vocab=TextVocab.of(tok), extra=PemContext(prompter, bank))
    enc = tok(captions[:batch], padding="max_length", max_length=30, truncation=True, return_tensors="pt")
    size = cfg.video.img_size  # 224 at paper size
    data = PretrainBatch(torch.randn(batch, num_frames, 3, size, size), enc["input_ids"], enc["attention_mask"])
    counter = FlopCounterMode(display=False)
    with counter:
        alpro_step(model, data, ctx)["loss"].backward()
    return counter.get_total_flops() / batch


def bench_gpu(args: argparse.Namespace, per_core: float) -> None:
    flops = alpro_flops_per_clip(args.preset)
    command = f"bench_input.py gpu --clips-per-s-per-core {per_core:.1f} --mfu {args.mfu}"
    size = "paper size, 4 x 224" if args.preset == "paper" else f"{args.preset} preset (not a GPU's load), 4 frames"
    row("ALPRO step FLOPs", f"{size}, fwd + bwd, per clip", f"{flops / 1e9:.0f} GFLOP", command)
    for gpu, peak in GPU_PEAK_TFLOPS.items():
        clips = peak * 1e12 * args.mfu / flops
        cores = clips / per_core
        row("cores to feed one GPU", f"{gpu} at {args.mfu:.0%} MFU: {clips:.0f} clips/s",
            f"{cores:.1f} cores at {per_core:.1f} clips/s per core", command)  # fmt: skip


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    b = sub.add_parser("bytes", help="bytes fetched per clip, before and after")
    b.add_argument("--root", required=True, help="local directory or s3:// prefix for the generated store")
    b.add_argument("--shards", type=int, default=10_000)
    b.add_argument("--clips", type=int, default=4, help="clips per shard")
    b.add_argument("--frames", type=int, default=16, help="frames per clip")
    b.add_argument("--size", type=int, default=16, help="frame side in pixels (tiny frames)")
    b.add_argument("--draws", type=int, default=2000, help="clips read per reader setting")
    b.add_argument("--shuffle-buffer", type=int, default=1024)
    b.add_argument("--regenerate", action="store_true")
    for name in ("rate", "overlap"):
        p = sub.add_parser(name)
        p.add_argument("--world", default=os.path.join(tempfile.gettempdir(), "vlp-bench-input-world"))
        p.add_argument("--videos", type=int, default=48)
        p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2] if name == "rate" else [0, 1])
        p.add_argument("--batch", type=int, default=8)
        p.add_argument("--batches", type=int, default=60)
        p.add_argument("--steps", type=int, default=25)
    g = sub.add_parser("gpu")
    g.add_argument("--clips-per-s-per-core", type=float, required=True, help="from `rate` with 1 worker")
    g.add_argument("--mfu", type=float, default=0.4, help="model-FLOPs utilisation assumed for the GPU")
    g.add_argument("--preset", choices=["paper", "tiny"], default="paper", help="model size (tiny: a smoke run)")
    args = parser.parse_args()
    handlers: dict[str, Callable[[], Any]] = {
        "bytes": lambda: bench_bytes(args),
        "rate": lambda: bench_rate(args),
        "overlap": lambda: bench_overlap(args),
        "gpu": lambda: bench_gpu(args, args.clips_per_s_per_core),
    }
    handlers[args.what]()
    print_table()


if __name__ == "__main__":
    main()
