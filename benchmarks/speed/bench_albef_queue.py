"""Benchmark: ALBEF's ITC scores against its queues, the released code's cat against vlp's kept rows.

One step's queue work as ``albef_forward`` does it: build the ``(B + M, D)`` image and text matrices (the momentum
batch's features, then the queue's columns), score the student's and the teacher's features against them (four
matmuls), then enqueue the batch. ``cat`` builds the matrices with ``torch.cat([feat, queue.t()])`` at every step
(the released code); ``rows`` with :class:`vlp.models.albef.queue.QueueRows`, which keeps them. Alternated, median
of ``--repeat`` steps of each, in fp32 and in bf16 (bf16 features, fp32 queues, as under ``cpu_bf16``); every step
checks that the two give the same scores bit for bit.

    python benchmarks/speed/bench_albef_queue.py                      # the paper's queue: 65,536 x 256, batch 2
    python benchmarks/speed/bench_albef_queue.py --batch 64 --repeat 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor

from vlp.models.albef.queue import QueueRows


class Cat(QueueRows):
    def with_batch(self, queue: Tensor, feat: Tensor) -> Tensor:
        return torch.cat([feat, queue.t().to(feat)])


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
    args = parser.parse_args()
    if args.queue % args.batch:
        parser.error(f"--queue {args.queue} must be a multiple of --batch {args.batch} (ALBEF's own rule)")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"queue {args.queue:,} x {args.dim}, batch {args.batch}, {torch.get_num_threads()} threads")
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
