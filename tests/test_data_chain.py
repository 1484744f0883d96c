"""The data steps chained through the real `vlp` command: synth -> ingest -> extract-frames -> mine-entities.

Runs on a local directory and on an s3:// bucket of a real S3 server process; corrupts 3 of 20
videos and checks they are rejected with reasons while the rest flows through every step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest

from vlp import storage
from vlp.data import manifest
from vlp.data.frames import FrameStore

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.yaml")
VLP = shutil.which("vlp", path=str(Path(sys.executable).parent)) or "vlp"


def vlp(*args: str, env: dict[str, str] | None = None) -> dict:
    """Run the real console script; return its JSON summary (stdout) after checking exit code 0."""
    proc = subprocess.run(
        [VLP, *args, "--config", TINY], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300
    )
    assert proc.returncode == 0, f"vlp {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def corrupt_three(raw: str) -> dict[str, str]:
    """Zero-byte, truncated and not-a-video: three different clips of ``raw``; returns {video_id: kind}."""
    videos = storage.read_parquet(storage.join(raw, manifest.VIDEOS)).to_pylist()
    clips = [v for v in videos if v["media"] == "video"][:3]
    kinds = {}
    for video, kind in zip(clips, ["zero-byte", "truncated", "text"], strict=True):
        uri = manifest.resolve(raw, video["path"])
        data = storage.read_bytes(uri)
        payload = {"zero-byte": b"", "truncated": data[: len(data) // 2], "text": b"just some text\n"}[kind]
        storage.write_bytes(uri, payload)
        kinds[video["video_id"]] = kind
    return kinds


def run_chain(root: str, env: dict[str, str] | None = None) -> dict[str, dict]:
    raw, dataset, frames, entities = (storage.join(root, p) for p in ("raw", "dataset", "frames", "entities"))
    out = {"synth": vlp("data", "synth", "--out", raw, "--num-videos", "16", "--seed", "3", env=env)}
    out["corrupted"] = corrupt_three(raw)
    out["ingest"] = vlp("ingest", "--source", raw, "--out", dataset, env=env)
    out["frames"] = vlp("extract-frames", "--dataset", dataset, "--out", frames, env=env)
    out["entities"] = vlp("mine-entities", "--dataset", dataset, "--out", entities, env=env)
    return out


def check_chain(root: str, result: dict[str, dict]) -> None:
    synth = result["synth"]
    total = synth["videos"] + synth["images"]
    assert total == 20, "tiny.yaml: 16 clips + 4 stills"
    counts = result["ingest"]["videos"]
    assert (counts["input"], counts["accepted"], counts["rejected"]) == (20, 17, 3)

    dataset = storage.join(root, "dataset")
    rejects = manifest.read(dataset, manifest.REJECTS, manifest.REJECT_SCHEMA)
    video_rejects = {r["record_id"]: r["reason"] for r in rejects.to_pylist() if r["kind"] == "video"}
    assert set(video_rejects) == set(result["corrupted"]), video_rejects
    assert all(video_rejects.values()), "every reject carries a reason"
    zero = next(v for v, k in result["corrupted"].items() if k == "zero-byte")
    assert "empty" in video_rejects[zero]

    accepted = manifest.read(dataset, manifest.VIDEOS, manifest.VIDEO_SCHEMA)
    assert accepted.num_rows == 17
    assert not set(accepted["video_id"].to_pylist()) & set(result["corrupted"])

    frames_root = storage.join(root, "frames")
    store = FrameStore(frames_root)
    index = storage.read_parquet(storage.join(frames_root, "index.parquet"))
    assert sorted(index["video_id"].to_pylist()) == sorted(accepted["video_id"].to_pylist())
    clip = accepted.filter(pc.equal(accepted["media"], "video"))["video_id"][0].as_py()
    pixels = store.load(clip)
    assert pixels.shape == (store.info(clip)["num_stored"], 32, 32, 3), "tiny.yaml stores 32 px frames"
    assert store.info(clip)["num_stored"] == min(8, store.info(clip)["num_frames"])

    vocab = storage.read_text(storage.join(root, "entities", "unigrams.txt")).split("\n")
    entities = [line.split(" ")[0] for line in vocab]
    from vlp.data.synth import SCENES, SHAPES

    visual = set(SHAPES) | {w for s in SCENES for w in s.split()}
    assert len(set(entities[:5]) & visual) >= 3, f"the top nouns should be the world's shapes/scenes: {entities[:10]}"


def test_chain_on_local_directory(tmp_path):
    root = str(tmp_path / "run")
    result = run_chain(root)
    check_chain(root, result)
    # Re-running the two derived steps changes nothing.
    before = {p: p.read_bytes() for p in (tmp_path / "run" / "frames").rglob("*.parquet")}
    vlp("extract-frames", "--dataset", f"{root}/dataset", "--out", f"{root}/frames")
    after = {p: p.read_bytes() for p in (tmp_path / "run" / "frames").rglob("*.parquet")}
    assert before == after


def test_chain_on_s3(s3_bucket, s3_env):
    root = f"{s3_bucket}/run"
    result = run_chain(root, env=s3_env)
    check_chain(root, result)
    assert storage.exists(f"{root}/frames/index.parquet")


def test_bad_source_is_a_clear_error_exit_2(tmp_path):
    proc = subprocess.run(
        [VLP, "ingest", "--source", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr


@pytest.mark.parametrize("override", ["frames.num_framez=3", "frames.num_frames=many"])
def test_bad_override_is_a_clear_error_exit_2(tmp_path, override):
    proc = subprocess.run(
        [VLP, "extract-frames", "--dataset", str(tmp_path), "--out", str(tmp_path / "o"), override],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert override.split("=")[0] in proc.stderr


def test_missing_bucket_is_a_clear_storage_error(s3_env, s3_endpoint, tmp_path):
    proc = subprocess.run(
        [VLP, "data", "synth", "--out", "s3://no-such-bucket-vlp/x", "--num-videos", "1", "--config", TINY],
        capture_output=True,
        text=True,
        env={**os.environ, **s3_env},
        timeout=120,
    )
    assert proc.returncode == 1
    assert "storage error" in proc.stderr and "no-such-bucket-vlp" in proc.stderr
    assert "Traceback" not in proc.stderr
