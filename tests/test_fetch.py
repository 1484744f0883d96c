"""``vlp fetch`` (src/vlp/data/fetch): a URL list to videos in storage, against a loopback HTTP server of real mp4
files with faults on chosen paths (benchmarks/input/url_server.py). No mock of the network stack: real sockets,
aiohttp, the real decoder probe, real files and (where marked) a real S3 server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from common import UrlServer
from vlp import storage
from vlp.config import load_config
from vlp.data.fetch import FetchConfig, fetch_part, guard, lists, merge
from vlp.data.fetch.client import Fetcher, retry_after_s, robots_opt_out
from vlp.data.fetch.part import scratch_dir

ROOT = Path(__file__).resolve().parents[1]
VLP = str(Path(sys.executable).with_name("vlp"))
LOOPBACK = '["127.0.0.1/32"]'
TINY = str(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml")  # the DAG test's step config
FAST = [f"fetch.allow={LOOPBACK}", "fetch.read_timeout_s=1", "fetch.backoff_s=0.05", "fetch.max_bytes=8000000",
        "fetch.min_bytes_per_s=20000", "fetch.progress=false"]  # fmt: skip


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    from conftest import write_mp4

    root = tmp_path_factory.mktemp("videos")
    made = {f"v{i}.mp4": write_mp4(root / f"v{i}.mp4", num_frames=12 + 4 * i).read_bytes() for i in range(3)}
    made["big.mp4"] = write_mp4(root / "big.mp4", num_frames=48, size=(160, 120)).read_bytes()
    return made


def _fetch(source: Path, out: Path, *overrides: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    run = subprocess.run([VLP, "fetch", "--source", str(source), "--out", str(out), *FAST, *overrides],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    if check:
        assert run.returncode == 0, run.stderr[-3000:]
    return run


def _records(out: Path | str, name: str = "fetch.parquet") -> list[dict]:
    return storage.read_parquet(storage.join(str(out), name)).to_pylist()


def _write_list(path: Path, urls: list[str], header: str = "url,caption") -> Path:
    path.write_text("\n".join([header, *(f"{u},clip {i}" for i, u in enumerate(urls))]) + "\n", encoding="utf-8")
    return path


FAULTS = {  # path -> (status, a piece of the detail)
    "/v/v0.mp4": ("ok", ""),
    "/404/v1.mp4": ("http 404", "Not Found"),
    "/flaky/2/v1.mp4": ("ok", ""),  # 500 twice, then the video
    "/flaky/9/v2.mp4": ("http 500", ""),  # 500 past the retries
    "/429/v2.mp4": ("ok", ""),  # 429 with Retry-After: 1, then the video
    "/cut/v0.mp4": ("cut off", "ContentLengthError"),
    "/lie/v1.mp4": ("cut off", "ContentLengthError"),
    "/stall/big.mp4": ("timeout", "no bytes for fetch.read_timeout_s=1 s"),
    "/drip/big.mp4": ("too slow", "fetch.min_bytes_per_s=20000"),
    "/html/v0.mp4": ("not a video", "Content-Type text/html"),
    "/redirect/3/v1.mp4": ("ok", ""),
    "/redirect/6/v1.mp4": ("too many redirects", "fetch.max_redirects=5"),
    "/to?u=http://169.254.169.254/latest/meta-data/": ("refused address", "169.254.169.254 is link-local"),
    "/bomb": ("too large", "more than fetch.max_bytes=8000000 bytes decompressed (gzip)"),
    "/gzip/v2.mp4": ("ok", ""),
    "/noise": ("not a video", "not decodable"),
    "/robots/noai/v0.mp4": ("opted out", "X-Robots-Tag: noai (fetch.honor_opt_out)"),
    "/robots/otherbot:+noindex/v1.mp4": ("ok", ""),  # meant for another crawler
    "/slowhead/v1.mp4": ("timeout", "no status line and headers within fetch.read_timeout_s=1 s"),
}


def test_every_fault_ends_as_designed_and_nothing_is_lost(tmp_path, videos):
    with UrlServer(videos, stall_s=4, bomb_bytes=64 << 20) as server:
        urls = [server.url(p) for p in FAULTS]
        urls.append(server.url("/to?u=" + server.url("/v/v0.mp4", host="127.0.0.2")))  # loopback, not allowed
        urls.append(server.url("/v/v0.mp4"))  # the same URL as row 0: fetched once
        listed = _write_list(tmp_path / "list.csv", urls)
        start = time.perf_counter()
        run = _fetch(listed, tmp_path / "out")
        seconds = time.perf_counter() - start
        hits = dict(server.hits)
    records = _records(tmp_path / "out")
    assert [r["row"] for r in records] == list(range(len(urls)))  # every row, once
    for r, (path, (status, detail)) in zip(records, FAULTS.items(), strict=False):
        assert (r["status"], path) == (status, path) and detail in r["detail"], r
    assert records[-2]["status"] == "refused address" and "127.0.0.2 is loopback" in records[-2]["detail"]
    assert hits["/v/v0.mp4"] == 1 and records[-1]["status"] == "ok" and records[-1]["sha256"] == records[0]["sha256"]
    assert hits["/flaky/2/v1.mp4"] == 3 and hits["/flaky/9/v2.mp4"] == 4 and hits["/429/v2.mp4"] == 2
    assert records[2]["attempts"] == 3 and records[4]["attempts"] == 2
    assert records[4]["seconds"] >= 1.0  # Retry-After: 1 was honoured
    # the good rows: stored once each, under the hash of their bytes, equal to what the server sent
    ok = [r for r in records if r["status"] == "ok"]
    by_name = {hashlib.sha256(data).hexdigest(): data for data in videos.values()}
    for r in ok:
        stored = (tmp_path / "out" / r["path"]).read_bytes()
        assert hashlib.sha256(stored).hexdigest() == r["sha256"] and stored == by_name[r["sha256"]]
        assert r["bytes"] == len(stored) and r["path"] == f"videos/{r['sha256'][:2]}/{r['sha256']}.mp4"
    written = {p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    tables = {"videos.parquet", "captions.parquet", "rejects.parquet", "fetch.parquet", "summary.json"}
    part = "parts/00000-of-00001/"
    assert {w for w in written if not w.startswith(("videos/", part))} == tables  # nothing named by a URL
    assert {w for w in written if w.startswith("videos/")} == {r["path"] for r in ok}
    stored_files = sorted(p.name for p in (tmp_path / "out" / "videos").rglob("*.mp4"))
    assert stored_files == sorted({f"{r['sha256']}.mp4" for r in ok}) and len(stored_files) == 3
    # a raw dataset: one video per content, every good row's caption; every failure a reject with its reason
    vids = _records(tmp_path / "out", "videos.parquet")
    assert [v["video_id"] for v in vids] == ["row0", "row2", "row4"] and {v["source"] for v in vids} == {"urls"}
    assert records[17]["sha256"] == records[2]["sha256"]  # the other crawler's opt-out: v1 again, the same video
    assert len(_records(tmp_path / "out", "captions.parquet")) == len(ok)
    rejects = _records(tmp_path / "out", "rejects.parquet")
    assert len(rejects) + len(ok) == len(urls)
    assert {r["reason"].split(":")[0] for r in rejects} == {s for s, _ in FAULTS.values() if s != "ok"}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["by_status"]["ok"] == len(ok) and summary["rows"] == len(urls) and summary["videos"] == 3
    assert seconds < 60, seconds
    ingested = subprocess.run([VLP, "ingest", "--source", str(tmp_path / "out"), "--out", str(tmp_path / "ds")],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ingested.returncode == 0, ingested.stderr[-2000:]
    got = json.loads((tmp_path / "ds" / "summary.json").read_text())
    assert got["videos"]["accepted"] == 3 and got["captions"]["accepted"] == len(ok)
    assert "Traceback" not in run.stderr


def test_no_credential_in_a_url_reaches_the_records_or_the_log(tmp_path, videos):
    with UrlServer(videos) as server:
        secret = (
            f"http://alice:hunter2@127.0.0.1:{server.port}/v/v1.mp4?X-Amz-Signature=s3cr3t&X-Amz-Credential=AKIAX&n=1"
        )
        bad = f"http://bob:pa55word@127.0.0.1:{server.port}/404/v1.mp4?token=t0ken"
        run = _fetch(_write_list(tmp_path / "list.csv", [secret, bad]), tmp_path / "out")
    records = _records(tmp_path / "out")
    assert records[0]["status"] == "ok" and records[1]["status"] == "http 404"
    assert (
        records[0]["url"]
        == f"http://127.0.0.1:{server.port}/v/v1.mp4?X-Amz-Signature=REDACTED&X-Amz-Credential=REDACTED&n=1"
    )
    everything = run.stderr + run.stdout
    for path in (tmp_path / "out").rglob("*"):
        if path.is_file() and path.suffix in (".parquet", ".json"):
            everything += path.read_bytes().decode("latin-1")
    for word in ("hunter2", "s3cr3t", "AKIAX", "pa55word", "t0ken", "alice", "bob"):
        assert word not in everything, word


@pytest.mark.parametrize(
    ("address", "refused"),
    [("8.8.8.8", ""), ("2001:4860:4860::8888", ""), ("127.0.0.1", "loopback"), ("::1", "loopback"),
     ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"), ("fc00::1", "private"),
     ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("224.0.0.1", "multicast"),
     ("100.64.0.1", "shared (100.64.0.0/10)"), ("0.0.0.0", "unspecified"), ("::ffff:127.0.0.1", "loopback"),
     ("240.0.0.1", "reserved")],
)  # fmt: skip
def test_the_address_rule(address, refused):
    why = guard.Policy().refusal(address)
    assert why == (f"{address} is {refused}" if refused else "")
    assert guard.Policy(["0.0.0.0/0", "::/0"]).refusal(address) == ""  # an allowlist opens what it names


def test_a_name_that_resolves_to_a_refused_address_is_refused_at_the_connection(tmp_path, videos):
    """``localhost`` resolves to 127.0.0.1: refused by the resolver the client connects through, with no
    allowlist; the same server by literal address is refused before any connection."""
    with UrlServer(videos) as server:
        listed = _write_list(
            tmp_path / "list.csv", [server.url("/v/v0.mp4", host="localhost"), server.url("/v/v0.mp4")]
        )
        _fetch(listed, tmp_path / "out", "fetch.allow=[]")
        hits = sum(server.hits.values())
    records = _records(tmp_path / "out")
    assert [r["status"] for r in records] == ["refused address", "refused address"]
    assert "localhost is loopback (a localhost name)" in records[0]["detail"], records[0]
    assert "127.0.0.1 is loopback" in records[1]["detail"] and hits == 0


def test_urls_that_cannot_be_fetched_are_rejects_not_requests(tmp_path):
    listed = tmp_path / "list.jsonl"
    listed.write_text("\n".join([
        json.dumps({"url": "ftp://example.com/a.mp4", "caption": "ftp"}),
        json.dumps({"url": "file:///etc/passwd", "caption": "a file"}),
        json.dumps({"url": "http://[::1", "caption": "broken"}),
        json.dumps({"caption": "no url"}),
        "{not json",
        json.dumps({"url": "http://example.com:99999/a.mp4"}),
    ]) + "\n")  # fmt: skip
    _fetch(listed, tmp_path / "out")
    got = [(r["status"], r["detail"][:40]) for r in _records(tmp_path / "out")]
    assert [s for s, _ in got] == ["bad url", "bad url", "bad url", "bad row", "bad row", "bad url"], got
    assert "scheme 'ftp'" in got[0][1] and "scheme 'file'" in got[1][1] and got[3][1] == "no URL (line 4)"
    assert got[4][1].startswith("not JSON") and "(line 5)" in _records(tmp_path / "out")[4]["detail"]


def test_a_webvid_csv_names_videos_by_videoid_with_its_name_as_caption(tmp_path, videos):
    with UrlServer(videos) as server:
        csv = tmp_path / "results_2M_val.csv"
        csv.write_text("videoid,contentUrl,duration,page_dir,name\n"
                       f"1066,{server.url('/v/v0.mp4')},PT00H00M10S,006001_006050,\"Aerial view, a city\"\n"
                       f"2077,{server.url('/v/v1.mp4')},PT00H00M12S,006001_006050,A dog runs\n"
                       f"1066,{server.url('/v/v2.mp4')},PT00H00M12S,006001_006050,the same id again\n")  # fmt: skip
        _fetch(csv, tmp_path / "out")
    records = _records(tmp_path / "out")
    assert [(r["video_id"], r["status"]) for r in records] == [("1066", "ok"), ("2077", "ok"),
                                                               ("1066", "duplicate id")]  # fmt: skip
    vids = _records(tmp_path / "out", "videos.parquet")
    assert [(v["video_id"], v["source"], v["split"]) for v in vids] == [("1066", "webvid", "train"),
                                                                        ("2077", "webvid", "train")]  # fmt: skip
    caps = _records(tmp_path / "out", "captions.parquet")
    assert [c["caption"] for c in caps] == ["Aerial view, a city", "A dog runs"]


def test_parts_then_merge_equal_one_part_and_a_missing_part_is_named(tmp_path, videos):
    with UrlServer(videos) as server:
        urls = [server.url(f"/v/v{i % 3}.mp4") + f"?n={i}" for i in range(7)] + [server.url("/404/x")]
        listed = _write_list(tmp_path / "list.csv", urls)
        _fetch(listed, tmp_path / "one")
        for i in (0, 2):
            _fetch(listed, tmp_path / "three", "--part", f"{i}/3")
        missing = subprocess.run([VLP, "fetch", "--source", str(listed), "--out", str(tmp_path / "three"),
                                  "--merge-parts", "3"], capture_output=True, text=True)  # fmt: skip
        assert missing.returncode != 0 and "part(s) [1] of 3 have not finished" in missing.stderr
        _fetch(listed, tmp_path / "three", "--part", "1/3")
        _fetch(listed, tmp_path / "three", "--merge-parts", "3")

    def same(out: Path, name: str) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in ("seconds",)} for r in _records(out, name)]

    for name in ("fetch.parquet", "videos.parquet", "captions.parquet", "rejects.parquet"):
        assert same(tmp_path / "one", name) == same(tmp_path / "three", name), name
    assert len(same(tmp_path / "one", "videos.parquet")) == 3


def test_a_changed_list_into_the_same_output_is_refused(tmp_path, videos):
    with UrlServer(videos) as server:
        listed = _write_list(tmp_path / "list.csv", [server.url("/v/v0.mp4")])
        _fetch(listed, tmp_path / "out")
        _write_list(listed, [server.url("/v/v1.mp4")])
        run = _fetch(listed, tmp_path / "out", check=False)
    assert run.returncode != 0 and "fetch a changed list into a new output" in run.stderr


def _stored(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "videos").rglob("*")) if p.is_file()}


def test_kill_9_mid_part_then_rerun_ends_as_an_uninterrupted_run(tmp_path, videos):
    """A part killed after some batches were journaled fetches only the rows it lacks when rerun, and ends with the
    same stored bytes and records (but the seconds) as a run never killed; a rerun of a finished part fetches
    nothing."""
    slow = ["fetch.per_host_rate=6", "fetch.batch=3", "fetch.concurrency=2"]  # ~4 s for 24 rows
    with UrlServer(videos) as server:
        urls = [server.url(f"/v/v{i % 3}.mp4") + f"?n={i}" for i in range(22)] + [
            server.url("/404/a"),
            server.url("/html/b"),
        ]
        listed = _write_list(tmp_path / "list.csv", urls)
        _fetch(listed, tmp_path / "whole", *slow)
        whole_hits = sum(server.hits.values())
        server.hits.clear()
        cmd = [VLP, "fetch", "--source", str(listed), "--out", str(tmp_path / "killed"), *FAST, *slow]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        part = tmp_path / "killed" / "parts" / "00000-of-00001"
        deadline = time.monotonic() + 60
        while len(list(part.glob("journal-*.parquet"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        journaled = sum(pq.read_metadata(p).num_rows for p in part.glob("journal-*.parquet"))
        assert 0 < journaled < len(urls) and not (part / "records.parquet").exists()
        scratch = Path(scratch_dir(str(tmp_path / "killed"), 0, 1))
        assert scratch.is_dir()  # what the kill left: the rerun empties it, and removes it when it ends
        before = sum(server.hits.values())
        _fetch(listed, tmp_path / "killed", *slow)
        rerun_hits = sum(server.hits.values()) - before
        assert rerun_hits <= len(urls) - journaled  # the journaled rows were not fetched again
        server.hits.clear()
        assert not scratch.exists()
        _fetch(listed, tmp_path / "killed", *slow)  # finished: nothing to fetch
        assert sum(server.hits.values()) == 0 and whole_hits == len(urls)

    def stable(out: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in _records(out)]

    assert stable(tmp_path / "killed") == stable(tmp_path / "whole")
    assert _stored(tmp_path / "killed") == _stored(tmp_path / "whole")
    for name in ("videos.parquet", "captions.parquet", "rejects.parquet"):
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_sigterm_mid_fetch_is_one_line_and_leaves_no_download_behind(tmp_path, videos):
    """SIGTERM while downloads, probes and uploads are in flight: exit 143, the interruption line and the log, no
    traceback or asyncio complaint, the part's scratch folder gone; a second process on the same part meanwhile is
    refused at once, naming the first."""
    with UrlServer(videos) as server:
        urls = [server.url(f"/drip/big.mp4?n={i}") for i in range(4)] + [
            server.url(f"/v/v0.mp4?n={i}") for i in range(80)
        ]
        listed = _write_list(tmp_path / "list.csv", urls)
        cmd = [VLP, "fetch", "--source", str(listed), "--out", str(tmp_path / "out"), *FAST, "fetch.min_bytes_per_s=0",
               "fetch.batch=8", "fetch.per_host_rate=40"]  # fmt: skip
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        part = tmp_path / "out" / "parts" / "00000-of-00001"
        deadline = time.monotonic() + 60
        while not list(part.glob("journal-*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        proc.send_signal(signal.SIGTERM)
        stderr = proc.communicate(timeout=60)[1]
    assert second.returncode == 2 and f"is being fetched by another process (pid {proc.pid})" in second.stderr
    assert second.stderr.strip().splitlines()[-1].startswith("vlp fetch: error: part 0/1 of ")
    assert "Traceback" not in second.stderr
    assert proc.returncode == 143, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == "vlp fetch: interrupted; rerun the same command to run it again"
    assert not any(word in stderr for word in ("Traceback", "Task was destroyed", "coroutine", "Exception")), stderr
    assert not Path(scratch_dir(str(tmp_path / "out"), 0, 1)).exists()


def test_the_per_host_rate_spaces_the_requests(tmp_path, videos):
    """9 request starts at 8 a second to one host, timed where they arrive: each at least 1/8 s after the one
    before (a margin for the clocks), so the last at least 1 s after the first."""
    with UrlServer(videos) as server:
        urls = [server.url("/v/v0.mp4") + f"?n={i}" for i in range(9)]
        _fetch(_write_list(tmp_path / "list.csv", urls), tmp_path / "out", "fetch.per_host_rate=8", "fetch.probe=false")
        gaps = [b - a for a, b in zip(server.arrivals, server.arrivals[1:], strict=False)]
    assert len(gaps) == 8 and min(gaps) > 0.1, gaps
    assert all(r["status"] == "ok" for r in _records(tmp_path / "out"))


def test_retry_after_is_read_as_seconds_or_a_date():
    assert retry_after_s("7") == 7.0
    assert retry_after_s("Thu, 01 Jan 2099 00:00:10 GMT", now=4070908800.0) == 10.0
    assert retry_after_s("soon") == -1.0 and retry_after_s(None) == -1.0


def test_the_limits_are_checked_with_the_config(tmp_path):
    with pytest.raises(Exception, match=r"fetch\.concurrency=0 must be >= 1"):
        load_config(overrides=["fetch.concurrency=0"])
    with pytest.raises(ValueError, match=r"fetch\.allow"):
        guard.Policy(["not a network"])


def test_lists_read_each_format(tmp_path):
    (tmp_path / "a.txt").write_text("http://h/a.mp4\n\nhttp://h/b.mp4\n")
    fmt, rows = lists.read(str(tmp_path / "a.txt"))
    assert fmt == "urls" and [(r.row, r.video_id, r.url) for r in rows] == [(0, "row0", "http://h/a.mp4"),
                                                                            (1, "row1", "http://h/b.mp4")]  # fmt: skip
    (tmp_path / "b.csv").write_text("id,url,text\nx1,http://h/a.mp4,a cat\n")
    assert lists.read(str(tmp_path / "b.csv"))[1] == [lists.Row(0, "x1", "http://h/a.mp4", "a cat")]
    (tmp_path / "c.csv").write_text("name,link\na,b\n")
    with pytest.raises(ValueError, match="has no 'url' column"):
        lists.read(str(tmp_path / "c.csv"))


def test_fetch_into_object_storage(s3_bucket, videos, tmp_path):
    """The videos and tables go to an S3 server (moto, or Ceph RGW in `make test TEST_S3=rgw`), read back by the
    merge and by ingest's reader."""
    cfg = FetchConfig(allow=["127.0.0.1/32"], progress=False)
    out = f"{s3_bucket}/fetched"
    with UrlServer(videos) as server:
        listed = _write_list(
            tmp_path / "list.csv", [server.url("/v/v0.mp4"), server.url("/v/v1.mp4"), server.url("/404/z")]
        )
        fetch_part(str(listed), out, cfg, 0, 1)
        summary = merge(str(listed), out, cfg, 1)
    assert summary["videos"] == 2 and summary["by_status"] == {"http 404": 1, "ok": 2}
    for rec in _records(out)[:2]:
        assert hashlib.sha256(storage.read_bytes(storage.join(out, rec["path"]))).hexdigest() == rec["sha256"]


