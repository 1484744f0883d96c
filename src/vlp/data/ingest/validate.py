"""Validation: the rules of :mod:`vlp.data.ingest` that fill each record's ``_reject`` - before probing (rows,
duplicates, texts, sizes) and after it (probe failures, durations, the texts of rejected videos)."""

from __future__ import annotations

import posixpath
from collections import Counter
from typing import Any

import pyarrow as pa

from vlp.data import manifest, video
from vlp.data.ingest.records import NO_TEXT, IngestConfig, ProbeResult, _bad_utf8, _Raw, _safe


def _prevalidate(raw: _Raw, cfg: IngestConfig) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Fill ``_reject`` from the checks that need no probe, cheapest first; returns the winning row of every
    video id and the rows left to probe."""
    winners = _check_videos(raw.videos)
    _check_texts(raw.captions, winners, "caption_id", manifest.CAPTION_SCHEMA)
    _check_texts(raw.qa, winners, "qa_id", manifest.QA_SCHEMA)
    _check_sizes(raw.captions, raw.qa, cfg)
    if cfg.require_text:
        with_text = {r["video_id"] for r in raw.captions + raw.qa if r["_reject"] is None}
        for vid, row in winners.items():
            if row["_reject"] is None and vid not in with_text:
                row["_reject"] = NO_TEXT
    return winners, [row for row in raw.videos if row["_reject"] is None]


def _finish_validation(
    raw: _Raw,
    winners: dict[str, dict[str, Any]],
    survivors: list[dict[str, Any]],
    probed: list[ProbeResult],
    cfg: IngestConfig,
) -> None:
    """Apply the probe results of ``survivors``: rejects, measurements, and the texts of rejected videos."""
    for row, (info, reason) in zip(survivors, probed, strict=True):
        row["_reject"] = reason or _duration_problem(row["media"], info, cfg)
        row.update(info or {})
    for row in raw.captions + raw.qa:
        owner = winners.get(row["video_id"])
        if row["_reject"] is None and owner is not None and owner["_reject"]:
            row["_reject"] = f"video rejected: {owner['_reject']}"


def _check_videos(videos: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Row problems and duplicates; returns ``video_id -> first row`` (whose verdict the id's texts follow).

    An id given to two different files is ambiguous: every row of it is rejected, each reason naming another
    file of the id, so its captions are rejected too. A row that repeats the id and the file of an earlier row
    (a raw ``videos.parquet`` listing a clip twice) is rejected as a duplicate and the first row stands.
    """
    winners: dict[str, dict[str, Any]] = {}
    first_row: dict[str, int] = {}
    files: dict[str, list[str]] = {}
    for row in videos:
        if row["video_id"] and row["path"] not in files.setdefault(row["video_id"], []):
            files[row["video_id"]].append(row["path"])
    for i, row in enumerate(videos):
        vid = row["video_id"]
        others = [f for f in files.get(vid, []) if f != row["path"]]
        if others:  # overrides a reader's reject too: the conflict is what the texts must learn of
            row["_reject"] = f"duplicate video_id: {manifest.quoted(vid)} also names {manifest.quoted(others[0])}" + (
                f" and {len(others) - 1} other file(s)" if len(others) > 1 else ""
            )
        if row["_reject"]:  # rejected by its reader (a path outside the root) or ambiguous: its texts follow it
            if vid and vid not in winners:
                winners[vid], first_row[vid] = row, i
            continue
        if not vid:
            row["_reject"] = "malformed record: empty video_id"
        elif vid in winners:
            row["_reject"] = f"duplicate video_id: the same file as row {first_row[vid]}"
        else:
            winners[vid], first_row[vid] = row, i
            row["_reject"] = _video_row_problem(row)
    return winners


def _video_row_problem(row: dict[str, Any]) -> str | None:
    path, media, split = row["path"], row["media"], row["split"]
    name = posixpath.basename(path)
    if not path:
        return "malformed record: empty path"
    if split not in manifest.SPLITS:
        return f"unknown split: {_safe(split)!r} (expected one of {', '.join(manifest.SPLITS)})"
    if media not in manifest.MEDIA:
        return f"unknown media: {_safe(media)!r} (expected one of {', '.join(manifest.MEDIA)})"
    if media == "image" and not video.is_image(path):
        return f"media mismatch: media is 'image' but {name} has no image suffix {video.IMAGE_SUFFIXES}"
    if media == "video" and video.is_image(path):
        return f"media mismatch: media is 'video' but {name} is an image file"
    return None


