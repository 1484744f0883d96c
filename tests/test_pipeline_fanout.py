"""The fanned-out data steps (pipelines/fanout.py) as a DAG under kfp.local, which runs ParallelFor and Collected:
the merged dataset and frame store are byte-identical to the single-pod DAG's; with ``data_root`` in a bucket the
parts of a rerun find the earlier run's work and skip it.

(No ``from __future__ import annotations``: KFP reads the pipeline function's annotations as types.)"""

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from kfp import dsl, local

from components import data
from pipelines import fanout, local_talk
from pipelines.config import CONFIG_DIR, FanOut, configure, load
from pipelines.local_run import list_outputs
from vlp import storage

TINY = str(CONFIG_DIR.parents[1] / "configs" / "tiny.yaml")
SKIP = {"summary.json"}  # it records the step's own paths and seconds


def data_pipeline(parts: int, retries: int = 0, overrides: tuple[str, ...] = ()) -> Any:
    """synth (a pointer to ``source_uri``) -> the data steps, as the production DAGs wire them."""
    cfg = dataclasses.replace(load(CONFIG_DIR / "local.yaml"), fanout=FanOut(parts=parts, parallelism=2))
    cfg.steps["extract_frames"].retries = retries
    extra = ["ingest.workers=1", "frames.workers=1", *overrides]

    @dsl.pipeline(name=f"vlp-data-{parts}")
    @fanout.parameters(cfg)
    def pipeline(source_uri: str, data_root: str = "", data_parts: int = cfg.fanout.parts) -> None:
        stored = {"config": TINY, "overrides": extra, "data_root": data_root}
        raw = configure(data.synth(**stored, source_uri=source_uri), cfg, "synth")
        fanout.data_steps(cfg, raw.outputs["raw"], stored, data_parts)

    return pipeline


def run(root: Path, parts: int, retries: int = 0, overrides: tuple[str, ...] = (), **arguments: Any) -> dict:
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    before = set(root.glob("*"))
    with local_talk.Talk():  # as pipelines.local_run runs a DAG (it restores what kfp's ParallelFor may leave)
        data_pipeline(parts, retries, overrides)(**arguments)
    (run_root,) = set(root.glob("*")) - before
    return list_outputs(run_root)


def contents(uri: str) -> dict[str, bytes]:
    return {
        os.path.relpath(u, uri) if not storage.is_s3(u) else u[len(uri) + 1 :]: storage.read_bytes(u)
        for u in storage.list_files(uri)
        if os.path.basename(u) not in SKIP
    }


@pytest.fixture(autouse=True)
def repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step subprocesses import ``components`` from the repo root, as local_run sets up."""
    root = str(CONFIG_DIR.parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH", "")])))


@pytest.mark.slow
def test_fanned_out_data_steps_give_the_single_pod_bytes(tiny_world: dict[str, str], tmp_path: Path) -> None:
    single = run(tmp_path / "kfp", 1, source_uri=tiny_world["raw"])
    fanned = run(tmp_path / "kfp", 3, source_uri=tiny_world["raw"])
    assert {"ingest", "extract-frames"} <= set(single) and not {"ingest-part", "ingest-merge"} & set(single)
    assert {"ingest-merge", "extract-frames-merge"} <= set(fanned)
    parts = sorted(Path(fanned["ingest-merge"]["dataset"]).parents[1].glob("for-loop-*/ingest-part/part"))
    assert len(parts) == 3 and all((p / "probes.parquet").is_file() for p in parts)
    dataset, frames = contents(fanned["ingest-merge"]["dataset"]), contents(fanned["extract-frames-merge"]["frames"])
    assert dataset == contents(single["ingest"]["dataset"])
    assert frames == contents(single["extract-frames"]["frames"])
    assert "index.parquet" in frames and any(k.startswith("shards/") for k in frames)
    summary = json.loads(Path(fanned["extract-frames-merge"]["frames"], "summary.json").read_text())
    assert (summary["parts"], summary["shards_written"]) == (3, 0)


@pytest.mark.slow
def test_a_rerun_with_data_root_skips_the_finished_parts(
    tiny_world: dict[str, str], tmp_path: Path, s3_bucket: str, s3_env: dict[str, str]
) -> None:
    data_root = f"{s3_bucket}/vlp-data"
    first = run(tmp_path / "kfp", 2, source_uri=tiny_world["raw"], data_root=data_root)
    ingest_parts = storage.list_files(f"{data_root}/parts/ingest", "summary.json")
    frame_parts = storage.list_files(f"{data_root}/parts/frames", "summary.json")
    assert len(ingest_parts) == len(frame_parts) == 2
    written = [json.loads(storage.read_text(u)) for u in frame_parts]
    assert all(s["shards_written"] == s["shards"] for s in written) and sum(s["shards"] for s in written) >= 2
    storage.delete(storage.list_files(frame_parts[0].rsplit("/", 1)[0] + "/shards")[0])  # one shard lost
    second = run(tmp_path / "kfp", 2, source_uri=tiny_world["raw"], data_root=data_root)
    assert [json.loads(storage.read_text(u))["skipped"] for u in ingest_parts] == [True, True]
    again = [json.loads(storage.read_text(u)) for u in frame_parts]
    assert [s["shards_written"] for s in again] == [1, 0]
    one, two = first["extract-frames-merge"]["frames"], second["extract-frames-merge"]["frames"]
    assert one != two and contents(one) == contents(two)  # each run's own store, the same bytes
    assert contents(first["ingest-merge"]["dataset"]) == contents(second["ingest-merge"]["dataset"])


@pytest.mark.slow
def test_a_failed_part_retries_alone_and_skips_the_shards_it_had_written(
    tiny_world: dict[str, str],
    tmp_path: Path,
    s3_bucket: str,
    s3_env: dict[str, str],
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store refuses the first writes of one frame shard (503 on every attempt botocore makes): its part
    fails, KFP retries that part alone (steps.extract_frames.retries), and the retry skips the shard the part had
    written before failing. Every other shard is written exactly once."""
    from common import FaultyProxy, fail_first

    puts: list[str] = []
    refuse = fail_first(5, "503", "shard-00004-", "PUT")  # storage.max_attempts = 5: one whole write fails

    def policy(method: str, path: str) -> str | None:
        if method == "PUT" and "/parts/frames/" in path and "/shards/shard-" in path:  # the parts, not the merge
            puts.append(path.rsplit("/", 1)[-1].split("?")[0][:11])
        return refuse(method, path)

    with FaultyProxy(s3_endpoint, policy) as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)  # the step subprocesses talk to the store through the proxy
        outputs = run(tmp_path / "kfp", 3, retries=1, overrides=("frames.videos_per_shard=2",),
                      source_uri=tiny_world["raw"], data_root=f"{s3_bucket}/vlp-data")  # fmt: skip
    counts = {name: puts.count(name) for name in sorted(set(puts))}
    assert counts.pop("shard-00004") == 6  # five refused, then the retry's write
    assert set(counts.values()) == {1} and len(counts) >= 8  # shard 3, before it in the same part, too
    index = contents(outputs["extract-frames-merge"]["frames"])
    assert "index.parquet" in index and sum(k.startswith("shards/") for k in index) == len(counts) + 1
