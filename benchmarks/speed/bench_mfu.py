"""Benchmark: FLOPs, time and MFU (model FLOP utilisation) of one training step of each model family.

Rows: the ALPRO retrieval fine-tuning step (VTC + VTM, the losses ``AlproFamily.task_config`` keeps for retrieval
with the default ``retrieval`` section), the
ALPRO pre-training step (``--family alpro-pretrain``: VTC + PEM + MLM + VTM with a frozen prompter of the model's
sizes and a random bank of ``--entities`` entities; ``--mlm-logits masked`` scores MLM at the masked positions
alone), the ALBEF pre-training step (ITC with queue + MLM + ITM, momentum distillation) and the TS2-Net retrieval
step (symmetric InfoNCE over the frame scores). Models are built with random weights (``init=""``) at ``--preset
tiny`` or ``paper`` size (ALPRO: TimeSformer-B + BERT-base split 6 + 6; ALBEF: ViT-B/16 + BERT-base split 6 + 6;
TS2-Net: CLIP ViT-B/32) with the same sizes as ``bench_alpro_step.py``, ``bench_albef_step.py``
(``common.alpro_config``, ``common.albef_config``) and ``bench_ts2net_selection.py``; inputs are random frames and
captions from a small WordPiece vocabulary (no downloads, no dataset). At paper size the word embeddings have BERT's
30,522 rows, as the reference models do (ALPRO's retrieval step reads no FLOP from them, but AdamW updates them;
ALBEF's MLM head scores them).

For each row the script

* counts the FLOPs of one forward and of its backward with ``torch.utils.flop_counter.FlopCounterMode``
  (matmuls, convolutions and attention; element-wise ops and the optimizer are not counted), once per family in
  fp32, and splits the forward's by the counter's per-module totals into the family's top-level parts (video
  tower, text tower, fusion / cross encoder, heads, ...; "other" = outside those modules, e.g. the losses'
  similarity matrices). The backward is reported as one total: the counter's per-module backward totals overlap
  for these models (see ``count_flops``);
* times ``--steps`` steps (forward + loss, backward, AdamW) after ``--warmup`` untimed ones and reports the median
  (``torch.cuda.synchronize`` before reading the clock on CUDA); ``--precision bf16`` runs forward + loss under
  ``torch.autocast(device, dtype=torch.bfloat16)``;
* measures this machine's peak in the same run: ``--peak-size`` square matmuls in that precision (fp32, or bf16
  tensors), the best of ``--peak-repeat`` timings of one matmul on CPU, of 20 back-to-back ones on CUDA; once at the
  start (the header) and again right before and right after each row's timed steps, whose MFU takes the higher of
  those two (a shared machine's speed drifts over a run of several rows: a peak taken minutes away would not be
  the rate the row's steps could reach).

MFU here = (counted FLOPs per step / median step time) / that measured matmul peak: the share of the rate a large
dense GEMM reaches on this device, in this precision, that the whole step reaches. It is not the share of a
data-sheet peak. The peak's GEMM is torch's ``mm`` (in fp32 on the CPU: MKL in the x86 wheels).
The process keeps the memory it frees, as the training loop does (``--freed-memory keep``, ``vlp.host_memory``);
``release`` leaves glibc's defaults, under which the kernel maps in the pages of every large tensor afresh at every
step: the report gives the minor page faults of a timed step. Peak memory is ``torch.cuda.max_memory_allocated`` per
row on CUDA; on CPU it is the process's ``ru_maxrss`` (resident high-water mark), which only grows, so a row shows
the maximum over itself and every row before it in the same run. A family's steps are timed before its FLOPs are
counted, so that the counting pass does not set that mark.

    python benchmarks/speed/bench_mfu.py --preset tiny --steps 3 --warmup 1                  # CPU, seconds
    python benchmarks/speed/bench_mfu.py --preset paper --family alpro --steps 2 --warmup 1  # CPU, minutes
    python benchmarks/speed/bench_mfu.py --device cuda --preset paper --batch 32 --precision bf16 --steps 10  # GPU
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vlp.host_memory import FREED_MEMORY, apply_freed_memory
from vlp.models.family import PretrainBatch, StepContext, TextVocab
from vlp.models.tokenizer import train_wordpiece
from vlp.train.loop import compile_blocks, enable_grad_checkpointing
from vlp.train.optim import ADAMW_KERNELS, OptimConfig, build_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common

MOMENTUM_PARTS = ("visual", "vision_proj", "text", "text_proj", "fusion", "mlm_head")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Row:
    """One family's model, optimizer and step (forward + loss -> the loss tensor), and its module groups."""

    name: str
    model: nn.Module
    loss: Callable[[], torch.Tensor]
    groups: dict[str, list[str]]  # label -> module names as the flop counter reports them (root = class name)


