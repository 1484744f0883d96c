"""Data components: [fetch a URL list, or the given source] -> synth -> ingest -> extract_frames, mine_entities
(CPU image); and the fan-out of fetch, ingest and extract_frames (plan_parts, fetch_part -> fetch_merge,
ingest_part -> ingest_merge, extract_frames_part -> extract_frames_merge), which ``pipelines/fanout.py`` wires under
``dsl.ParallelFor``."""

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
    data_root: str = "",
    source_uri: str = "",
) -> None:
    """Write the synthetic world, or (``source_uri`` set) point at an existing raw dataset without copying.

    Args:
        raw: The raw dataset (videos, images, manifests) or a pointer to ``source_uri``.
        config: Step config: YAML text or a path such as ``configs/tiny.yaml``.
        overrides: ``section.key=value`` config overrides.
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
    Step("synth", config, overrides).run(lambda cfg: step(out, cfg))


@component
def given_source(source_uri: str) -> str:
    """The raw dataset a run names (``source_uri``), when it fetches no URL list: what ``synth`` points ingest at.

    Args:
        source_uri: A raw dataset directory / annotation file ("" = a fresh synthetic world).
    """
    return source_uri


@component
def fetch(
    url_list: str,
    fetched: Output[Dataset],
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> str:
    """Download the videos of a URL list (a WebVid CSV, or a list of your own) into storage; returns where the
    fetched raw dataset is, which ``synth`` then points ingest at.

    Args:
        url_list: The list (local path in the image, or s3:// URI).
        fetched: The fetched raw dataset (videos, videos/captions/rejects/fetch Parquet tables).
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix: the videos go under ``<data_root>/parts/fetch/<hash of the list>``, where
            a rerun resumes ("" = inside the artifact; kfp.local only).
    """
    from components._runtime import Step, fetch_location
    from vlp.steps.fetch import fetch as step

    run = Step("fetch", config, overrides)
    out = fetch_location(fetched, data_root, url_list, run.cfg)
    run.run(lambda cfg: step(url_list, out, cfg))
    return out


@component
def fetch_part(
    url_list: str,
    part: Output[Dataset],
    index: int,
    count: int,
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> None:
    """Fetch part ``index`` of ``count`` of a URL list's rows, for ``fetch_merge``.

    Args:
        url_list: The list (local path in the image, or s3:// URI).
        part: A pointer to the fetch folder this part wrote into.
        index: This part (0-based).
        count: Parts in all.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix (required): every part writes under ``<data_root>/parts/fetch/<hash of
            the list>``, where a rerun's part resumes.
    """
    from components._runtime import Step, fetch_location
    from vlp.steps.fetch import fetch_part as step

    run = Step("fetch_part", config, overrides)
    out = fetch_location(part, data_root, url_list, run.cfg, fanned_out=True)
    run.run(lambda cfg: step(url_list, out, cfg, index, count))


@component
def fetch_merge(
    url_list: str,
    parts: Input[list[Dataset]],
    fetched: Output[Dataset],
    count: int,
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> str:
    """Gather the ``fetch_part`` outputs into the fetched raw dataset; returns where it is.

    Args:
        url_list: The list the parts fetched.
        parts: Every ``fetch_part`` output of this run (``dsl.Collected``): they must all have finished.
        fetched: The fetched raw dataset.
        count: Parts in all.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix (required; the parts' folder).
    """
    from components._runtime import Step, fetch_location
    from vlp.steps.fetch import fetch_merge as step

    if len(parts) != count:
        raise ValueError(f"fetch_merge: {len(parts)} part outputs for {count} parts")
    run = Step("fetch", config, overrides)
    out = fetch_location(fetched, data_root, url_list, run.cfg, fanned_out=True)
    run.run(lambda cfg: step(url_list, out, cfg, count))
    return out


@component
def ingest(
    raw: Input[Dataset],
    dataset: Output[Dataset],
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> None:
    """Validate and probe a raw dataset into the manifest schema, with rejects.

    Args:
        raw: The synth output (or a pointer to an annotation file / dataset directory).
        dataset: The ingested dataset: videos/captions/qa/rejects Parquet manifests.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
    """
    from components._runtime import Step, location, output_location
    from vlp.steps.ingest import ingest as step

    source, out = location(raw), output_location(dataset, data_root)
    Step("ingest", config, overrides).run(lambda cfg: step(source, out, cfg))


@component
def extract_frames(
    dataset: Input[Dataset],
    frames: Output[Dataset],
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> None:
    """Sparse frames of every video as Parquet shards of JPEGs with an index.

    Args:
        dataset: The ingested dataset.
        frames: Frame shards + ``index.parquet`` (large: consider ``data_root``).
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
    """
    from components._runtime import Step, location, output_location
    from vlp.steps.extract_frames import extract_frames as step

    source, out = location(dataset), output_location(frames, data_root)
    Step("extract_frames", config, overrides).run(lambda cfg: step(source, out, cfg))


@component
def mine_entities(
    dataset: Input[Dataset],
    entities: Output[Dataset],
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> None:
    """The entity vocabulary: top-M nouns of the training captions.

    Args:
        dataset: The ingested dataset.
        entities: ``entities.parquet``, ``entities.json``, ``unigrams.txt``.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
    """
    from components._runtime import Step, location, output_location
    from vlp.steps.mine_entities import mine_entities as step

    source, out = location(dataset), output_location(entities, data_root)
    Step("mine_entities", config, overrides).run(lambda cfg: step(source, out, cfg))


# --------------------------------------------------------------------------- fan-out


@component
def plan_parts(parts: int) -> list:
    """The part numbers ``[0, .., parts - 1]`` a fan-out's ``dsl.ParallelFor`` runs over.

    Args:
        parts: Pods for the step (the ``data_parts`` run parameter), 1..1024.
    """
    most = 1024  # pods of one fan-out step (the body runs alone in its pod: no module constants)
    if not 1 <= parts <= most:
        raise ValueError(f"data_parts={parts}: need 1..{most} pods for a fan-out step")
    return list(range(parts))


@component
def ingest_part(
    raw: Input[Dataset],
    part: Output[Dataset],
    index: int,
    count: int,
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> None:
    """Probe part ``index`` of ``count`` of the raw dataset's files (``probes.parquet``), for ``ingest_merge``.

    Args:
        raw: The synth output (or a pointer to an annotation file / dataset directory).
        part: This part's probe results.
        index: This part (0-based).
        count: Parts in all.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix: the part writes under ``<data_root>/parts/ingest/<hash of its source,
            settings and part>``, where a rerun's part finds it done ("" = inside the artifact).
    """
    from components._runtime import Step, location, part_location
    from vlp.config import to_dict
    from vlp.steps.ingest import ingest_part as step

    run = Step("ingest_part", config, overrides)
    source = location(raw)
    out = part_location(part, data_root, "ingest", [source, to_dict(run.cfg.ingest), index, count])
    run.run(lambda cfg: step(source, out, cfg, index, count))


@component
def ingest_merge(
    raw: Input[Dataset],
    parts: Input[list[Dataset]],
    dataset: Output[Dataset],
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> None:
    """``ingest`` with every probe taken from the parts: byte-identical to one ``ingest`` pod's dataset.

    Args:
        raw: The same raw dataset the parts probed.
        parts: Every ``ingest_part`` output of this run (``dsl.Collected``).
        dataset: The ingested dataset: videos/captions/qa/rejects Parquet manifests.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
    """
    from components._runtime import Step, location, output_location
    from vlp.steps.ingest import ingest as step

    source, out = location(raw), output_location(dataset, data_root)
    probes = [location(p) for p in parts]
    Step("ingest", config, overrides).run(lambda cfg: step(source, out, cfg, probes=probes))


@component
def extract_frames_part(
    dataset: Input[Dataset],
    part: Output[Dataset],
    index: int,
    count: int,
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> None:
    """Frame shards of part ``index`` of ``count`` (no index), for ``extract_frames_merge``.

    Args:
        dataset: The ingested dataset.
        part: This part's frame shards and ``part.json``.
        index: This part (0-based).
        count: Parts in all.
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix: the part writes under ``<data_root>/parts/frames/<hash of the videos
            table, settings and part>``, where a rerun's part skips the shards it finds ("" = inside the artifact).
    """
    import hashlib

    from components._runtime import Step, location, part_location
    from vlp import storage
    from vlp.config import to_dict
    from vlp.steps.extract_frames import extract_frames_part as step

    run = Step("extract_frames_part", config, overrides)
    source = location(dataset)
    videos = hashlib.sha256(storage.read_bytes(storage.join(source, "videos.parquet"))).hexdigest()
    out = part_location(part, data_root, "frames", [videos, to_dict(run.cfg.frames), index, count])
    run.run(lambda cfg: step(source, out, cfg, index, count))


@component
def extract_frames_merge(
    dataset: Input[Dataset],
    parts: Input[list[Dataset]],
    frames: Output[Dataset],
    config: str,
    overrides: list[str],
    data_root: str = "",
) -> None:
    """Every part's shards copied into one frame store, with its index: byte-identical to one pod's.

    Args:
        dataset: The ingested dataset the parts read.
        parts: Every ``extract_frames_part`` output of this run (``dsl.Collected``).
        frames: Frame shards + ``index.parquet`` (large: consider ``data_root``).
        config: Step config: YAML text or a path.
        overrides: ``section.key=value`` config overrides.
        data_root: Object-storage prefix for large outputs ("" = inside the artifact).
    """
    from components._runtime import Step, location, output_location
    from vlp.steps.extract_frames import extract_frames as step

    source, out = location(dataset), output_location(frames, data_root)
    done = [location(p) for p in parts]
    Step("extract_frames", config, overrides).run(lambda cfg: step(source, out, cfg, parts=done))
