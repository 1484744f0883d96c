"""Benchmark: one ALPRO pre-training step (VTC + PEM + MLM + VTM), clips/s and where the time goes.

Random-init models and random data (no hub, no dataset): the cost of a step does not depend on the
weights. Prints clips/s of the whole step (forward + backward + AdamW) and, timed separately with the
same inputs, the prompter forward (PEM pseudo-labels), the VTM hard-negative sampling, and one fusion
pass of the multimodal encoder.

    python benchmarks/speed/bench_alpro_step.py --preset tiny --batch 8           # CPU, seconds
    python benchmarks/speed/bench_alpro_step.py --preset paper --batch 32 --bf16  # GPU

With ``--dataset`` and ``--frames-dir`` (a `make data` output) it also times building one training batch
the way ``vlp pretrain`` does in its process: Parquet/JPEG frame reads, the ``rand`` sampler, RandAugment
and the resize to the model's size (``--img-size``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from vlp import losses
from vlp.models.alpro.model import Alpro, DualEncoder, PemContext, alpro_step
from vlp.models.family import PretrainBatch, StepContext, TextVocab
from vlp.models.tokenizer import train_wordpiece

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common


def timed(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    """Mean seconds of ``fn`` over ``repeat`` calls after one warm-up."""
    fn()
    common.sync(device)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    common.sync(device)
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=["tiny", "small", "paper"], default="tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--text-len", type=int, default=30)
    parser.add_argument("--entities", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA)")
    parser.add_argument("--img-size", type=int, default=0, help="frame side (default: the preset's)")
    parser.add_argument("--dataset", default="", help="ingested dataset, to time data loading too")
    parser.add_argument("--frames-dir", default="", help="extract-frames output, to time data loading too")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    captions = common.captions(200, 8)
    tok = train_wordpiece(captions, vocab_size=200 if args.preset == "tiny" else 30522, max_len=args.text_len)
    cfg = common.alpro_config(args.preset, args.frames, args.entities, len(tok))
    if args.img_size:
        cfg = replace(cfg, video=replace(cfg.video, img_size=args.img_size))
    model = Alpro(cfg).to(device)
    prompter = DualEncoder(cfg.video, cfg.text, embed_dim=cfg.embed_dim, init_temp=0.07).to(device).eval()
    bank = torch.nn.functional.normalize(torch.randn(args.entities, cfg.embed_dim, device=device), dim=-1)
    pem = PemContext(prompter.requires_grad_(False), bank)
    ctx = StepContext(vocab=TextVocab.of(tok), extra=pem)
    size = cfg.video.img_size
    enc = tok([captions[i % 200] for i in range(args.batch)], padding="max_length", max_length=args.text_len,
              truncation=True, return_tensors="pt")  # fmt: skip
    batch = PretrainBatch(
        torch.randn(args.batch, args.frames, 3, size, size, device=device),
        enc["input_ids"].to(device),
        enc["attention_mask"].to(device),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16 and device.type == "cuda")

    def step() -> None:
        with autocast:
            out = alpro_step(model, batch, ctx)
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        opt.step()

    def prompter_forward() -> None:
        with torch.no_grad(), autocast:
            prompter.encode_video(batch.video)

    def negatives() -> None:
        with torch.no_grad():
            sim = torch.randn(args.batch, args.batch, device=device)
            losses.sample_hard_negatives(sim, sim.t())

    with torch.no_grad(), autocast:
        video_tokens = model.dual.video(batch.video).tokens
        text_out = model.dual.text(batch.input_ids, batch.attention_mask)

    def fusion() -> None:
        with torch.no_grad(), autocast:
            model.fuse(text_out.tokens, text_out.attention_mask, video_tokens)

    load = None
    if args.dataset and args.frames_dir:
        from vlp.data.video_text import ClipRandAugment, VideoTextDataset, collate_video_text
        from vlp.models.family import randaug_ops

        data = VideoTextDataset(args.frames_dir, args.dataset, num_frames=args.frames, mode="rand",
                                augment=ClipRandAugment(randaug_ops("", "alpro")), size=size)  # fmt: skip
        order = iter(torch.randperm(len(data)).tolist() * 100)

        def load() -> None:
            collate_video_text([data[next(order)] for _ in range(args.batch)])

    step_s = timed(step, device, args.steps)
    parts = {
        "prompter forward (PEM)": timed(prompter_forward, device, args.steps),
        "VTM negative sampling": timed(negatives, device, args.steps),
        "one fusion pass (B pairs, no grad)": timed(fusion, device, args.steps),
    }
    parts["all fusion passes (3B VTM + B MLM pairs, fwd)"] = 4 * parts["one fusion pass (B pairs, no grad)"]
    if load is not None:
        parts["data loading (one batch, 1 process)"] = timed(load, torch.device("cpu"), args.steps)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{args.preset}: {params:.1f}M params, batch {args.batch} x {args.frames} frames at {size}px, {name}")
    print(f"full step (fwd+bwd+AdamW): {step_s * 1000:8.1f} ms   {args.batch / step_s:8.1f} clips/s")
    for label, seconds in parts.items():
        print(f"  {label:<36} {seconds * 1000:8.1f} ms  ({100 * seconds / step_s:4.1f}% of a step)")
    if device.type == "cuda":
        print(f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
