"""Benchmark: one ALBEF pre-training step (ITC + MLM + ITM with momentum distillation), time and peak memory.

Random-init models and random data (no hub, no dataset): the cost of a step does not depend on the weights.
A step is what ``vlp pretrain --model albef`` does per batch: the online forward (ITC against batch + queue,
MLM with the teacher's distribution, ITM on sampled hard negatives), the momentum (EMA) update and enqueue,
backward and AdamW. Prints the median of ``--steps`` timed steps after ``--warmup`` untimed ones, and the
process's peak resident memory (CPU) or peak allocated GPU memory.

    python benchmarks/speed/bench_albef_step.py --preset tiny --batch 8                       # CPU, seconds
    python benchmarks/speed/bench_albef_step.py --preset paper --batch 2 --img-size 224       # CPU, paper size
    python benchmarks/speed/bench_albef_step.py --preset paper --batch 64 --img-size 256 --bf16  # GPU

``--json`` prints one JSON line instead (for a driver that compares it with another implementation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from vlp.models.albef.model import Albef, albef_step
from vlp.models.family import PretrainBatch, StepContext, TextVocab
from vlp.models.tokenizer import train_wordpiece

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=["tiny", "paper"], default="tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--frames", type=int, default=1, help="frames per clip (ALBEF: one image)")
    parser.add_argument("--img-size", type=int, default=0, help="image side (default: tiny 32, paper 224)")
    parser.add_argument("--text-len", type=int, default=30, help="caption tokens (the released code caps at 30)")
    parser.add_argument("--queue", type=int, default=65536, help="ITC queue size M (paper: 65,536)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.queue % args.batch:
        parser.error(f"--queue {args.queue} must be a multiple of --batch {args.batch}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    captions = common.captions(200, 12)
    tok = train_wordpiece(captions, vocab_size=200 if args.preset == "tiny" else 30522, max_len=args.text_len)
    cfg = common.albef_config(args.preset, args.img_size, args.frames, len(tok), args.queue)
    model = Albef(cfg).to(device).train()
    enc = tok([captions[i % 200] for i in range(args.batch)], padding="max_length", max_length=args.text_len,
              truncation=True, return_tensors="pt")  # fmt: skip
    size = cfg.video.img_size
    batch = PretrainBatch(
        torch.randn(args.batch, args.frames, 3, size, size, device=device),
        enc["input_ids"].to(device),
        enc["attention_mask"].to(device),
        video_index=torch.arange(args.batch, device=device),
    )
    ctx = StepContext(vocab=TextVocab.of(tok), generator=torch.Generator(device=device).manual_seed(0))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.02)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16 and device.type == "cuda")

    def step() -> float:
        start = time.perf_counter()
        with autocast:
            out = albef_step(model, batch, ctx)
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        opt.step()
        common.sync(device)
        return time.perf_counter() - start

    for _ in range(args.warmup):
        step()
    times = [step() for _ in range(args.steps)]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6
    result = {
        "impl": "vlp",
        "preset": args.preset,
        "batch": args.batch,
        "img_size": size,
        "queue": args.queue,
        "trainable_params_m": round(trainable, 1),
        "step_s_median": statistics.median(times),
        "step_s_min": min(times),
        "step_s_max": max(times),
        "peak_mib": round(common.peak_memory_mib(device)),
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "CPU",
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"ALBEF {args.preset}: {trainable:.1f}M trainable params, batch {args.batch} x {args.frames} frame(s) at "
          f"{size}px, queue {args.queue}, {result['device']} ({result['threads']} threads)")  # fmt: skip
    print(f"full step (fwd + EMA + enqueue + bwd + AdamW): median {result['step_s_median'] * 1000:.0f} ms "
          f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}) over {args.steps} steps")  # fmt: skip
    print(f"peak memory {result['peak_mib']} MiB ({'allocated' if device.type == 'cuda' else 'resident'})")


if __name__ == "__main__":
    main()