@pytest.mark.slow
def test_the_retrieval_dag_from_a_url_list_served_on_loopback(tmp_path, tiny_world):
    """vlp-retrieval under kfp.local with the ``url_list`` parameter: fetch (the tiny world's clips, served on the
    loopback, one row per caption with its split) -> synth's pointer -> ingest -> ... -> the headline table; the
    fetched videos are the served bytes, and the dataset the run ingested holds every clip and caption."""
    from pipelines import local_run

    raw = Path(tiny_world["raw"])
    clips = [v for v in storage.read_parquet(str(raw / "videos.parquet")).to_pylist() if v["media"] == "video"]
    files = {Path(v["path"]).name: (raw / v["path"]).read_bytes() for v in clips}
    name = {v["video_id"]: Path(v["path"]).name for v in clips}
    captions = [c for c in storage.read_parquet(str(raw / "captions.parquet")).to_pylist() if c["video_id"] in name]
    with UrlServer(files) as server:
        listed = tmp_path / "urls.jsonl"
        rows = [{"id": c["video_id"], "url": server.url(f"/v/{name[c['video_id']]}"), "caption": c["caption"],
                 "split": c["split"]} for c in captions]  # fmt: skip
        listed.write_text("".join(json.dumps(row) + "\n" for row in rows))
        result = local_run.run(tmp_path / "run", step_config=TINY, family="ts2net", pipeline="retrieval", cache=False,
                               params={"url_list": str(listed)}, overrides=[f"fetch.allow={LOOPBACK}"])  # fmt: skip
        assert sum(server.hits.values()) == len(files)  # each clip once, though named by one row per caption
    ran = [task for task, kind, _ in result["tasks"] if kind == "done"]
    assert ran[:3] == ["start-run", "fetch", "synth"] and "given-source" not in ran and "evaluate-retrieval" in ran
    fetched = result["outputs"]["synth"]["raw"]  # synth's pointer, followed: the fetch's folder
    assert fetched == result["outputs"]["fetch"]["fetched"]
    for rec in _records(fetched):
        assert rec["status"] == "ok" and (Path(fetched) / rec["path"]).read_bytes() == files[name[rec["video_id"]]]
    dataset = result["outputs"]["ingest"]["dataset"]
    ingested = json.loads((Path(dataset) / "summary.json").read_text())
    assert ingested["videos"]["accepted"] == len(files) and ingested["captions"]["accepted"] == len(captions)
    summary = Path(result["outputs"]["report"]["summary"]).read_text()
    assert "| retrieval | text → video R@1 |" in summary and result["mlflow"]["steps"]["fetch"] == "FINISHED"


