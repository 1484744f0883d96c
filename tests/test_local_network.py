"""The container run's loopback-only network (pipelines/local_network.py): which ports the steps may reach, and the
host half of the relay joining a Unix socket to a port of this machine's loopback, on real sockets. The relay in a
container (a namespace with the loopback alone) is tests/test_local_container.py's, where podman and the image
exist."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from pipelines import local_network


def test_the_reachable_ports_are_the_endpoints_on_the_loopback():
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "MLFLOW_TRACKING_URI": "http://localhost:5001/",
           "MLFLOW_S3_ENDPOINT_URL": "http://127.0.0.1:9000", "UNRELATED": "http://10.0.0.1:1"}  # fmt: skip
    assert local_network.loopback_ports(env) == [5001, 9000]
    assert local_network.loopback_ports({"AWS_ENDPOINT_URL": "https://[::1]"}) == [443]
    # a file store, or nothing set: nothing to reach
    assert local_network.loopback_ports({"MLFLOW_TRACKING_URI": "sqlite:////tmp/m.db"}) == []
    assert local_network.loopback_ports({}) == []


@pytest.mark.parametrize("url", ["http://10.0.0.5:9000", "https://s3.example.com", "http://169.254.169.254/"])
def test_an_endpoint_off_the_loopback_is_refused_with_its_name_and_the_way_out(url):
    with pytest.raises(ValueError) as refused:
        local_network.loopback_ports({"AWS_ENDPOINT_URL": url})
    assert f"AWS_ENDPOINT_URL={url} is not on this machine's loopback" in str(refused.value)
    assert "--network host" in str(refused.value)


class _Server(http.server.ThreadingHTTPServer):
    request_queue_size = 64  # 20 connections at once: the default backlog (5) would reset some, as it should


class _Echo(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[::-1])

    def log_message(self, *args: object) -> None:
        pass


def _request(path: str, body: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(b"POST / HTTP/1.0\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        s.shutdown(socket.SHUT_WR)  # a half-close: the answer must still come back
        answer = b""
        while chunk := s.recv(1 << 16):
            answer += chunk
    return answer


def test_the_host_relay_joins_its_socket_to_the_port_and_passes_a_half_close(tmp_path):
    server = _Server(("127.0.0.1", 0), _Echo)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    folder = tmp_path / "relay"
    relay = local_network.HostRelay(str(folder), [port]).start()
    try:
        path = folder / f"{port}.sock"
        assert oct(path.stat().st_mode & 0o777) == "0o666"  # connectable by the containers' uid
        body = bytes(range(256)) * 1024  # 256 KiB: several chunks each way
        answer = _request(str(path), body)
        assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(body[::-1])
        # many at once
        results: list[bytes] = []
        threads = [threading.Thread(target=lambda i=i: results.append(_request(str(path), b"%05d" % i)))
                   for i in range(20)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(r[-5:] for r in results) == sorted((b"%05d" % i)[::-1] for i in range(20))
    finally:
        relay.stop()
        server.shutdown()
        server.server_close()
    assert not (folder / f"{port}.sock").exists()


def test_a_port_where_nothing_listens_closes_the_connection_as_a_refused_port_would(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    relay = local_network.HostRelay(str(tmp_path / "relay"), [port]).start()
    try:
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(str(tmp_path / "relay" / f"{port}.sock"))
            c.settimeout(10)
            assert c.recv(1) == b""  # closed, no bytes, no hang
    finally:
        relay.stop()
