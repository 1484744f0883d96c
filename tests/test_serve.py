"""``vlp serve`` (issue 26): the real server, started as ``python -m vlp.cli serve`` on a free loopback port over a
tiny ALPRO index, queried over HTTP: the Open Inference Protocol v2 and v1 routes rank as :class:`Searcher` ranks
in this process, the JSON API and its OpenAPI spec, one-line 4xx answers to bad requests, and SIGTERM / SIGINT
stopping it with the CLI's exit codes. ``POST /api/answer`` is checked in this process on a plain FastAPI app with
the same routes and a small answerer defined here (answers computed from the question's words, not a QA model)."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from test_index import TINY, captions, save_model
from vlp.cli import main
from vlp.config import Config, load_config
from vlp.index.query import Searcher
from vlp.index.store import ClipIndex
from vlp.models.tokenizer import train_wordpiece
from vlp.steps.index import index_clips

ROOT = Path(__file__).resolve().parents[1]
# re-ranking stops at the third candidate, so hits past it have no score (null / NaN on the wire)
OVERRIDES = ["retrieval.rerank_k=3", "index.candidates=64", "retrieval.num_workers=0"]
NAME = "vlp-search"
LIMIT = "at most 1000 are taken (index.max_text_chars)"
LISTENING = re.compile(r"vlp serve: listening on (http://127\.0\.0\.1:\d+)")


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread for the module


def config() -> Config:
    return load_config(TINY, OVERRIDES)


def build_index(tiny_world: dict[str, str], root: Path) -> str:
    """A tiny ALPRO retrieval model (random init) and the index of every clip of the tiny world, under ``root``."""
    tok = train_wordpiece(captions(tiny_world["dataset"], "train"), vocab_size=300)
    model = save_model(root / "alpro", "alpro", tok)
    out = str(root / "index")
    assert index_clips(model, tiny_world["frames"], out, config())["added"] > 3
    return out


@pytest.fixture(scope="module")
def index(tiny_world, tmp_path_factory) -> str:
    return build_index(tiny_world, tmp_path_factory.mktemp("serve"))


# the module's server requires it (VLP_SERVE_TOKEN); "!" is a character uvicorn's access log would quote (%21)
TOKEN = "Tk0!Qz8Vr2.xW9kLm!pJ4nB7"


class Server:
    """``vlp serve`` in a subprocess, its log in a file; :attr:`url` once it listens. ``token``: its
    ``VLP_SERVE_TOKEN`` (None: unset)."""

    def __init__(self, log: Path, *args: str, sigint: Any = signal.SIG_DFL, token: str | None = None) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
        env.pop("VLP_SERVE_TOKEN", None)
        if token is not None:
            env["VLP_SERVE_TOKEN"] = token
        self.log = log
        with open(log, "wb") as fh:
            cmd = [sys.executable, "-m", "vlp.cli", "serve", *args, "--config", str(TINY), *OVERRIDES]
            # SIGINT as a shell gives it: default in the foreground, ignored in a background job; never what this
            # test process happens to have
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                         preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))  # fmt: skip

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait_listening(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = LISTENING.search(self.text())
            if found:
                self.url = found[1]
                return self.url
            if self.proc.poll() is not None:
                pytest.fail(f"vlp serve exited {self.proc.returncode}:\n{self.text()}")
            time.sleep(0.1)
        self.proc.kill()
        pytest.fail(f"vlp serve did not listen within {timeout} s:\n{self.text()}")

    def stop(self, sig: int, timeout: float = 30) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)


@pytest.fixture(scope="module")
def server(index, tmp_path_factory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("serve_log") / "serve.log", "--index", index, "--port", "0", token=TOKEN)
    srv.wait_listening()
    yield srv
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait(10)


def call(url: str, body: Any = None, auth: str | None = f"Bearer {TOKEN}", raw: bytes | None = None,
         method: str | None = None) -> tuple[int, Any, bytes]:  # fmt: skip
    """``(status, headers, body)`` of a GET, or of a POST of the JSON ``body`` (or of the bytes ``raw``), with the
    ``Authorization`` header ``auth`` (None: none)."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} | ({"Authorization": auth} if auth else {})
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def get_json(url: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
    status, headers, raw = call(url, body, **kwargs)
    assert headers.get("Content-Type", "").startswith("application/json"), (status, raw[:200])
    return status, json.loads(raw)


def v2(texts: list[str], k: int | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    if k is not None:
        body["parameters"] = {"k": k}
    return {**body, **extra}


def test_oip_v2_ranks_as_the_searcher_does(server, index, tiny_world):
    assert get_json(f"{server.url}/v2/models/{NAME}/ready") == (200, {"name": NAME, "ready": True})
    status, meta = get_json(f"{server.url}/v2/models/{NAME}")
    assert status == 200 and [i["name"] for i in meta["inputs"]] == ["text"]
    assert [o["name"] for o in meta["outputs"]] == ["video_id", "score", "similarity"]
    searcher = Searcher(index, config())
    queries = [captions(tiny_world["dataset"])[0], "a red star moving left over sand"]
    status, got = get_json(f"{server.url}/v2/models/{NAME}/infer", v2(queries, 5, id="req-1"))
    assert status == 200 and got["id"] == "req-1" and got["model_name"] == NAME
    out = {o["name"]: o for o in got["outputs"]}
    assert {name: (o["datatype"], o["shape"]) for name, o in out.items()} == {
        "video_id": ("BYTES", [2, 5]), "score": ("FP32", [2, 5]), "similarity": ("FP32", [2, 5])}  # fmt: skip
    for i, query in enumerate(queries):
        want = searcher.search(query, 5)
        row = slice(5 * i, 5 * i + 5)
        assert out["video_id"]["data"][row] == [h.video_id for h in want]
        assert out["similarity"]["data"][row] == pytest.approx([h.similarity for h in want], abs=1e-5)
        scores = out["score"]["data"][row]
        assert [s is None for s in scores] == [h.score is None for h in want] == [False] * 3 + [True] * 2
        assert scores[:3] == pytest.approx([h.score for h in want[:3]], abs=1e-5)
    # k defaults to 10; one text may come as shape [1]
    status, got = get_json(f"{server.url}/v2/models/{NAME}/infer", v2(queries[:1]))
    assert status == 200 and got["outputs"][0]["shape"] == [1, 10]
    assert got["outputs"][0]["data"] == [h.video_id for h in searcher.search(queries[0], 10)]


def test_oip_binary_outputs_carry_nan_where_a_hit_has_no_score(server, index):
    body = v2(["a blue square"], parameters={"k": 4, "binary_data_output": True})
    status, headers, raw = call(f"{server.url}/v2/models/{NAME}/infer", body)
    assert status == 200
    header = json.loads(raw[: int(headers["inference-header-content-length"])])
    sizes = {o["name"]: o["parameters"]["binary_data_size"] for o in header["outputs"]}
    start = len(raw) - sizes["score"] - sizes["similarity"]
    score = torch.frombuffer(bytearray(raw[start : start + sizes["score"]]), dtype=torch.float32).tolist()
    want = Searcher(index, config()).search("a blue square", 4)
    assert [math.isnan(s) for s in score] == [h.score is None for h in want] == [False, False, False, True]
    assert score[:3] == pytest.approx([h.score for h in want[:3]], abs=1e-5)


def test_v1_predict_returns_each_instances_hits(server, index):
    searcher = Searcher(index, config())
    body = {"instances": [{"text": "a green circle", "k": 2}, {"text": "a red star"}]}
    status, got = get_json(f"{server.url}/v1/models/{NAME}:predict", body)
    assert status == 200 and [len(p) for p in got["predictions"]] == [2, 10]
    for prediction, (query, k) in zip(got["predictions"], [("a green circle", 2), ("a red star", 10)], strict=True):
        assert [h["video_id"] for h in prediction] == [h.video_id for h in searcher.search(query, k)]
        assert [h["rank"] for h in prediction] == list(range(1, k + 1))


def test_the_json_api_searches_and_shows_thumbnails(server, index):
    searcher = Searcher(index, config())
    query = "a yellow triangle moving up"
    status, got = get_json(f"{server.url}/api/search?" + urllib.parse.urlencode({"q": query, "k": 4}))
    assert status == 200 and got["query"] == query and got["k"] == 4
    want = searcher.search(query, 4)
    assert [h["video_id"] for h in got["hits"]] == [h.video_id for h in want]
    assert [h["score"] is None for h in got["hits"]] == [False, False, False, True]
    for hit, expected in zip(got["hits"], want, strict=True):
        assert hit["rank"] == expected.rank and hit["similarity"] == pytest.approx(expected.similarity, abs=1e-5)
    clip = want[0].video_id
    status, kind, jpeg = call(f"{server.url}/api/clips/{urllib.parse.quote(clip)}/thumbnail.jpg")
    assert status == 200 and kind["Content-Type"] == "image/jpeg" and jpeg == ClipIndex.open(index).thumbnail(clip)
    assert Image.open(io.BytesIO(jpeg)).format == "JPEG"
    health = {"status": "ok", "model": NAME, "qa_model": False, "clips": ClipIndex.open(index).count(),
              "family": "alpro", "kind": "alpro_retrieval"}  # fmt: skip
    assert get_json(f"{server.url}/healthz") == (200, health)


def test_a_clips_stored_frames_are_served_as_extract_frames_stored_them(server, index, tiny_world):
    from vlp.data.frames import FrameStore

    store = FrameStore(tiny_world["frames"])
    clip = sorted(ClipIndex.open(index).video_ids())[-1]
    quoted = urllib.parse.quote(clip, safe="")
    status, got = get_json(f"{server.url}/api/clips/{quoted}")
    stored = store.rows(clip, ["jpeg"]).column("jpeg").to_pylist()
    assert status == 200 and got == {
        "video_id": clip,
        "frames": [f"/api/clips/{quoted}/frames/{i}.jpg" for i in range(len(stored))],
    }
    for i in (0, len(stored) - 1):
        status, headers, jpeg = call(server.url + got["frames"][i])
        assert (status, headers["Content-Type"], jpeg) == (200, "image/jpeg", stored[i])
    assert get_json(f"{server.url}/api/clips/no-such-clip") == (
        404,
        {"error": "no clip 'no-such-clip' in the frames store of the index"},
    )
    status, body = get_json(f"{server.url}/api/clips/{quoted}/frames/{len(stored)}.jpg")
    assert status == 404 and body == {"error": f"clip {clip!r} has {len(stored)} stored frames; no frame {len(stored)}"}
    status, headers, html = call(f"{server.url}/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"<title>vlp search</title>" in html


def test_bad_requests_get_a_4xx_and_one_line(server):
    url = server.url
    search = f"{url}/api/search?"
    cases = [
        (search + "q=%20%20", 400, "the query is empty: give the text to search for"),
        (search + "q=star&k=0", 400, "k must be an integer in 1..1000, got 0"),
        (search + "q=star&k=1001", 400, "k must be an integer in 1..1000, got 1001"),
        (
            search + "q=star&k=many",
            422,
            "query k: Input should be a valid integer, unable to parse string as an integer",
        ),
        (search + "k=3", 422, "query q: Field required"),
        (search + "q=" + "a" * 1001, 400, f"the query is 1001 characters long; {LIMIT}"),
        (f"{url}/api/clips/no-such-clip/thumbnail.jpg", 404, "no clip 'no-such-clip' in the index"),
    ]
    for target, status, message in cases:
        assert get_json(target) == (status, {"error": message}), target
    answer = {"video_id": "v1", "question": "what color is the star?", "k": 3}
    assert get_json(f"{url}/api/answer", answer) == (
        404,
        {"error": "no QA model loaded: start vlp serve with --qa-model"},
    )
    big = {**answer, "question": "x" * (64 * 1024)}
    assert get_json(f"{url}/api/answer", big) == (413, {"error": "the request body is over 65536 bytes"})
    infer = f"{url}/v2/models/{NAME}/infer"
    assert get_json(infer, v2(["star " * 14000])) == (413, {"error": "the request body is over 65536 bytes"})
    wrong = {"inputs": [{"name": "query", "datatype": "BYTES", "shape": [1], "data": ["a star"]}]}
    assert get_json(infer, wrong) == (
        400,
        {"error": 'expected an input tensor "text" (BYTES, shape [n]: one query each)'},
    )
    numbers = {"inputs": [{"name": "text", "datatype": "INT32", "shape": [1], "data": [3]}]}
    assert get_json(infer, numbers) == (400, {"error": 'the input "text" must be BYTES, got INT32'})
    misshapen = v2(["a star", "a square"])
    misshapen["inputs"][0]["shape"] = [3]
    status, got = get_json(infer, misshapen)
    assert status == 400 and got == {"error": 'the input "text" does not hold as many texts as its shape [3] says'}
    assert get_json(infer, v2([""])) == (400, {"error": "the query is empty: give the text to search for"})
    assert get_json(infer, v2(["a star"], 0))[0] == 400
    assert get_json(infer, v2(["a star"] * 65)) == (400, {"error": "expected 1..64 texts, got 65"})
    assert get_json(f"{url}/v1/models/{NAME}:predict", {"instances": [{"k": 3}]}) == (
        400, {"error": 'each instance must be an object {"text": str, "k": int (optional)}'})  # fmt: skip
    status, got = get_json(f"{url}/v2/models/other/infer", v2(["a star"]))
    assert status == 404 and "other" in got["error"]
    status, got = get_json(infer, {"inputs": "nothing"})
    assert status == 422 and got["error"].startswith("body InferenceRequest inputs: Input should be a valid list")
    log = server.text()
    assert "GET /api/search: 400 k must be an integer in 1..1000, got 0" in log  # logged server-side
    assert "Internal Server Error" not in log and " 500 " not in log


def test_text_that_is_not_text_and_requests_that_are_not_http_get_one_line(server):
    """Lone surrogates in JSON strings (what a non-UTF-8 byte becomes), bodies that are not UTF-8 or not JSON, a
    request line over uvicorn's limits, an unknown route: 4xx and ``{"error": ...}`` each, never a 500."""
    url, infer = server.url, f"{server.url}/v2/models/{NAME}/infer"
    byte = "the query is not valid UTF-8: the byte 0x80 at character 2 is not text"
    assert get_json(infer, v2(["a \udc80 star"])) == (400, {"error": byte})
    nul = "the query holds a NUL byte (0x00) at character 1"  # in a body as in a query string: refused
    assert get_json(infer, v2(["a\x00b"])) == (400, {"error": nul})
    assert get_json(f"{url}/v1/models/{NAME}:predict", {"instances": [{"text": "a\x00b"}]}) == (400, {"error": nul})
    status, got = get_json(f"{url}/v1/models/{NAME}:predict", {"instances": [{"text": "a \udc80 star"}]})
    assert status == 400 and "surrogate" in got["error"], got  # KServe's JSON parser (orjson) refuses it first
    surrogate = f"{url}/api/search?q=" + urllib.parse.quote("a \ud800", errors="surrogatepass")  # %ED%A0%80
    assert get_json(surrogate) == (400, {"error": "the query parameter 'q' is not valid UTF-8: the byte 0xed at "
                                                  f"character 2 is not text {HINT}"})  # fmt: skip
    assert get_json(f"{url}/api/search?q=caf%C3%A9+au+lait&k=2")[1]["query"] == "café au lait"  # UTF-8: searched
    for raw in (b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["\xff"]}]}', b"{not json"):
        for target in (infer, f"{url}/v1/models/{NAME}:predict", f"{url}/api/answer"):
            status, headers, body = call(target, raw=raw)
            assert 400 <= status < 500 and headers["Content-Type"] == "application/json", (target, raw, body)
            assert list(json.loads(body)) == ["error"] and "\n" not in json.loads(body)["error"], (target, body)
    status, got = get_json(f"{url}/api/search?q=" + "a" * (1 << 20))
    assert status == 400 and got["error"].startswith("not a valid HTTP request"), got
    assert get_json(f"{url}/no/such/route") == (404, {"error": "Not Found"})
    assert get_json(f"{url}/api/search?q=star", raw=b"{}") == (405, {"error": "Method Not Allowed"})
    assert get_json(f"{url}/api/search?q=a+star&k=2")[0] == 200  # still serving
    log = server.text()
    assert "Traceback" not in log and " 500 " not in log and "TypeError" not in log


@pytest.mark.parametrize("shape", [[-1], [], [1, 1], [0], [2]], ids=str)
def test_oip_inputs_are_checked_against_the_declared_metadata(server, shape):
    infer = f"{server.url}/v2/models/{NAME}/infer"
    status, meta = get_json(f"{server.url}/v2/models/{NAME}")
    assert status == 200 and meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    body = v2(["a star"])
    body["inputs"][0]["shape"] = shape
    status, got = get_json(infer, body)
    assert status in (400, 422) and list(got) == ["error"], got
    if shape == [2]:
        assert got == {"error": 'the input "text" does not hold as many texts as its shape [2] says'}
    elif status == 400:
        assert got["error"] == f'the input "text" must have shape [n], n >= 1 (one query each); got {shape}'
    two = v2(["a star"])
    two["inputs"].append({"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a square"]})
    said = "expected one input tensor, \"text\" (BYTES, shape [n]); got 2: ['text', 'text']"
    assert get_json(infer, two) == (400, {"error": said})


