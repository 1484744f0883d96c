"""Pipelines: compile, drift against the committed YAML, Kubernetes settings from the pipeline config,
submission and recurring runs against a recording fake KFP API server (no cluster), cron validation."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from pipelines import compile as compile_mod
from pipelines import config as pipeline_config
from pipelines import submit
from vlp.config import ConfigError

COMPILED = compile_mod.COMPILED_DIR
DOCKERFILE = Path(__file__).resolve().parents[1] / "docker" / "Dockerfile"
GPU_STEPS = ("pretrain_prompter", "pretrain", "finetune_retrieval", "finetune_qa")


def _docs(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    return docs[0], docs[1] if len(docs) > 1 else {}


def _executor(name: str) -> str:
    return "exec-" + name.replace("_", "-")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compiled")
    compile_mod.compile_all(out_dir=out)
    return out


@pytest.mark.parametrize("name", ["pretrain", "pretrain-albef", "reevaluate", "retrieval", "index"])
def test_committed_yaml_matches_the_code(compiled: Path, name: str) -> None:
    fresh = (compiled / f"{name}.yaml").read_text(encoding="utf-8")
    committed = (COMPILED / f"{name}.yaml").read_text(encoding="utf-8")
    assert fresh == committed, f"pipelines/compiled/{name}.yaml is stale: run `make pipeline-compile` and commit it"


def test_gpu_steps_carry_the_configured_kubernetes_settings(compiled: Path) -> None:
    cfg = pipeline_config.load()
    spec, platform = _docs(compiled / "pretrain.yaml")
    executors = spec["deploymentSpec"]["executors"]
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    dag = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    for step in GPU_STEPS:
        want = cfg.step(step)
        container = executors[_executor(step)]["container"]
        assert container["image"].endswith("-cuda")
        accel = container["resources"]["accelerator"]
        assert accel["resourceType"] == want.accelerator_type == "nvidia.com/gpu"
        assert int(accel["resourceCount"]) == want.accelerator_count >= 1
        assert container["resources"]["memoryLimit"] > 0
        assert k8s[_executor(step)]["nodeSelector"]["labels"] == want.node_selector
        assert k8s[_executor(step)]["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
        shm = k8s[_executor(step)]["emptyDirMounts"][0]
        assert (shm["mountPath"], shm["medium"], shm["sizeLimit"]) == ("/dev/shm", "Memory", want.shm_size)
        task = dag[step.replace("_", "-")]
        assert task["retryPolicy"]["maxRetryCount"] == want.retries
        assert task["retryPolicy"]["backoffDuration"] == want.retry_backoff
        assert task["inputs"]["parameters"]["nproc"]["runtimeValue"]["constant"] == want.accelerator_count
    assert "accelerator" not in executors[_executor("synth")]["container"].get("resources", {})
    assert not executors[_executor("synth")]["container"]["image"].endswith("-cuda")
    assert dag["report"]["cachingOptions"] == {}  # caching off for the side-effect steps
    assert dag["pretrain"]["cachingOptions"] == {"enableCache": True}


def test_every_component_is_a_lightweight_python_component_without_runtime_installs(compiled: Path) -> None:
    for name in ("pretrain", "pretrain-albef", "reevaluate", "index"):
        spec, _ = _docs(compiled / f"{name}.yaml")
        for executor in spec["deploymentSpec"]["executors"].values():
            if "container" not in executor:  # the importer
                continue
            text = " ".join(executor["container"]["command"] + executor["container"].get("args", []))
            assert "pip install" not in text
            assert "kfp.dsl.executor_main" in text
            assert executor["container"]["image"].startswith("ghcr.io/vlp-ml/vlp:")


CHART_VALUES = Path(__file__).resolve().parents[1] / "helm" / "vlp" / "values.yaml"
KEY_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def _container_executors(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: e["container"] for name, e in spec["deploymentSpec"]["executors"].items() if "container" in e}


@pytest.mark.parametrize("name", ["pretrain", "pretrain-albef", "reevaluate", "index"])
def test_every_step_gets_s3_keys_from_the_secret_and_the_tracking_uri(compiled: Path, name: str) -> None:
    cfg = pipeline_config.load()
    spec, platform = _docs(compiled / f"{name}.yaml")
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    want_env = {
        "AWS_ENDPOINT_URL": cfg.s3.endpoint_url,
        "MLFLOW_S3_ENDPOINT_URL": cfg.s3.endpoint_url,
        "AWS_REGION": cfg.s3.region,
        "AWS_DEFAULT_REGION": cfg.s3.region,
        "MLFLOW_TRACKING_URI": cfg.tracking_uri,
    }
    containers = _container_executors(spec)
    assert len(containers) >= {"pretrain": 14, "pretrain-albef": 11, "reevaluate": 6, "index": 4}[name]
    for executor, container in containers.items():
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env == want_env, executor
        refs = k8s[executor]["secretAsEnv"]
        assert [(r["secretName"], r["optional"]) for r in refs] == [("vlp-s3", False), ("vlp-mlflow-step", False)]
        assert sorted((k["secretKey"], k["envVar"]) for k in refs[0]["keyToEnv"]) == [(k, k) for k in KEY_ENV]
        assert sorted((k["secretKey"], k["envVar"]) for k in refs[1]["keyToEnv"]) == [
            ("password", "MLFLOW_TRACKING_PASSWORD"), ("username", "MLFLOW_TRACKING_USERNAME")]  # fmt: skip
        step = "fetch" if executor in ("exec-fetch", "exec-fetch-part") else "true"  # fetch: the internet too
        assert k8s[executor]["podMetadata"]["labels"] == {  # what the chart's NetworkPolicies select
            "vlp.dev/mlflow-client": "true", "vlp.dev/pipeline-step": step}, executor  # fmt: skip
    lines = (compiled / f"{name}.yaml").read_text(encoding="utf-8").splitlines()
    secrets = (*KEY_ENV, "MLFLOW_TRACKING_PASSWORD")
    mentions = [line.strip().removeprefix("- ") for line in lines if any(key in line for key in secrets)]
    assert mentions and all(m.startswith(("envVar: ", "secretKey: ")) for m in mentions), mentions  # refs only


def _run_as(executor: dict[str, Any]) -> dict[str, Any]:
    """An executor's securityContext with the int64 fields (strings in the protobuf JSON) as ints."""
    context = executor.get("securityContext", {})
    return {k: int(v) if k in ("runAsUser", "runAsGroup") else v for k, v in context.items()}


