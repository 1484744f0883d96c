"""The ingest step: read, validate, probe, then write the manifest tables, the rejects and the summary."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from vlp import storage
from vlp.data import manifest
from vlp.data.ingest.probe import _probe_all, _probed_by
from vlp.data.ingest.readers import _read
from vlp.data.ingest.records import KINDS, KINDS_SUMMARY, IngestConfig, _absolute, _checked, _Raw, _reject_row
from vlp.data.ingest.validate import _finish_validation, _prevalidate

log = logging.getLogger(__package__)  # "vlp.data.ingest": the name its records had before the package


# --------------------------------------------------------------------------- entry point


def ingest(source: str, out: str, cfg: IngestConfig, probes: Sequence[str] = ()) -> dict[str, Any]:
    """Validate and probe dataset ``source`` into the manifest tables under ``out``.

    Args:
        source: a raw dataset directory (``synth``) or an annotation file; local path or ``s3://``.
        out: output dataset directory or ``s3://`` prefix.
        cfg: the ``ingest`` config section.
        probes: the outputs of every :func:`~vlp.data.ingest.probe_part` of this source and config: their results
            replace probing (a merge); empty = probe here.

    Returns:
        The summary: ``{"format", "videos"|"captions"|"qa": {"input", "accepted", "rejected"},
        "reject_reasons": {category: count}}``.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        ValueError: bad config, undetectable format, or an annotation file that cannot be read at all
            (``manifest.ManifestError`` for a raw directory whose tables lack columns).
    """
    source, out = _checked(source, cfg), _absolute(out)
    if source == out and storage.exists(storage.join(source, manifest.VIDEOS)):
        raise ValueError(f"ingest would overwrite its source {source}: pass a different --out")
    raw = _read(source, cfg)
    winners, survivors = _prevalidate(raw, cfg)
    uris = [r["path"] for r in survivors]
    _finish_validation(raw, winners, survivors, _probed_by(probes, uris, cfg) if probes else _probe_all(uris, cfg), cfg)
    rejects = _reject_rows(raw)
    tables = _tables(raw)
    summary = _summary(raw, tables, rejects)
    if probes:
        summary["probe_parts"] = len(probes)
    _write(out, tables, rejects, raw.boxes, raw.root)
    log.info("ingest: %s", json.dumps({k: summary[k] for k in KINDS_SUMMARY}))
    accepted = summary["videos"]["accepted"]
    if accepted == 0:
        why = Counter(r["reason"].split(":", 1)[0] for r in rejects if r["kind"] == "video")
        reasons = ", ".join(f"{k} x{n}" for k, n in sorted(why.items())) or "the source lists none"
        summary["warnings"] = [f"no video accepted from {source} ({reasons}); see {out}/{manifest.REJECTS}"]
        log.warning("ingest: %s", summary["warnings"][0])
    if accepted < cfg.min_videos:
        raise ValueError(
            f"ingest accepted {accepted} video(s) from {source}, fewer than ingest.min_videos={cfg.min_videos}; "
            f"the reasons are in {out}/{manifest.REJECTS}"
        )
    return summary


# --------------------------------------------------------------------------- outputs


def _reject_rows(raw: _Raw) -> list[dict[str, str]]:
    """Rejected videos, captions, QA (input order within each kind), then records that never became rows."""
    first_path: dict[str, str] = {}
    for row in raw.videos:
        first_path.setdefault(row["video_id"], row["path"])
    rows = [_reject_row("video", v["video_id"] or "", v["path"], v["_reject"]) for v in raw.videos if v["_reject"]]
    for kind, items, id_field in (("caption", raw.captions, "caption_id"), ("qa", raw.qa, "qa_id")):
        for r in items:
            if r["_reject"]:
                path = first_path.get(r["video_id"], raw.origin)
                rows.append(_reject_row(kind, r[id_field] or "", path, r["_reject"]))
    rows.extend(raw.rejects)
    rows.sort(key=lambda r: KINDS.index(r["kind"]))  # stable: keeps input order within a kind
    return rows


def _tables(raw: _Raw) -> dict[str, pa.Table]:
    def accepted(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
        return manifest.from_rows([{k: r[k] for k in schema.names} for r in rows if r["_reject"] is None], schema)

    return {
        manifest.VIDEOS: accepted(raw.videos, manifest.VIDEO_SCHEMA),
        manifest.CAPTIONS: accepted(raw.captions, manifest.CAPTION_SCHEMA),
        manifest.QA: accepted(raw.qa, manifest.QA_SCHEMA),
    }


def _summary(raw: _Raw, tables: dict[str, pa.Table], rejects: list[dict[str, str]]) -> dict[str, Any]:
    """Counts per kind; asserts that every record read is either written or rejected."""
    rejected = Counter(r["kind"] for r in rejects)
    summary: dict[str, Any] = {"format": raw.fmt, "source": raw.origin}
    for kind, key, name in zip(KINDS, KINDS_SUMMARY, (manifest.VIDEOS, manifest.CAPTIONS, manifest.QA), strict=True):
        counts = {"input": raw.inputs[kind], "accepted": tables[name].num_rows, "rejected": rejected[kind]}
        assert counts["input"] == counts["accepted"] + counts["rejected"], f"ingest lost {kind} records: {counts}"
        summary[key] = counts
    summary["reject_reasons"] = dict(sorted(Counter(r["reason"].split(":", 1)[0] for r in rejects).items()))
    return summary


def _write(
    out: str, tables: dict[str, pa.Table], rejects: list[dict[str, str]], boxes: pa.Table | None, root: str
) -> None:
    schemas = {manifest.VIDEOS: manifest.VIDEO_SCHEMA, manifest.CAPTIONS: manifest.CAPTION_SCHEMA}
    for name, table in tables.items():
        meta = {manifest.MEDIA_ROOT_KEY: root.encode()} if name == manifest.VIDEOS else None
        manifest.write(out, name, table, schemas.get(name, manifest.QA_SCHEMA), meta)
    if boxes is None:
        storage.delete(storage.join(out, manifest.BOXES))  # never leave a stale table from an earlier run
    else:
        keep = pc.is_in(boxes["video_id"], value_set=tables[manifest.VIDEOS]["video_id"].combine_chunks())
        manifest.write(out, manifest.BOXES, boxes.filter(keep), manifest.BOX_SCHEMA)
    manifest.write(out, manifest.REJECTS, manifest.from_rows(rejects, manifest.REJECT_SCHEMA), manifest.REJECT_SCHEMA)
