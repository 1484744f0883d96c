"""The main job (`make pipeline-run`: kfp.local, SubprocessRunner, this venv, configs/pipeline-local.yaml) for each
family's DAG: every step ran, and the figures it reports clear chance and the majority-answer baseline computed
here from the dataset the run made."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import clearly_above, majority_share, split_rows
from pipelines import local_run
from pipelines.config import CONFIG_DIR, load
from vlp import storage
from vlp.data import manifest
from vlp.data.video_text import normalize_answer

# A figure must reach what a chance-level predictor reaches with probability below ALPHA. Measured on 2 CPU cores,
# the tightest margin is ALBEF's re-ranked t2v R@1: 9.2 against a bar of 7.5 (11 captions of 120 against 9).
ALPHA = 1e-2


def retrieval_figures(outputs: dict[str, dict[str, str]], metrics: dict[str, float]) -> dict[str, float]:
    """Text -> video R@1 of the run against chance (100 / test clips), both from the dataset the run made.

    The bar is :func:`clearly_above` chance at :data:`ALPHA`; the final ranking and the similarity ranking it
    re-ranks (the same for a dot-product family) must reach it. The run's own top-1 clips, scored against a
    shifted truth (each caption credited to the next clip), are a ranking unrelated to the captions and must stay
    under it. Returns the figures recomputed here (the report's row must show them).
    """
    captions = split_rows(outputs["ingest"]["dataset"], manifest.CAPTIONS)
    clips = sorted({c["video_id"] for c in captions})
    chance, bar = 1 / len(clips), clearly_above(1 / len(clips), len(captions), ALPHA)
    ranks = storage.read_parquet(f"{outputs['evaluate-retrieval']['results']}/ranks.parquet").to_pylist()
    assert sorted(r["video_id"] for r in ranks) == sorted(c["video_id"] for c in captions)
    r1 = sum(r["t2v_rank"] == 1 for r in ranks) / len(ranks)
    shifted = dict(zip(clips, clips[1:] + clips[:1], strict=True))
    r1_shifted = sum(r["top5"][0] == shifted[r["video_id"]] for r in ranks) / len(ranks)
    assert metrics["retrieval.t2v_r1"] == pytest.approx(100 * r1)
    assert metrics["retrieval.chance_t2v_r1"] == pytest.approx(100 * chance)
    assert r1 >= bar, f"t2v R@1 {100 * r1:.1f} is not clearly above chance {100 * chance:.1f} (bar {100 * bar:.1f})"
    vtc = metrics["retrieval.vtc_t2v_r1"]
    assert vtc >= 100 * bar, f"similarity-only t2v R@1 {vtc:.1f} is not clearly above chance (bar {100 * bar:.1f})"
    assert r1_shifted < bar, f"a ranking scored against the wrong clips reaches the bar: {100 * r1_shifted:.1f}"
    return {"t2v_r1": 100 * r1, "vtc_t2v_r1": vtc, "chance": 100 * chance, "bar": 100 * bar,
            "shifted_truth_r1": 100 * r1_shifted}  # fmt: skip


def qa_figures(outputs: dict[str, dict[str, str]], metrics: dict[str, float]) -> dict[str, float]:
    """QA accuracy against the share of the test split's most common answer (what a constant answer scores at
    best), both from the dataset the run made; the bar, the shifted-truth check and the report's row as above."""
    dataset = outputs["ingest"]["dataset"]
    gold = {q["qa_id"]: normalize_answer(q["answer"]) for q in split_rows(dataset, manifest.QA)}
    majority = majority_share(list(gold.values()))
    bar = clearly_above(majority, len(gold), ALPHA)
    preds = storage.read_parquet(f"{outputs['evaluate-qa']['results']}/predictions.parquet").to_pylist()
    assert sorted(p["qa_id"] for p in preds) == sorted(gold)
    accuracy = sum(p["prediction"] == gold[p["qa_id"]] for p in preds) / len(preds)
    ids = sorted(gold)
    shifted = dict(zip(ids, ids[1:] + ids[:1], strict=True))  # each question graded by the next one's answer
    accuracy_shifted = sum(p["prediction"] == gold[shifted[p["qa_id"]]] for p in preds) / len(preds)
    assert metrics["qa.accuracy"] == pytest.approx(accuracy)
    assert metrics["qa.majority_accuracy"] <= majority + 1e-9  # the report's baseline guesses from the train split
    low = f"QA accuracy {100 * accuracy:.1f} is not clearly above the majority answer's {100 * majority:.1f}"
    assert accuracy >= bar, f"{low} (bar {100 * bar:.1f})"
    assert accuracy_shifted < bar, f"answers graded against the wrong questions reach the bar: {accuracy_shifted}"
    return {"accuracy": 100 * accuracy, "majority": 100 * majority, "bar": 100 * bar,
            "shifted_truth_accuracy": 100 * accuracy_shifted}  # fmt: skip


