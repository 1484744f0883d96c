"""Training past one node: a Kubeflow Trainer v2 ``TrainJob`` launched, watched and cleaned up by the step's pod.

A training step whose settings ask for ``num_nodes > 1`` (``pipelines/config``) does not train in its own pod: it
creates a ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) that runs the same image and the same ``vlp`` command
line on every node under the ``torch-distributed`` ClusterTrainingRuntime, then

- polls it and prints every change of its conditions and of its node jobs' counts into the step's log;
- returns when its ``Complete`` condition is True, and raises :class:`TrainJobFailed` (the step fails) when its
  ``Failed`` condition is True or it disappears;
- deletes it when the step is cancelled (SIGTERM, what Argo sends when a run is terminated, or SIGINT); it is
  also owned by the step's pod when the pod's name and UID are known, so Kubernetes removes it with the pod.

The runtime sets ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and
``PET_MASTER_PORT`` in every node's container, which are torchrun's own defaults for ``--nnodes``,
``--nproc-per-node``, ``--node-rank``, ``--master-addr`` and ``--master-port``: the command is
``python -m torch.distributed.run -m vlp.cli <step> ...`` with no flags, and the training code reads only what
torchrun sets (``RANK``, ``WORLD_SIZE``, ...). The step config travels as text in ``VLP_STEP_CONFIG`` (a
component's config may be YAML text that exists only in the launching pod, and the launching pod refuses one
that carries a credential); object-store and MLflow credentials travel as references to their Secrets, never as
values. The node pods run as the steps' non-root user on a read-only root filesystem (``Launch.run_as``).
"""

from __future__ import annotations

import copy
import hashlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
API_VERSION = f"{GROUP}/{VERSION}"
NODE_JOB = "node"  # the torch-distributed runtime's replicated job (and container) name
MANAGER = "vlp.dev/launcher"  # runtimePatches entry owner
CONFIG_ENV = "VLP_STEP_CONFIG"
_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class TrainJobFailed(RuntimeError):
    """The TrainJob ended Failed (or vanished); the message carries its reason."""


@dataclass
class Launch:
    """What a multi-node step's TrainJob looks like (compiled from the step's settings, see
    ``pipelines.config.launch_settings``)."""

    num_nodes: int
    proc_per_node: int = 1
    image: str = ""
    runtime: str = "torch-distributed"
    resources: dict[str, dict[str, str]] = field(default_factory=dict)  # requests/limits of one node
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, str]] = field(default_factory=list)
    service_account: str = ""
    shm_size: str = ""
    env: list[dict[str, Any]] = field(default_factory=list)  # Kubernetes EnvVar objects (values or secret refs)
    pod_labels: dict[str, str] = field(default_factory=dict)  # on the node pods (e.g. the MLflow client label)
    run_as: dict[str, int] = field(default_factory=dict)  # {"user", "group"}: non-root, read-only root filesystem
    poll_s: float = 10.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Launch:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TrainJob launch settings {unknown}; known: {sorted(known)}")
        launch = cls(**data)
        if launch.num_nodes < 2 or launch.proc_per_node < 1:
            raise ValueError(f"a TrainJob needs num_nodes >= 2 and proc_per_node >= 1, got {data}")
        if not launch.image:
            raise ValueError("a TrainJob needs the step's image")
        if launch.run_as and (set(launch.run_as) != {"user", "group"} or min(launch.run_as.values()) < 1):
            raise ValueError(f"run_as must be {{'user': uid, 'group': gid}} with both > 0, got {launch.run_as}")
        return launch


def job_name(step: str, run_key: str) -> str:
    """A DNS-1035 name (<= 63 characters) unique to a step of one run attempt."""
    digest = hashlib.sha256(f"{step}\0{run_key}".encode()).hexdigest()[:10]
    return f"vlp-{step.replace('_', '-')[:40]}-{digest}"


