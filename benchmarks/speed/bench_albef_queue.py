"""Benchmark: ALBEF's ITC scores against its queues, the released code's cat against vlp's kept rows.

One step's queue work as ``albef_forward`` does it: build the ``(B + M, D)`` image and text matrices (the momentum
batch's features, then the queue's columns), score the student's and the teacher's features against them (four
matmuls), then enqueue the batch. ``cat`` builds the matrices with ``torch.cat([feat, queue.t()])`` at every step
(the released code); ``rows`` with :class:`vlp.models.albef.queue.QueueRows`, which keeps them. Alternated, median
of ``--repeat`` steps of each, in fp32 and in bf16 (bf16 features, fp32 queues, as under ``cpu_bf16``); every step
checks that the two give the same scores bit for bit.

``--step`` times whole training steps instead: an ALBEF pre-training step as ``bench_mfu.py`` times it (one
model, paper size unless ``--preset tiny``, 1 frame, fused AdamW), the queue read through the cat or through the
kept rows in alternate steps (the enqueue always through the rows, so that they never need a rebuild), and prints
the median of each and of the pairwise ratios.

    python benchmarks/speed/bench_albef_queue.py                      # the paper's queue: 65,536 x 256, batch 2
    python benchmarks/speed/bench_albef_queue.py --batch 64 --repeat 20
    python benchmarks/speed/bench_albef_queue.py --step --repeat 12   # ~4 min on 2 cores
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from vlp.models.albef.queue import QueueRows

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common


class Cat(QueueRows):
    """The released code's read; writes go to ``rows`` where given (they then stay in step with the queue)."""

    def __init__(self, rows: QueueRows | None = None) -> None:
        super().__init__()
        self.rows = rows

    def with_batch(self, queue: Tensor, feat: Tensor) -> Tensor:
        return torch.cat([feat, queue.t().to(feat)])

    def write(self, queue: Tensor, ptr: int, feat: Tensor) -> None:
        (self.rows or super()).write(queue, ptr, feat)


