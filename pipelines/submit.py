"""Submit the compiled pipelines to a Kubeflow Pipelines API, once or on a schedule.

    python -m pipelines.submit run --host URL [--pipeline pretrain] [--param key=value ...]
    python -m pipelines.submit reevaluate --host URL --namespace NS --experiment EXP --param key=value ...
    python -m pipelines.submit schedule --host URL --name NAME --cron "0 0 3 * * *" [--pipeline reevaluate] ...

``--host`` defaults to ``$KFP_HOST``, ``--namespace`` to ``$KFP_NAMESPACE`` (else ``kubeflow``), ``--experiment``
to ``$KFP_EXPERIMENT`` (else ``vlp``). Authentication: a bearer token read from the file
``$KF_PIPELINES_SA_TOKEN_PATH`` (``--token-path``; in-cluster service-account token) or given in ``$KFP_TOKEN``.
Parameters are ``key=value`` with YAML values (``overrides='[a.b=1]'``), checked against the compiled pipeline's
inputs before anything is sent. ``schedule`` creates or replaces (by name; KFP cannot update a recurring run)
a recurring run; its cron expression has 6 fields, seconds first (``0 30 2 * * *`` = 02:30:00 every day).
"""

import argparse
import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from vlp.schema import ConfigError, load_yaml, quote

COMPILED_DIR = Path(__file__).resolve().parent / "compiled"


class SubmitError(ValueError):
    """A bad parameter, cron expression or setting; the message says what to change."""


# --------------------------------------------------------------------------- parameters


def pipeline_inputs(package: str | Path) -> dict[str, dict[str, Any]]:
    """``{name: {"type": PARAMETER_TYPE, "required": bool}}`` of a compiled pipeline's run parameters."""
    spec = next(yaml.safe_load_all(Path(package).read_text(encoding="utf-8")))
    params = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    return {
        name: {"type": p["parameterType"], "required": "defaultValue" not in p and not p.get("isOptional", False)}
        for name, p in params.items()
    }


_TYPE_CHECKS: dict[str, tuple[type, ...]] = {
    "STRING": (str,),
    "NUMBER_INTEGER": (int,),
    "NUMBER_DOUBLE": (int, float),
    "BOOLEAN": (bool,),
    "LIST": (list,),
    "STRUCT": (dict,),
}


def parse_params(items: Sequence[str], package: str | Path) -> dict[str, Any]:
    """``["key=value", ...]`` -> a dict checked against the pipeline's inputs (names, types, required ones)."""
    inputs = pipeline_inputs(package)
    params: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SubmitError(f"parameter {item!r} is not of the form key=value")
        if key not in inputs:
            raise SubmitError(f"unknown parameter {key!r} for {Path(package).name}; valid: {sorted(inputs)}")
        kind = inputs[key]["type"]
        try:
            value: Any = raw if kind == "STRING" else load_yaml(raw, f"parameter {key}")
        except ConfigError as exc:
            raise SubmitError(str(exc)) from None
        if (isinstance(value, bool) and kind != "BOOLEAN") or not isinstance(value, _TYPE_CHECKS.get(kind, (object,))):
            raise SubmitError(f"parameter {key}: {quote(raw)} is not a {kind} (YAML syntax, e.g. lists as '[a, b]')")
        params[key] = value
    missing = sorted(k for k, v in inputs.items() if v["required"] and k not in params)
    if missing:
        raise SubmitError(f"{Path(package).name} needs the parameter(s) {missing}: add --param {missing[0]}=...")
    return params


# --------------------------------------------------------------------------- cron

