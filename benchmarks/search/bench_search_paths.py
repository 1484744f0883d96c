"""Benchmark: one trained model's search through every way vlp offers it, on the main job's world (issue 26).

Run, after the main job (``make pipeline-run``; ``PIPELINE_OUT`` moves its folder)::

    .venv/bin/python benchmarks/search/bench_search_paths.py --run runs/pipeline-local
    .venv/bin/python benchmarks/search/bench_search_paths.py --run runs/pipeline-local --queries 8 -k 10 --no-page

Everything comes from the run: its MLflow (``<run>/mlflow.db``) holds the registered search model
(``<prefix>-retrieval@candidate``, ``--model-name``), a copy of the fine-tuned retrieval model made into an MLflow
model with the config it searches with and a copy of the run's clip index; its card names the index the DAG's
``index_clips`` task wrote, whose metadata names the model directory and the frames store. The queries are the
first ``--queries`` test captions of the run's dataset (``ingest``'s output), one per clip, plus a text no caption
has.

Two measurements:

1. **Index build throughput, encoding included**: ``vlp index`` (a subprocess, as a user runs it) over every clip
   of the run's frames store into a new index, with the saved config; then the same command again, which finds
   every clip there and adds none. Printed: the first run's wall time and clips/s, the second's (start-up, model
   and index opening: the fixed cost), and clips/s with that fixed cost taken off.
2. **The same queries through each path**, top ``k`` each, compared with :class:`vlp.index.query.Searcher` in this
   process (the library every path calls):

   - ``cli``: ``vlp search --json`` (a subprocess a query: its time includes start-up and model loading);
   - ``mlflow``: ``mlflow models serve -m models:/<name>@candidate --env-manager local``, ``POST /invocations``;
   - ``serve-json``: ``vlp serve`` (a subprocess), ``GET /api/search``;
   - ``serve-oip``: the same server, ``POST /v2/models/vlp-search/infer`` (KServe's Open Inference Protocol);
   - ``page``: the same server's page in headless Chromium (Playwright, ``--chromium``): type the query, press
     Enter, read the hit cards' ids (``--no-page`` skips it).

   Printed per path: whether every query's ranked ids equal the library's, the largest difference of the scores
   the path returns (the page shows none), and the per-query latency median (ms). Then the library's top hits for
   each query, with whether the query's own clip is among them (a caption's clip first is the model working; the
   chance of that is 1 / clips indexed).

Exit status 1 if any path ranks a query differently from the library. The machine's load changes the times, not
the rankings: read the latencies as a comparison between paths on one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
from common import ROOT, free_port

LISTENING = re.compile(r"vlp serve: listening on (http://127\.0\.0\.1:\d+)")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # fmt: skip
REPEATS = 3  # in-process index builds


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--run", type=Path, default=ROOT / "runs" / "pipeline-local", help="the main job's folder")
    p.add_argument("--model-name", default="", help="registered search model (default: <prefix>-retrieval found)")
    p.add_argument("--queries", type=int, default=5, help="test captions to search for (plus one unseen text)")
    p.add_argument("-k", type=int, default=10, help="hits a query")
    p.add_argument("--chromium", type=Path, default=Path("/usr/bin/chromium"), help="the browser Playwright drives")
    p.add_argument("--no-page", action="store_true", help="skip the browser path")
    p.add_argument("--no-build", action="store_true", help="skip the index build throughput")
    return p.parse_args()


def env() -> dict[str, str]:
    """The subprocesses' environment: this checkout's vlp and this venv's commands."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "PATH": path}


def http(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def process(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``cmd`` running in its own process group, its output in ``log``; stopped (SIGTERM, then SIGKILL) on exit."""
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env(), start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def wait_for(proc: subprocess.Popen[bytes], log: Path, ready: Callable[[], str | None], what: str) -> str:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError):
            found = ready()
            if found:
                return found
        time.sleep(0.3)
    raise SystemExit(f"{what} was not ready in 300 s:\n{log.read_text(errors='replace')[-3000:]}")


def registered(run: Path, name: str, tmp: Path) -> dict[str, Any]:
    """The run's registered search model, downloaded: its name, local path, config and the index its card names."""
    import mlflow
    import yaml
    from mlflow import MlflowClient

    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{(run / 'mlflow.db').resolve()}"
    if not name:
        found = [m.name for m in MlflowClient().search_registered_models() if m.name.endswith("-retrieval")]
        if len(found) != 1:
            raise SystemExit(f"{run}/mlflow.db: expected one <prefix>-retrieval registered model, found {found}")
        name = found[0]
    uri = f"models:/{name}@candidate"
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp / "model")))
    mlmodel = yaml.safe_load((local / "MLmodel").read_text())
    card = json.loads((local / "artifacts" / "vlp.json").read_text())
    settings = mlmodel["flavors"]["python_function"]["config"]  # the model_config it was saved with
    config = tmp / "search.yaml"
    config.write_text(yaml.safe_dump(settings["config"], sort_keys=False))
    index = card["index"] if Path(card["index"]).exists() else str(local / "artifacts" / "index")
    return {"name": name, "uri": uri, "config": str(config), "index": index, "overrides": settings["overrides"]}


