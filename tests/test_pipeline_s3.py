"""The local pipeline (kfp.local, the code path of `make pipeline-run`) end to end with ``data_root`` in a bucket.

It runs against a real Ceph RGW (``VLP_TEST_S3_ENDPOINT``; the ``s3_endpoint`` fixture marks it ``s3``): in
`make test TEST_S3=rgw`, CI's single pass, and in `make test-s3`. On moto, in a plain `make test`, it is skipped: it
costs CI minutes, and every step's S3 path is tested on moto too (test_storage, test_data_chain,
test_pretrain_steps, test_finetune_eval, test_index, test_pipeline_fanout, ...). Every
step subprocess reads the endpoint and keys from the ``AWS_*`` environment (``s3_env``), as a step pod does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from components._runtime import POINTER
from pipelines import local_run
from pipelines.config import CONFIG_DIR, load
from vlp import storage

TINY = str(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml")  # the main job's world is not needed here
FAST = ["pretrain.max_steps=2"]  # the tiny config with one optimiser step fewer in both pre-training steps

# (task, output) -> objects that must be under the output's prefix in the bucket
PRETRAIN_OUTPUTS = {
    ("synth", "raw"): ["videos.parquet", "captions.parquet", "summary.json"],
    ("ingest", "dataset"): ["videos.parquet", "captions.parquet", "qa.parquet", "rejects.parquet"],
    ("extract-frames", "frames"): ["index.parquet", "summary.json"],
    ("mine-entities", "entities"): ["entities.parquet", "unigrams.txt"],
    ("pretrain-prompter", "prompter"): ["model.json", "tokenizer/tokenizer.json"],
    ("build-prompt-bank", "bank"): ["prompt_bank.safetensors", "prompt_bank.json"],
    ("pretrain", "model"): ["model.json", "metrics.jsonl", "tokenizer/tokenizer.json"],
}
DOWNSTREAM_OUTPUTS = {
    ("finetune-retrieval", "model"): ["model.json"],
    ("finetune-qa", "model"): ["model.json", "answers.json"],
    ("evaluate-retrieval", "results"): ["metrics.json", "report.md"],
    ("evaluate-qa", "results"): ["metrics.json", "report.md", "predictions.parquet"],
    ("index-clips", "index"): ["summary.json"],  # and the LanceDB table, clips.lance/
}
TRAINED = {"pretrain-prompter": "prompter", "pretrain": "model", "finetune-retrieval": "model", "finetune-qa": "model"}


def _keys(prefix: str) -> set[str]:
    """Every object under ``prefix``, as paths relative to it."""
    return {uri[len(prefix) + 1 :] for uri in storage.list_files(prefix)}


def _metrics(results_uri: str) -> dict[str, float]:
    return json.loads(storage.read_text(storage.join(results_uri, "metrics.json")))


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("VLP_TEST_S3_ENDPOINT"), reason="runs on Ceph RGW: make test TEST_S3=rgw")
def test_local_pipeline_puts_its_large_outputs_in_the_bucket(
    tmp_path: Path, s3_bucket: str, s3_env: dict[str, str]
) -> None:
    data_root = f"{s3_bucket}/vlp-data"
    result = local_run.run(tmp_path / "run", step_config=TINY, overrides=FAST, data_root=data_root)
    outputs = result["outputs"]
    downstream = load(CONFIG_DIR / "local.yaml").downstream
    expected = {**PRETRAIN_OUTPUTS, **(DOWNSTREAM_OUTPUTS if downstream else {})}
    listing: dict[str, set[str]] = {}
    for (task, name), files in expected.items():
        uri = outputs[task][name]
        assert uri.startswith(f"{data_root}/"), f"{task}/{name} is at {uri}, not under {data_root}"
        (local,) = tmp_path.glob(f"run/kfp/*/{task}/{name}")
        assert [p.name for p in local.iterdir()] == [POINTER], f"{task}/{name} left data in {local}"
        listing[task] = _keys(uri)
        missing = [f for f in files if f not in listing[task]]
        assert not missing, f"{task}/{name}: {missing} not in {uri}; it holds {sorted(listing[task])}"
    assert any(k.startswith("videos/") and k.endswith(".mp4") for k in listing["synth"])
    assert any(k.startswith("shards/") and k.endswith(".parquet") for k in listing["extract-frames"])
    if downstream:
        assert any(k.startswith("clips.lance/") for k in listing["index-clips"])
    for task in TRAINED.keys() & {task for task, _ in expected}:
        assert any(k.startswith("checkpoints/step-") and k.endswith("model.safetensors") for k in listing[task]), task
    assert "checkpoints/step-000002/model.safetensors" in listing["pretrain"]  # FAST reached the step pods
    assert data_root in Path(outputs["report"]["summary"]).read_text()  # the pre-trained model's URI
    tracked = result["mlflow"]
    assert tracked["status"] == "FINISHED"
    assert set(tracked["steps"].values()) == {"FINISHED"}
    if downstream:
        retrieval = _metrics(outputs["evaluate-retrieval"]["results"])
        assert tracked["metrics"]["retrieval.t2v_r1"] == pytest.approx(retrieval["t2v_r1"])
        qa = _metrics(outputs["evaluate-qa"]["results"])
        assert tracked["metrics"]["qa.accuracy"] == pytest.approx(qa["accuracy"])