HINT = "(a query parameter is text: UTF-8, percent-encoded)"
NOT_TEXT = {  # percent-encoded bytes a query parameter may not hold, and how the refusal names them
    "%ff": "is not valid UTF-8: the byte 0xff at character 1 is not text",  # never in UTF-8
    "%ED%B2%80": "is not valid UTF-8: the byte 0xed at character 1 is not text",  # a surrogate, U+DC80, as UTF-8
    "%C3%28": "is not valid UTF-8: the byte 0xc3 at character 1 is not text",  # a lead byte without its follower
    "%00": "holds a NUL byte (0x00) at character 1",
}


@pytest.fixture(scope="module")
def open_server(index, tmp_path_factory) -> Iterator[Server]:
    """The module's index served without a token (``VLP_SERVE_TOKEN`` unset); Ctrl-C stops it in the module's last
    test."""
    srv = Server(tmp_path_factory.mktemp("open_log") / "serve.log", "--index", index, "--port", "0")
    srv.wait_listening()
    yield srv
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait(10)


def every_route(server: Server, index: str) -> list[tuple[str, str]]:
    """``(method, path)`` of every route the server has (its OpenAPI spec's, its parameters filled in, and those the
    spec leaves out), and of one it does not have."""
    clip = urllib.parse.quote(sorted(ClipIndex.open(index).video_ids())[0], safe="")
    spec = get_json(f"{server.url}/openapi.json")[1]
    fill = {"{video_id}": clip, "{model_name}": NAME, "{slot}": "0", "{model_version}": "1"}
    routes = {("GET", "/"), ("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/no/such/route"),
              ("POST", f"/v2/repository/models/{NAME}/unload")}  # fmt: skip
    for path, methods in spec["paths"].items():
        for key, value in fill.items():
            path = path.replace(key, value)
        routes |= {(method.upper(), path) for method in methods}
    assert len(routes) > 20 and not [path for _, path in routes if "{" in path], routes
    return sorted(routes)


