"""``make pipeline-run RUNNER=container`` (pipelines/local_container.py): what a container run refuses before it
starts, and which task a container runs. The container run itself is `.ci/run`'s, after `make image-test` has built
the image; here, where podman and that image exist, one task of a real DAG runs in it too."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines import local_container

ROOT = Path(__file__).resolve().parents[1]


def test_the_task_of_a_container_is_the_folder_of_its_executor_output():
    executor_input = {"outputs": {"outputFile": "/runs/x/kfp/vlp-retrieval-2026-12-05/finish-run/executor_output.json"}}
    command = ["sh", "-c", "python3 -m kfp.dsl.executor_main", "--executor_input", json.dumps(executor_input)]
    assert local_container.task_of(command) == "finish-run"
    compact = json.dumps(executor_input, separators=(",", ":"))
    assert local_container.task_of(["--executor_input", compact]) == "finish-run"
    assert local_container.task_of(["python3", "-c", "print(1)"]) == "?"


def test_a_run_without_a_docker_api_is_refused_in_one_line_that_says_how_to_start_one(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    with pytest.raises(RuntimeError, match=r"^no Docker API at DOCKER_HOST='unix://.*none\.sock' .*: start one with "
                       r"`eval \$\(scripts/podman-service\.sh start \.cache/podman\)`$"):  # fmt: skip
        local_container.check(local_container.IMAGE)
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.local_run", "--runner", "container", "--out", str(tmp_path / "out"),
         "--pipeline", "retrieval"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/x"},
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("pipelines.local_run: error: no Docker API at DOCKER_HOST")
    assert done.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


def test_a_local_path_is_refused_in_one_line_before_anything_runs(tmp_path):
    """The containers see the pipeline root alone: a local source_uri (or an index DAG's local model) is refused,
    naming it and what to pass instead, before the Docker API is asked anything."""
    index = ["--pipeline", "index", "--param", f"model={tmp_path}/m", "--param", "frames=s3://b/frames"]
    for extra in (["--source-uri", str(tmp_path / "ann.json")], index):
        done = subprocess.run([sys.executable, "-m", "pipelines.local_run", "--runner", "container", "--out",
                               str(tmp_path / "out"), *extra], capture_output=True, text=True, timeout=120, cwd=ROOT,
                              env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/x"})  # fmt: skip
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "a container sees no path of this machine; put it in object storage" in done.stderr
        assert str(tmp_path) in done.stderr and "frames=" not in done.stderr and not (tmp_path / "out").exists()


def _podman_with_image() -> str | None:
    """DOCKER_HOST of a podman service holding make image-test's image, or None."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        return None
    if subprocess.run(["podman", "image", "exists", local_container.IMAGE], capture_output=True).returncode != 0:
        return None
    started = subprocess.run([str(ROOT / "scripts" / "podman-service.sh"), "start", str(ROOT / ".cache" / "podman")],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    return started.stdout.strip().removeprefix("export DOCKER_HOST=") if started.returncode == 0 else None


@pytest.fixture
def docker_host(monkeypatch: pytest.MonkeyPatch) -> str:
    """A podman service's DOCKER_HOST (set for the test). Skipped without podman, runc and the image, unless
    ``VLP_CONTAINER_TESTS=required`` (``.ci/run``, after building the image): then a failure."""
    host = _podman_with_image()
    if host is None:
        reason = "needs podman, runc and make image-test's image (.ci/run runs these after building it)"
        if os.environ.get("VLP_CONTAINER_TESTS") == "required":
            pytest.fail(reason)
        pytest.skip(reason)
    monkeypatch.setenv("DOCKER_HOST", host)
    return host


def test_a_step_that_writes_outside_its_folders_fails_with_a_clear_error(docker_host, capsys):
    """The root filesystem is read-only for uid 10001, as in the chart's pods: a write to the code's folder fails
    with the OS's own message, and the container's exit code is what the run sees (not taken as a success)."""
    import docker

    client = docker.from_env()
    volumes: dict = {}
    command = ["python", "-c", "import os; print(os.getuid(), os.getcwd()); open('/opt/vlp/written', 'w')"]
    code = local_container.run_container(client, local_container.IMAGE, command, volumes,
                                         **local_container.runner().container_run_args)  # fmt: skip
    assert code == 1
    out = capsys.readouterr().out
    assert out.startswith("10001 /opt/vlp\n") and "[Errno 30] Read-only file system: '/opt/vlp/written'" in out
    last = local_container.STARTED[-1]
    assert (last.user, last.exit_code, last.image) == ("10001:10001", 1, local_container.IMAGE)


def test_a_step_reaches_the_relayed_ports_of_this_machine_and_nothing_else(docker_host, capsys):
    """The steps' network namespace (pipelines/local_network.py) has the loopback alone: the relayed port answers at
    its own number, another port listening on this machine's loopback does not, nor does any address beyond it."""
    import docker

    listening = []
    for _ in range(2):  # two ports listening here; the first is relayed
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        listening.append(s)
    relayed, other = (s.getsockname()[1] for s in listening)
    probe = f"""import socket
for host, port in [('127.0.0.1', {relayed}), ('127.0.0.1', {other}), ('1.1.1.1', 80)]:
    try:
        socket.create_connection((host, port), timeout=5).close(); print(host, port, 'open')
    except OSError as e: print(host, port, e.strerror)
print(sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]))
"""
    relay = local_container.start_relay(local_container.IMAGE, [relayed])
    try:
        run_args = local_container.runner(relay.network_mode).container_run_args
        code = local_container.run_container(docker.from_env(), local_container.IMAGE, ["python", "-c", probe], {},
                                             **run_args)  # fmt: skip
    finally:
        relay.stop()
        for s in listening:
            s.close()
    assert code == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"127.0.0.1 {relayed} open", f"127.0.0.1 {other} Connection refused",
                   "1.1.1.1 80 Network is unreachable", "['lo']"]  # fmt: skip