def _spellings(port: int) -> list[str]:
    """The loopback (and 0.0.0.0, which Linux connects to the loopback) as a URL list might spell it: Unicode
    digits and dots that IDNA/UTS 46 folds to ASCII, trailing dots, other bases, IPv6 forms, localhost names."""
    hosts = ["１２７.０.０.１", "127。0。0。1", "127．0．0．1", "127｡0｡0｡1", "①②⑦.0.0.1", "𝟏𝟐𝟕.𝟎.𝟎.𝟏", "₁₂₇.0.0.1",
             "¹²⁷.⁰.⁰.¹", "1２7.0.0.１", "127.0.0.1.", "127.1", "0x7f.1", "0177.0.0.1", "2130706433", "０.０.０.０",
             "0.0.0.0", "0", "[::1]", "[0::1]", "[０::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[::]",
             "localhost", "LOCALHOST.", "ｌｏｃａｌｈｏｓｔ", "a.b.localhost", "127.0.0.2"]  # fmt: skip
    return [f"http://{host}:{port}/v/v0.mp4" for host in hosts]


def test_every_spelling_of_the_loopback_is_refused_without_a_request(tmp_path, videos):
    """No allowlist: every spelling is refused (an address, or a URL the client cannot read), and the server
    (which logs every request) sees none."""
    with UrlServer(videos) as server:
        urls = _spellings(server.port)
        run = _fetch(_write_list(tmp_path / "list.csv", urls), tmp_path / "out", "fetch.allow=[]")
        hits = sum(server.hits.values())
    records = _records(tmp_path / "out")
    assert hits == 0 and len(records) == len(urls)
    assert {r["status"] for r in records} <= {"refused address", "bad url"}, [(r["url"], r["status"]) for r in records]
    bad = [r["url"].split("//")[-1].split(":")[0] for r in records if r["status"] == "bad url"]
    assert bad == ["127.0.0.1.", "127.1", "0177.0.0.1", "2130706433", "0", "(unparseable URL)"]  # aiohttp's refusals
    assert "Traceback" not in run.stderr


