"""``make pipeline-run RUNNER=container``: every task of a ``kfp.local`` DAG in vlp's own image, as a pod runs it.

``kfp.local``'s DockerRunner starts each task's container through a Docker API (here podman's,
``scripts/podman-service.sh``) with the pipeline root bind-mounted at its own path. :func:`runner` gives it
what the chart's pods have: the image's uid and gid (10001, ``run_as`` in the pipeline config), a read-only root
filesystem with memory-backed ``/tmp`` and home directory (a pod's emptyDirs) and ``/dev/shm``, and a network
namespace with the loopback alone, where the object store's and MLflow's ports answer and nothing else does
(:func:`start_relay`, :mod:`pipelines.local_network`), as the chart's NetworkPolicy lets a step pod reach those two.

Three things of kfp.local's container run are replaced while a run lasts (:func:`patched`), each for a reason:

- the task's command replaces the image's entrypoint, as a pod's ``command`` does (kfp.local passes it as Docker's
  ``command``, which would follow vlp's ``ENTRYPOINT ["vlp"]``);
- the container is removed only after its exit code is read: kfp.local (2.17) starts it with ``auto_remove`` and
  takes a container gone before ``wait`` as a success, so a step that failed fast could pass;
- the environment a container gets is the task's (what the compiled DAG sets) and the credentials of the run
  (``AWS_*``, ``MLFLOW_TRACKING_*`` from this process's environment, never from a parameter), as a pod gets its
  Secrets; kfp.local gives the task's alone. Images are never pulled (nothing outside this machine is reached):
  a missing one is an error that says to build it (``make image-test``).

Each task's container is recorded in :data:`STARTED` (task, image, digest, user, exit code, seconds).
:func:`start_tracking_server` runs the run's MLflow server from the same image, as the chart runs it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pipelines import local_network
from pipelines.local_talk import ExecutorFilter

IMAGE = "localhost/vlp:image-test"  # what `make image-test` builds and checks
RUN_AS = "10001:10001"  # docker/Dockerfile's USER; the chart's pods and pipelines/config's run_as
# What a container takes from this process's environment besides the task's: the run's credentials and endpoints
# (a pod's Secrets and the chart's settings, the MLflow server's URI among them) and the run id (a pod's
# pipeline/runid label, which local_run sets).
FROM_HOST = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION",
             "AWS_DEFAULT_REGION", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_S3_ENDPOINT_URL",
             "MLFLOW_TRACKING_URI", "KFP_RUN_ID")  # fmt: skip


@dataclass
class Started:
    """One task's container: its task, image (by name and digest), the user its process ran as, exit code, time."""

    task: str
    image: str
    digest: str
    user: str
    exit_code: int
    seconds: float


STARTED: list[Started] = []
VERBOSE = False  # True: the executor's own lines too (local_run --verbose)


def runner(network_mode: str = "none", shm_size: str = "1g") -> Any:
    """kfp.local's DockerRunner with a pod's settings (module docstring). ``network_mode``: ``"container:<id>"``
    of :func:`start_relay`'s container (the loopback, where the object store and MLflow answer), ``"none"`` (the
    loopback, where nothing answers) or ``"host"`` (this machine's network, for endpoints off its loopback)."""
    from kfp import local

    return local.DockerRunner(
        user=RUN_AS,
        read_only=True,
        tmpfs={"/tmp": "rw,exec,size=2g", "/home/vlp": "rw,size=256m"},
        shm_size=shm_size,
        network_mode=network_mode,
    )


@dataclass
class Relay:
    """The network namespace the steps join (:mod:`pipelines.local_network`): its container and this process's
    half of the relay."""

    container: Any
    host: local_network.HostRelay
    ports: list[int]

    @property
    def network_mode(self) -> str:
        return f"container:{self.container.id}"

    def stop(self) -> None:
        from docker import errors  # type: ignore[attr-defined]  # docker-py ships no type information

        with contextlib.suppress(errors.APIError):
            self.container.remove(force=True)
        self.host.stop()
        shutil.rmtree(self.host.folder, ignore_errors=True)


