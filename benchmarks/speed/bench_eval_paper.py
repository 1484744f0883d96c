"""Benchmark: ALPRO's retrieval evaluation at paper size, encode and re-rank timed apart (issue 27).

What ``evaluate-retrieval`` runs, without its data loading: the paper-size ALPRO retrieval model (TimeSformer-B/16 at
224 px over ``--frames`` frames, BERT-base split 6 + 6, random weights, no download: ``common.alpro_config``, as
``bench_mfu.py`` builds it) in eval mode; ``--videos`` random clips with one caption each, every caption ``--text-len``
tokens; then the step's own functions: :func:`vlp.inference.encode_clips` and ``encode_texts`` (the encode
part), the family's ``similarity``, and for each ``k`` of ``--ks`` :func:`vlp.eval.retrieval.topk_rerank` with
:func:`vlp.inference.pair_scorer` (the re-rank part), which fuses the union of both directions' top-k pairs,
each pair once, ``--eval-batch`` pairs per forward, scored ``match_plus_sim`` (LAVIS's rule). ``--precision bf16``
sets ``retrieval.eval_precision=bf16``. Encoding is timed after one untimed pass, each k's re-ranking after one
untimed call (the reference's first ``compute_sim_matrix`` call is untimed too). ``--freed-memory keep`` has glibc
keep the memory the process frees, as the training loop does (the evaluation steps leave glibc's defaults:
the ``freed_memory`` in evaluation row of ``docs/results/speed.md``).

Output: one JSON line on stdout (encode seconds, and per k the re-rank seconds and the pairs fused), which
``bench_vs_reference.py --eval`` reads beside LAVIS's ``compute_sim_matrix`` on the same sizes
(``reference_step.py --eval-videos``). ``--preset tiny`` runs the same code on the tiny model (seconds: a smoke run).

    .venv/bin/python benchmarks/speed/bench_eval_paper.py --videos 16 --ks 16 4 --precision bf16 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from vlp.config import Config
from vlp.eval.retrieval import topk_rerank
from vlp.host_memory import FREED_MEMORY, apply_freed_memory
from vlp.inference import encode_clips, encode_texts, pair_scorer
from vlp.models import family
from vlp.models.alpro.model import Alpro, AlproFamily
from vlp.models.tokenizer import train_wordpiece
from vlp.settings import RetrievalConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int, default=16, help="clips, one caption each")
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--text-len", type=int, default=30, help="caption tokens, [CLS] and [SEP] included")
    parser.add_argument("--ks", type=int, nargs="+", default=[16, 4], help="candidates re-ranked per query")
    parser.add_argument("--eval-batch", type=int, default=32, help="retrieval.eval_batch_size")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", choices=["paper", "tiny"], default="paper", help="model size (tiny: a smoke run)")
    parser.add_argument("--freed-memory", choices=list(FREED_MEMORY), default="release",
                        help="what glibc does with freed memory (release: its defaults, as the step runs)")  # fmt: skip
    args = parser.parse_args()
    apply_freed_memory(args.freed_memory)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    n = args.videos
    texts = common.captions(n, args.text_len - 2)
    tok = train_wordpiece(common.captions(200, 8), vocab_size=30522, max_len=args.text_len)
    cfg = common.alpro_config(args.preset, args.frames, 1, 30522)  # bert-base-uncased's word rows, as LAVIS has
    cfg = AlproFamily().task_config(cfg, "retrieval", RetrievalConfig())
    model = Alpro(cfg).eval()
    fam = family.get("alpro")
    size = cfg.video.img_size
    clips = torch.randn(n, args.frames, 3, size, size, generator=torch.Generator().manual_seed(args.seed))
    data = SimpleNamespace(clip=lambda video_id, rng: clips[int(video_id)], seed=args.seed)
    retrieval = RetrievalConfig(num_workers=0, eval_batch_size=args.eval_batch, eval_precision=args.precision,
                                num_frames=args.frames, progress=False, score_rule="match_plus_sim")  # fmt: skip
    run_cfg = Config(retrieval=retrieval)

    def encode() -> tuple[Any, Any]:
        videos = encode_clips(fam, model, data, [str(i) for i in range(n)], args.eval_batch, run_cfg)
        return videos, encode_texts(fam, model, tok, texts, args.text_len, args.eval_batch, args.precision)

    encode()  # warm-up: the first forwards of a process pay for allocations and kernel set-up
    start = time.perf_counter()
    videos, encoded = encode()
    encode_s = time.perf_counter() - start
    lengths = encoded.mask.sum(1)
    print(f"[bench_eval_paper] encoded {n} clips and {n} captions ({int(lengths.min())}-{int(lengths.max())} "
          f"tokens) in {encode_s:.2f} s", file=sys.stderr, flush=True)  # fmt: skip
    sim = fam.similarity(model, encoded, videos)
    scorer = pair_scorer(fam, model, encoded, videos, args.precision)
    result: dict[str, object] = {"precision": args.precision, "videos": n, "encode_s": encode_s, "k": {}}
    for k in args.ks:
        topk_rerank(sim, k, scorer, args.eval_batch, rule="match_plus_sim")  # warm-up
        start = time.perf_counter()
        reranked = topk_rerank(sim, k, scorer, args.eval_batch, rule="match_plus_sim")
        seconds = time.perf_counter() - start
        result["k"][str(k)] = {"rerank_s": seconds, "fused_pairs": reranked.num_pairs}  # type: ignore[index]
        print(f"[bench_eval_paper] k {k}: {reranked.num_pairs} pairs fused in {seconds:.2f} s", file=sys.stderr)
    result["peak_rss_mib"] = common.peak_rss_mib()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
