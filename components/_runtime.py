"""What every component body shares, imported *inside* the body at run time (never imports kfp).

In the image the repo sits at /opt/vlp with ``components`` importable; under ``kfp.local`` the runner's
working directory (the repo root) is on ``sys.path``. Artifacts are duck-typed: anything with ``.path``,
``.uri`` and ``.metadata`` (a KFP artifact) works, so tests can pass plain stand-ins too.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
POINTER = "LOCATION"  # file inside an artifact dir naming where its data really lives (an s3:// prefix)
TRACKING_ENV = "MLFLOW_TRACKING_URI"  # set on every step pod by the pipeline config's `tracking_uri`
RUN_ID_ENV = "KFP_RUN_ID"  # the KFP run id, from the environment, never a task input (see kfp_run_id)


def kfp_run_id() -> str:
    """The KFP run this step belongs to: ``$KFP_RUN_ID`` ("" when unset).

    It is read from the environment, not taken as a task input, so that a task's inputs (and so its KFP cache
    key) are the same in every run with the same parameters: a rerun reuses what an earlier run computed. On a
    cluster every step's pod gets it from its ``pipeline/runid`` label through the downward API
    (``pipelines.config.set_environment``); ``pipelines.local_run`` sets it for the step subprocesses.
    """
    return os.environ.get(RUN_ID_ENV, "").strip()


def config_file(config: str) -> str:
    """A YAML file holding ``config``: an existing path (absolute, relative to the working directory or to the
    repo root, e.g. ``configs/tiny.yaml``) is used as is; any other text is the YAML itself, written to a
    temporary file."""
    text = config.strip()
    if "\n" not in text and text.endswith((".yaml", ".yml")):
        for candidate in (Path(text), REPO_ROOT / text):
            if candidate.is_file():
                return str(candidate.resolve())
        raise FileNotFoundError(f"config file {text!r} not found (looked in {Path.cwd()} and {REPO_ROOT})")
    fd, path = tempfile.mkstemp(prefix="vlp-config-", suffix=".yaml")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(config)
    return path


def load_step_config(config: str, overrides: Sequence[str]) -> tuple[Any, list[str]]:
    """The vlp step config of ``config`` + ``overrides``, and the overrides that reproduce it in a subprocess.

    An empty ``tracking.tracking_uri`` is taken from ``$MLFLOW_TRACKING_URI`` (the cluster's MLflow, set on
    every pod by the compiled pipeline); one set in the config or the overrides wins. In a cluster pod
    (``KFP_POD_NAME`` set) a credential in the overrides or in the loaded config, whatever file or text it came
    from, is refused: storage keys and MLflow logins come from Secrets, never from run parameters.
    """
    from vlp.config import credential_overrides, load_config, to_dict

    overrides = list(overrides)
    secret = credential_overrides(overrides)
    if secret and os.environ.get("KFP_POD_NAME"):  # a cluster pod: the overrides are a run parameter in the UI
        raise ValueError(
            f"credentials given as overrides ({', '.join(secret)}): a run's parameters are visible in the KFP UI; "
            "put storage keys in the Secret of pipelines/config s3.secret and MLflow logins in tracking_secret"
        )
    cfg = load_config(config_file(config), overrides)
    secret = config_credentials(to_dict(cfg))
    if secret and os.environ.get("KFP_POD_NAME"):  # the `config` parameter: in the UI, and a TrainJob's env
        raise ValueError(
            f"credentials in the step config ({', '.join(secret)}): the `config` run parameter is visible in the "
            "KFP UI and a multi-node step copies it into its TrainJob; remove them from the config and put storage "
            "keys in the Secret of pipelines/config s3.secret and MLflow logins in tracking_secret"
        )
    uri = os.environ.get(TRACKING_ENV, "").strip()
    if uri and not cfg.tracking.tracking_uri:
        overrides.append(f"tracking.tracking_uri={uri}")
        cfg.tracking.tracking_uri = uri
    return cfg, overrides


def config_credentials(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys of a step config mapping (a loaded config's ``to_dict``, or parsed YAML) that carry a
    credential, judged as :func:`vlp.config.credential_overrides` judges an override: a storage key, or a URI with
    a password in it."""
    from vlp.config import credential_overrides

    found = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found += config_credentials(value, f"{dotted}.")
        elif isinstance(value, str | int | float):
            found += credential_overrides([f"{dotted}={value}"])
    return found


