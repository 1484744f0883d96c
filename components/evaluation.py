"""Evaluation components: evaluate_retrieval and evaluate_qa (metrics, Markdown and HTML reports)."""

import functools

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import CPU_IMAGE

component = functools.partial(dsl.component, base_image=CPU_IMAGE, install_kfp_package=False)


@component
def evaluate_retrieval(
    dataset: Input[Dataset],
    frames: Input[Dataset],
    model: Input[Model],
    results: Output[Artifact],
    metrics: Output[Metrics],
    report_md: Output[Markdown],
    report_html: Output[HTML],
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> None:
    """Text-video retrieval: R@1/5/10, MdR, MnR in both directions on the test split.

    Args:
        dataset: The ingested dataset (its test split is scored).
        frames: The extracted frames.
        model: A fine-tuned (or pre-trained, zero-shot) model dir.
        results: The step's output dir: ``metrics.json``, ``report.md``, ``report.html``.
        metrics: The metrics, for the KFP UI.
        report_md: The Markdown report.
        report_html: The HTML report.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
    """
    from components._runtime import Step, location, output_location, publish_eval
    from vlp.steps.evaluate import evaluate_retrieval as step

    ds, fr, md, out = location(dataset), location(frames), location(model), output_location(results, data_root)
    Step("evaluate_retrieval", config, overrides).run(lambda cfg: step(ds, fr, md, out, cfg), out=out)
    publish_eval(out, metrics, report_md, report_html)


@component
def evaluate_qa(
    dataset: Input[Dataset],
    frames: Input[Dataset],
    model: Input[Model],
    results: Output[Artifact],
    metrics: Output[Metrics],
    report_md: Output[Markdown],
    report_html: Output[HTML],
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> None:
    """Open-ended video QA: accuracy, per question type, OOV rate on the test split.

    Args:
        dataset: The ingested dataset (its test split is scored).
        frames: The extracted frames.
        model: A fine-tuned QA model dir.
        results: The step's output dir: ``metrics.json``, ``predictions.parquet``, reports.
        metrics: The metrics, for the KFP UI.
        report_md: The Markdown report.
        report_html: The HTML report.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
    """
    from components._runtime import Step, location, output_location, publish_eval
    from vlp.steps.evaluate import evaluate_qa as step

    ds, fr, md, out = location(dataset), location(frames), location(model), output_location(results, data_root)
    Step("evaluate_qa", config, overrides).run(lambda cfg: step(ds, fr, md, out, cfg), out=out)
    publish_eval(out, metrics, report_md, report_html)