@pytest.mark.parametrize("name", sorted(compile_mod.builders()))
def test_every_step_runs_as_the_images_non_root_user(compiled: Path, name: str) -> None:
    """Every step pod (they decode untrusted media) runs as the image's uid/gid, never root, and carries the label
    that the chart's step egress NetworkPolicy selects."""
    user = [line.split()[1] for line in DOCKERFILE.read_text(encoding="utf-8").splitlines() if line.startswith("USER ")]
    uid, gid = (int(x) for x in user[-1].split(":"))
    spec, platform = _docs(compiled / f"{name}.yaml")
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    containers = _container_executors(spec)
    assert containers and set(containers) <= set(k8s)
    for executor in containers:
        assert _run_as(k8s[executor]) == {"runAsUser": uid, "runAsGroup": gid, "runAsNonRoot": True}, executor
        step = "fetch" if executor in ("exec-fetch", "exec-fetch-part") else "true"  # fetch: the internet too
        assert k8s[executor]["podMetadata"]["labels"]["vlp.dev/pipeline-step"] == step, executor


def test_run_as_is_configurable_and_never_root(tmp_path: Path) -> None:
    custom = tmp_path / "run-as.yaml"
    custom.write_text("run_as: {user: 2000, group: 3000}\n")
    compile_mod.compile_all(custom, tmp_path)
    spec, platform = _docs(tmp_path / "reevaluate.yaml")
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert {executor: _run_as(k8s[executor]) for executor in _container_executors(spec)} == {
        executor: {"runAsUser": 2000, "runAsGroup": 3000, "runAsNonRoot": True}
        for executor in _container_executors(spec)
    }
    for bad in ("run_as: {user: 0}", "run_as: {group: 0}"):
        custom.write_text(bad + "\n")
        with pytest.raises(ConfigError, match="must be > 0"):
            pipeline_config.load(custom)


SHA_CPU, SHA_GPU = "sha256:" + "a" * 64, "sha256:" + "0123456789abcdef" * 4


def _image_env(tmp_path: Path, **extra: str) -> Path:
    env = tmp_path / "image.env"
    lines = ["# test", "REGISTRY=registry.local/ml", "IMAGE_NAME=vlp", "IMAGE_TAG=1.2.3"]
    env.write_text("\n".join([*lines, *(f"{k}={v}" for k, v in extra.items())]) + "\n")
    return env


def test_images_are_named_by_tag_or_by_digest(tmp_path: Path) -> None:
    from components.images import image

    env = _image_env(tmp_path, IMAGE_DIGEST="", IMAGE_DIGEST_CUDA="")
    assert (image(path=env), image(gpu=True, path=env)) == (
        "registry.local/ml/vlp:1.2.3",
        "registry.local/ml/vlp:1.2.3-cuda",
    )
    env = _image_env(tmp_path, IMAGE_DIGEST=SHA_CPU, IMAGE_DIGEST_CUDA=SHA_GPU)
    assert image(path=env) == f"registry.local/ml/vlp@{SHA_CPU}"
    assert image(gpu=True, path=env) == f"registry.local/ml/vlp@{SHA_GPU}"
    for bad in ("a" * 64, "sha256:" + "A" * 64, "sha256:abc", "latest"):
        with pytest.raises(ValueError, match=r"IMAGE_DIGEST=.* is not a digest"):
            image(path=_image_env(tmp_path, IMAGE_DIGEST=bad))


def test_a_digest_in_image_env_pins_every_compiled_step(tmp_path: Path) -> None:
    """With IMAGE_DIGEST / IMAGE_DIGEST_CUDA set, every executor runs ``registry/name@sha256:...``, the GPU steps
    the CUDA image's digest (a subprocess: the components read image.env when first imported)."""
    import subprocess
    import sys

    env = _image_env(tmp_path, IMAGE_DIGEST=SHA_CPU, IMAGE_DIGEST_CUDA=SHA_GPU)
    script = (
        "import sys; from pathlib import Path; import components.images as im; "
        "im.CPU_IMAGE, im.GPU_IMAGE = im.image(path=Path(sys.argv[1])), im.image(True, Path(sys.argv[1])); "
        "from pipelines import compile; compile.compile_all(out_dir=sys.argv[2])"
    )
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", script, str(env), str(tmp_path)], cwd=root, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    spec, _ = _docs(tmp_path / "pretrain.yaml")
    images = {name: c["image"] for name, c in _container_executors(spec).items()}
    gpu = {_executor(step) for step in GPU_STEPS}
    assert {images[name] for name in images if name in gpu} == {f"registry.local/ml/vlp@{SHA_GPU}"}
    assert {images[name] for name in images if name not in gpu} == {f"registry.local/ml/vlp@{SHA_CPU}"}