def text_inputs(preset: str, batch: int, text_len: int, words: int) -> tuple[object, torch.Tensor, torch.Tensor]:
    """A WordPiece tokenizer trained on the benchmark captions, and ``batch`` encoded captions."""
    caps = common.captions(200, words)
    tok = train_wordpiece(caps, vocab_size=200 if preset == "tiny" else 30522, max_len=text_len)
    enc = tok([caps[i % 200] for i in range(batch)], padding="max_length", max_length=text_len, truncation=True,
              return_tensors="pt")  # fmt: skip
    return tok, enc["input_ids"], enc["attention_mask"]


def alpro_row(args: argparse.Namespace, device: torch.device) -> Row:
    from vlp.models.alpro.model import Alpro, AlproFamily, alpro_step
    from vlp.settings import RetrievalConfig

    tok, ids, mask = text_inputs(args.preset, args.batch, args.text_len, 8)
    # paper: bert-base-uncased's 30,522 word rows, as the reference has (AdamW updates them; no FLOP reads them)
    cfg = common.alpro_config(args.preset, args.frames, 1, len(tok) if args.preset == "tiny" else 30522)
    cfg = AlproFamily().task_config(cfg, "retrieval", RetrievalConfig())  # VTC + VTM, no PEM entities
    model = Alpro(cfg).to(device).train()
    size = cfg.video.img_size
    batch = PretrainBatch(torch.randn(args.batch, args.frames, 3, size, size, device=device), ids.to(device),
                          mask.to(device))  # fmt: skip
    ctx = StepContext(vocab=TextVocab.of(tok))
    groups = {
        "video tower": ["Alpro.dual.video", "Alpro.dual.video_proj"],
        "text tower": ["Alpro.dual.text", "Alpro.dual.text_proj"],
        "fusion": ["Alpro.fusion"],
        "heads": ["Alpro.vtm_head", "Alpro.mlm_head", "Alpro.pem_head"],
    }
    return Row(f"ALPRO retrieval ({'+'.join(cfg.losses)})", model, lambda: alpro_step(model, batch, ctx)["loss"],
               groups)  # fmt: skip


def alpro_pretrain_row(args: argparse.Namespace, device: torch.device) -> Row:
    from vlp.models.alpro.model import Alpro, DualEncoder, PemContext, alpro_step

    tok, ids, mask = text_inputs(args.preset, args.batch, args.text_len, 8)
    vocab = len(tok) if args.preset == "tiny" else 30522
    cfg = common.alpro_config(args.preset, args.frames, args.entities, vocab)
    cfg = replace(cfg, mlm_logits=args.mlm_logits)  # VTC + PEM + MLM + VTM
    model = Alpro(cfg).to(device).train()
    # PEM's frozen prompter (a dual encoder of the model's sizes; its forward is part of the step, its parameters
    # are not trained) and a random prompt bank of --entities unit vectors
    prompter = DualEncoder(cfg.video, cfg.text, embed_dim=cfg.embed_dim, init_temp=cfg.init_temp)
    prompter = prompter.to(device).eval().requires_grad_(False)
    bank = F.normalize(torch.randn(args.entities, cfg.embed_dim, device=device), dim=-1)
    size = cfg.video.img_size
    batch = PretrainBatch(torch.randn(args.batch, args.frames, 3, size, size, device=device), ids.to(device),
                          mask.to(device))  # fmt: skip
    ctx = StepContext(vocab=TextVocab.of(tok), extra=PemContext(prompter, bank),
                      generator=torch.Generator(device=device).manual_seed(0))  # fmt: skip
    groups = {
        "video tower": ["Alpro.dual.video", "Alpro.dual.video_proj"],
        "text tower": ["Alpro.dual.text", "Alpro.dual.text_proj"],
        "fusion": ["Alpro.fusion"],
        "heads": ["Alpro.vtm_head", "Alpro.mlm_head", "Alpro.pem_head"],
        # the step calls the prompter's video tower and projection, never the DualEncoder module itself: the counter
        # names them by their classes, as they are no part of Alpro
        "prompter (frozen)": ["TimeSformer", "Linear"],
    }
    mlm = "" if cfg.mlm_logits == "all" else f", MLM logits {cfg.mlm_logits}"
    return Row(f"ALPRO pre-training ({'+'.join(cfg.losses)}{mlm})", model,
               lambda: alpro_step(model, batch, ctx)["loss"], groups)  # fmt: skip