@pytest.mark.parametrize("auth", ["token", "token-not-sent", "no-token-configured"])
def test_a_query_string_that_is_not_text_is_refused_on_every_route(server, open_server, index, auth):
    """Each byte sequence, in a parameter's value and in its name, on every route: 400 and the text gate's line,
    checked on the bytes the client sent (before the framework makes them U+FFFD), and before the token check."""
    srv = open_server if auth == "no-token-configured" else server
    header = f"Bearer {TOKEN}" if auth == "token" else None
    for method, path in every_route(server, index):
        for bad, said in NOT_TEXT.items():
            for query, error in [(f"k=2&q=a{bad}b", f"the query parameter 'q' {said} {HINT}"),
                                 (f"a{bad}b=star", f"a query parameter's name {said} {HINT}")]:  # fmt: skip
                body = {} if method == "POST" else None
                status, headers, raw = call(f"{srv.url}{path}?{query}", body, auth=header, method=method)
                assert (status, json.loads(raw)) == (400, {"error": error}), (method, path, query, raw[:200])
                assert headers["Content-Type"] == "application/json"
    assert call(f"{srv.url}/api/search?q=a+star&k=2", auth=header)[0] == (401 if auth == "token-not-sent" else 200)
    assert f"GET /api/search: 400 the query parameter 'q' {NOT_TEXT['%00']}" in srv.text()