def test_cluster_defaults_match_the_helm_chart() -> None:
    cfg = pipeline_config.load()
    values = yaml.safe_load(CHART_VALUES.read_text(encoding="utf-8"))
    store, mlflow = values["objectStore"], values["mlflow"]
    secret = store["existingSecret"]
    assert (cfg.s3.secret, cfg.s3.access_key_key, cfg.s3.secret_key_key) == (
        secret["name"],
        secret["accessKeyKey"],
        secret["secretKeyKey"],
    )
    scheme = "http" if store["disableSSL"] else "https"
    assert cfg.s3.endpoint_url == f"{scheme}://{store['endpoint']}"
    assert cfg.s3.region == store["region"]
    # release "vlp" -> Service "vlp-mlflow" in the namespace the pipelines run in (short name: same namespace)
    assert cfg.tracking_uri == f"http://vlp-mlflow:{mlflow['service']['port']}"
    step = mlflow["auth"]["stepSecret"]  # the user the chart's hook creates is the one the steps log in as
    login = cfg.tracking_secret
    assert (login.name, login.username_key, login.password_key) == (
        step["name"], step["usernameKey"], step["passwordKey"])  # fmt: skip
    assert values["networkPolicy"]["enabled"] and mlflow["auth"]["enabled"]


def test_local_config_sets_no_cluster_environment(tmp_path: Path) -> None:
    local = pipeline_config.load(pipeline_config.CONFIG_DIR / "local.yaml")
    assert pipeline_config.environment(local) == {} and local.s3.secret == ""
    compile_mod.compile_all(pipeline_config.CONFIG_DIR / "local.yaml", tmp_path)
    spec, platform = _docs(tmp_path / "pretrain.yaml")
    assert all("env" not in c for c in _container_executors(spec).values())
    k8s = platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get("executors", {})
    assert not any("secretAsEnv" in e for e in k8s.values())


def test_custom_s3_settings_compile_into_every_task(tmp_path: Path) -> None:
    custom = tmp_path / "s3.yaml"
    custom.write_text(
        "s3: {secret: team-s3, access_key_key: id, secret_key_key: key, endpoint_url: 'http://rgw.ceph:7480'}\n"
        "tracking_uri: http://mlflow.team-a.svc:5000\n"
    )
    compile_mod.compile_all(custom, tmp_path)
    spec, platform = _docs(tmp_path / "pretrain.yaml")
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for executor, container in _container_executors(spec).items():
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env == {
            "AWS_ENDPOINT_URL": "http://rgw.ceph:7480",
            "MLFLOW_S3_ENDPOINT_URL": "http://rgw.ceph:7480",
            "MLFLOW_TRACKING_URI": "http://mlflow.team-a.svc:5000",
        }, executor  # no region: none set
        (ref,) = k8s[executor]["secretAsEnv"]
        assert ref["secretName"] == "team-s3"
        assert sorted((k["secretKey"], k["envVar"]) for k in ref["keyToEnv"]) == [
            ("id", "AWS_ACCESS_KEY_ID"),
            ("key", "AWS_SECRET_ACCESS_KEY"),
        ]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("s3: {secrett: vlp-s3}", "secrett"),
        ("tracking_uri: vlp-mlflow:5000", "needs a scheme"),
        ("s3: {endpoint_url: s3.amazonaws.com}", "needs a scheme"),
        ("s3: {secret: vlp-s3, access_key_key: 'a key'}", "not a Secret key"),
        ("s3: {secret: vlp-s3, access_key_key: k, secret_key_key: k}", "are both 'k'"),
        ("step_config: 'storage: {secret_access_key: SENTINEL-s3cr3t}'", "step_config carries credentials"),
    ],
)
def test_bad_environment_settings_fail_loudly(tmp_path: Path, text: str, why: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + "\n")
    with pytest.raises(ConfigError, match=why):
        pipeline_config.load(bad)


def test_pipeline_config_is_strict(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: {pretrain: {gpus: 2}}\n")
    with pytest.raises(ConfigError, match="gpus"):
        pipeline_config.load(bad)
    bad.write_text("steps: {pretrian: {}}\n")
    with pytest.raises(ConfigError, match="unknown step 'pretrian'"):
        pipeline_config.load(bad)
    bad.write_text("steps: {pretrain: {accelerator_count: 2}}\n")
    with pytest.raises(ConfigError, match="accelerator_type"):
        pipeline_config.load(bad)
    bad.write_text("imagez: {}\n")
    with pytest.raises(ConfigError, match="imagez"):
        pipeline_config.load(bad)


def test_a_custom_config_compiles_into_the_yaml(tmp_path: Path) -> None:
    custom = tmp_path / "gpu.yaml"
    custom.write_text(
        "images: {gpu: registry.local/vlp:dev-cuda}\n"
        "defaults: {retries: 0}\n"
        "steps:\n"
        "  finetune_qa:\n"
        "    image: gpu\n"
        "    accelerator_type: nvidia.com/gpu\n"
        "    accelerator_count: 2\n"
        "    node_selector: {pool: a100}\n"
        "    tolerations: [{key: dedicated, operator: Equal, value: ml, effect: NoExecute}]\n"
        "    retries: 3\n"
    )
    compile_mod.compile_all(custom, tmp_path)
    spec, platform = _docs(tmp_path / "pretrain.yaml")
    container = spec["deploymentSpec"]["executors"]["exec-finetune-qa"]["container"]
    assert container["image"] == "registry.local/vlp:dev-cuda"
    assert int(container["resources"]["accelerator"]["resourceCount"]) == 2
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-finetune-qa"]
    assert k8s["nodeSelector"]["labels"] == {"pool": "a100"}
    assert k8s["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"}]
    dag = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert dag["finetune-qa"]["retryPolicy"]["maxRetryCount"] == 3
    assert dag["finetune-qa"]["inputs"]["parameters"]["nproc"]["runtimeValue"]["constant"] == 2  # torchrun x2
    assert "retryPolicy" not in dag["pretrain"]