def queries(run: Path, frames: str, count: int) -> list[tuple[str, str]]:
    """``(video_id, caption)`` of the first ``count`` test clips that are in ``frames``, one caption each, and one
    text no caption has (video id ``-``)."""
    from vlp.data import manifest
    from vlp.data.frames import FrameStore

    stored = set(FrameStore(frames).video_ids)
    for dataset in sorted(run.glob("kfp/*/ingest/dataset")):
        rows = manifest.read(str(dataset), manifest.CAPTIONS, manifest.CAPTION_SCHEMA).to_pylist()
        out: dict[str, str] = {}
        for row in rows:
            if row["split"] == "test" and row["video_id"] in stored and row["video_id"] not in out:
                out[row["video_id"]] = row["caption"]
        if out:
            return [*list(out.items())[:count], ("-", "a purple square turning slowly in the rain")]
    raise SystemExit(f"no ingest/dataset with test captions under {run}/kfp")


def build_throughput(model: str, frames: str, config: str, tmp: Path) -> None:
    from vlp.data.frames import FrameStore

    clips = len(FrameStore(frames).video_ids)
    out = tmp / "throughput-index"
    cmd = [sys.executable, "-m", "vlp.cli", "index", "--model", model, "--frames", frames, "--out", str(out),
           "--config", config]  # fmt: skip
    walls, summaries = [], []
    for _ in range(2):
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env(), capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"vlp index exited {done.returncode}:\n{done.stderr[-3000:]}")
        summaries.append(json.loads(done.stdout[done.stdout.index("{") :]))
    added, fixed = summaries[0]["added"], walls[1]
    print(f"index build: `vlp index` over the whole frames store ({clips} clips, {frames})")
    print(f"  first run:  added {added} in {walls[0]:.1f} s wall = {added / walls[0]:.1f} clips/s")
    print(f"  second run: added {summaries[1]['added']} (all {summaries[1]['skipped']} there) in {fixed:.1f} s wall"
          " (the fixed cost: Python, torch and LanceDB start-up, model and index opening)")  # fmt: skip
    # In this process, imports warm: a fresh index (read, decode, encode, add) against a rerun that adds nothing
    from vlp.config import load_config
    from vlp.steps.index import index_clips

    cfg = load_config(config)
    index_clips(model, frames, str(tmp / "warm-up"), cfg)
    full, noop = [], []
    for rep in range(REPEATS):
        out_rep = str(tmp / f"in-process-{rep}")
        start = time.perf_counter()
        index_clips(model, frames, out_rep, cfg)
        full.append(time.perf_counter() - start)
        start = time.perf_counter()
        index_clips(model, frames, out_rep, cfg)
        noop.append(time.perf_counter() - start)
    f, n = statistics.median(full), statistics.median(noop)
    print(
        f"  in one process, imports warm, median of {REPEATS}: a fresh index {f:.2f} s ({clips / f:.0f} clips/s), a "
        f"rerun that adds nothing {n:.2f} s; reading, decoding, encoding and adding: {clips / (f - n):.0f} clips/s"
    )
    print()


def ids_scores(hits: list[dict[str, Any]]) -> tuple[list[str], list[float | None]]:
    return [h["video_id"] for h in hits], [h.get("score") for h in hits]


