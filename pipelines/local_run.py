"""Run the whole pre-training DAG on this machine with ``kfp.local`` (``make pipeline-run`` without KFP_HOST).

A fresh synthetic world, the main job's step config (``configs/pipeline-local.yaml``), CPU, the current Python
environment (SubprocessRunner, ``use_venv=False``), a local pipeline root and a local MLflow store (sqlite)
under ``--out``. At the end it prints where every output is, each figure next to chance and the baselines, and
the MLflow parent run (with one nested run per step) to open::

    python -m pipelines.local_run [--out runs/pipeline-local] [--param key=value ...] [section.key=value ...]

``--param`` sets a pipeline parameter as ``make pipeline-run PARAMS="..."`` does on a cluster (same names and
YAML values, checked against the compiled pipeline's inputs, e.g. ``register_alias=x`` or ``data_root=s3://b/p``);
``overrides`` given as a parameter are added after the trailing ones. ``--family albef`` runs ALBEF's DAG
(no prompter, entities or prompt bank); ``--pipeline retrieval`` runs ``vlp-retrieval`` (no pre-training: the
family, TS2-Net by default, fine-tunes from its named weights; the tiny preset's are random); ``--pipeline index``
runs ``vlp-index`` over a model and a frames store given as ``--param model=URI --param frames=URI`` (and
optionally ``dataset``, ``split``, ``index_uri``; local paths are made absolute), e.g. to index a finished run's
whole frames store with its fine-tuned model.
"""

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import sys
import time
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines import config as pipeline_config
from pipelines import index, local_talk, pretrain, retrieval
from vlp.models.family import DEFAULT_FAMILY

REPO_ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "vlp-local"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipelines.local_run", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/pipeline-local", help="run directory (pipeline root + MLflow store)")
    parser.add_argument("--config", default=str(pipeline_config.CONFIG_DIR / "local.yaml"), help="pipeline config")
    parser.add_argument("--step-config", default=None, help="vlp step config (default: the pipeline config's)")
    parser.add_argument("--source-uri", default="", help="raw dataset to ingest instead of a fresh synthetic world")
    parser.add_argument("--pipeline", default="pretrain", choices=["pretrain", "retrieval", "index"],
                        help="the pre-training DAG of --family, vlp-retrieval (from weights), or vlp-index (--param "
                        "model=URI --param frames=URI)")  # fmt: skip
    parser.add_argument("--family", default=None, help="model family (pretrain: one that pre-trains, default "
                        f"{DEFAULT_FAMILY}; retrieval: any, default {retrieval.default_family()})")  # fmt: skip
    parser.add_argument(
        "--data-root", default=None, help="s3:// prefix for large outputs (default: the pipeline config's data_root)"
    )
    parser.add_argument("--param", action="append", default=[], metavar="key=value",
                        help="pipeline parameter, as PARAMS on a cluster (repeat)")  # fmt: skip
    parser.add_argument("--no-cache", action="store_true", help="run every task again (no reuse of earlier runs)")
    parser.add_argument("--runner", default="subprocess", choices=["subprocess", "container"],
                        help="subprocess: each task in this virtualenv; container: each task in vlp's image as "
                        "a pod runs it (uid 10001, read-only root; scripts/podman-service.sh)")  # fmt: skip
    parser.add_argument("--image", default=None, help="with --runner container: the image (default: make image-test's)")
    parser.add_argument("--network", default="loopback", choices=["loopback", "host"],
                        help="with --runner container: loopback (the steps reach the object store's and MLflow's "
                        "ports on this machine's loopback, nothing else) or host (this machine's network)")  # fmt: skip
    parser.add_argument("--verbose", action="store_true", help="kfp.local's own log: executor inputs, artifacts")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="step config overrides")
    return parser.parse_args(argv)