def start_relay(image: str, ports: list[int], timeout_s: float = 60) -> Relay:
    """Start the relay container (network ``none``, uid 10001, read-only root, running
    :mod:`pipelines.local_network` bind-mounted read-only) and this process's half; returns once every port
    listens in the container's namespace."""
    import docker

    folder = tempfile.mkdtemp(prefix="vlp-relay-")  # short: a Unix socket's path holds at most 107 bytes
    host = local_network.HostRelay(folder, ports).start()
    client = docker.from_env()  # type: ignore[attr-defined]
    script = os.path.abspath(local_network.__file__)
    container = client.containers.run(
        image, entrypoint=["python", "/relay/local_network.py"], command=["pod", "/relay/sockets", *map(str, ports)],
        network_mode="none", user=RUN_AS, read_only=True, detach=True,
        volumes={script: {"bind": "/relay/local_network.py", "mode": "ro"},
                 folder: {"bind": "/relay/sockets", "mode": "ro"}},
    )  # fmt: skip
    relay = Relay(container, host, ports)
    deadline = time.monotonic() + timeout_s
    while local_network.READY not in (logs := container.logs().decode(errors="replace")):
        container.reload()
        if container.status == "exited" or time.monotonic() > deadline:
            relay.stop()
            raise RuntimeError(f"the network relay in {image} did not start: {logs[-400:]}")
        time.sleep(0.1)
    return relay


def check(image: str) -> str:
    """Refuse, in one line, a run that could not start a container: no Docker API at ``$DOCKER_HOST`` (start one
    with ``scripts/podman-service.sh``), or no ``image`` on this machine (build it with ``make image-test``).
    Returns the image's id."""
    import docker
    from docker import errors  # type: ignore[attr-defined]  # docker-py ships no type information

    try:
        client = docker.from_env()  # type: ignore[attr-defined]
        client.ping()
    except errors.DockerException as exc:
        raise RuntimeError(
            f"no Docker API at DOCKER_HOST={os.environ.get('DOCKER_HOST', '')!r} ({str(exc)[:120]}): start one with "
            "`eval $(scripts/podman-service.sh start .cache/podman)`"
        ) from None
    try:
        return str(client.images.get(image).id)
    except errors.ImageNotFound:
        raise RuntimeError(f"no image {image!r} on this machine: build it with `make image-test`") from None


def task_of(command: list[str]) -> str:
    """The task a kfp.local container command runs: the folder of its executor output file (``.../<task>/
    executor_output.json`` in the ``--executor_input`` JSON), or ``"?"``."""
    found = re.search(r'"outputFile":\s*"[^"]*/([^/"]+)/executor_output\.json"', " ".join(command))
    return found.group(1) if found else "?"


def run_container(client: Any, image: str, command: list[str], volumes: dict[str, Any], **args: Any) -> int:
    """Run one task's container to its end; its output goes to stdout; returns its exit code (see the module
    docstring for what differs from kfp.local's own)."""
    from docker import errors  # type: ignore[attr-defined]  # docker-py ships no type information

    try:
        found = client.images.get(image)
    except errors.ImageNotFound:
        raise RuntimeError(f"no image {image!r} on this machine: build it with `make image-test`") from None
    env = dict(args.pop("environment", None) or {})
    env |= {name: os.environ[name] for name in FROM_HOST if name in os.environ}
    start = time.perf_counter()
    # a pod's `command` replaces the image's ENTRYPOINT (vlp's is `vlp`); Docker's `command` would be appended to it
    container = client.containers.run(image=image, entrypoint=command[:1], command=command[1:], volumes=volumes,
                                      environment=env, detach=True, stdout=True, stderr=True, **args)  # fmt: skip
    try:
        keep = ExecutorFilter()
        for line in container.logs(stream=True, follow=True):  # a line at a time
            text = line.decode(errors="replace")
            if VERBOSE or keep.keep(text):
                sys.stdout.write(text)
        code = int(container.wait()["StatusCode"])
        user = container.attrs.get("Config", {}).get("User", "")
    finally:
        with contextlib.suppress(errors.APIError):
            container.remove(force=True)
    STARTED.append(Started(task_of(command), image, found.id, user, code, round(time.perf_counter() - start, 1)))
    return code


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """kfp.local's container start replaced by :func:`run_container` while inside."""
    from kfp.local import docker_task_handler

    saved = docker_task_handler.run_docker_container
    docker_task_handler.run_docker_container = run_container
    try:
        yield
    finally:
        docker_task_handler.run_docker_container = saved