def config_param_credentials(config: Any) -> list[str]:
    """The dotted keys of a ``config`` run parameter that carry a credential: its YAML text, or the repo's file it
    names (e.g. ``configs/default.yaml``; the image holds the same files). Text that is not a YAML mapping, or a
    file only the image has, gives []: the step checks what it loads."""
    from vlp.schema import ConfigError, load_yaml

    text = str(config or "").strip()
    if "\n" not in text and text.endswith((".yaml", ".yml")):
        path = Path(text) if Path(text).is_absolute() else REPO_ROOT / text
        if not path.is_file():
            return []
        text = path.read_text(encoding="utf-8")
    try:
        data = load_yaml(text, "the config parameter")
    except ConfigError:
        return []
    return config_credentials(data) if isinstance(data, dict) else []


def location(artifact: Any) -> str:
    """The URI a step should read an input artifact from: its ``LOCATION`` pointer, else its local path."""
    pointer = Path(artifact.path) / POINTER
    if pointer.is_file():
        return pointer.read_text(encoding="utf-8").strip()
    return artifact.path


def source_location(artifact: Any) -> str:
    """Where an input artifact's data lives for a reader outside this step: its ``LOCATION`` pointer, else its URI
    when that is an ``s3://`` one (an object-storage URI imported with ``dsl.importer``, which KFP copies to a
    pod-local path), else its local path. An output that records its inputs by URI, as a clip index records its
    model and frames for ``vlp search`` to load later, must name this, not the pod-local copy."""
    from vlp import storage

    pointer = Path(artifact.path) / POINTER
    if pointer.is_file():
        return pointer.read_text(encoding="utf-8").strip()
    uri = str(getattr(artifact, "uri", "") or "")
    return uri if storage.local_path(uri) is None else artifact.path


def output_location(artifact: Any, data_root: str = "", uri: str = "") -> str:
    """Where a step writes an output artifact.

    With ``data_root`` empty, the artifact's own directory (KFP uploads it to the pipeline root). With
    ``data_root`` set (e.g. ``s3://bucket/vlp-data``), large data goes straight to
    ``<data_root>/<run>/<task>/<output>``; the artifact keeps only a ``LOCATION`` pointer and ``metadata.uri``.
    With ``uri`` (a place a run parameter names, e.g. the ``index_uri`` of ``vlp-index``), the data goes there
    whatever ``data_root`` says, behind the same pointer.
    """
    Path(artifact.path).mkdir(parents=True, exist_ok=True)
    if uri:
        return _point(artifact, uri.rstrip("/"))
    if not data_root:
        if os.environ.get("KFP_POD_NAME") and getattr(artifact, "schema_title", "") == "system.Model":
            print(  # a KFP pod on a cluster (kfp.local sets no KFP_POD_NAME): say what a retry will cost
                f"warning: data_root is empty, so the checkpoints of {artifact.name!r} stay in this pod until the "
                "step succeeds; a preempted or retried step restarts from step 0 (set the data_root parameter)",
                file=sys.stderr,
            )
        return artifact.path
    suffix = "/".join(artifact.uri.rstrip("/").split("/")[-3:])
    return _point(artifact, f"{data_root.rstrip('/')}/{suffix}")


def part_location(artifact: Any, data_root: str, kind: str, key: Any) -> str:
    """Where a fan-out part writes: with ``data_root`` set, ``<data_root>/parts/<kind>/<hash of key>``, the same
    for every run whose part has the same ``key`` (its inputs and settings), so the part of a rerun finds what
    the part of an earlier run finished and skips it; else the artifact's own directory (one run's)."""
    import hashlib

    Path(artifact.path).mkdir(parents=True, exist_ok=True)
    if not data_root:
        return artifact.path
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return _point(artifact, f"{data_root.rstrip('/')}/parts/{kind}/{digest}")


def fetch_location(artifact: Any, data_root: str, url_list: str, cfg: Any, fanned_out: bool = False) -> str:
    """Where a fetch writes (its parts and merge alike): with ``data_root`` set,
    ``<data_root>/parts/fetch/<hash of the list's URI, format and split>``, so a rerun resumes what an earlier run
    fetched; else the artifact's own directory, which a later step can read under kfp.local only (one machine).
    Refused, naming ``data_root``, where that cannot work: on a cluster (the next pod cannot read this pod's
    folder), and for fan-out parts (each would fetch into a folder of its own)."""
    if not data_root and (fanned_out or os.environ.get("KFP_POD_NAME")):
        raise ValueError("fetching a URL list on a cluster or in parts needs the data_root run parameter (an s3:// "
                         "prefix): the videos must be where every later pod can read them")  # fmt: skip
    return part_location(artifact, data_root, "fetch", [url_list, cfg.fetch.format, cfg.fetch.split])


