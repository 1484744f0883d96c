"""Benchmark: fp32 linear layers on the CPU, torch's BLAS (MKL in the x86 wheels) against oneDNN.

For each shape (the paper models' linears: rows x in -> out), the three matmuls of a layer's training step, each as
torch computes it and as ``cpu_linear: onednn`` does (:mod:`vlp.models.layers.linear`): the forward ``x @ W.t()``,
the input's gradient ``g @ W`` and the weight's gradient ``g.t() @ x``. Prints the GFLOP/s of each (the best of
``--repeat`` timings after one untimed, alternated) and each result's largest error against an fp64 product,
relative to that product's largest entry. ``vlp.models.layers.linear`` was written because of these figures.

    python benchmarks/speed/bench_linear.py                 # ~1 min on 2 cores
    python benchmarks/speed/bench_linear.py --repeat 10 --threads 1
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from vlp.models.layers.linear import onednn_available, onednn_matmul

# name, (rows, in, out): one paper-size step's linears
SHAPES = [
    ("large square (the fp32 peak's)", (4096, 4096, 4096)),
    ("TimeSformer MLP in (ALPRO, 2 clips x 4 frames x 197 tokens)", (1576, 768, 3072)),
    ("TimeSformer MLP out", (1576, 3072, 768)),
    ("ViT-B/16 qkv (ALBEF, 2 images)", (394, 768, 2304)),
    ("BERT attention output (ALBEF text, 2 x 30 tokens)", (60, 768, 768)),
    ("BERT fusion MLP in (ALPRO VTM, 6 pairs x 227 tokens)", (1362, 768, 3072)),
]


def best(fn: Callable[[], Tensor], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmuls(x: Tensor, w: Tensor, grad: Tensor) -> dict[str, tuple[Callable[[], Tensor], Callable[[], Tensor], Tensor]]:
    """A layer's three matmuls: torch's, oneDNN's (the kernel of ``OneDnnLinear``: ``a @ b.t()``), the fp64 product."""
    return {
        "forward": (lambda: F.linear(x, w), lambda: onednn_matmul(x, w), x.double() @ w.double().t()),
        "grad in": (lambda: grad @ w, lambda: onednn_matmul(grad, w.t()), grad.double() @ w.double()),
        "grad W": (lambda: grad.t() @ x, lambda: onednn_matmul(grad.t(), x.t()), grad.double().t() @ x.double()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timings of each (the best is kept)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every shape's sizes (a quick run)")
    args = parser.parse_args()
    if not onednn_available():
        raise SystemExit("this torch has no oneDNN (torch.backends.mkldnn): nothing to compare")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}")
    header = ["torch GF/s", "oneDNN GF/s", "ratio", "torch err", "oneDNN err"]
    print(f"{'linear':<62}{'matmul':<8}" + "".join(f"{h:>12}" for h in header))
    g = torch.Generator().manual_seed(0)
    for name, shape in SHAPES:
        m, k, n = (max(1, int(d * args.scale)) for d in shape)
        x, w, grad = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(m, n, generator=g)
        for matmul, (theirs, ours, exact) in matmuls(x, w, grad).items():
            t_torch, t_onednn = best(theirs, args.repeat), best(ours, args.repeat)
            errors = [float((got().double() - exact).abs().max() / exact.abs().max()) for got in (theirs, ours)]
            flops = 2 * m * k * n / 1e9
            cells = [f"{flops / t_torch:.0f}", f"{flops / t_onednn:.0f}", f"{t_onednn / t_torch:.2f}",
                     f"{errors[0]:.1e}", f"{errors[1]:.1e}"]  # fmt: skip
            print(f"{name if matmul == 'forward' else '':<62}{matmul:<8}" + "".join(f"{c:>12}" for c in cells))


if __name__ == "__main__":
    main()