def test_a_redirect_to_a_spelling_of_a_refused_address_is_refused(tmp_path, videos):
    """With 127.0.0.0/8 allowed, the first hop is fetched; its redirect to 0.0.0.0 or [::1] in other spellings is
    refused (0.0.0.0 is not in the allowlist) and never requested."""
    with UrlServer(videos) as server:
        targets = [f"http://{h}:{server.port}/v/v1.mp4" for h in ("０.０.０.０", "0。0。0。0", "[::1]", "[::]")]
        urls = [server.url("/to?u=" + t) for t in targets]
        _fetch(_write_list(tmp_path / "list.csv", urls), tmp_path / "out", 'fetch.allow=["127.0.0.0/8"]')
        hits = dict(server.hits)
    assert [r["status"] for r in _records(tmp_path / "out")] == ["refused address"] * 4
    assert not any(path.startswith("/v/") for path in hits) and sum(hits.values()) == 4


def test_the_connection_itself_refuses_a_refused_address(tmp_path, videos):
    """The last guard: with the URL check bypassed, a literal address never meets the resolver, and the socket's
    connect refuses it; the server sees nothing."""
    cfg = FetchConfig(retries=0, read_timeout_s=2)

    async def fetch_all(port: int, dest: str) -> list[str]:
        async with Fetcher(cfg) as fetcher:
            fetcher.policy.check_url = lambda url: ("", "")  # type: ignore[method-assign]
            hosts = ("127.0.0.1", "[::1]", "１２７.０.０.１", "127.0.0.3")
            return [(await fetcher.fetch(f"http://{h}:{port}/v/v0.mp4", dest)).detail for h in hosts]

    with UrlServer(videos) as server:
        details = asyncio.run(fetch_all(server.port, str(tmp_path / "dest")))
        hits = sum(server.hits.values())
    assert details == ["connection to 127.0.0.1 is loopback", "connection to ::1 is loopback",
                       "connection to 127.0.0.1 is loopback", "connection to 127.0.0.3 is loopback"]  # fmt: skip
    assert hits == 0


