"""Fan-out of the data steps at the function level: ingest's probing and frame extraction split into parts, then
merged, give the bytes one pod gives; a part rerun skips its finished work; a merge refuses parts that are not one
complete, matching set. (The DAG that runs the parts under ParallelFor is tested in test_pipeline_local.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vlp import storage
from vlp.data import manifest
from vlp.data.frames import FramesConfig, extract, extract_part, merge_parts
from vlp.data.ingest import PROBES, IngestConfig, ingest, probe_part

TINY_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


def all_bytes(root: str) -> dict[str, bytes]:
    return {os.path.relpath(u, root): storage.read_bytes(u) for u in storage.list_files(root)}


@pytest.mark.parametrize(("total", "count"), [(10, 3), (3, 5), (0, 2), (7, 1)])
def test_part_ranges_cover_every_item_once_in_order(total, count):
    ranges = [manifest.part_range(total, i, count) for i in range(count)]
    assert [i for r in ranges for i in r] == list(range(total))
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1
    with pytest.raises(ValueError, match="part"):
        manifest.part_range(total, count, count)


# --------------------------------------------------------------------------- extract-frames

FRAMES = FramesConfig(num_frames=4, size=32, videos_per_shard=3, workers=1, progress=False)


@pytest.mark.parametrize("count", [1, 2, 4, 9])
def test_merged_frame_parts_are_byte_identical_to_one_pod(tiny_world, tmp_path, count):
    single = str(tmp_path / "single")
    one = extract(tiny_world["dataset"], single, FRAMES)
    parts = [str(tmp_path / f"part-{i}") for i in range(count)]
    summaries = [extract_part(tiny_world["dataset"], p, FRAMES, i, count) for i, p in enumerate(parts)]
    assert sum(s["shards"] for s in summaries) == one["shards"] >= 4
    assert sum(s["videos"] for s in summaries) == one["videos"]
    for part in parts:  # a part holds its shards and part.json, never an index
        assert "index.parquet" not in all_bytes(part) and os.path.exists(os.path.join(part, "part.json"))
    merged = str(tmp_path / "merged")
    summary = merge_parts(tiny_world["dataset"], list(reversed(parts)), merged, FRAMES)
    assert all_bytes(merged) == all_bytes(single)
    assert (summary["parts"], summary["shards_copied"], summary["shards_written"]) == (count, one["shards"], 0)
    assert {k: summary[k] for k in ("stored_videos", "stored_frames", "rejected")} == {
        k: one[k] for k in ("stored_videos", "stored_frames", "rejected")
    }


def test_a_frame_part_rerun_skips_its_finished_shards(tiny_world, tmp_path):
    part = str(tmp_path / "part")
    first = extract_part(tiny_world["dataset"], part, FRAMES, 1, 2)
    assert first["shards"] == first["shards_written"] >= 2
    before = all_bytes(part)
    shards = sorted(p for p in before if p.startswith("shards/"))
    os.remove(os.path.join(part, shards[0]))  # a part that died before its last shard
    again = extract_part(tiny_world["dataset"], part, FRAMES, 1, 2)
    assert (again["shards_written"], again["shards_skipped"]) == (1, first["shards"] - 1)
    assert all_bytes(part) == before


def test_a_frame_merge_refuses_an_incomplete_or_foreign_set(tiny_world, tmp_path):
    ds = tiny_world["dataset"]
    parts = [str(tmp_path / f"part-{i}") for i in range(3)]
    for i, part in enumerate(parts):
        extract_part(ds, part, FRAMES, i, 3)
    with pytest.raises(ValueError, match=r"not one complete set: indices \[0, 2\]"):
        merge_parts(ds, [parts[0], parts[2]], str(tmp_path / "m1"), FRAMES)
    with pytest.raises(ValueError, match=r"has no part\.json"):
        merge_parts(ds, [*parts[:2], str(tmp_path)], str(tmp_path / "m2"), FRAMES)
    other = FramesConfig(num_frames=8, size=32, videos_per_shard=3, workers=1, progress=False)
    with pytest.raises(ValueError, match="made with settings"):
        merge_parts(ds, parts, str(tmp_path / "m3"), other)
    shards = sorted(Path(parts[1], "shards").iterdir())
    shards[0].unlink()  # part.json names a shard the part no longer holds
    with pytest.raises(ValueError, match=rf"the part {parts[1]} lacks shards/{shards[0].name}, which its part\.json "
                       "lists: the part was damaged after it ran; run that part again"):  # fmt: skip
        merge_parts(ds, parts, str(tmp_path / "m4"), FRAMES)
    assert not os.path.exists(tmp_path / "m4" / "index.parquet")


# --------------------------------------------------------------------------- ingest


@pytest.fixture
def raw_with_rejects(tiny_world, tmp_path) -> str:
    """The tiny raw world with two clips broken (truncated, and not a video), so probing rejects some."""
    raw = tmp_path / "raw"
    shutil.copytree(tiny_world["raw"], raw)
    videos = sorted((raw / "videos").glob("*.mp4"))
    videos[3].write_bytes(videos[3].read_bytes()[:200])
    videos[11].write_bytes(b"not a video\n")
    return str(raw)


INGEST = IngestConfig(workers=1, progress=False)


@pytest.mark.parametrize("count", [1, 3, 20])
def test_merged_probe_parts_are_byte_identical_to_one_pod(raw_with_rejects, tmp_path, count):
    single = str(tmp_path / "single")
    one = ingest(raw_with_rejects, single, INGEST)
    assert one["videos"]["rejected"] >= 2  # the two broken clips
    parts = [str(tmp_path / f"probe-{i}") for i in range(count)]
    summaries = [probe_part(raw_with_rejects, p, INGEST, i, count) for i, p in enumerate(parts)]
    assert sum(s["part_files"] for s in summaries) == summaries[0]["files"] == one["videos"]["input"]
    assert sum(s["rejected"] for s in summaries) == 2
    merged = str(tmp_path / "merged")
    summary = ingest(raw_with_rejects, merged, INGEST, probes=parts[::-1])
    assert all_bytes(merged) == all_bytes(single)
    assert summary["probe_parts"] == count
    assert {k: summary[k] for k in ("videos", "captions", "qa")} == {k: one[k] for k in ("videos", "captions", "qa")}


def test_a_probe_part_rerun_is_skipped_and_a_changed_source_is_probed_again(raw_with_rejects, tmp_path):
    part = str(tmp_path / "probe")
    assert probe_part(raw_with_rejects, part, INGEST, 0, 2)["skipped"] is False
    written = os.stat(os.path.join(part, PROBES)).st_mtime_ns
    assert probe_part(raw_with_rejects, part, INGEST, 0, 2)["skipped"] is True
    assert os.stat(os.path.join(part, PROBES)).st_mtime_ns == written
    assert (
        probe_part(raw_with_rejects, part, IngestConfig(workers=1, progress=False, max_bytes=10**6), 0, 2)["skipped"]
        is False
    )  # other limits: other results possible, so probed again


def test_an_ingest_merge_refuses_an_incomplete_or_foreign_set(raw_with_rejects, tiny_world, tmp_path):
    parts = [str(tmp_path / f"probe-{i}") for i in range(3)]
    for i, part in enumerate(parts):
        probe_part(raw_with_rejects, part, INGEST, i, 3)
    with pytest.raises(ValueError, match="not one complete set"):
        ingest(raw_with_rejects, str(tmp_path / "m1"), INGEST, probes=parts[:2])
    with pytest.raises(ValueError, match=r"has no probes\.parquet"):
        ingest(raw_with_rejects, str(tmp_path / "m2"), INGEST, probes=[*parts[:2], str(tmp_path)])
    with pytest.raises(ValueError, match="other files or settings"):
        ingest(raw_with_rejects, str(tmp_path / "m3"), IngestConfig(workers=1, progress=False, max_bytes=9), parts)
    videos = os.path.join(raw_with_rejects, "videos.parquet")
    table = storage.read_parquet(videos)
    storage.write_parquet(videos, table.slice(1))  # one clip fewer: another list of files to probe
    with pytest.raises(ValueError, match="other files or settings"):
        ingest(raw_with_rejects, str(tmp_path / "m4"), INGEST, probes=parts)
    assert not os.path.exists(tmp_path / "m4")
    meta = json.loads(storage.read_parquet(os.path.join(parts[0], PROBES)).schema.metadata[b"vlp.probes"])
    assert (meta["index"], meta["count"], meta["files"]) == (0, 3, table.num_rows)


def test_the_cli_runs_parts_and_merges_for_both_steps(raw_with_rejects, tmp_path):
    def vlp(*args: str) -> dict:
        cmd = [sys.executable, "-m", "vlp.cli", *args, "--config", str(TINY_CONFIG), "ingest.workers=1"]
        done = subprocess.run([*cmd, "frames.workers=1"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    single_ds, single_fr = str(tmp_path / "ds"), str(tmp_path / "fr")
    vlp("ingest", "--source", raw_with_rejects, "--out", single_ds)
    vlp("extract-frames", "--dataset", single_ds, "--out", single_fr)
    probes = [str(tmp_path / f"probe-{i}") for i in range(2)]
    assert [vlp("ingest", "--source", raw_with_rejects, "--out", p, "--part", f"{i}/2")["part"]
            for i, p in enumerate(probes)] == [0, 1]  # fmt: skip
    merged_ds = str(tmp_path / "merged-ds")
    assert (
        vlp("ingest", "--source", raw_with_rejects, "--out", merged_ds, "--merge", probes[0], "--merge", probes[1])[
            "probe_parts"
        ]
        == 2
    )
    frames = [str(tmp_path / f"frames-{i}") for i in range(3)]
    for i, part in enumerate(frames):
        vlp("extract-frames", "--dataset", merged_ds, "--out", part, "--part", f"{i}/3")
    merged_fr = str(tmp_path / "merged-fr")
    merge = [arg for part in frames for arg in ("--merge", part)]
    assert vlp("extract-frames", "--dataset", merged_ds, "--out", merged_fr, *merge)["parts"] == 3
    drop = {"summary.json"}  # it records the run's own paths and seconds
    assert {k: v for k, v in all_bytes(merged_ds).items() if k not in drop} == {
        k: v for k, v in all_bytes(single_ds).items() if k not in drop
    }
    # the frame shards name their source files, which live in the same raw folder either way
    assert {k: v for k, v in all_bytes(merged_fr).items() if k not in drop} == {
        k: v for k, v in all_bytes(single_fr).items() if k not in drop
    }
    cmd = [sys.executable, "-m", "vlp.cli", "extract-frames", "--dataset", merged_ds, "--out", merged_fr]
    bad = subprocess.run([*cmd, "--part", "3/3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "0 <= I < N" in bad.stderr
