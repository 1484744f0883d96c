"""The whole pre-training DAG through kfp.local (SubprocessRunner, this venv) on the tiny config."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import local_run
from pipelines.config import CONFIG_DIR, load
from pipelines.pretrain import downstream_enabled


@pytest.mark.slow
def test_local_pipeline_run_end_to_end(tmp_path: Path) -> None:
    tiny = str(CONFIG_DIR.parents[1] / "configs" / "tiny.yaml")  # `make pipeline-run` uses configs/pipeline-local.yaml
    result = local_run.run(tmp_path / "run", step_config=tiny, params={"register_alias": "local-test"})
    outputs = result["outputs"]
    steps = ["synth", "ingest", "extract-frames", "mine-entities", "pretrain-prompter", "build-prompt-bank", "pretrain"]
    if downstream_enabled(load(CONFIG_DIR / "local.yaml")):
        steps += ["finetune-retrieval", "evaluate-retrieval", "finetune-qa", "evaluate-qa"]
    for task in steps:
        assert task in outputs, f"{task} wrote no output: {sorted(outputs)}"
    assert (Path(outputs["pretrain"]["model"]) / "model.json").is_file()
    assert (Path(outputs["extract-frames"]["frames"]) / "index.parquet").is_file()
    assert Path(outputs["report"]["summary"]).read_text().startswith("# vlp pipeline run")
    tracked = result["mlflow"]
    assert tracked["parent_run_id"] and tracked["status"] == "FINISHED"
    expected = {name.replace("-", "_"): "FINISHED" for name in steps}
    assert tracked["steps"] == expected
    if "evaluate-retrieval" in steps:
        assert "retrieval.t2v_r1" in tracked["metrics"] and "qa.accuracy" in tracked["metrics"]
        from mlflow import MlflowClient

        registered = MlflowClient(tracked["tracking_uri"]).get_model_version_by_alias(
            "vlp-local-retrieval", "local-test"
        )
        assert registered.version  # the parameter reached the pipeline
        summary = Path(outputs["report"]["summary"]).read_text()  # what `make pipeline-run` prints at the end
        m = tracked["metrics"]
        assert (
            f"| retrieval | text → video R@1 | {m['retrieval.t2v_r1']:.2f} | {m['retrieval.vtc_t2v_r1']:.2f} | "
            f"{m['retrieval.chance_t2v_r1']:.2f} |" in summary
        )
        assert (
            f"| qa | accuracy (%) | {100 * m['qa.accuracy']:.2f} |  | {100 * m['qa.chance_accuracy']:.2f} | "
            f"{100 * m['qa.majority_accuracy']:.2f} |" in summary
        )


def test_local_run_checks_params_like_a_cluster_submission(capsys) -> None:
    assert local_run.main(["--param", "no_such_param=1"]) == 2
    assert "unknown parameter 'no_such_param'" in capsys.readouterr().err


@pytest.mark.slow
def test_local_albef_pipeline_run_end_to_end(tmp_path: Path) -> None:
    """ALBEF's DAG: no prompter, entities or prompt bank; the same fine-tune / evaluate / report branches."""
    tiny = str(CONFIG_DIR.parents[1] / "configs" / "tiny.yaml")
    result = local_run.run(tmp_path / "run", step_config=tiny, overrides=["model.queue_size=8"], family="albef")
    outputs = result["outputs"]
    assert not {"mine-entities", "pretrain-prompter", "build-prompt-bank"} & set(outputs)
    from vlp.models import directory

    assert directory.describe(outputs["pretrain"]["model"]).kind == "albef"
    steps = ["synth", "ingest", "extract-frames", "pretrain"]
    if downstream_enabled(load(CONFIG_DIR / "local.yaml")):
        steps += ["finetune-retrieval", "evaluate-retrieval", "finetune-qa", "evaluate-qa"]
        assert directory.describe(outputs["finetune-qa"]["model"]).kind == "albef_qa"
    tracked = result["mlflow"]
    assert tracked["status"] == "FINISHED" and tracked["steps"] == {s.replace("-", "_"): "FINISHED" for s in steps}
    assert Path(outputs["report"]["summary"]).read_text().startswith("# vlp pipeline run")


@pytest.mark.slow
def test_local_retrieval_pipeline_fine_tunes_ts2net_without_pre_training(tmp_path: Path) -> None:
    """vlp-retrieval under kfp.local: TS2-Net (tiny, random CLIP) fine-tuned, evaluated and registered."""
    tiny = str(CONFIG_DIR.parents[1] / "configs" / "tiny.yaml")
    result = local_run.run(tmp_path / "run", step_config=tiny, family="ts2net", pipeline="retrieval",
                           params={"register_alias": "ts2"})  # fmt: skip
    outputs = result["outputs"]
    steps = ["synth", "ingest", "extract-frames", "finetune-retrieval", "evaluate-retrieval"]
    assert set(steps) <= set(outputs) and not {"pretrain", "finetune-qa"} & set(outputs)
    from mlflow import MlflowClient

    from vlp.models import directory

    assert directory.describe(outputs["finetune-retrieval"]["model"]).kind == "ts2net_retrieval"
    tracked = result["mlflow"]
    assert tracked["status"] == "FINISHED" and tracked["steps"] == {s.replace("-", "_"): "FINISHED" for s in steps}
    m = tracked["metrics"]
    assert m["retrieval.t2v_r1"] == m["retrieval.vtc_t2v_r1"]  # the frame score is final: nothing re-ranks
    assert MlflowClient(tracked["tracking_uri"]).get_model_version_by_alias("vlp-local-retrieval", "ts2").version
    summary = Path(outputs["report"]["summary"]).read_text()
    assert summary.startswith("# vlp pipeline run") and "pre-trained model" not in summary