# --------------------------------------------------------------------------- cron + params


@pytest.mark.parametrize("cron", ["0 0 3 * * *", "*/30 5 1-5 ? JAN-MAR MON,FRI", "0 0 0 1 */2 0", "15 45 23 31 12 6"])
def test_valid_cron(cron: str) -> None:
    assert submit.validate_cron(cron) == cron


@pytest.mark.parametrize(
    ("cron", "why"),
    [
        ("0 3 * * *", "has 5 fields"),
        ("60 0 3 * * *", "second value '60'"),
        ("0 0 24 * * *", "hour value '24'"),
        ("0 0 3 0 * *", "day of month value '0'"),
        ("0 0 3 * 13 *", "month value '13'"),
        ("0 0 3 * * 7", "day of week value '7'"),
        ("? 0 3 * * *", "'?' is only allowed"),
        ("0 */0 3 * * *", "step /0"),
        ("0 0 5-3 * * *", "runs backwards"),
        ("0 0 3 * * MON;TUE", "is not"),
    ],
)
def test_invalid_cron(cron: str, why: str) -> None:
    with pytest.raises(submit.SubmitError, match=why):
        submit.validate_cron(cron)


def test_params_are_checked_against_the_compiled_inputs() -> None:
    package = COMPILED / "reevaluate.yaml"
    params = submit.parse_params(
        ["test_dataset=s3://b/test", "test_frames=s3://b/frames", "overrides=[eval.k=5, a=1]"], package
    )
    assert params == {"test_dataset": "s3://b/test", "test_frames": "s3://b/frames", "overrides": ["eval.k=5", "a=1"]}
    with pytest.raises(submit.SubmitError, match="unknown parameter 'model'"):
        submit.parse_params(["model=x", "test_dataset=a", "test_frames=b"], package)
    with pytest.raises(submit.SubmitError, match="needs the parameter"):
        submit.parse_params(["test_dataset=a"], package)
    with pytest.raises(submit.SubmitError, match="not a LIST"):
        submit.parse_params(["test_dataset=a", "test_frames=b", "overrides=a=1"], package)


# --------------------------------------------------------------------------- a recording fake KFP API


