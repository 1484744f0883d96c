"""Benchmark: vlp's training step beside the reference code's, same architecture, same batch, alternated.

For each family (``alpro``: LAVIS ``AlproRetrieval``; ``albef``: LAVIS ``AlbefPretrain``, one frame per clip as
its image batch) and precision, one round runs ``bench_mfu.py`` (vlp) and ``reference_step.py`` (LAVIS, in the
scratch venv ``scripts/reference-venv.sh`` builds) one after the other, each in its own process, the order swapped
every round; two PyTorch processes side by side on a small machine would slow each other several-fold. It prints
one table: each round's median step seconds of both, their ratio (vlp / reference: below 1, vlp is faster), the
FLOPs of one step as ``torch.utils.flop_counter`` counts them on each side, both sides' MFU (against the matmul
peak vlp's process measured in that round), vlp's AdamW seconds, and both processes' memory high-water marks over
their timed steps (``ru_maxrss``). ``--profile N`` adds each side's N costliest ops of one step.

``--eval N`` compares ALPRO's retrieval evaluation instead, over N random clips with a caption each:
``bench_eval_paper.py`` (vlp's encoders, ``topk_rerank`` over the union of both directions' top-k, each pair fused
once) against ``reference_step.py --eval-videos N`` (LAVIS's ``compute_sim_matrix``, each direction's top-k fused
apart), alternated the same way. One row per k: both sides' encode seconds, re-rank seconds and fused pairs, and the
ratio of the totals (encode + re-rank).

    scripts/reference-venv.sh                                          # once: ../scratch/lavis-venv
    .venv/bin/python benchmarks/speed/bench_vs_reference.py            # ALPRO, ALBEF; fp32, bf16; 2 rounds: ~30 min
    .venv/bin/python benchmarks/speed/bench_vs_reference.py --family albef --precision fp32 --rounds 1
    .venv/bin/python benchmarks/speed/bench_vs_reference.py --adamw fused --compile  # vlp's fastest switches
    .venv/bin/python benchmarks/speed/bench_vs_reference.py --adamw fused --rounds 1 --profile 5  # and the top ops
    .venv/bin/python benchmarks/speed/bench_vs_reference.py --reference-freed-memory keep  # LAVIS's allocator as vlp's
    .venv/bin/python benchmarks/speed/bench_vs_reference.py --eval 16 --ks 16 4      # evaluation at N = 16: ~15 min

vlp's process keeps the memory it frees, as its training loop does (``--freed-memory keep``, ``vlp.host_memory``);
the reference's runs with glibc's defaults, as LAVIS does, unless ``--reference-freed-memory keep`` (the same
``mallopt`` calls) asks for what the allocator setting alone is worth on its side.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
from common import ROOT

SPEED = "benchmarks/speed"  # this folder, as the commands below name it from the repo root
REFERENCE = {"alpro": ("alpro_retrieval", 4), "albef": ("albef_pretrain", 1)}  # LAVIS model, frames per clip
# a bench_mfu.py table row: name, precision, GFLOP/step, ms/step, AdamW ms, TFLOP/s, peak TFLOP/s, MFU %, MiB
NUMBER = r"\s+([\d.]+)"
ROW = re.compile(rf"^(ALPRO|ALBEF) .*\s(fp32|bf16){NUMBER * 7}$")


def run(command: list[str], threads: int) -> str:
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def vlp_step(family: str, precision: str, args: argparse.Namespace) -> dict:
    frames = REFERENCE[family][1]
    out = run([sys.executable, f"{SPEED}/bench_mfu.py", "--preset", "paper", "--family", family, "--precision",
               precision, "--frames", str(frames), "--batch", str(args.batch), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--adamw", args.adamw, *(["--compile"] if args.compile else []),
               "--freed-memory", args.freed_memory, "--profile", str(args.profile)],
              args.threads)  # fmt: skip
    if got := read_vlp(out):
        return got
    sys.exit(f"bench_mfu.py printed no row for {family} {precision}:\n{out}")


def read_vlp(out: str) -> dict | None:
    """bench_mfu.py's first ALPRO or ALBEF row (seconds, AdamW seconds, GFLOP, peak GFLOP/s, MFU, MiB) and the lines
    of its first profile (the indented lines under "Profile of one step", up to the next blank line); None without
    a row."""
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Profile of one step")), len(lines))
    profile = [line.strip() for line in itertools.takewhile(str.strip, lines[start + 1 :])]
    for line in lines:
        if m := ROW.match(line.strip()):
            return {"s": float(m[4]) / 1e3, "adamw_s": float(m[5]) / 1e3, "gflop": float(m[3]),
                    "peak": float(m[7]) * 1e3, "mfu": float(m[8]), "mib": float(m[9]), "profile": profile}  # fmt: skip
    return None


def reference_step(family: str, precision: str, args: argparse.Namespace) -> dict:
    model, frames = REFERENCE[family]
    out = run([str(args.reference_python), f"{SPEED}/reference_step.py", "--model", model, "--precision", precision,
               "--frames", str(frames), "--batch", str(args.batch), "--steps", str(args.steps), "--warmup",
               str(args.warmup), "--threads", str(args.threads), "--flops", "--profile", str(args.profile),
               "--freed-memory", args.reference_freed_memory], args.threads)  # fmt: skip
    got = json.loads(out.strip().splitlines()[-1])
    profile = [f"{p['op']:<44} {p['ms']:10.1f} ms {100 * p['share']:5.1f}% {p['calls']:7d} calls"
               for p in got.get("profile", [])]  # fmt: skip
    return {"s": got["step_s_median"], "mib": got["peak_rss_mib"], "gflop": got["step_gflop"], "profile": profile}


def vlp_eval(precision: str, args: argparse.Namespace) -> dict:
    out = run([sys.executable, f"{SPEED}/bench_eval_paper.py", "--videos", str(args.eval), "--precision", precision,
               "--ks", *map(str, args.ks), "--threads", str(args.threads)], args.threads)  # fmt: skip
    got = json.loads(out.strip().splitlines()[-1])
    return {k: (got["encode_s"], row["rerank_s"], row["fused_pairs"]) for k, row in got["k"].items()}


def reference_eval(precision: str, args: argparse.Namespace) -> dict:
    out = run([str(args.reference_python), f"{SPEED}/reference_step.py", "--model", "alpro_retrieval", "--precision",
               precision, "--eval-videos", str(args.eval), "--ks", *map(str, args.ks), "--threads",
               str(args.threads)], args.threads)  # fmt: skip
    got = json.loads(out.strip().splitlines()[-1])
    return {k: (row["encode_s"], row["rerank_s"], row["fused_pairs"]) for k, row in got["eval"].items()}


def compare_eval(precisions: list[str], args: argparse.Namespace) -> None:
    print(f"{'prec':<5} {'round':>5} {'k':>4} {'vlp enc s':>9} {'ref enc s':>9} {'vlp rr s':>8} {'ref rr s':>8} "
          f"{'vlp pairs':>9} {'ref pairs':>9} {'rr ratio':>8} {'ratio':>6}", flush=True)  # fmt: skip
    for precision in precisions:
        for r in range(args.rounds):
            if r % 2 == 0:
                vlp, ref = vlp_eval(precision, args), reference_eval(precision, args)
            else:
                ref, vlp = reference_eval(precision, args), vlp_eval(precision, args)
            for k in map(str, args.ks):
                (ve, vr, vp), (re_, rr, rp) = vlp[k], ref[k]
                print(f"{precision:<5} {r + 1:>5} {k:>4} {ve:>9.2f} {re_:>9.2f} {vr:>8.2f} {rr:>8.2f} {vp:>9} "
                      f"{rp:>9} {vr / rr:>8.2f} {(ve + vr) / (re_ + rr):>6.2f}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["all", *REFERENCE], default="all")
    parser.add_argument("--precision", choices=["both", "fp32", "bf16"], default="both")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per process (the median is reported)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed steps per process (after 1, the first timed one may grow the heap)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reference-python", type=Path, default=ROOT.parent / "scratch/lavis-venv/bin/python")
    parser.add_argument("--adamw", choices=["foreach", "fused", "loop"], default="foreach",
                        help="vlp's AdamW kernels (the paper-size configs set fused; the reference runs torch's "
                        "default)")  # fmt: skip
    parser.add_argument("--compile", action="store_true", help="vlp compiles its blocks (compile: true)")
    parser.add_argument("--freed-memory", choices=["keep", "release"], default="keep",
                        help="what glibc does with vlp's freed memory (freed_memory; keep: the default)")  # fmt: skip
    parser.add_argument("--reference-freed-memory", choices=["keep", "release"], default="release",
                        help="the reference's: release = glibc's defaults, as LAVIS runs; keep = as vlp's")  # fmt: skip
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="print each side's N costliest ops of one step (profiled after the timed steps)",
    )
    parser.add_argument("--eval", type=int, default=0, help="compare ALPRO's retrieval evaluation over N clips")
    parser.add_argument("--ks", type=int, nargs="+", default=[16, 4], help="--eval: candidates re-ranked per query")
    args = parser.parse_args()
    if not args.reference_python.exists():
        parser.error(f"{args.reference_python} is missing: build it with scripts/reference-venv.sh")
    if args.eval:
        compare_eval(["fp32", "bf16"] if args.precision == "both" else [args.precision], args)
        return
    families = list(REFERENCE) if args.family == "all" else [args.family]
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    print(f"vlp: adamw {args.adamw}, compile {args.compile}, freed_memory {args.freed_memory}; the reference: "
          f"torch's default AdamW, linears and dropout, eager, freed memory {args.reference_freed_memory}")  # fmt: skip
    print(
        "GFLOP: one step as torch.utils.flop_counter counts it on each side; both MFUs against the matmul peak "
        "vlp's process measured in the same round"
    )
    print(f"{'row':<8} {'prec':<5} {'round':>5} {'vlp s':>8} {'ref s':>8} {'ratio':>6} {'vlp GF':>7} {'ref GF':>7} "
          f"{'MFU %':>6} {'ref MFU':>7} {'AdamW s':>8} {'vlp MiB':>8} {'ref MiB':>8}", flush=True)  # fmt: skip
    profiles = []
    for family in families:
        for precision in precisions:
            for r in range(args.rounds):
                if r % 2 == 0:
                    vlp, ref = vlp_step(family, precision, args), reference_step(family, precision, args)
                else:
                    ref, vlp = reference_step(family, precision, args), vlp_step(family, precision, args)
                ref_mfu = 100 * ref["gflop"] / ref["s"] / vlp["peak"]
                print(f"{family:<8} {precision:<5} {r + 1:>5} {vlp['s']:>8.2f} {ref['s']:>8.2f} "
                      f"{vlp['s'] / ref['s']:>6.2f} {vlp['gflop']:>7.0f} {ref['gflop']:>7.0f} {vlp['mfu']:>6.1f} "
                      f"{ref_mfu:>7.1f} {vlp['adamw_s']:>8.2f} {vlp['mib']:>8.0f} {ref['mib']:>8.0f}",
                      flush=True)  # fmt: skip
                profiles.append((f"{family} {precision} round {r + 1}", vlp["profile"], ref["profile"]))
    for label, *sides in profiles if args.profile else []:
        for side, lines in zip(("vlp", "reference"), sides, strict=True):
            print(f"\n{label}, {side}: op, own CPU time, share of the step's op time, calls")
            for line in lines:
                print(f"  {line}")


if __name__ == "__main__":
    main()