def _point(artifact: Any, uri: str) -> str:
    """Make ``artifact`` a ``LOCATION`` pointer to ``uri``; returns ``uri``."""
    (Path(artifact.path) / POINTER).write_text(uri + "\n", encoding="utf-8")
    artifact.metadata["uri"] = uri
    return uri


class Step:
    """One step run from a component: its config, an MLflow step run, and in-process or ``torchrun`` execution.

    Args:
        name: Step name (the MLflow run name and ``vlp.step`` tag).
        config: YAML text or a path (see :func:`config_file`).
        overrides: ``section.key=value`` overrides applied after the file.
        nproc: Processes on this node; > 1 runs the step's CLI under ``torchrun --nproc-per-node nproc``.
        launch: Multi-node settings (:class:`components.trainjob.Launch`); non-empty = the step's CLI runs as a
            Kubeflow Trainer TrainJob on ``launch["num_nodes"]`` nodes, which this pod launches and follows.
    """

    def __init__(
        self,
        name: str,
        config: str,
        overrides: Sequence[str],
        nproc: int = 1,
        launch: dict[str, Any] | None = None,
    ):
        self.name, self.nproc, self.launch = name, nproc, dict(launch or {})
        self.kfp_run_id = kfp_run_id()  # with tracking on, the step run nests under this KFP run's parent run
        self.config_path = config_file(config)
        self.cfg, self.overrides = load_step_config(self.config_path, overrides)

    def run(self, fn: Callable[[Any], dict[str, Any]], cli: Sequence[str] = (), out: str = "") -> dict[str, Any]:
        """Run ``fn(cfg)`` (or ``vlp <cli>`` writing ``out``: under torchrun when ``nproc > 1``, as a TrainJob
        with ``launch``); returns the summary. ``<out>/metrics.json`` (evaluation steps) is added to the summary
        as ``eval``."""
        from vlp.tracking import track_step

        def work() -> dict[str, Any]:
            age = process_age()
            if age is not None:  # what this pod spent before its work: Python, imports, config, the tracking run
                print(f"{self.name}: start-up {age:.2f} s (process start to the step's work)", flush=True)
            if self.launch and cli:
                summary = self._trainjob(cli, out)
            else:
                summary = self._torchrun(cli, out) if self.nproc > 1 and cli else fn(self.cfg)
            evaluation = read_json(out, "metrics.json") if out else None
            return {**summary, "eval": evaluation} if evaluation else summary

        from vlp.signals import interrupt_on_signals

        with interrupt_on_signals():  # SIGTERM (a pod deleted or preempted) ends the step run KILLED, not RUNNING
            return track_step(self.cfg.tracking, self.name, work, kfp_run_id=self.kfp_run_id)

    def _trainjob(self, cli: Sequence[str], out: str) -> dict[str, Any]:
        """``vlp <cli>`` on every node of a TrainJob; its inputs and ``out`` must be in object storage."""
        from components import trainjob
        from vlp import storage

        launch = trainjob.Launch.from_dict(self.launch)
        local = [v for k, v in itertools.pairwise(cli) if k.startswith("--") and v.startswith("/")]
        if local or storage.local_path(out) is not None:
            raise ValueError(
                f"{self.name} on {launch.num_nodes} nodes cannot reach the pod-local paths "
                f"{local or [out]}: set the data_root run parameter to an s3:// prefix"
            )
        api, namespace = trainjob.in_cluster()
        overrides = [*self.overrides, f"tracking.run_id={self.cfg.tracking.run_id}"]
        name = trainjob.job_name(self.name, os.environ.get("KFP_POD_NAME") or self.kfp_run_id)
        labels = {"app.kubernetes.io/part-of": "vlp", "vlp.dev/step": self.name.replace("_", "-")}
        config_text = Path(self.config_path).read_text(encoding="utf-8")
        body = trainjob.manifest(name, namespace, launch, cli, overrides, config_text, labels, trainjob.pod_owner())
        trainjob.Launcher(api, namespace, trainjob.log_line).run(body, launch.poll_s)
        return json.loads(storage.read_text(storage.join(out, "summary.json")))

    def _torchrun(self, cli: Sequence[str], out: str) -> dict[str, Any]:
        from vlp import storage

        overrides = [*self.overrides, f"tracking.run_id={self.cfg.tracking.run_id}"]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={self.nproc}"]
        cmd += ["-m", "vlp.cli", *cli, "--config", self.config_path, *overrides]
        from vlp.config import redact_overrides

        print("+", " ".join(redact_overrides(cmd)), flush=True)
        subprocess.run(cmd, check=True)
        return json.loads(storage.read_text(storage.join(out, "summary.json")))


