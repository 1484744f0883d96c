"""Run-level components: the MLflow parent run (start, final report + registration, finish) and the
re-evaluation pair (fetch a registered model, compare its new scores with its previous ones).

They exist for their side effects on MLflow, so the pipelines run them with caching off.
"""

import functools

from kfp import dsl
from kfp.dsl import Artifact, Input, Markdown, Metrics, Model, Output

from components.images import CPU_IMAGE

component = functools.partial(dsl.component, base_image=CPU_IMAGE, install_kfp_package=False)


@component
def start_run(config: str, overrides: list[str], pipeline: str, image: str) -> str:
    """Create the MLflow parent run of this pipeline run (tags: KFP run id, pipeline, image, vlp version).

    Args:
        config: Step config: YAML text or a path (its ``tracking`` section says where MLflow is).
        overrides: ``section.key=value`` config overrides.
        pipeline: Pipeline name.
        image: The image the steps run in.

    Returns:
        The parent run id ("" when tracking is off).
    """
    from components._runtime import start_pipeline

    return start_pipeline(config, overrides, pipeline, image)


@component
def finish_run(config: str, overrides: list[str], status: dsl.PipelineTaskFinalStatus) -> None:
    """Exit handler: end the parent run FINISHED, or FAILED when a task failed.

    Args:
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        status: The final status of the pipeline's tasks (set by KFP).
    """
    from components._runtime import finish_pipeline

    print(f"pipeline tasks ended {status.state} {status.error_message or ''}")
    finish_pipeline(config, overrides, status.state)


@component
def report(
    summary: Output[Markdown],
    config: str,
    overrides: list[str],
    pretrained: Input[Model] = None,
    register_prefix: str = "vlp",
    register_alias: str = "candidate",
    retrieval_results: Input[Artifact] = None,
    retrieval_model: Input[Model] = None,
    qa_results: Input[Artifact] = None,
    qa_model: Input[Model] = None,
    retrieval_index: Input[Artifact] = None,
) -> None:
    """Final metrics to the parent run, fine-tuned models registered with their eval metrics, a summary.

    Args:
        pretrained: The pre-trained model (listed in the summary); None in the retrieval DAG (no pre-training).
        summary: Markdown table of the final metrics and the registered model versions.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        register_prefix: Models register as ``<prefix>-retrieval`` and ``<prefix>-qa``.
        register_alias: Alias pointed at the new versions.
        retrieval_results: evaluate_retrieval output dir.
        retrieval_model: finetune_retrieval output.
        qa_results: evaluate_qa output dir.
        qa_model: finetune_qa output.
        retrieval_index: index_clips output: the clip index of the retrieval model (listed in the summary; the
            registered retrieval model carries a copy, as an MLflow pyfunc model that searches it).
    """
    import pathlib

    from components._runtime import final_report, index_line, location

    results = {}
    if retrieval_results is not None:
        results["retrieval"] = (retrieval_results, retrieval_model)
    if qa_results is not None:
        results["qa"] = (qa_results, qa_model)
    indexes = {"retrieval": location(retrieval_index)} if retrieval_index is not None else {}
    text = final_report(config, overrides, results, register_prefix, register_alias, indexes)
    if pretrained is not None:
        text += f"\npre-trained model: `{location(pretrained)}`\n"
    if retrieval_index is not None:
        text += index_line(retrieval_index)
    pathlib.Path(summary.path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(summary.path).write_text(text, encoding="utf-8")
    print(text)


@component
def fetch_model(model_ref: str, model: Output[Model], config: str, overrides: list[str]) -> None:
    """Download a registered model version (``name@alias``, ``name/version`` or ``name`` = newest).

    Args:
        model_ref: Which registered model version.
        model: The model dir, plus ``registry.json`` (name, version, stored metrics).
        config: Step config: YAML text or a path (its ``tracking`` section names the registry).
        overrides: ``section.key=value`` config overrides.
    """
    from components._runtime import load_step_config
    from vlp.tracking import download_model

    cfg, _ = load_step_config(config, overrides)
    info = download_model(cfg.tracking, model_ref, model.path)
    model.metadata.update({"name": info["name"], "version": info["version"], "run_id": info["run_id"]})


@component
def compare_scores(
    task: str,
    model: Input[Model],
    results: Input[Artifact],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    config: str,
    overrides: list[str],
) -> None:
    """New scores of a registered model vs its previous ones, to MLflow, the model version and a table.

    Args:
        task: ``retrieval`` or ``qa``.
        model: The fetch_model output.
        results: The evaluate step's output dir.
        summary: Markdown table: metric, previous, new, change.
        metrics: The new metrics, for the KFP UI.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
    """
    import pathlib

    from components._runtime import compare_scores as compare

    text, new = compare(config, overrides, task, model, results)
    for key, value in new.items():
        metrics.log_metric(key, value)
    pathlib.Path(summary.path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(summary.path).write_text(text, encoding="utf-8")
    print(text)
