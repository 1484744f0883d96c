"""Data components: synth -> ingest -> extract_frames, mine_entities (CPU image)."""

import functools

from kfp import dsl
from kfp.dsl import Dataset, Input, Output

from components.images import CPU_IMAGE

component = functools.partial(dsl.component, base_image=CPU_IMAGE, install_kfp_package=False)


@component
def synth(
    raw: Output[Dataset],
    config: str,
    overrides: list[str],
    kfp_run_id: str = "",
    data_root: str = "",
    source_uri: str = "",
) -> None:
    """Write the synthetic world, or (``source_uri`` set) point at an existing raw dataset without copying.

    Args:
        raw: The raw dataset (videos, images, manifests) or a pointer to ``source_uri``.
        config: Step config: YAML text or a path such as ``configs/tiny.yaml``.
        overrides: ``section.key=value`` config overrides.
        kfp_run_id: KFP run id; nests the MLflow step run under the pipeline's parent run.
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
        source_uri: A raw dataset directory / annotation file to ingest instead of the synthetic world.
    """
    from components._runtime import POINTER, Step, output_location
    from vlp.steps.synth import synth as step

    if source_uri:
        import pathlib

        pathlib.Path(raw.path).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(raw.path) / POINTER).write_text(source_uri + "\n", encoding="utf-8")
        raw.metadata["uri"] = source_uri
        return
    out = output_location(raw, data_root)
    Step("synth", config, overrides, kfp_run_id).run(lambda cfg: step(out, cfg))


@component
def ingest(
    raw: Input[Dataset],
    dataset: Output[Dataset],
    config: str,
    overrides: list[str],
    kfp_run_id: str = "",
    data_root: str = "",
) -> None:
    """Validate and probe a raw dataset into the manifest schema, with rejects.

    Args:
        raw: The synth output (or a pointer to an annotation file / dataset directory).
        dataset: The ingested dataset: videos/captions/qa/rejects Parquet manifests.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        kfp_run_id: KFP run id (MLflow nesting).
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
    """
    from components._runtime import Step, location, output_location
    from vlp.steps.ingest import ingest as step

    source, out = location(raw), output_location(dataset, data_root)
    Step("ingest", config, overrides, kfp_run_id).run(lambda cfg: step(source, out, cfg))


@component
def extract_frames(
    dataset: Input[Dataset],
    frames: Output[Dataset],
    config: str,
    overrides: list[str],
    kfp_run_id: str = "",
    data_root: str = "",
) -> None:
    """Sparse frames of every video as Parquet shards of JPEGs with an index.

    Args:
        dataset: The ingested dataset.
        frames: Frame shards + ``index.parquet`` (large: consider ``data_root``).
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        kfp_run_id: KFP run id (MLflow nesting).
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
    """
    from components._runtime import Step, location, output_location
    from vlp.steps.extract_frames import extract_frames as step

    source, out = location(dataset), output_location(frames, data_root)
    Step("extract_frames", config, overrides, kfp_run_id).run(lambda cfg: step(source, out, cfg))


@component
def mine_entities(
    dataset: Input[Dataset],
    entities: Output[Dataset],
    config: str,
    overrides: list[str],
    kfp_run_id: str = "",
    data_root: str = "",
) -> None:
    """The entity vocabulary: top-M nouns of the training captions.

    Args:
        dataset: The ingested dataset.
        entities: ``entities.parquet``, ``entities.json``, ``unigrams.txt``.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        kfp_run_id: KFP run id (MLflow nesting).
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
    """
    from components._runtime import Step, location, output_location
    from vlp.steps.mine_entities import mine_entities as step

    source, out = location(dataset), output_location(entities, data_root)
    Step("mine_entities", config, overrides, kfp_run_id).run(lambda cfg: step(source, out, cfg))