def index_rows(outputs: dict[str, dict[str, str]], summary: str) -> int:
    """The run's clip index holds the test split's clips, one row each, and the report names it; returns how many."""
    from vlp.index.store import ClipIndex

    where = outputs["index-clips"]["index"]
    clips = {c["video_id"] for c in split_rows(outputs["ingest"]["dataset"], manifest.CAPTIONS)}
    index = ClipIndex.open(where)
    assert index.video_ids() == clips and index.count() == len(clips)
    assert f"clip index: `{where}` ({len(clips)} clips of the test split)" in summary, summary
    return len(clips)


def report_rows(summary: str, metrics: dict[str, float], retrieval: dict[str, float], qa: dict | None) -> None:
    """The report's table shows the figures and baselines recomputed here."""
    r1, vtc, chance = retrieval["t2v_r1"], retrieval["vtc_t2v_r1"], retrieval["chance"]
    similarity = "" if metrics["retrieval.pairs_scored"] == 0 else f"{vtc:.2f}"  # shown only where a pass re-ranks
    row = f"| retrieval | text → video R@1 | {r1:.2f} | {similarity} | {chance:.2f} |  | above chance by "
    assert row in summary, summary
    if qa is not None:
        chance, train_majority = 100 * metrics["qa.chance_accuracy"], 100 * metrics["qa.majority_accuracy"]
        row = (
            f"| qa | accuracy (%) | {qa['accuracy']:.2f} |  | {chance:.2f} | {train_majority:.2f} | above the majority"
        )
        assert row in summary, summary


DATA_STEPS = {"given-source", "synth", "ingest", "extract-frames"}  # every family's DAG runs them with the same inputs
SIDE_EFFECT_TASKS = {"start-run", "report", "finish-run"}  # MLflow tasks: caching off (pipelines/config/local.yaml)
ALIAS = {"register_alias": "local-test"}


def kinds(result: dict) -> dict[str, str]:
    return {task: kind for task, kind, _ in result["tasks"]}


