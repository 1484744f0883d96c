"""Servers that fail on purpose, for the outage tests and ``benchmarks/fault_battery.py``.

:class:`FaultyProxy`: an HTTP proxy in front of a real S3 server that injects 5xx answers and connection resets
on chosen requests. boto3 talks to it as to any S3 endpoint; every request is forwarded unchanged (headers
included, so signatures still match) unless ``faults`` says otherwise.

:class:`MlflowServer`: a real ``mlflow server`` process on a fixed port and sqlite file, to kill and restart.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

# faults(method, path) -> None (forward), "503" (answer 503 SlowDown), "reset" (drop the connection) or "truncate"
# (forward, then send the headers and only half the body before closing: a transfer cut off mid-way)
Fault = Callable[[str, str], str | None]


class FaultyProxy:
    """``with FaultyProxy(upstream_url, faults) as url:`` an endpoint that misbehaves as ``faults`` decides."""

    def __init__(self, upstream: str, faults: Fault) -> None:
        self.upstream = urlsplit(upstream)
        self.faults = faults
        self.injected: list[tuple[str, str, str]] = []  # (method, path, fault) in order
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fault = proxy.faults(self.command, self.path)
                if fault:
                    with proxy._lock:
                        proxy.injected.append((self.command, self.path, fault))
                if fault == "reset":  # RST instead of FIN: the client sees "connection reset by peer"
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if fault == "503":
                    payload = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status)
                for key, value in resp.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fault == "truncate":
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.connection.close()
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> str:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def fail_first(n: int, fault: str, key_part: str, method: str = "GET") -> Fault:
    """A policy that answers the first ``n`` ``method`` requests for paths containing ``key_part`` with ``fault``."""
    seen = {"n": 0}
    lock = threading.Lock()

    def policy(req_method: str, path: str) -> str | None:
        if req_method != method or key_part not in path:
            return None
        with lock:
            seen["n"] += 1
            return fault if seen["n"] <= n else None

    return policy


class MlflowServer:
    """``mlflow server --workers 1`` on a fixed loopback port and sqlite file, so it can be killed and restarted."""

    def __init__(
        self,
        root: Path,
        artifacts: list[str] | None = None,
        env: dict[str, str] | None = None,
        extra: list[str] | None = None,
    ) -> None:
        """``artifacts``: the server's artifact flags (default: a local ``--default-artifact-root``); ``extra``:
        more flags (e.g. ``--app-name basic-auth``)."""
        self.extra = list(extra or [])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.root, self.url, self.proc = root, f"http://127.0.0.1:{self.port}", None
        self.artifacts = artifacts or ["--default-artifact-root", (root / "artifacts").as_uri()]
        self.env = {**os.environ, **(env or {})}

    def start(self) -> None:
        cmd = [str(Path(sys.executable).with_name("mlflow")), "server", "--workers", "1", "--host", "127.0.0.1",
               "--port", str(self.port), "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
               *self.artifacts, "--allowed-hosts", f"127.0.0.1:{self.port},localhost:{self.port}",
               *self.extra]  # fmt: skip
        log = open(self.root / "mlflow.log", "ab")  # noqa: SIM115 - the server process owns it
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start: {(self.root / 'mlflow.log').read_text()[-3000:]}")
            time.sleep(0.3)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # as an OOM kill or a node loss would
            self.proc.wait(timeout=30)
