"""A loopback HTTP server of real video files with faults on chosen paths: what `vlp fetch` meets on the internet,
for its tests (tests/test_fetch.py) and its benchmark (benchmarks/input/bench_fetch.py). Standard library only.

    with UrlServer({"a.mp4": data}) as server:
        server.url("/v/a.mp4")          # 200, video/mp4
        server.url("/404/a.mp4")        # 404
        server.url("/flaky/2/a.mp4")    # 500 twice per path, then the video
        server.url("/429/a.mp4")        # 429 with Retry-After: 1 once per path, then the video
        server.url("/cut/a.mp4")        # a body cut off mid-transfer (half the bytes, then the connection closed)
        server.url("/lie/a.mp4")        # Content-Length twice the body's length
        server.url("/stall/a.mp4")      # headers and 1 KiB, then nothing for `stall_s`
        server.url("/drip/a.mp4")       # the video 512 bytes every 0.25 s
        server.url("/html/a.mp4")       # 200 with text/html
        server.url("/redirect/3/a.mp4") # a chain of 3 redirects, then the video
        server.url("/to?u=http://...")  # a redirect to any URL
        server.url("/bomb")             # gzip-encoded: 1 GiB of zeros in about 1 MB
        server.url("/gzip/a.mp4")       # the video, gzip-encoded (a legitimate compressed body)
        server.url("/noise")            # 200 video/mp4 of random bytes: not a decodable video

``server.hits`` counts requests per path.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time
import urllib.parse
import zlib
from collections import Counter
from typing import Any


def _bomb(size: int) -> bytes:
    """gzip of ``size`` zero bytes, made in pieces (never ``size`` bytes in memory)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    block, out = bytes(1 << 20), []
    for _ in range(size // len(block)):
        out.append(comp.compress(block))
    out.append(comp.flush())
    return b"".join(out)


class UrlServer:
    """The server (module docstring); a context manager, listening on 127.0.0.1 on a free port."""

    def __init__(self, files: dict[str, bytes], stall_s: float = 30.0, bomb_bytes: int = 1 << 30) -> None:
        self.files, self.stall_s = files, stall_s
        self.hits: Counter[str] = Counter()
        self.lock = threading.Lock()
        self._bomb: bytes | None = None
        self.bomb_bytes = bomb_bytes
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> UrlServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def _count(self, path: str) -> int:
        with self.lock:
            self.hits[path] += 1
            return self.hits[path]

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        parsed = urllib.parse.urlsplit(h.path)
        path, query = parsed.path, urllib.parse.parse_qs(parsed.query)
        n = self._count(h.path)
        parts = path.strip("/").split("/")
        kind, name = parts[0], parts[-1]
        data = self.files.get(name)
        try:
            if kind == "v" and data is not None:
                return self._send(h, 200, data)
            if kind == "404":
                return self._send(h, 404, b"not here", "text/plain")
            if kind == "flaky" and data is not None:
                return self._send(h, 500, b"busy", "text/plain") if n <= int(parts[1]) else self._send(h, 200, data)
            if kind == "429" and data is not None:
                if n == 1:
                    return self._send(h, 429, b"slow down", "text/plain", {"Retry-After": "1"})
                return self._send(h, 200, data)
            if kind == "cut" and data is not None:
                self._head(h, 200, len(data))
                h.wfile.write(data[: len(data) // 2])
                h.wfile.flush()
                h.close_connection = True
                return None
            if kind == "lie" and data is not None:
                self._head(h, 200, 2 * len(data))
                h.wfile.write(data)
                h.wfile.flush()
                h.close_connection = True
                return None
            if kind == "stall" and data is not None:
                self._head(h, 200, len(data))
                h.wfile.write(data[:1024])
                h.wfile.flush()
                time.sleep(self.stall_s)
                h.close_connection = True
                return None
            if kind == "drip" and data is not None:
                self._head(h, 200, len(data))
                for i in range(0, len(data), 512):
                    h.wfile.write(data[i : i + 512])
                    h.wfile.flush()
                    time.sleep(0.25)
                return None
            if kind == "html":
                return self._send(h, 200, b"<html><body>a page, not a video</body></html>", "text/html")
            if kind == "redirect" and len(parts) == 3:
                left = int(parts[1])
                target = f"/redirect/{left - 1}/{name}" if left > 1 else f"/v/{name}"
                return self._send(h, 302, b"", "text/plain", {"Location": target})
            if kind == "to":
                return self._send(h, 302, b"", "text/plain", {"Location": query["u"][0]})
            if kind == "bomb":
                if self._bomb is None:
                    self._bomb = _bomb(self.bomb_bytes)
                return self._send(h, 200, self._bomb, "video/mp4", {"Content-Encoding": "gzip"})
            if kind == "gzip" and data is not None:
                return self._send(h, 200, gzip.compress(data), "video/mp4", {"Content-Encoding": "gzip"})
            if kind == "noise":
                return self._send(h, 200, bytes(range(256)) * 64, "video/mp4")
            return self._send(h, 404, b"no such path", "text/plain")
        except (BrokenPipeError, ConnectionResetError):
            return None

    @staticmethod
    def _head(h: http.server.BaseHTTPRequestHandler, code: int, length: int, ctype: str = "video/mp4",
              headers: dict[str, str] | None = None) -> None:  # fmt: skip
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(length))
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.end_headers()

    def _send(self, h: http.server.BaseHTTPRequestHandler, code: int, body: bytes, ctype: str = "video/mp4",
              headers: dict[str, str] | None = None) -> None:  # fmt: skip
        self._head(h, code, len(body), ctype, headers)
        h.wfile.write(body)
