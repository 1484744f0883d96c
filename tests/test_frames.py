"""Frame extraction on real h264 mp4 files (tests/conftest.py write_mp4: frame i has grey level (i*10) % 250)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from conftest import write_mp4
from vlp import storage
from vlp.config import Config
from vlp.data import manifest, video
from vlp.data.frames import (
    FRAME_SCHEMA,
    INDEX_SCHEMA,
    CorruptClipError,
    FramesConfig,
    FrameStore,
    encode_frame,
    extract,
    load_video_frames,
    packet_plan,
    read_sparse,
    stored_indices,
)

TINY = {"size": 32, "progress": False, "workers": 1}


def grey(i: int) -> int:
    return (i * 10) % 250


def video_row(video_id: str, path: str, local: str | None = None, media: str = "video") -> dict:
    """A VIDEO_SCHEMA row, probed from the real file (``local`` when ``path`` is an s3:// URI)."""
    info = video.probe(local or path)
    return {
        "video_id": video_id, "path": path, "split": "train", "media": media, "source": "synth",
        "num_frames": info.num_frames, "fps": info.fps, "duration_s": info.duration_s,
        "width": info.width, "height": info.height, "size_bytes": os.path.getsize(local or path),
    }  # fmt: skip


def write_videos(dataset: str, rows: list[dict]) -> str:
    """Write ``rows`` as ingest would, recording the dataset's parent as the media root (the media lie beside it)."""
    root = {manifest.MEDIA_ROOT_KEY: dataset.rstrip("/").rsplit("/", 1)[0].encode()}
    table = manifest.from_rows(rows, manifest.VIDEO_SCHEMA)
    manifest.write(dataset, manifest.VIDEOS, table, manifest.VIDEO_SCHEMA, root)
    return dataset


def jpeg_means(table: pa.Table) -> list[float]:
    return [float(np.asarray(Image.open(io.BytesIO(b)).convert("L")).mean()) for b in table.column("jpeg").to_pylist()]


def all_bytes(root: str) -> dict[str, bytes]:
    return {os.path.relpath(u, root) if not storage.is_s3(u) else u[len(root) :]: storage.read_bytes(u)
            for u in storage.list_files(root)}  # fmt: skip


@pytest.fixture
def dataset(tmp_path: Path) -> str:
    """Three clips (48, 10 and 30 frames, g=6) and one still image."""
    rows = [
        video_row("a", str(write_mp4(tmp_path / "media/a.mp4", num_frames=48))),
        video_row("b", str(write_mp4(tmp_path / "media/b.mp4", num_frames=10))),
        video_row("c", str(write_mp4(tmp_path / "media/c.mp4", num_frames=30, size=(80, 40)))),
    ]
    img = tmp_path / "media/still.png"
    Image.fromarray(np.full((30, 50, 3), 77, np.uint8)).save(img)
    rows.append(video_row("d_img", str(img), media="image"))
    return write_videos(str(tmp_path / "dataset"), rows)


def test_stores_the_uniform_frames_with_indices_and_timestamps(dataset, tmp_path):
    out = str(tmp_path / "frames")
    summary = extract(dataset, out, FramesConfig(num_frames=4, **TINY))
    assert summary["stored_videos"] == 4 and summary["rejected"] == 0
    store = FrameStore(out)
    rows = store.rows("a").to_pylist()
    assert [r["slot"] for r in rows] == [0, 1, 2, 3]
    assert [r["frame_index"] for r in rows] == [6, 18, 30, 42] == stored_indices(48, 4)
    assert [r["timestamp_s"] for r in rows] == pytest.approx([i / 12 for i in (6, 18, 30, 42)])
    # the RIGHT frames: each decoded JPEG has the grey level of its source frame
    assert jpeg_means(store.rows("a")) == pytest.approx([grey(i) for i in (6, 18, 30, 42)], abs=3)
    frames = store.load("a")
    assert frames.shape == (4, 32, 32, 3) and frames.dtype == np.uint8


def test_a_clip_shorter_than_num_frames_stores_every_frame(dataset, tmp_path):
    out = str(tmp_path / "frames")
    extract(dataset, out, FramesConfig(num_frames=16, **TINY))
    rows = FrameStore(out).rows("b")
    assert rows.column("frame_index").to_pylist() == list(range(10))
    assert jpeg_means(rows) == pytest.approx([grey(i) for i in range(10)], abs=3)
    index = storage.read_parquet(os.path.join(out, "index.parquet"))
    assert index.schema.equals(INDEX_SCHEMA)
    by_id = {r["video_id"]: r for r in index.to_pylist()}
    assert (by_id["b"]["num_stored"], by_id["b"]["num_frames"], by_id["b"]["fps"]) == (10, 10, 12.0)
    assert (by_id["a"]["num_stored"], by_id["d_img"]["num_stored"], by_id["d_img"]["fps"]) == (16, 1, 0.0)


def test_still_image_stores_one_frame_and_the_loader_repeats_it(dataset, tmp_path):
    out = str(tmp_path / "frames")
    extract(dataset, out, FramesConfig(num_frames=8, **TINY))
    store = FrameStore(out)
    rows = store.rows("d_img").to_pylist()
    assert [(r["slot"], r["frame_index"], r["timestamp_s"]) for r in rows] == [(0, 0, 0.0)]
    clip = store.sample("d_img", 4, "rand", rng=0)
    assert clip.shape == (4, 32, 32, 3)
    assert np.abs(clip.astype(int) - 77).max() <= 3 and all((clip[i] == clip[0]).all() for i in range(4))


def write_banded_mp4(path: Path, num_frames: int = 6, size: tuple[int, int] = (64, 32)) -> Path:
    """A real h264 mp4 whose frames have a white band over their left fifth (black elsewhere): stretching keeps the
    band, a centre crop of the short side loses it."""
    width, height = size
    img = np.zeros((height, width, 3), np.uint8)
    img[:, : width // 5] = 255
    with av.open(str(path), "w") as container:
        stream = container.add_stream("h264", rate=12)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for _ in range(num_frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def test_each_resize_mode_stores_what_encode_frame_makes_of_the_decoded_frame(tmp_path):
    """The stored JPEGs are exactly ``encode_frame`` of the decoded source frames in the configured mode (so the mode
    reaches the encoder), and the two modes store different pixels of a frame whose sides differ."""
    src = write_banded_mp4(tmp_path / "band.mp4")
    dataset = write_videos(str(tmp_path / "ds"), [video_row("band", str(src))])
    loaded = {}
    for resize in ("stretch", "short_side_crop"):
        out = str(tmp_path / resize)
        extract(dataset, out, FramesConfig(num_frames=2, size=24, resize=resize, progress=False, workers=1))
        store = FrameStore(out)
        rows = store.rows("band").to_pylist()
        decoded = read_sparse(str(src), [r["frame_index"] for r in rows])
        for row, frame in zip(rows, decoded, strict=True):
            jpeg, width, height = encode_frame(frame, 24, resize, FramesConfig().jpeg_quality)
            assert row["jpeg"] == jpeg and (row["width"], row["height"]) == (width, height) == (24, 24)
        loaded[resize] = store.load("band")  # (2, 24, 24, 3)
    assert loaded["stretch"][:, :, :3].mean() > 200  # the band, squeezed to the left 4-5 columns
    assert loaded["short_side_crop"][:, :, :3].mean() < 30  # cropped away with the left of the frame


def test_stretch_keeps_the_whole_frame_and_crop_drops_the_sides():
    frame = np.zeros((50, 100, 3), np.uint8)
    frame[:, :20] = 255  # a white band on the left fifth
    stretched = np.asarray(Image.open(io.BytesIO(encode_frame(frame, 40, "stretch", 95)[0])))
    cropped_jpeg, w, h = encode_frame(frame, 40, "short_side_crop", 95)
    cropped = np.asarray(Image.open(io.BytesIO(cropped_jpeg)))
    assert stretched.shape == cropped.shape == (40, 40, 3) and (w, h) == (40, 40)
    assert stretched[:, :6].mean() > 240 and stretched[:, 12:].mean() < 10  # band kept, squeezed to 8 px
    assert cropped.max() < 10  # centre crop = original columns 25..75: no white left


def test_default_size_is_224_stretched(tmp_path):
    dataset = write_videos(str(tmp_path / "ds"), [video_row("a", str(write_mp4(tmp_path / "a.mp4")))])
    extract(dataset, str(tmp_path / "out"), FramesConfig(num_frames=2, progress=False, workers=1))
    assert load_video_frames(str(tmp_path / "out"), "a").shape == (2, 224, 224, 3)


def test_corrupt_and_missing_videos_go_to_rejects_and_the_rest_is_stored(dataset, tmp_path):
    rows = manifest.read(dataset, manifest.VIDEOS, manifest.VIDEO_SCHEMA).to_pylist()
    garbage = tmp_path / "media/garbage.mp4"
    garbage.write_bytes(os.urandom(4000))
    good = Path(rows[0]["path"]).read_bytes()
    truncated = tmp_path / "media/truncated.mp4"
    truncated.write_bytes(good[: len(good) // 3])
    rows += [
        {**rows[0], "video_id": "bad_garbage", "path": str(garbage)},
        {**rows[0], "video_id": "bad_missing", "path": str(tmp_path / "media/nope.mp4")},
        {**rows[0], "video_id": "bad_truncated", "path": str(truncated)},
    ]
    write_videos(dataset, rows)
    out = str(tmp_path / "frames")
    summary = extract(dataset, out, FramesConfig(num_frames=4, videos_per_shard=3, **TINY))
    assert summary["rejected"] == 3 and summary["stored_videos"] == 4
    rejects = manifest.read(out, manifest.REJECTS, manifest.REJECT_SCHEMA).to_pylist()
    assert [r["record_id"] for r in rejects] == ["bad_garbage", "bad_missing", "bad_truncated"]
    assert {r["stage"] for r in rejects} == {"extract_frames"} and all(r["reason"] for r in rejects)
    assert rejects[1]["reason"].startswith("missing file")
    assert rejects[0]["reason"].startswith("sparse: ") and "; decord: " in rejects[0]["reason"]  # every decoder tried
    assert len(rejects[0]["reason"]) <= 200
    store = FrameStore(out)
    assert store.video_ids == ["a", "b", "c", "d_img"]
    with pytest.raises(KeyError, match="bad_garbage"):
        store.load("bad_garbage")


def test_rerun_is_byte_identical_and_skips_existing_shards(dataset, tmp_path):
    out = str(tmp_path / "frames")
    cfg = FramesConfig(num_frames=4, videos_per_shard=2, **TINY)
    first = extract(dataset, out, cfg)
    assert (first["shards"], first["shards_written"]) == (2, 2)
    before = all_bytes(out)
    shards = set(storage.read_parquet(os.path.join(out, "index.parquet")).column("shard").to_pylist())
    assert sorted(before) == sorted(["index.parquet", "rejects.parquet", *shards])
    mtimes = {p: os.stat(os.path.join(out, p)).st_mtime_ns for p in before}
    second = extract(dataset, out, cfg)
    assert (second["shards_written"], second["shards_skipped"]) == (0, 2)
    assert all_bytes(out) == before
    assert {p: os.stat(os.path.join(out, p)).st_mtime_ns for p in before} == mtimes  # nothing rewritten
    # a deleted shard, alone, is redone - identically
    lost, kept = sorted(p for p in before if p.startswith("shards/"))
    os.remove(os.path.join(out, lost))
    third = extract(dataset, out, cfg)
    assert third["shards_written"] == 1
    assert all_bytes(out) == before
    assert os.stat(os.path.join(out, kept)).st_mtime_ns == mtimes[kept]


def test_changed_settings_never_reuse_a_shard_and_old_shards_are_pruned(dataset, tmp_path):
    out = str(tmp_path / "frames")
    extract(dataset, out, FramesConfig(num_frames=4, **TINY))
    old = set(storage.list_files(os.path.join(out, "shards")))
    summary = extract(dataset, out, FramesConfig(num_frames=4, jpeg_quality=50, **TINY))
    new = set(storage.list_files(os.path.join(out, "shards")))
    assert summary["shards_written"] == 1 and summary["shards_pruned"] == 1
    assert old.isdisjoint(new) and len(new) == 1
    meta = storage.read_parquet_metadata(next(iter(new)))[b"vlp.frames"]
    assert b'"jpeg_quality": 50' in meta


def test_shard_rows_and_metadata(dataset, tmp_path):
    out = str(tmp_path / "frames")
    extract(dataset, out, FramesConfig(num_frames=4, **TINY))
    (shard,) = storage.list_files(os.path.join(out, "shards"))
    assert Path(shard).name.startswith("shard-00000-") and len(Path(shard).stem.split("-")[-1]) == 8
    table = storage.read_parquet(shard)
    assert table.schema.remove_metadata().equals(FRAME_SCHEMA)
    assert table.column("video_id").to_pylist() == sorted(table.column("video_id").to_pylist())


def test_two_workers_write_the_same_bytes_as_one(dataset, tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    extract(dataset, one, FramesConfig(num_frames=4, videos_per_shard=1, **TINY))
    summary = extract(dataset, two, FramesConfig(num_frames=4, videos_per_shard=1, size=32, workers=2, progress=False))
    assert summary["shards_written"] == 4
    assert all_bytes(one) == all_bytes(two)


def test_s3_in_and_out_with_rerun_byte_identical(s3_bucket, tmp_path):
    rows = []
    for vid, n in [("s1", 36), ("s2", 20)]:
        local = write_mp4(tmp_path / f"{vid}.mp4", num_frames=n)
        uri = f"{s3_bucket}/media/{vid}.mp4"
        storage.upload(local, uri)
        rows.append(video_row(vid, uri, local=str(local)))
    rows.append({**rows[0], "video_id": "s3_missing", "path": f"{s3_bucket}/media/none.mp4"})
    dataset = write_videos(f"{s3_bucket}/dataset", rows)
    out = f"{s3_bucket}/frames"
    cfg = FramesConfig(num_frames=4, videos_per_shard=2, size=32, workers=2, progress=False)
    first = extract(dataset, out, cfg)
    assert (first["stored_videos"], first["rejected"], first["shards_written"]) == (2, 1, 2)
    before = all_bytes(out)
    assert extract(dataset, out, cfg)["shards_written"] == 0
    assert all_bytes(out) == before
    store = FrameStore(out)
    assert jpeg_means(store.rows("s1")) == pytest.approx([grey(i) for i in stored_indices(36, 4)], abs=3)
    assert manifest.read(out, manifest.REJECTS, manifest.REJECT_SCHEMA).column("record_id").to_pylist() == [
        "s3_missing"
    ]


def _clip_bytes(shard: str, group: int) -> int:
    """Bytes of one row group's column chunks in a shard: what reading that clip alone must cost."""
    meta = storage.parquet_footer(shard).metadata.row_group(group)
    return sum(meta.column(i).total_compressed_size for i in range(meta.num_columns))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_clip_read_costs_its_own_bytes(dataset, tmp_path, where, request):
    """One row group per clip: a clip is one ranged read of about its own bytes, after its shard's footer, which
    is read once (its exact size comes from the index) and then cached for the shard's other clips."""
    out = str(tmp_path / "frames") if where == "local" else request.getfixturevalue("s3_bucket") + "/frames"
    extract(dataset, out, FramesConfig(num_frames=4, videos_per_shard=4, **TINY))
    (shard,) = storage.list_files(storage.join(out, "shards"))
    footer = storage.parquet_footer(shard)
    assert footer.metadata.num_row_groups == 4  # a, b, c, d_img
    index = storage.read_parquet(storage.join(out, "index.parquet"))
    assert index["row_group"].to_pylist() == [0, 1, 2, 3]
    assert set(index["footer_bytes"].to_pylist()) == {footer.metadata.serialized_size + 8}
    store = FrameStore(out)
    storage.reset_read_stats()
    frames = store.load("c")
    first = storage.read_stats()
    assert frames.shape == (4, 32, 32, 3)
    row_group = footer.metadata.row_group(2)
    jpegs = row_group.column(FRAME_SCHEMA.get_field_index("jpeg")).total_compressed_size
    clip = first.bytes - (footer.metadata.serialized_size + 8)
    assert first.requests == 2  # the footer, then the clip
    assert jpegs <= clip <= _clip_bytes(shard, 2) <= 1.2 * jpegs
    storage.reset_read_stats()
    store.load("a")
    second = storage.read_stats()
    assert second.requests == 1 and second.bytes <= _clip_bytes(shard, 0)  # the footer is cached


def test_an_output_written_before_row_groups_per_clip_is_still_read(dataset, tmp_path):
    """FORMAT_VERSION 1 (one row group for a whole shard, an index without row_group): read a shard at a time."""
    import pyarrow.parquet as pq

    out = str(tmp_path / "frames")
    extract(dataset, out, FramesConfig(num_frames=4, **TINY))
    expected = {v: FrameStore(out).load(v) for v in ("a", "b", "c", "d_img")}
    (shard,) = storage.list_files(os.path.join(out, "shards"))
    pq.write_table(storage.read_parquet(shard), shard)  # one row group, as vlp wrote before
    index = storage.read_parquet(os.path.join(out, "index.parquet"))
    pq.write_table(index.drop_columns(["row_group", "footer_bytes"]), os.path.join(out, "index.parquet"))
    old = FrameStore(out)
    assert old.info("b")["row_group"] == -1
    for video_id, frames in expected.items():
        assert np.array_equal(old.load(video_id), frames)


def test_a_damaged_jpeg_names_the_clip_shard_and_slot(dataset, tmp_path):
    out = str(tmp_path / "frames")
    extract(dataset, out, FramesConfig(num_frames=4, **TINY))
    store = FrameStore(out)
    (shard,) = storage.list_files(os.path.join(out, "shards"))
    victim = store.rows("a", ["jpeg"]).column("jpeg")[2].as_py()
    data = Path(shard).read_bytes()
    assert data.count(victim) == 1
    Path(shard).write_bytes(data.replace(victim, b"\x00" * len(victim)))  # same size: the footer still holds
    fresh = FrameStore(out)
    assert fresh.load("a", [0, 1]).shape == (2, 32, 32, 3)  # the other frames still decode
    with pytest.raises(CorruptClipError, match=r"video 'a' \(shards/shard-00000-\w+\.parquet, slot 2\)"):
        fresh.load("a")


def test_an_index_that_disagrees_with_its_shard_is_refused(dataset, tmp_path):
    import pyarrow.parquet as pq

    out = str(tmp_path / "frames")
    extract(dataset, out, FramesConfig(num_frames=4, **TINY))
    index = storage.read_parquet(os.path.join(out, "index.parquet"))
    groups = index["row_group"].to_pylist()
    swapped = index.set_column(index.schema.get_field_index("row_group"), "row_group",
                               pa.array([groups[1], groups[0], *groups[2:]], pa.int32()))  # fmt: skip
    pq.write_table(swapped, os.path.join(out, "index.parquet"))
    with pytest.raises(CorruptClipError, match="the index and the shard disagree"):
        FrameStore(out).load("a")


def test_the_index_of_two_and_a_half_million_clips_is_a_few_arrays(tmp_path):
    """WebVid-2.5M's index: no Python object per clip; memory per clip stated by bytes_per_clip and bounded."""
    import pyarrow.parquet as pq

    n = 2_500_000
    ids = pa.array(np.char.add("webvid_", np.arange(n).astype("U8")).tolist())
    shards = pa.array([f"shards/shard-{i:05d}-0123abcd.parquet" for i in range(n // 64 + 1)])
    index = pa.table(
        {
            "video_id": ids,
            "shard": pa.DictionaryArray.from_arrays(pa.array(np.arange(n) // 64, pa.int32()), shards),
            "num_stored": pa.array(np.full(n, 16), pa.int64()),
            "num_frames": pa.array(np.full(n, 300), pa.int64()),
            "fps": pa.array(np.full(n, 30.0)),
            "row_group": pa.array(np.arange(n) % 64, pa.int32()),
            "footer_bytes": pa.array(np.full(n, 30_000), pa.int32()),
        }
    )
    os.makedirs(tmp_path / "frames")
    pq.write_table(index.cast(INDEX_SCHEMA), tmp_path / "frames/index.parquet")
    store = FrameStore(str(tmp_path / "frames"))
    assert len(store) == n
    assert store.bytes_per_clip <= 48  # 15-byte ids + 32 bytes of counts and codes + the shard names
    info = store.info("webvid_1234567")
    assert info["shard"] == "shards/shard-19290-0123abcd.parquet" and info["row_group"] == 7
    found = store.positions(["webvid_0", "nope", "webvid_2499999"])
    assert found[1] == -1 and min(found[0], found[2]) >= 0 and "webvid_2499999" in store and "webvid_x" not in store
    assert store.shard_of(["webvid_63", "webvid_64"]).tolist() == [0, 1]


def test_step_writes_a_summary(dataset, tmp_path):
    from vlp.steps.extract_frames import extract_frames

    out = str(tmp_path / "frames")
    summary = extract_frames(dataset, out, Config(frames=FramesConfig(num_frames=2, **TINY)))
    assert summary["step"] == "extract_frames" and summary["stored_frames"] == 2 + 2 + 2 + 1
    assert storage.exists(os.path.join(out, "summary.json"))


def test_cli_runs_the_step_and_rejects_a_bad_setting(dataset, tmp_path):
    out = str(tmp_path / "frames")
    cmd = [sys.executable, "-m", "vlp.cli", "extract-frames", "--dataset", dataset, "--out", out]
    ok = subprocess.run(
        [*cmd, "frames.num_frames=3", "frames.size=16", "frames.workers=1"], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["stored_frames"] == 3 + 3 + 3 + 1
    assert FrameStore(out).load("c").shape == (3, 16, 16, 3)
    bad = subprocess.run([*cmd, "frames.resize=pad"], capture_output=True, text=True)
    assert bad.returncode == 2 and "frames.resize" in bad.stderr


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("jpeg_quality", 0, "jpeg_quality"), ("num_frames", 0, "num_frames"), ("resize", "pad", "resize")],
)
def test_bad_settings_are_rejected_up_front(dataset, tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        extract(dataset, str(tmp_path / "frames"), FramesConfig(**{field: value}))


def test_a_dataset_with_no_videos_gives_an_empty_index(tmp_path):
    dataset = write_videos(str(tmp_path / "ds"), [])
    out = str(tmp_path / "frames")
    summary = extract(dataset, out, FramesConfig(**TINY))
    assert (summary["videos"], summary["stored_frames"], summary["shards"], summary["rejected"]) == (0, 0, 0, 0)
    assert len(FrameStore(out)) == 0
    assert manifest.read(out, manifest.REJECTS, manifest.REJECT_SCHEMA).num_rows == 0


def test_duplicate_video_ids_are_an_input_error(dataset, tmp_path):
    rows = manifest.read(dataset, manifest.VIDEOS, manifest.VIDEO_SCHEMA).to_pylist()
    write_videos(dataset, [*rows, rows[0]])
    with pytest.raises(ValueError, match="duplicate video_id"):
        extract(dataset, str(tmp_path / "frames"), FramesConfig(**TINY))


def test_every_decoder_writes_the_same_bytes(dataset, tmp_path):
    outs = {d: str(tmp_path / d) for d in ("sparse", "decord", "pyav")}
    for decoder, out in outs.items():
        extract(dataset, out, FramesConfig(num_frames=5, decoder=decoder, **TINY))
    assert all_bytes(outs["sparse"]) == all_bytes(outs["decord"]) == all_bytes(outs["pyav"])


def test_sparse_decoder_needs_no_fallback_on_good_files(dataset, tmp_path, monkeypatch):
    def no_fallback(*args, **kwargs):
        raise AssertionError("fallback decoder used")

    for name in video.BACKENDS:  # the fallbacks decode_frames tries after read_sparse
        monkeypatch.setitem(video.BACKENDS, name, no_fallback)
    assert extract(dataset, str(tmp_path / "frames"), FramesConfig(num_frames=4, **TINY))["rejected"] == 0


def test_when_the_sparse_reader_fails_the_fallback_decodes_the_file(dataset, tmp_path, monkeypatch):
    import vlp.data.frames.decode as frames_module

    def broken(*args, **kwargs):
        raise av.error.InvalidDataError(1094995529, "simulated sparse failure")

    monkeypatch.setattr(frames_module, "read_sparse", broken)
    out = str(tmp_path / "frames")
    assert extract(dataset, out, FramesConfig(num_frames=4, **TINY))["rejected"] == 0
    assert jpeg_means(FrameStore(out).rows("a")) == pytest.approx([grey(i) for i in (6, 18, 30, 42)], abs=3)


# --------------------------------------------------------------------------- the sparse reader


def write_bframe_mp4(path: Path, num_frames: int, gop: int) -> Path:
    """A clip with B-frames (libx264 defaults) and a keyframe every ``gop`` frames; frame i has grey (i*10)%250."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.options = {"g": str(gop), "bf": "3"}
        for i in range(num_frames):
            img = np.full((48, 64, 3), grey(i), np.uint8)
            img[:, (i * 3) % 64] = 255  # a moving line, so P and B frames carry real motion
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.mark.parametrize("gop", [6, 25, 250])
@pytest.mark.parametrize("indices", [[0], [5, 17, 40, 79], stored_indices(80, 16), [79], [3, 4, 5, 6, 7]])
def test_sparse_reader_returns_exactly_what_decord_returns(tmp_path, gop, indices):
    path = str(write_bframe_mp4(tmp_path / "clip.mp4", 80, gop))
    sparse = read_sparse(path, indices)
    assert np.array_equal(sparse, video.BACKENDS["decord"](path, indices))
    assert np.array_equal(sparse, video.BACKENDS["pyav"](path, indices))


def test_sparse_reader_demuxes_twice_for_large_files(tmp_path, monkeypatch):
    import vlp.data.frames.decode as frames_module

    path = str(write_bframe_mp4(tmp_path / "clip.mp4", 60, 20))
    indices = stored_indices(60, 8)
    in_memory = read_sparse(path, indices)
    monkeypatch.setattr(frames_module, "_KEEP_PACKETS_BYTES", 0)
    assert np.array_equal(read_sparse(path, indices), in_memory)
    assert np.array_equal(in_memory, video.BACKENDS["decord"](path, indices))


def test_sparse_reader_rejects_out_of_range_indices(tmp_path):
    path = str(write_mp4(tmp_path / "clip.mp4", num_frames=12))
    with pytest.raises(video.VideoError, match="out of range"):
        read_sparse(path, [3, 12])


def test_packet_plan_skips_gops_without_wanted_frames_and_gop_tails():
    # decode order, closed GOPs of 4: I P B B | I P B B | I P B B ; pts are display positions
    pts = [0, 3, 1, 2, 4, 7, 5, 6, 8, 11, 9, 10]
    key = [True, False, False, False] * 3
    send, wanted_pts = packet_plan(pts, key, [5])
    assert wanted_pts == {5}
    assert send == [False] * 4 + [True, True, True, False] + [False] * 4  # I(4) P(7) B(5), nothing else


def test_packet_plan_keeps_the_previous_gop_for_an_open_gop_leading_picture():
    # second GOP starts with I at pts 6; B at pts 4, 5 are leading pictures that may reference GOP 1
    pts = [0, 3, 1, 2, 6, 4, 5, 7]
    key = [True, False, False, False, True, False, False, False]
    send, _ = packet_plan(pts, key, [4])
    assert send == [True] * 6 + [False] * 2
    assert packet_plan(pts, key, [7])[0] == [False] * 4 + [True] * 4  # pts 7 is not a leading picture