def main() -> int:
    args = parse_args()
    if not (args.run / "mlflow.db").is_file():
        raise SystemExit(f"{args.run} has no mlflow.db: give --run the main job's folder (make pipeline-run)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
    with tempfile.TemporaryDirectory(prefix="bench-search-paths-") as tmpdir:
        tmp = Path(tmpdir)
        reg = registered(args.run, args.model_name, tmp)
        from vlp.config import load_config
        from vlp.index.query import Searcher
        from vlp.index.store import ClipIndex

        info = ClipIndex.open(reg["index"]).info
        print(f"registered model {reg['uri']} (MLflow {os.environ['MLFLOW_TRACKING_URI']})")
        print(f"index {reg['index']}: {ClipIndex.open(reg['index']).count()} clips; model {info.model}; "
              f"frames {info.frames}")  # fmt: skip
        print(f"config: the registered model's, written to {reg['config']} (overrides {reg['overrides'] or 'none'})")
        print()
        if not args.no_build:
            build_throughput(info.model, info.frames, reg["config"], tmp)

        asked = queries(args.run, info.frames, args.queries)
        k = args.k
        cfg = load_config(reg["config"], reg["overrides"])
        searcher = Searcher(reg["index"], cfg)
        want: dict[str, tuple[list[str], list[float | None]]] = {}
        times: dict[str, list[float]] = {"library": []}
        for _, text in asked:
            start = time.perf_counter()
            want[text] = ids_scores([h.as_dict() for h in searcher.search(text, k)])
            times["library"].append(time.perf_counter() - start)
        got: dict[str, dict[str, tuple[list[str], list[float | None]]]] = {}

        # cli
        got["cli"], times["cli"] = {}, []
        for _, text in asked:
            cmd = [sys.executable, "-m", "vlp.cli", "search", "--index", reg["index"], "--config", reg["config"],
                   "-k", str(k), "--json", text, *reg["overrides"]]  # fmt: skip
            start = time.perf_counter()
            done = subprocess.run(cmd, env=env(), capture_output=True, text=True)
            times["cli"].append(time.perf_counter() - start)
            if done.returncode != 0:
                raise SystemExit(f"vlp search exited {done.returncode}:\n{done.stderr[-3000:]}")
            got["cli"][text] = ids_scores(json.loads(done.stdout))  # the hits

        # mlflow models serve
        port = free_port()
        log = tmp / "mlflow-serve.log"
        cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", reg["uri"], "--env-manager", "local",
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
        with process(cmd, log) as proc:
            url = f"http://127.0.0.1:{port}"
            wait_for(proc, log, lambda: url if urllib.request.urlopen(url + "/ping", timeout=5).status == 200 else None,
                     "mlflow models serve")  # fmt: skip
            got["mlflow"], times["mlflow"] = {}, []
            for _, text in asked:
                start = time.perf_counter()
                body = http(url + "/invocations", {"dataframe_records": [{"text": text, "k": k}]})
                times["mlflow"].append(time.perf_counter() - start)
                got["mlflow"][text] = ids_scores(body["predictions"])

        # vlp serve: JSON API, OIP v2, the page
        log = tmp / "vlp-serve.log"
        cmd = [sys.executable, "-m", "vlp.cli", "serve", "--index", reg["index"], "--config", reg["config"],
               "--port", "0", *reg["overrides"]]  # fmt: skip
        with process(cmd, log) as proc:

            def listening() -> str | None:
                found = LISTENING.search(log.read_text(errors="replace"))
                return found[1] if found else None

            url = wait_for(proc, log, listening, "vlp serve")
            got["serve-json"], times["serve-json"] = {}, []
            got["serve-oip"], times["serve-oip"] = {}, []
            for _, text in asked:
                start = time.perf_counter()
                body = http(f"{url}/api/search?" + urllib.parse.urlencode({"q": text, "k": k}))
                times["serve-json"].append(time.perf_counter() - start)
                got["serve-json"][text] = ids_scores(body["hits"])
                oip = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}],
                       "parameters": {"k": k}}  # fmt: skip
                start = time.perf_counter()
                body = http(f"{url}/v2/models/vlp-search/infer", oip)
                times["serve-oip"].append(time.perf_counter() - start)
                out = {o["name"]: o["data"] for o in body["outputs"]}
                got["serve-oip"][text] = (out["video_id"], out["score"])
            if not args.no_page:
                got["page"], times["page"] = page(url, asked, k, args.chromium)

    print(f"{len(asked)} queries, top {k} each, against the library (Searcher in this process):")
    print("| path | same ranking | max score diff | latency p50 (ms) |")
    print("|---|---|---|---|")
    print(f"| library | - | - | {1000 * statistics.median(times['library']):.1f} |")
    differ = 0
    for path, ranked in got.items():
        same = sum(ranked[text][0] == want[text][0] for _, text in asked)
        differ += len(asked) - same
        diffs = [
            abs(a - b)
            for _, text in asked
            for a, b in zip(ranked[text][1], want[text][1], strict=False)
            if a is not None and b is not None
        ]  # fmt: skip (the page returns no scores)
        diff = f"{max(diffs):.1e}" if diffs else "-"
        print(f"| {path} | {same}/{len(asked)} | {diff} | {1000 * statistics.median(times[path]):.1f} |")
    print()
    clips = ClipIndex.open(reg["index"]).count()
    print(f"the library's top 3 (chance that a caption's own clip ranks first: 1/{clips} = {1 / clips:.3f}):")
    for video_id, text in asked:
        ids = want[text][0]
        place = ids.index(video_id) + 1 if video_id in ids else None
        where = "-" if video_id == "-" else (f"own clip at rank {place}" if place else f"own clip not in the top {k}")
        print(f"  {text!r} ({video_id}): {', '.join(ids[:3])}  [{where}]")
    if differ:
        print(f"FAILED: {differ} rankings differ from the library's")
        return 1
    return 0


def page(url: str, asked: list[tuple[str, str]], k: int, chromium: Path) -> tuple[dict[str, Any], list[float]]:
    from playwright.sync_api import sync_playwright

    found: dict[str, Any] = {}
    times = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
        try:
            view = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            view.set_default_timeout(120_000)
            view.goto(url + "/")
            view.locator("#about").filter(has_text="clips indexed").wait_for()
            view.fill("#k", str(k))
            for _, text in asked:
                view.evaluate("() => { document.getElementById('hits').innerHTML = ''; }")
                view.fill("#query", text)
                start = time.perf_counter()
                view.press("#query", "Enter")
                view.locator("#hits li.hit").first.wait_for()
                times.append(time.perf_counter() - start)
                cards = view.locator("#hits li.hit")
                found[text] = ([cards.nth(i).get_attribute("data-video-id") for i in range(cards.count())], [])
        finally:
            browser.close()
    return found, times


if __name__ == "__main__":
    sys.exit(main())