def albef_row(args: argparse.Namespace, device: torch.device) -> Row:
    from vlp.models.albef.model import Albef, albef_step

    if args.queue % args.batch:
        raise SystemExit(f"--queue {args.queue} must be a multiple of --batch {args.batch}")
    tok, ids, mask = text_inputs(args.preset, args.batch, args.text_len, 12)
    cfg = replace(common.albef_config(args.preset, 0, args.frames, len(tok), args.queue), mlm_logits=args.mlm_logits)
    model = Albef(cfg).to(device).train()
    size = cfg.video.img_size
    batch = PretrainBatch(torch.randn(args.batch, args.frames, 3, size, size, device=device), ids.to(device),
                          mask.to(device), video_index=torch.arange(args.batch, device=device))  # fmt: skip
    ctx = StepContext(vocab=TextVocab.of(tok), generator=torch.Generator(device=device).manual_seed(0))
    groups = {
        "video tower": ["Albef.online.visual", "Albef.online.vision_proj"],
        "text tower": ["Albef.online.text", "Albef.online.text_proj"],
        "cross encoder": ["Albef.online.fusion"],
        "heads": ["Albef.online.mlm_head", "Albef.itm_head"],
        # the step calls the momentum towers' parts, never the Towers module itself
        "momentum model": [f"Albef.momentum.{part}" for part in MOMENTUM_PARTS],
    }
    mlm = "" if cfg.mlm_logits == "all" else f", MLM logits {cfg.mlm_logits}"
    return Row(f"ALBEF pre-training ({'+'.join(cfg.losses)}{mlm})", model,
               lambda: albef_step(model, batch, ctx)["loss"], groups)  # fmt: skip


def ts2net_row(args: argparse.Namespace, device: torch.device) -> Row:
    from vlp.losses import frames as frame_losses
    from vlp.models.ts2net.model import ClipTextConfig, ClipVisionConfig, TS2Net, TS2NetConfig

    if args.preset == "tiny":
        cfg = TS2NetConfig.tiny(vocab_size=100)
        cfg = replace(cfg, video=replace(cfg.video, num_frames=args.frames))
    else:  # CLIP ViT-B/32 sizes, the selection's 500 draws (as bench_ts2net_selection.py)
        cfg = TS2NetConfig(ClipVisionConfig(num_frames=args.frames), ClipTextConfig())
    model = TS2Net(cfg).to(device).train()
    g = torch.Generator().manual_seed(1)
    text_len = min(args.text_len, cfg.text.max_len)
    ids = torch.randint(1, cfg.text.vocab_size, (args.batch, text_len), generator=g)
    size = cfg.video.img_size
    video = torch.randn(args.batch, args.frames, 3, size, size, generator=g)
    batch = PretrainBatch(video.to(device), ids.to(device), torch.ones_like(ids).to(device))
    ctx = StepContext(generator=torch.Generator(device=device).manual_seed(2))
    groups = {
        "video tower": ["TS2Net.clip.vision_model", "TS2Net.clip.visual_projection"],
        "text tower": ["TS2Net.clip.text_model", "TS2Net.clip.text_projection"],
        "token selector": ["TS2Net.selector"],
        "frame aggregator": ["TS2Net.aggregator"],
    }
    return Row(f"TS2-Net retrieval (select {cfg.select})", model,
               lambda: frame_losses.ts2net_losses(model(batch, ctx))["loss"], groups)  # fmt: skip


BUILDERS = {"alpro": alpro_row, "alpro-pretrain": alpro_pretrain_row, "albef": albef_row, "ts2net": ts2net_row}