class FakeKfp(BaseHTTPRequestHandler):
    """Just enough of the KFP v2beta1 REST API for runs, experiments and recurring runs; records requests."""

    state: dict[str, Any]

    def log_message(self, *args: Any) -> None:  # keep pytest output clean
        pass

    def _reply(self, body: dict[str, Any], code: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> tuple[str, dict[str, list[str]], dict[str, Any]]:
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else {}
        self.state["requests"].append(
            {
                "method": self.command,
                "path": url.path,
                "query": parse_qs(url.query),
                "body": body,
                "auth": self.headers.get("Authorization"),
            }
        )
        return url.path, parse_qs(url.query), body

    def do_GET(self) -> None:
        path, query, _ = self._record()
        if path == "/apis/v2beta1/experiments":
            wanted = json.loads(query["filter"][0])["predicates"][0]["stringValue"] if "filter" in query else None
            found = [e for e in self.state["experiments"] if wanted in (None, e["display_name"])]
            self._reply({"experiments": found, "total_size": len(found)})
        elif path == "/apis/v2beta1/recurringruns":
            exp = query.get("experiment_id", [None])[0]
            found = [r for r in self.state["recurring"] if exp in (None, r["experiment_id"])]
            self._reply({"recurringRuns": found, "total_size": len(found)})
        elif path == "/apis/v2beta1/healthz":
            self._reply({"multi_user": False})
        else:
            self._reply({"error": f"no route {path}"}, 404)

    def do_POST(self) -> None:
        path, _, body = self._record()
        new_id = uuid.uuid4().hex
        if path == "/apis/v2beta1/experiments":
            experiment = {**body, "experiment_id": new_id}
            self.state["experiments"].append(experiment)
            self._reply(experiment)
        elif path == "/apis/v2beta1/runs":
            self._reply({**body, "run_id": new_id, "state": "PENDING"})
        elif path == "/apis/v2beta1/recurringruns" and self.state.get("refuse_recurring"):
            self._reply({"error": "admission webhook denied the request", "code": 3}, 400)
        elif path == "/apis/v2beta1/recurringruns":
            run = {**body, "recurring_run_id": new_id}
            self.state["recurring"].append(run)
            self._reply(run)
        else:
            self._reply({"error": f"no route {path}"}, 404)

    def do_DELETE(self) -> None:
        path, _, _ = self._record()
        rid = path.rsplit("/", 1)[-1]
        self.state["recurring"] = [r for r in self.state["recurring"] if r["recurring_run_id"] != rid]
        self._reply({})


def _spec_name(body: dict[str, Any]) -> str:
    """Pipeline name of a request body (the spec is wrapped with its platform spec when it has one)."""
    spec = body["pipeline_spec"]
    return spec.get("pipeline_spec", spec)["pipelineInfo"]["name"]


@pytest.fixture
def fake_kfp() -> Iterator[tuple[str, dict[str, Any]]]:
    state: dict[str, Any] = {"requests": [], "experiments": [], "recurring": []}
    handler = type("Handler", (FakeKfp,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def test_submit_run_sends_the_compiled_spec_and_params(fake_kfp: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    host, state = fake_kfp
    token = tmp_path / "token"
    token.write_text("sa-token-123")
    argv = ["run", "--host", host, "--namespace", "team-a", "--experiment", "nightly", "--token-path", str(token)]
    params = ["--param", "register_alias=nightly", "--param", "overrides=[pretrain.max_steps=5]"]
    assert submit.main([*argv, *params]) == 2, "no data_root: checkpoints would live in the pods, refused"
    assert not [r for r in state["requests"] if r["path"] == "/apis/v2beta1/runs"]
    assert submit.main([*argv, *params, "--param", "data_root=s3://bkt/vlp"]) == 0
    runs = [r for r in state["requests"] if r["method"] == "POST" and r["path"] == "/apis/v2beta1/runs"]
    assert len(runs) == 1
    body = runs[0]["body"]
    assert _spec_name(body) == "vlp-pretrain"
    assert body["runtime_config"]["parameters"] == {
        "register_alias": "nightly", "overrides": ["pretrain.max_steps=5"], "data_root": "s3://bkt/vlp",
    }  # fmt: skip
    assert submit.main([*argv, *params, "--allow-pod-local-checkpoints"]) == 0  # accepted on request
    experiment = state["experiments"][0]
    assert (experiment["display_name"], experiment["namespace"]) == ("nightly", "team-a")
    assert body["experiment_id"] == experiment["experiment_id"]
    assert {r["auth"] for r in state["requests"]} == {"Bearer sa-token-123"}


@pytest.mark.parametrize(
    "param",
    [
        "overrides=[storage.secret_access_key=SENTINEL-s3cr3t]",
        "overrides=[storage.access_key_id=AKIASENTINEL]",
        "overrides=['tracking.tracking_uri=http://vlp-steps:SENTINEL-s3cr3t@vlp-mlflow:5000']",
        "source_uri=s3://user:SENTINEL-s3cr3t@bucket/raw",
    ],
)
def test_credentials_in_run_parameters_are_refused_before_anything_is_sent(
    fake_kfp: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str], param: str
) -> None:
    """A run's parameters are shown in the KFP UI: storage keys and passwords in URIs never go there."""
    host, state = fake_kfp
    argv = ["run", "--host", host, "--param", "data_root=s3://bkt/vlp", "--param", param]
    assert submit.main(argv) == 2
    err = capsys.readouterr().err
    assert "credentials in the run parameters" in err and "SENTINEL" not in err
    assert not state["requests"]
    assert submit.main(["run", "--host", host, "--param", "data_root=s3://bkt/vlp", "--param",
                        "overrides=[storage.endpoint_url=http://minio:9000, storage.access_key_id=]"]) == 0  # fmt: skip


@pytest.mark.parametrize(
    "config",
    [
        "storage:\n  secret_access_key: SENTINEL-s3cr3t\n",
        "storage: {access_key_id: AKIASENTINEL}",
        "tracking:\n  tracking_uri: http://vlp-steps:SENTINEL-s3cr3t@vlp-mlflow:5000\n",
        "FILE",  # a config file holding the key, named by its path
    ],
)
def test_credentials_in_the_config_parameter_are_refused_before_anything_is_sent(
    fake_kfp: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str], tmp_path: Path, config: str
) -> None:
    """The `config` run parameter is YAML text (or a file) shown in the KFP UI and copied into a TrainJob's env."""
    host, state = fake_kfp
    if config == "FILE":
        config = str(tmp_path / "secret.yaml")
        Path(config).write_text("frames: {size: 8}\nstorage: {secret_access_key: SENTINEL-s3cr3t}\n")
    argv = ["run", "--host", host, "--param", "data_root=s3://bkt/vlp", "--param", f"config={config}"]
    assert submit.main(argv) == 2
    err = capsys.readouterr().err
    assert "credentials in the run parameters" in err and "config: " in err and "SENTINEL" not in err
    assert not state["requests"]
    for fine in ("configs/tiny.yaml", "frames: {size: 8}\nstorage: {endpoint_url: 'http://minio:9000'}\n"):
        argv = ["run", "--host", host, "--param", "data_root=s3://bkt/vlp", "--param", f"config={fine}"]
        assert submit.main(argv) == 0


def test_reevaluate_cli_has_the_cronjob_shape(
    fake_kfp: tuple[str, dict[str, Any]], tmp_path: Path, monkeypatch
) -> None:
    host, state = fake_kfp
    token = tmp_path / "token"
    token.write_text("cron-token")
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token))
    argv = ["reevaluate", "--host", host, "--namespace", "ml", "--experiment", "reeval"]
    code = submit.main([*argv, "--param", "test_dataset=s3://b/ds", "--param", "test_frames=s3://b/fr"])
    assert code == 0
    body = next(r["body"] for r in state["requests"] if r["path"] == "/apis/v2beta1/runs")
    assert _spec_name(body) == "vlp-reevaluate"
    assert body["runtime_config"]["parameters"] == {"test_dataset": "s3://b/ds", "test_frames": "s3://b/fr"}
    assert state["requests"][-1]["auth"] == "Bearer cron-token"
    assert submit.main([*argv, "--param", "test_dataset=s3://b/ds"]) == 2  # missing test_frames: nothing sent
    assert sum(r["path"] == "/apis/v2beta1/runs" for r in state["requests"]) == 1


