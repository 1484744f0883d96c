"""Ingest: real mp4/png files, corrupt ones mixed in, every public annotation format, local and S3."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from PIL import Image

from conftest import put, write_mp4
from vlp import cli, storage
from vlp.data import manifest
from vlp.data.ingest import IngestConfig, _run_pool, detect_format, ingest

CFG = IngestConfig(workers=1, progress=False, split="train")  # annotation files below name no split


def make_raw_dir(root: Path, clip: bytes, n_good: int, bad: dict[str, bytes | None], **kw) -> Path:
    """A raw-schema dataset: ``n_good`` good clips ``good<i>`` plus ``bad`` (name -> bytes, None = missing)."""
    videos, captions = [], []
    names = [f"good{i:02d}" for i in range(n_good)] + list(bad)
    for name in names:
        data = clip if name.startswith("good") else bad[name]
        if data is not None:
            put(root / "videos" / f"{name}.mp4", data)
        videos.append({"video_id": name, "path": f"videos/{name}.mp4", "split": "train", "media": "video"})
        captions.append({"video_id": name, "caption_id": f"{name}#0", "caption": f"a clip called {name}"})
    for row in videos:
        row["source"] = "synth"
    for row in captions:
        row["split"] = "train"
    write_raw(root, videos + kw.get("extra_videos", []), captions + kw.get("extra_captions", []), kw.get("qa"))
    return root


def write_raw(root: Path, videos: list[dict], captions: list[dict], qa: list[dict] | None = None) -> None:
    manifest.write(
        str(root), manifest.VIDEOS, manifest.from_rows(videos, manifest.RAW_VIDEO_SCHEMA), manifest.RAW_VIDEO_SCHEMA
    )
    storage.write_parquet(str(root / manifest.CAPTIONS), manifest.from_rows(captions, manifest.CAPTION_SCHEMA))
    if qa is not None:
        storage.write_parquet(str(root / manifest.QA), manifest.from_rows(qa, manifest.QA_SCHEMA))


def read(out: str | Path, name: str) -> list[dict]:
    return storage.read_parquet(storage.join(str(out), name)).to_pylist()


def rejects_by_id(out: str | Path, kind: str) -> dict[str, str]:
    return {r["record_id"]: r["reason"] for r in read(out, manifest.REJECTS) if r["kind"] == kind}


def assert_invariant(summary: dict) -> None:
    for key in ("videos", "captions", "qa"):
        c = summary[key]
        assert c["input"] == c["accepted"] + c["rejected"], (key, c)


# --------------------------------------------------------------------------- raw-schema directory


def test_corrupt_inputs_are_rejected_with_reasons_and_the_rest_accepted(tmp_path, clip_bytes):
    bad = {
        "zero": b"",
        "half": clip_bytes[: len(clip_bytes) // 2],
        "text": b"this is a text file, not a video\n",
        "missing": None,
        "silent": clip_bytes,  # decodes, but its only caption is empty
    }
    (tmp_path / "src").mkdir()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(tmp_path / "src" / "still.png")
    still = {"video_id": "still", "path": "still.png", "split": "val", "media": "image", "source": "synth"}
    extra_captions = [{"video_id": "still", "caption_id": "still#0", "caption": "a red square", "split": "val"}]
    qa = [
        {"video_id": "good00", "qa_id": "good00#q0", "question": "what moves?", "answer": "circle"},
        {"video_id": "half", "qa_id": "half#q0", "question": "what colour?", "answer": "red"},
        {"video_id": "good01", "qa_id": "good01#q0", "question": "what colour?", "answer": " "},
    ]
    qa = [r | {"answer_type": "shape", "split": "train"} for r in qa]
    src = make_raw_dir(tmp_path / "src", clip_bytes, 4, bad, extra_videos=[still], extra_captions=extra_captions, qa=qa)
    # The "silent" clip's only caption is empty.
    caps = read(src, manifest.CAPTIONS)
    caps[[c["video_id"] for c in caps].index("silent")]["caption"] = "   "
    storage.write_parquet(str(src / manifest.CAPTIONS), manifest.from_rows(caps, manifest.CAPTION_SCHEMA))

    summary = ingest(str(src), str(tmp_path / "out"), CFG)

    assert summary["format"] == "synth"
    assert summary["videos"] == {"input": 10, "accepted": 5, "rejected": 5}
    assert summary["captions"] == {"input": 10, "accepted": 5, "rejected": 5}
    assert summary["qa"] == {"input": 3, "accepted": 1, "rejected": 2}
    assert_invariant(summary)
    video_rejects = rejects_by_id(tmp_path / "out", "video")
    assert video_rejects["zero"] == "empty file (0 bytes)"
    assert video_rejects["half"].startswith("not decodable:")
    assert video_rejects["text"].startswith("not decodable:")
    assert video_rejects["missing"] == f"missing file: {src / 'videos' / 'missing.mp4'}"
    assert video_rejects["silent"] == "no valid caption or QA"
    caption_rejects = rejects_by_id(tmp_path / "out", "caption")
    assert caption_rejects["silent#0"] == "empty caption"
    assert caption_rejects["half#0"].startswith("video rejected: not decodable:")
    assert rejects_by_id(tmp_path / "out", "qa") == {
        "half#q0": caption_rejects["half#0"],
        "good01#q0": "empty answer",
    }
    assert summary["reject_reasons"] == {
        "empty answer": 1,
        "empty caption": 1,
        "empty file (0 bytes)": 1,
        "missing file": 1,
        "no valid caption or QA": 1,
        "not decodable": 2,
        "video rejected": 5,
    }
    videos = {v["video_id"]: v for v in read(tmp_path / "out", manifest.VIDEOS)}
    assert sorted(videos) == ["good00", "good01", "good02", "good03", "still"]
    good = videos["good00"]
    assert good["path"] == str(src / "videos" / "good00.mp4") and os.path.isabs(good["path"])
    assert (good["num_frames"], good["fps"], good["duration_s"]) == (24, 12.0, 2.0)
    assert (good["width"], good["height"], good["size_bytes"]) == (64, 48, len(clip_bytes))
    assert (videos["still"]["num_frames"], videos["still"]["fps"], videos["still"]["width"]) == (1, 0.0, 40)
    assert {c["video_id"] for c in read(tmp_path / "out", manifest.CAPTIONS)} == set(videos)
    assert [q["qa_id"] for q in read(tmp_path / "out", manifest.QA)] == ["good00#q0"]


def test_duplicates_splits_media_and_unknown_videos(tmp_path, clip_bytes):
    put(tmp_path / "src" / "a.mp4", clip_bytes)
    put(tmp_path / "src" / "b.mp4", clip_bytes)
    row = {"split": "train", "media": "video", "source": "synth"}
    videos = [
        row | {"video_id": "a", "path": "a.mp4"},
        row | {"video_id": "a", "path": "b.mp4"},  # the id names two files: both rows are rejects
        row | {"video_id": "b", "path": "b.mp4", "split": "holdout"},
        row | {"video_id": "c", "path": "b.mp4", "media": "image"},
        row | {"video_id": "d", "path": "a.mp4"},
        row | {"video_id": "d", "path": "a.mp4"},  # the same id and file again: the first row stands
    ]
    captions = [
        {"video_id": v, "caption_id": f"{v}#0", "caption": "words", "split": "train"}
        for v in ("a", "b", "c", "zz", "d")
    ]
    captions.append({"video_id": "a", "caption_id": "a#0", "caption": "again", "split": "train"})
    write_raw(tmp_path / "src", videos, captions)

    summary = ingest(str(tmp_path / "src"), str(tmp_path / "out"), CFG)

    assert summary["videos"] == {"input": 6, "accepted": 1, "rejected": 5}
    assert summary["captions"] == {"input": 6, "accepted": 1, "rejected": 5}
    assert summary["reject_reasons"]["duplicate video_id"] == 3
    out = tmp_path / "out"
    assert [(v["video_id"], v["path"]) for v in read(out, manifest.VIDEOS)] == [("d", str(tmp_path / "src" / "a.mp4"))]
    reasons = [r["reason"] for r in read(out, manifest.REJECTS) if r["kind"] == "video"]
    assert reasons[0] == f"duplicate video_id: 'a' also names {str(tmp_path / 'src' / 'b.mp4')!r}"
    assert reasons[1] == f"duplicate video_id: 'a' also names {str(tmp_path / 'src' / 'a.mp4')!r}"
    assert reasons[2].startswith("unknown split: 'holdout'")
    assert reasons[3].startswith("media mismatch: media is 'image'")
    assert reasons[4] == "duplicate video_id: the same file as row 4"
    caption_reasons = [r["reason"] for r in read(out, manifest.REJECTS) if r["kind"] == "caption"]
    # the texts of an ambiguous id follow its first row (which names the other file), not a later one
    first = str(tmp_path / "src" / "b.mp4")
    assert caption_reasons[0] == f"video rejected: duplicate video_id: 'a' also names {first!r}"
    assert caption_reasons[1].startswith("video rejected: unknown split")
    assert caption_reasons[3].startswith("unknown video_id: 'zz'")
    assert caption_reasons[4] == "duplicate caption_id: 'a#0' appeared before"


def test_invalid_utf8_in_a_parquet_caption_rejects_that_row_only(tmp_path, clip_bytes):
    src = make_raw_dir(tmp_path / "src", clip_bytes, 2, {})
    binary = pa.schema(
        [pa.field(f.name, pa.binary()) if f.name in ("caption", "caption_id") else f for f in manifest.CAPTION_SCHEMA]
    )
    rows = [
        {"video_id": "good00", "caption_id": b"good00#0", "caption": b"caf\xe9 noir", "split": "train"},
        {"video_id": "good00", "caption_id": b"good00#1", "caption": "caf\u00e9 au lait".encode(), "split": "train"},
        {"video_id": "good01", "caption_id": b"good01#0", "caption": b"\xff\xfe", "split": "train"},
        {"video_id": "good01", "caption_id": b"\xffid", "caption": b"\xfe", "split": "train"},  # two bad fields
        # the id of a row rejected as not UTF-8 is not taken: a valid row may use it
        {"video_id": "good00", "caption_id": b"good00#0", "caption": b"cafe noir", "split": "train"},
    ]
    storage.write_parquet(str(src / manifest.CAPTIONS), pa.Table.from_pylist(rows, schema=binary))

    summary = ingest(str(src), str(tmp_path / "out"), CFG)

    assert [c["caption"] for c in read(tmp_path / "out", manifest.CAPTIONS)] == ["caf\u00e9 au lait", "cafe noir"]
    assert [r["reason"] for r in read(tmp_path / "out", manifest.REJECTS) if r["kind"] == "caption"] == [
        "invalid UTF-8: caption not valid UTF-8 text",
        "invalid UTF-8: caption not valid UTF-8 text",
        "invalid UTF-8: caption_id, caption not valid UTF-8 text",
    ]
    assert rejects_by_id(tmp_path / "out", "video") == {"good01": "no valid caption or QA"}
    assert_invariant(summary)


def test_duration_limits_and_boxes_follow_accepted_videos(tmp_path, clip_bytes):
    src = make_raw_dir(tmp_path / "src", clip_bytes, 1, {})
    put(src / "videos" / "long.mp4", write_mp4(tmp_path / "long.mp4", num_frames=48).read_bytes())  # 4 s
    long_video = {"video_id": "long", "path": "videos/long.mp4", "split": "test", "media": "video", "source": "synth"}
    long_caption = {"video_id": "long", "caption_id": "l#0", "caption": "x", "split": "test"}
    videos = [*read(src, manifest.VIDEOS), long_video]
    captions = [*read(src, manifest.CAPTIONS), long_caption]
    write_raw(src, videos, captions)
    box = {"frame_index": 0, "entity_id": 0, "name": "red circle", "shape": "circle", "color": "red", "size": "small"}
    box |= {"x0": 0.1, "y0": 0.1, "x1": 0.5, "y1": 0.5}
    boxes = [box | {"video_id": "good00"}, box | {"video_id": "long"}]
    storage.write_parquet(str(src / manifest.BOXES), manifest.from_rows(boxes, manifest.BOX_SCHEMA))

    summary = ingest(str(src), str(tmp_path / "out"), IngestConfig(workers=1, progress=False, max_duration_s=3.0))

    assert rejects_by_id(tmp_path / "out", "video") == {"long": "too long: 4.000 s > ingest.max_duration_s=3.0"}
    assert [b["video_id"] for b in read(tmp_path / "out", manifest.BOXES)] == ["good00"]
    short = IngestConfig(workers=1, progress=False, min_duration_s=3.0)
    summary = ingest(str(src), str(tmp_path / "out"), short)
    assert rejects_by_id(tmp_path / "out", "video") == {"good00": "too short: 2.000 s < ingest.min_duration_s=3.0"}
    assert summary["reject_reasons"] == {"too short": 1, "video rejected": 1}


def test_rerun_gives_byte_identical_outputs(tmp_path, clip_bytes):
    src = make_raw_dir(tmp_path / "src", clip_bytes, 3, {"text": b"not a video", "missing": None})
    cfg = IngestConfig(workers=2, progress=False)
    ingest(str(src), str(tmp_path / "out"), cfg)
    first = {p.name: p.read_bytes() for p in sorted((tmp_path / "out").iterdir())}
    ingest(str(src), str(tmp_path / "out"), cfg)
    second = {p.name: p.read_bytes() for p in sorted((tmp_path / "out").iterdir())}
    assert sorted(first) == sorted([manifest.VIDEOS, manifest.CAPTIONS, manifest.QA, manifest.REJECTS])
    assert first == second


# --------------------------------------------------------------------------- annotation formats


def test_alpro_retrieval_jsonl_with_a_bad_line_and_a_non_utf8_caption(tmp_path, clip_bytes):
    for vid in ("video0", "video1", "video2"):
        put(tmp_path / "videos" / f"{vid}.mp4", clip_bytes)
    lines = [
        b'{"caption": "a man is cooking", "clip_name": "video0"}',
        b'{"caption": "someone cooks pasta", "clip_name": "video0"}',
        b'{"caption": "caf\xe9 scene", "clip_name": "video1"}',  # latin-1 byte: not UTF-8
        b"{this is not json",
        b"",
        b'{"caption": "a dog runs", "clip_name": "video2", "split": "validate"}',
        b'{"caption": "   ", "clip_name": "video2"}',
    ]
    ann = put(tmp_path / "ann" / "train.jsonl", b"\n".join(lines) + b"\n")
    cfg = IngestConfig(workers=1, progress=False, video_root=str(tmp_path / "videos"), split="train")

    summary = ingest(str(ann), str(tmp_path / "out"), cfg)

    assert summary["format"] == "alpro" == detect_format(str(ann))
    assert summary["videos"] == {"input": 3, "accepted": 2, "rejected": 1}
    assert summary["captions"] == {"input": 6, "accepted": 3, "rejected": 3}
    captions = read(tmp_path / "out", manifest.CAPTIONS)
    assert [(c["caption_id"], c["caption"], c["split"]) for c in captions] == [
        ("video0#0", "a man is cooking", "train"),
        ("video0#1", "someone cooks pasta", "train"),
        ("video2#0", "a dog runs", "val"),
    ]
    rejects = {r["record_id"]: r for r in read(tmp_path / "out", manifest.REJECTS)}
    assert rejects["video1#0"]["reason"] == "invalid UTF-8: caption not valid UTF-8 text"
    assert rejects["video1"]["reason"] == "no valid caption or QA"
    assert rejects["line 4"]["reason"].startswith("malformed record: not JSON")
    assert rejects["line 4"]["kind"] == "caption" and rejects["line 4"]["path"] == str(ann)
    assert rejects["video2#1"]["reason"] == "empty caption"
    videos = read(tmp_path / "out", manifest.VIDEOS)
    assert [(v["video_id"], v["path"], v["source"]) for v in videos] == [
        ("video0", str(tmp_path / "videos" / "video0.mp4"), "alpro"),
        ("video2", str(tmp_path / "videos" / "video2.mp4"), "alpro"),
    ]


def test_alpro_qa_jsonl(tmp_path, clip_bytes):
    put(tmp_path / "video7.mp4", clip_bytes)
    recs = [
        {"answer": "couch", "question": "what are people sitting on?", "video_id": "video7", "answer_type": "what"},
        {"answer": 3, "question": "how many people?", "video_id": "video7", "answer_type": "how"},
        {"answer": "x", "question": "where?", "video_id": "video8", "answer_type": "where"},  # file missing
    ]
    ann = put(tmp_path / "msrvtt_qa_test.jsonl", "\n".join(json.dumps(r) for r in recs))

    summary = ingest(str(ann), str(tmp_path / "out"), IngestConfig(workers=1, progress=False, split="test"))

    qa = read(tmp_path / "out", manifest.QA)
    assert [(q["qa_id"], q["question"], q["answer"], q["answer_type"], q["split"]) for q in qa] == [
        ("video7#q0", "what are people sitting on?", "couch", "what", "test"),
        ("video7#q1", "how many people?", "3", "how", "test"),
    ]
    assert summary["qa"] == {"input": 3, "accepted": 2, "rejected": 1}
    assert rejects_by_id(tmp_path / "out", "qa")["video8#q0"].startswith("video rejected: missing file:")
    assert read(tmp_path / "out", manifest.CAPTIONS) == []


def test_lavis_retrieval_and_qa_json(tmp_path, clip_bytes):
    put(tmp_path / "vids" / "video9.mp4", clip_bytes)
    put(tmp_path / "vids" / "video10.mp4", clip_bytes)
    Image.new("RGB", (16, 16)).save(tmp_path / "vids" / "frame.jpg")
    retrieval = [
        {"video": "video9.mp4", "caption": ["a cat sleeps", "a cat naps on a sofa"], "instance_id": "0"},
        {"video": "video10.mp4", "caption": "a car drives", "instance_id": "1"},
        {"video": "frame.jpg", "caption": "a black square"},
        {"video": "video9.mp4"},  # neither caption nor question
    ]
    ann = put(tmp_path / "ann" / "test.json", json.dumps(retrieval))
    cfg = IngestConfig(workers=1, progress=False, video_root=str(tmp_path / "vids"), split="train")

    summary = ingest(str(ann), str(tmp_path / "out"), cfg)

    assert summary["format"] == "lavis" == detect_format(str(ann))
    assert [(c["caption_id"], c["caption"]) for c in read(tmp_path / "out", manifest.CAPTIONS)] == [
        ("video9#0", "a cat sleeps"),
        ("video9#1", "a cat naps on a sofa"),
        ("video10#0", "a car drives"),
        ("frame#0", "a black square"),
    ]
    videos = {v["video_id"]: v for v in read(tmp_path / "out", manifest.VIDEOS)}
    assert videos["frame"]["media"] == "image" and videos["video9"]["media"] == "video"
    assert rejects_by_id(tmp_path / "out", "caption") == {
        "record 3": "malformed record: no 'caption' or 'question' field"
    }
    assert_invariant(summary)

    qa = [{"video": "video9.mp4", "question": "what sleeps?", "answer": ["cat", "kitten", "cat"], "question_id": 5}]
    ann_qa = put(tmp_path / "ann" / "qa.json", json.dumps(qa))
    ingest(str(ann_qa), str(tmp_path / "out_qa"), cfg)
    assert [(q["qa_id"], q["answer"], q["answer_type"]) for q in read(tmp_path / "out_qa", manifest.QA)] == [
        ("video9#q0", "cat", "other")
    ]


def test_msrvtt_list_and_official_json(tmp_path, clip_bytes):
    put(tmp_path / "video0.mp4", clip_bytes)
    put(tmp_path / "clips" / "v1.mp4", clip_bytes)
    records = [
        {"video_id": "video0", "caption": ["a man talks", "a person speaks"]},
        {"video_id": "video1", "video": "clips/v1.mp4", "caption": "a band plays"},
    ]
    ann = put(tmp_path / "msrvtt_train.json", json.dumps(records))
    summary = ingest(str(ann), str(tmp_path / "out"), CFG)
    assert summary["format"] == "msrvtt" == detect_format(str(ann))
    assert [(v["video_id"], v["path"]) for v in read(tmp_path / "out", manifest.VIDEOS)] == [
        ("video0", str(tmp_path / "video0.mp4")),
        ("video1", str(tmp_path / "clips" / "v1.mp4")),
    ]
    assert summary["captions"] == {"input": 3, "accepted": 3, "rejected": 0}

    official = {
        "videos": [{"video_id": "video0", "split": "validate"}, {"video_id": "video5", "split": "test"}],
        "sentences": [
            {"video_id": "video0", "caption": "a man talks", "sen_id": 0},
            {"video_id": "video5", "caption": "rain falls", "sen_id": 1},
            {"video_id": "video6", "caption": "orphan", "sen_id": 2},
        ],
    }
    ann2 = put(tmp_path / "videodatainfo.json", json.dumps(official))
    summary = ingest(str(ann2), str(tmp_path / "out2"), CFG)
    assert [(v["video_id"], v["split"]) for v in read(tmp_path / "out2", manifest.VIDEOS)] == [("video0", "val")]
    # A sentence takes its video's split (it has none of its own): a validate clip's captions never train.
    assert [(c["video_id"], c["split"]) for c in read(tmp_path / "out2", manifest.CAPTIONS)] == [("video0", "val")]
    assert rejects_by_id(tmp_path / "out2", "video")["video5"].startswith("missing file:")
    assert rejects_by_id(tmp_path / "out2", "caption")["sentences[2]"].startswith("unknown video_id: 'video6'")
    assert_invariant(summary)


def test_webvid_csv_with_page_dirs_and_a_non_utf8_name(tmp_path, clip_bytes):
    put(tmp_path / "videos" / "001" / "1001.mp4", clip_bytes)
    put(tmp_path / "videos" / "002" / "1002.mp4", clip_bytes)
    put(tmp_path / "videos" / "1003.mp4", clip_bytes)
    csv_bytes = (
        b"videoid,contentUrl,duration,page_dir,name\n"
        b'1001,https://example.invalid/1001.mp4,PT00H00M11S,001,"Aerial view, of a beach"\n'
        b"1002,https://example.invalid/1002.mp4,PT00H00M20S,002,Caf\xe9 sign\n"
        b"1003,https://example.invalid/1003.mp4,PT00H00M05S,,Snow falls\n"
        b",https://example.invalid/x.mp4,PT00H00M05S,003,no id\n"
    )
    ann = put(tmp_path / "results_2M_val.csv", csv_bytes)
    cfg = IngestConfig(workers=1, progress=False, video_root=str(tmp_path / "videos"), split="train")

    summary = ingest(str(ann), str(tmp_path / "out"), cfg)

    assert summary["format"] == "webvid" == detect_format(str(ann))
    assert [(v["video_id"], v["path"]) for v in read(tmp_path / "out", manifest.VIDEOS)] == [
        ("1001", str(tmp_path / "videos" / "001" / "1001.mp4")),
        ("1003", str(tmp_path / "videos" / "1003.mp4")),
    ]
    assert [c["caption"] for c in read(tmp_path / "out", manifest.CAPTIONS)] == [
        "Aerial view, of a beach",
        "Snow falls",
    ]
    assert rejects_by_id(tmp_path / "out", "caption") == {
        "1002#0": "invalid UTF-8: caption not valid UTF-8 text",
        "line 5": "malformed record: no valid 'videoid'",
    }
    assert summary["videos"] == {"input": 3, "accepted": 2, "rejected": 1}
    assert summary["captions"] == {"input": 4, "accepted": 2, "rejected": 2}


def test_an_auto_detected_json_file_is_read_once(tmp_path, clip_bytes, monkeypatch):
    put(tmp_path / "video9.mp4", clip_bytes)
    ann = put(tmp_path / "ann.json", json.dumps([{"video": "video9.mp4", "caption": "a cat sleeps"}]))
    reads: list[str] = []
    real_read = storage.read_bytes
    monkeypatch.setattr(storage, "read_bytes", lambda uri: reads.append(str(uri)) or real_read(uri))
    summary = ingest(str(ann), str(tmp_path / "out"), CFG)
    assert summary["format"] == "lavis" and summary["captions"]["accepted"] == 1
    assert reads.count(str(ann)) == 1


def test_an_empty_dataset_gives_empty_tables(tmp_path):
    from vlp.data.synth import SynthConfig, generate

    generate(str(tmp_path / "raw"), SynthConfig(num_videos=0, workers=1))
    summary = ingest(str(tmp_path / "raw"), str(tmp_path / "out"), CFG)
    assert [summary[k] for k in ("videos", "captions", "qa")] == [{"input": 0, "accepted": 0, "rejected": 0}] * 3
    assert read(tmp_path / "out", manifest.VIDEOS) == read(tmp_path / "out", manifest.REJECTS) == []
    assert read(tmp_path / "out", manifest.BOXES) == []


def test_bad_sources_and_config_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ingest(str(tmp_path / "nope"), str(tmp_path / "out"), CFG)
    put(tmp_path / "data.txt", "hello")
    with pytest.raises(ValueError, match="cannot detect the format"):
        ingest(str(tmp_path / "data.txt"), str(tmp_path / "out"), CFG)
    put(tmp_path / "broken.json", "{not json")
    with pytest.raises(ValueError, match="not a JSON file"):
        ingest(str(tmp_path / "broken.json"), str(tmp_path / "out"), CFG)
    with pytest.raises(ValueError, match=r"ingest\.workers"):
        ingest(str(tmp_path / "data.txt"), str(tmp_path / "out"), IngestConfig(workers=-1))
    put(tmp_path / "w.csv", "id,caption\n1,x\n")
    with pytest.raises(ValueError, match="videoid,name"):
        ingest(str(tmp_path / "w.csv"), str(tmp_path / "out"), CFG)


# --------------------------------------------------------------------------- CLI, S3, process pool


def test_cli_twenty_videos_three_corrupt(tmp_path, clip_bytes, capsys):
    bad = {"corrupt_zero": b"", "corrupt_half": clip_bytes[: len(clip_bytes) // 2], "corrupt_text": b"hello\n"}
    src = make_raw_dir(tmp_path / "raw", clip_bytes, 17, bad)
    out = tmp_path / "dataset"

    rc = cli.main(["ingest", "--source", str(src), "--out", str(out), "ingest.workers=2", "ingest.progress=false"])

    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["videos"] == {"input": 20, "accepted": 17, "rejected": 3}
    assert json.loads((out / manifest.SUMMARY).read_text())["videos"] == printed["videos"]
    assert len(read(out, manifest.VIDEOS)) == 17
    reasons = rejects_by_id(out, "video")
    assert sorted(reasons) == sorted(bad)
    assert all(reason for reason in reasons.values())
    assert cli.main(["ingest", "--source", str(tmp_path / "absent"), "--out", str(out)]) == 2


def test_ingest_from_and_to_s3(tmp_path, clip_bytes, s3_bucket):
    src = make_raw_dir(tmp_path / "raw", clip_bytes, 3, {"text": b"not a video", "missing": None, "zero": b""})
    for path in sorted(src.rglob("*")):
        if path.is_file():
            storage.upload(path, storage.join(s3_bucket, "raw", str(path.relative_to(src))))
    source, out = storage.join(s3_bucket, "raw"), storage.join(s3_bucket, "dataset")

    summary = ingest(source, out, IngestConfig(workers=2, progress=False))

    assert summary["videos"] == {"input": 6, "accepted": 3, "rejected": 3}
    videos = read(out, manifest.VIDEOS)
    assert [v["path"] for v in videos] == [f"{source}/videos/good{i:02d}.mp4" for i in range(3)]
    assert {v["size_bytes"] for v in videos} == {len(clip_bytes)}
    reasons = rejects_by_id(out, "video")
    assert reasons["missing"] == f"missing file: {source}/videos/missing.mp4"
    assert reasons["zero"] == "empty file (0 bytes)"
    assert reasons["text"].startswith("not decodable:") and "/tmp/" not in reasons["text"]
    before = {name: storage.read_bytes(storage.join(out, name)) for name in (manifest.VIDEOS, manifest.REJECTS)}
    ingest(source + "/", out + "/", IngestConfig(workers=1, progress=False))  # trailing slashes change nothing
    assert {name: storage.read_bytes(storage.join(out, name)) for name in before} == before


def _exit_on_crash(item: str) -> tuple[str | None, str]:
    if item == "crash":
        os._exit(3)  # what a segfaulting decoder does to its worker
    return item.upper(), ""


def test_process_pool_survives_a_worker_killed_by_a_decoder():
    items = ["a", "b", "crash", "c", "d", "e"]
    ticks: list[int] = []
    results = _run_pool(_exit_on_crash, items, 2, lambda: ticks.append(1))
    assert results[:2] == [("A", ""), ("B", "")] and results[3:] == [("C", ""), ("D", ""), ("E", "")]
    assert results[2] == (None, "probe crashed: the decoder killed its worker process (crashed: exit code 3)")
    assert len(ticks) == len(items)


def test_config_fields_exist_for_the_cli_shortcuts():
    from vlp.config import load_config

    cfg = load_config(None, ['ingest.format="webvid"', 'ingest.video_root="/data/videos"', "ingest.workers=4"])
    assert (cfg.ingest.format, cfg.ingest.video_root, cfg.ingest.workers) == ("webvid", "/data/videos", 4)
    with pytest.raises(ValueError, match=r"ingest\.format"):
        load_config(None, ['ingest.format="youtube"'])


# --------------------------------------------------------------------------- hostile inputs


def test_paths_that_leave_the_video_root_are_rejected_and_never_opened(tmp_path, clip_bytes, monkeypatch):
    from vlp.data import video as video_mod

    put(tmp_path / "root" / "inside.mp4", clip_bytes)
    put(tmp_path / "outside" / "secret.mp4", clip_bytes)  # a valid video, but not under the root
    (tmp_path / "root" / "link.mp4").symlink_to(tmp_path / "outside" / "secret.mp4")
    records = [
        {"video": "inside.mp4", "caption": "a clip inside the root"},
        {"video": "../outside/secret.mp4", "caption": "climbs out"},
        {"video": "/etc/passwd", "caption": "absolute path elsewhere"},
        {"video": "link.mp4", "caption": "a link out of the root"},
    ]
    ann = put(tmp_path / "ann.json", json.dumps(records))
    opened: list[str] = []
    real_probe = video_mod.probe
    monkeypatch.setattr(video_mod, "probe", lambda path: opened.append(path) or real_probe(path))
    cfg = IngestConfig(workers=1, progress=False, split="train", video_root=str(tmp_path / "root"))
    summary = ingest(str(ann), str(tmp_path / "out"), cfg)
    assert opened == [str(tmp_path / "root" / "inside.mp4")], "nothing outside the root is opened"
    assert [v["video_id"] for v in read(tmp_path / "out", manifest.VIDEOS)] == ["inside"]
    reasons = rejects_by_id(tmp_path / "out", "video")
    assert sorted(reasons) == ["../outside/secret", "link", "passwd"]  # lavis ids come from the path
    assert all(r.startswith("path outside its root: ") for r in reasons.values()), reasons
    assert reasons["passwd"] == f"path outside its root: '/etc/passwd' resolves outside {tmp_path / 'root'}"
    caption = rejects_by_id(tmp_path / "out", "caption")["../outside/secret#0"]
    assert caption.startswith("video rejected: path outside its root")
    assert_invariant(summary)


def test_a_raw_directory_row_that_points_outside_is_rejected(tmp_path, clip_bytes):
    put(tmp_path / "elsewhere.mp4", clip_bytes)
    extra = [{"video_id": "esc", "path": "../elsewhere.mp4", "split": "train", "media": "video", "source": "synth"}]
    extra_captions = [{"video_id": "esc", "caption_id": "esc#0", "caption": "escapes", "split": "train"}]
    src = make_raw_dir(tmp_path / "raw", clip_bytes, 2, {}, extra_videos=extra, extra_captions=extra_captions)
    summary = ingest(str(src), str(tmp_path / "out"), CFG)
    assert summary["videos"] == {"input": 3, "accepted": 2, "rejected": 1}
    assert rejects_by_id(tmp_path / "out", "video")["esc"].startswith("path outside its root: '../elsewhere.mp4'")


def test_resolve_inside_on_s3_refuses_other_prefixes_and_dot_dot_keys():
    assert manifest.resolve_inside("s3://b/data", "v/a.mp4") == "s3://b/data/v/a.mp4"
    for path in ("../other/a.mp4", "v/../../a.mp4", "s3://b/other/a.mp4", "s3://b/data-2/a.mp4", "/etc/passwd"):
        with pytest.raises(manifest.PathEscapeError, match="path outside its root"):
            manifest.resolve_inside("s3://b/data", path)
    with pytest.raises(storage.StorageError, match="leaves"):
        storage.local_path_under("/tmp/x", "../../etc/passwd")


def test_an_annotation_file_without_splits_needs_ingest_split(tmp_path, clip_bytes):
    put(tmp_path / "video7.mp4", clip_bytes)
    ann = put(tmp_path / "msrvtt_test_1k.json", json.dumps([{"video_id": "video7", "caption": "a dog runs"}]))
    with pytest.raises(ValueError, match=r"gives no split for its records: set ingest.split=train, val or test"):
        ingest(str(ann), str(tmp_path / "out"), IngestConfig(workers=1, progress=False))
    ingest(str(ann), str(tmp_path / "out"), IngestConfig(workers=1, progress=False, split="test"))
    assert [v["split"] for v in read(tmp_path / "out", manifest.VIDEOS)] == ["test"]
    assert [c["split"] for c in read(tmp_path / "out", manifest.CAPTIONS)] == ["test"]


def test_zero_accepted_videos_warn_and_a_minimum_fails_the_step(tmp_path, caplog):
    src = make_raw_dir(tmp_path / "raw", b"", 0, {"broken": b"not a video", "gone": None})
    with caplog.at_level("WARNING", logger="vlp.data.ingest"):
        summary = ingest(str(src), str(tmp_path / "out"), CFG)
    assert summary["videos"]["accepted"] == 0
    assert summary["warnings"] == [
        f"no video accepted from {src} (missing file x1, not decodable x1); see {tmp_path / 'out'}/rejects.parquet"
    ]
    assert "no video accepted" in caplog.text
    with pytest.raises(ValueError, match=r"accepted 0 video\(s\) .* fewer than ingest.min_videos=1"):
        ingest(str(src), str(tmp_path / "out2"), IngestConfig(workers=1, progress=False, min_videos=1))
    assert read(tmp_path / "out2", manifest.REJECTS), "the rejects are written before the step fails"


# --------------------------------------------------------------------------- storage outages


@pytest.mark.parametrize("fault", ["503", "reset"])
def test_a_short_storage_outage_drops_no_video(tmp_path, clip_bytes, s3_bucket, s3_config, fault):
    import dataclasses

    from common import FaultyProxy, fail_first

    src = make_raw_dir(tmp_path / "raw", clip_bytes, 3, {"text": b"not a video"})
    for path in sorted(src.rglob("*")):
        if path.is_file():
            storage.upload(path, storage.join(s3_bucket, "raw", str(path.relative_to(src))))
    source = storage.join(s3_bucket, "raw")
    cfg = IngestConfig(workers=2, progress=False, retry_wait_s=0.01)
    with FaultyProxy(s3_config.endpoint_url, fail_first(2, fault, "videos/good01.mp4")) as url:
        storage.configure(dataclasses.replace(s3_config, endpoint_url=url, max_attempts=1))  # every fault reaches us
        summary = ingest(source, str(tmp_path / "out"), cfg)
    assert summary["videos"] == {"input": 4, "accepted": 3, "rejected": 1}, "good01 survived two failed reads"
    assert list(rejects_by_id(tmp_path / "out", "video")) == ["text"], "only the file's own defect is a reject"


def test_a_storage_outage_that_lasts_fails_the_step_and_names_the_file(tmp_path, clip_bytes, s3_bucket, s3_config):
    import dataclasses

    from common import FaultyProxy, fail_first

    src = make_raw_dir(tmp_path / "raw", clip_bytes, 2, {})
    for path in sorted(src.rglob("*")):
        if path.is_file():
            storage.upload(path, storage.join(s3_bucket, "raw", str(path.relative_to(src))))
    cfg = IngestConfig(workers=1, progress=False, storage_retries=2, retry_wait_s=0.01)
    with FaultyProxy(s3_config.endpoint_url, fail_first(10**6, "503", "videos/good01.mp4")) as url:
        storage.configure(dataclasses.replace(s3_config, endpoint_url=url, max_attempts=1))
        with pytest.raises(storage.StorageError, match=r"failed on 1 file\(s\) after 3 attempts .*good01.mp4.*rerun"):
            ingest(storage.join(s3_bucket, "raw"), str(tmp_path / "out"), cfg)
    assert not (tmp_path / "out" / manifest.VIDEOS).exists(), "no dataset that silently lacks the video"


def test_duration_bounds_are_inclusive_and_only_apply_to_probed_videos():
    from vlp.data.ingest.validate import _duration_problem

    cfg = IngestConfig(workers=1, progress=False, min_duration_s=2.0, max_duration_s=4.0)
    for seconds in (2.0, 3.0, 4.0):  # both bounds belong to the range
        assert _duration_problem("video", {"duration_s": seconds}, cfg) is None
    assert _duration_problem("video", {"duration_s": 1.5}, cfg) == "too short: 1.500 s < ingest.min_duration_s=2.0"
    assert _duration_problem("video", {"duration_s": 4.5}, cfg) == "too long: 4.500 s > ingest.max_duration_s=4.0"
    assert _duration_problem("video", None, cfg) is None  # not probed (a reject already)
    assert _duration_problem("image", {"duration_s": 0.0}, cfg) is None  # a still image has no duration
    unbounded = IngestConfig(workers=1, progress=False, min_duration_s=0.0, max_duration_s=0.0)
    assert _duration_problem("video", {"duration_s": 1e6}, unbounded) is None  # max 0: no upper bound


def test_each_video_row_problem_has_its_own_exact_reason(tmp_path, clip_bytes):
    """One row per problem a video row can have, each reason checked whole: what a user reads in rejects.parquet."""
    for name in ("a.mp4", "b.mp4", "c.mp4", "d.mp4", "pic.jpg"):
        put(tmp_path / "src" / name, clip_bytes)
    row = {"split": "train", "media": "video", "source": "synth"}
    videos = [
        row | {"video_id": "three", "path": "a.mp4"},  # one id, three files: each row names the others
        row | {"video_id": "three", "path": "b.mp4"},
        row | {"video_id": "three", "path": "c.mp4"},
        row | {"video_id": "", "path": "d.mp4"},
        row | {"video_id": "nopath", "path": ""},
        row | {"video_id": "split", "path": "d.mp4", "split": "holdout"},
        row | {"video_id": "media", "path": "d.mp4", "media": "audio"},
        row | {"video_id": "notimage", "path": "d.mp4", "media": "image"},
        row | {"video_id": "image", "path": "pic.jpg"},
    ]
    write_raw(tmp_path / "src", videos, [])

    ingest(str(tmp_path / "src"), str(tmp_path / "out"), CFG)

    reasons = [r["reason"] for r in read(tmp_path / "out", manifest.REJECTS) if r["kind"] == "video"]
    src = tmp_path / "src"
    assert reasons == [
        f"duplicate video_id: 'three' also names {str(src / 'b.mp4')!r} and 1 other file(s)",
        f"duplicate video_id: 'three' also names {str(src / 'a.mp4')!r} and 1 other file(s)",
        f"duplicate video_id: 'three' also names {str(src / 'a.mp4')!r} and 1 other file(s)",
        "malformed record: empty video_id",
        "malformed record: empty path",
        "unknown split: 'holdout' (expected one of train, val, test)",
        "unknown media: 'audio' (expected one of video, image)",
        "media mismatch: media is 'image' but d.mp4 has no image suffix ('.jpg', '.jpeg', '.png', '.bmp', '.webp')",
        "media mismatch: media is 'video' but pic.jpg is an image file",
    ]


def test_text_checks_and_limits_give_each_row_its_own_reason(tmp_path, clip_bytes):
    """Every text check and limit, at its bound and one past it, with later rows still checked after a reject."""
    put(tmp_path / "src" / "a.mp4", clip_bytes)
    row = {"split": "train", "media": "video", "source": "synth"}
    videos = [row | {"video_id": "a", "path": "a.mp4"}]
    texts = [
        ("c0", "a", "0123456789", "train"),  # 10 characters: at the limit
        ("c1", "a", "01234567890", "train"),  # 11
        ("c2", "a", "x y z", "train"),  # 3 words: at the limit
        ("c3", "a", "w x y z", "train"),  # 4
        ("c4", "a", "more", "train"),  # a third valid caption of a: past max_captions_per_video
        ("c5", "zz", "unknown", "train"),
        ("", "a", "no id", "train"),
        ("c7", "a", "holdout", "holdout"),
        ("c8", "a", " ", "train"),
    ]
    captions = [{"caption_id": c, "video_id": v, "caption": t, "split": s} for c, v, t, s in texts]
    asked = [
        ("q0", " ", "yes"),
        ("q1", "what?", ""),
        ("q2", "which is", "red"),  # a question of 8 characters and an answer of 3: both at their limits
        ("q3", "which one", "red"),  # 9
        ("q4", "which", "blue"),  # 4
    ]
    qa = [
        {"qa_id": q, "video_id": "a", "question": t, "answer": a, "answer_type": "", "split": "train"}
        for q, t, a in asked
    ]
    write_raw(tmp_path / "src", videos, captions, qa)
    cfg = IngestConfig(
        workers=1, progress=False, max_caption_chars=10, max_caption_words=3, max_captions_per_video=2,
        max_question_chars=8, max_answer_chars=3,
    )  # fmt: skip

    ingest(str(tmp_path / "src"), str(tmp_path / "out"), cfg)

    out = tmp_path / "out"
    assert [c["caption_id"] for c in read(out, manifest.CAPTIONS)] == ["c0", "c2"]
    assert [r["reason"] for r in read(out, manifest.REJECTS) if r["kind"] == "caption"] == [
        "text too long: caption of 11 characters > ingest.max_caption_chars=10",
        "text too long: caption of 4 words > ingest.max_caption_words=3",
        "too many captions: 'a' has more than ingest.max_captions_per_video=2",
        "unknown video_id: 'zz' is not in videos.parquet",
        "malformed record: empty caption_id",
        "unknown split: 'holdout' (expected one of train, val, test)",
        "empty caption",
    ]
    assert [q["qa_id"] for q in read(out, manifest.QA)] == ["q2"]
    assert rejects_by_id(out, "qa") == {
        "q0": "empty question",
        "q1": "empty answer",
        "q3": "text too long: question of 9 characters > ingest.max_question_chars=8",
        "q4": "text too long: answer of 4 characters > ingest.max_answer_chars=3",
    }


def test_caption_clean_cuts_to_the_word_limit_and_rejects_what_it_empties(tmp_path, clip_bytes):
    """ALBEF's cleaning at ingest: lower case, punctuation out, at most max_caption_words words; a caption it empties
    is a reject, and the rows after it are still cleaned and counted."""
    put(tmp_path / "src" / "a.mp4", clip_bytes)
    videos = [{"video_id": "a", "path": "a.mp4", "split": "train", "media": "video", "source": "synth"}]
    texts = ["!!!", "Hello, World! one two", "third"]
    captions = [{"caption_id": f"c{i}", "video_id": "a", "caption": t, "split": "train"} for i, t in enumerate(texts)]
    write_raw(tmp_path / "src", videos, captions)
    cfg = IngestConfig(workers=1, progress=False, caption_clean=True, max_caption_words=3, max_captions_per_video=1)

    ingest(str(tmp_path / "src"), str(tmp_path / "out"), cfg)

    out = tmp_path / "out"
    assert [(c["caption_id"], c["caption"]) for c in read(out, manifest.CAPTIONS)] == [("c1", "hello world one")]
    assert rejects_by_id(out, "caption") == {
        "c0": "empty caption: nothing left after ingest.caption_clean",
        "c2": "too many captions: 'a' has more than ingest.max_captions_per_video=1",
    }