def run(
    out: str | Path,
    pipeline_config_path: str | Path = pipeline_config.CONFIG_DIR / "local.yaml",
    step_config: str | None = None,
    overrides: Sequence[str] = (),
    source_uri: str = "",
    data_root: str | None = None,
    params: dict[str, Any] | None = None,
    family: str = DEFAULT_FAMILY,
    pipeline: str = "pretrain",
    cache: bool = True,
    verbose: bool = False,
    talk: local_talk.Talk | None = None,
    runner: str = "subprocess",
    image: str | None = None,
    network: str = "loopback",
) -> dict[str, Any]:
    """Run ``family``'s pre-training DAG (or, with ``pipeline="retrieval"``, ``vlp-retrieval`` for ``family``; with
    ``pipeline="index"``, ``vlp-index`` on ``params``' model and frames) locally into ``out``; returns ``{"outputs":
    {task: {name: path}}, "tasks": [(task, "done" | "cached" | "failed", seconds)], "reports": {task: html path},
    "mlflow": {...}, "step_config": the vlp step config's path}``.

    With ``data_root`` (e.g. ``s3://bucket/prefix``; default: the pipeline config's) the large outputs go there
    and the local artifacts keep ``LOCATION`` pointers; storage settings come from the ``AWS_*`` environment,
    which the step subprocesses inherit.

    With ``cache`` (the default) a task whose inputs, component code and environment (which holds
    :func:`code_digest` and :func:`source_digest` as ``$VLP_CODE_DIGEST``) match a finished task of an earlier run
    in the same ``out`` is not run again: kfp.local's cache (``<out>/kfp-cache``) gives its outputs, as KFP's does
    on a cluster. The tasks that exist for their MLflow side effects (start_run, report,
    finish_run) are never cached, so every run has its own MLflow parent run. Each run gets a fresh
    ``$KFP_RUN_ID`` (``local-<time>-<hex>``) that its steps read to nest their MLflow runs; it is not a task
    input, so it does not break the cache.

    With ``runner="container"`` each task runs in ``image`` (:mod:`pipelines.local_container`) against an MLflow
    server from the same image; with ``network="loopback"`` the tasks reach the object store's and MLflow's ports
    and nothing else (:mod:`pipelines.local_network`), with ``"host"`` this machine's network.
    """
    from kfp import local

    from pipelines import local_container, local_network
    from vlp.tracking import environment, sqlite_uri

    cfg = pipeline_config.load(pipeline_config_path)
    run_dir = Path(out).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    config = step_config or cfg.step_config
    if "\n" not in config and not Path(config).is_absolute():
        config = str((REPO_ROOT / config).resolve())
    source = str((params or {}).get("source_uri") or source_uri)
    cfg = dataclasses.replace(cfg, code_digest=code_digest(config) + source_digest(source))
    kfp_root = run_dir / "kfp"
    in_containers = runner == "container"
    root = cfg.data_root if data_root is None else data_root
    tracking_uri, server, relay = sqlite_uri(run_dir), None, None
    logins: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if in_containers:  # a container sees the pipeline root alone: the step config goes as text
        config = Path(config).read_text(encoding="utf-8") if "\n" not in config else config
        tag = image or local_container.IMAGE
        cfg = dataclasses.replace(cfg, images=pipeline_config.Images(cpu=tag, gpu=tag))
        kfp_root.mkdir(exist_ok=True)
        kfp_root.chmod(0o777)  # written by the containers' uid 10001 as well as by this process
        artifacts = f"{root.rstrip('/')}/mlflow" if root.startswith("s3://") else ""
        server = local_container.start_tracking_server(tag, str(run_dir / "mlflow-server"), artifacts)
        tracking_uri = server.uri
        user, password = server.step_user  # the steps' login, as a pod's Secret gives it: in the environment
        # the server as a pod finds the chart's: $MLFLOW_TRACKING_URI, not an override (a task input: its port, new
        # each run, would keep every task out of KFP's cache)
        logins = environment(MLFLOW_TRACKING_URI=server.uri, MLFLOW_TRACKING_USERNAME=user,
                             MLFLOW_TRACKING_PASSWORD=password)  # fmt: skip
        if network == "loopback":  # the object store's and MLflow's ports, nothing else (the chart's NetworkPolicy)
            try:
                ports = local_network.loopback_ports(os.environ | {"MLFLOW_TRACKING_URI": server.uri})
                relay = local_container.start_relay(tag, ports)
            except Exception:
                server.stop()
                raise
    tracking = [] if in_containers else [f"tracking.tracking_uri={tracking_uri}"]
    tracking.append(f"tracking.experiment={EXPERIMENT}")
    if in_containers:
        task_runner = local_container.runner(relay.network_mode if relay else network)
    else:
        task_runner = local.SubprocessRunner(use_venv=False)
    local.init(
        runner=task_runner,
        pipeline_root=str(kfp_root),
        enable_caching=cache,
        cache_root=str(run_dir / "kfp-cache"),
    )
    new_run_id()
    talk = talk or local_talk.Talk(verbose=verbose)
    local_container.VERBOSE = verbose
    local_container.STARTED.clear()
    containers = local_container.patched() if in_containers else contextlib.nullcontext()
    with contextlib.ExitStack() as stack:
        if server is not None:
            stack.callback(server.stop)
        if relay is not None:
            stack.callback(relay.stop)
        stack.enter_context(logins)
        result = _run_dag(cfg, kfp_root, run_dir, talk, containers, in_containers, pipeline, family, config,
                          source_uri, root, params, tracking, overrides)  # fmt: skip
        result["mlflow"] = mlflow_summary(tracking_uri)
        if in_containers:
            result["network"] = {"mode": network, "ports": relay.ports if relay else []}
        if server is not None:  # the server (in the image, with its login) ends with the run; its store stays
            result["mlflow"]["tracking_uri"] = f"sqlite:///{server.data}/mlflow.db"
    return result


