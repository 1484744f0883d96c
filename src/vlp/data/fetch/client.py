"""One URL to one local file: redirects checked hop by hop, limits, retries (:class:`Fetcher`).

Built on aiohttp (pinned with the project): its resolver hook lets the address rule (:mod:`vlp.data.fetch.guard`)
check the very addresses it connects to, it streams a body in chunks as they arrive, and its connector bounds the
connections in flight overall and per host. Redirects are followed here, not by the client, so that each hop's URL
is checked and counted. Bodies are asked for uncompressed (``Accept-Encoding: identity``); a server that compresses
anyway (a gzip bomb among them) is decompressed here under ``fetch.max_bytes``.

Each attempt ends in an :class:`Outcome` whose ``status`` is ``ok`` or the reason: ``http <code>``, ``timeout``,
``too slow``, ``too large``, ``not a video``, ``opted out`` (an ``X-Robots-Tag`` of ``noai``, ``noimageai``,
``noindex`` or ``none``), ``refused address``, ``bad url``, ``too many redirects``, ``cut off`` (the body ended early
or the connection was reset), ``connection failed``. The status line and headers must arrive within
``fetch.read_timeout_s`` of the request, the body at ``fetch.min_bytes_per_s`` on average. 408, 429, 5xx, ``cut off``
and ``connection failed`` are tried again up to ``fetch.retries`` times after a doubling wait with jitter, or after
the server's ``Retry-After`` when it asks for longer (up to ``fetch.max_retry_after_s``; a longer one gives up).
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import os
import random
import re
import time
import urllib.parse
import zlib
from dataclasses import dataclass, field
from typing import Any

from vlp import __version__
from vlp.data.fetch.config import FetchConfig
from vlp.data.fetch.guard import GuardedResolver, Policy, RefusedAddress, redact, socket_factory

REDIRECTS = (301, 302, 303, 307, 308)
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
RETRY_KINDS = frozenset({"cut off", "connection failed"})
NOT_VIDEO_TYPES = ("text/", "application/json", "application/xml", "application/xhtml")
CHUNK = 1 << 16


@dataclass
class Outcome:
    """How fetching one URL ended: ``status`` ``ok`` with the file written, or a reason and its detail."""

    status: str
    detail: str = ""
    bytes: int = 0
    sha256: str = ""
    final_url: str = ""  # redacted
    content_type: str = ""
    attempts: int = 0
    seconds: float = 0.0
    retry_after: float | None = field(default=None, repr=False)  # a retryable end: the server's wish, or -1


class _Failed(Exception):
    def __init__(self, status: str, detail: str, retry_after: float | None = None) -> None:
        super().__init__(status, detail)
        self.status, self.detail, self.retry_after = status, detail, retry_after


def retry_after_s(value: str | None, now: float | None = None) -> float:
    """Seconds a ``Retry-After`` header asks to wait (a number or an HTTP date); -1 when absent or unreadable."""
    if not value:
        return -1.0
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return -1.0
    return max(0.0, when - (time.time() if now is None else now))


class HostRate:
    """At most ``rate`` request starts per second to one host (0 = no limit): each start takes the next free slot."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next: dict[str, float] = {}

    async def wait(self, host: str) -> None:
        if not self.interval:
            return
        now = asyncio.get_running_loop().time()
        slot = max(now, self.next.get(host, now))
        self.next[host] = slot + self.interval
        if slot > now:
            await asyncio.sleep(slot - now)


