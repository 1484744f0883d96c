"""Ingest: validate a dataset into the manifest schema, probing every video; bad inputs become rejects.

Sources (``IngestConfig.format``; ``auto`` picks one from the source URI):

- ``synth``: a directory (local or ``s3://``) already in the raw manifest schema, as ``vlp data synth``
  writes it: ``videos.parquet`` (RAW_VIDEO_SCHEMA, paths relative to the directory or absolute),
  ``captions.parquet`` and/or ``qa.parquet``, optional ``boxes.parquet``. Auto: a directory with
  ``videos.parquet``.
- ``alpro`` (``*.jsonl``): ALPRO annotations, one JSON object per line: retrieval
  ``{"caption", "clip_name"}`` or QA ``{"question", "answer", "video_id", "answer_type"}``.
  Videos are ``<video_root>/<id><video_ext>``.
- ``lavis`` (``*.json``): a list of ``{"video": "<file>", "caption": str | [str, ...]}`` (retrieval)
  or ``{"video", "question", "answer"}`` (QA). The video id is the path without its extension (``clips/a`` for
  ``clips/a.mp4``).
- ``msrvtt`` (``*.json`` whose first record has ``video_id``): a list of ``{"video_id", "video",
  "caption"}`` (``video`` optional, ``caption`` a string or a list), or the official
  ``{"videos": [...], "sentences": [...]}`` file.
- ``webvid`` (``*.csv``): columns ``videoid,contentUrl,duration,page_dir,name``; videos are
  ``<video_root>/<page_dir>/<videoid><video_ext>`` (``<videoid><video_ext>`` when ``page_dir`` is empty).

Rules. Every input record ends up either in the output tables or in ``rejects.parquet`` with a
reason ``"<category>: <detail>"``, and ``input == accepted + rejected`` is asserted for videos,
captions and QA. Annotation files are read as bytes and decoded record by record, so one line
that is not UTF-8 or not JSON rejects that record only. A caption/QA is rejected when its text is
empty or not UTF-8, longer than its ``max_*_chars`` limit (a caption: more than ``max_caption_words``
words, unless ``caption_clean`` truncates it), past ``max_captions_per_video`` valid captions of its
video, when its video is unknown, or (``"video rejected: ..."``) when its video is. A video is rejected
when its path is unusable or leaves its root, when its id is given to two different files (every row
of the id, each reason naming another file: whose clip would the captions describe?), when it repeats
an earlier row's id and file (a raw table), when its row is inconsistent (split, media), when it has
no valid caption or QA left (``require_text``; such a clip is useless for training, and the check runs
before probing to save the decode), when the probe fails (a still image under a video name included),
or when its duration is outside the configured limits. Annotation formats list one video per distinct
id and file (many records per video are normal there); the first record's split wins.

Fan-out: probing is the step's cost, so on a cluster pod ``i`` of ``n`` probes the contiguous run of the files to
probe that :func:`vlp.data.manifest.part_range` gives it (:func:`probe_part`, into ``probes.parquet``), and
:func:`ingest` with ``probes=`` those parts takes every probe result from them instead of probing. Reading and
validating the annotations is repeated in every pod (cheap next to decoding), so the merged output is
byte-identical to one pod's.

Where the code lives: :mod:`~vlp.data.ingest.write` (the step, :func:`ingest`, and its outputs),
:mod:`~vlp.data.ingest.readers` (the format readers and :func:`detect_format`), :mod:`~vlp.data.ingest.validate`
(the rules above), :mod:`~vlp.data.ingest.probe` (probing, and the fan-out parts: :func:`probe_part`) and
:mod:`~vlp.data.ingest.records` (:class:`IngestConfig`, the records and reject rows the others share). Everything
named here is importable from :mod:`vlp.data.ingest` itself.
"""

from vlp.data.ingest.probe import PROBE_SCHEMA, PROBES, probe_file, probe_part
from vlp.data.ingest.probe import _run_pool as _run_pool
from vlp.data.ingest.readers import detect_format
from vlp.data.ingest.records import FORMATS, KINDS, KINDS_SUMMARY, NO_TEXT, STAGE, IngestConfig, ProbeResult
from vlp.data.ingest.write import ingest

__all__ = [
    "FORMATS",
    "KINDS",
    "KINDS_SUMMARY",
    "NO_TEXT",
    "PROBES",
    "PROBE_SCHEMA",
    "STAGE",
    "IngestConfig",
    "ProbeResult",
    "detect_format",
    "ingest",
    "probe_file",
    "probe_part",
]
