"""Components through ``.python_func`` (the exact body KFP runs) on the tiny synthetic world, with a local
MLflow store: outputs, LOCATION pointers, nested step runs, registration and re-evaluation bookkeeping."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from kfp.dsl import HTML, Artifact, Dataset, Markdown, Metrics, Model

from components import _runtime, data, evaluation, reporting, training
from vlp import tracking

TINY = str(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml")


def _art(cls, path: Path):
    return cls(name=path.name, uri=str(path))


@pytest.fixture
def store(tmp_path: Path) -> list[str]:
    """Overrides pointing tracking at a fresh sqlite store."""
    return [f"tracking.tracking_uri={tracking.sqlite_uri(tmp_path)}", "tracking.experiment=components"]


def _cfg(store: list[str]) -> tracking.TrackingConfig:
    return tracking.TrackingConfig(tracking_uri=store[0].split("=", 1)[1], experiment="components")


def _runs(store: list[str]) -> list:
    cfg = _cfg(store)
    return tracking.client(cfg).search_runs([tracking.experiment_id(cfg)])


def test_ingest_and_mine_entities_write_outputs_and_nested_runs(tiny_world, tmp_path, store, monkeypatch):
    raw = _art(Dataset, tmp_path / "raw")
    data.synth.python_func(raw=raw, config=TINY, overrides=[], source_uri=tiny_world["raw"])
    assert _runtime.location(raw) == tiny_world["raw"]  # a pointer, nothing copied
    dataset, entities = _art(Dataset, tmp_path / "dataset"), _art(Dataset, tmp_path / "entities")
    monkeypatch.setenv(_runtime.RUN_ID_ENV, "run-1")  # as the pod's run-id label / local_run set it
    common = {"config": TINY, "overrides": store}
    data.ingest.python_func(raw=raw, dataset=dataset, **common)
    data.mine_entities.python_func(dataset=dataset, entities=entities, **common)
    assert json.loads((tmp_path / "dataset" / "summary.json").read_text())["step"] == "ingest"
    assert (tmp_path / "entities" / "entities.parquet").is_file()
    runs = {r.info.run_name: r for r in _runs(store)}
    parent = runs["pipeline-run-1"]
    assert parent.data.tags[tracking.KFP_RUN_TAG] == "run-1"
    for step, out in (("ingest", "dataset"), ("mine_entities", "entities")):
        assert runs[step].data.tags[tracking.PARENT_RUN_TAG] == parent.info.run_id
        assert runs[step].info.status == "FINISHED"
        summary = json.loads((tmp_path / out / "summary.json").read_text())
        numbers = tracking.numeric_leaves({k: v for k, v in summary.items() if k != "config"})
        assert numbers and runs[step].data.metrics == numbers  # every number of the summary, as written
    assert runs["mine_entities"].data.params["entities.top_m"] == "50"


def test_data_root_puts_data_elsewhere_and_leaves_a_pointer(tiny_world, tmp_path):
    dataset = _art(Dataset, tmp_path / "kfp" / "run-9" / "ingest" / "dataset")
    root = tmp_path / "bucket"
    data.ingest.python_func(
        raw=_art(Dataset, Path(tiny_world["raw"])), dataset=dataset, config=TINY, overrides=[], data_root=str(root)
    )
    where = root / "run-9" / "ingest" / "dataset"
    assert (where / "videos.parquet").is_file()
    assert not (Path(dataset.path) / "videos.parquet").exists()
    assert _runtime.location(dataset) == str(where) == dataset.metadata["uri"]


def test_config_can_be_yaml_text_and_bad_input_fails_loudly(tiny_world, tmp_path):
    text = Path(TINY).read_text() + "\n"
    entities = _art(Dataset, tmp_path / "entities")
    ds = _art(Dataset, Path(tiny_world["dataset"]))
    data.mine_entities.python_func(dataset=ds, entities=entities, config=text, overrides=["entities.top_m=5"])
    assert json.loads((tmp_path / "entities" / "summary.json").read_text())["config"]["entities"]["top_m"] == 5
    with pytest.raises(FileNotFoundError, match=r"nope\.yaml"):
        data.mine_entities.python_func(dataset=ds, entities=entities, config="nope.yaml", overrides=[])
    with pytest.raises(ValueError, match="'clip4clip' is not available; choose one of"):
        _runtime.pretrain_fn("clip4clip")
    with pytest.raises(ValueError, match="'ts2net' is not pre-trained"):
        _runtime.pretrain_fn("ts2net")


def test_tracking_uri_comes_from_the_pod_environment_unless_the_config_sets_one(store, tmp_path, monkeypatch):
    uri = _cfg(store).tracking_uri
    monkeypatch.setenv(_runtime.TRACKING_ENV, uri)  # what the compiled pipeline sets on every pod
    monkeypatch.setenv(_runtime.RUN_ID_ENV, "env-1")
    run_id = reporting.start_run.python_func(
        config=TINY, overrides=["tracking.experiment=components"], pipeline="p", image="i"
    )
    assert run_id and [r.info.run_id for r in _runs(store)] == [run_id]
    cfg, overrides = _runtime.load_step_config(TINY, [])
    assert cfg.tracking.tracking_uri == uri
    assert overrides == [f"tracking.tracking_uri={uri}"]  # a torchrun subprocess gets the same store
    other = tracking.sqlite_uri(tmp_path / "other")
    cfg, overrides = _runtime.load_step_config(TINY, [f"tracking.tracking_uri={other}"])
    assert (cfg.tracking.tracking_uri, overrides) == (other, [f"tracking.tracking_uri={other}"])
    monkeypatch.delenv(_runtime.TRACKING_ENV)
    assert _runtime.load_step_config(TINY, [])[0].tracking.tracking_uri == ""


def test_start_and_finish_run_tag_and_close_the_parent(store, monkeypatch):
    monkeypatch.setenv(_runtime.RUN_ID_ENV, "k-7")  # as the pod's run-id label / local_run set it
    run_id = reporting.start_run.python_func(config=TINY, overrides=store, pipeline="vlp-pretrain", image="img:1")
    assert reporting.start_run.python_func(config=TINY, overrides=store, pipeline="p", image="i") == run_id
    status = SimpleNamespace(state="FAILED", error_message="boom")
    reporting.finish_run.python_func(config=TINY, overrides=store, status=status)
    run = tracking.client(_cfg(store)).get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["vlp.image"] == "img:1"
    assert run.data.params["model.preset"] == "tiny"
    assert reporting.start_run.python_func(config=TINY, overrides=[], pipeline="p", image="i") == ""
    monkeypatch.setenv(_runtime.TRACKING_ENV, _cfg(store).tracking_uri)
    monkeypatch.delenv(_runtime.RUN_ID_ENV)  # tracking on and no run id: one error that says where it comes from
    with pytest.raises(RuntimeError, match=r"\$KFP_RUN_ID is not set.*pipeline/runid"):
        reporting.start_run.python_func(config=TINY, overrides=[], pipeline="p", image="i")


def _fake_model(path: Path) -> Model:
    path.mkdir(parents=True)
    (path / "model.json").write_text('{"kind": "alpro"}')
    (path / "checkpoints").mkdir()
    (path / "checkpoints" / "w.safetensors").write_bytes(b"\0" * 16)
    return _art(Model, path)


def _results(path: Path, metrics: dict[str, float]) -> Artifact:
    path.mkdir(parents=True)
    (path / "metrics.json").write_text(json.dumps(metrics))
    return _art(Artifact, path)


def _index(path: Path, summary: dict) -> Artifact:
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps(summary))
    return _art(Artifact, path)


def test_report_registers_models_and_reevaluation_compares(tmp_path, store, monkeypatch):
    monkeypatch.setenv(_runtime.RUN_ID_ENV, "k-1")
    reporting.start_run.python_func(config=TINY, overrides=store, pipeline="p", image="i")
    summary = _art(Markdown, tmp_path / "summary.md")
    reporting.report.python_func(
        pretrained=_art(Model, tmp_path / "pretrained"),
        summary=summary,
        config=TINY,
        overrides=store,
        register_prefix="t",
        retrieval_results=_results(tmp_path / "eval", {"t2v_r1": 40.0, "t2v_r5": 80.0}),
        retrieval_model=_fake_model(tmp_path / "tuned"),
        retrieval_index=_index(tmp_path / "index", {"total": 7, "split": "test"}),
    )
    text = Path(summary.path).read_text()
    assert "| retrieval | t2v_r1 | 40.0000 | t-retrieval/1 |" in text
    assert f"clip index: `{tmp_path / 'index'}` (7 clips of the test split)" in text  # the run's index, listed
    cfg = _cfg(store)
    version = tracking.resolve_model(cfg, "t-retrieval@candidate")
    assert tracking.version_metrics(version) == {"t2v_r1": 40.0, "t2v_r5": 80.0}
    parent = tracking.client(cfg).get_run(tracking.find_pipeline_run(cfg, "k-1"))
    assert parent.data.metrics["retrieval.t2v_r1"] == 40.0

    fetched = _art(Model, tmp_path / "fetched")
    reporting.fetch_model.python_func(model_ref="t-retrieval/1", model=fetched, config=TINY, overrides=store)
    assert (tmp_path / "fetched" / "checkpoints" / "w.safetensors").read_bytes() == b"\0" * 16
    assert fetched.metadata["version"] == "1"
    table, metrics = _art(Markdown, tmp_path / "cmp.md"), _art(Metrics, tmp_path / "m")
    new = _results(tmp_path / "eval2", {"t2v_r1": 45.0, "t2v_r5": 70.0})
    monkeypatch.setenv(_runtime.RUN_ID_ENV, "k-2")  # as the pod's run-id label / local_run set it
    common = {"config": TINY, "overrides": store}
    reporting.compare_scores.python_func(
        task="retrieval", model=fetched, results=new, summary=table, metrics=metrics, **common
    )
    text = Path(table.path).read_text()
    assert "| t2v_r1 | 40.0000 | 45.0000 | +5.0000 |" in text and "| t2v_r5 | 80.0000 | 70.0000 | -10.0000 |" in text
    assert metrics.metadata == {"t2v_r1": 45.0, "t2v_r5": 70.0}
    assert tracking.version_metrics(tracking.resolve_model(cfg, "t-retrieval"), "last_eval.") == {
        "t2v_r1": 45.0,
        "t2v_r5": 70.0,
    }


def test_a_model_output_without_data_root_warns_in_a_cluster_pod_only(tmp_path, monkeypatch, capsys):
    model, dataset = _art(Model, tmp_path / "model"), _art(Dataset, tmp_path / "data")
    assert _runtime.output_location(model) == model.path
    assert capsys.readouterr().err == "", "kfp.local sets no KFP_POD_NAME: nothing to warn about"
    monkeypatch.setenv("KFP_POD_NAME", "vlp-pretrain-abc")
    _runtime.output_location(dataset)
    assert capsys.readouterr().err == "", "only training outputs (Model) hold checkpoints"
    _runtime.output_location(model)
    assert "checkpoints of 'model' stay in this pod" in capsys.readouterr().err
    assert _runtime.output_location(model, "s3://bkt/vlp").startswith("s3://bkt/vlp/")
    assert capsys.readouterr().err == ""


def test_an_index_names_durable_inputs_and_its_output_points_at_the_uri_given(tmp_path):
    """What index_clips records and publishes: inputs by the URI a later `vlp search` can reach (the data_root
    pointer, an imported s3:// URI rather than KFP's pod-local copy of it), the index where index_uri says, and the
    summary's counts on the artifact and as KFP metrics."""
    pointed = _art(Model, tmp_path / "kfp" / "run-1" / "finetune-retrieval" / "model")
    assert _runtime.output_location(pointed, "s3://bkt/vlp") == "s3://bkt/vlp/run-1/finetune-retrieval/model"
    assert _runtime.source_location(pointed) == "s3://bkt/vlp/run-1/finetune-retrieval/model"
    imported = Dataset(name="frames", uri="s3://bkt/testsets/frames")  # what dsl.importer gives the step
    assert _runtime.location(imported) == imported.path != imported.uri  # KFP's copy, inside the pod
    assert _runtime.source_location(imported) == "s3://bkt/testsets/frames"
    local = _art(Dataset, tmp_path / "frames")
    assert _runtime.source_location(local) == local.path == str(tmp_path / "frames")

    index, where = _art(Artifact, tmp_path / "kfp" / "index"), str(tmp_path / "indexes" / "msrvtt")
    assert _runtime.output_location(index, "s3://bkt/vlp", where + "/") == where  # index_uri wins over data_root
    assert _runtime.location(index) == where == index.metadata["uri"]
    summary = {"index": where, "added": 3, "skipped": 1, "total": 4, "tokens_stored": True, "ann": False,
               "split": "test", "dataset": "s3://bkt/ds", "seconds": 1.5}  # fmt: skip
    metrics = _art(Metrics, tmp_path / "m")
    published = _runtime.publish_index(summary, index, metrics)
    assert published == {"uri": where, "added": 3, "skipped": 1, "total": 4, "tokens_stored": True, "ann": False,
                         "split": "test"}  # fmt: skip
    assert index.metadata == published
    assert metrics.metadata == {"added": 3.0, "skipped": 1.0, "total": 4.0}
    assert json.loads(Path(metrics.path).read_text()) == metrics.metadata  # a file, or kfp.local's cache misses
    whole_store = _runtime.publish_index({**summary, "split": None}, _art(Artifact, tmp_path / "i2"), metrics)
    assert "split" not in whole_store


def test_publish_eval_fills_the_kfp_artifacts(tmp_path):
    out = _results(tmp_path / "res", {"accuracy": 0.5, "acc_color": 0.25}).path
    (Path(out) / "report.md").write_text("# QA\n")
    metrics, md, html = (
        _art(Metrics, tmp_path / "m"),
        _art(Markdown, tmp_path / "r.md"),
        _art(HTML, tmp_path / "r.html"),
    )
    assert _runtime.publish_eval(out, metrics, md, html) == {"accuracy": 0.5, "acc_color": 0.25}
    assert metrics.metadata == {"accuracy": 0.5, "acc_color": 0.25}
    assert json.loads(Path(metrics.path).read_text()) == metrics.metadata  # a file, or kfp.local's cache misses
    assert Path(md.path).read_text() == "# QA\n"
    assert "not written" in Path(html.path).read_text()


@pytest.mark.slow
def test_training_chain_through_the_components(tiny_world, tmp_path, store, monkeypatch):
    ds, fr = _art(Dataset, Path(tiny_world["dataset"])), _art(Dataset, Path(tiny_world["frames"]))
    monkeypatch.setenv(_runtime.RUN_ID_ENV, "k-3")  # as the pod's run-id label / local_run set it
    common = {"config": TINY, "overrides": store}
    entities, prompter = _art(Dataset, tmp_path / "entities"), _art(Model, tmp_path / "prompter")
    bank, model = _art(Model, tmp_path / "bank"), _art(Model, tmp_path / "model")
    data.mine_entities.python_func(dataset=ds, entities=entities, **common)
    training.pretrain_prompter.python_func(dataset=ds, frames=fr, prompter=prompter, **common)
    training.build_prompt_bank.python_func(prompter=prompter, entities=entities, bank=bank, **common)
    training.pretrain.python_func(dataset=ds, frames=fr, prompter=prompter, bank=bank, model=model, **common)
    assert (tmp_path / "model" / "model.json").is_file()
    runs = {r.info.run_name: r for r in _runs(store)}
    assert runs["pretrain"].info.status == "FINISHED"
    lines = [json.loads(x) for x in (tmp_path / "model" / "metrics.jsonl").read_text().splitlines()]
    curve = {m["step"]: m["train/loss_vtm"] for m in lines if "step" in m}
    history = tracking.client(_cfg(store)).get_metric_history(runs["pretrain"].info.run_id, "train/loss_vtm")
    assert curve and {m.step: m.value for m in history} == curve  # the training curves went into the step run
    tuned = _art(Model, tmp_path / "tuned")
    training.finetune_retrieval.python_func(dataset=ds, frames=fr, pretrained=model, model=tuned, **common)
    outs = {n: _art(c, tmp_path / n) for n, c in (("res", Artifact), ("m", Metrics), ("md", Markdown), ("html", HTML))}
    evaluation.evaluate_retrieval.python_func(
        dataset=ds, frames=fr, model=tuned, results=outs["res"], metrics=outs["m"], report_md=outs["md"],
        report_html=outs["html"], **common,
    )  # fmt: skip
    written = json.loads((Path(outs["res"].path) / "metrics.json").read_text())
    assert outs["m"].metadata == tracking.numeric_leaves(written) and "t2v_r1" in written
    report = (Path(outs["res"].path) / "report.md").read_text()
    assert Path(outs["md"].path).read_text() == report and "was not written" not in report  # the step's report


@pytest.mark.slow
@pytest.mark.parametrize("family", ["albef", "ts2net"])
def test_another_family_is_registered_and_re_evaluated_like_alpro(tiny_world, tmp_path, store, family, monkeypatch):
    """ALBEF (pretrain without a prompter) and TS2-Net (no pre-training: fine-tuned from its named weights) through
    the components: fine-tune, register, fetch, re-evaluate."""
    ds, fr = _art(Dataset, Path(tiny_world["dataset"])), _art(Dataset, Path(tiny_world["frames"]))
    monkeypatch.setenv(_runtime.RUN_ID_ENV, f"k-{family}")  # as the pod's run-id label / local_run set it
    common = {"config": TINY, "overrides": [*store, "model.albef.queue_size=8"]}
    reporting.start_run.python_func(**common, pipeline=f"vlp-{family}", image="i")
    model, tuned = _art(Model, tmp_path / "model"), _art(Model, tmp_path / "tuned")
    if family == "albef":
        training.pretrain.python_func(dataset=ds, frames=fr, model=model, family="albef", **common)
        assert json.loads((tmp_path / "model" / "model.json").read_text())["kind"] == "albef"
        training.finetune_retrieval.python_func(dataset=ds, frames=fr, pretrained=model, model=tuned, **common)
    else:
        model = None
        training.finetune_retrieval.python_func(dataset=ds, frames=fr, model=tuned, family=family, **common)
    outs = {n: _art(c, tmp_path / n) for n, c in (("res", Artifact), ("m", Metrics), ("md", Markdown), ("html", HTML))}
    evaluation.evaluate_retrieval.python_func(
        dataset=ds, frames=fr, model=tuned, results=outs["res"], metrics=outs["m"], report_md=outs["md"],
        report_html=outs["html"], **common,
    )  # fmt: skip
    summary = _art(Markdown, tmp_path / "summary.md")
    reporting.report.python_func(
        pretrained=model, summary=summary, register_prefix="a", retrieval_results=outs["res"],
        retrieval_model=tuned, **common,
    )  # fmt: skip
    fetched = _art(Model, tmp_path / "fetched")
    reporting.fetch_model.python_func(
        model_ref="a-retrieval@candidate", model=fetched, config=TINY, overrides=common["overrides"]
    )
    assert json.loads((tmp_path / "fetched" / "model.json").read_text())["kind"] == f"{family}_retrieval"
    again = {n: _art(c, tmp_path / f"{n}2") for n, c in (("res", Artifact), ("m", Metrics), ("md", Markdown),
                                                         ("html", HTML))}  # fmt: skip
    evaluation.evaluate_retrieval.python_func(
        dataset=ds, frames=fr, model=fetched, results=again["res"], metrics=again["m"], report_md=again["md"],
        report_html=again["html"], **common,
    )  # fmt: skip
    table, metrics = _art(Markdown, tmp_path / "cmp.md"), _art(Metrics, tmp_path / "cmp")
    reporting.compare_scores.python_func(
        task="retrieval", model=fetched, results=again["res"], summary=table, metrics=metrics, **common
    )
    first = json.loads((Path(outs["res"].path) / "metrics.json").read_text())
    second = json.loads((Path(again["res"].path) / "metrics.json").read_text())
    assert second == first  # the registered weights score exactly what the fine-tuned model scored
    assert f"| t2v_r1 | {first['t2v_r1']:.4f} | {second['t2v_r1']:.4f} | +0.0000 |" in Path(table.path).read_text()


@pytest.mark.parametrize(
    "secret",
    [
        {"storage": {"secret_access_key": "SENTINEL-s3cr3t"}},
        {"storage": {"access_key_id": "AKIASENTINEL"}},
        {"tracking": {"tracking_uri": "http://vlp-steps:SENTINEL-pw@vlp-mlflow:5000"}},
    ],
)
@pytest.mark.parametrize("given_as", ["text", "file"])
def test_a_cluster_pod_refuses_credentials_in_the_loaded_config(monkeypatch, tmp_path, secret, given_as):
    """The `config` run parameter (YAML text, shown in the KFP UI, copied into a TrainJob's env) or a config file
    holding a credential is refused in a cluster pod, before any step work; kfp.local and tests may use one."""
    import yaml

    text = Path(TINY).read_text(encoding="utf-8") + yaml.safe_dump(secret)
    config = text
    if given_as == "file":
        config = str(tmp_path / "secret.yaml")
        Path(config).write_text(text, encoding="utf-8")
    cfg, _ = _runtime.load_step_config(config, [])  # off a cluster: allowed
    assert "SENTINEL" in str(cfg.storage) + cfg.tracking.tracking_uri
    monkeypatch.setenv("KFP_POD_NAME", "run-pod-1")
    key = next(f"{section}.{k}" for section, values in secret.items() for k in values)
    monkeypatch.setenv(_runtime.RUN_ID_ENV, "k")
    with pytest.raises(ValueError, match=f"credentials in the step config \\({key}\\)") as refused:
        reporting.start_run.python_func(config=config, overrides=[], pipeline="p", image="i")
    assert "SENTINEL" not in str(refused.value)
    with pytest.raises(ValueError, match="credentials in the step config"):
        _runtime.Step("ingest", config, ["frames.size=8"])
    emptied = [f"{key}="] if "tracking" not in key else [f"{key}=http://vlp-mlflow:5000"]
    assert _runtime.load_step_config(config, emptied)[0]  # an override that clears the key makes it acceptable


def test_credentials_never_reach_a_cluster_pods_overrides_or_printed_lines(monkeypatch, capsys, store):
    """In a KFP pod (KFP_POD_NAME set) credential overrides are refused; a printed torchrun line and a printed
    tracking URI never show a secret."""
    from vlp.config import credential_overrides, redact_overrides

    secret = ["storage.secret_access_key=SENTINEL-s3cr3t", "tracking.tracking_uri=http://u:SENTINEL-pw@mlflow:5000"]
    assert credential_overrides([*secret, "storage.access_key_id=", "frames.size=8"]) == [
        "storage.secret_access_key", "tracking.tracking_uri"]  # fmt: skip
    assert "SENTINEL" not in " ".join(redact_overrides(["vlp.cli", *secret, "frames.size=8"]))
    _runtime.load_step_config(TINY, secret)  # off a cluster (kfp.local, tests): allowed
    monkeypatch.setenv("KFP_POD_NAME", "run-pod-1")
    with pytest.raises(ValueError, match="visible in the KFP UI") as refused:
        _runtime.load_step_config(TINY, ["frames.size=8", secret[0]])
    assert "SENTINEL" not in str(refused.value)
    monkeypatch.delenv("KFP_POD_NAME")
    step = _runtime.Step("pretrain", TINY, ["storage.secret_access_key=SENTINEL-s3cr3t"], nproc=2)
    monkeypatch.setattr(_runtime.subprocess, "run", lambda *a, **k: None)
    monkeypatch.setattr(_runtime, "read_json", lambda *a: None)
    from vlp import storage

    monkeypatch.setattr(storage, "read_text", lambda uri: "{}")
    step._torchrun(["pretrain", "--out", "/tmp/x"], "/tmp/x")
    printed = capsys.readouterr().out
    assert printed.startswith("+ ") and "storage.secret_access_key=***" in printed and "SENTINEL" not in printed
    from vlp.tracking_auth import redact

    assert redact("http://u:SENTINEL-pw@mlflow:5000") == "http://u:***@mlflow:5000"


def test_a_step_prints_its_start_up_from_its_process_start(tmp_path):
    """The start-up line: the seconds from the step process's start (Linux ``/proc``) to its work, which a step
    pod's log shows; a process that idled 0.6 s before its work reports at least that."""
    import os
    import re
    import subprocess
    import sys

    code = (f"import time; time.sleep(0.6); from components import _runtime; "
            f"_runtime.Step('toy', {TINY!r}, ['tracking.tracking_uri=']).run(lambda cfg: {{'done': 1}})")  # fmt: skip
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != _runtime.TRACKING_ENV}  # untracked: the line alone
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                         env=env).stdout  # fmt: skip
    found = re.fullmatch(r"toy: start-up ([0-9.]+) s \(process start to the step's work\)\n", out)
    assert found, out
    assert 0.6 <= float(found[1]) < 0.6 + 30
    assert 0.0 <= _runtime.process_age() < 3600  # this test process: started before the test, not before boot