class Fetcher:
    """Downloads with ``cfg``'s limits through one aiohttp session; use as ``async with Fetcher(cfg) as f``."""

    def __init__(self, cfg: FetchConfig) -> None:
        self.cfg = cfg
        self.policy = Policy(cfg.allow)
        self.rate = HostRate(cfg.per_host_rate)
        self.agent = cfg.user_agent or f"vlp-fetch/{__version__}"
        self.session: Any = None

    async def __aenter__(self) -> Fetcher:
        import aiohttp

        connector = aiohttp.TCPConnector(
            limit=self.cfg.concurrency,
            limit_per_host=self.cfg.per_host_concurrency,
            resolver=GuardedResolver(self.policy),  # type: ignore[arg-type]  # aiohttp's resolver protocol
            socket_factory=socket_factory(self.policy),  # every connect() checks the address it connects to
            ttl_dns_cache=60,
        )
        trace = aiohttp.TraceConfig()
        trace.on_request_headers_sent.append(_start_head_clock)
        timeout = aiohttp.ClientTimeout(sock_connect=self.cfg.connect_timeout_s, sock_read=self.cfg.read_timeout_s)
        agent = self.agent
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,  # decompressed here, within max_bytes
            trust_env=False,  # no proxy or .netrc from the environment
            headers={"User-Agent": agent, "Accept-Encoding": "identity"},
            trace_configs=[trace],
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()

    async def fetch(self, url: str, dest: str, seed: int = 0) -> Outcome:
        """Download ``url`` into the file ``dest`` (attempts, redirects and waits included)."""
        rng = random.Random(seed)  # the jitter of this row's waits: the same on every run
        start = time.perf_counter()
        attempt = 0
        while True:
            attempt += 1
            outcome = await self._attempt(url, dest)
            if outcome.retry_after is None or attempt > self.cfg.retries:
                break
            wait = min(self.cfg.max_backoff_s, self.cfg.backoff_s * 2 ** (attempt - 1)) * (0.5 + rng.random() / 2)
            if outcome.retry_after > self.cfg.max_retry_after_s:
                outcome.detail += f"; Retry-After {outcome.retry_after:g} s > fetch.max_retry_after_s"
                break
            await asyncio.sleep(max(wait, outcome.retry_after))
        outcome.retry_after = None
        outcome.attempts, outcome.seconds = attempt, round(time.perf_counter() - start, 3)
        if outcome.status != "ok" and os.path.exists(dest):
            os.remove(dest)
        return outcome

    async def _attempt(self, url: str, dest: str) -> Outcome:
        try:
            async with asyncio.timeout(self.cfg.timeout_s):
                return await self._hops(url, dest)
        except _Failed as failed:
            return Outcome(failed.status, failed.detail, retry_after=failed.retry_after)
        except TimeoutError:
            return Outcome("timeout", f"the attempt took over fetch.timeout_s={self.cfg.timeout_s:g} s")

    async def _hops(self, url: str, dest: str) -> Outcome:
        import aiohttp

        current = url
        for _hop in range(self.cfg.max_redirects + 1):
            status, detail = self.policy.check_url(current)
            if status:
                raise _Failed(status, f"{redact(current)}: {detail}")
            host = urllib.parse.urlsplit(current).hostname or ""
            await self.rate.wait(host)
            try:
                async with await self._head(current) as resp:
                    if resp.status in REDIRECTS:
                        location = resp.headers.get("Location", "")
                        if not location:
                            raise _Failed(f"http {resp.status}", "a redirect without a Location")
                        current = urllib.parse.urljoin(current, location)
                        continue
                    return await self._body(resp, current, dest)
            except aiohttp.ClientConnectorError as exc:
                cause: BaseException | None = exc.os_error
                while cause is not None and not isinstance(cause, RefusedAddress):
                    cause = cause.__cause__
                if isinstance(cause, RefusedAddress):
                    raise _Failed("refused address", str(cause)) from None
                if isinstance(exc.os_error, TimeoutError):
                    limit = f"fetch.connect_timeout_s={self.cfg.connect_timeout_s:g} s"
                    raise _Failed("timeout", f"connect: over {limit}") from None
                raise _Failed("connection failed", _short(exc), retry_after=-1) from None
            except aiohttp.ServerTimeoutError:
                raise _Failed("timeout", f"no bytes for fetch.read_timeout_s={self.cfg.read_timeout_s:g} s") from None
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionResetError) as exc:
                raise _Failed("cut off", _short(exc), retry_after=-1) from None
            except aiohttp.ClientResponseError as exc:  # a malformed response
                raise _Failed("bad response", _short(exc)) from None
            except (aiohttp.InvalidURL, ValueError) as exc:
                raise _Failed("bad url", _short(exc)) from None
            except aiohttp.ClientError as exc:
                raise _Failed("connection failed", _short(exc), retry_after=-1) from None
        raise _Failed("too many redirects", f"more than fetch.max_redirects={self.cfg.max_redirects}")

    async def _head(self, url: str) -> Any:
        """The response to a GET of ``url`` once its status line and headers are in: they must arrive within
        ``fetch.read_timeout_s`` of the request being sent (a byte at a time resets no clock here)."""
        head = _HeadClock(self.cfg.read_timeout_s)
        try:
            async with head.timeout:
                return await self.session.get(url, allow_redirects=False, trace_request_ctx=head)
        except TimeoutError:
            if not head.timeout.expired():
                raise  # the attempt's own limit, or aiohttp's
            limit = f"fetch.read_timeout_s={self.cfg.read_timeout_s:g} s"
            raise _Failed("timeout", f"no status line and headers within {limit} of the request") from None

    async def _body(self, resp: Any, url: str, dest: str) -> Outcome:
        cfg = self.cfg
        if resp.status != 200:
            wait = retry_after_s(resp.headers.get("Retry-After")) if resp.status in RETRY_STATUS else None
            raise _Failed(f"http {resp.status}", resp.reason or "", retry_after=wait)
        opted_out = robots_opt_out(resp.headers.getall("X-Robots-Tag", []), self.agent) if cfg.honor_opt_out else ""
        if opted_out:
            raise _Failed("opted out", f"X-Robots-Tag: {opted_out} (fetch.honor_opt_out)")
        ctype = resp.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if ctype.startswith(NOT_VIDEO_TYPES):
            raise _Failed("not a video", f"Content-Type {ctype}")
        length = resp.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > cfg.max_bytes:
            raise _Failed("too large", f"Content-Length {length} > fetch.max_bytes={cfg.max_bytes}")
        encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "", "gzip", "x-gzip", "deflate"):
            raise _Failed("not a video", f"Content-Encoding {encoding} (identity, gzip or deflate only)")
        inflate = None if encoding in ("identity", "") else zlib.decompressobj(31 if "gzip" in encoding else 15)
        digest, written, start = hashlib.sha256(), 0, time.perf_counter()
        with open(dest, "wb") as f:
            async for chunk in resp.content.iter_chunked(CHUNK):
                if inflate is not None:
                    try:
                        chunk = inflate.decompress(chunk, cfg.max_bytes + 1 - written)
                    except zlib.error as exc:
                        raise _Failed("not a video", f"{encoding} body: {exc}") from None
                    if inflate.unconsumed_tail:
                        written = cfg.max_bytes + 1
                written += len(chunk)
                if written > cfg.max_bytes:
                    what = f"decompressed ({encoding})" if inflate is not None else "streamed"
                    raise _Failed("too large", f"more than fetch.max_bytes={cfg.max_bytes} bytes {what}")
                digest.update(chunk)
                f.write(chunk)
                elapsed = time.perf_counter() - start
                if cfg.min_bytes_per_s and elapsed > cfg.read_timeout_s and written / elapsed < cfg.min_bytes_per_s:
                    speed = f"{written / elapsed:.0f} B/s"
                    raise _Failed("too slow", f"{speed} < fetch.min_bytes_per_s={cfg.min_bytes_per_s:g}")
        if written == 0:
            raise _Failed("not a video", "an empty body")
        return Outcome("ok", "", written, digest.hexdigest(), redact(url), ctype)