def test_schedule_creates_then_replaces_by_name(fake_kfp: tuple[str, dict[str, Any]]) -> None:
    host, state = fake_kfp
    client = submit.make_client(host, "ml")
    params = {"test_dataset": "s3://b/ds", "test_frames": "s3://b/fr"}
    package = COMPILED / "reevaluate.yaml"
    first = submit.schedule(client, package, "nightly-eval", "0 0 3 * * *", params, "reeval", "ml")
    submit.schedule(client, package, "other", "0 0 4 * * *", params, "reeval", "ml")
    second = submit.schedule(client, package, "nightly-eval", "0 30 2 * * *", params, "reeval", "ml")
    assert first != second
    deletes = [r["path"] for r in state["requests"] if r["method"] == "DELETE"]
    assert deletes == [f"/apis/v2beta1/recurringruns/{first}"]
    order = [(r["method"], r["body"].get("display_name")) for r in state["requests"] if r["method"] != "GET"]
    assert order.index(("POST", "nightly-eval"), 3) < order.index(("DELETE", None))  # the new one first
    names = sorted(r["display_name"] for r in state["recurring"])
    assert names == ["nightly-eval", "other"]
    current = next(r for r in state["recurring"] if r["display_name"] == "nightly-eval")
    assert current["trigger"]["cron_schedule"]["cron"] == "0 30 2 * * *"
    assert int(current["max_concurrency"]) == 1
    assert current["runtime_config"]["parameters"] == params
    assert _spec_name(current) == "vlp-reevaluate"
    with pytest.raises(submit.SubmitError, match="6, seconds first"):
        submit.schedule(client, package, "bad", "0 3 * * *", params, "reeval", "ml")
    assert len(state["recurring"]) == 2
    state["refuse_recurring"] = True  # the server refuses the replacement: the old schedule stays
    with pytest.raises(Exception, match=r"400|denied|Bad Request"):
        submit.schedule(client, package, "nightly-eval", "0 0 5 * * *", params, "reeval", "ml")
    assert [r["recurring_run_id"] for r in state["recurring"] if r["display_name"] == "nightly-eval"] == [second]


def test_the_albef_dag_pretrains_straight_from_the_frames(compiled: Path) -> None:
    """ALBEF's DAG has no prompter, entities or prompt bank; its pretrain task is told the family."""
    spec, _ = _docs(compiled / "pretrain-albef.yaml")
    assert spec["pipelineInfo"]["name"] == "vlp-pretrain-albef"
    tasks = set(_task_names_of(spec))
    assert {"synth", "ingest-merge", "extract-frames-merge", "pretrain", "finetune-retrieval", "finetune-qa",
            "report"} <= tasks  # fmt: skip
    assert not tasks & {"mine-entities", "pretrain-prompter", "build-prompt-bank"}
    alpro, _ = _docs(compiled / "pretrain.yaml")
    assert {"mine-entities", "pretrain-prompter", "build-prompt-bank"} <= set(_task_names_of(alpro))
    pretrain_task = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]["pretrain"]
    assert pretrain_task["inputs"]["parameters"]["family"]["runtimeValue"]["constant"] == "albef"
    assert "prompter" not in pretrain_task["inputs"].get("artifacts", {})


def test_the_retrieval_dag_fine_tunes_from_named_weights_without_pre_training(compiled: Path) -> None:
    """vlp-retrieval: data -> finetune_retrieval (no pretrained input, the family as a parameter) -> eval -> report."""
    spec, _ = _docs(compiled / "retrieval.yaml")
    assert spec["pipelineInfo"]["name"] == "vlp-retrieval"
    tasks = set(_task_names_of(spec))
    assert {"synth", "ingest-merge", "extract-frames-merge", "finetune-retrieval", "evaluate-retrieval",
            "report"} <= tasks  # fmt: skip
    assert not tasks & {"pretrain", "pretrain-prompter", "mine-entities", "finetune-qa", "evaluate-qa"}
    assert spec["root"]["inputDefinitions"]["parameters"]["family"]["defaultValue"] == "ts2net"
    tuned = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]["finetune-retrieval"]
    assert "pretrained" not in tuned["inputs"].get("artifacts", {})
    assert tuned["inputs"]["parameters"]["family"]["componentInputParameter"] == "pipelinechannel--family"
    report = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]["report"]
    assert set(report["inputs"]["artifacts"]) == {"retrieval_model", "retrieval_results", "retrieval_index"}


@pytest.mark.parametrize("name", ["pretrain", "pretrain-albef", "retrieval"])
def test_every_training_dag_ends_by_indexing_the_test_split_with_its_retrieval_model(compiled: Path, name: str) -> None:
    """index_clips reads the run's dataset (its split: the step config's retrieval.split, the test split), frames
    and fine-tuned retrieval model, writes under data_root, is cached like the evaluations, and the report lists it."""
    spec, _ = _docs(compiled / f"{name}.yaml")
    tasks = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    task = tasks["index-clips"]
    producers = {k: (a["taskOutputArtifact"]["producerTask"], a["taskOutputArtifact"]["outputArtifactKey"])
                 for k, a in task["inputs"]["artifacts"].items()}  # fmt: skip
    assert producers == {"dataset": (_data_task(tasks, "ingest"), "dataset"),
                         "frames": (_data_task(tasks, "extract-frames"), "frames"),
                         "model": ("finetune-retrieval", "model")}  # fmt: skip
    parameters = task["inputs"]["parameters"]
    assert parameters["data_root"]["componentInputParameter"] == "pipelinechannel--data_root"
    assert "split" not in parameters and "index_uri" not in parameters  # retrieval.split; the run's own output
    assert task["cachingOptions"] == {"enableCache": True} and task["taskInfo"]["name"] == "index_clips"
    report = tasks["report"]["inputs"]["artifacts"]["retrieval_index"]["taskOutputArtifact"]
    assert (report["producerTask"], report["outputArtifactKey"]) == ("index-clips", "index")
    want = pipeline_config.load().step("index_clips")
    resources = spec["deploymentSpec"]["executors"]["exec-index-clips"]["container"]["resources"]
    assert resources["cpuRequest"] == float(want.cpu_request) and "accelerator" not in resources