def test_the_gate_sees_the_parameters_the_routes_see():
    """:func:`vlp.serve.querystring.parameters` splits and decodes a query string as Starlette does, so the gate
    checks what a route reads; a credential in it is found by name or by value, and never shown."""
    from starlette.datastructures import QueryParams

    from vlp.serve.auth import in_url
    from vlp.serve.querystring import parameters

    for query in ["q=a+red+star&k=3", "q=caf%C3%A9", "a&&b=&=c&q=x%3Dy%26z", "q=%zz%2", "q=1;k=2", "q=a%2Bb+c"]:
        got = [(name.decode(), value.decode()) for name, value in parameters(query.encode())]
        assert got == QueryParams(query).multi_items(), query
    token = TOKEN.encode()
    quoted = urllib.parse.quote(TOKEN, safe="")
    for query, where in [("q=star&token=x", "the query parameter 'token'"), ("ACCESS_TOKEN=", "the query parameter "
                         "'ACCESS_TOKEN'"), (f"q={quoted}", "a query parameter holding the token"),
                         (f"{quoted}&q=star", "a query parameter holding the token"), ("q=star&k=2", None),
                         (f"q={quoted}x", None), ("tokens=1", None)]:  # fmt: skip
        assert in_url(query.encode(), token) == where, query


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_without_the_token_only_the_health_probes_answer(server):
    url = server.url
    for path in ("/healthz", "/v2/health/live", "/v2/health/ready"):
        assert call(url + path, auth=None)[0] == 200, path
    wrong = [None, "Bearer wrong-token-0123456789", "Bearer", basic("user", "wrong"), basic("", TOKEN[:-1]),
             "Basic !!not-base64", f"Token {TOKEN}", TOKEN]  # fmt: skip
    routes = [("/api/search?q=star", None), ("/", None), (f"/v2/models/{NAME}/infer", v2(["star"])),
              (f"/v1/models/{NAME}:predict", {"instances": [{"text": "star"}]}), ("/openapi.json", None),
              (f"/v2/models/{NAME}", None), ("/metrics", None), ("/api/answer", {"video_id": "v", "question": "q"}),
              (f"/v2/repository/models/{NAME}/unload", {})]  # fmt: skip
    for path, body in routes:
        for auth in wrong:
            status, headers, raw = call(url + path, body, auth=auth)
            assert status == 401 and headers["WWW-Authenticate"].startswith('Basic realm="vlp serve"'), (path, auth)
            assert json.loads(raw)["error"].endswith("send the token of VLP_SERVE_TOKEN as 'Authorization: Bearer "
                                                     "<token>' or as basic auth's password"), raw  # fmt: skip
    assert get_json(f"{url}/api/search?q=star&k=2", auth=basic("anyone", TOKEN))[0] == 200
    assert call(url + "/", auth=basic("", TOKEN))[0] == 200  # the page, as a browser asks for it
    assert "401 no credential" in server.text() and TOKEN not in server.text()