def _run_dag(cfg: Any, kfp_root: Path, run_dir: Path, talk: local_talk.Talk, containers: Any, in_containers: bool,
             pipeline: str, family: str, config: str, source_uri: str, root: str, params: dict[str, Any] | None,
             tracking: list[str], overrides: Sequence[str]) -> dict[str, Any]:  # fmt: skip
    """The DAG run itself (:func:`run`'s middle): its outputs, task list and reports."""
    from pipelines import local_container

    before = set(kfp_root.glob("*"))
    with warnings.catch_warnings(), talk, containers:
        warnings.filterwarnings("ignore", message=".*non-Python base image.*")
        warnings.filterwarnings("ignore", message=".*no effect in the current local runner.*")
        arguments: dict[str, Any] = {"config": config, "source_uri": source_uri, "data_root": root}
        arguments |= {k: v for k, v in (params or {}).items() if k != "overrides"}
        arguments["overrides"] = [*tracking, *overrides, *(params or {}).get("overrides", [])]
        if pipeline == "index":
            arguments.pop("source_uri")
            index.build(cfg)(**{k: local_uri(v) if k in INDEX_URIS else v for k, v in arguments.items()})
        elif pipeline == "retrieval":
            retrieval.build(cfg)(**arguments, family=family)
        else:
            pretrain.build(cfg, family)(**arguments)
    new_dirs = sorted(p for p in set(kfp_root.glob("*")) - before if p.is_dir())
    outputs = list_outputs(new_dirs[-1]) if new_dirs else {}
    for task, items in talk.outputs.items():  # cached tasks: their files are in the run that made them
        if task not in outputs:
            outputs[task] = {name: where(value) for name, value in items.items() if hasattr(value, "path")}
    return {
        "outputs": outputs,
        "tasks": list(talk.order),
        "reports": copy_reports(outputs, run_dir / "reports"),
        "step_config": config,
        "containers": [dataclasses.asdict(c) for c in local_container.STARTED] if in_containers else [],
    }


INDEX_URIS = ("model", "frames", "dataset", "index_uri")  # vlp-index's URI parameters


def local_uri(value: Any) -> Any:
    """A local path made absolute (an importer in a task subprocess and the index's record of it need one); an
    ``s3://`` URI or an empty value as it is."""
    if not isinstance(value, str) or not value or "://" in value:
        return value
    return str(Path(value).resolve())


