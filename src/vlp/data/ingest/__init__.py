"""Ingest (moving into a package: everything is still in :mod:`vlp.data.ingest.write`)."""

from vlp.data.ingest.write import (
    FORMATS,
    KINDS,
    KINDS_SUMMARY,
    NO_TEXT,
    PROBE_SCHEMA,
    PROBES,
    STAGE,
    IngestConfig,
    ProbeResult,
    detect_format,
    ingest,
    probe_part,
)
from vlp.data.ingest.write import (
    _run_pool as _run_pool,
)

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
    "probe_part",
]