def test_two_authorization_headers_are_refused_whichever_holds_the_token(server):
    import http.client

    host, port = urllib.parse.urlsplit(server.url).netloc.split(":")
    wrong = "Bearer wrong-token-0123456789"
    for pair in [(f"Bearer {TOKEN}", wrong), (wrong, f"Bearer {TOKEN}"),
                 (f"Bearer {TOKEN}", f"Bearer {TOKEN}")]:  # fmt: skip
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.putrequest("GET", "/api/search?q=star")
        for value in pair:
            conn.putheader("Authorization", value)
        conn.endheaders()
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        assert (resp.status, body) == (
            400,
            {"error": "2 Authorization headers: send the token of VLP_SERVE_TOKEN in one"},
        )


SECRET_TEXT = "zebra umbrella quartz"  # searched for: no log line may show it


def test_no_log_line_shows_the_token_or_the_search_text(server):
    """The token sent every way a client may send it, the search text in queries: every request is in the server's
    log (method, path, status), and no line of it (the access log included) shows either, in any form."""
    url, quoted, q = server.url, urllib.parse.quote(TOKEN, safe=""), urllib.parse.quote_plus(SECRET_TEXT)
    bearer, in_url = f"Bearer {TOKEN}", "a credential in the URL ({}) is refused"
    sent = [  # how, target, Authorization, body, status, the error's start
        ("bearer header", f"/api/search?q={q}&k=2", bearer, None, 200, None),
        ("basic auth", f"/api/search?q={q}", basic("me", TOKEN), None, 200, None),
        ("?token=", f"/api/search?token={quoted}&q={q}", None, None, 400, in_url.format("the query parameter 'token'")),
        ("&access_token=", f"/api/search?q={q}&access_token={quoted}", None, None, 400,
         in_url.format("the query parameter 'access_token'")),
        ("?token= beside the header", f"/api/search?q={q}&token={quoted}", bearer, None, 400, None),
        ("on a health probe", f"/healthz?access_token={quoted}", None, None, 400, None),
        ("as the search text", f"/api/search?q={quoted}", bearer, None, 400,
         in_url.format("a query parameter holding the token")),
        ("as a parameter's name", f"/api/search?{quoted}&q={q}", bearer, None, 400, None),
        ("in the path", f"/api/clips/{quoted}/thumbnail.jpg", None, None, 401, "no credential"),
        ("in the path, with the header", f"/api/clips/{quoted}/thumbnail.jpg", bearer, None, 404, "no clip "),
        ("as the model's name", f"/v2/models/{quoted}/infer", bearer, v2([SECRET_TEXT]), 404, None),
        ("in a path no route has", f"/{quoted}", bearer, None, 404, "Not Found"),
        ("in the body", f"/v2/models/{NAME}/infer", bearer, v2([TOKEN, SECRET_TEXT]), 200, None),
        ("a wrong one", f"/api/search?q={q}", f"Bearer {TOKEN[1:]}", None, 401, "a wrong credential"),
        ("another scheme", f"/api/search?q={q}", f"Token {TOKEN}", None, 401, None),
    ]  # fmt: skip
    for how, target, auth, body, status, error in sent:
        got, _, raw = call(url + target, body, auth=auth)
        assert got == status, (how, raw[:300])
        if got == 400:
            assert "in the Authorization header, as 'Authorization: Bearer <token>'" in json.loads(raw)["error"], how
        if error:
            assert json.loads(raw)["error"].startswith(error), (how, raw[:300])
    assert get_json(f"{url}/healthz")[0] == 200
    time.sleep(0.5)  # KServe's timing lines come just after a response
    lines = server.text().splitlines()
    forms = [TOKEN, quoted, urllib.parse.quote(TOKEN), *re.findall(r"[A-Za-z0-9]{4,}", TOKEN), *SECRET_TEXT.split()]
    assert not [(form, line) for line in lines for form in forms if form in line]
    access = [line for line in lines if "uvicorn.access" in line]
    assert len(access) > len(sent) and not [line for line in access if "?" in line]
    for line in ['"GET /api/search HTTP/1.1" 200', '"GET /api/search HTTP/1.1" 400', '"GET /healthz HTTP/1.1" 400',
                 '"GET /api/clips/<VLP_SERVE_TOKEN>/thumbnail.jpg HTTP/1.1" 401',
                 '"POST /v2/models/<VLP_SERVE_TOKEN>/infer HTTP/1.1" 404']:  # fmt: skip
        assert line in server.text(), line