def _data_task(tasks: dict[str, Any], step: str) -> str:
    """The task that makes a data step's output: ``<step>-merge`` when the DAG fans it out, else ``<step>``."""
    return f"{step}-merge" if f"{step}-merge" in tasks else step


def test_the_index_dag_indexes_a_models_clips_into_the_index_given(compiled: Path) -> None:
    """vlp-index: the model, frames and (optional) dataset URIs imported; with a dataset, index_clips of its split,
    else of the whole frames store; the index at index_uri; never cached (it adds what that index lacks)."""
    spec, _ = _docs(compiled / "index.yaml")
    assert spec["pipelineInfo"]["name"] == "vlp-index"
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert {k for k, p in params.items() if "defaultValue" not in p} == {"model", "frames"}
    assert {k: params[k]["defaultValue"] for k in ("index_uri", "dataset", "split")} == dict.fromkeys(
        ("index_uri", "dataset", "split"), "")  # fmt: skip
    tasks = dict(_tasks(spec))
    imported = {t["inputs"]["parameters"]["uri"]["componentInputParameter"].removeprefix("pipelinechannel--"): name
                for name, t in tasks.items() if name.startswith("importer")}  # fmt: skip
    assert set(imported) == {"model", "frames", "dataset"}
    indexing = {name: t for name, t in tasks.items() if t.get("taskInfo", {}).get("name") == "index_clips"}
    assert len(indexing) == 2
    with_dataset = [t for t in indexing.values() if "dataset" in t["inputs"]["artifacts"]]
    (given,) = with_dataset
    assert given["inputs"]["artifacts"]["dataset"]["taskOutputArtifact"]["producerTask"] == imported["dataset"]
    policies = [t.get("triggerPolicy", {}) for t in tasks.values()]
    conditions = sorted(policy["condition"] for policy in policies if "condition" in policy)
    assert conditions == ["!(inputs.parameter_values['pipelinechannel--dataset'] != '')",
                          "inputs.parameter_values['pipelinechannel--dataset'] != ''"]  # fmt: skip
    channels = {k: f"pipelinechannel--{imported[k]}-artifact" for k in ("model", "frames")}
    for task in indexing.values():
        assert task["cachingOptions"] == {}
        parameters = task["inputs"]["parameters"]
        for name in ("index_uri", "split", "data_root", "config", "overrides"):
            assert parameters[name]["componentInputParameter"] == f"pipelinechannel--{name}"
        artifacts = task["inputs"]["artifacts"]
        assert {k: artifacts[k]["componentInputArtifact"] for k in ("model", "frames")} == channels


