"""Multi-node training through Kubeflow Trainer (components/trainjob.py).

- The TrainJob a step generates validates against the TrainJob CRD's OpenAPI schema (tests/fixtures/trainjob_crd,
  from kubeflow/trainer; jsonschema checks types, enums, required keys and patterns, not the CEL rules).
- The launcher's create / watch / fail / cancel logic runs against a local HTTP server that answers the
  Kubernetes API calls it makes (no API server can run here), through the official ``kubernetes`` client.
- The node command, run as two "nodes" with only the environment a torch-distributed runtime sets (``PET_*``),
  trains exactly what ``torchrun --nproc-per-node 2`` trains on one node.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from components import trainjob
from pipelines import config as pipeline_config

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "tests/fixtures/trainjob_crd/trainjob-v1alpha1.schema.json").read_text())
TINY = REPO / "configs" / "tiny.yaml"
PREFIX = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs"


def gpu_launch(**extra: Any) -> trainjob.Launch:
    settings = {
        "num_nodes": 4,
        "proc_per_node": 8,
        "image": "registry.example/vlp:1.0-cuda",
        "resources": {"requests": {"cpu": "8", "nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}},
        "node_selector": {"vlp.dev/node-pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "service_account": "vlp-trainer",
        "shm_size": "64Gi",
        "env": [{"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "vlp-s3", "key": "id"}}}],
        **extra,
    }
    return trainjob.Launch.from_dict(settings)


def body(name: str = "vlp-pretrain-0123456789", launch: trainjob.Launch | None = None) -> dict[str, Any]:
    cli = ["pretrain", "--dataset", "s3://b/ds", "--frames", "s3://b/fr", "--out", "s3://b/model"]
    owner = {"name": "run-pod-1", "uid": "7f1c"}
    return trainjob.manifest(name, "ml", launch or gpu_launch(), cli, ["pretrain.max_steps=2"], "seed: 1\n",
                             {"vlp.dev/step": "pretrain"}, owner)  # fmt: skip


# --------------------------------------------------------------------------- the manifest


def test_the_generated_trainjob_validates_against_the_crd_schema() -> None:
    job = body()
    jsonschema.validate(job, SCHEMA)  # raises on any mismatch
    spec = job["spec"]
    assert spec["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                  "name": "torch-distributed"}  # fmt: skip
    trainer = spec["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (4, 8)
    assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "8"}
    assert trainer["env"][0] == {"name": "VLP_STEP_CONFIG", "value": "seed: 1\n"}
    assert trainer["env"][1]["valueFrom"]["secretKeyRef"] == {"name": "vlp-s3", "key": "id"}  # a reference only
    assert "torch.distributed.run -m vlp.cli" in trainer["command"][2] and "--nnodes" not in trainer["command"][2]
    assert trainer["args"][:2] == ["pretrain", "--dataset"] and trainer["args"][-1] == "pretrain.max_steps=2"
    (patch,) = spec["runtimePatches"]
    (job_patch,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = job_patch["template"]["spec"]["template"]["spec"]
    assert job_patch["name"] == "node" and pod["nodeSelector"] == {"vlp.dev/node-pool": "gpu"}
    assert pod["serviceAccountName"] == "vlp-trainer" and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert pod["containers"] == [{"name": "node", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}]
    assert job["metadata"]["ownerReferences"][0] == {"apiVersion": "v1", "kind": "Pod", "blockOwnerDeletion": False,
                                                     "name": "run-pod-1", "uid": "7f1c"}  # fmt: skip
    bare = trainjob.manifest("vlp-x-1", "ml", trainjob.Launch(num_nodes=2, image="i"), ["pretrain"], [], "")
    jsonschema.validate(bare, SCHEMA)
    assert "runtimePatches" not in bare["spec"] and "resourcesPerNode" not in bare["spec"]["trainer"]


def test_node_pods_run_non_root_on_a_read_only_root_filesystem() -> None:
    """With ``run_as`` (every compiled launch has it) the node pods meet the restricted Pod Security level and write
    only to emptyDirs, as scripts/image-test.sh runs the node command."""
    job = body(launch=gpu_launch(run_as={"user": 10001, "group": 10001}))
    jsonschema.validate(job, SCHEMA)
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = pod["template"]["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                      "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    (node,) = pod["containers"]
    assert node["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                       "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    volumes = {v["name"]: v["emptyDir"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in node["volumeMounts"]}
    assert mounts == {"/dev/shm": "dshm", "/tmp": "tmp", "/home/vlp": "home"} and set(volumes) == set(mounts.values())
    assert "mktemp" in job["spec"]["trainer"]["command"][2]  # the config file goes to /tmp, an emptyDir
    for bad in ({"user": 0, "group": 10001}, {"user": 10001}):
        with pytest.raises(ValueError, match="run_as must be"):
            gpu_launch(run_as=bad)


@pytest.mark.parametrize(
    ("path", "value"),
    [(("trainer", "numNodes"), "4"), (("trainer", "numProcPerNode"), "auto"), (("runtimeRef",), {}),
     (("trainer", "command"), "torchrun"), (("managedBy",), 3)],
)  # fmt: skip
def test_the_schema_refuses_what_the_api_server_would(path: tuple[str, ...], value: Any) -> None:
    """The check can fail: each of these is a TrainJob the API server rejects (v2.2+: numProcPerNode is int32)."""
    job = body()
    target = job["spec"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(job, SCHEMA)


def test_names_and_settings_are_checked() -> None:
    name = trainjob.job_name("finetune_retrieval", "kfp-run-pod-" + "x" * 200)
    assert len(name) <= 63 and name.startswith("vlp-finetune-retrieval-") and name == name.lower()
    assert name != trainjob.job_name("finetune_retrieval", "another-attempt")
    with pytest.raises(ValueError, match="num_nodes >= 2"):
        trainjob.Launch.from_dict({"num_nodes": 1, "image": "i"})
    with pytest.raises(ValueError, match="unknown TrainJob launch settings"):
        trainjob.Launch.from_dict({"num_nodes": 2, "image": "i", "gpus": 8})


def test_a_multi_node_step_compiles_its_launch_settings(tmp_path: Path) -> None:
    text = (pipeline_config.CONFIG_DIR / "default.yaml").read_text(encoding="utf-8")
    text = text.replace("  pretrain: {<<: *gpu, accelerator_count: 8,", "  pretrain: {<<: *gpu, accelerator_count: 8, "
                        "num_nodes: 4, trainer_service_account: vlp-trainer,")  # fmt: skip
    path = tmp_path / "multi.yaml"
    path.write_text(text, encoding="utf-8")
    cfg = pipeline_config.load(path)
    settings = pipeline_config.launch_settings(cfg, "pretrain")
    launch = trainjob.Launch.from_dict(settings)
    assert (launch.num_nodes, launch.proc_per_node, launch.service_account) == (4, 8, "vlp-trainer")
    assert launch.resources["limits"]["nvidia.com/gpu"] == "8" and launch.image.endswith("-cuda")
    names = {e["name"]: e for e in launch.env}
    assert names["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "vlp-s3"
    assert names["MLFLOW_TRACKING_URI"]["value"] == "http://vlp-mlflow:5000"
    assert names["MLFLOW_TRACKING_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "vlp-mlflow-step",
                                                                              "key": "password"}  # fmt: skip
    job = trainjob.manifest("vlp-pretrain-1", "ml", launch, ["pretrain"], [], "")
    jsonschema.validate(job, SCHEMA)
    (patch,) = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert patch["template"]["spec"]["template"]["metadata"]["labels"] == {"vlp.dev/mlflow-client": "true"}
    assert launch.run_as == {"user": 10001, "group": 10001}  # the pipeline config's run_as: the steps' own user
    assert patch["template"]["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001
    assert pipeline_config.launch_settings(cfg, "finetune_qa") == {}
    assert pipeline_config.scale(cfg, "finetune_qa") == {"nproc": 1}
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: {ingest: {num_nodes: 2}}\n", encoding="utf-8")
    with pytest.raises(pipeline_config.ConfigError, match="num_nodes"):
        pipeline_config.load(bad)


# --------------------------------------------------------------------------- the launcher vs a fake API server


class FakeKube(BaseHTTPRequestHandler):
    """The TrainJob calls of the Kubernetes API: create, get, delete. ``script`` is the list of statuses that
    successive GETs return (the last one repeats); ``requests`` records every call."""

    state: dict[str, Any]

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str) -> None:
        self._reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code})

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else {}

    def do_POST(self) -> None:
        obj = self._body()
        self.state["requests"].append(("POST", self.path, obj))
        if self.path != PREFIX:
            return self._status(404, "NotFound")
        name = obj["metadata"]["name"]
        if name in self.state["jobs"]:
            return self._status(409, "AlreadyExists")
        self.state["jobs"][name] = obj
        self._reply(201, obj)

    def do_GET(self) -> None:
        self.state["requests"].append(("GET", self.path, None))
        name = self.path.rsplit("/", 1)[-1]
        if not self.path.startswith(PREFIX + "/") or name not in self.state["jobs"]:
            return self._status(404, "NotFound")
        script = self.state["script"]
        status = script.pop(0) if len(script) > 1 else script[0]
        self._reply(200, {**self.state["jobs"][name], "status": status})

    def do_DELETE(self) -> None:
        self.state["requests"].append(("DELETE", self.path, self._body()))
        name = self.path.rsplit("/", 1)[-1]
        if self.state["jobs"].pop(name, None) is None:
            return self._status(404, "NotFound")
        self._reply(200, {"kind": "Status", "status": "Success"})


@pytest.fixture
def kube() -> Iterator[tuple[str, dict[str, Any]]]:
    state: dict[str, Any] = {"requests": [], "jobs": {}, "script": [{}]}
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (FakeKube,), {"state": state}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def api_client(url: str) -> Any:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = url
    return client.ApiClient(configuration)


def condition(kind: str, reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": kind, "status": "True", "reason": reason, "message": message}


RUNNING = {"jobsStatus": [{"name": "node", "active": 4, "ready": 4}]}


def test_the_launcher_creates_follows_and_returns_on_complete(kube: tuple[str, dict[str, Any]]) -> None:
    url, state = kube
    state["script"] = [{}, {"jobsStatus": [{"name": "node", "active": 2}]}, RUNNING, RUNNING,
                       {"conditions": [condition("Complete", "AllJobsCompleted")],
                        "jobsStatus": [{"name": "node", "succeeded": 4}]}]  # fmt: skip
    lines: list[str] = []
    final = trainjob.Launcher(api_client(url), "ml", lines.append).run(body(), poll_s=0.01)
    assert trainjob.finished(final) == "Complete"
    (created,) = [r for r in state["requests"] if r[0] == "POST"]
    assert created[1] == PREFIX and created[2] == body()
    assert lines == [
        "trainjob vlp-pretrain-0123456789: created in ml (4 nodes, runtime torch-distributed)",
        "trainjob vlp-pretrain-0123456789: no status yet",
        "trainjob vlp-pretrain-0123456789: node: active 2",
        "trainjob vlp-pretrain-0123456789: node: active 4, ready 4",  # printed once, though seen twice
        "trainjob vlp-pretrain-0123456789: Complete (AllJobsCompleted); node: succeeded 4",
    ]
    assert not [r for r in state["requests"] if r[0] == "DELETE"]  # a finished TrainJob is kept for its logs


def test_a_failed_trainjob_fails_the_step_with_its_reason(kube: tuple[str, dict[str, Any]]) -> None:
    url, state = kube
    failed = {"conditions": [condition("Failed", "FailedJobs", "jobset node-1 failed: OOMKilled")],
              "jobsStatus": [{"name": "node", "failed": 1, "active": 3}]}  # fmt: skip
    state["script"] = [RUNNING, failed]
    with pytest.raises(trainjob.TrainJobFailed, match="FailedJobs: jobset node-1 failed: OOMKilled"):
        trainjob.Launcher(api_client(url), "ml", lambda _: None).run(body(), poll_s=0.01)


def test_a_retried_launcher_follows_the_existing_trainjob_and_a_vanished_one_fails(
    kube: tuple[str, dict[str, Any]],
) -> None:
    url, state = kube
    state["jobs"][body()["metadata"]["name"]] = body()  # the first attempt created it
    state["script"] = [{"conditions": [condition("Complete")]}]
    lines: list[str] = []
    trainjob.Launcher(api_client(url), "ml", lines.append).run(body(), poll_s=0.01)
    assert "exists already" in lines[0]
    state["jobs"].clear()
    state["script"] = [RUNNING]
    launcher = trainjob.Launcher(api_client(url), "ml", lambda _: None)
    threading.Timer(0.3, lambda: state["jobs"].clear()).start()  # someone deletes it mid-run
    with pytest.raises(trainjob.TrainJobFailed, match="was deleted before it finished"):
        launcher.run(body("vlp-pretrain-9"), poll_s=0.05)


def test_cancelling_the_step_deletes_the_trainjob(kube: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    """SIGTERM (Argo's terminate) to a launcher in its own process: it deletes the TrainJob and exits 143."""
    url, state = kube
    state["script"] = [RUNNING]
    (tmp_path / "body.json").write_text(json.dumps(body()))
    code = (
        "import json, sys\n"
        "from components import trainjob\n"
        "from kubernetes import client\n"
        "c = client.Configuration(); c.host = sys.argv[1]\n"
        "trainjob.Launcher(client.ApiClient(c), 'ml', lambda s: print(s, flush=True))"
        ".run(json.load(open(sys.argv[2])), poll_s=0.05)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", code, url, str(tmp_path / "body.json")], env=env,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert "created in ml" in proc.stdout.readline()
    deadline = time.monotonic() + 30
    while sum(r[0] == "GET" for r in state["requests"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "cancelled (signal 15); deleting it" in out
    (deleted,) = [r for r in state["requests"] if r[0] == "DELETE"]
    assert deleted[1] == f"{PREFIX}/vlp-pretrain-0123456789" and deleted[2]["propagationPolicy"] == "Foreground"
    assert not state["jobs"]


def test_a_step_with_launch_settings_runs_as_a_trainjob(
    kube: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, s3_bucket: str, s3_env: dict[str, str]
) -> None:
    """``Step.run`` with ``launch``: the TrainJob carries the step's CLI and config, and the step's summary is
    the one the nodes wrote; pod-local inputs are refused before anything is created."""
    from components._runtime import Step
    from vlp import storage

    url, state = kube
    out = f"{s3_bucket}/model"
    monkeypatch.setattr(trainjob, "in_cluster", lambda: (api_client(url), "ml"))
    monkeypatch.setenv("KFP_POD_NAME", "run-pod-7")
    monkeypatch.setenv("KFP_POD_UID", "uid-7")

    def nodes_finish(status: dict[str, Any]) -> dict[str, Any]:  # what rank 0 writes before the job completes
        storage.write_text(storage.join(out, "summary.json"), json.dumps({"step": "pretrain", "steps": 2}))
        return status

    state["script"] = [RUNNING, RUNNING]
    threading.Timer(0.5, lambda: state["script"].append(nodes_finish({"conditions": [condition("Complete")]}))).start()
    launch = {"num_nodes": 2, "image": "img", "poll_s": 0.05}
    step = Step("pretrain", str(TINY), ["pretrain.max_steps=2"], nproc=1, launch=launch)
    cli = ["pretrain", "--model", "alpro", "--dataset", f"{s3_bucket}/ds", "--frames", f"{s3_bucket}/fr", "--out", out]
    summary = step.run(lambda cfg: pytest.fail("the launching pod must not train"), cli, out)
    assert summary == {"step": "pretrain", "steps": 2}
    (created,) = [r[2] for r in state["requests"] if r[0] == "POST"]
    trainer = created["spec"]["trainer"]
    assert trainer["args"][: len(cli)] == cli and "pretrain.max_steps=2" in trainer["args"]
    assert trainer["env"][0]["value"] == TINY.read_text(encoding="utf-8")
    assert created["metadata"]["name"] == trainjob.job_name("pretrain", "run-pod-7")
    assert created["metadata"]["ownerReferences"][0]["uid"] == "uid-7"
    local = Step("pretrain", str(TINY), [], launch=launch)
    with pytest.raises(ValueError, match="data_root run parameter"):
        local.run(lambda cfg: {}, ["pretrain", "--dataset", "/tmp/ds", "--out", out], out)
    assert len([r for r in state["requests"] if r[0] == "POST"]) == 1


def test_a_config_carrying_a_secret_never_reaches_a_trainjob(
    kube: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step config travels in the TrainJob's VLP_STEP_CONFIG (readable by whoever reads TrainJobs): a config
    with a storage key is refused in the launching pod, before anything is sent to the API server."""
    from components._runtime import Step

    url, state = kube
    monkeypatch.setattr(trainjob, "in_cluster", lambda: (api_client(url), "ml"))
    monkeypatch.setenv("KFP_POD_NAME", "run-pod-8")
    config = TINY.read_text(encoding="utf-8") + "storage:\n  secret_access_key: SENTINEL-s3cr3t\n"
    with pytest.raises(ValueError, match="credentials in the step config") as refused:
        Step("pretrain", config, [], launch={"num_nodes": 2, "image": "img", "poll_s": 0.05})
    assert "SENTINEL" not in str(refused.value)
    assert not state["requests"]


# --------------------------------------------------------------------------- the node command under PET_*


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_with_only_the_runtime_environment_train_what_one_node_with_two_processes_does(
    tiny_world: dict[str, str], tmp_path: Path
) -> None:
    """The TrainJob's node command, run twice with PET_NNODES=2, PET_NODE_RANK=0/1, PET_NPROC_PER_NODE=1 and a
    master address and port (all the torch-distributed runtime sets), trains the same weights as
    ``torchrun --standalone --nproc-per-node 2`` on one machine: same world size, same ranks."""
    from safetensors.torch import load

    cli = ["pretrain-prompter", "--dataset", tiny_world["dataset"], "--frames", tiny_world["frames"]]
    overrides = ["pretrain.max_steps=2"]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "MASTER_", "RANK", "WORLD_", "LOCAL_"))}
    base |= {"OMP_NUM_THREADS": "1", "VLP_STEP_CONFIG": TINY.read_text(encoding="utf-8")}
    base["PATH"] = (
        f"{Path(sys.executable).parent}{os.pathsep}{base['PATH']}"  # `python` is the image's, here the venv's
    )
    two_nodes = str(tmp_path / "two-nodes")
    command, args = trainjob.command([*cli, "--out", two_nodes], overrides)
    port = str(_free_port())
    runtime = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port}
    pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    nodes = [
        subprocess.Popen([*command, *args], env={**base, **runtime, "PET_NODE_RANK": str(r)}, **pipe) for r in (0, 1)
    ]
    results = [node.communicate(timeout=600) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], results[0][1][-2000:] + results[1][1][-2000:]
    one_node = str(tmp_path / "one-node")
    torchrun = Path(sys.executable).with_name("torchrun")
    standalone = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "vlp.cli", *cli, "--out", one_node,
                  "--config", str(TINY), *overrides]  # fmt: skip
    done = subprocess.run(standalone, env=base, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    def trained(out: str) -> tuple[int, dict[str, Any]]:
        doc = json.loads(Path(out, "model.json").read_text())
        state = json.loads(Path(out, doc["checkpoint"], "state.json").read_text())
        return state["world_size"], load(Path(out, doc["checkpoint"], "model.safetensors").read_bytes())

    (world_a, weights_a), (world_b, weights_b) = trained(two_nodes), trained(one_node)
    assert world_a == world_b == 2
    assert weights_a.keys() == weights_b.keys() and all((weights_a[k] == weights_b[k]).all() for k in weights_a)
