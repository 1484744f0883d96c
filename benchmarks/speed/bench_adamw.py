"""Benchmark: one AdamW update of a paper-size model's parameters with each of the ``adamw`` kernels.

The parameters are those of ALPRO at paper size (TimeSformer-B + BERT-base split 6 + 6, 30,522 word rows; random
weights, no download) or at tiny size, each with a random gradient. The update is the training loop's
(``vlp.train.optim.build_optimizer``: the default decay groups) with ``adamw`` = ``loop`` (one parameter at a time,
torch's CPU default), ``foreach`` (the config default) and ``fused``, alternated over ``--rounds`` rounds; each
cell is the median of ``--updates`` updates after one untimed one (which allocates the moments).

    .venv/bin/python benchmarks/speed/bench_adamw.py                  # paper size: about a minute on 2 cores
    .venv/bin/python benchmarks/speed/bench_adamw.py --preset tiny
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from vlp.models.alpro.model import Alpro
from vlp.train.optim import OptimConfig, build_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common

KERNELS = ("loop", "foreach", "fused")  # the adamw values (vlp.train.optim.ADAMW_KERNELS), loop first: the baseline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=["tiny", "paper"], default="paper")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the three kernels, alternated")
    parser.add_argument("--updates", type=int, default=4, help="timed updates per cell (the median is reported)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Alpro(common.alpro_config(args.preset, 4, 1, 30522 if args.preset == "paper" else 200))
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    print(f"ALPRO {args.preset}: {sum(p.numel() for p in params):,} parameters in {len(params)} tensors, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")  # fmt: skip
    seconds: dict[str, list[float]] = {k: [] for k in KERNELS}
    for _ in range(args.rounds):
        for kernel in KERNELS:
            opt = build_optimizer(model, OptimConfig(lr=1e-6, adamw=kernel))
            opt.step()
            timed = []
            for _ in range(args.updates):
                start = time.perf_counter()
                opt.step()
                timed.append(time.perf_counter() - start)
            seconds[kernel].append(statistics.median(timed))
            del opt
    print(f"\n{'adamw':<8} " + " ".join(f"{'round ' + str(r + 1) + ' ms':>12}" for r in range(args.rounds))
          + f" {'vs loop':>8}")  # fmt: skip
    base = statistics.median(seconds["loop"])
    for kernel in KERNELS:
        row = " ".join(f"{s * 1e3:>12.1f}" for s in seconds[kernel])
        print(f"{kernel:<8} {row} {base / statistics.median(seconds[kernel]):>7.2f}x")


if __name__ == "__main__":
    main()