class _HeadClock:
    """The deadline of one request's status line and headers: none until the request is sent, then ``limit_s``."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s, self.sent = limit_s, False
        self.timeout = asyncio.timeout(None)


async def _start_head_clock(_session: Any, context: Any, _params: Any) -> None:
    """aiohttp's ``on_request_headers_sent``: the request is out (a connection was had), the head's clock starts."""
    head = context.trace_request_ctx
    if isinstance(head, _HeadClock):
        head.sent = True
        head.timeout.reschedule(asyncio.get_running_loop().time() + head.limit_s)


OPT_OUT = frozenset({"noai", "noimageai", "noindex", "none"})  # X-Robots-Tag directives that refuse use


def robots_opt_out(values: list[str], agent: str) -> str:
    """The opt-out directives among ``X-Robots-Tag`` header ``values`` that apply to ``agent``, joined, or ``""``.

    A value is a comma-separated list of directives, optionally after ``<user agent>:`` naming whom they are for
    (``otherbot: noindex`` does not apply here; ``*`` and the first word of ``agent`` do).
    """
    me = agent.split("/", 1)[0].strip().lower()
    found: list[str] = []
    for value in values:
        head, sep, rest = value.partition(":")
        whom = head.strip().lower()
        if sep and "," not in whom and whom not in OPT_OUT:  # "<user agent>: <directives>"
            if whom not in ("*", me):
                continue
            value = rest
        found += [d.strip().lower() for d in value.split(",") if d.strip().lower() in OPT_OUT]
    return ", ".join(dict.fromkeys(found))


_URL = re.compile(r"https?://[^\s'\"<>]+")


def _short(exc: BaseException, limit: int = 200) -> str:
    """An error in one line, any URL in it redacted (aiohttp's messages name the URL, query string and all)."""
    text = _URL.sub(lambda m: redact(m.group(0)), f"{type(exc).__name__}: {exc}")
    return text if len(text) <= limit else text[: limit - 3] + "..."
