"""Benchmark: what TS2-Net's token selection costs (the perturbed top-k's 500 draws are not free).

One training step (forward, symmetric InfoNCE, backward, AdamW) of a TS2-Net at ViT-B/32 size (random weights:
the cost does not depend on them), with selection ([CLS] + top-3 patches by the perturbed top-k, 500 draws) and
without it ([CLS] alone per frame), each in its own process so that its peak resident memory is its own; the two
alternate ``--rounds`` times in one run and the script prints both, their ratio, and the selector's own forward +
backward time.

    python benchmarks/speed/bench_ts2net_selection.py                      # batch 8, 12 frames, CPU
    python benchmarks/speed/bench_ts2net_selection.py --one code --json    # one measurement (what the driver runs)

``--preset tiny`` measures the same way on the tiny TS2-Net (32 px frames, 2 + 2 layers of width 64: a smoke run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common


def build(select: str, frames: int, draws: int, preset: str = "paper") -> torch.nn.Module:
    from dataclasses import replace

    from vlp.models.ts2net.model import ClipTextConfig, ClipVisionConfig, TS2Net, TS2NetConfig

    if preset == "tiny":
        cfg = TS2NetConfig.tiny(vocab_size=100, select=select, select_draws=draws)
        cfg = replace(cfg, video=replace(cfg.video, num_frames=frames))
    else:  # ViT-B/32
        cfg = TS2NetConfig(ClipVisionConfig(num_frames=frames), ClipTextConfig(), select=select, select_draws=draws)
    return TS2Net(cfg).train()


def measure(args: argparse.Namespace) -> dict[str, float | str]:
    from vlp.losses import frames as frame_losses
    from vlp.models.family import PretrainBatch, StepContext

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build(args.one, args.frames, args.draws, args.preset)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 49000 if args.preset == "paper" else 100, (args.batch, args.text_len), generator=g)
    size = model.cfg.video.img_size  # 224 at ViT-B/32 size
    batch = PretrainBatch(torch.randn(args.batch, args.frames, 3, size, size, generator=g), ids,
                          torch.ones_like(ids))  # fmt: skip
    ctx = StepContext(generator=torch.Generator().manual_seed(2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        start = time.perf_counter()
        loss = frame_losses.ts2net_losses(model(batch, ctx))["loss"]  # what the family's train_step computes
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return time.perf_counter() - start

    step()  # warm-up
    times = [step() for _ in range(args.steps)]
    selector_s = float("nan")
    if model.selector is not None:  # the selector alone on the real frame tokens
        with torch.no_grad():
            tokens = model.frame_tokens(batch.video)
        tokens.requires_grad_(True)
        start = time.perf_counter()
        for _ in range(3):
            model.selector(tokens, ctx.generator).sum().backward()
        selector_s = (time.perf_counter() - start) / 3
    return {"select": args.one, "step_s": statistics.median(times), "step_s_min": min(times),
            "selector_fwd_bwd_s": selector_s, "peak_mib": common.peak_rss_mib(),
            "threads": torch.get_num_threads()}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--frames", type=int, default=12)
    p.add_argument("--text-len", type=int, default=32)
    p.add_argument("--draws", type=int, default=500)
    p.add_argument("--steps", type=int, default=2, help="timed steps per measurement (after one warm-up)")
    p.add_argument("--rounds", type=int, default=2, help="alternating measurements of each setting")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--one", choices=["code", "none"], default="", help="measure one setting in this process")
    p.add_argument("--json", action="store_true")
    p.add_argument("--preset", choices=["paper", "tiny"], default="paper", help="model size (tiny: a smoke run)")
    args = p.parse_args()
    if args.one:
        result = measure(args)
        print(json.dumps(result) if args.json else result)
        return
    runs: dict[str, list[dict]] = {"code": [], "none": []}
    for _ in range(args.rounds):
        for select in runs:
            cmd = [sys.executable, __file__, "--one", select, "--json", "--batch", str(args.batch), "--frames",
                   str(args.frames), "--text-len", str(args.text_len), "--draws", str(args.draws), "--steps",
                   str(args.steps), "--threads", str(args.threads), "--preset", args.preset]  # fmt: skip
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            runs[select].append(json.loads(out))
    med = {k: statistics.median(r["step_s"] for r in v) for k, v in runs.items()}
    mem = {k: max(r["peak_mib"] for r in v) for k, v in runs.items()}
    threads = runs["code"][0]["threads"]
    model, size = ("ViT-B/32", 224) if args.preset == "paper" else ("tiny", 32)
    print(f"TS2-Net {model}, batch {args.batch} x {args.frames} frames at {size} px, {args.text_len} text tokens, "
          f"CPU ({threads} threads), {args.rounds} alternating rounds x {args.steps} steps")  # fmt: skip
    for k, label in (("code", f"with selection ([CLS] + top-3, {args.draws} draws)"), ("none", "without ([CLS] only)")):
        print(f"  {label:44s} step {med[k]:7.2f} s (runs: {[round(r['step_s'], 2) for r in runs[k]]})  peak "
              f"{mem[k]:7.0f} MiB")  # fmt: skip
    sel = statistics.median(r["selector_fwd_bwd_s"] for r in runs["code"])
    print(f"  ratio with / without: time {med['code'] / med['none']:.3f}, peak memory {mem['code'] / mem['none']:.3f}; "
          f"the selector alone (forward + backward): {sel:.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