@pytest.mark.parametrize(
    ("host", "refused"),
    [("１２７.０.０.１", "127.0.0.1 is loopback"), ("①②⑦.0.0.1", "127.0.0.1 is loopback"),
     ("127。0。0。1", "127.0.0.1 is loopback"), ("[::ffff:127.0.0.1]", "::ffff:7f00:1 is loopback"),
     ("LOCALHOST.", "localhost. is loopback (a localhost name)"),
     ("x.localhost", "x.localhost is loopback (a localhost name)"),
     ("１６９.２５４.１６９.２５４", "169.254.169.254 is link-local"), ("①⓪.0.0.1", "10.0.0.1 is private")],
)  # fmt: skip
def test_the_url_check_reads_the_host_as_the_client_does(host, refused):
    assert guard.Policy().check_url(f"http://{host}/a.mp4") == ("refused address", refused)


def test_control_characters_make_a_bad_url_and_nested_urls_are_redacted():
    policy = guard.Policy()
    assert policy.check_url("http://example.com/a\x00b.mp4")[0] == "bad url"
    assert policy.check_url("http://example.com/a\nb.mp4") == ("bad url", "it holds the control character U+000A")
    nested = "http://h/r?next=" + urllib.parse.quote("http://bob:pa55@i/x.mp4?X-Amz-Signature=s3cr3t&n=2", safe="")
    redacted = guard.redact(nested)
    assert "pa55" not in redacted and "s3cr3t" not in redacted and "bob" not in redacted
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(redacted).query)["next"] == [
        "http://i/x.mp4?X-Amz-Signature=REDACTED&n=2"
    ]


