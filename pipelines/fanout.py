"""The data steps of a DAG, one pod each or fanned out (``PipelineConfig.fanout``), and where they start: a URL
list's fetch or the source a run names (:func:`source`).

Fanned out, ``plan_parts`` turns the ``data_parts`` run parameter into part numbers, ``ingest_part`` probes each
part's files and ``extract_frames_part`` extracts each part's frame shards under ``dsl.ParallelFor`` (at most
``fanout.parallelism`` pods at once, each with the step's own resources and retries, so a failed part retries
alone), and ``ingest_merge`` / ``extract_frames_merge`` gather them (``dsl.Collected``) into the dataset and frame
store one pod would have written, byte for byte. With ``data_root`` set, a part writes under
``<data_root>/parts/<ingest|frames>/<hash of its inputs, settings and part number>``, so the parts of a rerun
find what the parts of an earlier run finished: a probe part whose results are there is skipped, a frame part
skips the shards it finds (KFP's cache cannot do it: every task takes the run id). Without ``data_root`` the
parts live in one run's artifacts. The step code stays a plain function over a part
(``vlp.steps.ingest.ingest_part``, ``vlp.steps.extract_frames.extract_frames_part``).

A part is keyed by names, not by file contents (the raw source's location, or the ingested videos table): a
video replaced under the same name is not probed or extracted again; write changed data under new names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from kfp import dsl

from components import data
from pipelines.config import PipelineConfig, configure

PARAMETER = "data_parts"  # the run parameter: pods for ingest and for extract_frames


def parameters(cfg: PipelineConfig) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator (under ``@dsl.pipeline``): a DAG compiled without fan-out (``fanout.parts == 1``) shows no
    ``data_parts`` parameter, since nothing would read it. KFP reads a pipeline's parameters from its signature."""

    def apply(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not enabled(cfg):
            sig = inspect.signature(fn)
            fn.__signature__ = sig.replace(  # type: ignore[attr-defined]  # what inspect.signature reads first
                parameters=[p for p in sig.parameters.values() if p.name != PARAMETER]
            )
        return fn

    return apply


def enabled(cfg: PipelineConfig) -> bool:
    """Whether the compiled DAG fans the data steps out."""
    return cfg.fanout.parts > 1


def data_steps(cfg: PipelineConfig, raw: Any, stored: dict[str, Any], parts: Any) -> tuple[Any, Any]:
    """``(dataset, frames)`` outputs of ingest -> extract_frames on ``raw``, fanned out into ``parts`` pods each
    when ``cfg`` says so (``parts`` is the ``data_parts`` pipeline parameter)."""
    if not enabled(cfg):
        ds = configure(data.ingest(raw=raw, **stored), cfg, "ingest").outputs["dataset"]
        fr = configure(data.extract_frames(dataset=ds, **stored), cfg, "extract_frames").outputs["frames"]
        return ds, fr
    numbers = plan(cfg, parts)
    ds = ingest(cfg, raw, stored, parts, numbers)
    return ds, extract_frames(cfg, ds, stored, parts, numbers)


def source(cfg: PipelineConfig, url_list: Any, source_uri: Any, stored: dict[str, Any], parts: Any, start: Any) -> Any:
    """What ``synth`` points ingest at: with a URL list (the ``url_list`` run parameter), the raw dataset the fetch
    steps make of it (one ``fetch`` pod, or ``fetch_part`` pods and ``fetch_merge`` where the data steps fan out);
    else ``source_uri`` as given. Both run after ``start`` (the run's MLflow parent run)."""
    with dsl.If(url_list != "", name="fetch-url-list"):
        if enabled(cfg):
            numbers = plan(cfg, parts).after(start)
            with dsl.ParallelFor(numbers.output, parallelism=cfg.fanout.parallelism, name="fetch-parts") as index:
                part = configure(data.fetch_part(url_list=url_list, index=index, count=parts, **stored), cfg, "fetch")
                part.set_display_name("fetch_part")
            merged = data.fetch_merge(url_list=url_list, parts=dsl.Collected(part.outputs["part"]), count=parts,
                                      **stored)  # fmt: skip
            fetched = configure(merged, cfg, "fetch_merge")
        else:
            fetched = configure(data.fetch(url_list=url_list, **stored).after(start), cfg, "fetch")
    with dsl.Else(name="source-given"):
        given = configure(data.given_source(source_uri=source_uri).after(start), cfg, "given_source")
    return dsl.OneOf(fetched.outputs["Output"], given.output)


def plan(cfg: PipelineConfig, parts: Any) -> Any:
    """The task whose output, ``[0, .., parts - 1]``, the fan-outs loop over."""
    return configure(data.plan_parts(parts=parts), cfg, "plan_parts")


def ingest(cfg: PipelineConfig, raw: Any, stored: dict[str, Any], parts: Any, numbers: Any) -> Any:
    """ParallelFor(ingest_part) -> ingest_merge; returns the dataset output."""
    with dsl.ParallelFor(numbers.output, parallelism=cfg.fanout.parallelism, name="ingest-parts") as index:
        probed = configure(data.ingest_part(raw=raw, index=index, count=parts, **stored), cfg, "ingest")
        probed.set_display_name("ingest_part")
    merged = data.ingest_merge(raw=raw, parts=dsl.Collected(probed.outputs["part"]), **stored)
    return configure(merged, cfg, "ingest_merge").outputs["dataset"]


def extract_frames(cfg: PipelineConfig, ds: Any, stored: dict[str, Any], parts: Any, numbers: Any) -> Any:
    """ParallelFor(extract_frames_part) -> extract_frames_merge; returns the frames output."""
    with dsl.ParallelFor(numbers.output, parallelism=cfg.fanout.parallelism, name="extract-frames-parts") as index:
        extracted = configure(data.extract_frames_part(dataset=ds, index=index, count=parts, **stored), cfg,
                              "extract_frames")  # fmt: skip
        extracted.set_display_name("extract_frames_part")
    frames = data.extract_frames_merge(dataset=ds, parts=dsl.Collected(extracted.outputs["part"]), **stored)
    return configure(frames, cfg, "extract_frames_merge").outputs["frames"]
