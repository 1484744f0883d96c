"""The search component: index_clips (a trained model's clip features into a LanceDB index, ``vlp index``)."""

import functools

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from components.images import CPU_IMAGE

component = functools.partial(dsl.component, base_image=CPU_IMAGE, install_kfp_package=False)


@component
def index_clips(
    frames: Input[Dataset],
    model: Input[Model],
    index: Output[Artifact],
    metrics: Output[Metrics],
    config: str,
    overrides: list[str],
    dataset: Input[Dataset] = None,
    split: str = "",
    index_uri: str = "",
    data_root: str = "",
) -> None:
    """Encode clips with a retrieval (or pre-trained) model into a clip index that ``vlp search`` reads.

    Args:
        frames: The extracted frames.
        model: The model that encodes the clips (what evaluate_retrieval takes).
        index: The index (a LanceDB table ``clips`` and ``summary.json``); its metadata holds ``uri`` and the
            summary's ``added``, ``skipped``, ``total``, ``tokens_stored``, ``ann``.
        metrics: ``added``, ``skipped`` and ``total``, for the KFP UI.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        dataset: The ingested dataset: only the clips of its ``split`` are indexed (None = every clip of the
            frames store).
        split: The dataset's split to index ("" = the config's ``retrieval.split``, the retrieval test split).
        index_uri: Where the index is, made or added to ("" = the step's own output, under ``data_root`` if set).
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
    """
    from components._runtime import Step, output_location, publish_index, source_location
    from vlp.steps.index import index_clips as step

    # The index records its model and frames by URI (vlp search loads them from there): the durable ones
    md, fr = source_location(model), source_location(frames)
    ds = source_location(dataset) if dataset is not None else ""
    out = output_location(index, data_root, index_uri)
    summary = Step("index_clips", config, overrides).run(
        lambda cfg: step(md, fr, out, cfg, dataset=ds, split=split), out=out
    )
    print(publish_index(summary, index, metrics))