def command(cli: Sequence[str], overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """The node container's ``(command, args)``: write the config from its env var to a fresh temporary file,
    then torchrun the step with it (``--config`` last: the overrides are positional)."""
    script = (f'cfg=$(mktemp) && printf "%s" "${CONFIG_ENV}" > "$cfg" && '
              'exec python -m torch.distributed.run -m vlp.cli "$@" --config "$cfg"')  # fmt: skip
    return ["/bin/sh", "-c", script, "vlp-trainjob"], [*cli, *overrides]


def manifest(
    name: str,
    namespace: str,
    launch: Launch,
    cli: Sequence[str],
    overrides: Sequence[str],
    config_text: str,
    labels: dict[str, str] | None = None,
    owner: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The TrainJob object for ``launch`` running ``vlp <cli> --config <config_text> <overrides>`` on every node."""
    cmd, args = command(cli, overrides)
    trainer: dict[str, Any] = {
        "image": launch.image,
        "command": cmd,
        "args": args,
        "numNodes": launch.num_nodes,
        "numProcPerNode": launch.proc_per_node,
        "env": [{"name": CONFIG_ENV, "value": config_text}, *launch.env],
    }
    if launch.resources:
        trainer["resourcesPerNode"] = launch.resources
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if owner:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "blockOwnerDeletion": False, **owner}]
    spec: dict[str, Any] = {
        "runtimeRef": {"apiGroup": GROUP, "kind": "ClusterTrainingRuntime", "name": launch.runtime},
        "trainer": trainer,
    }
    pod = _pod_patch(launch)
    if pod or launch.pod_labels:
        template: dict[str, Any] = {"spec": pod} if pod else {}
        if launch.pod_labels:
            template["metadata"] = {"labels": dict(launch.pod_labels)}
        job = {"name": NODE_JOB, "template": {"spec": {"template": template}}}
        spec["runtimePatches"] = [
            {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}
        ]
    return {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": spec}


def _pod_patch(launch: Launch) -> dict[str, Any]:
    """The node pods' scheduling, /dev/shm and security, as the runtime patch allows (no env: that is
    ``trainer.env``)."""
    pod: dict[str, Any] = {}
    if launch.node_selector:
        pod["nodeSelector"] = dict(launch.node_selector)
    if launch.tolerations:
        pod["tolerations"] = [dict(t) for t in launch.tolerations]
    if launch.service_account:
        pod["serviceAccountName"] = launch.service_account
    volumes, mounts = [], []
    if launch.shm_size:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": launch.shm_size}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    container: dict[str, Any] = {"name": NODE_JOB}
    if launch.run_as:
        pod["securityContext"] = _pod_security(launch.run_as)
        container["securityContext"] = copy.deepcopy(CONTAINER_SECURITY)
        volumes += [{"name": name, "emptyDir": {}} for name in SCRATCH]
        mounts += [{"name": name, "mountPath": path} for name, path in SCRATCH.items()]
    if volumes:
        pod["volumes"] = volumes
        container["volumeMounts"] = mounts
    if len(container) > 1:
        pod["containers"] = [container]
    return pod


# The node container as the Helm chart runs its own: no privilege escalation, no capabilities, a read-only root
# filesystem with emptyDirs where the step writes (mktemp's config file, caches in $HOME). The image-test runs the
# node command exactly so (scripts/image-test.sh).
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
SCRATCH = {"tmp": "/tmp", "home": "/home/vlp"}  # emptyDir name -> mount path


def _pod_security(run_as: dict[str, int]) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": run_as["user"],
        "runAsGroup": run_as["group"],
        "fsGroup": run_as["group"],
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# --------------------------------------------------------------------------- status


def finished(obj: dict[str, Any]) -> str:
    """``"Complete"``, ``"Failed"`` or ``""`` (still running), from the TrainJob's conditions."""
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return condition["type"]
    return ""


def describe(obj: dict[str, Any]) -> str:
    """One line of what the TrainJob's status says: its true conditions and its node jobs' counts."""
    status = obj.get("status") or {}
    parts = []
    for c in status.get("conditions") or []:
        if c.get("status") == "True":
            why = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
            parts.append(f"{c['type']}" + (f" ({why})" if why else ""))
    for job in status.get("jobsStatus") or []:
        counts = ", ".join(f"{k} {job[k]}" for k in ("active", "ready", "succeeded", "failed") if job.get(k))
        parts.append(f"{job.get('name', '?')}: {counts or 'no pods yet'}")
    return "; ".join(parts) or "no status yet"


# --------------------------------------------------------------------------- the launcher


class Launcher:
    """Create a TrainJob, wait for it, delete it on cancel. ``api`` is a ``kubernetes.client.ApiClient``."""

    def __init__(self, api: Any, namespace: str, log: Callable[[str], None] = print) -> None:
        from kubernetes import client

        self.objects = client.CustomObjectsApi(api)
        self.namespace, self.log = namespace, log
        self._cancelled = 0

    def run(self, body: dict[str, Any], poll_s: float = 10.0, timeout_s: float = 0.0) -> dict[str, Any]:
        """Create ``body`` (or adopt the TrainJob of that name: a retried launcher) and wait for it to end;
        returns its last state. Raises :class:`TrainJobFailed`; deletes it and exits 143 when cancelled."""
        name = body["metadata"]["name"]
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._create(body)
            return self._wait(name, poll_s, timeout_s)
        except _Cancelled:
            self.log(f"trainjob {name}: cancelled (signal {self._cancelled}); deleting it")
            self.delete(name)
            raise SystemExit(128 + self._cancelled) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._cancelled = signum
        raise _Cancelled

    def _create(self, body: dict[str, Any]) -> None:
        from kubernetes.client.rest import ApiException

        name = body["metadata"]["name"]
        try:
            self.objects.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
            nodes = body["spec"]["trainer"]["numNodes"]
            self.log(f"trainjob {name}: created in {self.namespace} ({nodes} nodes, runtime "
                     f"{body['spec']['runtimeRef']['name']})")  # fmt: skip
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.log(f"trainjob {name}: exists already (a retried launcher); following it")

    def _wait(self, name: str, poll_s: float, timeout_s: float) -> dict[str, Any]:
        from kubernetes.client.rest import ApiException

        start, last = time.monotonic(), ""
        while True:
            try:
                obj = self.objects.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
            except ApiException as exc:
                if exc.status == 404:
                    raise TrainJobFailed(f"trainjob {name} was deleted before it finished") from None
                raise
            line = describe(obj)
            if line != last:
                self.log(f"trainjob {name}: {line}")
                last = line
            state = finished(obj)
            if state == "Complete":
                return obj
            if state == "Failed":
                raise TrainJobFailed(f"trainjob {name} failed: {line}")
            if timeout_s and time.monotonic() - start > timeout_s:
                self.delete(name)
                raise TrainJobFailed(f"trainjob {name} did not finish in {timeout_s:g} s; deleted it")
            time.sleep(poll_s)

    def delete(self, name: str) -> None:
        """Delete the TrainJob and, in the foreground, its JobSet and pods; a missing one is not an error."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            self.objects.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                body=client.V1DeleteOptions(propagation_policy="Foreground"),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise


class _Cancelled(BaseException):
    """Raised from the signal handler inside the wait."""


def in_cluster() -> tuple[Any, str]:
    """A Kubernetes API client from the pod's ServiceAccount, and the pod's namespace."""
    from kubernetes import client, config

    config.load_incluster_config()
    with open(_SA_NAMESPACE, encoding="utf-8") as fh:
        namespace = fh.read().strip()
    return client.ApiClient(), namespace


def pod_owner() -> dict[str, str] | None:
    """The launching pod as an owner reference (KFP sets ``KFP_POD_NAME`` and ``KFP_POD_UID``), else None."""
    name, uid = os.environ.get("KFP_POD_NAME", ""), os.environ.get("KFP_POD_UID", "")
    return {"name": name, "uid": uid} if name and uid else None


def log_line(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True, file=sys.stdout)
