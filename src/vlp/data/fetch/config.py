"""``FetchConfig``: the ``fetch`` section of a step config, and the range of each of its numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from vlp.ranges import COUNT, RATE, SIZE, Range, at_least

FORMATS = ("webvid", "urls")


@dataclass
class FetchConfig:
    """How ``vlp fetch`` reads a URL list and downloads its videos (docs/guides/fetch.md)."""

    format: Literal["auto", "webvid", "urls"] = "auto"  # auto: a .csv with contentUrl = webvid, else urls
    split: Literal["train", "val", "test"] = "train"  # the split of every fetched video (WebVid: pre-training)
    concurrency: int = 32  # downloads in flight per part
    per_host_concurrency: int = 8  # of which to one host at most
    per_host_rate: float = 0.0  # requests started per second to one host, per part (0 = no limit)
    connect_timeout_s: float = 10.0  # to open a connection
    read_timeout_s: float = 30.0  # longest wait for the next bytes of a response
    timeout_s: float = 600.0  # one attempt at one URL, redirects and body included
    min_bytes_per_s: float = 16384.0  # a body slower than this on average, after read_timeout_s, is cut (0 = off)
    max_bytes: int = 128 << 20  # a larger video (Content-Length, streamed, decompressed) is refused; WebVid's are MBs
    max_redirects: int = 5  # redirects followed per attempt
    retries: int = 3  # further attempts after a 408/429/5xx, a reset connection or a body cut off
    backoff_s: float = 1.0  # wait before the first retry, doubled before each further one, with jitter
    max_backoff_s: float = 60.0  # longest wait between attempts
    max_retry_after_s: float = 120.0  # a longer Retry-After gives the URL up instead of waiting
    allow: list[str] = field(default_factory=list)  # address ranges opened despite the refusal rules, e.g. 10.0.0.0/8
    probe: bool = True  # decode each download's header with ingest's probe; what fails is a reject
    probe_workers: int = 1  # probe processes (a crashing or hanging decoder takes down its worker only)
    probe_timeout_s: float = 60.0  # probe time per video (0 = no limit)
    batch: int = 64  # downloads probed, stored and recorded together: what a killed part may fetch again
    store_workers: int = 8  # uploads of a batch side by side
    user_agent: str = ""  # "" = vlp-fetch/<version>
    honor_opt_out: bool = True  # an X-Robots-Tag of noai, noimageai, noindex or none ends the row as "opted out"
    progress: bool = True  # a progress line on stderr


RANGES: dict[str, Range] = {
    "concurrency": COUNT, "per_host_concurrency": COUNT, "per_host_rate": at_least(0, " (0 = no limit)"),
    "connect_timeout_s": RATE, "read_timeout_s": RATE, "timeout_s": RATE,
    "min_bytes_per_s": at_least(0, " (0 = off)"), "max_bytes": COUNT, "max_redirects": SIZE, "retries": SIZE,
    "backoff_s": SIZE, "max_backoff_s": SIZE, "max_retry_after_s": SIZE, "probe_workers": COUNT,
    "probe_timeout_s": at_least(0, " (0 = no limit)"), "batch": COUNT, "store_workers": COUNT,
}  # fmt: skip