_CRON_FIELDS = (  # name, low, high, names
    ("second", 0, 59, ()),
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")),
    ("day of week", 0, 6, ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")),
)
_CRON_PART = re.compile(r"^(\*|\?|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?$")


def validate_cron(expr: str) -> str:
    """Check a 6-field cron expression (seconds first, as KFP's scheduler reads it); returns it normalised."""
    fields = expr.split()
    if len(fields) != 6:
        raise SubmitError(
            f"cron {expr!r} has {len(fields)} fields; KFP needs 6, seconds first: "
            "'second minute hour day-of-month month day-of-week', e.g. '0 0 3 * * *' (03:00:00 daily)"
        )
    for text, (name, low, high, names) in zip(fields, _CRON_FIELDS, strict=True):
        for part in text.split(","):
            _check_cron_part(part, name, low, high, names, expr)
    return " ".join(fields)


def _check_cron_part(part: str, name: str, low: int, high: int, names: tuple[str, ...], expr: str) -> None:
    match = _CRON_PART.match(part)
    if not match:
        raise SubmitError(f"cron {expr!r}: {name} field part {part!r} is not *, ?, N, N-M or one of those /STEP")
    if match.group(1) == "?" and name not in ("day of month", "day of week"):
        raise SubmitError(f"cron {expr!r}: '?' is only allowed for day of month and day of week")
    if match.group(3) and int(match.group(3)[1:]) == 0:
        raise SubmitError(f"cron {expr!r}: {name} step /0 is invalid")
    if match.group(1) in ("*", "?"):
        return
    bounds = match.group(1).split("-")
    values = [_cron_value(b, name, low, high, names, expr) for b in bounds]
    if len(values) == 2 and values[0] > values[1]:
        raise SubmitError(f"cron {expr!r}: {name} range {part!r} runs backwards")


def _cron_value(text: str, name: str, low: int, high: int, names: tuple[str, ...], expr: str) -> int:
    if text.upper() in names:
        return names.index(text.upper()) + low
    if not text.isdigit() or not low <= int(text) <= high:
        raise SubmitError(f"cron {expr!r}: {name} value {text!r} is outside {low}-{high}")
    return int(text)


# --------------------------------------------------------------------------- client calls


def make_client(host: str, namespace: str, token_path: str = "", token: str = "") -> Any:
    """A ``kfp.Client`` for ``host`` with a bearer token from ``token`` or the file ``token_path`` (if any)."""
    import kfp
    from kfp.client import ServiceAccountTokenVolumeCredentials

    if not host:
        raise SubmitError("no KFP API host: pass --host URL or set KFP_HOST (e.g. http://ml-pipeline-ui.kubeflow)")
    if token_path and not Path(token_path).is_file():
        raise SubmitError(f"token file {token_path} does not exist (KF_PIPELINES_SA_TOKEN_PATH / --token-path)")
    credentials = ServiceAccountTokenVolumeCredentials(token_path) if token_path and not token else None
    with warnings.catch_warnings():  # "only works with KFP v2.0.0-beta.2 and later": we target 2.x anyway
        warnings.filterwarnings("ignore", category=FutureWarning)
        return kfp.Client(host=host, namespace=namespace, existing_token=token or None, credentials=credentials)


def submit_run(
    client: Any, package: str | Path, params: dict[str, Any], experiment: str, namespace: str, run_name: str = ""
) -> str:
    """Start one run of ``package``; returns the run id."""
    result = client.create_run_from_pipeline_package(
        str(package),
        arguments=params,
        run_name=run_name or None,
        experiment_name=experiment,
        namespace=namespace,
    )
    return result.run_id


def schedule(
    client: Any, package: str | Path, name: str, cron: str, params: dict[str, Any], experiment: str, namespace: str
) -> str:
    """Create or replace the recurring run ``name`` in ``experiment``; returns the new recurring run id.

    The new one is created first and the old ones of that name are deleted after, so a refused or failed
    creation leaves the old schedule running (never none); the two overlap for the moment in between, and
    ``max_concurrency=1`` holds per recurring run only.
    """
    cron = validate_cron(cron)
    experiment_id = client.create_experiment(name=experiment, namespace=namespace).experiment_id
    old = [r.recurring_run_id for r in _recurring_runs(client, experiment_id, namespace) if r.display_name == name]
    created = client.create_recurring_run(
        experiment_id=experiment_id,
        job_name=name,
        cron_expression=cron,
        params=params,
        pipeline_package_path=str(package),
        max_concurrency=1,
        no_catchup=True,
        enabled=True,
    )
    for recurring_run_id in old:
        client.delete_recurring_run(recurring_run_id)
    return created.recurring_run_id


def _recurring_runs(client: Any, experiment_id: str, namespace: str) -> list[Any]:
    runs: list[Any] = []
    token = ""
    while True:
        page = client.list_recurring_runs(
            page_token=token, page_size=100, experiment_id=experiment_id, namespace=namespace
        )
        runs += page.recurring_runs or []
        token = page.next_page_token
        if not token:
            return runs


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines.submit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in (
        ("run", "start one run of a compiled pipeline"),
        ("reevaluate", "start one run of the re-evaluation pipeline"),
        ("schedule", "create or replace a recurring run (by name)"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--host", default=os.environ.get("KFP_HOST", ""), help="KFP API URL (default: $KFP_HOST)")
        p.add_argument("--namespace", default=os.environ.get("KFP_NAMESPACE") or "kubeflow", help="KFP namespace")
        p.add_argument("--experiment", default=os.environ.get("KFP_EXPERIMENT") or "vlp", help="KFP experiment")
        p.add_argument(
            "--token-path", default=os.environ.get("KF_PIPELINES_SA_TOKEN_PATH", ""), help="bearer token file"
        )
        p.add_argument("--param", action="append", default=[], metavar="key=value", help="run parameter (repeat)")
        p.add_argument("--package", default="", help="compiled pipeline YAML (default: pipelines/compiled/<pipeline>)")
        if name != "reevaluate":
            default = "reevaluate" if name == "schedule" else "pretrain"
            from pipelines.compile import builders

            choices = list(builders())
            p.add_argument("--pipeline", default=default, choices=choices, help="which pipeline")
        if name == "schedule":
            p.add_argument("--name", required=True, help="recurring run name (an existing one is replaced)")
            p.add_argument("--cron", required=True, help="6 fields, seconds first, e.g. '0 0 3 * * *'")
        else:
            p.add_argument("--run-name", default="", help="run display name")
        p.add_argument(
            "--allow-pod-local-checkpoints",
            action="store_true",
            help="submit a training pipeline without data_root (checkpoints then live in the pod until it succeeds)",
        )
    return parser


def check_durable_checkpoints(package: str | Path, params: dict[str, Any]) -> None:
    """Refuse a pipeline that trains while ``data_root`` is empty (run parameter and compiled default).

    Without an object-storage ``data_root`` a training step writes its checkpoints into its KFP output
    artifact, which is uploaded only when the step succeeds: a preempted or failed step's retry starts
    again from step 0. With ``data_root`` the checkpoints go straight to object storage and a retry resumes.
    """
    spec = next(yaml.safe_load_all(Path(package).read_text(encoding="utf-8")))
    tasks = spec.get("root", {}).get("dag", {}).get("tasks", {})
    trains = any(name.startswith(("pretrain", "finetune")) for name in _task_names(spec, tasks))
    default = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {}).get("data_root", {})
    data_root = params.get("data_root", default.get("defaultValue", ""))
    if trains and "data_root" in pipeline_inputs(package) and not str(data_root).startswith("s3://"):
        raise SubmitError(
            f"{Path(package).name} trains, and with data_root={data_root!r} its checkpoints stay inside the pod "
            "until the step succeeds, so a preempted or retried step restarts from step 0. Pass "
            "--param data_root=s3://bucket/prefix (or set data_root in pipelines/config/default.yaml and "
            "recompile), or --allow-pod-local-checkpoints to accept that"
        )


def check_no_credentials(params: dict[str, Any], package: str | Path | None = None) -> None:
    """Refuse credentials in the run parameters (the KFP UI shows them to everyone who can see the run): storage
    keys as overrides or in the ``config`` parameter's YAML (given, else ``package``'s compiled default), or a URI
    with a password in any parameter."""
    from components._runtime import config_param_credentials
    from vlp.config import credential_overrides

    overrides = params.get("overrides") or []
    found = credential_overrides(overrides) + credential_overrides(
        f"{k}={v}" for k, v in params.items() if k != "overrides" and isinstance(v, str)
    )
    config = params.get("config", _default(package, "config") if package else "")
    found += [f"config: {key}" for key in config_param_credentials(config)]
    if found:
        raise SubmitError(
            f"credentials in the run parameters ({', '.join(sorted(set(found)))}): KFP shows them in the UI. Put "
            "storage keys in the Secret of pipelines/config s3.secret and MLflow logins in tracking_secret"
        )


def _default(package: str | Path, name: str) -> Any:
    """The compiled default value of run parameter ``name`` ("" when it has none)."""
    spec = next(yaml.safe_load_all(Path(package).read_text(encoding="utf-8")))
    params = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    return params.get(name, {}).get("defaultValue", "")


def _task_names(spec: dict[str, Any], tasks: dict[str, Any]) -> list[str]:
    """Task names of the root DAG and of every sub-DAG (conditions, loops, exit handlers)."""
    names = list(tasks)
    for component in spec.get("components", {}).values():
        names += list(component.get("dag", {}).get("tasks", {}))
    return names


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pipeline = getattr(args, "pipeline", "reevaluate")
    package = Path(args.package or COMPILED_DIR / f"{pipeline}.yaml")
    try:
        if not package.is_file():
            raise SubmitError(f"{package} does not exist: run `make pipeline-compile` first")
        params = parse_params(args.param, package)
        check_no_credentials(params, package)
        if not args.allow_pod_local_checkpoints:
            check_durable_checkpoints(package, params)
        if args.command == "schedule":
            validate_cron(args.cron)
        client = make_client(args.host, args.namespace, args.token_path, os.environ.get("KFP_TOKEN", ""))
        if args.command == "schedule":
            rid = schedule(client, package, args.name, args.cron, params, args.experiment, args.namespace)
            print(f"recurring run {args.name!r} ({rid}) of {package.name}: cron {args.cron!r}")
        else:
            rid = submit_run(client, package, params, args.experiment, args.namespace, args.run_name)
            print(f"run {rid} of {package.name} in experiment {args.experiment!r}: {args.host}/#/runs/details/{rid}")
    except SubmitError as exc:
        print(f"pipelines.submit {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
