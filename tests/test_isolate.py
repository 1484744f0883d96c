"""Per-file isolation: a crash, a hang or a declared-oversize file is one reject, never a failed step."""

from __future__ import annotations

import os
import time

import pytest

from common import child_pids, living
from conftest import png_header
from vlp.data import video
from vlp.data.isolate import isolated_map


def _work(item: str) -> str:
    if item == "crash":
        os._exit(11)  # what a segfaulting decoder or the OOM killer does to its worker
    if item == "hang":
        time.sleep(600)
    if item == "raise":
        raise ValueError("the step must fail: raised by fn")
    return item.upper()


def test_a_crash_and_a_hang_cost_their_own_item_only_and_order_is_kept():
    items = ["a", "crash", "b", "hang", "c", "d", "crash", "e"]
    start = time.monotonic()
    got = list(isolated_map(_work, items, workers=2, timeout_s=1.5, on_failure=lambda item, why: f"{item}: {why}"))
    assert got == ["A", "crash: crashed: exit code 11", "B", "hang: timed out after 1.5 s", "C", "D",
                   "crash: crashed: exit code 11", "E"]  # fmt: skip
    assert time.monotonic() - start < 30


def test_an_exception_of_fn_fails_the_map_and_leaves_no_worker_behind():
    import multiprocessing

    with pytest.raises(ValueError, match=r"^the step must fail"):
        list(isolated_map(_work, ["a", "raise", "b"], workers=2, timeout_s=0, on_failure=lambda i, w: None))
    assert multiprocessing.active_children() == []


def test_limits_are_read_from_the_header_before_any_decoding(tmp_path, mp4_factory):
    bomb = png_header(tmp_path / "bomb.png", 16000, 16000)
    limits = video.DecodeLimits()
    assert video.limits_problem(str(bomb), limits).startswith("too large: Image size (256000000 pixels) exceeds")
    wide = png_header(tmp_path / "wide.png", 9000, 4500)  # under PIL's own guard, over ours
    assert (
        video.limits_problem(str(wide), limits)
        == "too large: 9000x4500 = 40500000 pixels a frame > max_pixels=35389440"
    )
    clip = str(mp4_factory("clip.mp4", num_frames=24, fps=12, size=(64, 48)))
    assert video.limits_problem(clip, limits) is None
    assert video.limits_problem(clip, video.DecodeLimits(max_pixels=64 * 48 - 1)).startswith("too large: 64x48")
    assert video.limits_problem(clip, video.DecodeLimits(max_duration_s=1.5)) == (
        "too long: 2.000 s > max_duration_s=1.5"
    )
    size = os.path.getsize(clip)
    assert video.limits_problem(clip, video.DecodeLimits(max_bytes=size - 1)) == (
        f"too large: {size} bytes > max_bytes={size - 1}"
    )


def test_ingest_quarantines_a_crashing_a_hanging_and_an_oversize_file(tmp_path, mp4_factory, monkeypatch):
    import json

    from vlp.data import manifest
    from vlp.data.ingest import IngestConfig, ingest

    root = tmp_path / "videos"
    for name in ("good", "crash", "hang"):
        mp4_factory(f"videos/{name}.mp4")
    png_header(root / "bomb.png", 16000, 16000)
    records = [{"video": f, "caption": f"a clip {f}"} for f in ("good.mp4", "crash.mp4", "hang.mp4", "bomb.png")]
    (tmp_path / "ann.json").write_text(json.dumps(records))
    real_probe = video.probe

    def probe(path: str) -> video.VideoInfo:  # a decoder that segfaults on one file and hangs on another
        if path.endswith("crash.mp4"):
            os._exit(11)
        if path.endswith("hang.mp4"):
            time.sleep(600)
        return real_probe(path)

    monkeypatch.setattr(video, "probe", probe)  # the forked workers inherit it
    cfg = IngestConfig(workers=2, progress=False, split="train", timeout_s=2.0, video_root=str(root))
    summary = ingest(str(tmp_path / "ann.json"), str(tmp_path / "out"), cfg)
    assert summary["videos"] == {"input": 4, "accepted": 1, "rejected": 3}
    rejects = {r["record_id"]: r["reason"] for r in manifest.read(str(tmp_path / "out"), manifest.REJECTS,
               manifest.REJECT_SCHEMA).to_pylist() if r["kind"] == "video"}  # fmt: skip
    assert rejects["crash"] == "probe crashed: the decoder killed its worker process (crashed: exit code 11)"
    assert rejects["hang"] == "probe timed out after 2 s: a hanging decoder (ingest.timeout_s)"
    assert rejects["bomb"].startswith("too large: Image size (256000000 pixels)")


def test_extract_frames_quarantines_a_crashing_and_a_hanging_file(tmp_path, mp4_factory, monkeypatch):
    from vlp.data import manifest
    from vlp.data.frames import FramesConfig, extract
    from vlp.data.frames import decode as frames

    rows = []
    for name in ("a", "crash", "b", "hang"):
        path = str(mp4_factory(f"media/{name}.mp4"))
        info = video.probe(path)
        rows.append({"video_id": name, "path": path, "split": "train", "media": "video", "source": "synth",
                     "num_frames": info.num_frames, "fps": info.fps, "duration_s": info.duration_s,
                     "width": info.width, "height": info.height, "size_bytes": os.path.getsize(path)})  # fmt: skip
    dataset = str(tmp_path / "dataset")
    table, root = manifest.from_rows(rows, manifest.VIDEO_SCHEMA), {manifest.MEDIA_ROOT_KEY: str(tmp_path).encode()}
    manifest.write(dataset, manifest.VIDEOS, table, manifest.VIDEO_SCHEMA, root)
    real_decode = frames.decode_frames

    def decode(path: str, indices, decoder: str = "sparse"):
        if path.endswith("crash.mp4"):
            os._exit(11)
        if path.endswith("hang.mp4"):
            time.sleep(600)
        return real_decode(path, indices, decoder)

    monkeypatch.setattr(frames, "decode_frames", decode)
    cfg = FramesConfig(num_frames=4, size=32, progress=False, workers=2, videos_per_shard=2, timeout_s=2.0)
    summary = extract(dataset, str(tmp_path / "frames"), cfg)
    assert summary["stored_videos"] == 2 and summary["rejected"] == 2
    rejects = manifest.read(str(tmp_path / "frames"), manifest.REJECTS, manifest.REJECT_SCHEMA).to_pylist()
    assert {r["record_id"]: r["reason"] for r in rejects} == {
        "crash": "decoder crashed: exit code 11 (frames.timeout_s=2)",
        "hang": "decoder timed out after 2 s (frames.timeout_s=2)",
    }


_PARENT = """
import time
from vlp.data.isolate import isolated_map

def work(item):
    if item == "hang":
        time.sleep(600)
    return item.upper()

results = isolated_map(work, {items!r}, workers=3, timeout_s=0, on_failure=lambda i, w: None)
print(next(results), flush=True)  # the first result: every worker started, some idle, some busy
time.sleep(600)
"""


@pytest.mark.parametrize("items", [["a", "b", "c"], ["a", "hang", "hang"]], ids=["idle", "busy"])
def test_workers_end_when_their_parent_is_killed(items):
    """SIGKILL of the parent (what the OOM killer and a pod eviction do): every worker, waiting for work or in the
    middle of an item that never returns, is gone within seconds."""
    import signal
    import subprocess
    import sys

    script = _PARENT.format(items=items)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "A"
        workers = child_pids(parent.pid)
        assert len(workers) == 3, workers
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while living(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not living(workers), f"workers outlived their parent: {living(workers)}"
