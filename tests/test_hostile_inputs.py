"""Hostile and malformed inputs, round 2 (issue 22): one record's defect is that record's reject, whatever the format.

Real files through the real steps: NUL bytes and control characters in paths, ids given to two files, text too
large to train on, a still image under a video name, and a dataset edited after ingest to point elsewhere.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from conftest import put, write_mp4
from vlp import cli, storage
from vlp.data import manifest
from vlp.data.frames import FramesConfig, FrameStore, extract
from vlp.data.ingest import IngestConfig, ingest

ROOT = Path(__file__).resolve().parents[1]
CFG = IngestConfig(workers=1, progress=False, split="train")
NUL = "bad\x00name"


def rejects(out: Path, kind: str = "video") -> dict[str, str]:
    rows = storage.read_parquet(str(out / manifest.REJECTS)).to_pylist()
    return {r["record_id"]: r["reason"] for r in rows if r["kind"] == kind}


def accepted(out: Path, name: str = manifest.VIDEOS) -> list[dict]:
    return storage.read_parquet(str(out / name)).to_pylist()


def lost(summary: dict) -> int:
    return sum(abs(c["input"] - c["accepted"] - c["rejected"]) for c in (summary[k] for k in ("videos", "captions")))


# --------------------------------------------------------------------------- unusable paths


def _annotations(fmt: str, root: Path, bad_path: str) -> Path:
    """An annotation file of ``fmt`` naming good.mp4 and one video whose path is ``bad_path``."""
    stem = bad_path.removesuffix(".mp4")
    if fmt == "lavis":
        recs = [{"video": "good.mp4", "caption": "a good clip"}, {"video": bad_path, "caption": "a bad path"}]
        return put(root / "ann.json", json.dumps(recs))
    if fmt == "msrvtt":
        recs = [{"video_id": "good", "caption": "a good clip"}, {"video_id": "bad", "video": bad_path, "caption": "x"}]
        return put(root / "ann.json", json.dumps(recs))
    if fmt == "alpro":
        lines = [{"clip_name": "good", "caption": "a good clip"}, {"clip_name": stem, "caption": "a bad path"}]
        return put(root / "ann.jsonl", "\n".join(json.dumps(r) for r in lines))
    assert fmt == "webvid"
    return put(root / "ann.csv", f'videoid,name,page_dir\ngood,a good clip,\n"{stem}",a bad path,\n')


@pytest.mark.parametrize("fmt", ["lavis", "msrvtt", "alpro", "webvid"])
@pytest.mark.parametrize("bad", [f"{NUL}.mp4", "line\nbreak.mp4", "x" * 300 + ".mp4"], ids=["nul", "newline", "long"])
def test_an_unusable_path_is_its_records_reject_in_every_format(tmp_path, clip_bytes, fmt, bad):
    put(tmp_path / "good.mp4", clip_bytes)
    ann = _annotations(fmt, tmp_path, bad)

    summary = ingest(str(ann), str(tmp_path / "out"), CFG)

    assert [v["video_id"] for v in accepted(tmp_path / "out")] == ["good"]
    assert summary["videos"]["accepted"] == 1 and lost(summary) == 0
    (reason,) = rejects(tmp_path / "out").values()
    assert reason.startswith("unusable path: ") and reason.endswith(manifest.path_problem(bad)), reason


def test_a_nul_byte_in_a_raw_videos_parquet_path_rejects_that_row_through_the_cli(tmp_path, clip_bytes, capsys):
    src = tmp_path / "src"
    put(src / "videos" / "good.mp4", clip_bytes)
    row = {"split": "train", "media": "video", "source": "synth"}
    videos = [row | {"video_id": "good", "path": "videos/good.mp4"}, row | {"video_id": "bad", "path": f"{NUL}.mp4"}]
    captions = [{"video_id": v, "caption_id": f"{v}#0", "caption": "words", "split": "train"} for v in ("good", "bad")]
    manifest.write(str(src), manifest.VIDEOS, manifest.from_rows(videos, manifest.RAW_VIDEO_SCHEMA),
                   manifest.RAW_VIDEO_SCHEMA)  # fmt: skip
    storage.write_parquet(str(src / manifest.CAPTIONS), manifest.from_rows(captions, manifest.CAPTION_SCHEMA))

    code = cli.main(["ingest", "--source", str(src), "--out", str(tmp_path / "out"), "ingest.progress=false"])

    assert code == 0, capsys.readouterr().err
    assert rejects(tmp_path / "out")["bad"] == "unusable path: 'bad\\x00name.mp4' contains a NUL byte"
    assert rejects(tmp_path / "out", "caption")["bad#0"].startswith("video rejected: unusable path")


def test_path_problem_names_each_class():
    assert manifest.path_problem("videos/a.mp4") is None
    assert manifest.path_problem("s3://b/" + "k/" * 400) is None  # 802 bytes: within S3's 1024
    assert manifest.path_problem("a\x00b") == "contains a NUL byte"
    assert manifest.path_problem("a\x1bb") == "contains the control character '\\x1b'"
    assert manifest.path_problem("a\x85b") == "contains the control character '\\x85'"  # C1 NEL
    assert manifest.path_problem("a\u2028b") == "contains the control character '\\u2028'"
    assert manifest.path_problem("caf\u00e9/\u6620\u50cf.mp4") is None  # letters of any script are fine
    assert "not valid UTF-8" in manifest.path_problem("caf\udce9")
    assert "1025 bytes" in manifest.path_problem("a" * 1025)
    assert "256 bytes" in manifest.path_problem("d/" + "a" * 256)
    assert "not text" in manifest.path_problem(7)
    with pytest.raises(manifest.UnusablePathError, match="unusable path"):
        manifest.resolve_inside("s3://b/root", "k\x00.mp4")


def test_a_nul_byte_in_model_json_checkpoint_is_a_clear_error(tmp_path):
    from vlp.models import directory

    (tmp_path / "m").mkdir()
    doc = {"format": directory.FORMAT, "kind": "alpro", "checkpoint": "weights\x00.safetensors", "config": {}}
    (tmp_path / "m" / directory.MODEL_JSON).write_text(json.dumps(doc))
    with pytest.raises(manifest.UnusablePathError, match=r"model\.json: checkpoint: unusable path: .* NUL byte"):
        directory.describe(str(tmp_path / "m"))


# --------------------------------------------------------------------------- duplicate ids


def test_an_id_given_to_two_files_rejects_both_and_their_captions(tmp_path, clip_bytes):
    put(tmp_path / "one" / "a.mp4", clip_bytes)
    put(tmp_path / "two" / "a.mp4", clip_bytes[:-10])  # different media under the same id
    put(tmp_path / "b.mp4", clip_bytes)
    recs = [
        {"video_id": "a", "video": "one/a.mp4", "caption": "the first file"},
        {"video_id": "a", "video": "two/a.mp4", "caption": "the second file"},
        {"video_id": "a", "video": "one/a.mp4", "caption": "the first file again"},
        {"video_id": "b", "caption": "unrelated"},
        {"video_id": "b", "video": "b.mp4", "caption": "the same file, named"},
    ]
    ann = put(tmp_path / "ann.json", json.dumps(recs))

    summary = ingest(str(ann), str(tmp_path / "out"), CFG)

    assert summary["videos"] == {"input": 3, "accepted": 1, "rejected": 2}
    assert summary["captions"] == {"input": 5, "accepted": 2, "rejected": 3}
    assert summary["reject_reasons"]["duplicate video_id"] == 2
    reasons = storage.read_parquet(str(tmp_path / "out" / manifest.REJECTS)).to_pylist()
    video_reasons = {r["path"]: r["reason"] for r in reasons if r["kind"] == "video"}
    one, two = str(tmp_path / "one" / "a.mp4"), str(tmp_path / "two" / "a.mp4")
    assert video_reasons == {one: f"duplicate video_id: 'a' also names {two!r}",
                             two: f"duplicate video_id: 'a' also names {one!r}"}  # fmt: skip
    assert all(r["reason"].startswith("video rejected: duplicate video_id") for r in reasons if r["kind"] == "caption")
    assert [c["caption"] for c in accepted(tmp_path / "out", manifest.CAPTIONS)] == [
        "unrelated",
        "the same file, named",
    ]


def test_one_file_named_two_ways_is_one_video_not_a_duplicate(tmp_path, clip_bytes):
    put(tmp_path / "v" / "a.mp4", clip_bytes)
    recs = [
        {"video_id": "a", "video": p, "caption": f"c{i}"} for i, p in enumerate(["v/a.mp4", "./v/a.mp4", "v//a.mp4"])
    ]
    summary = ingest(str(put(tmp_path / "ann.json", json.dumps(recs))), str(tmp_path / "out"), CFG)
    assert summary["videos"] == {"input": 1, "accepted": 1, "rejected": 0}
    assert [v["path"] for v in accepted(tmp_path / "out")] == [str(tmp_path / "v" / "a.mp4")]
    assert summary["captions"]["accepted"] == 3


def test_webvid_rows_that_give_one_id_two_page_dirs_are_rejects(tmp_path, clip_bytes):
    put(tmp_path / "p1" / "7.mp4", clip_bytes)
    put(tmp_path / "p2" / "7.mp4", clip_bytes)
    ann = put(tmp_path / "ann.csv", "videoid,name,page_dir\n7,first,p1\n7,second,p2\n")

    summary = ingest(str(ann), str(tmp_path / "out"), CFG)

    assert summary["videos"] == {"input": 2, "accepted": 0, "rejected": 2} and lost(summary) == 0


# --------------------------------------------------------------------------- text limits


def _lavis(tmp_path: Path, clip_bytes: bytes, captions: list[str], qa: list[tuple[str, str]] = ()) -> Path:
    put(tmp_path / "v.mp4", clip_bytes)
    recs = [{"video": "v.mp4", "caption": c} for c in captions]
    if qa:
        return put(tmp_path / "qa.json", json.dumps([{"video": "v.mp4", "question": q, "answer": a} for q, a in qa]))
    return put(tmp_path / "ann.json", json.dumps(recs))


def test_a_ten_megabyte_caption_is_a_reject_and_the_rest_of_the_video_stays(tmp_path, clip_bytes):
    ann = _lavis(tmp_path, clip_bytes, ["a red circle", "x" * 10_000_000, "a blue square"])

    summary = ingest(str(ann), str(tmp_path / "out"), CFG)

    assert summary["captions"] == {"input": 3, "accepted": 2, "rejected": 1}
    assert rejects(tmp_path / "out", "caption") == {
        "v#1": "text too long: caption of 10000000 characters > ingest.max_caption_chars=2000"
    }


def test_question_and_answer_limits(tmp_path, clip_bytes):
    ann = _lavis(tmp_path, clip_bytes, [], qa=[("what?", "red"), ("q" * 1001, "red"), ("what?", "a" * 201)])

    summary = ingest(str(ann), str(tmp_path / "out"), CFG)

    assert summary["qa"] == {"input": 3, "accepted": 1, "rejected": 2}
    assert sorted(r.split(" of ")[0] + " " + r.rsplit(" ", 1)[1] for r in rejects(tmp_path / "out", "qa").values()) == [
        "text too long: answer ingest.max_answer_chars=200",
        "text too long: question ingest.max_question_chars=1000",
    ]


def test_captions_per_video_and_words_are_limited(tmp_path, clip_bytes):
    caps = [f"caption number {i}" for i in range(5)] + ["one two three four five six"]
    ann = _lavis(tmp_path, clip_bytes, caps)
    cfg = IngestConfig(workers=1, progress=False, split="train", max_captions_per_video=3, max_caption_words=5)

    summary = ingest(str(ann), str(tmp_path / "out"), cfg)

    assert [c["caption"] for c in accepted(tmp_path / "out", manifest.CAPTIONS)] == caps[:3]
    assert rejects(tmp_path / "out", "caption") == {
        "v#3": "too many captions: 'v' has more than ingest.max_captions_per_video=3",
        "v#4": "too many captions: 'v' has more than ingest.max_captions_per_video=3",
        "v#5": "text too long: caption of 6 words > ingest.max_caption_words=5",
    }
    assert lost(summary) == 0


def test_albef_cleaning_truncates_instead_of_rejecting(tmp_path, clip_bytes):
    long_caption = "A Red-Circle, moving: " + " ".join(f"w{i}" for i in range(40))
    ann = _lavis(tmp_path, clip_bytes, [long_caption, "?!.,"])
    cfg = IngestConfig(workers=1, progress=False, split="train", caption_clean=True)

    summary = ingest(str(ann), str(tmp_path / "out"), cfg)

    (kept,) = [c["caption"] for c in accepted(tmp_path / "out", manifest.CAPTIONS)]
    assert kept == "a red circle moving " + " ".join(f"w{i}" for i in range(26))  # 30 words, as ALBEF's code
    assert rejects(tmp_path / "out", "caption") == {"v#1": "empty caption: nothing left after ingest.caption_clean"}
    assert summary["captions"]["rejected"] == 1


def test_negative_text_limits_are_config_errors(tmp_path, clip_bytes):
    ann = _lavis(tmp_path, clip_bytes, ["x"])
    with pytest.raises(ValueError, match="max_caption_chars"):
        ingest(str(ann), str(tmp_path / "out"), IngestConfig(split="train", max_caption_chars=-1))
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- what a file is


def test_a_png_renamed_mp4_is_a_reject_and_a_png_is_a_still_image(tmp_path, clip_bytes):
    put(tmp_path / "good.mp4", clip_bytes)
    Image.fromarray(np.full((24, 32, 3), 90, np.uint8)).save(tmp_path / "still.png")
    put(tmp_path / "fake.mp4", (tmp_path / "still.png").read_bytes())
    Image.fromarray(np.full((24, 32, 3), 90, np.uint8)).save(tmp_path / "photo.jpg")
    put(tmp_path / "fake2.mp4", (tmp_path / "photo.jpg").read_bytes())
    recs = [{"video": n, "caption": "c"} for n in ("good.mp4", "still.png", "fake.mp4", "fake2.mp4")]
    ann = put(tmp_path / "ann.json", json.dumps(recs))

    summary = ingest(str(ann), str(tmp_path / "out"), CFG)

    got = {v["video_id"]: (v["media"], v["num_frames"]) for v in accepted(tmp_path / "out")}
    assert got == {"good": ("video", 24), "still": ("image", 1)}
    found = rejects(tmp_path / "out")
    assert found["fake"].startswith("not a video: a still image (png, read by ffmpeg's png_pipe demuxer)")
    assert found["fake2"].startswith("not a video: a still image (mjpeg")
    assert summary["videos"]["rejected"] == 2


def _frames(n: int) -> list[Image.Image]:
    return [Image.fromarray(np.full((24, 32, 3), 40 * i, np.uint8)) for i in range(n)]


def test_a_video_has_two_frames_and_a_duration_whatever_the_container(tmp_path, clip_bytes):
    """A one-frame GIF or h264 mp4 is not a video; an animated GIF is; an animated WebP under a video name (which
    ffmpeg reads as one picture) is refused as what it is, not as a still image."""
    one, five = _frames(1), _frames(5)
    one[0].save(tmp_path / "one_gif.mp4", format="GIF")
    five[0].save(tmp_path / "anim_gif.mp4", format="GIF", save_all=True, append_images=five[1:], duration=100)
    five[0].save(tmp_path / "anim_webp.mp4", format="WEBP", save_all=True, append_images=five[1:], duration=100)
    write_mp4(tmp_path / "one_h264.mp4", num_frames=1)
    put(tmp_path / "good.mp4", clip_bytes)
    names = ["good", "one_gif", "anim_gif", "anim_webp", "one_h264"]
    ann = put(tmp_path / "ann.json", json.dumps([{"video": f"{n}.mp4", "caption": "c"} for n in names]))

    summary = ingest(str(ann), str(tmp_path / "out"), CFG)

    got = {v["video_id"]: (v["media"], v["num_frames"]) for v in accepted(tmp_path / "out")}
    assert got == {"good": ("video", 24), "anim_gif": ("video", 5)}
    found, rule = rejects(tmp_path / "out"), "a video has at least 2 frames and a positive duration"
    assert found["one_gif"].startswith("not a video: a GIF image, 1 frame and ") and rule in found["one_gif"]
    assert found["one_h264"].startswith("not a video: a h264 stream in ffmpeg's mov,mp4") and rule in found["one_h264"]
    assert found["anim_webp"].startswith("not a video: an animated WEBP image of 5 frames under a video name")
    assert "still image" not in found["anim_webp"]
    assert summary["videos"]["rejected"] == 3 and lost(summary) == 0


# --------------------------------------------------------------------------- later steps re-check manifest paths


def test_extract_frames_rechecks_paths_of_a_dataset_edited_after_ingest(tmp_path, clip_bytes, monkeypatch):
    put(tmp_path / "raw" / "a.mp4", clip_bytes)
    put(tmp_path / "raw" / "b.mp4", clip_bytes)
    secret = write_mp4(tmp_path / "elsewhere" / "secret.mp4")
    ann = put(tmp_path / "raw" / "ann.json", json.dumps([{"video": f"{n}.mp4", "caption": n} for n in "ab"]))
    ingest(str(ann), str(tmp_path / "ds"), CFG)
    table = storage.read_parquet(str(tmp_path / "ds" / manifest.VIDEOS))
    paths = table["path"].to_pylist()
    edited = table.set_column(1, "path", pa.array([paths[0], str(secret)]))  # keeps the recorded media root
    storage.write_parquet(str(tmp_path / "ds" / manifest.VIDEOS), edited)
    opened: list[str] = []
    real = storage.local_copy
    monkeypatch.setattr(storage, "local_copy", lambda uri: opened.append(uri) or real(uri))

    cfg = FramesConfig(num_frames=2, size=32, progress=False, workers=1)
    summary = extract(str(tmp_path / "ds"), str(tmp_path / "frames"), cfg)

    assert (summary["stored_videos"], summary["rejected"]) == (1, 1)
    assert opened == [paths[0]]
    (row,) = storage.read_parquet(str(tmp_path / "frames" / manifest.REJECTS)).to_pylist()
    assert row["record_id"] == "b" and row["reason"].startswith("path outside its root:")


def test_a_dataset_that_records_no_media_root_is_refused_whole_when_its_paths_leave_it(tmp_path, clip_bytes):
    """A videos.parquet written by an older vlp (absolute paths into the source, no recorded root): one clear error
    that says to re-run ingest, not a reject for every clip. Relative paths inside the dataset still work."""
    put(tmp_path / "raw" / "a.mp4", clip_bytes)
    ann = put(tmp_path / "raw" / "ann.json", json.dumps([{"video": "a.mp4", "caption": "a"}]))
    ingest(str(ann), str(tmp_path / "ds"), CFG)
    videos = tmp_path / "ds" / manifest.VIDEOS
    storage.write_parquet(str(videos), storage.read_parquet(str(videos)).replace_schema_metadata(None))
    cfg = FramesConfig(num_frames=2, size=32, progress=False, workers=1)
    with pytest.raises(manifest.ManifestError, match=r"records no media root .* re-run `vlp ingest`"):
        extract(str(tmp_path / "ds"), str(tmp_path / "frames"), cfg)
    assert not (tmp_path / "frames").exists()
    put(tmp_path / "ds" / "media" / "a.mp4", clip_bytes)
    table = storage.read_parquet(str(videos))
    storage.write_parquet(str(videos), table.set_column(1, "path", pa.array(["media/a.mp4"])))
    assert extract(str(tmp_path / "ds"), str(tmp_path / "frames"), cfg)["stored_videos"] == 1


def test_a_shard_is_named_anew_when_its_paths_are_refused(tmp_path, clip_bytes):
    """Shard names cover the verdict on each path: a clip refused under one media root and opened under another
    never share a shard file, so a rerun cannot keep a shard written under the other verdict."""
    from vlp.data.frames import _plan_shards

    put(tmp_path / "raw" / "a.mp4", clip_bytes)
    ann = put(tmp_path / "raw" / "ann.json", json.dumps([{"video": "a.mp4", "caption": "a"}]))
    ingest(str(ann), str(tmp_path / "ds"), CFG)
    table, cfg = manifest.read(str(tmp_path / "ds"), manifest.VIDEOS, manifest.VIDEO_SCHEMA), FramesConfig(size=32)
    opened = _plan_shards(table, str(tmp_path / "ds"), cfg)
    elsewhere = table.replace_schema_metadata({manifest.MEDIA_ROOT_KEY: b"/elsewhere"})
    refused = _plan_shards(elsewhere, str(tmp_path / "ds"), cfg)
    assert not opened[0].tasks[0].problem
    assert refused[0].tasks[0].problem.startswith("path outside its root")
    assert opened[0].name != refused[0].name


def test_a_frame_index_naming_a_shard_outside_its_store_is_refused(tmp_path, clip_bytes):
    put(tmp_path / "raw" / "a.mp4", clip_bytes)
    ann = put(tmp_path / "raw" / "ann.json", json.dumps([{"video": "a.mp4", "caption": "a"}]))
    ingest(str(ann), str(tmp_path / "ds"), CFG)
    out = tmp_path / "frames"
    extract(str(tmp_path / "ds"), str(out), FramesConfig(num_frames=2, size=32, progress=False, workers=1))
    assert FrameStore(str(out)).load("a").shape == (2, 32, 32, 3)
    index = storage.read_parquet(str(out / "index.parquet"))
    for shard in ("../../etc/passwd", "shards/x.parquet", f"shards/{NUL}.parquet"):
        storage.write_parquet(str(out / "index.parquet"), index.set_column(1, "shard", pa.array([shard])))
        with pytest.raises(manifest.ManifestError, match="not a shard name"):
            FrameStore(str(out))


def test_an_s3_key_with_a_nul_byte_is_a_reject_not_a_request(tmp_path, clip_bytes, s3_bucket):
    storage.upload(put(tmp_path / "good.mp4", clip_bytes), f"{s3_bucket}/raw/good.mp4")
    recs = [{"video": "good.mp4", "caption": "c"}, {"video": f"{NUL}.mp4", "caption": "c"}]
    storage.write_text(f"{s3_bucket}/raw/ann.json", json.dumps(recs))

    summary = ingest(f"{s3_bucket}/raw/ann.json", f"{s3_bucket}/out", CFG)

    assert (summary["videos"]["accepted"], summary["videos"]["rejected"]) == (1, 1)
    (reason,) = rejects_s3(f"{s3_bucket}/out").values()
    assert reason == "unusable path: 'bad\\x00name.mp4' contains a NUL byte"


def rejects_s3(out: str) -> dict[str, str]:
    rows = storage.read_parquet(storage.join(out, manifest.REJECTS)).to_pylist()
    return {r["record_id"]: r["reason"] for r in rows if r["kind"] == "video"}


# --------------------------------------------------------------------------- text that is not text


@pytest.mark.parametrize("command", ["search", "answer"])
def test_arguments_that_are_not_utf8_are_refused_in_one_line(tmp_path, command):
    """Real argv bytes (not UTF-8) through a real process: exit 2 and one line, before anything is loaded."""
    import subprocess
    import sys

    where = str(tmp_path).encode()
    args = {"search": [b"search", b"--index", where, b"a \xff star"],
            "answer": [b"answer", b"--model", where, b"clip.mp4", b"what \xc3\x28 is it?"]}  # fmt: skip
    done = subprocess.run([sys.executable.encode(), b"-m", b"vlp.cli", *args[command]], capture_output=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
    where = {"search": "query is not valid UTF-8: the byte 0xff at character 2", "answer":
             "question is not valid UTF-8: the byte 0xc3 at character 5"}[command]  # fmt: skip
    assert (done.returncode, done.stderr.decode()) == (2, f"vlp {command}: error: the argument {where} is not text\n")
    assert done.stdout == b""


def test_the_cli_takes_the_servers_length_limit_from_one_config_value(tmp_path, capsys):
    for argv, said in [
        (["search", "--index", str(tmp_path), "six ch", "index.max_text_chars=5"],
         "the query is 6 characters long; at most 5 are taken (index.max_text_chars)"),
        (["answer", "--model", str(tmp_path), "clip.mp4", "x" * 1001],
         "the question is 1001 characters long; at most 1000 are taken (index.max_text_chars)"),
        (["search", "--index", str(tmp_path), "   "], "the query is empty: give the text to search for"),
        (["search", "--index", str(tmp_path), "star", "retrieval.split=\udcff"],
         "the argument overrides is not valid UTF-8: the byte 0xff at character 16 is not text"),
    ]:  # fmt: skip
        assert cli.main(argv) == 2
        assert capsys.readouterr().err == f"vlp {argv[0]}: error: {said}\n"


def test_text_problem_names_each_class():
    from vlp.text import TextError, checked_text, text_problem

    assert text_problem("caf\u00e9 \u6620\u50cf \U0001f3ac") is None  # any script, emoji included
    assert text_problem("a\udc80") == "is not valid UTF-8: the byte 0x80 at character 1 is not text"
    assert text_problem("\ud83c") == "is not valid UTF-8: a lone surrogate U+D83C at character 0"
    assert text_problem(b"bytes") == "is a bytes, not text"
    assert text_problem("abcd", 3) == "is 4 characters long; at most 3 are taken (index.max_text_chars)"
    assert text_problem("abc", 3) is None and text_problem("x" * 5000, 0) is None
    with pytest.raises(TextError, match="the question is empty: give the question to answer"):
        checked_text("\t \n", "question")
    assert checked_text(" a star ") == " a star "


# --------------------------------------------------------------------------- links out of a store


def test_a_checkpoint_with_a_link_is_refused_before_anything_is_restored(tmp_path):
    import torch

    from vlp.train.checkpoint import MODEL_FILE, load_checkpoint, save_checkpoint

    torch.manual_seed(0)
    saved = torch.nn.Linear(3, 2)
    where = save_checkpoint(str(tmp_path / "run"), 1, saved, None, None)
    fresh = torch.nn.Linear(3, 2)
    before = fresh.weight.detach().clone()
    weights = Path(where) / MODEL_FILE
    weights.rename(tmp_path / "outside.safetensors")
    weights.symlink_to(tmp_path / "outside.safetensors")  # the same bytes, through a link
    with pytest.raises(storage.LinkError, match=f"the checkpoint {where} holds a symbolic link, {MODEL_FILE} -> "):
        load_checkpoint(where, fresh, restore_rng=False)
    assert torch.equal(fresh.weight, before)
    weights.unlink()
    (tmp_path / "outside.safetensors").rename(weights)
    load_checkpoint(where, fresh, restore_rng=False)
    assert torch.equal(fresh.weight, saved.weight)


def test_refuse_links_passes_a_linked_root_and_s3(tmp_path):
    (tmp_path / "store" / "a").mkdir(parents=True)
    (tmp_path / "store" / "a" / "f.parquet").write_bytes(b"x")
    (tmp_path / "alias").symlink_to(tmp_path / "store")  # the caller's own argument may be a link
    storage.refuse_links(str(tmp_path / "alias"), "frames store")
    storage.refuse_links(str(tmp_path / "missing"), "frames store")
    storage.refuse_links("s3://bucket/prefix", "frames store")  # no links on S3: nothing to list
    (tmp_path / "store" / "a" / "g.parquet").symlink_to(tmp_path / "store" / "a" / "f.parquet")  # inside, still
    with pytest.raises(storage.LinkError, match=r"a/g\.parquet -> "):
        storage.refuse_links(str(tmp_path / "store"), "frames store")


def test_a_config_that_is_not_text_is_refused_naming_the_file_or_the_key(tmp_path):
    from vlp.config import ConfigError, load_config

    (tmp_path / "latin1.yaml").write_bytes(b"frames:\n  size: 32  # caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1\.yaml: not UTF-8 text: the byte 0xe9 at offset 25$"):
        load_config(tmp_path / "latin1.yaml")
    (tmp_path / "escaped.yaml").write_text('retrieval:\n  split: "\\udc80"\n')  # a YAML escape: a lone surrogate
    with pytest.raises(ConfigError, match=r"^retrieval\.split: the value is not valid UTF-8: the byte 0x80 at "):
        load_config(tmp_path / "escaped.yaml")
    with pytest.raises(ConfigError, match=r"^override qa\.split: the text is not valid UTF-8: a lone surrogate U\+D80"):
        load_config(None, ["qa.split=a\ud800"])