def new_run_id() -> str:
    """A fresh ``$KFP_RUN_ID`` (``local-<time>-<hex>``) for the next kfp.local run, which its step subprocesses
    inherit: what a cluster's pods read from their run-id label. Returns it."""
    from components._runtime import RUN_ID_ENV

    os.environ[RUN_ID_ENV] = f"local-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    return os.environ[RUN_ID_ENV]


def code_digest(step_config: str) -> str:
    """A digest of what a local step's result depends on besides its inputs: vlp's and the components' source, the
    repo's step configs and the step config given (its text when it is a path).

    Locally every task runs the same "image" (this checkout), and a config path names a file whose text can
    change, so kfp.local's cache key (inputs, the component's own code, its image name) would reuse a step after
    ``src/vlp`` or the config changed. Every task gets this digest as ``$VLP_CODE_DIGEST``, which kfp.local's key
    holds beside the task's inputs: any such change misses. On a cluster the image reference stands for the code:
    see docs/guides/pipelines.md (pin images by digest).
    """
    h = hashlib.sha256()
    files = sorted([*REPO_ROOT.glob("src/vlp/**/*.py"), *REPO_ROOT.glob("components/*.py"),
                    *REPO_ROOT.glob("configs/**/*.yaml")])  # fmt: skip
    for path in files:
        h.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    config = Path(step_config) if "\n" not in step_config else None
    h.update(config.read_bytes() if config is not None and config.is_file() else step_config.encode())
    return h.hexdigest()[:16]


def source_digest(source_uri: str) -> str:
    """A digest of the files behind a local ``source_uri`` (every file's path, size and mtime), "" for none or for
    an s3:// one. The ingest step's cache key holds ``source_uri`` as a string: without this, an annotation file or
    a clip edited in place would be ingested from KFP's cache as it was before."""
    from vlp import storage

    if not source_uri or storage.local_path(source_uri) is None or not Path(source_uri).exists():
        return ""
    root = Path(source_uri)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    h = hashlib.sha256()
    for path in files:
        stat = path.stat()
        h.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return "-" + h.hexdigest()[:16]


def where(artifact: Any) -> str:
    """Where an artifact's data is: the URI its ``LOCATION`` pointer names (outputs under ``data_root``), else its
    local path."""
    from components._runtime import POINTER

    path = Path(artifact.path if hasattr(artifact, "path") else artifact)
    pointer = path / POINTER
    return pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else str(path)


def copy_reports(outputs: dict[str, dict[str, str]], dest: Path) -> dict[str, str]:
    """Copy each task's HTML report (an artifact file with no extension, which a browser shows as text) to
    ``<dest>/<task>.html``; returns ``{task: path}``."""
    from vlp import storage

    copied = {}
    for stale in dest.glob("*.html"):  # an earlier run's (e.g. evaluate-qa.html before a retrieval-only run)
        stale.unlink()
    for task, items in outputs.items():
        source = items.get("report_html")
        if not source or not storage.exists(source):
            continue
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / f"{task}.html"
        target.write_bytes(storage.read_bytes(source))
        copied[task] = str(target)
    return copied


def list_outputs(run_root: Path) -> dict[str, dict[str, str]]:
    """``{task: {output name: where}}`` of a kfp.local pipeline run directory: the artifact's local path, or the
    URI its ``LOCATION`` pointer names (outputs written under ``data_root``)."""
    outputs: dict[str, dict[str, str]] = {}
    for task_dir in sorted(p for p in run_root.iterdir() if p.is_dir()):
        items = {p.name: where(p) for p in sorted(task_dir.iterdir()) if p.name != "executor_output.json"}
        if items:
            outputs[task_dir.name] = items
    return outputs


def mlflow_summary(tracking_uri: str) -> dict[str, Any]:
    """The newest parent run in the local store, its metrics and its nested step runs."""
    from vlp.tracking import KIND_TAG, PARENT_RUN_TAG, TrackingConfig, client, experiment_id

    cfg = TrackingConfig(tracking_uri=tracking_uri, experiment=EXPERIMENT)
    mlflow_client, exp = client(cfg), experiment_id(cfg)
    parents = mlflow_client.search_runs(
        [exp], f"tags.`{KIND_TAG}` = 'pipeline'", order_by=["attributes.start_time DESC"], max_results=1
    )
    if not parents:
        return {"tracking_uri": tracking_uri, "parent_run_id": None}
    parent = parents[0]
    children = mlflow_client.search_runs([exp], f"tags.`{PARENT_RUN_TAG}` = '{parent.info.run_id}'")
    return {
        "tracking_uri": tracking_uri,
        "experiment_id": exp,
        "parent_run_id": parent.info.run_id,
        "status": parent.info.status,
        "metrics": parent.data.metrics,
        "steps": {c.info.run_name: c.info.status for c in children},
    }


