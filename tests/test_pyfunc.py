"""vlp's models as MLflow pyfunc models (vlp.index.pyfunc): a clip index with its model, loaded with
``mlflow.pyfunc.load_model``, ranks as ``vlp search`` does from its own copies of the index and model, and a real
``mlflow models serve`` process answers JSON queries with the same hits (a bad query: HTTP 400); a QA model answers
as ``vlp answer`` does; either directory is still the vlp model directory it was copied from."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from test_answer import _save as save_qa_model
from test_index import FULL, TINY, captions, config, save_model
from vlp.index.answer import Answerer
from vlp.index.pyfunc import COLUMNS, QA_COLUMNS, save, save_qa
from vlp.index.query import Searcher
from vlp.models.tokenizer import train_wordpiece
from vlp.steps.index import index_clips

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tiny_world, tmp_path_factory) -> dict[str, Any]:
    """An ALPRO model (random init) and the index of every clip of the tiny world, then its pyfunc model; the
    originals are moved away afterwards, so the pyfunc model can only use its own copies."""
    root = tmp_path_factory.mktemp("pyfunc")
    tok = train_wordpiece(captions(tiny_world["dataset"], "train"), vocab_size=300)
    model = save_model(root / "model", "alpro", tok)
    cfg = config()
    index_clips(model, tiny_world["frames"], str(root / "index"), cfg)
    texts = captions(tiny_world["dataset"], "test")[:2]
    searcher = Searcher(str(root / "index"), cfg)
    expected = {(text, k): [h.as_dict() for h in searcher.search(text, k)] for text in texts for k in (3, 5)}
    pyfunc_dir = save(str(root / "pyfunc"), str(root / "index"), cfg)
    for name in ("model", "index"):
        shutil.move(str(root / name), str(root / f"{name}-moved"))
    return {"path": pyfunc_dir, "texts": texts, "expected": expected, "cfg": cfg, "frames": tiny_world["frames"]}


def test_the_saved_directory_is_still_the_vlp_model_directory(built, tmp_path) -> None:
    from vlp.models import directory

    info = directory.describe(built["path"])
    assert info.kind == "alpro_retrieval" and info.family.name == "alpro"
    again = index_clips(built["path"], built["frames"], str(tmp_path / "index"), built["cfg"])  # a vlp step reads it
    assert again["added"] == 20


def _hits(frame: pd.DataFrame, query: int) -> list[dict[str, Any]]:
    rows = frame[frame["query"] == query].drop(columns="query").to_dict("records")
    return [{**r, "score": None if r["score"] is None or r["score"] != r["score"] else r["score"]} for r in rows]


def _close(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [h["video_id"] for h in got] == [h["video_id"] for h in want]
    assert [h["rank"] for h in got] == [h["rank"] for h in want]
    for g, w in zip(got, want, strict=True):
        assert g["similarity"] == pytest.approx(w["similarity"], abs=1e-5)
        assert (g["score"] is None) == (w["score"] is None)
        if w["score"] is not None:
            assert g["score"] == pytest.approx(w["score"], abs=1e-5)


def test_the_loaded_model_ranks_as_vlp_search_from_its_own_copies(built) -> None:
    model = mlflow.pyfunc.load_model(built["path"])
    a, b = built["texts"]
    frame = model.predict(pd.DataFrame({"text": [a, b], "k": [3, 5]}))
    assert list(frame.columns) == COLUMNS
    _close(_hits(frame, 0), built["expected"][(a, 3)])
    _close(_hits(frame, 1), built["expected"][(b, 5)])
    fewer = mlflow.pyfunc.load_model(built["path"], model_config={"overrides": ["retrieval.rerank_k=2"]})
    scored = fewer.predict(pd.DataFrame({"text": [a], "k": [5]}))["score"]
    assert scored.notna().sum() == 2, "a loader's override changes the saved config"
    one = model.predict(pd.DataFrame({"text": [a]}))  # k defaults to 10: more than the 5 asked above
    assert len(one) == 10 and _hits(one, 0)[:5] == _hits(model.predict(pd.DataFrame({"text": [a], "k": [5]})), 0)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (pd.DataFrame({"query": ["a red star"]}), "missing inputs ['text']"),  # the signature's check
        (pd.DataFrame({"text": ["a"], "k": [2.5]}), "Failed to enforce schema"),  # the signature's check
        (pd.DataFrame({"text": ["  "]}), "query 0: the query is empty"),
        (pd.DataFrame({"text": ["a", "b"], "k": [3, 1001]}), "query 1: k must be an integer in 1..1000"),
    ],
)
def test_a_bad_query_is_an_invalid_parameter_error(built, bad: pd.DataFrame, says: str) -> None:
    model = mlflow.pyfunc.load_model(built["path"])
    with pytest.raises(MlflowException) as err:
        model.predict(bad)
    assert says in err.value.message
    assert err.value.error_code in ("INVALID_PARAMETER_VALUE", "BAD_REQUEST")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_mlflow_models_serve_answers_json_queries_with_the_same_hits(built, tmp_path) -> None:
    port = _free_port()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }  # its uvicorn
    mlflow_cli = [sys.executable, "-m", "mlflow", "models", "serve", "-m", built["path"], "--env-manager", "local",
                  "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(mlflow_cli, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow models serve did not answer /ping in 180 s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        a, b = built["texts"]
        status, body = _post(f"http://127.0.0.1:{port}/invocations",
                             {"dataframe_records": [{"text": a, "k": 3}, {"text": b, "k": 5}]})  # fmt: skip
        assert status == 200, body
        frame = pd.DataFrame(body["predictions"])
        _close(_hits(frame, 0), built["expected"][(a, 3)])
        _close(_hits(frame, 1), built["expected"][(b, 5)])
        status, body = _post(f"http://127.0.0.1:{port}/invocations", {"dataframe_records": [{"text": ""}]})
        assert status == 400 and "the query is empty" in body["message"], body
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def test_a_qa_model_answers_as_vlp_answer_does_and_refuses_what_it_cannot_read(tiny_world, tmp_path) -> None:
    from vlp.data import manifest
    from vlp.data.video_text import normalize_answer
    from vlp.eval.qa import build_answer_vocab
    from vlp.models import directory, family

    qa = manifest.read(tiny_world["dataset"], manifest.QA, manifest.QA_SCHEMA).to_pylist()
    tok = train_wordpiece([r["question"] for r in qa] + [r["answer"] for r in qa], vocab_size=300)
    answers = build_answer_vocab([normalize_answer(r["answer"]) for r in qa if r["split"] == "train"], 40)
    model = save_qa_model(tmp_path / "qa", "alpro", family.get("alpro").kinds.qa, tok, answers)
    cfg = config("qa.num_workers=0")
    asked = [(r["video_id"], r["question"]) for r in qa if r["split"] == "test"][:2]
    expected = [[a.as_dict() for a in Answerer(model, cfg, frames=tiny_world["frames"]).answer(v, q, 3)]
                for v, q in asked]  # fmt: skip
    path = save_qa(str(tmp_path / "qa-mlflow"), model, cfg, tiny_world["frames"])
    assert directory.describe(path).kind == directory.describe(model).kind
    loaded = mlflow.pyfunc.load_model(path)
    frame = loaded.predict(pd.DataFrame({"clip": [v for v, _ in asked], "question": [q for _, q in asked], "k": 3}))
    assert list(frame.columns) == QA_COLUMNS
    for i, want in enumerate(expected):
        got = frame[frame["query"] == i].drop(columns="query").to_dict("records")
        assert [g["answer"] for g in got] == [w["answer"] for w in want] and len(got) == 3
        assert [g["probability"] for g in got] == pytest.approx([w["probability"] for w in want], abs=1e-6)
    for bad, says in [({"clip": "no-such-clip", "question": "what colour?"}, "query 0: the frames store"),
                      ({"clip": asked[0][0], "question": " "}, "query 0: the question is empty")]:  # fmt: skip
        with pytest.raises(MlflowException) as err:
            loaded.predict(pd.DataFrame([bad]))
        assert says in err.value.message and err.value.error_code == "INVALID_PARAMETER_VALUE"
    with pytest.raises(ValueError, match="finetune-qa"):
        save_qa(str(tmp_path / "not-qa"), save_model(tmp_path / "retrieval", "alpro", tok), cfg)


def test_a_pipeline_report_registers_models_that_load_with_mlflow_pyfunc(tiny_world, tmp_path, monkeypatch) -> None:
    """The report component registers the run's retrieval model with its clip index, and its QA model, as MLflow
    pyfunc models: ``models:/<name>/<version>`` loads and answers as ``vlp search`` / ``vlp answer`` do."""
    from kfp.dsl import Artifact, Markdown, Model

    from components import _runtime, reporting
    from vlp import tracking
    from vlp.data import manifest
    from vlp.data.video_text import normalize_answer
    from vlp.eval.qa import build_answer_vocab
    from vlp.models import family

    def art(cls: Any, path: Path) -> Any:
        return cls(name=path.name, uri=str(path))

    def results(path: Path, metrics: dict[str, float]) -> Any:
        path.mkdir(parents=True)
        (path / "metrics.json").write_text(json.dumps(metrics))
        return art(Artifact, path)

    qa = manifest.read(tiny_world["dataset"], manifest.QA, manifest.QA_SCHEMA).to_pylist()
    texts = [r["question"] for r in qa] + [r["answer"] for r in qa] + captions(tiny_world["dataset"], "train")
    tok = train_wordpiece(texts, vocab_size=300)
    answers = build_answer_vocab([normalize_answer(r["answer"]) for r in qa if r["split"] == "train"], 40)
    retrieval = save_model(tmp_path / "retrieval", "alpro", tok)
    qa_model = save_qa_model(tmp_path / "qa", "alpro", family.get("alpro").kinds.qa, tok, answers)
    cfg = config("qa.num_workers=0")
    index_clips(retrieval, tiny_world["frames"], str(tmp_path / "index"), cfg)
    uri = tracking.sqlite_uri(tmp_path)
    store = [f"tracking.tracking_uri={uri}", "tracking.experiment=pyfunc"]
    monkeypatch.setenv(_runtime.RUN_ID_ENV, "k-pyfunc")
    reporting.start_run.python_func(config=str(TINY), overrides=store, pipeline="p", image="i")
    reporting.report.python_func(
        pretrained=art(Model, tmp_path / "pretrained"), summary=art(Markdown, tmp_path / "summary.md"),
        config=str(TINY), overrides=[*store, *FULL, "qa.num_workers=0"], register_prefix="t",
        retrieval_results=results(tmp_path / "eval", {"t2v_r1": 40.0}), retrieval_model=art(Model, Path(retrieval)),
        qa_results=results(tmp_path / "qa-eval", {"accuracy": 20.0}), qa_model=art(Model, Path(qa_model)),
        retrieval_index=art(Artifact, tmp_path / "index"),
    )  # fmt: skip
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # models:/ resolves here; the env, not mlflow's process-wide
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)  # setters, which would leak into every later test's client
    text = captions(tiny_world["dataset"], "test")[0]
    want = [h.as_dict() for h in Searcher(str(tmp_path / "index"), cfg).search(text, 4)]
    _close(_hits(mlflow.pyfunc.load_model("models:/t-retrieval/1").predict(pd.DataFrame({"text": [text], "k": [4]})),
                 0), want)  # fmt: skip
    clip, question = next((r["video_id"], r["question"]) for r in qa if r["split"] == "test")
    expected = Answerer(qa_model, cfg, frames=tiny_world["frames"]).answer(clip, question, 3)
    answerer = mlflow.pyfunc.load_model("models:/t-qa/1", model_config={"frames": tiny_world["frames"]})
    got = answerer.predict(pd.DataFrame({"clip": [clip], "question": [question], "k": [3]}))
    assert list(got["answer"]) == [a.answer for a in expected]
    assert list(got["probability"]) == pytest.approx([a.probability for a in expected], abs=1e-6)