def test_no_route_takes_the_model_offline(server):
    """KServe's model-repository routes are not mounted: unload (and load) are 404, and the model keeps serving."""
    url = server.url
    for action in ("unload", "load"):
        assert get_json(f"{url}/v2/repository/models/{NAME}/{action}", {}) == (404, {"error": "Not Found"})
    assert get_json(f"{url}/v2/models/{NAME}/ready") == (200, {"name": NAME, "ready": True})
    assert get_json(f"{url}/healthz")[0] == 200
    status, got = get_json(f"{url}/v2/models/{NAME}/infer", v2(["a star"], 2))
    assert status == 200 and got["outputs"][0]["shape"] == [1, 2]


def test_a_token_is_taken_from_the_environment_and_checked():
    from vlp.serve.auth import presented, token_from

    assert token_from({}) is None
    assert token_from({"VLP_SERVE_TOKEN": TOKEN}) == TOKEN
    for bad, reason in [("", "set but empty"), ("short", "holds 5 characters: a token needs at least 16"),
                        ("a token with spaces", "not printable ASCII"),
                        ("t\u00f6ken-0123456789abcdef", "ASCII")]:  # fmt: skip
        with pytest.raises(ValueError, match=reason) as err:
            token_from({"VLP_SERVE_TOKEN": bad})
        assert not bad or bad not in str(err.value)
    assert presented(b"Bearer abc") == b"abc" and presented(b"bearer  abc ") == b"abc"
    assert presented(basic("u", "p:q").encode()) == b"p:q"  # a password may hold a colon; the user name may not
    assert presented(b"Basic " + base64.b64encode(b"no-colon")) is None
    assert presented(b"Digest abc") is None and presented(b"Bearer") is None