class Interrupted(BaseException):
    """SIGTERM reached the local run; ``code`` is the exit status (143). A BaseException, as KeyboardInterrupt (a
    Ctrl-C, exit 130) is, so that no ``except Exception`` in kfp.local turns it into a failed task."""

    def __init__(self, sig: int):
        super().__init__(signal.Signals(sig).name)
        self.code = 128 + sig


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    from pipelines.submit import SubmitError, parse_params

    family = args.family or (retrieval.default_family() if args.pipeline == "retrieval" else DEFAULT_FAMILY)
    try:
        if args.pipeline == "pretrain" and family not in pretrain.families():
            raise SubmitError(f"no pre-training DAG for {family!r}: choose {sorted(pretrain.families())} or "
                              "--pipeline retrieval")  # fmt: skip
        name = pretrain.name_of(family).removeprefix("vlp-") if args.pipeline == "pretrain" else args.pipeline
        params = parse_params(args.param, REPO_ROOT / "pipelines" / "compiled" / f"{name}.yaml")
    except SubmitError as exc:
        print(f"pipelines.local_run: error: {exc}", file=sys.stderr)
        return 2
    if args.runner == "container":
        from pipelines import local_container, local_network

        given = {"source_uri": args.source_uri or params.get("source_uri", ""), "url_list": params.get("url_list")}
        given |= {k: params.get(k) for k in INDEX_URIS}
        local = [f"{name}={value}" for name, value in given.items() if value and not str(value).startswith("s3://")]
        if local:  # a container sees the pipeline root alone
            print(f"pipelines.local_run: error: {', '.join(local)}: a container sees no path of this machine; put "
                  "it in object storage and pass its s3:// URI", file=sys.stderr)  # fmt: skip
            return 2
        try:
            local_container.check(args.image or local_container.IMAGE)
            if args.network == "loopback":
                local_network.loopback_ports(os.environ)
        except (RuntimeError, ValueError) as exc:
            print(f"pipelines.local_run: error: {exc}", file=sys.stderr)
            return 2
    talk = local_talk.Talk(verbose=args.verbose)

    def on_signal(sig: int, _frame: Any) -> None:
        raise Interrupted(sig)

    # SIGTERM becomes Interrupted; SIGINT stays a KeyboardInterrupt. Either way Talk stops the step's process group
    # (its own: a terminal's Ctrl-C reaches only this process).
    saved = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_signal)}
    try:
        result = run(
            args.out, args.config, args.step_config, args.overrides, args.source_uri, args.data_root, params, family,
            args.pipeline, cache=not args.no_cache, talk=talk, runner=args.runner, image=args.image,
            network=args.network,
        )  # fmt: skip
    except (Interrupted, KeyboardInterrupt) as exc:
        for sig in saved:  # a second Ctrl-C while the steps wind down kills at once
            signal.signal(sig, signal.SIG_DFL)
        code = exc.code if isinstance(exc, Interrupted) else 130
        return interrupted(args.out, talk, code)
    except RuntimeError:  # kfp.local: "Pipeline ... finished with status FAILURE. Inner task failed: ..."
        failed = [task for task, kind, _ in talk.order if kind == "failed"]
        if not failed:
            raise
        print(f"pipelines.local_run: the run failed at {', '.join(failed)} (its output is above); "
              f"{_done(talk)}", file=sys.stderr)  # fmt: skip
        return 1
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    print_result(result, time.perf_counter() - start)
    return 0


