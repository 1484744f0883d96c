"""Every refusal exits 2, every time (issue 39): no abort after the error line.

A process that read Parquet through Arrow and then exited at once used to abort now and then (exit 134, "terminate
called without an active exception", after its own error line): a task left on Arrow's thread pool released a
buffer backed by Python ``bytes`` while the interpreter was finalizing, which ends the thread inside a C++
destructor (:func:`vlp.storage.parquet._arrow_owned`). The rate was 1 in 13-40 runs of a CLI error path under load and
about 1 in 4 for the child process below (three reads of a wide file, then exit), so the child runs often enough
here to see it: at 1 in 4, 24 clean runs in a row happen by chance with probability 0.75^24 = 0.1%.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from conftest import write_mp4
from vlp.data.frames import FramesConfig, extract_part
from vlp.data.ingest import IngestConfig, ingest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
CHILD = """
import sys
from vlp import storage
for _ in range(3):
    storage.read_parquet(sys.argv[1])
print("refused", file=sys.stderr)
sys.exit(2)
"""


def run_many(commands: list[list[str]], parallel: int = 2) -> list[subprocess.CompletedProcess[bytes]]:
    """Each command as its own process, ``parallel`` at a time (load makes the race likelier)."""

    def one(cmd: list[str]) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(cmd, capture_output=True, timeout=120, env=ENV, cwd=ROOT)

    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(one, commands))


def outcomes(done: list[subprocess.CompletedProcess[bytes]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for proc in done:
        counts[proc.returncode] = counts.get(proc.returncode, 0) + 1
    return counts


def test_a_process_that_exits_right_after_reading_parquet_exits_with_its_own_code(tmp_path):
    wide = tmp_path / "wide.parquet"
    pq.write_table(pa.table({f"c{i}": np.arange(2000) for i in range(40)}), wide, row_group_size=100)
    done = run_many([[sys.executable, "-c", CHILD, str(wide)]] * 24)
    assert outcomes(done) == {2: 24}, [p.stderr.decode()[-300:] for p in done if p.returncode != 2]
    assert {p.stderr for p in done} == {b"refused\n"}


def test_the_cli_error_paths_that_aborted_exit_2_with_one_line_every_time(tmp_path):
    """``extract-frames --merge`` with a part that lost a shard, and a frames store whose index names a file that is
    not a shard: 8 runs each, exit 2 and the one line each time."""
    for name in ("a", "b", "c"):
        write_mp4(tmp_path / "raw" / f"{name}.mp4", num_frames=6)
    ann = tmp_path / "raw" / "ann.json"
    ann.write_text('[{"video": "a.mp4", "caption": "a"}, {"video": "b.mp4", "caption": "b"}, '
                   '{"video": "c.mp4", "caption": "c"}]')  # fmt: skip
    ingest(str(ann), str(tmp_path / "ds"), IngestConfig(workers=1, progress=False, split="train"))
    frames = FramesConfig(num_frames=2, size=32, progress=False, workers=1, videos_per_shard=1)
    parts = [str(tmp_path / f"part{i}") for i in range(2)]
    for i, part in enumerate(parts):
        extract_part(str(tmp_path / "ds"), part, frames, i, 2)
    lost = next(Path(parts[0], "shards").iterdir())
    lost.unlink()
    overrides = ["frames.num_frames=2", "frames.size=32", "frames.workers=1", "frames.videos_per_shard=1",
                 "frames.progress=false"]  # fmt: skip
    merge = [sys.executable, "-m", "vlp.cli", "extract-frames", "--dataset", str(tmp_path / "ds"), "--out",
             str(tmp_path / "merged"), "--merge", parts[0], "--merge", parts[1], *overrides]  # fmt: skip
    store = tmp_path / "store"
    store.mkdir()
    index = pa.table({"video_id": ["a"], "shard": ["../../etc/passwd"], "num_stored": [2], "num_frames": [6],
                      "fps": [12.0]})  # fmt: skip
    pq.write_table(index, store / "index.parquet")
    refuse = [sys.executable, "-c", f"import sys; from vlp.data.frames import FrameStore\n"
              f"try:\n    FrameStore({str(store)!r})\nexcept ValueError as e:\n    print(e, file=sys.stderr); "
              f"sys.exit(2)"]  # fmt: skip
    done = run_many([merge] * 8 + [refuse] * 8)
    assert outcomes(done) == {2: 16}, [p.stderr.decode()[-300:] for p in done if p.returncode != 2]
    said = {p.stderr.decode().strip().splitlines()[-1] for p in done[:8]}
    assert said == {f"vlp extract-frames: error: the part {parts[0]} lacks shards/{lost.name}, which its part.json "
                    "lists: the part was damaged after it ran; run that part again"}, said  # fmt: skip
    assert {p.stderr.decode().count("\n") for p in done[8:]} == {1}
    assert all(b"terminate called" not in p.stderr for p in done)
