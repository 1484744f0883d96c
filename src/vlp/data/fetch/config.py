"""``FetchConfig``: the ``fetch`` section of a step config, and the range of each of its numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from vlp.ranges import COUNT, RATE, SIZE, at_least, ranged

FORMATS = ("webvid", "urls")


@dataclass
class FetchConfig:
    """How ``vlp fetch`` reads a URL list and downloads its videos (docs/guides/fetch.md)."""

    format: Literal["auto", "webvid", "urls"] = "auto"  # auto: a .csv with contentUrl = webvid, else urls
    split: Literal["train", "val", "test"] = "train"  # the split of every fetched video (WebVid: pre-training)
    concurrency: int = ranged(32, COUNT)  # downloads in flight per part
    per_host_concurrency: int = ranged(8, COUNT)  # of which to one host at most
    # requests started per second to one host, per part (0 = no limit)
    per_host_rate: float = ranged(0.0, at_least(0, " (0 = no limit)"))
    connect_timeout_s: float = ranged(10.0, RATE)  # to open a connection
    read_timeout_s: float = ranged(30.0, RATE)  # longest wait for the next bytes of a response
    timeout_s: float = ranged(600.0, RATE)  # one attempt at one URL, redirects and body included
    # a body slower than this on average, after read_timeout_s, is cut (0 = off)
    min_bytes_per_s: float = ranged(16384.0, at_least(0, " (0 = off)"))
    # a larger video (Content-Length, streamed, decompressed) is refused; WebVid's are MBs
    max_bytes: int = ranged(128 << 20, COUNT)
    max_redirects: int = ranged(5, SIZE)  # redirects followed per attempt
    retries: int = ranged(3, SIZE)  # further attempts after a 408/429/5xx, a reset connection or a body cut off
    backoff_s: float = ranged(1.0, SIZE)  # wait before the first retry, doubled before each further one, with jitter
    max_backoff_s: float = ranged(60.0, SIZE)  # longest wait between attempts
    max_retry_after_s: float = ranged(120.0, SIZE)  # a longer Retry-After gives the URL up instead of waiting
    allow: list[str] = field(default_factory=list)  # address ranges opened despite the refusal rules, e.g. 10.0.0.0/8
    probe: bool = True  # decode each download's header with ingest's probe; what fails is a reject
    probe_workers: int = ranged(1, COUNT)  # probe processes (a crashing or hanging decoder takes down its worker only)
    probe_timeout_s: float = ranged(60.0, at_least(0, " (0 = no limit)"))  # probe time per video (0 = no limit)
    batch: int = ranged(64, COUNT)  # downloads probed, stored and recorded together: what a killed part may fetch again
    store_workers: int = ranged(8, COUNT)  # uploads of a batch side by side
    user_agent: str = ""  # "" = vlp-fetch/<version>
    honor_opt_out: bool = True  # an X-Robots-Tag of noai, noimageai, noindex or none ends the row as "opted out"
    progress: bool = True  # a progress line on stderr