def _done(talk: local_talk.Talk) -> str:
    done = [task for task, kind, _ in talk.order if kind in ("done", "cached")]
    return f"{len(done)} task(s) finished; rerun the same command and they come from KFP's cache"


def interrupted(out: str | Path, talk: local_talk.Talk, code: int) -> int:
    """End the parent run and the step run left RUNNING as KILLED, and say in one line where the run stopped and
    how to go on."""
    task = talk.running  # its step process has been stopped (Talk.stop)
    from components._runtime import RUN_ID_ENV
    from vlp.tracking import TrackingConfig, end_open_runs, find_pipeline_run, sqlite_uri

    cfg = TrackingConfig(tracking_uri=sqlite_uri(Path(out).resolve()), experiment=EXPERIMENT)
    with contextlib.suppress(Exception):  # tracking must not hide the one line below
        parent = find_pipeline_run(cfg, os.environ.get(RUN_ID_ENV, ""))
        if parent:
            end_open_runs(cfg, parent, "KILLED")
    again = f" ({task} runs again from its start)" if task else ""
    print(f"interrupted {f'during {task}' if task else 'between tasks'}; {_done(talk)}{again}", file=sys.stderr)
    return code


def print_result(result: dict[str, Any], seconds: float) -> None:
    """Where every output is, the headline table, the HTML reports and the MLflow run to open."""
    print("\n=== outputs (task -> artifact) ===")
    for task, items in result["outputs"].items():
        for name, path in items.items():
            print(f"  {task:20s} {name:14s} {path}")
    summary = result["outputs"].get("report", {}).get("summary")
    if summary and Path(summary).is_file():  # the report task's table: every figure next to chance / baselines
        headline = Path(summary).read_text(encoding="utf-8").split("## Every metric")[0]
        print("\n=== results ===")
        print(headline.removeprefix("# vlp pipeline run").strip())
    indexes = [items["index"] for task, items in result["outputs"].items() if task.startswith("index-clips")]
    if indexes and not summary:  # vlp-index: no report names it
        print("\n=== clip index ===")
        for path in indexes:
            print(f'  .venv/bin/vlp search --index {path} --config {result.get("step_config", "...")} "a caption"')
    if result["reports"]:
        print("\n=== reports (open in a browser) ===")
        for task, path in result["reports"].items():
            print(f"  {task:20s} {path}")
    tracked = result["mlflow"]
    print("\n=== MLflow ===")
    if tracked.get("parent_run_id"):
        print(f"parent run {tracked['parent_run_id']} ({tracked['status']}), experiment {EXPERIMENT}, "
              f"store {tracked['tracking_uri']}")  # fmt: skip
        for step, status in sorted(tracked["steps"].items()):
            print(f"  {step:20s} {status}")
        print(f"open: .venv/bin/mlflow ui --backend-store-uri {tracked['tracking_uri']}")
        print(
            f"      then http://127.0.0.1:5000/#/experiments/{tracked['experiment_id']}/runs/{tracked['parent_run_id']}"
        )
    else:
        print(json.dumps(tracked, indent=2, sort_keys=True))
    if result.get("containers"):
        print("\n=== containers (each task in its image, as a pod runs it) ===")
        net = result.get("network", {})
        if net.get("mode") == "loopback":
            reach = ", ".join(f"127.0.0.1:{port}" for port in net["ports"]) or "nothing"
            print(f"  network: the loopback alone, where {reach} answer (the object store, MLflow)")
        else:
            print("  network: this machine's (--network host)")
        for c in result["containers"]:
            print(f"  {c['task']:20s} {c['image']}@{c['digest'][:19]} user {c['user']} exit {c['exit_code']} "
                  f"{c['seconds']:.1f} s")  # fmt: skip
    cached = [task for task, kind, _ in result["tasks"] if kind == "cached"]
    ran = [task for task, kind, _ in result["tasks"] if kind == "done"]
    reused = f"{len(cached)} reused from KFP's cache" + (f" ({', '.join(cached)})" if cached else "")
    print(f"\nlocal pipeline run finished in {seconds:.0f} s: {len(ran)} task(s) ran, {reused} "
          "(CACHE=0 / --no-cache runs them all)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