def test_the_openapi_spec_covers_the_routes(server):
    status, spec = get_json(f"{server.url}/openapi.json")
    assert status == 200 and spec["openapi"].startswith("3.")
    paths = spec["paths"]
    for path, method in [("/api/search", "get"), ("/api/clips/{video_id}/thumbnail.jpg", "get"),
                         ("/api/clips/{video_id}", "get"), ("/api/clips/{video_id}/frames/{slot}.jpg", "get"),
                         ("/api/answer", "post"), ("/healthz", "get"), ("/v2/models/{model_name}/infer", "post"),
                         ("/v2/models/{model_name}/ready", "get")]:  # fmt: skip
        assert method in paths.get(path, {}), path
    assert not [path for path in paths if path.startswith("/v2/repository")]  # not served: not in the spec either
    search = paths["/api/search"]["get"]
    assert {p["name"] for p in search["parameters"]} == {"q", "k"}
    assert {"200", "400", "422"} <= set(search["responses"])
    assert "image/jpeg" in paths["/api/clips/{video_id}/thumbnail.jpg"]["get"]["responses"]["200"]["content"]
    assert {"video_id", "question", "k"} <= set(spec["components"]["schemas"]["AnswerIn"]["properties"])


class WordAnswerer:
    """A small real answerer for the route: its answers are the question's words, longest first, with
    probabilities proportional to their lengths; it knows the clips it is given and refuses a question mark
    alone."""

    def __init__(self, clips: set[str]) -> None:
        self.clips = clips

    def answer(self, video_id: str, question: str, k: int) -> list[dict[str, Any]]:
        if video_id not in self.clips:
            raise KeyError(video_id)
        words = sorted({w.strip("?.,") for w in question.split()} - {""}, key=lambda w: (-len(w), w))
        if not words:
            raise ValueError("the question has no words")
        total = sum(len(w) for w in words)
        return [{"answer": w, "probability": len(w) / total} for w in words[:k]]


