"""The whole re-evaluation DAG (``vlp-reevaluate``) under kfp.local: a registered model scored on a fixed test set,
compared with its own previous scores and with the current champion, the result recorded in MLflow; a failing
step fails the run and its MLflow parent run.

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
from pipelines import reevaluate
from pipelines.config import CONFIG_DIR, load
from pipelines.local_run import list_outputs, new_run_id
from vlp import tracking

REPO = CONFIG_DIR.parents[1]
TINY = str(REPO / "configs" / "tiny.yaml")


@pytest.fixture(autouse=True)
def repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    monkeypatch.setenv(RUN_ID_ENV, "")  # restored after the test; run_dag sets a fresh one per run


@pytest.fixture(scope="module")
def registry(tiny_world: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A fine-tuned TS2-Net (no pre-training needed) registered twice in a local store: version 1 is the champion
    (registered with made-up scores), version 2 the candidate."""
    root = tmp_path_factory.mktemp("reevaluate")
    store = [f"tracking.tracking_uri={tracking.sqlite_uri(root)}", "tracking.experiment=reeval"]
    tuned = Model(name="model", uri=str(root / "tuned"))
    ds, fr = (Dataset(name=k, uri=tiny_world[k]) for k in ("dataset", "frames"))
    training.finetune_retrieval.python_func(dataset=ds, frames=fr, model=tuned, family="ts2net", config=TINY,
                                            overrides=[*store, "retrieval.max_steps=2"])  # fmt: skip
    cfg = tracking.TrackingConfig(tracking_uri=store[0].split("=", 1)[1], experiment="reeval")
    run = tracking.start_run(cfg, "registration")
    champion = {"t2v_r1": 0.25, "v2t_r1": 0.5}
    tracking.register_model(cfg, "t-retrieval", tuned.path, run, champion, "champion")
    tracking.register_model(cfg, "t-retrieval", tuned.path, run, {"t2v_r1": 0.0}, "candidate")
    tracking.end_run(cfg, run)
    return {"root": root, "store": store, "cfg": cfg, "champion": champion, **tiny_world}


def run_dag(registry: dict[str, Any], **arguments: Any) -> dict[str, dict[str, str]]:
    root = registry["root"] / "kfp"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    new_run_id()  # as pipelines.local_run does: the steps nest their MLflow runs under this run's parent
    before = set(root.glob("*")) if root.exists() else set()
    reevaluate.build(load(CONFIG_DIR / "local.yaml"))(
        test_dataset=registry["dataset"], test_frames=registry["frames"], config=TINY,
        overrides=registry["store"], **arguments,
    )  # fmt: skip
    (run_root,) = set(root.glob("*")) - before
    return list_outputs(run_root)


def parent_runs(cfg: tracking.TrackingConfig) -> list[Any]:
    client = tracking.client(cfg)
    return client.search_runs([tracking.experiment_id(cfg)], f"tags.`{tracking.KIND_TAG}` = 'pipeline'",
                              order_by=["attributes.start_time DESC"])  # fmt: skip


@pytest.mark.slow
def test_the_dag_scores_the_candidate_and_compares_it_with_the_champion(registry: dict[str, Any]) -> None:
    outputs = run_dag(registry, retrieval_model="t-retrieval@candidate", qa_model="")
    assert "evaluate-retrieval" in outputs and "evaluate-qa" not in outputs  # "" skipped the QA branch
    new = json.loads(Path(outputs["evaluate-retrieval"]["results"], "metrics.json").read_text())
    table = Path(outputs["compare-scores"]["summary"]).read_text()
    assert table.startswith("# Re-evaluation of t-retrieval version 2 (retrieval)")
    assert "| metric | previous | new | change | champion (v1) | vs champion |" in table
    t2v = new["t2v_r1"]
    assert f"| t2v_r1 | 0.0000 | {t2v:.4f} | {t2v:+.4f} | 0.2500 | {t2v - 0.25:+.4f} |" in table
    parent = parent_runs(registry["cfg"])[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["vlp.pipeline"] == "vlp-reevaluate"
    assert parent.data.metrics["retrieval.t2v_r1"] == pytest.approx(t2v)
    assert parent.data.metrics["retrieval.vs_champion.t2v_r1"] == pytest.approx(t2v - 0.25)
    assert parent.data.tags["vlp.retrieval_champion"] == "t-retrieval/1"
    version = tracking.client(registry["cfg"]).get_model_version("t-retrieval", "2")
    assert tracking.version_metrics(version, tracking.LAST_EVAL_TAG_PREFIX)["t2v_r1"] == pytest.approx(t2v)
    # re-evaluating the champion itself: no champion column, and its newest scores become its previous ones
    again = run_dag(registry, retrieval_model="t-retrieval@champion", qa_model="")
    table = Path(again["compare-scores"]["summary"]).read_text()
    assert "champion (v" not in table and "| t2v_r1 | 0.2500 |" in table


@pytest.mark.slow
def test_a_failing_step_fails_the_run_and_its_parent_run(registry: dict[str, Any]) -> None:
    before = len(parent_runs(registry["cfg"]))
    with pytest.raises(RuntimeError, match=r"FAILURE.*fetch-model"):
        run_dag(registry, retrieval_model="t-retrieval@no-such-alias", qa_model="")
    runs = parent_runs(registry["cfg"])
    assert len(runs) == before + 1 and runs[0].info.status == "FAILED"  # the exit handler saw the failure