def process_age() -> float | None:
    """Seconds since this process started, from Linux's ``/proc`` (to 10 ms); None where there is no ``/proc``."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            started = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started / os.sysconf("SC_CLK_TCK"))


def read_json(base: str, name: str) -> dict[str, Any] | None:
    """``<base>/<name>`` parsed, or None when it does not exist."""
    from vlp import storage

    uri = storage.join(base, name)
    return json.loads(storage.read_text(uri)) if storage.exists(uri) else None


def pretrain_fn(family: str) -> Callable[..., dict[str, Any]]:
    """The pre-training step function for a model ``family`` (``model.family`` picks the model inside it)."""
    from vlp.models.family import names, spec

    if family not in names():
        raise ValueError(f"model family {family!r} is not available; choose one of {sorted(names())}")
    if not spec(family).pretrains:
        raise ValueError(f"model family {family!r} is not pre-trained: it fine-tunes from its named weights "
                         "(the vlp-retrieval DAG)")  # fmt: skip
    return _pretrain_from_prompter_and_bank


def _pretrain_from_prompter_and_bank(
    dataset: str, frames: str, prompter: str, bank: str, out: str, cfg: Any
) -> dict[str, Any]:
    """The shared ``pretrain`` component's step: its ``prompter`` and ``bank`` inputs by their names (``""``: not
    given; a family whose spec declares other inputs has a pretrain component of its own)."""
    from vlp.steps.pretrain import pretrain

    return pretrain(dataset, frames, out, cfg, {"prompter": prompter, "bank": bank})


def publish_eval(out: str, metrics: Any, report_md: Any, report_html: Any) -> dict[str, float]:
    """Log ``<out>/metrics.json`` to a KFP Metrics artifact and copy the step's reports to Markdown/HTML."""
    from vlp import storage
    from vlp.tracking import numeric_leaves

    values = numeric_leaves(read_json(out, "metrics.json") or {})
    for key, value in values.items():
        metrics.log_metric(key, value)
    # The figures as a file too: KFP keeps a Metrics artifact's values in its metadata and writes no file, and
    # kfp.local's cache treats an output whose file is missing as a miss, so the step would never be reused.
    Path(metrics.path).parent.mkdir(parents=True, exist_ok=True)
    Path(metrics.path).write_text(json.dumps(values, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for name, artifact in (("report.md", report_md), ("report.html", report_html)):
        uri = storage.join(out, name)
        text = storage.read_text(uri) if storage.exists(uri) else f"{name} was not written by the step\n"
        Path(artifact.path).parent.mkdir(parents=True, exist_ok=True)
        Path(artifact.path).write_text(text, encoding="utf-8")
    return values


INDEX_FIGURES = ("added", "skipped", "total")  # the counts of a `vlp index` summary, as KFP metrics


def publish_index(summary: dict[str, Any], index: Any, metrics: Any) -> dict[str, Any]:
    """Put what ``vlp index`` did (its summary: ``added``, ``skipped``, ``total``, ``tokens_stored``, ``ann`` and,
    for a dataset's clips, ``split``) on the index artifact's metadata, with ``uri`` (where the index is), and its
    counts in a KFP Metrics artifact (as a file too, as :func:`publish_eval` does). Returns the metadata."""
    keys = (*INDEX_FIGURES, "tokens_stored", "ann", "split")
    found = {key: summary[key] for key in keys if summary.get(key) is not None}
    found["uri"] = summary["index"]
    index.metadata.update(found)
    values = {key: float(summary[key]) for key in INDEX_FIGURES}
    for key, value in values.items():
        metrics.log_metric(key, value)
    Path(metrics.path).parent.mkdir(parents=True, exist_ok=True)
    Path(metrics.path).write_text(json.dumps(values, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return found


def index_line(index: Any) -> str:
    """The run report's line for an index_clips output: where the index is, what it holds (from its
    ``summary.json``) and the command that searches it."""
    where = location(index)
    summary = read_json(where, "summary.json") or {}
    split = f" of the {summary['split']} split" if summary.get("split") else ""
    return (f"\nclip index: `{where}` ({summary.get('total', '?')} clips{split}); search it with "
            f"`vlp search --index {where} \"a caption\"` and the run's step config\n")  # fmt: skip


# --------------------------------------------------------------------------- pipeline-level tracking


def start_pipeline(config: str, overrides: Sequence[str], pipeline: str, image: str) -> str:
    """Create (or find) the MLflow parent run of this pipeline run (:func:`kfp_run_id`), tagged and with the step
    config as params."""
    from vlp import __version__
    from vlp.config import to_dict
    from vlp.tracking import log_params, pipeline_run

    cfg, _ = load_step_config(config, overrides)
    if not cfg.tracking.tracking_uri:
        print("tracking.tracking_uri is empty: MLflow tracking is off for this run")
        return ""
    tags = {"vlp.pipeline": pipeline, "vlp.image": image, "vlp.version": __version__}
    run = _require_run_id()
    run_id = pipeline_run(cfg.tracking, run, run_name=f"{pipeline}-{run}", tags=tags)
    log_params(cfg.tracking, run_id, {k: v for k, v in to_dict(cfg).items() if k not in ("storage", "tracking")})
    from vlp.tracking_auth import redact

    print(f"MLflow parent run {run_id} in {redact(cfg.tracking.tracking_uri)} (experiment {cfg.tracking.experiment})")
    return run_id


def _require_run_id() -> str:
    """:func:`kfp_run_id`, or an error that says where it comes from (a run-level task cannot find its parent run
    without it)."""
    run = kfp_run_id()
    if not run:
        raise RuntimeError(
            f"${RUN_ID_ENV} is not set: on a cluster the compiled pipeline sets it on every step from the pod's "
            "pipeline/runid label (recompile with `make pipeline-compile`); locally pipelines.local_run sets it"
        )
    return run


def finish_pipeline(config: str, overrides: Sequence[str], state: str) -> None:
    """End the parent run: FINISHED when the pipeline's tasks succeeded, else FAILED."""
    from vlp.tracking import end_run, find_pipeline_run

    cfg, _ = load_step_config(config, overrides)
    if not cfg.tracking.tracking_uri:
        return
    run_id = find_pipeline_run(cfg.tracking, _require_run_id())
    if run_id:
        end_run(cfg.tracking, run_id, "FINISHED" if state == "SUCCEEDED" else "FAILED")


def final_report(
    config: str,
    overrides: Sequence[str],
    results: dict[str, tuple[Any, Any]],
    register_prefix: str,
    register_alias: str,
    indexes: dict[str, str] | None = None,
) -> str:
    """Final metrics of every task in ``results`` (``task -> (eval results artifact, model artifact)``) to the
    parent run; each model registered as ``<register_prefix>-<task>``, made an MLflow pyfunc model where it can be
    (:func:`mlflow_model`; ``indexes``: ``task -> `` the clip index its model built). Returns a Markdown summary."""
    from vlp.tracking import log_metrics, pipeline_run, register_model

    cfg, _ = load_step_config(config, overrides)
    run = _require_run_id() if cfg.tracking.tracking_uri else ""
    rows, final, per_task = [], {}, {}
    for task, (evaluation, model) in results.items():
        metrics = {k: float(v) for k, v in (read_json(location(evaluation), "metrics.json") or {}).items()}
        per_task[task] = metrics
        final.update({f"{task}.{k}": v for k, v in metrics.items()})
        version = ""
        if cfg.tracking.tracking_uri and model is not None and metrics:
            parent = pipeline_run(cfg.tracking, run)
            name = f"{register_prefix}-{task}"
            tags = {"vlp.kfp_run_id": run, "vlp.task": task}
            with tempfile.TemporaryDirectory(prefix="vlp-register-") as tmp:
                source = mlflow_model(task, location(model), (indexes or {}).get(task, ""), cfg, tmp)
                version = register_model(
                    cfg.tracking, name, source, parent, metrics, register_alias, tags, f"{task}_model"
                )
            version = f"{name}/{version}"
        rows += [f"| {task} | {k} | {v:.4f} | {version} |" for k, v in sorted(metrics.items())]
    if cfg.tracking.tracking_uri and final:
        log_metrics(cfg.tracking, pipeline_run(cfg.tracking, run), final)
    from vlp.report import headline_table

    header = ["# vlp pipeline run", "", "Each figure next to the levels it must beat, and its verdict:", ""]
    header += [headline_table(per_task).rstrip(), ""]
    header += ["## Every metric", "", "| task | metric | value | registered |", "|---|---|---|---|"]
    return "\n".join([*header, *rows]) + "\n"


def mlflow_model(task: str, model: str, index: str, cfg: Any, tmp: str) -> str:
    """What to register for ``task``'s ``model``: the model directory made an MLflow pyfunc model under ``tmp``
    (:mod:`vlp.index.pyfunc`) when it can serve one, else ``model`` itself. A QA model answers questions
    about video files (``model_config={"frames": ...}`` at load time names a frames store); a retrieval model
    with the clip ``index`` it built searches a copy of that index. Either is still the model directory the
    re-evaluation reads."""
    from vlp.index import pyfunc
    from vlp.index.store import ClipIndex
    from vlp.models import directory, family

    out = str(Path(tmp) / "model")
    if task == "qa":
        info = directory.describe(model)
        if family.answers_questions(info.family) and info.kind == info.family.kinds.qa:
            return pyfunc.save_qa(out, model, cfg)
    if task == "retrieval" and index:
        if ClipIndex.exists(index):
            return pyfunc.save(out, index, cfg, model=model)
        print(f"report: {index} holds no clip index: {task} model registered without one", file=sys.stderr)
    return model


CHAMPION = "champion"  # the alias the scheduled re-evaluation scores by default, and compares others with


def compare_scores(
    config: str, overrides: Sequence[str], task: str, model: Any, evaluation: Any
) -> tuple[str, dict[str, float]]:
    """New evaluation metrics vs the registered model's previous ones (newest re-evaluation, else those at
    registration) and, when the model is not its name's ``@champion``, vs the champion's (its newest
    re-evaluation, else its registration's); logged to MLflow and stored on the model version. Returns
    (Markdown table, new metrics)."""
    from vlp.tracking import log_metrics, pipeline_run, record_reevaluation, set_tags

    cfg, _ = load_step_config(config, overrides)
    info = read_json(location(model), "registry.json") or {}
    new = {k: float(v) for k, v in (read_json(location(evaluation), "metrics.json") or {}).items()}
    previous = info.get("last_eval") or info.get("metrics") or {}
    name, version = info.get("name", "?"), info.get("version", "?")
    champion = _champion(cfg.tracking, name, version) if cfg.tracking.tracking_uri and name != "?" else None
    head = ["metric", "previous", "new", "change"]
    if champion:
        head += [f"champion (v{champion[0]})", "vs champion"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, value in sorted(new.items()):
        cells = [key, _cell(previous.get(key)), f"{value:.4f}", _change(value, previous.get(key))]
        if champion:
            cells += [_cell(champion[1].get(key)), _change(value, champion[1].get(key))]
        rows.append("| " + " | ".join(cells) + " |")
    if cfg.tracking.tracking_uri and new:
        parent = pipeline_run(cfg.tracking, _require_run_id())
        logged = {f"{task}.{k}": v for k, v in new.items()}
        if champion:
            logged |= {f"{task}.vs_champion.{k}": v - champion[1][k] for k, v in new.items() if k in champion[1]}
        log_metrics(cfg.tracking, parent, logged)
        tags = {f"vlp.{task}_model": f"{name}/{version}"}
        if champion:
            tags[f"vlp.{task}_champion"] = f"{name}/{champion[0]}"
        set_tags(cfg.tracking, parent, tags)
        if name != "?":
            record_reevaluation(cfg.tracking, name, version, new)
    title = f"# Re-evaluation of {name} version {version} ({task})"
    return title + "\n\n" + "\n".join(rows) + "\n", new


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _change(new: float, before: float | None) -> str:
    return "n/a" if before is None else f"{new - before:+.4f}"


def _champion(cfg: Any, name: str, version: str) -> tuple[str, dict[str, float]] | None:
    """``(version, metrics)`` of ``name@champion`` when it exists and is another version than ``version``."""
    from mlflow.exceptions import MlflowException

    from vlp.tracking import LAST_EVAL_TAG_PREFIX, resolve_model, version_metrics

    try:
        found = resolve_model(cfg, f"{name}@{CHAMPION}")
    except MlflowException as exc:  # no such alias (an invalid parameter to MLflow) or model: nothing to compare
        if exc.error_code in ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST"):
            return None
        raise
    if str(found.version) == str(version):
        return None
    return str(found.version), version_metrics(found, LAST_EVAL_TAG_PREFIX) or version_metrics(found)