def count_flops(row: Row) -> tuple[float, float, dict[str, float]]:
    """FLOPs of one step in fp32: (forward, backward, forward per group plus "other", outside every group).

    The forward and the backward are counted by two counters. Only the forward is split by module: the counter's
    module tracker attributes backward ops by hooks that misfire here (a module whose inputs need no gradient,
    such as a text tower fed token ids, stays "active" for the rest of the backward; one that returns a dataclass
    gets no backward hooks), so its per-module backward totals overlap and do not add up."""
    forward, backward = FlopCounterMode(display=False), FlopCounterMode(display=False)
    with forward:
        loss = row.loss()
    with backward:
        loss.backward()
    row.model.zero_grad(set_to_none=True)
    per_module = {name: float(sum(ops.values())) for name, ops in forward.get_flop_counts().items()}
    fwd = float(forward.get_total_flops())
    parts = {label: sum(per_module.get(n, 0.0) for n in names) for label, names in row.groups.items()}
    parts = {label: flops for label, flops in parts.items() if flops}
    parts["other"] = fwd - sum(parts.values())
    return fwd, float(backward.get_total_flops()), parts


def training_step(
    row: Row, device: torch.device, precision: str, adamw: str, phase: list[str] | None = None
) -> Callable[[], tuple[float, float]]:
    """One step as the training loop runs it, as a function returning its seconds and its AdamW update's: forward +
    loss (autocast for bf16), backward, AdamW (the loop's ``build_optimizer``, lr 1e-4, the default decay groups, the
    ``adamw`` kernels), then ``zero_grad`` (``set_to_none``, after the update, as ``vlp.train.loop`` does: no gradient
    is held through the next forward). ``phase``: a one-item list the step sets to ``forward``, ``backward``,
    ``update`` and ``idle`` as it goes (``--op-times``' groups)."""
    phase = [""] if phase is None else phase
    opt = build_optimizer(row.model, OptimConfig(lr=1e-4, adamw=adamw))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    def step() -> tuple[float, float]:
        common.sync(device)
        start = time.perf_counter()
        phase[0] = "forward"
        with autocast:
            loss = row.loss()
        phase[0] = "backward"
        loss.backward()
        common.sync(device)
        update = time.perf_counter()
        phase[0] = "update"
        opt.step()
        opt.zero_grad(set_to_none=True)
        common.sync(device)
        end = time.perf_counter()
        phase[0] = "idle"
        return end - start, end - update

    return step


def minor_faults() -> int:
    """The process's minor page faults so far (``ru_minflt``: pages the kernel mapped in, e.g. for blocks glibc took
    from it afresh; see ``--freed-memory``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_step(step: Callable[[], tuple[float, float]], steps: int, warmup: int) -> tuple[float, float, float, float]:
    """Median seconds of ``step`` (:func:`training_step`) over ``steps`` after ``warmup``, the median seconds of its
    AdamW update, the first warm-up step's seconds (with ``--compile``, it compiles the blocks) and the minor page
    faults per timed step."""
    first = [step()[0] for _ in range(warmup)]
    faults = minor_faults()
    timed = [step() for _ in range(steps)]
    faults = (minor_faults() - faults) / max(steps, 1)
    return statistics.median(t for t, _ in timed), statistics.median(u for _, u in timed), (first or [0.0])[0], faults


def profile_step(step: Callable[[], tuple[float, float]], device: torch.device, top: int) -> tuple[int, list[str]]:
    """The ``top`` ops of one more ``step`` (the timed steps' model and optimizer: a new optimizer's state would be
    new memory, whose pages the step would fault in) by their own time (``torch.profiler``, self CPU time on the CPU,
    self device time on CUDA), each with its share of the step's profiled op time and its call count; and the
    step's minor page faults."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    faults = minor_faults()
    with profile(activities=activities) as prof:
        step()
    faults = minor_faults() - faults
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr) > 0]
    total = sum(getattr(e, attr) for e in events)
    events.sort(key=lambda e: getattr(e, attr), reverse=True)
    return faults, [f"{e.key:<44} {getattr(e, attr) / 1e3:10.1f} ms {100 * getattr(e, attr) / total:5.1f}% "
                    f"{e.count:7d} calls" for e in events[:top]]  # fmt: skip