@pytest.mark.parametrize(
    ("values", "found"),
    [(["noai"], "noai"), (["noindex, nofollow"], "noindex"), (["NoImageAI"], "noimageai"), (["none"], "none"),
     (["otherbot: noindex"], ""), (["vlp-fetch: noai"], "noai"), (["*: noai, noindex"], "noai, noindex"),
     (["nofollow", "noai"], "noai"), (["nofollow, max-snippet: 20"], ""), ([], "")],
)  # fmt: skip
def test_the_opt_out_directives(values, found):
    assert robots_opt_out(values, "vlp-fetch/1.0") == found


def test_a_csv_list_is_parsed_as_csv(tmp_path):
    """Quoted newlines, commas and quotes stay in their caption; CRLF and a byte-order mark are read; a NUL byte,
    bytes that are not UTF-8 and a broken quote are bad rows naming their line, never URLs."""
    data = ("\ufeffid,url,caption\r\n"
            'a,http://h/1.mp4,"first line\r\nsecond line, with ""quotes"""\r\n'
            "b,http://h/2.mp4,plain\r\n"
            "c,http://h/3\x00.mp4,a NUL\r\n"
            'd,http://h/4.mp4,"two\nlines"\r\n').encode() + b"e,http://h/5.mp4,caf\xe9\r\n" + \
           b'f,http://h/6.mp4,"a quote"that goes on\r\ng,http://h/7.mp4,last\r\n'  # fmt: skip
    (tmp_path / "l.csv").write_bytes(data)
    fmt, rows = lists.read(str(tmp_path / "l.csv"))
    assert fmt == "urls" and [r.row for r in rows] == list(range(7))
    assert rows[0] == lists.Row(0, "a", "http://h/1.mp4", 'first line\r\nsecond line, with "quotes"')
    assert rows[1] == lists.Row(1, "b", "http://h/2.mp4", "plain") and rows[3].caption == "two\nlines"
    assert rows[2] == lists.Row(2, "row2", "", "", "bad row: its URL holds a NUL byte (0x00) at character 10 (line 5)")
    assert rows[4].url == "" and rows[4].problem.startswith("bad row: its caption is not valid UTF-8: the byte 0xe9")
    assert rows[4].problem.endswith("(line 8)")
    assert (
        rows[5].url == "" and rows[5].problem.startswith("bad row: not a CSV record") and "(line 9)" in rows[5].problem
    )
    assert rows[6] == lists.Row(6, "g", "http://h/7.mp4", "last")


