"""Pipeline config: per-step Kubernetes resources, images, caching and retries, from ``pipelines/config/*.yaml``.

Loaded strictly (an unknown key is an error naming it), with the same loader as the step configs. Every step
starts from ``defaults`` and takes its ``steps.<name>`` keys on top, e.g.::

    defaults: {cpu_request: "1", memory_request: 2Gi, retries: 1}
    steps:
      pretrain:
        image: gpu
        accelerator_type: nvidia.com/gpu
        accelerator_count: 4          # GPUs on the node; > 1 runs torchrun with 4 processes
        node_selector: {cloud.google.com/gke-accelerator: nvidia-h100-80gb}
        tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
        shm_size: 32Gi                # memory-backed /dev/shm (DataLoader workers, NCCL)

On a cluster every step pod also needs the object store and MLflow; ``s3``, ``tracking_uri`` and
``tracking_secret`` put them into the environment of every task (credentials only as a reference to a Kubernetes
Secret, never as values)::

    s3: {secret: vlp-s3, endpoint_url: https://s3.amazonaws.com, region: us-east-1}
    tracking_uri: http://vlp-mlflow:5000
    tracking_secret: {name: vlp-mlflow-step}   # MLFLOW_TRACKING_USERNAME / _PASSWORD (keys username, password)

Every step container runs as ``run_as`` (default the image's uid/gid 10001, ``runAsNonRoot``), and every step
pod carries the label ``vlp.dev/pipeline-step=true`` that the Helm chart's step egress NetworkPolicy selects.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vlp.config import ConfigError, from_dict
from vlp.schema import load_yaml

CONFIG_DIR = Path(__file__).resolve().parent / "config"
STEPS = (
    "start_run",
    "given_source",
    "fetch",
    "fetch_merge",
    "synth",
    "plan_parts",
    "ingest",
    "ingest_merge",
    "extract_frames",
    "extract_frames_merge",
    "mine_entities",
    "pretrain_prompter",
    "build_prompt_bank",
    "pretrain",
    "finetune_retrieval",
    "finetune_qa",
    "evaluate_retrieval",
    "evaluate_qa",
    "index_clips",
    "report",
    "finish_run",
    "fetch_model",
    "compare_scores",
)


@dataclass
class Toleration:
    """A Kubernetes toleration (e.g. of the GPU node pool's taint)."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Exists"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


@dataclass
class StepSettings:
    """How one step's pod runs. Empty strings / zero leave the setting out of the compiled pipeline."""

    image: Literal["cpu", "gpu"] = "cpu"  # which of `images` the step runs in
    cpu_request: str = ""  # e.g. "2"
    cpu_limit: str = ""
    memory_request: str = ""  # e.g. 8Gi
    memory_limit: str = ""
    accelerator_type: str = ""  # e.g. nvidia.com/gpu
    accelerator_count: int = 0  # GPUs of one node; > 1 runs the step under torchrun with that many processes
    num_nodes: int = 1  # training steps: > 1 runs the step as a Kubeflow Trainer TrainJob on that many nodes
    trainer_runtime: str = "torch-distributed"  # the ClusterTrainingRuntime a multi-node TrainJob refers to
    trainer_service_account: str = ""  # ServiceAccount of the TrainJob's node pods ("" = the runtime's)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[Toleration] = field(default_factory=list)
    shm_size: str = ""  # size of a memory-backed emptyDir at /dev/shm ("" = none)
    retries: int = 0  # extra attempts after a failure
    retry_backoff: str = ""  # first back-off, e.g. 60s (doubles each retry)
    caching: bool = True  # False for steps that exist for a side effect


@dataclass
class Images:
    """Container images; "" = from docker/image.env (gpu: its tag + ``-cuda``)."""

    cpu: str = ""
    gpu: str = ""


@dataclass
class S3Settings:
    """Object-store access of every step pod (what ``vlp.storage`` and boto3 read from the environment).

    Empty strings leave the variable out: no ``secret`` = no keys injected (an IAM role / IRSA, or the image's
    own environment); no ``endpoint_url`` = AWS S3.
    """

    secret: str = ""  # Kubernetes Secret with the key pair (the Helm chart's objectStore.existingSecret.name)
    access_key_key: str = "AWS_ACCESS_KEY_ID"  # key in the Secret -> env AWS_ACCESS_KEY_ID
    secret_key_key: str = "AWS_SECRET_ACCESS_KEY"  # key in the Secret -> env AWS_SECRET_ACCESS_KEY
    endpoint_url: str = ""  # env AWS_ENDPOINT_URL (and MLFLOW_S3_ENDPOINT_URL), with the scheme
    region: str = ""  # env AWS_REGION and AWS_DEFAULT_REGION


@dataclass
class TrackingSecret:
    """The step pods' MLflow user (the chart's ``mlflow.auth.stepSecret``): ``MLFLOW_TRACKING_USERNAME`` and
    ``MLFLOW_TRACKING_PASSWORD`` from this Secret on every step pod. No ``name`` = no login (a server without
    authentication)."""

    name: str = ""
    username_key: str = "username"
    password_key: str = "password"


@dataclass
class RunAs:
    """The non-root user and group every step container runs as: the image's own (docker/Dockerfile ``USER
    10001:10001``, which owns ``/gcs``, ``/minio``, ``/s3`` and ``/oci``, where the KFP launcher writes)."""

    user: int = 10001
    group: int = 10001


@dataclass
class FanOut:
    """Fan-out of ingest and extract_frames (``pipelines/fanout.py``): the parts use the steps' own settings."""

    parts: int = 1  # default `data_parts` run parameter (pods per step); 1 = one pod each and no such parameter
    parallelism: int = 8  # most pods of one fan-out at once (0 = no bound)


@dataclass
class PipelineConfig:
    """The whole pipeline config: what to compile into ``pipelines/compiled``."""

    step_config: str = "configs/default.yaml"  # default `config` parameter: the vlp step config (path or YAML)
    downstream: bool = True  # fine-tune + evaluate branches (false: pre-training and its zero-shot evaluation only)
    register_prefix: str = "vlp"  # fine-tuned models register as <prefix>-retrieval and <prefix>-qa
    data_root: str = ""  # default `data_root` parameter: object-storage prefix for large outputs
    tracking_uri: str = ""  # env MLFLOW_TRACKING_URI of every step ("" = none; the step config may still set one)
    tracking_secret: TrackingSecret = field(default_factory=TrackingSecret)  # the steps' MLflow login
    s3: S3Settings = field(default_factory=S3Settings)
    images: Images = field(default_factory=Images)
    run_as: RunAs = field(default_factory=RunAs)  # runAsUser/runAsGroup (and runAsNonRoot) of every step
    fanout: FanOut = field(default_factory=FanOut)
    steps: dict[str, StepSettings] = field(default_factory=dict)  # every name of STEPS, filled from defaults
    # Set by pipelines.local_run, never by a config file: a digest of the code, the step config and local source
    # data, given to every step as $VLP_CODE_DIGEST. kfp.local's cache key holds a task's inputs, image, command and
    # environment; locally every step runs this checkout under one image name, so the digest is what changes.
    code_digest: str = ""

    def step(self, name: str) -> StepSettings:
        """Settings of step ``name``."""
        if name not in self.steps:
            raise KeyError(f"no settings for step {name!r}; steps: {sorted(self.steps)}")
        return self.steps[name]

    def image(self, name: str) -> str:
        """The image step ``name`` runs in."""
        from components.images import CPU_IMAGE, GPU_IMAGE

        if self.step(name).image == "gpu":
            return self.images.gpu or GPU_IMAGE
        return self.images.cpu or CPU_IMAGE


def load(path: str | Path = CONFIG_DIR / "default.yaml") -> PipelineConfig:
    """Load and validate a pipeline config (``defaults`` merged under every ``steps.<name>``)."""
    path = Path(path)
    data = load_yaml(path.read_text(encoding="utf-8"), str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    defaults = _mapping(data.pop("defaults", None), "defaults")
    steps = _mapping(data.pop("steps", None), "steps")
    known = step_names()
    unknown = sorted(set(steps) - set(known))
    if unknown:
        raise ConfigError(f"{path}: unknown step {unknown[0]!r} in 'steps'; valid steps: {list(known)}")
    try:
        from_dict(StepSettings, defaults, "defaults")
        cfg = from_dict(PipelineConfig, data)
        for name in known:
            merged = {**defaults, **_mapping(steps.get(name), f"steps.{name}")}
            cfg.steps[name] = from_dict(StepSettings, merged, f"steps.{name}")
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    _check(cfg, path)
    return cfg


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
    return value


TRAINING_STEPS = ("pretrain_prompter", "pretrain", "finetune_retrieval", "finetune_qa")  # torchrun / TrainJob


def step_names() -> tuple[str, ...]:
    """Every step a DAG may have: :data:`STEPS` and the steps the registered families declare before pre-training
    (``FamilySpec.prepared``), which a config may set like any other."""
    from vlp.models.family import specs

    declared = [one.step for spec in specs().values() for one in spec.prepared]
    return STEPS + tuple(dict.fromkeys(step for step in declared if step not in STEPS))


def training_steps() -> tuple[str, ...]:
    """The steps that train (torchrun, or a TrainJob on several nodes): :data:`TRAINING_STEPS` and the families'
    declared steps that do."""
    from vlp.models.family import specs

    declared = [one.step for spec in specs().values() for one in spec.prepared if one.trains]
    return TRAINING_STEPS + tuple(dict.fromkeys(step for step in declared if step not in TRAINING_STEPS))


SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")  # what Kubernetes accepts as a key of a Secret


def _check(cfg: PipelineConfig, path: Path) -> None:
    _check_env(cfg, path)
    if cfg.code_digest:
        raise ConfigError(f"{path}: code_digest is set by pipelines.local_run, not by a pipeline config")
    if cfg.run_as.user < 1 or cfg.run_as.group < 1:
        raise ConfigError(f"{path}: run_as.user and run_as.group must be > 0 (steps run as non-root), got {cfg.run_as}")
    if not 1 <= cfg.fanout.parts <= 1024 or cfg.fanout.parallelism < 0:
        raise ConfigError(f"{path}: fanout.parts must be in 1..1024 and fanout.parallelism >= 0")
    for name, step in cfg.steps.items():
        if step.num_nodes < 1 or (step.num_nodes > 1 and name not in training_steps()):
            raise ConfigError(
                f"{path}: steps.{name}: num_nodes must be 1, or > 1 on a training step {training_steps()}"
            )
        if step.accelerator_count < 0 or step.retries < 0:
            raise ConfigError(f"{path}: steps.{name}: accelerator_count and retries must be >= 0")
        if step.accelerator_count and not step.accelerator_type:
            raise ConfigError(f"{path}: steps.{name}: accelerator_count needs accelerator_type (e.g. nvidia.com/gpu)")
        for tol in step.tolerations:
            if tol.operator == "Equal" and not tol.key:
                raise ConfigError(f"{path}: steps.{name}: a toleration with operator Equal needs a key")


def _check_env(cfg: PipelineConfig, path: Path) -> None:
    from components._runtime import config_param_credentials

    secret = config_param_credentials(cfg.step_config)
    if secret:
        raise ConfigError(
            f"{path}: step_config carries credentials ({', '.join(secret)}): it becomes the `config` run parameter "
            "that the KFP UI shows; use s3.secret and tracking_secret (references to Kubernetes Secrets)"
        )
    s3 = cfg.s3
    for key, value in (("s3.endpoint_url", s3.endpoint_url), ("tracking_uri", cfg.tracking_uri)):
        if value and not value.startswith(("http://", "https://")):
            raise ConfigError(f"{path}: {key} {value!r} needs a scheme, e.g. http://host:port or https://host")
    if s3.secret:
        for key, value in (("s3.access_key_key", s3.access_key_key), ("s3.secret_key_key", s3.secret_key_key)):
            if not SECRET_KEY.match(value):
                raise ConfigError(f"{path}: {key} {value!r} is not a Secret key (letters, digits, '-', '_', '.')")
        if s3.access_key_key == s3.secret_key_key:
            raise ConfigError(f"{path}: s3.access_key_key and s3.secret_key_key are both {s3.access_key_key!r}")
    login = cfg.tracking_secret
    if login.name:
        for key, value in (("username_key", login.username_key), ("password_key", login.password_key)):
            if not SECRET_KEY.match(value):
                raise ConfigError(f"{path}: tracking_secret.{key} {value!r} is not a Secret key")
        if login.username_key == login.password_key:
            raise ConfigError(f"{path}: tracking_secret.username_key and password_key are the same key")


# --------------------------------------------------------------------------- applying settings to tasks

SHM_VOLUME = "dshm"


# Tasks that exist for their MLflow side effects (a parent run per run, registration, re-evaluation): never cached,
# whatever a pipeline config says, or a rerun would have no parent run and register nothing.
RUN_LEVEL_STEPS = ("start_run", "finish_run", "report", "fetch_model", "compare_scores")
CODE_DIGEST_ENV = "VLP_CODE_DIGEST"


def configure(task: Any, cfg: PipelineConfig, name: str) -> Any:
    """Apply step ``name``'s settings (image, resources, accelerator, scheduling, /dev/shm, retries, caching), the
    environment of every step and its security context."""
    from kfp import kubernetes

    s = cfg.step(name)
    task.set_display_name(name).set_container_image(cfg.image(name))
    for value, setter in (
        (s.cpu_request, task.set_cpu_request),
        (s.cpu_limit, task.set_cpu_limit),
        (s.memory_request, task.set_memory_request),
        (s.memory_limit, task.set_memory_limit),
    ):
        if value:
            setter(value)
    if s.accelerator_type and s.accelerator_count:
        task.set_accelerator_type(s.accelerator_type).set_accelerator_limit(s.accelerator_count)
    for key, value in sorted(s.node_selector.items()):
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    for tol in s.tolerations:
        kubernetes.add_toleration(
            task, key=tol.key or None, operator=tol.operator, value=tol.value or None, effect=tol.effect or None
        )
    if s.shm_size:
        kubernetes.empty_dir_mount(task, SHM_VOLUME, "/dev/shm", medium="Memory", size_limit=s.shm_size)
    if s.retries:
        task.set_retry(
            s.retries, backoff_duration=s.retry_backoff or None, backoff_factor=2.0 if s.retry_backoff else None
        )
    task.set_caching_options(enable_caching=s.caching and name not in RUN_LEVEL_STEPS)
    if cfg.code_digest:
        task.set_env_variable(CODE_DIGEST_ENV, cfg.code_digest)
    return secure(set_environment(task, cfg), cfg, name)


MLFLOW_CLIENT_LABEL = ("vlp.dev/mlflow-client", "true")  # the chart's NetworkPolicy admits these pods to MLflow
STEP_POD_LABEL = ("vlp.dev/pipeline-step", "true")  # the chart's step egress NetworkPolicy selects these pods
# The fetch step's pods instead (they download from the internet): the chart's fetch egress NetworkPolicy adds public
# addresses on the web's ports to what every step pod may reach.
FETCH_POD_LABEL = ("vlp.dev/pipeline-step", "fetch")
INTERNET_STEPS = ("fetch",)


def secure(task: Any, cfg: PipelineConfig, name: str = "") -> Any:
    """Run the step's container as ``run_as`` (non-root user and group) and label its pod as a step pod.

    kfp-kubernetes can set only runAsUser, runAsGroup and runAsNonRoot; the KFP backend adds no privilege
    escalation, no capabilities and the RuntimeDefault seccomp profile itself. A read-only root filesystem cannot
    be said in the compiled spec (see docs/guides/pipelines.md); the Helm chart adds what it can at the namespace: a Pod
    Security label and an egress NetworkPolicy for pods with :data:`STEP_POD_LABEL` (step ``name`` in
    :data:`INTERNET_STEPS`: :data:`FETCH_POD_LABEL`, whose policy adds the internet's public addresses).
    """
    from kfp import kubernetes

    kubernetes.set_security_context(task, run_as_user=cfg.run_as.user, run_as_group=cfg.run_as.group,
                                    run_as_non_root=True)  # fmt: skip
    kubernetes.add_pod_label(task, *(FETCH_POD_LABEL if name in INTERNET_STEPS else STEP_POD_LABEL))
    return task


RUN_ID_LABEL = "pipeline/runid"  # the label KFP's API server puts on every pod of a run: the run's id


def set_environment(task: Any, cfg: PipelineConfig) -> Any:
    """Object-store credentials (from the Secret ``s3.secret``), the MLflow login (from ``tracking_secret``),
    endpoint, region and the MLflow URI as env; ``KFP_RUN_ID`` from the pod's run-id label; the label that lets
    the pod reach MLflow.

    The run id reaches the step through the downward API rather than as a task input: an input would differ in
    every run, so no step's cache key would ever repeat and KFP would never reuse a finished step.
    """
    from kfp import kubernetes

    from components._runtime import RUN_ID_ENV

    kubernetes.use_field_path_as_env(task, env_name=RUN_ID_ENV, field_path=f"metadata.labels['{RUN_ID_LABEL}']")
    for secret, keys in _secret_keys(cfg):
        kubernetes.use_secret_as_env(task, secret_name=secret, secret_key_to_env=keys)
    for name, value in environment(cfg).items():
        task.set_env_variable(name, value)
    if cfg.tracking_uri:
        kubernetes.add_pod_label(task, *MLFLOW_CLIENT_LABEL)
    return task


def _secret_keys(cfg: PipelineConfig) -> list[tuple[str, dict[str, str]]]:
    """``(Secret name, {key: env var})`` of every credential a step pod gets."""
    s3, login = cfg.s3, cfg.tracking_secret
    found = []
    if s3.secret:
        found.append((s3.secret, {s3.access_key_key: "AWS_ACCESS_KEY_ID", s3.secret_key_key: "AWS_SECRET_ACCESS_KEY"}))
    if login.name:
        keys = {login.username_key: "MLFLOW_TRACKING_USERNAME", login.password_key: "MLFLOW_TRACKING_PASSWORD"}
        found.append((login.name, keys))
    return found


def environment(cfg: PipelineConfig) -> dict[str, str]:
    """The plain (non-secret) environment variables every step gets from ``cfg``."""
    s3 = cfg.s3
    env = {
        "AWS_ENDPOINT_URL": s3.endpoint_url,
        "MLFLOW_S3_ENDPOINT_URL": s3.endpoint_url,
        "AWS_REGION": s3.region,
        "AWS_DEFAULT_REGION": s3.region,
        "MLFLOW_TRACKING_URI": cfg.tracking_uri,
    }
    return {name: value for name, value in env.items() if value}


def nproc(cfg: PipelineConfig, name: str) -> int:
    """Processes per node of a training step: its GPU count (1 without GPUs)."""
    return max(1, cfg.step(name).accelerator_count)


def scale(cfg: PipelineConfig, name: str) -> dict[str, Any]:
    """A training task's ``nproc`` and, when the step asks for more than one node, its ``launch`` settings."""
    launch = launch_settings(cfg, name)
    return {"nproc": nproc(cfg, name), **({"launch": launch} if launch else {})}


def launch_settings(cfg: PipelineConfig, name: str) -> dict[str, Any]:
    """What ``components.trainjob.Launch`` needs for step ``name`` on ``num_nodes`` nodes ({} for one node): its
    image, one node's resources, scheduling and /dev/shm, the environment of every step pod (credentials as
    Secret references) and ``run_as`` (the node pods run non-root on a read-only root filesystem)."""
    s = cfg.step(name)
    if s.num_nodes <= 1:
        return {}
    requests = {"cpu": s.cpu_request, "memory": s.memory_request}
    limits = {"cpu": s.cpu_limit, "memory": s.memory_limit}
    if s.accelerator_type and s.accelerator_count:
        requests[s.accelerator_type] = limits[s.accelerator_type] = str(s.accelerator_count)
    resources = {k: {n: v for n, v in r.items() if v} for k, r in (("requests", requests), ("limits", limits))}
    tolerations = [{k: v for k, v in dataclasses.asdict(t).items() if v} for t in s.tolerations]
    return {
        "num_nodes": s.num_nodes,
        "proc_per_node": nproc(cfg, name),
        "image": cfg.image(name),
        "runtime": s.trainer_runtime,
        "resources": {k: r for k, r in resources.items() if r},
        "node_selector": dict(sorted(s.node_selector.items())),
        "tolerations": tolerations,
        "service_account": s.trainer_service_account,
        "shm_size": s.shm_size,
        "env": secret_env(cfg) + [{"name": k, "value": v} for k, v in environment(cfg).items()],
        "pod_labels": dict([MLFLOW_CLIENT_LABEL]) if cfg.tracking_uri else {},
        "run_as": {"user": cfg.run_as.user, "group": cfg.run_as.group},
    }


def secret_env(cfg: PipelineConfig) -> list[dict[str, Any]]:
    """The credentials every step gets, as Kubernetes EnvVar objects that reference their Secrets."""
    return [
        {"name": env, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for secret, keys in _secret_keys(cfg)
        for key, env in keys.items()
    ]
