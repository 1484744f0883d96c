"""Benchmark: the frozen ALPRO prompter's pseudo-labels, cheaper (``model.alpro.pem_prompter_size``,
``pem_prompter_precision``) against today's path: what they save and how often they name the same entity.

Two parts, each optional:

* **Agreement** (``--prompter``, ``--bank``, ``--dataset``, ``--frames``: a ``make pipeline-run`` output's
  ``pretrain-prompter``, ``build-prompt-bank``, ``ingest`` and ``extract-frames`` task folders). Every training clip
  of the world, ``--draws`` PEM boxes each (drawn as the pre-training step draws them, one seed), goes through
  :func:`vlp.models.alpro.model.prompter_features` once per variant; the table gives, against the default (fp32,
  the crop resized to the frame size), the share of boxes whose top-1 entity is the same, the share whose
  PEM keep decision (``pem_rule``, the paper's by default) is the same, and the mean total-variation distance of the
  pseudo-label distributions. Beside them: chance agreement of the top-1 (1 / M) and the majority baseline (the
  share of boxes whose default top-1 is the most common one: what a constant label would agree with).
* **Cost** (``--paper-cost``): a paper-size prompter (TimeSformer-B / 16 at 224 px, random weights: the cost does
  not depend on them) encodes ``--paper-batch`` crops of ``--frames-per-clip`` frames in each variant, the variants
  interleaved ``--rounds`` times; it prints the median seconds and the ratio to the default.

    .venv/bin/python benchmarks/speed/bench_prompter.py --run runs/pipeline-local/kfp/<run>  # agreement, tiny world
    .venv/bin/python benchmarks/speed/bench_prompter.py --paper-cost --rounds 3              # cost at paper size
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

from vlp import losses
from vlp.models.alpro.model import AlproConfig, DualEncoder, prompter_features
from vlp.models.layers.timesformer import TimeSformerConfig
from vlp.models.text import TextConfig

# (label, side as a share of the frame's, precision); the side is rounded down to a multiple of the patch size
VARIANTS = (
    ("default (fp32, frame size)", 1.0, "fp32"),
    ("bf16", 1.0, "bf16"),
    ("3/4 side (fp32)", 0.75, "fp32"),
    ("1/2 side (fp32)", 0.5, "fp32"),
    ("3/4 side, bf16", 0.75, "bf16"),
    ("1/2 side, bf16", 0.5, "bf16"),
)


def variant(cfg: AlproConfig, share: float, precision: str) -> AlproConfig:
    patch, side = cfg.video.patch_size, cfg.video.img_size
    size = 0 if share == 1.0 else max(patch, int(side * share) // patch * patch)
    return replace(cfg, pem_prompter_size=size, pem_prompter_precision=precision)


def find_task(run: Path, task: str) -> Path:
    """The one output folder of ``task`` under a kfp.local run folder."""
    found = sorted(p for p in run.glob(f"{task}/*") if p.is_dir())
    if not found:
        raise SystemExit(f"{run} has no {task} output: pass a `make pipeline-run` run folder (runs/.../kfp/<run>)")
    return found[0]


def agreement(args: argparse.Namespace) -> None:
    from vlp.data.video_text import VideoTextDataset
    from vlp.models.alpro.pretraining import load_prompter
    from vlp.models.alpro.prompts import PromptBank

    prompter, _, cfg = load_prompter(args.prompter)
    bank = PromptBank.load(args.bank)
    data = VideoTextDataset(args.frames, args.dataset, split="train", num_frames=cfg.video.num_frames, mode="uniform",
                            mean=cfg.pixel_mean, std=cfg.pixel_std, size=cfg.video.img_size)  # fmt: skip
    first = {}
    for i, (video_id, _) in enumerate(data.pairs):
        if data.media.get(video_id) == "video":
            first.setdefault(video_id, i)
    clips = [first[v] for v in sorted(first)][: args.clips or None]
    gen = torch.Generator().manual_seed(args.seed)
    grid, patch = cfg.video.img_size // cfg.video.patch_size, cfg.video.patch_size
    probs: dict[str, list[torch.Tensor]] = {label: [] for label, _, _ in VARIANTS}
    seconds: dict[str, float] = dict.fromkeys(probs, 0.0)
    for start in range(0, len(clips), args.batch):
        video = torch.stack([data[i]["video"] for i in clips[start : start + args.batch]])  # (B, T, 3, S, S)
        for _ in range(args.draws):
            boxes = losses.sample_pem_boxes(video.shape[0], grid, grid, patch_size=patch, area=cfg.pem_area,
                                            ratio=cfg.pem_ratio, generator=gen)  # fmt: skip
            for label, share, precision in VARIANTS:
                tick = time.perf_counter()
                feat = prompter_features(variant(cfg, share, precision), prompter, video, boxes.pixel_boxes)
                seconds[label] += time.perf_counter() - tick
                probs[label].append(losses.pseudo_labels(feat, bank.video, prompter.temperature()))
    table = {label: torch.cat(p) for label, p in probs.items()}
    base = table[VARIANTS[0][0]]
    top, keep = base.argmax(-1), losses.pem_keep_mask(base, rule=args.rule)
    m, n = base.shape[1], base.shape[0]
    majority = Counter(top.tolist()).most_common(1)[0][1] / n
    print(f"{n} boxes ({len(clips)} training clips x {args.draws} draws) from {args.frames}; prompter {args.prompter}; "
          f"{m} entities; frames {cfg.video.img_size} px, patch {patch}")  # fmt: skip
    print(f"default keeps {keep.float().mean():.3f} of the boxes (pem_rule={args.rule}); chance top-1 agreement "
          f"{1 / m:.4f}; majority baseline {majority:.3f}")  # fmt: skip
    print(f"{'variant':<28} {'size px':>8} {'top-1 same':>11} {'keep same':>10} {'mean TV':>9} {'prompter s':>11}")
    for label, share, precision in VARIANTS:
        p = table[label]
        size = variant(cfg, share, precision).pem_prompter_size or cfg.video.img_size
        same_top = (p.argmax(-1) == top).float().mean()
        same_keep = (losses.pem_keep_mask(p, rule=args.rule) == keep).float().mean()
        tv = 0.5 * (p - base).abs().sum(-1).mean()
        print(f"{label:<28} {size:>8} {same_top:>11.3f} {same_keep:>10.3f} {tv:>9.4f} {seconds[label]:>11.2f}")


def paper_cost(args: argparse.Namespace) -> None:
    video = TimeSformerConfig.paper(num_frames=args.frames_per_clip, init="")
    cfg = AlproConfig(video, TextConfig.paper(vocab_size=30522, init=""), num_entities=1000)
    torch.manual_seed(0)
    prompter = DualEncoder(cfg.video, cfg.text, embed_dim=cfg.embed_dim, init_temp=0.07).eval().requires_grad_(False)
    side, patch = cfg.video.img_size, cfg.video.patch_size
    clips = torch.randn(args.paper_batch, args.frames_per_clip, 3, side, side)
    boxes = losses.sample_pem_boxes(args.paper_batch, side // patch, side // patch, patch_size=patch,
                                    generator=torch.Generator().manual_seed(0)).pixel_boxes  # fmt: skip
    times: dict[str, list[float]] = {label: [] for label, _, _ in VARIANTS}
    for _label, share, precision in VARIANTS:  # an untimed pass each (first-call allocations, bf16 kernels)
        prompter_features(variant(cfg, share, precision), prompter, clips, boxes)
    for _ in range(args.rounds):
        for label, share, precision in VARIANTS:
            tick = time.perf_counter()
            prompter_features(variant(cfg, share, precision), prompter, clips, boxes)
            times[label].append(time.perf_counter() - tick)
    base = statistics.median(times[VARIANTS[0][0]])
    print(f"paper-size prompter (TimeSformer-B/16, {side} px), {args.paper_batch} clips x {args.frames_per_clip} "
          f"frames, CPU {torch.get_num_threads()} threads, median of {args.rounds} interleaved rounds")  # fmt: skip
    print(f"{'variant':<28} {'size px':>8} {'median s':>9} {'runs s':>24} {'/ default':>10}")
    for label, share, precision in VARIANTS:
        size = variant(cfg, share, precision).pem_prompter_size or side
        med = statistics.median(times[label])
        runs = ", ".join(f"{t:.2f}" for t in times[label])
        print(f"{label:<28} {size:>8} {med:>9.2f} {runs:>24} {med / base:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a kfp.local run folder: finds the four task outputs below in it")
    parser.add_argument("--prompter", help="pretrain-prompter output (model directory)")
    parser.add_argument("--bank", help="build-prompt-bank output")
    parser.add_argument("--dataset", help="ingest output")
    parser.add_argument("--frames", help="extract-frames output")
    parser.add_argument("--clips", type=int, default=0, help="training clips used (0 = all)")
    parser.add_argument("--draws", type=int, default=4, help="PEM boxes drawn per clip")
    parser.add_argument("--rule", choices=["paper", "official_code"], default="paper", help="pem_rule for 'keep'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=16, help="clips per prompter call (agreement)")
    parser.add_argument("--paper-batch", type=int, default=2, help="clips per prompter call (--paper-cost)")
    parser.add_argument("--paper-cost", action="store_true", help="time the variants at paper size")
    parser.add_argument("--frames-per-clip", type=int, default=4, help="frames a clip (paper pre-training: 4)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.run:
        for name, task in (("prompter", "pretrain-prompter"), ("bank", "build-prompt-bank"), ("dataset", "ingest"),
                           ("frames", "extract-frames")):  # fmt: skip
            if getattr(args, name) is None:
                setattr(args, name, str(find_task(args.run, task)))
    if args.prompter:
        agreement(args)
    if args.paper_cost:
        if args.prompter:
            print()
        paper_cost(args)
    if not (args.prompter or args.paper_cost):
        parser.error("give --run (or --prompter, --bank, --dataset, --frames), --paper-cost, or both")


if __name__ == "__main__":
    main()