@pytest.fixture(scope="module")
def main_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The main job (what `make pipeline-run` runs), once for the module: its test reads it, the rerun test runs it
    again from KFP's cache, and the other families' DAGs run into the same folder, as a user's next
    `make pipeline-run FAMILY=...` does (the data steps come from the cache; the figures are the same bytes)."""
    out = tmp_path_factory.mktemp("main-job") / "run"
    return out, local_run.run(out, params=ALIAS)


@pytest.mark.slow
def test_local_pipeline_run_end_to_end(main_job: tuple[Path, dict]) -> None:
    result = main_job[1]
    assert set(kinds(result).values()) == {"done"}
    outputs = result["outputs"]
    steps = ["synth", "ingest", "extract-frames", "mine-entities", "pretrain-prompter", "build-prompt-bank", "pretrain"]
    if load(CONFIG_DIR / "local.yaml").downstream:
        steps += ["finetune-retrieval", "evaluate-retrieval", "index-clips", "finetune-qa", "evaluate-qa"]
    for task in steps:
        assert task in outputs, f"{task} wrote no output: {sorted(outputs)}"
    assert (Path(outputs["pretrain"]["model"]) / "model.json").is_file()
    assert (Path(outputs["extract-frames"]["frames"]) / "index.parquet").is_file()
    summary = Path(outputs["report"]["summary"]).read_text()  # what `make pipeline-run` prints at the end
    assert summary.startswith("# vlp pipeline run")
    tracked = result["mlflow"]
    assert tracked["parent_run_id"] and tracked["status"] == "FINISHED"
    expected = {name.replace("-", "_"): "FINISHED" for name in steps}
    assert tracked["steps"] == expected
    if "evaluate-retrieval" in steps:
        from mlflow import MlflowClient

        registered = MlflowClient(tracked["tracking_uri"]).get_model_version_by_alias(
            "vlp-local-retrieval", "local-test"
        )
        assert registered.version  # the parameter reached the pipeline
        m = tracked["metrics"]
        retrieval, qa = retrieval_figures(outputs, m), qa_figures(outputs, m)
        report_rows(summary, m, retrieval, qa)
        print(f"alpro: retrieval {retrieval}, qa {qa}, {index_rows(outputs, summary)} clips indexed")


@pytest.mark.slow
def test_a_rerun_reuses_every_cached_step_and_still_logs_its_parent_run(main_job: tuple[Path, dict], capsys) -> None:
    out, first = main_job
    computed = set(kinds(first)) - SIDE_EFFECT_TASKS
    assert {"synth", "ingest", "extract-frames", "pretrain", "evaluate-retrieval", "evaluate-qa"} <= computed
    capsys.readouterr()

    assert local_run.main(["--out", str(out), "--param", f"register_alias={ALIAS['register_alias']}"]) == 0
    printed = capsys.readouterr().out
    second = {task: ("cached" if "reused from KFP's cache" in line else "done")
              for line in printed.splitlines() if line.startswith("[")
              for task in [line.split("] ", 1)[1].split(" ", 1)[0]] if " started" not in line}  # fmt: skip
    assert {t for t, k in second.items() if k == "cached"} == computed
    assert {t for t, k in second.items() if k == "done"} == SIDE_EFFECT_TASKS
    assert f"{len(SIDE_EFFECT_TASKS)} task(s) ran, {len(computed)} reused from KFP's cache" in printed
    assert "Got executor_input" not in printed and "[KFP Executor" not in printed  # the executor's dump is off

    summary = local_run.mlflow_summary(first["mlflow"]["tracking_uri"])  # the newest parent run: the rerun's
    assert summary["parent_run_id"] != first["mlflow"]["parent_run_id"]
    assert summary["status"] == "FINISHED"
    assert summary["steps"] == {}  # no step ran, so no step run nests under it
    assert summary["metrics"] == first["mlflow"]["metrics"]  # the report logged the reused evaluations' figures
    for task in ("evaluate-retrieval", "evaluate-qa"):  # the HTML reports of the reused evaluations, openable
        html = out / "reports" / f"{task}.html"
        assert html.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")


def test_local_run_checks_params_like_a_cluster_submission(capsys) -> None:
    assert local_run.main(["--param", "no_such_param=1"]) == 2
    assert "unknown parameter 'no_such_param'" in capsys.readouterr().err


@pytest.mark.slow
def test_local_albef_pipeline_run_end_to_end(main_job: tuple[Path, dict]) -> None:
    """ALBEF's DAG (`make pipeline-run FAMILY=albef`) into the main job's folder: no prompter, entities or prompt
    bank; the same fine-tune / evaluate / report branches, and figures as clear of chance and the majority answer.
    The data steps come from KFP's cache; ALBEF's pre-training has another family input and runs (the cache key
    holds every input, beside the code digest)."""
    result = local_run.run(main_job[0], family="albef")
    assert {t for t, k in kinds(result).items() if k == "cached"} == DATA_STEPS
    outputs = result["outputs"]
    assert not {"mine-entities", "pretrain-prompter", "build-prompt-bank"} & set(outputs)
    from vlp.models import directory

    assert directory.describe(outputs["pretrain"]["model"]).kind == "albef"
    steps = ["synth", "ingest", "extract-frames", "pretrain"]
    if load(CONFIG_DIR / "local.yaml").downstream:
        steps += ["finetune-retrieval", "evaluate-retrieval", "index-clips", "finetune-qa", "evaluate-qa"]
        assert directory.describe(outputs["finetune-qa"]["model"]).kind == "albef_qa"
    tracked = result["mlflow"]  # a cached step opens no MLflow run
    ran = {s.replace("-", "_"): "FINISHED" for s in steps if s not in DATA_STEPS}
    assert tracked["status"] == "FINISHED" and tracked["steps"] == ran
    summary = Path(outputs["report"]["summary"]).read_text()
    assert summary.startswith("# vlp pipeline run")
    if "evaluate-retrieval" in steps:
        m = tracked["metrics"]
        retrieval, qa = retrieval_figures(outputs, m), qa_figures(outputs, m)
        report_rows(summary, m, retrieval, qa)
        print(f"albef: retrieval {retrieval}, qa {qa}, {index_rows(outputs, summary)} clips indexed")


@pytest.mark.slow
def test_local_retrieval_pipeline_fine_tunes_ts2net_without_pre_training(main_job: tuple[Path, dict]) -> None:
    """vlp-retrieval under kfp.local (`make pipeline-run PIPELINE=retrieval`) into the main job's folder, its data
    steps from the cache: TS2-Net (tiny, random CLIP) fine-tuned, evaluated, registered, and clear of chance."""
    result = local_run.run(main_job[0], family="ts2net", pipeline="retrieval", params={"register_alias": "ts2"})
    assert {t for t, k in kinds(result).items() if k == "cached"} == DATA_STEPS
    outputs = result["outputs"]
    steps = ["synth", "ingest", "extract-frames", "finetune-retrieval", "evaluate-retrieval", "index-clips"]
    assert set(steps) <= set(outputs) and not {"pretrain", "finetune-qa"} & set(outputs)
    from mlflow import MlflowClient

    from vlp.models import directory

    assert directory.describe(outputs["finetune-retrieval"]["model"]).kind == "ts2net_retrieval"
    tracked = result["mlflow"]
    ran = {s.replace("-", "_"): "FINISHED" for s in steps if s not in DATA_STEPS}
    assert tracked["status"] == "FINISHED" and tracked["steps"] == ran
    m = tracked["metrics"]
    assert m["retrieval.t2v_r1"] == m["retrieval.vtc_t2v_r1"]  # the frame score is final: nothing re-ranks
    assert MlflowClient(tracked["tracking_uri"]).get_model_version_by_alias("vlp-local-retrieval", "ts2").version
    summary = Path(outputs["report"]["summary"]).read_text()
    assert summary.startswith("# vlp pipeline run") and "pre-trained model" not in summary
    retrieval = retrieval_figures(outputs, m)
    report_rows(summary, m, retrieval, None)
    print(f"ts2net: retrieval {retrieval}, {index_rows(outputs, summary)} clips indexed")
