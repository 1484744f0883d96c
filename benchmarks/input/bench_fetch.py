"""How fast does one ``vlp fetch`` part download, probe and store videos, by downloads in flight?

A loopback web server (``common.UrlServer``, in a process of its own so that its CPU is not the part's) serves
``--videos`` real mp4s of about ``--mb`` MB (h264 of noise, made here), each row's URL giving other bytes (an MP4
``free`` box naming the URL is appended), so every row is a distinct video to hash, probe and store. For each
``--concurrency`` the part fetches ``--rows`` rows (:func:`vlp.data.fetch.fetch_part`, the step's own code) into a
fresh folder, or into ``--s3 s3://bucket/prefix`` (the ``AWS_*`` environment names the server, e.g.
``scripts/s3-server.sh``). Printed per row of the table: videos/s, MB/s, the part's CPU seconds (this process and
its probe workers) and CPU share (CPU seconds over wall seconds: the cores busy outside the network wait), and MB
per CPU second (what one core sustains). The last lines say how many parts fetch WebVid's 2.5M clips (about 2 MB
each) in a day at the measured speed, and at per-host rate limits (a part's ``fetch.per_host_rate``).

    python benchmarks/input/bench_fetch.py [--rows 400] [--concurrency 1 8 32 128] [--mb 2] [--s3 s3://b/p]
"""

import argparse
import math
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
from common import UrlServer

WEBVID_CLIPS, WEBVID_MB, DAY_S = 2_500_000, 2.0, 86_400


def make_videos(folder: Path, count: int, mb: float) -> dict[str, bytes]:
    """``count`` real mp4s of noise, about ``mb`` MB each (320x240, 12 fps)."""
    import numpy as np

    from vlp.data.synth.encode import encode_mp4

    folder.mkdir(parents=True, exist_ok=True)
    frames = max(2, round(24 * mb))  # about 41 kB a frame of noise at 320x240
    made = {}
    for i in range(count):
        path = folder / f"n{i}.mp4"
        if not path.exists():
            rng = np.random.default_rng(i)
            encode_mp4(rng.integers(0, 255, size=(frames, 240, 320, 3), dtype=np.uint8), 12, str(path))
        made[path.name] = path.read_bytes()
    return made


def serve(files: dict[str, bytes], port: "multiprocessing.Queue[int]") -> None:
    with UrlServer(files) as server:
        port.put(server.port)
        time.sleep(10**9)


def cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def remove_prefix(uri: str) -> None:
    """Delete every object under the ``s3://`` prefix ``uri``."""
    from vlp import storage

    bucket, prefix = storage.split_s3(uri)
    client = storage.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=400, help="rows of the URL list each round fetches")
    parser.add_argument("--videos", type=int, default=8, help="distinct source videos served")
    parser.add_argument("--mb", type=float, default=2.0, help="size of each video, MB")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--no-probe", action="store_true", help="store without ingest's probe")
    parser.add_argument("--probe-workers", type=int, default=2, help="fetch.probe_workers")
    parser.add_argument("--s3", default="", help="s3://bucket/prefix to store into (default: a local folder)")
    parser.add_argument("--out", default="runs/bench-fetch", help="videos made here; local outputs under it")
    args = parser.parse_args()

    from vlp import storage
    from vlp.data.fetch import FetchConfig, fetch_part

    if args.s3:
        storage.configure(storage.StorageConfig())  # endpoint and keys from AWS_*
    out = Path(args.out)
    files = make_videos(out / "videos", args.videos, args.mb)
    size_mb = sum(map(len, files.values())) / len(files) / 1e6
    queue: multiprocessing.Queue[int] = multiprocessing.get_context("fork").Queue()
    server = multiprocessing.get_context("fork").Process(target=serve, args=(files, queue), daemon=True)
    server.start()
    port = queue.get(timeout=60)
    names = sorted(files)
    listed = out / "urls.csv"
    rows = [f"http://127.0.0.1:{port}/u/{names[i % len(names)]}?n={i},clip {i}" for i in range(args.rows)]
    listed.write_text("url,caption\n" + "\n".join(rows) + "\n")
    probe = "off" if args.no_probe else f"on ({args.probe_workers} workers)"
    print(f"{args.rows} rows of {len(files)} mp4s of {size_mb:.2f} MB (distinct bytes per row), probe {probe}, into "
          f"{args.s3 or 'a local folder'}; {os.cpu_count()} CPUs")  # fmt: skip
    print("| in flight | videos | MB | wall s | videos/s | MB/s | CPU s | CPU share | MB per CPU s |")
    print("|---|---|---|---|---|---|---|---|---|")
    best = 0.0
    try:
        for c in args.concurrency:
            cfg = FetchConfig(concurrency=c, per_host_concurrency=c, allow=["127.0.0.1/32"], progress=False,
                              probe=not args.no_probe, batch=max(64, c), probe_workers=args.probe_workers)  # fmt: skip
            target = f"{args.s3.rstrip('/')}/{uuid.uuid4().hex[:8]}" if args.s3 else tempfile.mkdtemp(dir=out)
            cpu0, t0 = cpu_s(), time.perf_counter()
            summary = fetch_part(str(listed), target, cfg, 0, 1)
            wall, cpu = time.perf_counter() - t0, cpu_s() - cpu0
            if args.s3:
                remove_prefix(target)  # an object store in memory (scripts/s3-server.sh) fills up otherwise
            else:
                shutil.rmtree(target, ignore_errors=True)
            mb = summary["bytes"] / 1e6
            videos = summary["ok"]
            assert videos == args.rows, summary["by_status"]
            best = max(best, videos / wall)
            print(f"| {c} | {videos} | {mb:.0f} | {wall:.1f} | {videos / wall:.1f} | {mb / wall:.1f} | {cpu:.1f} | "
                  f"{cpu / wall:.2f} | {mb / cpu:.1f} |", flush=True)  # fmt: skip
    finally:
        server.kill()
    day = WEBVID_CLIPS / DAY_S
    print(f"\nWebVid in a day: {WEBVID_CLIPS:,} clips = {day:.1f} clips/s for 24 h")
    print(f"  at the best measured speed ({best:.1f} videos/s a part): {math.ceil(day / best)} part(s)")
    for rate in (2, 5, 10, 20):
        per_part = min(best, rate)
        print(f"  at fetch.per_host_rate={rate} (one host, as WebVid's): {math.ceil(day / per_part)} parts")


if __name__ == "__main__":
    main()
