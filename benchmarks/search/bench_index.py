"""Benchmark: the clip index (:class:`vlp.index.store.ClipIndex`) at scale, exact scan against ANN (issue 26).

Run (``--help`` for every knob)::

    python benchmarks/search/bench_index.py                       # 100,000 clips, dim 256, 200 queries
    python benchmarks/search/bench_index.py --rows 2000           # a smoke run (seconds)
    python benchmarks/search/bench_index.py --dim 512 --out runs/bench-index

The clips are synthetic embeddings, not encoded video: ``--clusters`` Gaussian clusters around random unit
centres, each point ``centre + spread * g / sqrt(dim)`` (``g`` standard normal) L2-normalised, so two points of one
cluster have a dot product near ``1 / (1 + spread^2)`` and points of different clusters near 0. The queries are
noisy copies (``--query-noise``, same form) of ``--queries`` points drawn like the others but held out of the index.
Ground truth is numpy's exact top-k by dot product over every row.

Everything goes through ``ClipIndex``: :meth:`ClipIndex.create` with an :class:`IndexInfo` (tokens not stored),
:meth:`ClipIndex.add` in chunks of ``--chunk`` (512, as ``vlp index`` adds) with a constant ``--thumb-bytes``
thumbnail, :meth:`ClipIndex.build_ann`, and :meth:`ClipIndex.nearest` for the first stage, asked for
``n = max(k, candidates)`` rows as ``vlp search`` asks. The add rate excludes encoding (there is none here) and the
making of the embeddings; it includes building the Arrow batches inside ``add`` and LanceDB's writes.

Printed: the add rate and ``build_ann`` time; the index directory's size before and after the ANN index; whether
the exact scan's top-k is numpy's; then per first-stage variant the latency p50 / p99 (ms) and recall@k and
recall@n against numpy. The variants are the exact scan (``nearest`` told the index has no ANN index, so it skips the
``list_indices`` call that ``has_ann`` makes on every ``nearest``), ``nearest`` with the ANN index as store.py sets
it up, and a sweep of LanceDB's query knobs (``nprobes``, ``ef``,
``refine_factor``), each varied alone around store.py's defaults (``--grid``: every combination); a sweep row
builds the same query as ``nearest`` with the knob added (checked equal to ``nearest`` at store.py's defaults on
the first 50 queries).
After ``--warmup`` queries per variant, the variants are timed interleaved, query by query in rotated order,
``--repeats`` times over all queries: p50 and p99 are per pass and shown as min/median/max over the passes; "vs
exact" is the median over passes of exact p50 / variant p50. The goals (issue 26): p50 < 50 ms and recall@10 >= 0.95
at 100k rows. Below 10,000 rows (a smoke run) there is one timed pass and no knob sweep unless values are given.
Peak RSS is the process's (``getrusage``), the embeddings and ground truth included.

``--threads`` (default 1) sets ``OMP_NUM_THREADS``, ``LANCE_CPU_THREADS`` (Lance's compute pool) and
``RAYON_NUM_THREADS`` before LanceDB loads; 0 leaves the environment as it is. Lance's I/O pool is left alone.
``--grow G`` then adds G more rows drawn like the others (``vlp index`` adding clips to a grown collection), copies
the index, and brings the ANN index up to date both ways: :meth:`ClipIndex.extend_ann` (what ``vlp index`` does
while the new rows stay under ``index.ann_rebuild_share`` of the table) and :meth:`ClipIndex.build_ann`; printed:
each one's time, and p50 / p99 / recall of the exact scan and of each through ``nearest`` against numpy over every
row (one pass).
If ``faiss`` is importable, the same queries also go through a faiss ``IndexFlatIP`` and ``IndexHNSWFlat``
(inner product) for comparison; else that part is skipped and the script says so.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common

K, CANDIDATES = 10, 50  # vlp search's default -k and index.candidates
NPROBES, EFS, REFINES = [5, 10, 20, 40], [250, 500, 1000], [0, 1, 2, 10]
SMOKE = 10_000  # below this many rows (a smoke run): one timed pass, and no knob sweep unless one is given
TIE = 1e-5  # numpy's k-th and (k+1)-th dot closer than this: the exact scan may order them either way
Query = Callable[[np.ndarray, int], list[int]]  # (query vector, n) -> row numbers, best first


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000, help="clips in the index")
    p.add_argument("--dim", type=int, default=256, help="vector size (ALPRO/ALBEF 256, TS2-Net 512)")
    p.add_argument("--queries", type=int, default=200, help="queries (held-out points, noised)")
    p.add_argument("--out", default=None, help="index directory, kept (default: a temporary one, deleted after)")
    p.add_argument("--clusters", type=int, default=1000, help="Gaussian clusters of the embeddings")
    p.add_argument("--spread", type=float, default=1.0, help="cluster noise relative to its unit centre")
    p.add_argument("--query-noise", type=float, default=0.5, help="noise added to a held-out point for its query")
    p.add_argument("-k", type=int, default=K, help="k of recall@k (vlp search's -k)")
    p.add_argument("--candidates", type=int, default=CANDIDATES, help="index.candidates: n = max(k, candidates)")
    p.add_argument("--chunk", type=int, default=512, help="rows per ClipIndex.add (vlp index adds 512 at a time)")
    p.add_argument("--thumb-bytes", type=int, default=512, help="size of the constant thumbnail of every row")
    knob = f"values to sweep (default %s; none below {SMOKE} rows)"
    p.add_argument("--nprobes", type=int, nargs="*", default=None, help="nprobes " + knob % NPROBES)
    too_small = "; LanceDB needs ef >= n * refine_factor: smaller ones are dropped"
    p.add_argument("--ef", type=int, nargs="*", default=None, help="HNSW ef " + knob % EFS + too_small)
    p.add_argument("--refine", type=int, nargs="*", default=None, help="refine_factor (0: none) " + knob % REFINES)
    p.add_argument("--grid", action="store_true", help="sweep every nprobes x ef x refine combination")
    p.add_argument("--warmup", type=int, default=20, help="untimed queries per variant first")
    p.add_argument("--repeats", type=int, default=None, help=f"timed passes (default 3; 1 below {SMOKE} rows)")
    p.add_argument("--threads", type=int, default=1, help="OMP / Lance CPU / rayon threads (0: leave the env)")
    p.add_argument("--no-faiss", action="store_true", help="skip the faiss comparison even if faiss is importable")
    grow = "then add this many more rows and compare extending the ANN index with building it again"
    p.add_argument("--grow", type=int, default=0, help=grow)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def normalise(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def embeddings(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows (N + grow, dim), queries (Q, dim), the clusters of the first N rows then of each query's source
    point)``, float32, unit length."""
    rng = np.random.default_rng(args.seed)
    d, total = args.dim, args.rows + args.grow + args.queries
    centres = normalise(rng.standard_normal((args.clusters, d), dtype=np.float32))
    labels = rng.integers(args.clusters, size=total)
    noise = rng.standard_normal((total, d), dtype=np.float32) * np.float32(args.spread / math.sqrt(d))
    points = normalise(centres[labels] + noise).astype(np.float32)
    held = points[args.rows + args.grow :]
    jitter = rng.standard_normal(held.shape, dtype=np.float32) * np.float32(args.query_noise / math.sqrt(d))
    rows = np.ascontiguousarray(points[: args.rows + args.grow])
    queries = normalise(held + jitter).astype(np.float32)
    return rows, queries, np.concatenate([labels[: args.rows], labels[-len(held) :]])  # the queries' labels last