MATMULS = {"mm", "addmm", "bmm", "baddbmm"}
# --op-times' groups: what an op works on. The per-parameter ones cost the same at any batch
OP_GROUPS = ("matmuls", "attention kernels", "per parameter: optimizer step, zero_grad",
             "per parameter: in-place in the forward (EMA)", "per parameter: weight casts",
             "per parameter: gradient casts", "everything else")  # fmt: skip


def op_group(name: str, args: tuple, out: object, phase: str, params: set[int], shapes: set[tuple[int, ...]]) -> str:
    """The :data:`OP_GROUPS` entry of one aten op of a training step: the optimizer's phase whole; a matmul; torch's
    attention kernels; an in-place op on a parameter in the forward (ALBEF's and the QA decoders' momentum models'
    moving average); a cast of a parameter (autocast's bf16 copy of a weight); in the backward, a bf16 -> fp32 cast
    of a trainable parameter's shape (the weight's gradient back to the weight's dtype: by shape, so an activation's
    gradient of the same shape would count too); else everything else."""
    first = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if phase == "update":
        return OP_GROUPS[2]
    if name in MATMULS:
        return OP_GROUPS[0]
    if "scaled_dot_product" in name:
        return OP_GROUPS[1]
    if first is not None and first.data_ptr() in params:
        if name.endswith("_") and phase == "forward":
            return OP_GROUPS[3]
        if name == "_to_copy":
            return OP_GROUPS[4]
    from_bf16 = first is not None and first.dtype == torch.bfloat16
    to_fp32 = isinstance(out, torch.Tensor) and out.dtype == torch.float32
    if name == "_to_copy" and phase == "backward" and from_bf16 and to_fp32 and tuple(out.shape) in shapes:
        return OP_GROUPS[5]
    return OP_GROUPS[6]


def op_times_step(
    step: Callable[[], tuple[float, float]], top: int, model: torch.nn.Module, phase: list[str]
) -> tuple[float, float, int, list[str], list[str]]:
    """One more ``step`` (as :func:`profile_step`) with each aten op timed around its call (a ``TorchDispatchMode``;
    an op that another calls counts in the outer one's time, so the times add up to the op time of the step): the
    step's seconds, the ops' total seconds, its minor page faults, the ``top`` ops by time, each with its share of
    that total and its call count, and the time of each :data:`OP_GROUPS` entry (:func:`op_group`; ``phase`` is the
    list :func:`training_step` writes its phase into). CPU only (CUDA ops return before they run)."""
    from collections import defaultdict

    from torch.utils._python_dispatch import TorchDispatchMode

    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    groups: dict[str, float] = dict.fromkeys(OP_GROUPS, 0.0)
    params = {p.data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters() if p.requires_grad}

    class Timer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            took = time.perf_counter() - start
            name = func.__name__.split(".")[0]
            entry = totals[name]
            entry[0] += took
            entry[1] += 1
            groups[op_group(name, args, out, phase[0], params, shapes)] += took
            return out

    faults = minor_faults()
    with Timer():
        seconds, _ = step()
    faults = minor_faults() - faults
    total = sum(s for s, _ in totals.values())
    ranked = sorted(totals.items(), key=lambda kv: kv[1][0], reverse=True)[:top]
    top_lines = [f"{op:<44} {1e3 * s:10.1f} ms {100 * s / total:5.1f}% {int(n):7d} calls" for op, (s, n) in ranked]
    group_lines = [f"{group:<44} {1e3 * s:10.1f} ms {100 * s / total:5.1f}%" for group, s in groups.items()]
    return seconds, total, faults, top_lines, group_lines