def test_the_answer_route_asks_the_answerer_it_is_given(index):
    """In this process: a plain FastAPI app with the routes, the real search model and :class:`WordAnswerer`."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from vlp.serve.api import add_routes
    from vlp.serve.model import SearchModel

    model = SearchModel(index, config())
    model.load()
    clip = sorted(ClipIndex.open(index).video_ids())[0]
    app = FastAPI()
    add_routes(app, model, WordAnswerer({clip}))
    with TestClient(app) as client:
        got = client.post("/api/answer", json={"video_id": clip, "question": "what colour is the star?", "k": 2})
        assert got.status_code == 200
        assert got.json() == {"video_id": clip, "question": "what colour is the star?",
                              "answers": [{"answer": "colour", "probability": pytest.approx(6 / 19)},
                                          {"answer": "star", "probability": pytest.approx(4 / 19)}]}  # fmt: skip
        assert client.post("/api/answer", json={"video_id": clip, "question": "why"}).json()["answers"] == [
            {"answer": "why", "probability": 1.0}]  # fmt: skip
        for body, status, message in [
            ({"video_id": "nope", "question": "why?"}, 404, "the QA model has no clip 'nope'"),
            ({"video_id": clip, "question": " ? "}, 400, "the question has no words"),
            ({"video_id": clip, "question": ""}, 400, "the question is empty: give the question to answer"),
            ({"video_id": clip, "question": "why?", "k": 0}, 400, "k must be an integer in 1..1000, got 0"),
            ({"video_id": clip, "question": "q" * 1001}, 400, f"the question is 1001 characters long; {LIMIT}"),
            ({"video_id": clip, "question": "why \udc80?"}, 400,
             "the question is not valid UTF-8: the byte 0x80 at character 4 is not text"),
            ({"video_id": clip, "question": "\ud800"}, 400,
             "the question is not valid UTF-8: a lone surrogate U+D800 at character 0"),
            ({"question": "why?"}, 422, "body video_id: Field required"),
        ]:  # fmt: skip
            # as ASCII JSON: a lone surrogate is spelled "\\udc80", as a client that escapes it sends it
            got = client.post("/api/answer", content=json.dumps(body), headers={"Content-Type": "application/json"})
            assert (got.status_code, got.json()) == (status, {"error": message}), body
        assert client.get("/healthz").json() == {"status": "ok", "model": NAME, "qa_model": True, "clips": 20,
                                                 "family": "alpro", "kind": "alpro_retrieval"}  # fmt: skip


def test_a_port_in_use_is_refused_and_sigterm_stops_the_server(server, index, capsys):
    port = server.url.rsplit(":", 1)[1]
    assert main(["serve", "--index", index, "--port", port, "--config", str(TINY), *OVERRIDES]) == 2
    assert re.fullmatch(rf"vlp serve: error: cannot listen on 127\.0\.0\.1:{port}: .*in use\n", capsys.readouterr().err)
    assert call(f"{server.url}/healthz")[0] == 200  # the first one still serves
    assert server.stop(signal.SIGTERM) == 143
    log = server.text()
    assert log.rstrip().endswith("vlp serve: stopped") and "Traceback" not in log


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["foreground", "background-job"])
def test_ctrl_c_stops_the_server(index, tmp_path, sigint, request):
    """SIGINT stops the server with 130 and one line, also where it started ignored (``vlp serve ... &`` in a
    script): uvicorn stops on it regardless, and raises it again into the ignoring handler. In the foreground: the
    module's server without a token."""
    if sigint == signal.SIG_DFL:
        srv = request.getfixturevalue("open_server")
    else:
        srv = Server(tmp_path / "serve.log", "--index", index, "--port", "0", sigint=sigint)
        srv.wait_listening()
    url = srv.url
    assert get_json(f"{url}/healthz")[0] == 200
    assert srv.stop(signal.SIGINT) == 130, srv.text()
    assert srv.text().rstrip().endswith("vlp serve: stopped") and "Traceback" not in srv.text()