def _check_texts(rows: list[dict[str, Any]], winners: dict[str, Any], id_field: str, schema: pa.Schema) -> None:
    seen: set[str] = set()
    text_fields = [n for n in ("caption", "question", "answer") if n in schema.names]
    for row in rows:
        bad = [n for n in schema.names if isinstance(row[n], str) and _bad_utf8(row[n])]
        empty = [n for n in [id_field, "video_id", *text_fields] if not (row[n] or "").strip()]
        if bad:
            row["_reject"] = f"invalid UTF-8: {', '.join(bad)} not valid UTF-8 text"
        elif empty:
            row["_reject"] = f"empty {empty[0]}" if empty[0] in text_fields else f"malformed record: empty {empty[0]}"
        elif row[id_field] in seen:
            row["_reject"] = f"duplicate {id_field}: {row[id_field]!r} appeared before"
        elif row["video_id"] not in winners:
            row["_reject"] = f"unknown video_id: {row['video_id']!r} is not in {manifest.VIDEOS}"
        elif row["split"] not in manifest.SPLITS:
            row["_reject"] = f"unknown split: {row['split']!r} (expected one of {', '.join(manifest.SPLITS)})"
        if not bad and row[id_field]:
            seen.add(row[id_field])


def _check_sizes(captions: list[dict[str, Any]], qa: list[dict[str, Any]], cfg: IngestConfig) -> None:
    """Text limits on the rows still accepted: characters per field, caption words (or ALBEF's cleaning), and
    captions per video (the first ``max_captions_per_video`` valid ones of a video, in input order, stay)."""
    limits = {"caption": cfg.max_caption_chars, "question": cfg.max_question_chars, "answer": cfg.max_answer_chars}
    for row in captions + qa:
        for name in ("caption", "question", "answer"):
            if row["_reject"] is None and name in row and limits[name] and len(row[name]) > limits[name]:
                size = f"{name} of {len(row[name])} characters"
                row["_reject"] = f"text too long: {size} > ingest.max_{name}_chars={limits[name]}"
    # the cleaning function when ingest.caption_clean is set (mypy takes None for its type: hence the ignore below)
    clean = None
    if cfg.caption_clean:
        # here: ingest imports no torch unless ingest.caption_clean asks for the training code's cleaning
        from vlp.data.video_text import clean_caption as clean  # type: ignore[assignment]
    per_video: Counter[str] = Counter()
    for row in captions:
        if row["_reject"] is not None:
            continue
        words = len(row["caption"].split())
        if clean is not None:
            row["caption"] = clean(row["caption"], cfg.max_caption_words or 30)
            if not row["caption"]:
                row["_reject"] = "empty caption: nothing left after ingest.caption_clean"
                continue
        elif cfg.max_caption_words and words > cfg.max_caption_words:
            limit = cfg.max_caption_words
            row["_reject"] = f"text too long: caption of {words} words > ingest.max_caption_words={limit}"
            continue
        per_video[row["video_id"]] += 1
        if cfg.max_captions_per_video and per_video[row["video_id"]] > cfg.max_captions_per_video:
            row["_reject"] = (
                f"too many captions: {manifest.quoted(row['video_id'])} has more than "
                f"ingest.max_captions_per_video={cfg.max_captions_per_video}"
            )


def _duration_problem(media: str, info: dict[str, Any] | None, cfg: IngestConfig) -> str | None:
    if info is None or media != "video":
        return None
    duration = info["duration_s"]
    if duration < cfg.min_duration_s:
        return f"too short: {duration:.3f} s < ingest.min_duration_s={cfg.min_duration_s}"
    if cfg.max_duration_s and duration > cfg.max_duration_s:
        return f"too long: {duration:.3f} s > ingest.max_duration_s={cfg.max_duration_s}"
    return None
