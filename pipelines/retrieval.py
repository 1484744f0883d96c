"""The retrieval DAG (``vlp-retrieval``) for model families that need no vlp pre-training (TS2-Net: CLIP).

synth (or an existing raw dataset) -> ingest -> extract_frames -> finetune_retrieval (from the step config's
``model`` section: the family's named weights) -> evaluate_retrieval and index_clips (the test split's clips into a
clip index that ``vlp search`` reads) -> report (registers the model as ``<prefix>-retrieval``). An MLflow parent
run opens first and an exit handler closes it FINISHED or FAILED, as in the pre-training DAGs; per-step resources,
images, caching and retries come from :class:`PipelineConfig`.
"""

from typing import Any

from kfp import dsl

from components import data, evaluation, reporting, training
from pipelines import fanout
from pipelines.config import PipelineConfig, configure, scale
from pipelines.pretrain import clip_index
from vlp.models.family import DEFAULT_FAMILY, specs

NAME = "vlp-retrieval"


def default_family() -> str:
    """The ``family`` parameter's default: the first registered family that does not pre-train (TS2-Net)."""
    return next((name for name, spec in specs().items() if not spec.pretrains), DEFAULT_FAMILY)


def build(cfg: PipelineConfig) -> Any:
    """The ``vlp-retrieval`` pipeline for ``cfg``."""

    @dsl.pipeline(name=NAME, description="vlp retrieval: data -> fine-tune from named weights (TS2-Net) -> eval")
    @fanout.parameters(cfg)
    def vlp_retrieval(
        config: str = cfg.step_config,
        overrides: list[str] = [],  # noqa: B006 (KFP reads the default; it is never mutated)
        family: str = default_family(),
        source_uri: str = "",
        url_list: str = "",
        data_root: str = cfg.data_root,
        register_alias: str = "candidate",
        data_parts: int = cfg.fanout.parts,
    ) -> None:
        """Args: config = vlp step config (path in the image or YAML text); overrides = section.key=value list;
        family = the model family fine-tuned from its named weights; source_uri = raw dataset to ingest ("" = a
        fresh synthetic world); url_list = a list of video URLs (WebVid CSV, url list) to fetch and ingest instead
        of source_uri ("" = none); data_root = s3:// prefix for large outputs ("" = KFP artifacts); register_alias =
        alias of the new model; data_parts = pods for fetch, ingest and extract_frames each (in a DAG
        compiled with fanout.parts > 1 only)."""
        common = {"config": config, "overrides": overrides}
        stored = {**common, "data_root": data_root}
        finish = configure(reporting.finish_run(**common), cfg, "finish_run")
        with dsl.ExitHandler(finish, name="tracked-run"):
            start = reporting.start_run(**common, pipeline=NAME, image=cfg.image("finetune_retrieval"))
            configure(start, cfg, "start_run")
            given = fanout.source(cfg, url_list, source_uri, stored, data_parts, start)
            raw = configure(data.synth(**stored, source_uri=given).after(start), cfg, "synth")
            ds, fr = fanout.data_steps(cfg, raw.outputs["raw"], stored, data_parts)
            tuned = training.finetune_retrieval(
                dataset=ds, frames=fr, family=family, **stored, **scale(cfg, "finetune_retrieval")
            )
            model = configure(tuned, cfg, "finetune_retrieval").outputs["model"]
            scored = configure(evaluation.evaluate_retrieval(dataset=ds, frames=fr, model=model, **stored), cfg,
                               "evaluate_retrieval")  # fmt: skip
            summary = reporting.report(
                **common,
                register_prefix=cfg.register_prefix,
                register_alias=register_alias,
                retrieval_results=scored.outputs["results"],
                retrieval_model=model,
                retrieval_index=clip_index(cfg, ds, fr, model, stored),
            )
            configure(summary, cfg, "report")

    return vlp_retrieval
