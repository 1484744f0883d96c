"""The re-evaluation DAG (``vlp-reevaluate``): registered model versions + a fixed test set -> evaluate ->
new scores compared with the models' previous ones (in MLflow, on the model versions and as Markdown).

The test set is an ingested dataset and its extracted frames (``test_dataset``, ``test_frames``: URIs in
object storage, imported as artifacts). An empty model reference skips that task's branch.
"""

from typing import Any

from kfp import dsl
from kfp.dsl import Dataset

from components import evaluation, reporting
from pipelines.config import PipelineConfig, configure

NAME = "vlp-reevaluate"


def build(cfg: PipelineConfig) -> Any:
    """The ``vlp-reevaluate`` pipeline for ``cfg``."""
    prefix = cfg.register_prefix

    @dsl.pipeline(name=NAME, description="vlp re-evaluation: registered models on fixed test sets, vs previous scores")
    def vlp_reevaluate(
        test_dataset: str,
        test_frames: str,
        retrieval_model: str = f"{prefix}-retrieval@champion",
        qa_model: str = f"{prefix}-qa@champion",
        config: str = cfg.step_config,
        overrides: list[str] = [],  # noqa: B006 (KFP reads the default; it is never mutated)
    ) -> None:
        """Args: test_dataset / test_frames = URIs of an ingested test set and its frames; retrieval_model /
        qa_model = name@alias, name/version or name ("" skips); config, overrides = vlp step config."""
        common = {"config": config, "overrides": overrides}
        finish = configure(reporting.finish_run(**common), cfg, "finish_run")
        with dsl.ExitHandler(finish, name="tracked-run"):
            start = reporting.start_run(**common, pipeline=NAME, image=cfg.image("evaluate_retrieval"))
            configure(start, cfg, "start_run")
            ds = dsl.importer(artifact_uri=test_dataset, artifact_class=Dataset, reimport=False).output
            fr = dsl.importer(artifact_uri=test_frames, artifact_class=Dataset, reimport=False).output
            for task, ref, evaluate in (
                ("retrieval", retrieval_model, evaluation.evaluate_retrieval),
                ("qa", qa_model, evaluation.evaluate_qa),
            ):
                with dsl.If(ref != "", name=f"{task}-model-given"):
                    fetched = reporting.fetch_model(model_ref=ref, config=config, overrides=overrides).after(start)
                    model = configure(fetched, cfg, "fetch_model").outputs["model"]
                    scored = configure(evaluate(dataset=ds, frames=fr, model=model, **common), cfg, f"evaluate_{task}")
                    compare = reporting.compare_scores(
                        task=task, model=model, results=scored.outputs["results"], **common
                    )
                    configure(compare, cfg, "compare_scores")

    return vlp_reevaluate
