"""A clip index saved as an MLflow pyfunc model (vlp.index.pyfunc): loaded with ``mlflow.pyfunc.load_model`` it
ranks as ``vlp search`` does, from its own copies of the index and model; a real ``mlflow models serve`` process
answers JSON queries with the same hits, and a bad query with HTTP 400."""

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

from test_index import captions, config, save_model
from vlp.index.build import index_clips
from vlp.index.pyfunc import COLUMNS, save
from vlp.index.query import Searcher
from vlp.models.tokenizer import train_wordpiece

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
    pyfunc_dir = save(str(root / "pyfunc"), str(root / "index"), overrides=["retrieval.rerank_k=64",
                                                                              "index.candidates=64"])  # fmt: skip
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
