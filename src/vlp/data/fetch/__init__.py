"""Fetch: a list of video URLs (a WebVid CSV, or a list of your own) -> the videos in object storage (or a folder),
as a raw dataset ``vlp ingest`` reads, every row that failed a reject with its reason (docs/guides/fetch.md).

Where the code lives: :mod:`~vlp.data.fetch.lists` (reading the list), :mod:`~vlp.data.fetch.guard` (what may
be connected to, what of a URL is written down), :mod:`~vlp.data.fetch.client` (one URL to one file: redirects,
limits, retries), :mod:`~vlp.data.fetch.part` (a fan-out part: downloads, probe, storage, journal; and the
merge) and :mod:`~vlp.data.fetch.config` (:class:`FetchConfig`).
"""

from vlp.data.fetch.config import FORMATS, FetchConfig
from vlp.data.fetch.part import FETCHED, RECORD_SCHEMA, RECORDS, fetch_part, merge, part_dir

__all__ = ["FETCHED", "FORMATS", "RECORDS", "RECORD_SCHEMA", "FetchConfig", "fetch_part", "merge", "part_dir"]
