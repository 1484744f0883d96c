"""Benchmark: attention's forward + backward at the paper models' shapes, torch's kernel against explicit matmuls.

For each shape, in fp32 and in bf16 (bf16 leaf tensors under CPU autocast, as ``cpu_bf16`` runs them), it times
``F.scaled_dot_product_attention`` (the kernel torch picks: flash on the CPU, math where dropout is on) and
:func:`vlp.models.layers.attention.attend`'s explicit path (two matmuls and a softmax), alternated, and prints the
median of ``--repeat`` forward + backward passes of each and their ratio. ``vlp.models.layers.attention.attend`` takes
the explicit path for bf16 on the CPU because of these figures.

    python benchmarks/speed/bench_attention.py                 # ~1 min on 2 cores
    python benchmarks/speed/bench_attention.py --repeat 20 --precision bf16
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

from vlp.models.layers.attention import attend

# name, (batch, heads, queries, head dim), keys, boolean key mask, dropout: the attentions of one paper-size step
SHAPES = [
    ("TimeSformer space (ALPRO, 2 clips x 4 frames)", (8, 12, 197, 64), 197, False, 0.0),
    ("TimeSformer time (2 clips x 196 patches)", (392, 12, 4, 64), 4, False, 0.0),
    ("ViT-B/16 (ALBEF, 2 images)", (2, 12, 197, 64), 197, False, 0.0),
    ("BERT fusion, training (ALPRO VTM: 6 pairs)", (6, 12, 227, 64), 227, True, 0.1),
    ("BERT fusion, evaluation", (6, 12, 227, 64), 227, True, 0.0),
    ("BERT cross-attention, training (ALBEF)", (6, 12, 30, 64), 197, True, 0.1),
    ("CLIP ViT-B/32 (TS2-Net, 2 clips x 4 frames)", (8, 12, 50, 64), 50, False, 0.0),
]


def attention(kind: str, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float) -> Tensor:
    """One attention forward, under bf16 autocast where the inputs are bf16."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=q.dtype == torch.bfloat16):
        return attend(q, k, v, mask, dropout, explicit=kind == "explicit")


def timed(fn: Callable[[], Tensor], grad: Tensor) -> float:
    start = time.perf_counter()
    fn().backward(grad)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9, help="timed passes of each (after one untimed)")
    parser.add_argument("--precision", choices=["fp32", "bf16", "both"], default="both")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    if "bf16" in precisions:
        from vlp.distributed import cpu_bf16_support

        fast, what = cpu_bf16_support()
        if not fast:  # several to hundreds of times slower than fp32 there
            print(f"bf16 skipped: this CPU has {what}")
            precisions.remove("bf16")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU {torch.backends.cpu.get_cpu_capability()}"
    )
    print(f"{'shape':<46} {'prec':<5} {'sdpa ms':>8} {'explicit ms':>11} {'explicit / sdpa':>15}")
    g = torch.Generator().manual_seed(0)
    for name, shape, keys, masked, dropout in SHAPES:
        for precision in precisions:
            dtype = torch.bfloat16 if precision == "bf16" else torch.float32
            kv_shape = (*shape[:2], keys, shape[3])
            q = torch.randn(shape, generator=g).to(dtype).requires_grad_()
            k, v = (torch.randn(kv_shape, generator=g).to(dtype).requires_grad_() for _ in range(2))
            grad = torch.randn(shape, generator=g).to(dtype)
            mask = torch.ones(shape[0], 1, 1, keys, dtype=torch.bool) if masked else None
            if mask is not None:
                mask[0, ..., keys // 2 :] = False  # the first row's second half is padding

            sdpa = functools.partial(attention, "sdpa", q, k, v, mask, dropout)
            explicit = functools.partial(attention, "explicit", q, k, v, mask, dropout)
            timed(sdpa, grad), timed(explicit, grad)  # untimed: first-call allocations
            times: dict[str, list[float]] = {"sdpa": [], "explicit": []}
            for _ in range(args.repeat):
                times["sdpa"].append(timed(sdpa, grad))
                times["explicit"].append(timed(explicit, grad))
            s, e = (statistics.median(times[key]) * 1e3 for key in ("sdpa", "explicit"))
            print(f"{name:<46} {precision:<5} {s:>8.2f} {e:>11.2f} {e / s:>15.2f}", flush=True)


if __name__ == "__main__":
    main()
