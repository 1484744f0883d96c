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
family, TS2-Net by default, fine-tunes from its named weights; the tiny preset's are random).
"""

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines import config as pipeline_config
from pipelines import pretrain, retrieval

REPO_ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "vlp-local"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipelines.local_run", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/pipeline-local", help="run directory (pipeline root + MLflow store)")
    parser.add_argument("--config", default=str(pipeline_config.CONFIG_DIR / "local.yaml"), help="pipeline config")
    parser.add_argument("--step-config", default=None, help="vlp step config (default: the pipeline config's)")
    parser.add_argument("--source-uri", default="", help="raw dataset to ingest instead of a fresh synthetic world")
    parser.add_argument("--pipeline", default="pretrain", choices=["pretrain", "retrieval"],
                        help="the pre-training DAG of --family, or vlp-retrieval (from weights)")  # fmt: skip
    parser.add_argument("--family", default=None, help="model family (pretrain: alpro / albef, default alpro; "
                        "retrieval: any, default ts2net)")  # fmt: skip
    parser.add_argument(
        "--data-root", default=None, help="s3:// prefix for large outputs (default: the pipeline config's data_root)"
    )
    parser.add_argument("--param", action="append", default=[], metavar="key=value",
                        help="pipeline parameter, as PARAMS on a cluster (repeat)")  # fmt: skip
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
    family: str = "alpro",
    pipeline: str = "pretrain",
) -> dict[str, Any]:
    """Run ``family``'s pre-training DAG (or, with ``pipeline="retrieval"``, ``vlp-retrieval`` for ``family``)
    locally into ``out``; returns ``{"outputs": {task: {name: path}},
    "mlflow": {...}}``.

    With ``data_root`` (e.g. ``s3://bucket/prefix``; default: the pipeline config's) the large outputs go there
    and the local artifacts keep ``LOCATION`` pointers; storage settings come from the ``AWS_*`` environment,
    which the step subprocesses inherit.
    """
    from kfp import local

    from vlp.tracking import sqlite_uri

    cfg = pipeline_config.load(pipeline_config_path)
    run_dir = Path(out).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    config = step_config or cfg.step_config
    if "\n" not in config and not Path(config).is_absolute():
        config = str((REPO_ROOT / config).resolve())
    tracking = [f"tracking.tracking_uri={sqlite_uri(run_dir)}", f"tracking.experiment={EXPERIMENT}"]
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(run_dir / "kfp"))
    before = set((run_dir / "kfp").glob("*"))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*non-Python base image.*")
        root = cfg.data_root if data_root is None else data_root
        arguments: dict[str, Any] = {"config": config, "source_uri": source_uri, "data_root": root}
        arguments |= {k: v for k, v in (params or {}).items() if k != "overrides"}
        arguments["overrides"] = [*tracking, *overrides, *(params or {}).get("overrides", [])]
        if pipeline == "retrieval":
            retrieval.build(cfg)(**arguments, family=family)
        else:
            pretrain.build(cfg, family)(**arguments)
    new_dirs = sorted(set((run_dir / "kfp").glob("*")) - before)
    return {"outputs": list_outputs(new_dirs[-1]), "mlflow": mlflow_summary(sqlite_uri(run_dir))}


def list_outputs(run_root: Path) -> dict[str, dict[str, str]]:
    """``{task: {output name: where}}`` of a kfp.local pipeline run directory: the artifact's local path, or the
    URI its ``LOCATION`` pointer names (outputs written under ``data_root``)."""
    from components._runtime import POINTER

    def where(path: Path) -> str:
        pointer = path / POINTER
        return pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else str(path)

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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    from pipelines.submit import SubmitError, parse_params

    family = args.family or ("ts2net" if args.pipeline == "retrieval" else "alpro")
    try:
        if args.pipeline == "pretrain" and family not in pretrain.FAMILIES:
            raise SubmitError(f"no pre-training DAG for {family!r}: choose {pretrain.FAMILIES} or --pipeline retrieval")
        name = "pretrain" if family == "alpro" else f"pretrain-{family}"
        name = "retrieval" if args.pipeline == "retrieval" else name
        params = parse_params(args.param, REPO_ROOT / "pipelines" / "compiled" / f"{name}.yaml")
    except SubmitError as exc:
        print(f"pipelines.local_run: error: {exc}", file=sys.stderr)
        return 2
    result = run(
        args.out, args.config, args.step_config, args.overrides, args.source_uri, args.data_root, params, family,
        args.pipeline,
    )  # fmt: skip
    print("\n=== outputs (task -> artifact) ===")
    for task, items in result["outputs"].items():
        for name, path in items.items():
            print(f"  {task:20s} {name:14s} {path}")
    summary = result["outputs"].get("report", {}).get("summary")
    if summary and Path(summary).is_file():  # the report task's table: every figure next to chance / baselines
        headline = Path(summary).read_text(encoding="utf-8").split("## Every metric")[0]
        print("\n=== results ===")
        print(headline.removeprefix("# vlp pipeline run").strip())
    tracked = result["mlflow"]
    print("\n=== MLflow ===")
    print(json.dumps(tracked, indent=2, sort_keys=True))
    if tracked.get("parent_run_id"):
        print(f"open: mlflow ui --backend-store-uri {tracked['tracking_uri']}  (then the experiment {EXPERIMENT},")
        print(
            f"      run {tracked['parent_run_id']}: http://127.0.0.1:5000/#/experiments/{tracked['experiment_id']}"
            f"/runs/{tracked['parent_run_id']})"
        )
    print(f"\nlocal pipeline run finished in {time.perf_counter() - start:.0f} s")
    print("(KFP's cache is not reused across runs: every step takes the run id, for MLflow nesting, as an input)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
