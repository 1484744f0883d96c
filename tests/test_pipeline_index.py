"""The clip-index DAG (``vlp-index``) under kfp.local: a fine-tuned model's test-split clips go into an index at the
URI given, which ``vlp search`` ranks as evaluate-retrieval does; a second run without a dataset adds the rest of
the frames store to the same index. Each run is a tracked MLflow parent run with an ``index_clips`` step run.

(No ``from __future__ import annotations``: KFP reads pipeline annotations as types.)"""

import json
import os
from pathlib import Path
from typing import Any

import pytest
from kfp import local
from kfp.dsl import Dataset, Model

from components import training
from components._runtime import RUN_ID_ENV
from conftest import split_rows
from pipelines import index, local_run, local_talk
from pipelines.config import CONFIG_DIR, load
from pipelines.local_run import list_outputs, new_run_id
from vlp import tracking
from vlp.cli import main
from vlp.data import manifest
from vlp.data.frames import FrameStore
from vlp.index.store import ClipIndex

REPO = CONFIG_DIR.parents[1]
TINY = str(REPO / "configs" / "tiny.yaml")
LOADERS = ["retrieval.num_workers=0"]  # the clips are read on the step's own thread


@pytest.fixture(autouse=True)
def repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    monkeypatch.setenv(RUN_ID_ENV, "")  # restored after the test; run_dag sets a fresh one per run


@pytest.fixture(scope="module")
def tuned(tiny_world: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """TS2-Net fine-tuned for two steps on the tiny world (no pre-training needed), and an MLflow store."""
    root = tmp_path_factory.mktemp("index_dag")
    store = [f"tracking.tracking_uri={tracking.sqlite_uri(root)}", "tracking.experiment=index"]
    model = Model(name="model", uri=str(root / "tuned"))
    ds, fr = (Dataset(name=k, uri=tiny_world[k]) for k in ("dataset", "frames"))
    training.finetune_retrieval.python_func(dataset=ds, frames=fr, model=model, family="ts2net", config=TINY,
                                            overrides=[*LOADERS, "retrieval.max_steps=2"])  # fmt: skip
    return {"root": root, "store": store, "model": model.path, **tiny_world}


def run_dag(world: dict[str, Any], **arguments: Any) -> dict[str, dict[str, str]]:
    root = world["root"] / "kfp"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    new_run_id()  # as pipelines.local_run does: the step nests its MLflow run under this run's parent
    before = set(root.glob("*")) if root.exists() else set()
    with local_talk.Talk():  # as pipelines.local_run runs a DAG
        index.build(load(CONFIG_DIR / "local.yaml"))(
            model=world["model"],
            frames=world["frames"],
            config=TINY,
            overrides=[*world["store"], *LOADERS],
            **arguments,
        )
    (run_root,) = set(root.glob("*")) - before
    return list_outputs(run_root)


def search(index_uri: str, query: str, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """``vlp search --json`` over the index, as a user runs it after the DAG."""
    capsys.readouterr()
    assert main(["search", "--index", index_uri, "-k", "5", "--json", "--config", TINY, query, *LOADERS]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_the_dag_indexes_the_test_split_then_adds_the_rest_of_the_frames_store(
    tuned: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = str(tmp_path / "index")
    outputs = run_dag(tuned, dataset=tuned["dataset"], index_uri=out)
    assert "index-clips" in outputs and "index-clips-2" not in outputs  # the dataset branch ran, alone
    assert outputs["index-clips"]["index"] == out  # the artifact points at the index_uri given
    test_clips = {row["video_id"] for row in split_rows(tuned["dataset"], manifest.CAPTIONS)}
    assert ClipIndex.open(out).video_ids() == test_clips  # the test split's clips, no others
    counts = json.loads(Path(outputs["index-clips"]["metrics"]).read_text())
    assert counts == {"added": len(test_clips), "skipped": 0, "total": len(test_clips)}

    # The search over the DAG's index ranks each test caption's clips as evaluate-retrieval ranks them
    from vlp.config import load_config
    from vlp.steps.evaluate import evaluate_retrieval

    evaluate_retrieval(tuned["dataset"], tuned["frames"], tuned["model"], str(tmp_path / "eval"),
                       load_config(TINY, LOADERS))  # fmt: skip
    from vlp import storage

    ranks = storage.read_parquet(str(tmp_path / "eval" / "ranks.parquet")).to_pylist()
    assert ranks
    for row in ranks:
        hits = search(out, row["text"], capsys)
        assert [h["video_id"] for h in hits] == row["top5"] and all(h["score"] is not None for h in hits)

    cfg = tracking.TrackingConfig(tracking_uri=tuned["store"][0].split("=", 1)[1], experiment="index")
    client = tracking.client(cfg)
    (parent,) = client.search_runs([tracking.experiment_id(cfg)], f"tags.`{tracking.KIND_TAG}` = 'pipeline'")
    assert parent.info.status == "FINISHED" and parent.data.tags["vlp.pipeline"] == "vlp-index"
    (step,) = client.search_runs([tracking.experiment_id(cfg)], f"tags.`{tracking.PARENT_RUN_TAG}` = "
                                 f"'{parent.info.run_id}'")  # fmt: skip
    assert step.info.run_name == "index_clips" and step.data.metrics["total"] == len(test_clips)

    # No dataset: every clip of the frames store, into the same index (it adds what the index lacks), through
    # `make pipeline-run PIPELINE=index` (local_run), the index named by a path relative to the working directory
    monkeypatch.chdir(tmp_path)
    params = {"model": tuned["model"], "frames": tuned["frames"], "index_uri": "index"}
    result = local_run.run(tmp_path / "local", step_config=TINY, overrides=LOADERS, params=params, pipeline="index")
    again = result["outputs"]
    assert "index-clips-2" in again and "index-clips" not in again and again["index-clips-2"]["index"] == out
    local_run.print_result(result, 1.0)
    assert f"vlp search --index {out} --config {TINY}" in capsys.readouterr().out
    clips = set(FrameStore(tuned["frames"]).video_ids)
    assert ClipIndex.open(out).video_ids() == clips and len(clips) > len(test_clips)
    counts = json.loads(Path(again["index-clips-2"]["metrics"]).read_text())
    assert counts == {"added": len(clips - test_clips), "skipped": len(test_clips), "total": len(clips)}


def test_local_run_index_needs_a_model_and_frames(capsys: pytest.CaptureFixture[str]) -> None:
    assert local_run.main(["--pipeline", "index", "--param", "frames=/x"]) == 2
    err = capsys.readouterr().err
    assert "index.yaml needs the parameter(s) ['model']: add --param model=..." in err