def test_a_webvid_csv_with_a_bom_and_quoted_newlines_keeps_its_ids(tmp_path):
    (tmp_path / "results_10M_train.csv").write_bytes(
        "\ufeffvideoid,contentUrl,duration,page_dir,name\n"
        '31353427,http://h/1.mp4,PT00H00M12S,1,"Aerial shot\nof a city"\n'
        "31353428,http://h/2.mp4,PT00H00M10S,1,A dog\n".encode()
    )
    fmt, rows = lists.read(str(tmp_path / "results_10M_train.csv"))
    assert fmt == "webvid" and [(r.row, r.video_id, r.caption) for r in rows] == [
        (0, "31353427", "Aerial shot\nof a city"), (1, "31353428", "A dog")]  # fmt: skip


def test_a_quoted_newline_is_never_requested(tmp_path, videos):
    """The issue's case through the real command: the second half of a caption is not a row and not a request."""
    with UrlServer(videos) as server:
        listed = tmp_path / "list.csv"
        listed.write_text(f'url,caption\n{server.url("/v/v0.mp4")},"one\n/v/41.mp4 second line"\n')
        _fetch(listed, tmp_path / "out")
        hits = dict(server.hits)
    assert hits == {"/v/v0.mp4": 1}
    assert [(r["status"], r["caption"]) for r in _records(tmp_path / "out")] == [("ok", "one\n/v/41.mp4 second line")]