def peak_flops(device: torch.device, precision: str, size: int, repeat: int, inner: int) -> float:
    """FLOP/s of ``size`` x ``size`` matmuls in ``precision``: the fastest of ``repeat`` timings of ``inner``
    back-to-back matmuls each (after one warm-up matmul)."""
    a = torch.randn(size, size, device=device, dtype=DTYPES[precision])
    b = torch.randn(size, size, device=device, dtype=DTYPES[precision])

    def matmul() -> None:
        torch.mm(a, b)

    best = float("inf")
    matmul()
    for _ in range(repeat):
        common.sync(device)
        start = time.perf_counter()
        for _ in range(inner):
            matmul()
        common.sync(device)
        best = min(best, (time.perf_counter() - start) / inner)
    return 2 * size**3 / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["all", *BUILDERS], default="all")
    parser.add_argument("--preset", choices=["tiny", "paper"], default="tiny")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--text-len", type=int, default=30, help="caption tokens (TS2-Net tiny: at most 24)")
    parser.add_argument("--queue", type=int, default=65536, help="ALBEF ITC queue size (paper: 65,536)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (the median is reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--precision", choices=["fp32", "bf16", "both"], default="both")
    parser.add_argument("--peak-size", type=int, default=4096, help="side of the square matmul timed for the peak")
    parser.add_argument("--peak-repeat", type=int, default=3, help="timings of the peak matmul (the best is kept)")
    parser.add_argument("--adamw", choices=list(ADAMW_KERNELS), default="foreach",
                        help="AdamW's kernels (a training section's adamw; default: its default)")  # fmt: skip
    parser.add_argument("--freed-memory", choices=list(FREED_MEMORY), default="keep",
                        help="what glibc does with freed memory (freed_memory; keep: the loop's default)")  # fmt: skip
    parser.add_argument("--grad-checkpointing", action="store_true",
                        help="recompute activations in the backward (grad_checkpointing)")  # fmt: skip
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile every transformer block (compile); needs --warmup >= 1")  # fmt: skip
    parser.add_argument("--mlm-logits", choices=["all", "masked"], default="all",
                        help="MLM's logits at every position or the masked ones' (mlm_logits)")  # fmt: skip
    parser.add_argument("--entities", type=int, default=1000, help="ALPRO pre-training's prompt bank (paper: 1,000)")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile one step per row and precision: its N costliest ops by their own time",
    )
    parser.add_argument(
        "--op-times",
        type=int,
        default=0,
        metavar="N",
        help="CPU: also time each aten op of one step around its call; print the N costliest",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.batch < 2:
        parser.error("--batch must be at least 2: ALPRO's VTM and ALBEF's ITM draw in-batch negatives")
    if args.compile and args.warmup < 1:
        parser.error("--compile needs --warmup >= 1: the first step compiles")
    device = torch.device(args.device)
    if args.op_times and device.type != "cpu":
        parser.error("--op-times times ops on the CPU (CUDA ops return before they run): use --profile there")
    kept = apply_freed_memory(args.freed_memory)  # before anything large is allocated, as the training loop
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    if device.type == "cpu" and "bf16" in precisions:
        from vlp.distributed import cpu_bf16_support

        fast, what = cpu_bf16_support()
        if not fast:  # several to hundreds of times slower than fp32 there: the run could print nothing for hours
            print(f"bf16 skipped: this CPU has {what}")
            precisions.remove("bf16")
            if not precisions:
                sys.exit(f"nothing to measure: --precision bf16 on a CPU with {what}; use --precision fp32")
    families = list(BUILDERS) if args.family == "all" else [args.family]
    inner = 20 if device.type == "cuda" else 1  # back-to-back matmuls per timing (a GPU's launches are short)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{args.preset} preset, batch {args.batch} x {args.frames} frames, {name}, torch {torch.__version__}")
    peaks = {p: peak_flops(device, p, args.peak_size, args.peak_repeat, inner) for p in precisions}
    for p, flops in peaks.items():
        print(f"peak ({args.peak_size}^2 matmul, best of {args.peak_repeat} x {inner}) {p}: {flops / 1e12:.3f} TFLOP/s")
    table, breakdowns, firsts, profiles, op_times = [], [], [], [], []
    for family in families:
        torch.manual_seed(0)
        row = BUILDERS[family](args, device)
        if args.grad_checkpointing:
            enable_grad_checkpointing(row.model)
        if args.compile:
            print(f"{row.name}: {compile_blocks(row.model, 'the benchmark')} blocks compiled", flush=True)
        timed = []  # timed before the FLOPs are counted, so that a CPU row's memory high-water mark is the step's
        for p in precisions:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            phase = ["idle"]
            step = training_step(row, device, p, args.adamw, phase)
            peak = peak_flops(device, p, args.peak_size, args.peak_repeat, inner)
            seconds, update, first, faults = time_step(step, args.steps, args.warmup)
            peak = max(peak, peak_flops(device, p, args.peak_size, args.peak_repeat, inner))
            timed.append((p, seconds, update, common.peak_memory_mib(device), peak))
            firsts.append(f"{row.name} {p}: first step {first:.2f} s, median {seconds:.2f} s, "
                          f"{faults:,.0f} minor page faults a timed step")  # fmt: skip
            if args.profile:  # after the timing, so that the profiler's own cost is in no timed step
                profile_faults, profile = profile_step(step, device, args.profile)
                profiles.append((f"{row.name} {p}", profile_faults, profile))
            if args.op_times:
                op_times.append((f"{row.name} {p}", *op_times_step(step, args.op_times, row.model, phase)))
            del step  # its optimizer's state
        # the FLOPs the model needs, not the recomputation: a checkpointed block's extra forward is not counted
        if args.grad_checkpointing:
            enable_grad_checkpointing(row.model, enable=False)
        with torch.compiler.set_stance("force_eager"):  # the counter sees the eager ops of a compiled block
            fwd, bwd, parts = count_flops(row)
        total = fwd + bwd
        params = sum(p.numel() for p in row.model.parameters() if p.requires_grad)
        breakdowns.append((row.name, fwd, bwd, parts, params))
        for p, seconds, update, memory, peak in timed:
            achieved = total / seconds
            table.append((row.name, p, total / 1e9, seconds * 1e3, update * 1e3, achieved / 1e12, peak / 1e12,
                          100 * achieved / peak, memory))  # fmt: skip
        del row
    memory = "max allocated" if device.type == "cuda" else "ru_maxrss so far"
    header = ("row", "precision", "GFLOP/step", "ms/step", "AdamW ms", "TFLOP/s", "peak TFLOP/s", "MFU %",
              f"MiB ({memory})")  # fmt: skip
    print(f"\nAdamW: {args.adamw} kernels; grad_checkpointing: {args.grad_checkpointing}; compile: {args.compile}; "
          f"freed_memory: {args.freed_memory}"
          f"{' (not glibc: its defaults)' if args.freed_memory == 'keep' and not kept else ''}")  # fmt: skip
    print(f"{header[0]:<36} {header[1]:>9} {header[2]:>11} {header[3]:>10} {header[4]:>9} {header[5]:>9} "
          f"{header[6]:>12} {header[7]:>6} {header[8]:>24}")  # fmt: skip
    for r in table:
        print(f"{r[0]:<36} {r[1]:>9} {r[2]:>11.2f} {r[3]:>10.1f} {r[4]:>9.1f} {r[5]:>9.4f} {r[6]:>12.3f} "
              f"{r[7]:>6.1f} {r[8]:>24.0f}")  # fmt: skip
    print("\nThe first warm-up step (with --compile, it compiles; the precision after it compiles again), and the "
          "timed steps' page faults:")  # fmt: skip
    for line in firsts:
        print(f"  {line}")
    for label, profile_faults, lines in profiles:
        print(f"\nProfile of one step, {label} ({profile_faults:,} minor page faults): op, own time, share of the "
              "step's op time, calls")  # fmt: skip
        for line in lines:
            print(f"  {line}")
    for label, seconds, total, op_faults, lines, group_lines in op_times:
        print(f"\nOp times of one step, {label} ({seconds:.2f} s; its ops {total:.2f} s; {op_faults:,} minor page "
              "faults): op, time around its calls, share of the ops' time, calls")  # fmt: skip
        for line in lines:
            print(f"  {line}")
        print(f"Op times of one step by what the op works on, {label}: group, time, share of the ops' time")
        for line in group_lines:
            print(f"  {line}")
    print("\nForward FLOPs by top-level module (flop counter, fp32; the backward is counted as one total):")
    for label, fwd, bwd, parts, params in breakdowns:
        print(f"  {label}: forward {fwd / 1e9:.3f} GFLOP, backward {bwd / 1e9:.3f} GFLOP ({bwd / fwd:.2f}x forward), "
              f"{params:,} trainable parameters")  # fmt: skip
        for part, flops in parts.items():
            print(f"    {part:<22} {flops / 1e9:10.3f} GFLOP  {100 * flops / fwd:5.1f}% of the forward")


if __name__ == "__main__":
    main()