@dataclass
class TrackingServer:
    """An MLflow server in vlp's image, run as the chart runs it: basic-auth on (an admin made at its first start,
    a step user made through the API, a fresh signing key), the backend store in ``data`` (sqlite), artifacts proxied
    to ``artifacts`` (an ``s3://`` prefix) or kept in ``data``. ``uri`` is where it listens (the host's loopback)."""

    uri: str
    container: Any
    data: str
    step_user: tuple[str, str]

    def stop(self) -> None:
        from docker import errors  # type: ignore[attr-defined]  # docker-py ships no type information

        with contextlib.suppress(errors.APIError):
            self.container.remove(force=True)


def logins_of(data: str) -> dict[str, str]:
    """The server's passwords and signing key: random on its first start, then read back from
    ``<data>/logins.json`` (mode 600, beside the stores), because its auth database keeps the admin made at the first
    start and the step user's rights on the experiments it made, so a rerun into the same ``--out`` must log in as
    the same users."""
    import json
    import secrets

    path = os.path.join(data, "logins.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return dict(json.load(f))
    made = {
        "admin": secrets.token_urlsafe(18),
        "steps": secrets.token_urlsafe(18),
        "signing_key": secrets.token_hex(16),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(made, f)
    return made


def start_tracking_server(image: str, data: str, artifacts: str = "") -> TrackingServer:
    """Start :class:`TrackingServer` (module docstring of :mod:`pipelines.local_container`); waits until it answers
    and its step user exists. The passwords (:func:`logins_of`) reach the containers through their environment
    only, never a parameter."""
    import socket

    import docker

    from vlp import tracking_auth

    client = docker.from_env()  # type: ignore[attr-defined]
    os.makedirs(data, exist_ok=True)
    os.chmod(data, 0o777)  # written by the containers' uid 10001
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logins = logins_of(data)
    admin, step = ("vlp-admin", logins["admin"]), ("vlp-steps", logins["steps"])
    pod = dict(user=RUN_AS, read_only=True, tmpfs={"/tmp": "rw,size=256m", "/home/vlp": "rw,size=64m"},
               network_mode="host", volumes={data: {"bind": "/data", "mode": "rw"}})  # fmt: skip
    # the chart's init container: basic_auth.ini from the environment
    auth = {"MLFLOW_AUTH_DEFAULT_PERMISSION": "READ", "MLFLOW_AUTH_DATABASE_URI": "sqlite:////data/basic_auth.db"}
    write = ["-m", "vlp.tracking_auth", "write-config", "/data/basic_auth.ini"]
    client.containers.run(image, entrypoint=["python"], command=write, remove=True, environment=auth, **pod)
    env = {
        "MLFLOW_BACKEND_STORE_URI": "sqlite:////data/mlflow.db",
        "MLFLOW_AUTH_CONFIG_PATH": "/data/basic_auth.ini",
        "MLFLOW_AUTH_ADMIN_USERNAME": admin[0],
        "MLFLOW_AUTH_ADMIN_PASSWORD": admin[1],
        "MLFLOW_FLASK_SERVER_SECRET_KEY": logins["signing_key"],
    } | {name: os.environ[name] for name in FROM_HOST if name.startswith("AWS_") and name in os.environ}
    destination = artifacts or "/data/mlartifacts"
    args = ["server", "--host=127.0.0.1", f"--port={port}", "--workers=1", "--serve-artifacts",
            f"--artifacts-destination={destination}", f"--allowed-hosts=127.0.0.1:{port},localhost:{port}",
            "--app-name=basic-auth"]  # fmt: skip
    container = client.containers.run(image, entrypoint=["mlflow"], command=args, environment=env, detach=True, **pod)
    server = TrackingServer(f"http://127.0.0.1:{port}", container, data, step)
    try:
        tracking_auth.wait_healthy(server.uri, timeout_s=120)
        tracking_auth.ensure_user(server.uri, admin, *step)
    except Exception:
        logs = container.logs(tail=20).decode(errors="replace")
        server.stop()
        raise RuntimeError(f"the MLflow server in {image} did not start: {logs}") from None
    return server
