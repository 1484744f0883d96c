"""Loopback-only networking for ``make pipeline-run RUNNER=container``, as the chart's NetworkPolicy gives a step pod.

A step pod of the chart may reach the object store and MLflow and nothing else. Here the step containers join the
network namespace of one *relay* container started with Docker's network ``none``: that namespace has the loopback
interface alone, so a step reaches no address of this machine or beyond, but for the ports listed when the run
starts (the object store's and MLflow's, read from ``AWS_ENDPOINT_URL``, ``MLFLOW_S3_ENDPOINT_URL`` and
``MLFLOW_TRACKING_URI``), which answer on the namespace's 127.0.0.1 at the same numbers as on this machine's, so
every URI means the same inside and out. Each such connection crosses a Unix socket in a folder mounted into the
relay container alone (not into the steps):

- in the relay container (:func:`pod_side`): a listener on 127.0.0.1:P hands each connection to ``<folder>/P.sock``;
- in the run's process (:class:`HostRelay`, a thread): a listener on ``<folder>/P.sock`` connects it to
  127.0.0.1:P of this machine.

The module uses the standard library alone: the relay container runs this very file (bind-mounted read-only), so
nothing of it is baked into vlp's image. ``python local_network.py pod FOLDER PORT...`` is the container's command.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import sys
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping

ENDPOINTS = ("AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL", "MLFLOW_TRACKING_URI")  # what a step connects to
READY = "relay ready"  # the relay container's line once every port listens
CHUNK = 1 << 16
_LIVE: set[asyncio.Task[None]] = set()  # the connections being relayed


def loopback_ports(environ: Mapping[str, str]) -> list[int]:
    """The ports a step may reach: those of the endpoints in ``environ`` (:data:`ENDPOINTS`), which must be on this
    machine's loopback; anything else is a ``ValueError`` naming it (the relay reaches the loopback alone)."""
    ports = set()
    for name in ENDPOINTS:
        value = environ.get(name, "")
        url = urllib.parse.urlsplit(value)
        if url.scheme not in ("http", "https"):
            continue  # unset, or a file store (sqlite://, a path): no connection
        host = url.hostname or ""
        try:
            local = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            local = False
        if not local:
            raise ValueError(
                f"{name}={value} is not on this machine's loopback, and a container run's steps reach the loopback "
                "alone (the chart's NetworkPolicy); run with --network host to reach it"
            )
        ports.add(url.port or (443 if url.scheme == "https" else 80))
    return sorted(ports)


Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _splice(a: Streams, b: Streams) -> None:
    """Copy bytes both ways until both ends are done; an end's EOF is passed on as a half-close, an error closes
    both."""

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    try:
        await asyncio.gather(one(a[0], b[1]), one(b[0], a[1]))
    except (ConnectionError, OSError):
        pass
    finally:
        for writer in (a[1], b[1]):
            writer.close()


def _handler(connect: Callable[[], Awaitable[Streams]]) -> Callable[..., Awaitable[None]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        _LIVE.add(task)  # asyncio holds a connection's task weakly (Python 3.11): without this, GC may end it mid-way
        try:
            try:
                other = await connect()
            except OSError:
                writer.close()  # the far side is down: the client sees the connection closed, as a refused port
                return
            await _splice((reader, writer), other)
        finally:
            _LIVE.discard(task)

    return handle


def _socket(folder: str, port: int) -> str:
    return os.path.join(folder, f"{port}.sock")


async def _pod_side(folder: str, ports: list[int]) -> None:
    servers = []
    for port in ports:
        path = _socket(folder, port)
        connect = lambda path=path: asyncio.open_unix_connection(path)  # noqa: E731
        servers.append(await asyncio.start_server(_handler(connect), "127.0.0.1", port))
    print(READY, *ports, flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def pod_side(folder: str, ports: list[int]) -> None:
    """The relay container's process: serve 127.0.0.1:P for each port until killed."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_pod_side(folder, ports))


class HostRelay:
    """This machine's half: a thread serving ``<folder>/P.sock`` for each port, each connection joined to
    127.0.0.1:P. The sockets are made connectable by the containers' uid (mode 666 in a folder of mode 755)."""

    def __init__(self, folder: str, ports: list[int]) -> None:
        self.folder, self.ports = folder, ports
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._servers: list[asyncio.Server] = []
        self.thread = threading.Thread(target=self._run, name="vlp-host-relay", daemon=True)

    def start(self) -> HostRelay:
        os.makedirs(self.folder, exist_ok=True)
        os.chmod(self.folder, 0o755)
        self.thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError(f"the host relay did not start: {self._error}")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            for port in self.ports:
                path = _socket(self.folder, port)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                connect = lambda port=port: asyncio.open_connection("127.0.0.1", port)  # noqa: E731
                self._servers.append(self.loop.run_until_complete(asyncio.start_unix_server(_handler(connect), path)))
                os.chmod(path, 0o666)
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()
        self.loop.close()

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:  # connections still open: cut, as a pod's network goes with it
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        asyncio.get_running_loop().stop()

    def stop(self) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
            self.thread.join(10)
        for port in self.ports:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_socket(self.folder, port))


if __name__ == "__main__":  # in the relay container
    if len(sys.argv) < 3 or sys.argv[1] != "pod":
        sys.exit("usage: python local_network.py pod FOLDER PORT...")
    pod_side(sys.argv[2], [int(port) for port in sys.argv[3:]])
