"""The index DAG (``vlp-index``): a trained model + a frames store (+ a dataset's split) -> index_clips -> a clip
index that ``vlp search`` reads (docs/guides/search.md).

The model, frames and dataset are URIs (a run's outputs under its ``data_root``, a registered version's model
directory, ``vlp import-*`` outputs), imported as artifacts; the index records the model and frames by these URIs
and ``vlp search`` loads them from there later, so give durable ones (``s3://``). With ``dataset`` only the clips
of its ``split`` are indexed (default: the step config's ``retrieval.split``), else every clip of the frames store.
``index_uri`` names an index to make or to add to: only the clips it lacks are encoded, so a run over a grown
frames store adds the new clips, and the task is never taken from KFP's cache. An MLflow parent run opens first
and an exit handler closes it, as in the other DAGs.
"""

from typing import Any

from kfp import dsl
from kfp.dsl import Dataset, Model

from components import reporting
from components.index import index_clips
from pipelines.config import PipelineConfig, configure

NAME = "vlp-index"


def build(cfg: PipelineConfig) -> Any:
    """The ``vlp-index`` pipeline for ``cfg``."""

    @dsl.pipeline(name=NAME, description="vlp index: a trained model's clip features -> a searchable clip index")
    def vlp_index(
        model: str,
        frames: str,
        index_uri: str = "",
        dataset: str = "",
        split: str = "",
        config: str = cfg.step_config,
        overrides: list[str] = [],  # noqa: B006 (KFP reads the default; it is never mutated)
        data_root: str = cfg.data_root,
    ) -> None:
        """Args: model / frames = URIs of a retrieval (or pre-trained) model directory and a frames store;
        index_uri = the index to make or add to ("" = this run's output, under data_root when set); dataset =
        URI of an ingested dataset ("" = every clip of the frames store); split = its split ("" =
        retrieval.split); config, overrides = vlp step config; data_root = s3:// prefix for large outputs."""
        common = {"config": config, "overrides": overrides}
        finish = configure(reporting.finish_run(**common), cfg, "finish_run")
        with dsl.ExitHandler(finish, name="tracked-run"):
            start = reporting.start_run(**common, pipeline=NAME, image=cfg.image("index_clips"))
            configure(start, cfg, "start_run")
            md = dsl.importer(artifact_uri=model, artifact_class=Model, reimport=False).output
            fr = dsl.importer(artifact_uri=frames, artifact_class=Dataset, reimport=False).output
            given = {"frames": fr, "model": md, "split": split, "index_uri": index_uri, "data_root": data_root}
            with dsl.If(dataset != "", name="dataset-given"):
                ds = dsl.importer(artifact_uri=dataset, artifact_class=Dataset, reimport=False).output
                _configure(index_clips(dataset=ds, **given, **common).after(start), cfg)
            with dsl.Else(name="whole-frames-store"):
                _configure(index_clips(**given, **common).after(start), cfg)

    return vlp_index


def _configure(task: Any, cfg: PipelineConfig) -> Any:
    """index_clips' settings, never cached: the index at ``index_uri`` may have changed since (or the frames store
    behind an unchanged URI grown), and a run adds only what the index lacks anyway."""
    return configure(task, cfg, "index_clips").set_caching_options(enable_caching=False)