def _task_names_of(spec: dict[str, Any]) -> list[str]:
    names = list(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        names += list(component.get("dag", {}).get("tasks", {}))
    return names


FAN_OUT = {  # task -> the step whose settings it takes
    "plan-parts": "plan_parts",
    "ingest-part": "ingest",
    "ingest-merge": "ingest_merge",
    "extract-frames-part": "extract_frames",
    "extract-frames-merge": "extract_frames_merge",
    "fetch-part": "fetch",
    "fetch-merge": "fetch_merge",
}


@pytest.mark.parametrize("name", ["pretrain", "pretrain-albef", "retrieval"])
def test_the_cluster_dags_fan_the_data_steps_out(compiled: Path, name: str) -> None:
    """default.yaml: plan_parts -> ParallelFor(ingest_part) -> ingest_merge -> ParallelFor(extract_frames_part) ->
    extract_frames_merge, and (a run with a URL list) plan_parts -> ParallelFor(fetch_part) -> fetch_merge, at most
    fanout.parallelism pods at once; each part has its step's resources and retries."""
    cfg = pipeline_config.load()
    assert cfg.fanout.parts > 1
    spec, _ = _docs(compiled / f"{name}.yaml")
    param = spec["root"]["inputDefinitions"]["parameters"]["data_parts"]
    assert (param["parameterType"], param["defaultValue"]) == ("NUMBER_INTEGER", cfg.fanout.parts)
    tasks = {t: task for c in spec["components"].values() for t, task in c.get("dag", {}).get("tasks", {}).items()}
    assert set(FAN_OUT) <= set(tasks) and not {"ingest", "extract-frames", "fetch"} & set(tasks)
    loops = {t: task for t, task in tasks.items() if "parameterIterator" in task}
    assert len(loops) == 3
    for loop in loops.values():
        assert loop["iteratorPolicy"]["parallelismLimit"] == cfg.fanout.parallelism
        assert any(task.startswith("plan-parts") for task in loop["dependentTasks"])
    executors = spec["deploymentSpec"]["executors"]
    for task, step in FAN_OUT.items():
        want = cfg.step(step)
        resources = executors[tasks[task]["componentRef"]["name"].replace("comp-", "exec-")]["container"]["resources"]
        assert resources["cpuRequest"] == float(want.cpu_request)
        assert tasks[task]["retryPolicy"]["maxRetryCount"] == want.retries
    for part in ("ingest-part", "extract-frames-part", "fetch-part"):  # the part number from the loop, the count
        parameters = tasks[part]["inputs"]["parameters"]  # from the run
        assert parameters["index"]["componentInputParameter"].startswith("pipelinechannel--plan-parts")
        assert parameters["count"]["componentInputParameter"] == "pipelinechannel--data_parts"
    for merge, part in (("ingest-merge", "ingest-part"), ("extract-frames-merge", "extract-frames-part"),
                        ("fetch-merge", "fetch-part")):  # fmt: skip
        collected = tasks[merge]["inputs"]["artifacts"]["parts"]["taskOutputArtifact"]
        assert collected["producerTask"] in loops and collected["outputArtifactKey"] == f"pipelinechannel--{part}-part"


def test_a_dag_compiled_without_fan_out_has_one_pod_per_data_step_and_no_parts_parameter(tmp_path: Path) -> None:
    local = tmp_path / "local.yaml"
    local.write_text((pipeline_config.CONFIG_DIR / "local.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    compile_mod.compile_all(local, tmp_path / "out")
    for name in ("pretrain", "retrieval"):
        spec, _ = _docs(tmp_path / "out" / f"{name}.yaml")
        assert "data_parts" not in spec["root"]["inputDefinitions"]["parameters"]
        tasks = set(_task_names_of(spec))
        assert {"ingest", "extract-frames"} <= tasks and not tasks & set(FAN_OUT)
    bad = tmp_path / "bad.yaml"
    bad.write_text("fanout: {parts: 0}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"fanout\.parts"):
        pipeline_config.load(bad)


def _tasks(node: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every ``(task name, task spec)`` of a compiled pipeline spec, in every DAG (exit handler, ParallelFor...)."""
    if isinstance(node, dict):
        yield from (node.get("dag") or {}).get("tasks", {}).items()
        for value in node.values():
            yield from _tasks(value)
    elif isinstance(node, list):
        for value in node:
            yield from _tasks(value)


@pytest.mark.parametrize("name", ["pretrain", "pretrain-albef", "reevaluate", "retrieval", "index"])
def test_no_cached_step_takes_a_per_run_input_and_every_step_gets_the_run_id_from_its_pod(
    compiled: Path, name: str
) -> None:
    """A cached step's key is its inputs: one that took the run id (or any other per-run value) would never repeat,
    and KFP would never reuse a finished step. The run id reaches every step through the downward API instead."""
    spec, platform = _docs(compiled / f"{name}.yaml")
    text = yaml.safe_dump(spec)
    assert "kfp_run_id" not in text
    cached = 0
    for task_name, task in _tasks(spec):
        if not task.get("cachingOptions", {}).get("enableCache"):
            continue
        cached += 1
        constants = json.dumps(task.get("inputs", {}))
        for per_run in ("pipeline_job_uuid", "pipeline_job_name", "pipeline_task_uuid", "pipeline_job_create_time"):
            assert per_run not in constants, f"{name}: cached task {task_name} takes {per_run} as an input"
    assert cached or name == "reevaluate"
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for executor in spec["deploymentSpec"]["executors"]:
        if "container" not in spec["deploymentSpec"]["executors"][executor]:
            continue  # an importer
        fields = {e["name"]: e["fieldPath"] for e in k8s[executor].get("fieldPathAsEnv", [])}
        assert fields.get("KFP_RUN_ID") == "metadata.labels['pipeline/runid']", executor


@pytest.mark.parametrize("name", ["pretrain", "pretrain-albef", "retrieval"])
def test_a_run_with_a_url_list_starts_with_fetch_and_any_other_with_its_source(compiled: Path, name: str) -> None:
    """The ``url_list`` parameter (default ""): a branch that fetches it when set, another that passes
    ``source_uri`` on when not; synth's source is whichever ran (``dsl.OneOf``)."""
    spec, _ = _docs(compiled / f"{name}.yaml")
    assert spec["root"]["inputDefinitions"]["parameters"]["url_list"]["defaultValue"] == ""
    tasks = {t: task for c in spec["components"].values() for t, task in c.get("dag", {}).get("tasks", {}).items()}
    conditions = {t: task["triggerPolicy"]["condition"] for t, task in tasks.items()
                  if task.get("triggerPolicy", {}).get("condition")}  # fmt: skip
    fetching = [t for t, c in conditions.items() if c == "inputs.parameter_values['pipelinechannel--url_list'] != ''"]
    given = [t for t, c in conditions.items() if c.startswith("!(") and "url_list" in c]
    assert len(fetching) == len(given) == 1
    inside = set(spec["components"][f"comp-{fetching[0]}"]["dag"]["tasks"])
    loop = next(t for t in inside if t.startswith("for-loop"))
    assert inside == {"plan-parts", "fetch-merge", loop}  # fanned out (default.yaml)
    assert set(spec["components"][f"comp-{loop}"]["dag"]["tasks"]) == {"fetch-part"}
    assert set(spec["components"][f"comp-{given[0]}"]["dag"]["tasks"]) == {"given-source"}
    synth = spec["root"]["dag"]["tasks"]["exit-handler-1"]["componentRef"]["name"]
    source = spec["components"][synth]["dag"]["tasks"]["synth"]["inputs"]["parameters"]["source_uri"]
    assert source["taskOutputParameter"]["producerTask"].startswith("condition-branches")
    assert "oneof" in source["taskOutputParameter"]["outputParameterKey"]