def exact_topn(rows: np.ndarray, queries: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy's ``(indices (Q, n+1), dots (Q, n+1))`` of the largest dot products, best first (one past ``n`` to
    see ties)."""
    scores = queries @ rows.T  # (Q, N)
    m = min(n + 1, rows.shape[0])
    part = np.argpartition(-scores, m - 1, axis=1)[:, :m]
    dots = np.take_along_axis(scores, part, axis=1)
    order = np.argsort(-dots, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(dots, order, axis=1)


def dir_mib(path: str) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 2**20


def row_ids(ids: list[str]) -> list[int]:
    return [int(v[1:]) for v in ids]


def ann_query(index: Any, nprobes: int, ef: int, refine: int) -> Query:
    """The query ``ClipIndex.nearest`` makes on an index with an ANN index (``has_ann`` asked, same columns, same
    conversion of the vectors), with LanceDB's ``nprobes`` / ``ef`` set when non-zero and ``refine_factor`` when
    non-zero."""
    from vlp.index.store import _matrix

    def run(q: np.ndarray, n: int) -> list[int]:
        assert index.has_ann()
        search = index.table.search(q, vector_column_name="vector").distance_type("dot").limit(n)
        search = search.select(["video_id", "vector", "_distance"])
        if nprobes:
            search = search.nprobes(nprobes)
        if ef:
            search = search.ef(ef)
        if refine:
            search = search.refine_factor(refine)
        got = search.to_arrow()
        _matrix(got["vector"], index.info.dim)
        return row_ids(got["video_id"].to_pylist())

    return run


def pcts(ms: list[float]) -> tuple[float, float]:
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def mmm(values: list[float]) -> str:
    return f"{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f}"


def recall(got: list[list[int]], truth: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(g[:k]) & set(t[:k].tolist())) / k for g, t in zip(got, truth, strict=True)]))


def time_variants(variants: list[tuple[str, Query]], queries: np.ndarray, n: int, warmup: int,
                  repeats: int) -> tuple[dict[str, list[list[float]]], dict[str, list[list[int]]]]:  # fmt: skip
    """Per variant, the latencies (ms) of each pass and the ids of the first pass; the variants interleaved query by
    query, in an order rotated by one each query."""
    for _, fn in variants:
        for q in queries[:warmup]:
            fn(q, n)
    times = {name: [[] for _ in range(repeats)] for name, _ in variants}
    ids: dict[str, list[list[int]]] = {name: [] for name, _ in variants}
    for r in range(repeats):
        for i, q in enumerate(queries):
            shift = i % len(variants)
            for name, fn in variants[shift:] + variants[:shift]:
                start = time.perf_counter()
                got = fn(q, n)
                times[name][r].append((time.perf_counter() - start) * 1e3)
                if r == 0:
                    ids[name].append(got)
    return times, ids


def faiss_part(rows: np.ndarray, queries: np.ndarray, truth: np.ndarray, k: int, n: int, args: argparse.Namespace,
               exact_p50: float) -> None:  # fmt: skip
    """The same queries through faiss (flat inner product, and HNSW over flat vectors) when it is importable."""
    try:
        import faiss  # type: ignore[import-not-found]
    except ImportError:
        print("\nfaiss: not importable in this environment: comparison skipped")
        return
    if args.threads:
        faiss.omp_set_num_threads(args.threads)
    print(f"\nfaiss {faiss.__version__} (in memory, inner product, one query at a time; same queries and ground truth)")
    built: list[tuple[str, Any, float]] = []
    start = time.perf_counter()
    flat = faiss.IndexFlatIP(rows.shape[1])
    flat.add(rows)
    built.append(("IndexFlatIP", flat, time.perf_counter() - start))
    for m, efc in ((32, 200),):
        start = time.perf_counter()
        hnsw = faiss.IndexHNSWFlat(rows.shape[1], m, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = efc
        hnsw.add(rows)
        built.append((f"IndexHNSWFlat M={m} efC={efc}", hnsw, time.perf_counter() - start))
    variants: list[tuple[str, Query]] = []
    for name, index, _ in built:
        efs = [0] if name == "IndexFlatIP" else [64, 128, 256]
        for ef in efs:
            params = faiss.SearchParametersHNSW(efSearch=ef) if ef else None

            def run(q: np.ndarray, n: int, index: Any = index, params: Any = params) -> list[int]:
                _, got = index.search(q.reshape(1, -1), n, params=params)
                return got[0].tolist()

            variants.append((name + (f" efSearch={ef}" if ef else ""), run))
    times, ids = time_variants(variants, queries, n, args.warmup, args.repeats)
    print(f"{'variant':<40} {'build s':>8} {'p50 ms min/med/max':>20} {'p99 ms med':>10} {'R@k':>6} {'R@n':>6}")
    for name, _ in variants:
        build = next(s for b, _, s in built if name.startswith(b))
        p50s, p99s = zip(*(pcts(t) for t in times[name]), strict=True)
        print(f"{name:<40} {build:>8.2f} {mmm(list(p50s)):>20} {statistics.median(p99s):>10.2f} "
              f"{recall(ids[name], truth, k):>6.3f} {recall(ids[name], truth, n):>6.3f}")  # fmt: skip
    print(f"(LanceDB exact scan p50 for reference: {exact_p50:.2f} ms)")


def grow_part(index: Any, rows: np.ndarray, later: np.ndarray, queries: np.ndarray, args: argparse.Namespace,
              thumb: bytes) -> None:  # fmt: skip
    """Add ``later`` to ``index`` (whose ANN index covers ``rows``), copy it, then bring the ANN index up to date
    both ways: :meth:`ClipIndex.extend_ann` on one copy, :meth:`ClipIndex.build_ann` on the other; time each and
    compare their searches (through ``nearest``) with the exact scan against numpy's top-k over every row."""
    from vlp.index.store import ClipIndex

    k, n = args.k, max(args.k, args.candidates)
    start = time.perf_counter()
    for a in range(0, len(later), args.chunk):
        b = min(a + args.chunk, len(later))
        ids = [f"v{args.rows + i:07d}" for i in range(a, b)]
        index.add(ids, later[a:b], None, [thumb] * (b - a))
    add_s = time.perf_counter() - start
    copy = index.uri + "-rebuilt"
    shutil.copytree(index.uri, copy)
    extended, rebuilt = ClipIndex.open(index.uri), ClipIndex.open(copy)
    before = extended.unindexed_rows()
    start = time.perf_counter()
    extended.extend_ann()
    extend_s = time.perf_counter() - start
    start = time.perf_counter()
    rebuilt.build_ann()
    rebuild_s = time.perf_counter() - start
    share = len(later) / (len(rows) + len(later))
    print(f"\ngrow: {len(later)} rows added to the {len(rows)} the ANN index covers ({share:.1%} of the table; "
          f"vlp index extends below index.ann_rebuild_share) in {add_s:.2f} s; unindexed before / after extend_ann: "
          f"{before} / {extended.unindexed_rows()}")  # fmt: skip
    print(f"extend_ann: {extend_s:.2f} s; build_ann over every row: {rebuild_s:.2f} s ({rebuild_s / extend_s:.1f}x)")
    truth, _ = exact_topn(np.concatenate([rows, later]), queries, n)
    exact = ClipIndex.open(index.uri)
    exact.has_ann = lambda: False
    variants: list[tuple[str, Query]] = [
        ("exact scan", lambda q, n: row_ids(exact.nearest(q, n)[0])),
        ("ANN extended", lambda q, n: row_ids(extended.nearest(q, n)[0])),
        ("ANN rebuilt", lambda q, n: row_ids(rebuilt.nearest(q, n)[0])),
    ]
    times, ids = time_variants(variants, queries, n, args.warmup, 1)
    print(f"{'after growing':<16} {'p50 ms':>8} {'p99 ms':>8} {'R@' + str(k):>6} {'R@' + str(n):>6}")
    for name, _ in variants:
        p50, p99 = pcts(times[name][0])
        r_k, r_n = recall(ids[name], truth, k), recall(ids[name], truth, n)
        print(f"{name:<16} {p50:>8.2f} {p99:>8.2f} {r_k:>6.3f} {r_n:>6.3f}")
    shutil.rmtree(copy, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 1 when the exact scan's top-k is not numpy's (beyond float ties)."""
    args = parse_args(argv)
    small = args.rows < SMOKE
    args.repeats = args.repeats or (1 if small else 3)
    for name, values in (("nprobes", NPROBES), ("ef", EFS), ("refine", REFINES)):
        if getattr(args, name) is None:
            setattr(args, name, [] if small else values)
    if args.threads:
        for var in ("OMP_NUM_THREADS", "LANCE_CPU_THREADS", "RAYON_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    from vlp.index import store
    from vlp.index.store import ClipIndex, IndexInfo

    k, n = args.k, max(args.k, args.candidates)
    threads = {v: os.environ.get(v, "-") for v in ("OMP_NUM_THREADS", "LANCE_CPU_THREADS", "RAYON_NUM_THREADS")}
    print(f"rows {args.rows}, dim {args.dim}, queries {args.queries}, clusters {args.clusters}, spread {args.spread}, "
          f"query noise {args.query_noise}; k {k}, n {n}; threads {threads}")  # fmt: skip

    start = time.perf_counter()
    rows, queries, labels = embeddings(args)
    rows, later = rows[: args.rows], rows[args.rows :]
    truth, dots = exact_topn(rows, queries, n)
    own = labels[truth[:, :k]] == labels[args.rows :][:, None]
    print(f"embeddings and numpy ground truth: {time.perf_counter() - start:.1f} s; ground-truth dot at rank 1 / {k} / "
          f"{k + 1} / {n}: {dots[:, 0].mean():.3f} / {dots[:, k - 1].mean():.3f} / {dots[:, k].mean():.3f} / "
          f"{dots[:, n - 1].mean():.3f} (means); top-{k} in the query's own cluster: {own.mean():.2f}")  # fmt: skip
    rss_data = common.peak_rss_mib()

    out = args.out or tempfile.mkdtemp(prefix="bench-index-")
    try:
        if args.out and Path(out).exists() and any(Path(out).iterdir()):
            print(f"--out {out} is not empty: give a new or empty directory")
            return 2
        uri = str(Path(out) / "index")
        fp = {"family": "synthetic", "kind": "bench", "weights_sha256": "0" * 64}
        sample = {"num_frames": 1, "eval_mode": "uniform", "seed": 0}
        info = IndexInfo("synthetic", fp, "synthetic", args.dim, [1, args.dim], False, sample)
        index = ClipIndex.create(uri, info)
        thumb = bytes(range(256)) * (args.thumb_bytes // 256) + bytes(args.thumb_bytes % 256)
        chunks = [(s, min(s + args.chunk, args.rows)) for s in range(0, args.rows, args.chunk)]
        batches = [([f"v{i:07d}" for i in range(a, b)], [thumb] * (b - a)) for a, b in chunks]
        start = time.perf_counter()
        for (a, b), (ids, thumbs) in zip(chunks, batches, strict=True):
            index.add(ids, rows[a:b], None, thumbs)
        add_s = time.perf_counter() - start
        assert index.count() == args.rows
        size_rows = dir_mib(uri)
        start = time.perf_counter()
        index.build_ann()
        build_s = time.perf_counter() - start
        size_ann = dir_mib(uri)
        rss_built = common.peak_rss_mib()
        [ann_meta] = [i for i in index.table.list_indices() if "vector" in i.columns]
        stats = index.table.index_stats(ann_meta.name)
        print(f"add: {args.rows} rows in {len(chunks)} ClipIndex.add calls of {args.chunk}: {add_s:.2f} s, "
              f"{args.rows / add_s:,.0f} rows/s (no encoding; Arrow batches + LanceDB writes)")  # fmt: skip
        print(
            f"build_ann (IVF-HNSW-SQ, dot): {build_s:.2f} s; {stats.index_type if stats else '?'} over "
            f"{stats.num_indexed_rows if stats else '?'} rows, LanceDB's default partitions and graph settings"
        )
        print(f"disk: {size_rows:.1f} MiB after add ({args.thumb_bytes} B thumbnails), {size_ann:.1f} MiB with the "
              f"ANN index; vectors alone {args.rows * args.dim * 4 / 2**20:.1f} MiB")  # fmt: skip

        exact = ClipIndex.open(uri)
        exact.has_ann = lambda: False  # nearest()'s exact path, as on an index below index.ann_min_rows

        def via_nearest(ix: Any) -> Query:
            return lambda q, n: row_ids(ix.nearest(q, n)[0])

        default = (0, max(store.ANN_EF, n * store.REFINE_FACTOR), store.REFINE_FACTOR)
        knobs = [default]
        if args.grid:
            knobs += [(p, e, r) for p in [0, *args.nprobes] for e in [0, *args.ef] for r in args.refine]
        else:
            knobs += [(p, default[1], default[2]) for p in args.nprobes] + [(0, e, default[2]) for e in args.ef]
            knobs += [(0, max(store.ANN_EF, n * r), r) if r else (0, 0, 0) for r in args.refine]
        dropped = [kn for kn in knobs if kn[1] and kn[1] < n * max(kn[2], 1)]
        knobs = [kn for kn in dict.fromkeys(knobs) if kn not in dropped][1:]
        if dropped:
            print(f"dropped (ef < n * refine_factor, which LanceDB refuses): {sorted(set(dropped))}")

        check = ann_query(index, *default)
        few = queries[:50]
        same = sum(check(q, n) == row_ids(index.nearest(q, n)[0]) for q in few)
        print(f"sweep query at store.py's defaults returns nearest()'s ids: {same}/{len(few)} queries")

        def label(p: int, e: int, r: int) -> str:
            return f"ANN nprobes={p or 'def'} ef={e or 'def'} refine={r or 'none'}"

        variants = [("exact scan (nearest, no ANN)", via_nearest(exact))]
        variants += [("ANN nearest() [store.py]", via_nearest(index))]
        variants += [(label(*kn), ann_query(index, *kn)) for kn in knobs]
        start = time.perf_counter()
        times, ids = time_variants(variants, queries, n, args.warmup, args.repeats)
        timed_s = time.perf_counter() - start

        exact_ids = ids[variants[0][0]]
        tie = np.abs(dots[:, k - 1] - dots[:, k]) < TIE
        set_ok = [set(g[:k]) == set(t[:k].tolist()) for g, t in zip(exact_ids, truth, strict=True)]
        order_ok = sum(g[:k] == t[:k].tolist() for g, t in zip(exact_ids, truth, strict=True))
        bad = sum(not ok and not t for ok, t in zip(set_ok, tie, strict=True))
        print(f"exact scan vs numpy: top-{k} same set {sum(set_ok)}/{len(queries)}, same order {order_ok}/"
              f"{len(queries)}; recall@{n} {recall(exact_ids, truth, n):.4f}; mismatches not explained by a "
              f"float tie (<{TIE}): {bad}")  # fmt: skip

        p50_exact = [pcts(t)[0] for t in times[variants[0][0]]]
        print(f"\nfirst stage, n = {n}, {args.queries} queries x {args.repeats} interleaved passes "
              f"({timed_s:.0f} s), after {args.warmup} warm-up queries per variant")  # fmt: skip
        head = f"{'variant':<42} {'p50 ms min/med/max':>20} {'p99 ms med':>10} {'vs exact':>8} {'R@' + str(k):>6} "
        print(head + f"{'R@' + str(n):>6} goals")
        for name, _ in variants:
            p50s, p99s = zip(*(pcts(t) for t in times[name]), strict=True)
            speed = statistics.median(e / v for e, v in zip(p50_exact, p50s, strict=True))
            r_k, r_n = recall(ids[name], truth, k), recall(ids[name], truth, n)
            goals = "yes" if statistics.median(p50s) < 50 and r_k >= 0.95 else "no"
            print(f"{name:<42} {mmm(list(p50s)):>20} {statistics.median(p99s):>10.2f} {speed:>7.1f}x {r_k:>6.3f} "
                  f"{r_n:>6.3f} {goals}")  # fmt: skip
        print(f"(def: LanceDB's default; refine=none: no refine_factor; goals: p50 < 50 ms and R@{k} >= 0.95)")
        if not args.no_faiss:
            faiss_part(rows, queries, truth, k, n, args, statistics.median(p50_exact))
        if args.grow:
            grow_part(index, rows, later, queries, args, thumb)
        print(f"\npeak RSS: {rss_data:.0f} MiB after embeddings + ground truth, {rss_built:.0f} MiB after add + "
              f"build_ann, {common.peak_rss_mib():.0f} MiB at the end")  # fmt: skip
        return 1 if bad else 0
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