def albef_step(preset: str, batch: int, queue: int) -> tuple[torch.nn.Module, Callable[[str], float]]:
    """An ALBEF pre-training model (1 frame) and one training step of it as ``bench_mfu.py`` times it: forward + loss
    (bf16 autocast for ``"bf16"``), backward, fused AdamW, ``zero_grad``; returns the step's seconds."""
    from vlp.models.albef.model import Albef, albef_step
    from vlp.models.family import PretrainBatch, StepContext, TextVocab
    from vlp.models.tokenizer import train_wordpiece
    from vlp.train.optim import OptimConfig, build_optimizer

    caps = common.captions(200, 12)
    tok = train_wordpiece(caps, vocab_size=200 if preset == "tiny" else 30522, max_len=30)
    enc = tok(caps[:batch], padding="max_length", max_length=30, truncation=True, return_tensors="pt")
    model = Albef(common.albef_config(preset, 0, 1, len(tok), queue)).train()
    size = model.cfg.video.img_size
    inputs = PretrainBatch(torch.randn(batch, 1, 3, size, size), enc["input_ids"], enc["attention_mask"],
                           video_index=torch.arange(batch))  # fmt: skip
    ctx = StepContext(vocab=TextVocab.of(tok), generator=torch.Generator().manual_seed(0))
    opt = build_optimizer(model, OptimConfig(lr=1e-4, adamw="fused"))

    def step(precision: str) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = albef_step(model, inputs, ctx)["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    return model, step


def time_steps(args: argparse.Namespace) -> None:
    """ALBEF training steps, the queue read through the cat and through the rows in turn."""
    model, step = albef_step(args.preset, args.batch, args.queue)
    rows = {name: QueueRows() for name in ("image_queue", "text_queue")}
    sides = {"cat": {name: Cat(r) for name, r in rows.items()}, "rows": rows}
    print(f"{'precision':<10}{'cat s':>8}{'rows s':>8}{'ratio':>7}  pairwise ratio: median, min, max  rebuilds")
    for precision in ("fp32", "bf16"):
        times: dict[str, list[float]] = {"cat": [], "rows": []}
        for i in range(args.repeat + 1):
            for name in ("cat", "rows") if i % 2 else ("rows", "cat"):
                model.queue_rows = sides[name]
                seconds = step(precision)
                if i:
                    times[name].append(seconds)
        cat, kept = (statistics.median(times[k]) for k in ("cat", "rows"))
        pairs = [r / c for r, c in zip(times["rows"], times["cat"], strict=True)]
        spread = f"{statistics.median(pairs):.3f}, {min(pairs):.3f}, {max(pairs):.3f}"
        print(f"{precision:<10}{cat:>8.3f}{kept:>8.3f}{kept / cat:>7.3f}  {spread:<34}{rows['text_queue'].rebuilds:>8}")


def step(rows: dict[str, QueueRows], queues: dict[str, Tensor], feats: list[Tensor], ptr: int) -> list[Tensor]:
    """The scores of one step (student and teacher, both directions), then the enqueue at ``ptr``."""
    image, text, image_m, text_m = feats
    image_all = rows["image"].with_batch(queues["image"], image_m)
    text_all = rows["text"].with_batch(queues["text"], text_m)
    scores = [image @ text_all.t(), text @ image_all.t(), image_m @ text_all.t(), text_m @ image_all.t()]
    rows["image"].write(queues["image"], ptr, image_m.float())
    rows["text"].write(queues["text"], ptr, text_m.float())
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, default=65536, help="queue size M (the paper's 65,536)")
    parser.add_argument("--dim", type=int, default=256, help="embedding width D")
    parser.add_argument("--batch", type=int, default=2, help="global batch B (each step enqueues B)")
    parser.add_argument("--repeat", type=int, default=9, help="timed steps of each (after one untimed)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--step", action="store_true", help="time ALBEF training steps (module docstring)")
    parser.add_argument("--preset", choices=["tiny", "paper"], default="paper", help="--step: the model's size")
    args = parser.parse_args()
    if args.queue % args.batch:
        parser.error(f"--queue {args.queue} must be a multiple of --batch {args.batch} (ALBEF's own rule)")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"queue {args.queue:,} x {args.dim}, batch {args.batch}, {torch.get_num_threads()} threads")
    if args.step:
        return time_steps(args)
    print(f"{'precision':<10}{'cat ms':>10}{'rows ms':>10}{'ratio':>8}  same scores")
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        queues = {k: F.normalize(torch.randn(args.dim, args.queue, generator=g), dim=0) for k in ("image", "text")}
        sides = {name: ({k: kind() for k in queues}, {k: q.clone() for k, q in queues.items()})
                 for name, kind in (("cat", Cat), ("rows", QueueRows))}  # fmt: skip
        times: dict[str, list[float]] = {"cat": [], "rows": []}
        same, ptr = True, 0
        for i in range(args.repeat + 1):
            feats = [F.normalize(torch.randn(args.batch, args.dim, generator=g), dim=1).to(dtype) for _ in range(4)]
            out = {}
            for name in ("cat", "rows") if i % 2 else ("rows", "cat"):
                start = time.perf_counter()
                out[name] = step(*sides[name], feats, ptr)
                if i:
                    times[name].append(time.perf_counter() - start)
            same &= all(torch.equal(a, b) for a, b in zip(out["cat"], out["rows"], strict=True))
            ptr = (ptr + args.batch) % args.queue
        cat, rows = (statistics.median(times[k]) * 1e3 for k in ("cat", "rows"))
        print(f"{str(dtype).removeprefix('torch.'):<10}{cat:>10.2f}{rows:>10.2f}{rows / cat:>8.2f}  {same}")


if __name__ == "__main__":
    main()
