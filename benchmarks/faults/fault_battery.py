"""Fault battery: hostile inputs and outages against the real steps, one table of how each was handled.

Usage::

    .venv/bin/python benchmarks/faults/fault_battery.py [--out /tmp/vlp-faults] [--only WORD ...]

Every case runs real components (real mp4 files through the real decoders, moto's S3 server behind a proxy
that injects 5xx answers and connection resets, a real ``mlflow server`` process that is SIGKILLed, a
training process that is SIGKILLed) and checks the outcome the design promises:

=====================  =====================================================================================
corrupt media          garbage, truncated, empty and missing files are rejects with a reason; good ones kept
hostile paths          ``../``, an absolute path and a symlink out of the root are rejects; nothing is opened
oversize declared      a 16000x16000 header is a reject before any decoding
unusable paths         NUL bytes, control characters and over-long names in every annotation format and a raw
                       ``videos.parquet``: that record's reject; the rest of the dataset is ingested
one id, two files      an id given to two different files (MSR-VTT json, WebVid page dirs): both rows rejected
oversize text          a 10 MB caption, a 1 MB question and answer, 5,000 captions on one clip: rejects by the limits
still image as video   PNG, JPEG and BMP files renamed ``.mp4``: rejects ("not a video"); named as images: stills
edited manifest        paths outside the media root or with a NUL byte written into ``videos.parquet`` after ingest:
                       extract-frames rejects them unopened; an index naming ``../`` files is refused by FrameStore
crashing decoder       a decoder that kills its worker (ingest, extract-frames) is a reject; the rest go on
hanging decoder        a decoder that never returns is a reject after ``timeout_s``; the rest go on
truncated checkpoint   each file of the newest checkpoint cut in half: resume from the previous one, same weights
hostile checkpoints    damaged or hostile files for ``vlp import-checkpoint`` (random bytes, terabyte headers, empty
                       or misshapen tensors, pickles of objects or code): one line naming the file, nothing written
config out of range    a zero batch size, a negative step count, a size that cannot work: exit 2, one line naming
                       the key, before the step writes anything (records lost = files under the refused output)
MLflow killed          the server SIGKILLed mid-training and restarted: training finishes, every metric arrives
MLflow down at end     the server is down when the step ends and back later: ``vlp tracking sync`` (twice) sends
                       each missing step once, in order, and ends the run FINISHED
secret in config       the ``config`` parameter (text or file) with a storage key or a URI password: refused by
                       submit and by a cluster pod, the secret never in the message; a clean config passes
S3 faults              503s and connection resets on video reads: retried, nothing lost; a lasting outage fails
                       the step naming the file, with no dataset written
kill -9 + resume       a training process SIGKILLed after its 2nd checkpoint; the rerun ends bit-identical, and
                       ``metrics.jsonl`` holds each step once
serve: credentials     ``vlp serve`` with ``VLP_SERVE_TOKEN``: 11 routes x 10 missing, wrong, malformed or misplaced
                       credentials are 401 (one line); the model-repository routes (5 path variants) are 404 with the
                       token; the probes stay open; the model still answers afterwards
text that is not text  lone surrogates in v2 / v1 / JSON-API bodies, non-UTF-8 or non-JSON bodies, a 1 MB query;
                       non-UTF-8 ``vlp search`` / ``vlp answer`` / ``vlp index`` arguments and overrides, a config file
                       that is not UTF-8 or escapes a surrogate: 4xx ``{"error"}`` or exit 2, one line each
links out of a store   a shard, a frames index, an index data or version file, model weights, ``model.json``, a
                       tokenizer directory, a checkpoint file replaced by a symbolic link (out, or inside): refused
a video is a video     a one-frame GIF, PNG, h264 mp4 and VP9 WebM and an animated WebP under video names: rejects
                       naming what the file is; an animated GIF is kept
refusals exit 2        200 runs each (two at a time) of the two error paths that aborted with 134 after their line
loopback spellings     ``vlp fetch`` of hosts that spell the loopback in Unicode digits and dots, other bases, IPv6 and
                       localhost forms, direct and behind a redirect: all refused; the server counts no request
lists that are CSV     quoted newlines, commas and quotes, CRLF, a BOM; a NUL, non-UTF-8, a broken quote: rows parsed
                       whole or ``bad row`` with their line; no caption text requested as a URL
fetch stops            SIGTERM/SIGINT at three moments: one line, no scratch left; SIGKILL then a rerun: cleaned,
                       complete; two processes on a part: the second refused; headers a byte at a time: a timeout
workers and parent     ingest, extract-frames, fetch, synth with two workers, the parent SIGKILLed: workers gone in 10 s
unwritable outputs     every writing command's ``--out`` a file, under a file, a dangling link; a file as ``--index``:
                       exit 2, one line, nothing written
numbers, YAML bombs    ``inf``/``nan``/``1e309`` for float keys (override and file), a billion-laughs file under an
                       unknown and a typed key: exit 2, one short line, in seconds
poison, linked ckpts   a run diverging (lr 1e30): one line, no checkpoint of the step; a NaN in the newest checkpoint:
                       skipped, the rerun ends as a straight one; a checkpoint or ``checkpoints/`` linked outside:
                       exit 2, one line, the copy unchanged
unknown sizes          ``model.preset`` no size of the family (unknown, another family's, empty, 10,000 characters), as
                       an override and in a file: exit 2, one line naming the family's sizes
slow bf16              bf16 asked for where the probe measures it slower than fp32: exit 2, one line, no checkpoint
serve: secrets, bytes  the token sent nine ways, secret search words, not-text query bytes on five routes: answers as
                       designed, and neither the token nor the words in any log line
=====================  =====================================================================================

A case "crashes" when it raises where the design says it must not, "hangs" when it runs past its limit (it is
then abandoned), and "records lost" counts input records that are neither accepted nor rejected (ingest) or
metrics steps missing (training). Goal: crashes 0, hangs 0, records lost 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from vlp import storage
from vlp.data import manifest, video
from vlp.data.ingest import IngestConfig, ingest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
from common import (
    HOSTILE_CHECKPOINTS,
    ROOT,
    FaultyProxy,
    MlflowServer,
    UrlServer,
    child_pids,
    fail_first,
    free_port,
    living,
    png_header,
    put,
    write_mp4,
)

sys.path.insert(0, str(ROOT))  # components/ and pipelines/, the repo's top-level packages
TINY = ROOT / "configs" / "tiny.yaml"


@dataclasses.dataclass
class Outcome:
    tried: int = 0  # faults injected (files, checkpoints, outages)
    handled: int = 0  # of those, handled as designed
    lost: int = 0  # records neither kept nor rejected / metric steps missing


# --------------------------------------------------------------------------- helpers


def _annotations(root: Path, names: list[str]) -> Path:
    ann = root / "ann.json"
    ann.write_text(json.dumps([{"video": n, "caption": f"a clip {n}"} for n in names]))
    return ann


def _rejects(out: Path) -> dict[str, str]:
    rows = manifest.read(str(out), manifest.REJECTS, manifest.REJECT_SCHEMA).to_pylist()
    return {r["record_id"]: r["reason"] for r in rows if r["kind"] == "video"}


def _cfg(video_root: Path, workers: int = 2, **kw: object) -> IngestConfig:
    return IngestConfig(workers=workers, progress=False, split="train", video_root=str(video_root), **kw)


def _lost(summary: dict) -> int:
    return sum(abs(c["input"] - c["accepted"] - c["rejected"]) for c in (summary[k] for k in ("videos", "captions")))


def _tiny_world(tmp: Path, *overrides: str) -> list[str]:
    """The tiny synthetic world ingested and frame-extracted under ``tmp``; the training steps' data arguments."""
    from vlp.config import load_config
    from vlp.steps.extract_frames import extract_frames
    from vlp.steps.ingest import ingest as ingest_step
    from vlp.steps.synth import synth

    cfg = load_config(TINY, list(overrides))
    synth(str(tmp / "raw"), cfg)
    ingest_step(str(tmp / "raw"), str(tmp / "dataset"), cfg)
    extract_frames(str(tmp / "dataset"), str(tmp / "frames"), cfg)
    return ["--dataset", str(tmp / "dataset"), "--frames", str(tmp / "frames"), "--config", str(TINY)]


# --------------------------------------------------------------------------- cases


def corrupt_media(tmp: Path) -> Outcome:
    vids = tmp / "videos"
    good = write_mp4(vids / "good.mp4")
    (vids / "garbage.mp4").write_bytes(os.urandom(5000))
    (vids / "truncated.mp4").write_bytes(good.read_bytes()[: good.stat().st_size // 3])
    (vids / "empty.mp4").write_bytes(b"")
    bad = ["garbage", "truncated", "empty", "missing"]
    ann = _annotations(tmp, ["good.mp4", *[f"{b}.mp4" for b in bad]])
    summary = ingest(str(ann), str(tmp / "out"), _cfg(vids))
    rejects = _rejects(tmp / "out")
    handled = sum(b in rejects and bool(rejects[b]) for b in bad) if summary["videos"]["accepted"] == 1 else 0
    return Outcome(len(bad), handled, _lost(summary))


def hostile_paths(tmp: Path) -> Outcome:
    root = tmp / "root"
    write_mp4(root / "inside.mp4")
    write_mp4(tmp / "outside" / "secret.mp4")
    (root / "link.mp4").symlink_to(tmp / "outside" / "secret.mp4")
    ann = _annotations(tmp, ["inside.mp4", "../outside/secret.mp4", "/etc/passwd", "link.mp4"])
    opened: list[str] = []
    real = video.probe
    video.probe = lambda path: opened.append(path) or real(path)
    try:
        summary = ingest(str(ann), str(tmp / "out"), _cfg(root, workers=1))
    finally:
        video.probe = real
    rejects = _rejects(tmp / "out")
    escaped = ["../outside/secret", "passwd", "link"]
    handled = sum(rejects.get(v, "").startswith("path outside its root") for v in escaped)
    handled = handled if opened == [str(root / "inside.mp4")] else 0
    return Outcome(len(escaped), handled, _lost(summary))


def oversize_declared(tmp: Path) -> Outcome:
    vids = tmp / "videos"
    write_mp4(vids / "good.mp4")
    png_header(vids / "bomb.png", 16000, 16000)
    ann = _annotations(tmp, ["good.mp4", "bomb.png"])
    summary = ingest(str(ann), str(tmp / "out"), _cfg(vids))
    return Outcome(1, int(_rejects(tmp / "out").get("bomb", "").startswith("too large")), _lost(summary))


def _write_annotations(fmt: str, root: Path, names: list[str]) -> Path:
    """An annotation file of ``fmt`` naming the videos ``<name>.mp4`` under ``root`` (one caption each)."""
    stems = [n.removesuffix(".mp4") for n in names]
    if fmt == "lavis":
        return put(root / "ann.json", json.dumps([{"video": n, "caption": f"clip {i}"} for i, n in enumerate(names)]))
    if fmt == "msrvtt":
        recs = [{"video_id": f"v{i}", "video": n, "caption": "c"} for i, n in enumerate(names)]
        return put(root / "ann.json", json.dumps(recs))
    if fmt == "alpro":
        return put(root / "ann.jsonl", "\n".join(json.dumps({"clip_name": s, "caption": "c"}) for s in stems))
    rows = "".join(f'"{s}",a caption,\n' for s in stems)
    return put(root / "ann.csv", f"videoid,name,page_dir\n{rows}")


def _all_rejects(out: Path) -> list[str]:
    return [r["reason"] for r in manifest.read(str(out), manifest.REJECTS, manifest.REJECT_SCHEMA).to_pylist()]


def unusable_paths(tmp: Path) -> Outcome:
    """NUL bytes, control characters and over-long names, in every annotation format and a raw videos.parquet."""
    good = write_mp4(tmp / "media" / "good.mp4")
    bad_names = ["nul\x00byte.mp4", "new\nline.mp4", "esc\x1bname.mp4", "x" * 300 + ".mp4"]
    outcome = Outcome()
    for fmt in ("lavis", "msrvtt", "alpro", "webvid"):
        ann = _write_annotations(fmt, tmp / fmt, ["good.mp4", *bad_names])
        shutil.copy(good, tmp / fmt / "good.mp4")
        summary = ingest(str(ann), str(tmp / f"out-{fmt}"), _cfg(tmp / fmt, workers=1))
        reasons = _all_rejects(tmp / f"out-{fmt}")
        outcome.tried += len(bad_names)
        ok = summary["videos"]["accepted"] == 1
        outcome.handled += sum(ok for r in reasons if r.startswith("unusable path:"))
        outcome.lost += _lost(summary)
    raw = tmp / "raw"
    shutil.copytree(tmp / "media", raw)
    row = {"split": "train", "media": "video", "source": "synth"}
    names = ["good.mp4", *bad_names]
    videos = [row | {"video_id": f"v{i}", "path": n} for i, n in enumerate(names)]
    captions = [{"video_id": v["video_id"], "caption_id": f"{v['video_id']}#0", "caption": "c", "split": "train"}
                for v in videos]  # fmt: skip
    table = manifest.from_rows(videos, manifest.RAW_VIDEO_SCHEMA)
    manifest.write(str(raw), manifest.VIDEOS, table, manifest.RAW_VIDEO_SCHEMA)
    storage.write_parquet(str(raw / manifest.CAPTIONS), manifest.from_rows(captions, manifest.CAPTION_SCHEMA))
    summary = ingest(str(raw), str(tmp / "out-raw"), _cfg(raw, workers=1))
    outcome.tried += len(bad_names)
    if summary["videos"]["accepted"] == 1:
        outcome.handled += sum(r.startswith("unusable path:") for r in _rejects(tmp / "out-raw").values())
    outcome.lost += _lost(summary)
    return outcome


def duplicate_ids(tmp: Path) -> Outcome:
    """One id given to two different files (lavis-style json with ids, and WebVid page dirs): both rows rejected."""
    for sub in ("one", "two"):
        write_mp4(tmp / sub / "a.mp4", num_frames=24 if sub == "one" else 30)
    write_mp4(tmp / "b.mp4")
    recs = [{"video_id": "a", "video": "one/a.mp4", "caption": "first"}, {"video_id": "a", "video": "two/a.mp4",
            "caption": "second"}, {"video_id": "b", "video": "b.mp4", "caption": "unrelated"}]  # fmt: skip
    summary = ingest(str(put(tmp / "ann.json", json.dumps(recs))), str(tmp / "out"), _cfg(tmp, workers=1))
    webvid = put(tmp / "ann.csv", "videoid,name,page_dir\na,first,one\na,second,two\n")
    summary_w = ingest(str(webvid), str(tmp / "out-w"), _cfg(tmp, workers=1))
    handled = 0
    for out, s, n_ok in ((tmp / "out", summary, 1), (tmp / "out-w", summary_w, 0)):
        dupes = [r for r in _all_rejects(out) if r.startswith("duplicate video_id: 'a' also names")]
        handled += int(len(dupes) == 2 and s["videos"]["accepted"] == n_ok)
    return Outcome(2, handled, _lost(summary) + _lost(summary_w))


def oversize_text(tmp: Path) -> Outcome:
    """A 10 MB caption, a 1 MB question and answer, and 5,000 captions on one video: rejects, the rest kept."""
    write_mp4(tmp / "v.mp4")
    caps = [{"video": "v.mp4", "caption": "x" * 10_000_000}] + [{"video": "v.mp4", "caption": f"c{i}"} for i in
                                                                range(5000)]  # fmt: skip
    summary = ingest(str(put(tmp / "ann.json", json.dumps(caps))), str(tmp / "out"), _cfg(tmp, workers=1))
    qa = [{"video": "v.mp4", "question": "q" * 1_000_000, "answer": "a"},
          {"video": "v.mp4", "question": "what?", "answer": "a" * 1_000_000},
          {"video": "v.mp4", "question": "what?", "answer": "red"}]  # fmt: skip
    summary_qa = ingest(str(put(tmp / "qa.json", json.dumps(qa))), str(tmp / "out-qa"), _cfg(tmp, workers=1))
    reasons = _all_rejects(tmp / "out") + _all_rejects(tmp / "out-qa")
    handled = int(sum(r.startswith("text too long: caption") for r in reasons) == 1)
    handled += int(sum(r.startswith("too many captions") for r in reasons) == 5000 - 100)
    handled += int(sum(r.startswith(("text too long: question", "text too long: answer")) for r in reasons) == 2)
    handled = handled if summary["captions"]["accepted"] == 100 and summary_qa["qa"]["accepted"] == 1 else 0
    return Outcome(3, handled, _lost(summary) + _lost(summary_qa))


def still_image_as_video(tmp: Path) -> Outcome:
    """PNG, JPEG and BMP stills renamed .mp4 are rejects ("not a video"); the same files named as images are stills."""
    from PIL import Image

    write_mp4(tmp / "good.mp4")
    names = ["good.mp4"]
    for ext in ("png", "jpg", "bmp"):
        Image.new("RGB", (32, 24), (90, 20, 200)).save(tmp / f"still-{ext}.{ext}")
        put(tmp / f"{ext}-renamed.mp4", (tmp / f"still-{ext}.{ext}").read_bytes())
        names += [f"still-{ext}.{ext}", f"{ext}-renamed.mp4"]
    summary = ingest(str(_annotations(tmp, names)), str(tmp / "out"), _cfg(tmp, workers=1))
    rejects = _rejects(tmp / "out")
    handled = sum(
        rejects.get(f"{e}-renamed", "").startswith("not a video: a still image") for e in ("png", "jpg", "bmp")
    )
    return Outcome(3, handled if summary["videos"]["accepted"] == 4 else 0, _lost(summary))


def edited_manifest(tmp: Path) -> Outcome:
    """A dataset edited after ingest (a path outside the media root, a NUL byte; an index naming ../ files):
    extract-frames makes those rows rejects without opening them; FrameStore refuses the index."""
    import pyarrow as pa

    from vlp.data import frames
    from vlp.data.frames import FramesConfig, FrameStore, extract

    for n in "abc":
        write_mp4(tmp / "raw" / f"{n}.mp4")
    secret = write_mp4(tmp / "outside" / "secret.mp4")
    ingest(str(_annotations(tmp / "raw", ["a.mp4", "b.mp4", "c.mp4"])), str(tmp / "ds"), _cfg(tmp / "raw"))
    table = storage.read_parquet(str(tmp / "ds" / manifest.VIDEOS))
    paths = table["path"].to_pylist()
    edited = table.set_column(1, "path", pa.array([paths[0], str(secret), "c\x00.mp4"]))
    storage.write_parquet(str(tmp / "ds" / manifest.VIDEOS), edited)
    opened: list[str] = []
    real = storage.local_copy
    storage.local_copy = lambda uri: opened.append(uri) or real(uri)
    try:
        summary = extract(str(tmp / "ds"), str(tmp / "frames"), FramesConfig(num_frames=2, size=32, progress=False,
                                                                              workers=1))  # fmt: skip
    finally:
        storage.local_copy = real
    handled = 2 if (summary["stored_videos"], summary["rejected"], opened) == (1, 2, [paths[0]]) else 0
    index = storage.read_parquet(str(tmp / "frames" / frames.INDEX))
    storage.write_parquet(str(tmp / "frames" / frames.INDEX), index.set_column(1, "shard", pa.array(["../../x"])))
    try:
        FrameStore(str(tmp / "frames"))
    except manifest.ManifestError:
        handled += 1
    return Outcome(3, handled, 0)


def _misbehaving(kind: str) -> Callable[[str], None]:
    def act(path: str) -> None:
        if path.endswith(f"{kind}.mp4"):
            if kind == "crash":
                os._exit(11)
            time.sleep(3600)

    return act


def bad_decoder(tmp: Path, kind: str) -> Outcome:
    from vlp.data.frames import FramesConfig, extract
    from vlp.data.frames import decode as frames  # where extract-frames' workers look decode_frames up

    vids = tmp / "videos"
    for name in ("a", kind, "b"):
        write_mp4(vids / f"{name}.mp4")
    ann = _annotations(tmp, ["a.mp4", f"{kind}.mp4", "b.mp4"])
    act, real_probe, real_decode = _misbehaving(kind), video.probe, frames.decode_frames
    video.probe = lambda path: act(path) or real_probe(path)  # the forked workers inherit the patch
    try:
        cfg = _cfg(vids, timeout_s=3.0)
        summary = ingest(str(ann), str(tmp / "ds"), cfg)
        ingest_ok = summary["videos"]["accepted"] == 2 and kind in _rejects(tmp / "ds")
    finally:
        video.probe = real_probe
    ingest(str(ann), str(tmp / "ds2"), _cfg(vids, workers=1))
    frames.decode_frames = lambda path, idx, decoder="sparse": act(path) or real_decode(path, idx, decoder)
    try:
        fsum = extract(str(tmp / "ds2"), str(tmp / "frames"), FramesConfig(num_frames=4, size=32, progress=False,
                                                                              workers=2, timeout_s=3.0))  # fmt: skip
    finally:
        frames.decode_frames = real_decode
    frames_ok = fsum["stored_videos"] == 2 and fsum["rejected"] == 1
    return Outcome(2, int(ingest_ok) + int(frames_ok), _lost(summary))


def _cli(argv: list[str]) -> tuple[int, str]:
    """``vlp <argv>`` in this process: (exit code, what it wrote to stderr)."""
    import io

    from vlp import cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse refusing the command line
            code = exc.code if isinstance(exc.code, int) else 1
    return code, err.getvalue()


def hostile_checkpoints(tmp: Path) -> Outcome:
    """Damaged and hostile files given to ``vlp import-checkpoint`` (random bytes, a header or tensor that declares
    terabytes, offsets past the end, empty tensors, misshapen tensors, pickles of other objects or of code): each
    is one error line naming the file, no traceback, no advice to load with ``weights_only=False``, nothing
    written, no code run."""
    outcome = Outcome()
    for name, (make, _) in sorted(HOSTILE_CHECKPOINTS.items()):
        folder = tmp / name.replace(".", "_")
        folder.mkdir()
        path, out = make(folder / name), folder / "out"
        code, err = _cli(["import-checkpoint", "--source", str(path), "--out", str(out)])
        lines = [line for line in err.splitlines() if " INFO " not in line]
        ok = code == 2 and len(lines) == 1 and lines[0].startswith(f"vlp import-checkpoint: error: {path}: ")
        ok = ok and "Traceback" not in err and "weights_only=False" not in err
        outcome.tried += 1
        outcome.handled += int(ok and not out.exists() and not (folder / "ran").exists())
    return outcome


def config_out_of_range(tmp: Path) -> Outcome:
    """Counts out of range and settings that cannot work, given to the training steps on a tiny world: exit 2 with
    one line naming the key, before the step writes anything. lost = files found under a refused ``--out``."""
    data = _tiny_world(tmp)
    cases = [
        (["pretrain-prompter", *data], "pretrain.batch_size=0", "pretrain.batch_size=0 must be >= 1"),
        (["pretrain-prompter", *data], "pretrain.max_steps=-1", "pretrain.max_steps=-1 must be >= 1"),
        (["pretrain-prompter", *data], "model.img_size=30", "img_size"),
        (["finetune-retrieval", "--model", "ts2net", *data], "retrieval.max_steps=-1", "retrieval.max_steps=-1"),
        (["finetune-retrieval", "--model", "ts2net", *data], "retrieval.batch_size=0", "retrieval.batch_size=0"),
        (["finetune-qa", "--pretrained", str(tmp / "none"), *data], "qa.batch_size=0", "qa.batch_size=0 must be >= 1"),
        (["extract-frames", "--dataset", str(tmp / "dataset"), "--config", str(TINY)], "storage.max_attempts=0",
         "storage.max_attempts=0"),
    ]  # fmt: skip
    outcome = Outcome()
    for i, (argv, override, says) in enumerate(cases):
        out = tmp / f"refused-{i}"
        code, err = _cli([*argv, "--out", str(out), override])
        lines = [line for line in err.splitlines() if " INFO " not in line and " WARNING " not in line]
        outcome.tried += 1
        outcome.handled += int(code == 2 and len(lines) == 1 and says in lines[0] and not out.exists())
        outcome.lost += sum(1 for f in out.rglob("*") if f.is_file()) if out.exists() else 0
    return outcome


def truncated_checkpoints(tmp: Path) -> Outcome:
    from vlp.data.loader import ResumableSampler, SamplerBatches
    from vlp.train.checkpoint import MODEL_FILE, OPTIM_FILE, STATE_FILE
    from vlp.train.loop import TrainConfig, train

    def run(out: Path, stop_at: int | None) -> torch.nn.Module:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 2))
        x, y = torch.randn(12, 4, generator=torch.Generator().manual_seed(1)), torch.arange(12) % 2
        data = SamplerBatches(ResumableSampler(12, seed=3), lambda i: (x[i], y[i]), 3)
        calls = {"n": 0}

        def step(m: torch.nn.Module, b: tuple) -> dict:
            calls["n"] += 1
            if stop_at is not None and calls["n"] > stop_at:
                raise KeyboardInterrupt  # stands for the kill: the checkpoints so far stay
            return {"loss": torch.nn.functional.cross_entropy(m(b[0]), b[1])}

        cfg = TrainConfig(out_dir=str(out), max_steps=8, ckpt_every=2, keep_last=3, seed=3, progress=False)
        with contextlib.suppress(KeyboardInterrupt):
            train(model, step, data, cfg)
        return model

    reference = run(tmp / "straight", None)
    files = [MODEL_FILE, OPTIM_FILE, "rng-rank00000.safetensors", STATE_FILE]
    handled = 0
    for name in files:
        out = tmp / f"cut-{name}"
        run(out, 5)  # checkpoints at 2 and 4
        bad = out / "checkpoints" / "step-000004" / name
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed = run(out, None)
        named = any(str(bad) in str(w.message) for w in caught)
        pairs = zip(reference.state_dict().values(), resumed.state_dict().values(), strict=True)
        same = all(torch.equal(a, b) for a, b in pairs)
        handled += int(named and same)
    return Outcome(len(files), handled, 0)


def mlflow_killed(tmp: Path) -> Outcome:
    from vlp import tracking
    from vlp.config import load_config
    from vlp.data.loader import ResumableSampler, SamplerBatches
    from vlp.models.tokenizer import train_wordpiece
    from vlp.steps.common import train_model

    server = MlflowServer(tmp)
    server.start()
    try:
        x, y = torch.randn(16, 4, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 2
        data = SamplerBatches(ResumableSampler(16, seed=0), lambda i: {"x": x[i], "y": y[i]}, 4)
        calls = {"n": 0}

        def step(m: torch.nn.Module, b: dict) -> dict:
            calls["n"] += 1
            if calls["n"] == 3:
                server.kill()
            if calls["n"] == 8:
                server.start()
            return {"loss": torch.nn.functional.cross_entropy(m(b["x"]), b["y"])}

        cfg = load_config(TINY, [f"tracking.tracking_uri={server.url}", "tracking.retry_every_s=0",
                                 "pretrain.max_steps=12", "pretrain.log_every=1"])  # fmt: skip
        result = train_model(torch.nn.Linear(4, 2), step, data, cfg, str(tmp / "out"), "pretrain",
                        tokenizer=train_wordpiece(["a b c"], vocab_size=12))  # fmt: skip
        client = tracking.client(tracking.TrackingConfig(tracking_uri=server.url))
        history = {m.step for m in client.get_metric_history(result.tracking["run_id"], "train/loss")}
        jsonl = [json.loads(s) for s in (tmp / "out" / "metrics.jsonl").read_text().splitlines()]
        steps = {m["step"] for m in jsonl if "step" in m}
        lost = (12 - len(history)) + (12 - len(steps))
        return Outcome(1, int(result.step == 12 and lost == 0 and result.tracking["complete"]), lost)
    finally:
        server.kill()


def mlflow_down_at_the_end(tmp: Path) -> Outcome:
    """The server dies at update 5 and is still down when the step ends; once it is back, ``vlp tracking sync``
    (twice) must leave the run FINISHED with each of the 12 steps once. lost = steps missing + steps doubled."""
    from vlp import tracking
    from vlp.config import load_config
    from vlp.data.loader import ResumableSampler, SamplerBatches
    from vlp.models.tokenizer import train_wordpiece
    from vlp.steps.common import run_step, train_model, train_summary

    server = MlflowServer(tmp)
    server.start()
    try:
        x, y = torch.randn(16, 4, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 2
        data = SamplerBatches(ResumableSampler(16, seed=0), lambda i: {"x": x[i], "y": y[i]}, 4)
        calls, out = {"n": 0}, tmp / "out"

        def step(m: torch.nn.Module, b: dict) -> dict:
            calls["n"] += 1
            if calls["n"] == 5:
                server.kill()
            return {"loss": torch.nn.functional.cross_entropy(m(b["x"]), b["y"])}

        cfg = load_config(TINY, [f"tracking.tracking_uri={server.url}", "tracking.retry_every_s=60",
                                 "pretrain.max_steps=12", "pretrain.log_every=1"])  # fmt: skip
        tok = train_wordpiece(["a b c"], vocab_size=12)

        def work() -> dict:
            model = torch.nn.Linear(4, 2)
            return train_summary(train_model(model, step, data, cfg, str(out), "pretrain", tokenizer=tok))

        summary = run_step("pretrain", str(out), cfg, "pretrain", work)
        server.start()
        cmd = [sys.executable, "-m", "vlp.cli", "tracking", "sync", "--config", str(TINY), str(out),
               f"tracking.tracking_uri={server.url}"]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        first, second = (subprocess.run(cmd, capture_output=True, text=True, env=env) for _ in range(2))
        client = tracking.client(tracking.TrackingConfig(tracking_uri=server.url))
        run_id = summary["tracking"]["run_id"]
        history = [m.step for m in client.get_metric_history(run_id, "train/loss")]
        lost = (12 - len(set(history))) + (len(history) - len(set(history)))
        synced = first.returncode == 0 and second.returncode == 0 and json.loads(second.stdout)["sent"] == 0
        ok = summary["tracking"]["unsent"] > 0 and synced and client.get_run(run_id).info.status == "FINISHED"
        return Outcome(1, int(ok and lost == 0), lost)
    finally:
        server.kill()


def secret_in_config(tmp: Path) -> Outcome:
    """Storage keys or a URI password in the ``config`` run parameter (YAML text, or a file it names): refused by
    submit and by a cluster pod before any work, the secret never in the message; a clean config passes both."""
    from components._runtime import load_step_config
    from pipelines.submit import SubmitError, check_no_credentials

    sentinel = "SENTINEL-s3cr3t"
    texts = [f"storage:\n  secret_access_key: {sentinel}\n", f"storage:\n  access_key_id: {sentinel}\n",
             f"tracking:\n  tracking_uri: http://user:{sentinel}@mlflow:5000\n"]  # fmt: skip
    variants = []
    for i, text in enumerate(texts):
        path = tmp / f"secret-{i}.yaml"
        path.write_text(text)
        variants += [text, str(path)]
    outcome = Outcome()
    before = os.environ.get("KFP_POD_NAME")
    os.environ["KFP_POD_NAME"] = "fault-battery-pod"
    try:
        for config in variants:
            outcome.tried += 2
            try:
                check_no_credentials({"config": config})
            except SubmitError as exc:
                outcome.handled += int(sentinel not in str(exc))
            try:
                load_step_config(config, [])
            except ValueError as exc:
                outcome.handled += int("credentials in the step config" in str(exc) and sentinel not in str(exc))
        outcome.tried += 1
        check_no_credentials({"config": str(TINY)})
        load_step_config(str(TINY), [])
        outcome.handled += 1
    finally:
        if before is None:
            os.environ.pop("KFP_POD_NAME", None)
        else:
            os.environ["KFP_POD_NAME"] = before
    return outcome


def s3_faults(tmp: Path) -> Outcome:
    moto = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    port = free_port()
    proc = subprocess.Popen(
        [moto, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            time.sleep(0.1)
        base = storage.StorageConfig(endpoint_url=url, access_key_id="k", secret_access_key="s")
        storage.configure(base)
        storage.client().create_bucket(Bucket="faults")
        names = ["a", "b", "c"]
        for n in names:
            storage.upload(write_mp4(tmp / "videos" / f"{n}.mp4"), f"s3://faults/raw/videos/{n}.mp4")
        ann = "s3://faults/raw/ann.json"
        storage.write_text(ann, json.dumps([{"video": f"videos/{n}.mp4", "caption": n} for n in names]))
        cfg = IngestConfig(workers=2, progress=False, split="train", retry_wait_s=0.05)
        outcome = Outcome()
        for fault, key in (("503", "videos/a.mp4"), ("reset", "videos/b.mp4")):
            with FaultyProxy(url, fail_first(2, fault, key)) as proxy:
                storage.configure(dataclasses.replace(base, endpoint_url=proxy, max_attempts=1))
                summary = ingest(ann, str(tmp / f"out-{fault}"), cfg)
            outcome.tried += 1
            outcome.handled += int(summary["videos"]["accepted"] == 3)
            outcome.lost += _lost(summary) + (3 - summary["videos"]["accepted"])
        with FaultyProxy(url, fail_first(10**6, "503", "videos/c.mp4")) as proxy:
            storage.configure(dataclasses.replace(base, endpoint_url=proxy, max_attempts=1))
            outcome.tried += 1
            try:
                ingest(ann, str(tmp / "out-lasting"), dataclasses.replace(cfg, storage_retries=2))
            except storage.StorageError as exc:
                outcome.handled += int("c.mp4" in str(exc) and not (tmp / "out-lasting" / manifest.VIDEOS).exists())
        return outcome
    finally:
        storage.configure(storage.StorageConfig())
        proc.terminate()
        proc.wait(timeout=10)


def kill_and_resume(tmp: Path) -> Outcome:
    data = _tiny_world(tmp)

    def cmd(out: Path) -> list[str]:
        return [sys.executable, "-m", "vlp.cli", "pretrain-prompter", *data, "--out", str(out), "pretrain.max_steps=6",
                "pretrain.ckpt_every=1"]  # fmt: skip

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd(tmp / "straight"), check=True, capture_output=True, env=env)
    proc = subprocess.Popen(cmd(tmp / "killed"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    while not (tmp / "killed" / "checkpoints" / "step-000002" / "state.json").exists() and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    subprocess.run(cmd(tmp / "killed"), check=True, capture_output=True, env=env)
    last = Path("checkpoints") / "step-000006"
    same = all((tmp / "killed" / last / f).read_bytes() == (tmp / "straight" / last / f).read_bytes()
               for f in ("model.safetensors", "optimizer.safetensors", "rng-rank00000.safetensors"))  # fmt: skip
    lines = (tmp / "killed" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(s)["step"] for s in lines if '"step"' in s]
    doubled = len(steps) - len(set(steps))  # metrics.jsonl must hold each step once after a resume
    return Outcome(1, int(same and doubled == 0), 6 - len(set(steps)) + doubled)


def _tiny_index(tmp: Path) -> dict[str, str]:
    """The tiny synthetic world ingested and frame-extracted, a random-init ALPRO retrieval model (tiny sizes) and the
    index of its clips: ``{"dataset", "frames", "model", "index"}``."""
    from vlp.config import load_config
    from vlp.models import directory, family
    from vlp.models.tokenizer import train_wordpiece
    from vlp.settings import ModelConfig, RetrievalConfig
    from vlp.steps.extract_frames import extract_frames
    from vlp.steps.index import index_clips
    from vlp.steps.ingest import ingest as ingest_step
    from vlp.steps.synth import synth
    from vlp.train.checkpoint import save_model_weights

    cfg = load_config(TINY, ["retrieval.num_workers=0"])
    uris = {name: str(tmp / name) for name in ("raw", "dataset", "frames", "model", "index")}
    synth(uris["raw"], cfg)
    ingest_step(uris["raw"], uris["dataset"], cfg)
    extract_frames(uris["dataset"], uris["frames"], cfg)
    rows = manifest.read(uris["dataset"], manifest.CAPTIONS, manifest.CAPTION_SCHEMA).to_pylist()
    tok = train_wordpiece([r["caption"] for r in rows if r["split"] == "train"], vocab_size=300)
    fam = family.get("alpro")
    section = ModelConfig(family="alpro", preset="tiny", img_size=32, num_frames=2, max_len=24, embed_dim=16)
    mcfg = fam.prepare(fam.task_config(fam.config(section, len(tok), 4), "retrieval",
                                       RetrievalConfig(num_frames=2, max_len=24)), 2, 4)  # fmt: skip
    torch.manual_seed(0)
    weights = save_model_weights(str(tmp / "model" / "weights"), fam.build(fam.kinds.retrieval, mcfg))
    directory.save(uris["model"], kind=fam.kinds.retrieval, config=mcfg, checkpoint=weights, tokenizer=tok, steps=0)
    index_clips(uris["model"], uris["frames"], uris["index"], cfg)
    return uris


def _http(url: str, body: bytes | None = None, auth: str | None = None) -> tuple[int, dict[str, str], bytes]:
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"} | ({"Authorization": auth} if auth else {})
    request = urllib.request.Request(url, data=body, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _one_line_error(raw: bytes) -> bool:
    try:
        doc = json.loads(raw)
    except ValueError:
        return False
    return isinstance(doc, dict) and list(doc) == ["error"] and "\n" not in str(doc["error"])


@contextlib.contextmanager
def _serving(tmp: Path, uris: dict[str, str], token: str | None) -> Iterator[str]:
    """``vlp serve`` over the index in a subprocess (``VLP_SERVE_TOKEN`` = ``token``), its base URL while inside."""
    import re

    env = {k: v for k, v in os.environ.items() if k != "VLP_SERVE_TOKEN"} | {"OMP_NUM_THREADS": "1"}
    env |= {"VLP_SERVE_TOKEN": token} if token else {}
    log = tmp / "serve.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "vlp.cli", "serve", "--index", uris["index"], "--port", "0",
                                 "--config", str(TINY), "retrieval.num_workers=0"], stdout=fh, stderr=subprocess.STDOUT,
                                env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"listening on (http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vlp serve did not start:\n{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        yield found[1]
    finally:
        proc.terminate()
        proc.wait(30)


def serve_access(tmp: Path) -> Outcome:
    """``vlp serve`` with ``VLP_SERVE_TOKEN``: every route but the probes refuses a missing, wrong, malformed or
    misplaced credential (401, one line); KServe's model-repository routes (unload, load; path variants: a trailing
    slash, percent-encoding, a doubled slash) neither unload nor answer 200, with or without the token; afterwards the
    model still answers."""
    import base64

    uris, token = _tiny_index(tmp), "battery-token-0123456789abcdef"
    outcome = Outcome()
    routes = ["/api/search?q=star", "/", "/openapi.json", "/metrics", "/v2/models/vlp-search", "/api/clips/x",
              "/v2/models/vlp-search/infer", "/v1/models/vlp-search:predict", "/api/answer",
              "/v2/repository/models/vlp-search/unload", "/v2/repository/models/vlp-search/load"]  # fmt: skip
    wrong = [None, "Bearer nope-0123456789abcdef", "Bearer ", f"Bearer {token}x", f"bearer{token}",
             "Basic " + base64.b64encode(f"user:{token[:-1]}".encode()).decode(), "Basic %%%", f"Digest {token}",
             token]  # fmt: skip
    posts = {"/v2/models/vlp-search/infer", "/v1/models/vlp-search:predict", "/api/answer"}
    with _serving(tmp, uris, token) as url:
        for route in routes:
            body = b"{}" if route in posts or "repository" in route else None
            for auth in wrong:
                status, headers, raw = _http(url + route, body, auth)
                outcome.tried += 1
                challenged = "www-authenticate" in {k.lower() for k in headers}
                outcome.handled += int(status == 401 and _one_line_error(raw) and challenged)
            outcome.tried += 1  # the token in the query string instead of the header: refused, with the way to send it
            status, _, raw = _http(url + route + ("&" if "?" in route else "?") + f"token={token}", body)
            outcome.handled += int(status == 400 and _one_line_error(raw) and b"Authorization" in raw)
        good = f"Bearer {token}"
        for path in ("/v2/repository/models/vlp-search/unload", "/v2/repository/models/vlp-search/unload/",
                     "/v2/repository/models/vlp-search/%75nload", "//v2/repository/models/vlp-search/unload",
                     "/v2/repository/models/vlp-search/load", "/v2/repository/index"):  # fmt: skip
            status, _, raw = _http(url + path, b"{}", good)
            outcome.tried += 1
            outcome.handled += int(status in (404, 405) and _one_line_error(raw))
        for probe in ("/healthz", "/v2/health/live", "/v2/health/ready"):
            outcome.tried += 1
            outcome.handled += int(_http(url + probe)[0] == 200)
        status, _, raw = _http(url + "/api/search?q=a+red+star&k=3", None, good)
        outcome.tried += 1
        outcome.handled += int(status == 200 and len(json.loads(raw)["hits"]) == 3)
    return outcome


def text_not_text(tmp: Path) -> Outcome:
    """Text that is not valid UTF-8 wherever it enters: lone surrogates in JSON (v2, v1, the JSON API), bodies that
    are not UTF-8 or not JSON, a 1 MB query string, a query over ``index.max_text_chars``; non-UTF-8 bytes in
    ``vlp search`` / ``vlp answer`` arguments and overrides, a config file that is not UTF-8 or escapes a surrogate.
    Each is a 4xx with one ``{"error": ...}`` line, or exit 2 with one line; never a 500 or a traceback."""
    uris = _tiny_index(tmp)
    outcome = Outcome()
    with _serving(tmp, uris, None) as url:
        infer, v1 = f"{url}/v2/models/vlp-search/infer", f"{url}/v1/models/vlp-search:predict"
        bodies = []
        for text in ("\udc80", "a \ud800 star", "\udfff", "ok \udcff\udcfe"):
            v2 = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
            bodies += [(infer, json.dumps(v2).encode()), (v1, json.dumps({"instances": [{"text": text}]}).encode())]
            bodies.append((f"{url}/api/answer", json.dumps({"video_id": "x", "question": text}).encode()))
        for raw in (b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["\xff\xfe"]}]}',
                    b"{not json", b"\x00\x01", b'{"instances": [{"text": "\xc3\x28"}]}'):  # fmt: skip
            bodies += [(infer, raw), (v1, raw), (f"{url}/api/answer", raw)]
        for target, body in bodies:
            status, _, raw = _http(target, body)
            outcome.tried += 1
            outcome.handled += int(400 <= status < 500 and _one_line_error(raw))
        for query in ("a" * 1001, "a" * (1 << 20), "%FF%FE"):
            status, _, raw = _http(f"{url}/api/search?q={query}")
            outcome.tried += 1
            outcome.handled += int(400 <= status < 500 and _one_line_error(raw))
        log = (tmp / "serve.log").read_text(errors="replace")
        outcome.tried += 1
        outcome.handled += int("Traceback" not in log and " 500 " not in log)
    (tmp / "latin1.yaml").write_bytes(b"frames:\n  size: 32  # caf\xe9\n")
    (tmp / "escaped.yaml").write_text('retrieval:\n  split: "\\udc80"\n')
    index, model = uris["index"].encode(), uris["model"].encode()
    argvs = [[b"search", b"--index", index, b"a \xff star"], [b"search", b"--index", index, b"\xc3\x28"],
             [b"search", b"--index", index, b"star", b"retrieval.split=\xff"],
             [b"search", b"--index", index, b"x" * 1001], [b"search", b"--index", index, b"   "],
             [b"answer", b"--model", model, b"--index", index, b"synth-000000", b"what \xe9?"],
             [b"answer", b"--model", model, b"--index", index, b"synth-000000", b"q" * 5000],
             [b"search", b"--index", index, b"--config", str(tmp / "latin1.yaml").encode(), b"star"],
             [b"search", b"--index", index, b"--config", str(tmp / "escaped.yaml").encode(), b"star"],
             [b"index", b"--model", model, b"--frames", uris["frames"].encode(), b"--out", b"\xff"]]  # fmt: skip
    for argv in argvs:
        done = subprocess.run([sys.executable.encode(), b"-m", b"vlp.cli", *argv], capture_output=True, timeout=300)
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        outcome.tried += 1
        outcome.handled += int(done.returncode == 2 and len(lines) == 1 and ": error: " in lines[0])
    return outcome


def links_out_of_a_store(tmp: Path) -> Outcome:
    """A file of a frames store, an index, a model directory or a checkpoint replaced by a symbolic link to a real
    file of the same kind outside (and a directory linked in, and a link pointing inside): each reader refuses it in
    one line naming the link, through the CLI where a command reads it (exit 2)."""
    from vlp.train.checkpoint import MODEL_FILE, load_checkpoint, save_checkpoint

    uris = _tiny_index(tmp)
    outcome = Outcome()

    def relink(path: Path, target: Path) -> None:
        shutil.move(path, target)
        path.symlink_to(target)

    def refused(argv: list[str], what: str) -> int:
        code, err = _cli([*argv, "--config", str(TINY)] if argv[0] != "search" else argv)
        lines = [line for line in err.splitlines() if " INFO " not in line and " WARNING " not in line]
        return int(code == 2 and len(lines) == 1 and f"the {what} " in lines[0] and "symbolic link" in lines[0])

    cases: list[tuple[str, str, Callable[[Path], Path], Callable[[Path], list[str]]]] = [
        ("frames store", "frames", lambda d: next((d / "shards").iterdir()),
         lambda d: ["index", "--model", uris["model"], "--frames", str(d), "--out", str(tmp / "new-index")]),
        ("frames store", "frames", lambda d: d / "index.parquet",
         lambda d: ["index", "--model", uris["model"], "--frames", str(d), "--out", str(tmp / "new-index2")]),
        ("index", "index", lambda d: next((d / "clips.lance" / "data").iterdir()),
         lambda d: ["search", "--index", str(d), "--config", str(TINY), "a star"]),
        ("index", "index", lambda d: next((d / "clips.lance" / "_versions").iterdir()),
         lambda d: ["search", "--index", str(d), "--config", str(TINY), "a star"]),
        ("model directory", "model", lambda d: next(d.rglob("*.safetensors")),
         lambda d: ["index", "--model", str(d), "--frames", uris["frames"], "--out", str(tmp / "new-index3")]),
        ("model directory", "model", lambda d: d / "model.json",
         lambda d: ["index", "--model", str(d), "--frames", uris["frames"], "--out", str(tmp / "new-index4")]),
        ("model directory", "model", lambda d: d / "tokenizer",
         lambda d: ["index", "--model", str(d), "--frames", uris["frames"], "--out", str(tmp / "new-index5")]),
    ]  # fmt: skip
    for i, (what, name, pick, argv) in enumerate(cases):
        copy = tmp / f"{name}-{i}"
        shutil.copytree(uris[name], copy)
        picked = pick(copy)
        relink(picked, tmp / f"outside-{i}-{picked.name}")
        outcome.tried += 1
        outcome.handled += refused(argv(copy), what)
    inside = tmp / "frames-inside"
    shutil.copytree(uris["frames"], inside)
    shard = next((inside / "shards").iterdir())
    shutil.copy(shard, inside / "spare.parquet")
    shard.unlink()
    shard.symlink_to(inside / "spare.parquet")  # a link that stays inside the store is refused as well
    outcome.tried += 1
    outcome.handled += refused(["index", "--model", uris["model"], "--frames", str(inside), "--out",
                                str(tmp / "new-index6")], "frames store")  # fmt: skip
    torch.manual_seed(0)
    where = save_checkpoint(str(tmp / "run"), 1, torch.nn.Linear(3, 2), None, None)
    relink(Path(where) / MODEL_FILE, tmp / "outside-weights.safetensors")
    fresh = torch.nn.Linear(3, 2)
    before = fresh.weight.detach().clone()
    outcome.tried += 1
    try:
        load_checkpoint(where, fresh, restore_rng=False)
    except storage.LinkError:
        outcome.handled += int(torch.equal(fresh.weight, before))
    return outcome


def video_is_a_video(tmp: Path) -> Outcome:
    """Files that decode to fewer than two frames, or to none over time, under a video name (a one-frame GIF, APNG,
    h264 mp4 and WebM; an animated WebP that ffmpeg reads as one picture): rejects whose reason names what the file
    is; an animated GIF and the good mp4 are kept."""
    import av
    from PIL import Image

    frames = [Image.fromarray(np.full((24, 32, 3), 40 * i, np.uint8)) for i in range(5)]
    frames[0].save(tmp / "one-gif.mp4", format="GIF")
    frames[0].save(tmp / "one-apng.mp4", format="PNG", save_all=True, append_images=[], duration=100)
    frames[0].save(tmp / "anim-webp.mp4", format="WEBP", save_all=True, append_images=frames[1:], duration=100)
    frames[0].save(tmp / "anim-gif.mp4", format="GIF", save_all=True, append_images=frames[1:], duration=100)
    write_mp4(tmp / "one-h264.mp4", num_frames=1)
    write_mp4(tmp / "good.mp4")
    with av.open(str(tmp / "one-vp9.webm"), "w") as container:
        stream = container.add_stream("libvpx-vp9", rate=12)
        stream.width, stream.height, stream.pix_fmt = 32, 24, "yuv420p"
        for packet in [*stream.encode(av.VideoFrame.from_ndarray(np.zeros((24, 32, 3), np.uint8), format="rgb24")),
                       *stream.encode()]:  # fmt: skip
            container.mux(packet)
    bad = {"one-gif": "a GIF image", "one-apng": "a still image (png", "one-h264": "a h264 stream",
           "anim-webp": "an animated WEBP image of 5 frames", "one-vp9": "a vp9 stream"}  # fmt: skip
    names = ["good.mp4", "anim-gif.mp4", *[f"{b}.webm" if b == "one-vp9" else f"{b}.mp4" for b in bad]]
    summary = ingest(str(_annotations(tmp, names)), str(tmp / "out"), _cfg(tmp, workers=1))
    rejects = _rejects(tmp / "out")
    kept = summary["videos"]["accepted"] == 2
    handled = sum(rejects.get(b, "").startswith(f"not a video: {what}") for b, what in bad.items())
    return Outcome(len(bad), handled if kept else 0, _lost(summary))


def exit_codes(tmp: Path, runs: int = 200) -> Outcome:
    """The two error paths that used to abort after their error line (exit 134): ``extract-frames --merge`` with a
    part that lost a shard, and a FrameStore refusing an index that names a file outside its shards; each run
    ``runs`` times, two processes at a time, counted by exit code (stderr names any other code)."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa

    from vlp.data.frames import FramesConfig, extract_part

    for n in "abc":
        write_mp4(tmp / "raw" / f"{n}.mp4", num_frames=6)
    ingest(str(_annotations(tmp / "raw", ["a.mp4", "b.mp4", "c.mp4"])), str(tmp / "ds"), _cfg(tmp / "raw", workers=1))
    fcfg = FramesConfig(num_frames=2, size=32, progress=False, workers=1, videos_per_shard=1)
    parts = [str(tmp / f"part{i}") for i in range(2)]
    for i, part in enumerate(parts):
        extract_part(str(tmp / "ds"), part, fcfg, i, 2)
    next(Path(parts[0], "shards").iterdir()).unlink()
    store = tmp / "store"
    store.mkdir()
    storage.write_parquet(str(store / "index.parquet"), pa.table({"video_id": ["a"], "shard": ["../../etc/passwd"],
                          "num_stored": [2], "num_frames": [6], "fps": [12.0]}))  # fmt: skip
    merge = [sys.executable, "-m", "vlp.cli", "extract-frames", "--dataset", str(tmp / "ds"), "--out",
             str(tmp / "merged"), "--merge", parts[0], "--merge", parts[1], "frames.num_frames=2", "frames.size=32",
             "frames.workers=1", "frames.videos_per_shard=1", "frames.progress=false"]  # fmt: skip
    child = (
        "import sys\nfrom vlp.data.frames import FrameStore\ntry:\n    FrameStore(sys.argv[1])\n"
        "except ValueError as e:\n    print(e, file=sys.stderr)\n    sys.exit(2)"
    )
    refuse = [sys.executable, "-c", child, str(store)]
    outcome = Outcome()
    for name, cmd in (("extract-frames --merge", merge), ("FrameStore refusing its index", refuse)):
        with ThreadPoolExecutor(2) as pool:
            done = pool.map(functools.partial(subprocess.run, capture_output=True, timeout=120), [cmd] * runs)
            codes = [proc.returncode for proc in done]
        counts = {c: codes.count(c) for c in sorted(set(codes))}
        print(f"  {name}: {runs} runs, exit codes {counts}", file=sys.stderr, flush=True)
        outcome.tried += runs
        outcome.handled += codes.count(2)
    return outcome


# --------------------------------------------------------------------------- the edges of issue 58: URLs, lists, logs,
# processes, outputs, numbers


def _fetch_cli(source: Path, out: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    fast = ["fetch.read_timeout_s=2", "fetch.backoff_s=0.05", "fetch.progress=false", "fetch.retries=0"]
    return subprocess.run([sys.executable, "-m", "vlp.cli", "fetch", "--source", str(source), "--out", str(out),
                           *fast, *overrides], capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _fetched(out: Path) -> list[dict]:
    return storage.read_parquet(str(out / "fetch.parquet")).to_pylist()


def _one_line(err: str, prefix: str) -> bool:
    lines = [line for line in err.strip().splitlines() if " INFO " not in line and " WARNING " not in line]
    return len(lines) == 1 and lines[0].startswith(prefix) and "Traceback" not in err


# Spellings of this machine's loopback (127.0.0.0/8, ::1, and 0.0.0.0, which Linux connects to the loopback) that the
# URL library folds to ASCII (IDNA/UTS 46) or that another reader might take for a name: only loopback addresses, so a
# bypass can only reach this machine.
LOOPBACK_SPELLINGS = ["１２７.０.０.１", "127。0。0。2", "127．9．8．7", "127｡1｡1｡1", "⑫⑦.0.0.1", "①②⑦.0.0.1",
                      "𝟭𝟮𝟳.0.0.1", "𝟙𝟚𝟟.0.0.1", "١٢٧.0.0.1", "۱۲۷.0.0.1", "१२७.0.0.1", "₁₂₇.₀.₀.₁", "¹²⁷.0.0.1",
                      "127.0.0.1.", "127.0.0.1..", "127.000.000.001", "0x7f000001", "0x7f.0.0.1", "017700000001",
                      "127.1", "127.0.1", "2130706433", "０.０.０.０", "0.0.0.0.", "0", "[::1]", "[0:0:0:0:0:0:0:1]",
                      "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[0::ffff:127.0.0.1]", "[::127.0.0.1]", "[::]",
                      "localhost", "LocalHost.", "ｌｏｃａｌｈｏｓｔ", "x.localhost", "localhost.localdomain",
                      "127.0.0.1:80@127.0.0.1", "127.0.0.1%2e"]  # fmt: skip


def loopback_spellings(tmp: Path) -> Outcome:
    """``vlp fetch`` of a list whose hosts spell the loopback every way above (no allowlist), and of redirects from
    an allowed 127.0.0.1 to spellings of other loopback addresses and 0.0.0.0: no row fetched (an address the rule
    refuses, a URL the client cannot read, or a name that resolves nowhere: digits IDNA does not fold, such as
    Arabic-Indic ones, make a name), and a server that counts every request sees none but the redirecting hops.
    lost = rows without a record."""
    data = write_mp4(tmp / "a.mp4").read_bytes()
    outcome = Outcome()
    with UrlServer({"a.mp4": data}) as server:
        urls = [f"http://{host}:{server.port}/v/a.mp4" for host in LOOPBACK_SPELLINGS]
        put(tmp / "direct.txt", "\n".join(urls) + "\n")
        _fetch_cli(tmp / "direct.txt", tmp / "direct", "fetch.allow=[]")
        direct_hits = sum(server.hits.values())
        hosts = ("０.０.０.０", "127。0。0。2", "[::1]", "[::]", "127.0.0.1.", "[::ffff:127.0.0.2]", "①②⑦.0.0.3")
        targets = [f"http://{host}:{server.port}/v/a.mp4" for host in hosts]
        put(tmp / "hops.txt", "\n".join(server.url("/to?u=" + t) for t in targets) + "\n")
        _fetch_cli(tmp / "hops.txt", tmp / "hops", 'fetch.allow=["127.0.0.1/32"]')
        hop_hits = {path for path in server.hits if not path.startswith("/to")}
    for out, n in ((tmp / "direct", len(urls)), (tmp / "hops", len(targets))):
        records = _fetched(out) if (out / "fetch.parquet").exists() else []
        outcome.tried += n
        outcome.handled += sum(r["status"] != "ok" for r in records)  # refused, unreadable, or a name none resolves
        outcome.lost += n - len(records)
    if direct_hits or hop_hits:
        outcome.handled = 0
    return outcome


def lists_as_csv(tmp: Path) -> Outcome:
    """URL lists as spreadsheets and scripts write them: quoted newlines, commas and doubled quotes in captions, CRLF,
    a byte-order mark, blank lines; and records that are not records (a NUL, bytes that are not UTF-8, a broken
    quote): the good rows fetched with their captions whole, the others ``bad row`` rejects naming their line, and
    no request for any text of a caption. Each row is a fault tried."""
    data = write_mp4(tmp / "a.mp4").read_bytes()
    outcome = Outcome()
    with UrlServer({"a.mp4": data}) as server:
        u = [server.url(f"/v/a.mp4?n={i}") for i in range(8)]
        good = {0: 'one\r\n/v/41.mp4 two', 1: 'a, "quoted", caption', 2: "plain", 4: "three\nlines\nhere",
                6: "after a broken one"}  # fmt: skip
        text = ("\ufeffurl,caption,id\r\n"
                f'{u[0]},"one\r\n/v/41.mp4 two",a\r\n{u[1]},"a, ""quoted"", caption",b\r\n\r\n{u[2]},plain,c\r\n'
                f"{u[3]},a \x00 NUL,d\r\n" f'{u[4]},"three\nlines\nhere",e\r\n').encode()  # fmt: skip
        text += (
            f"{u[5]},caf".encode()
            + b"\xe9,f\r\n"
            + f'{u[6]},"broken"quote,g\r\n{u[7]},after a broken one,h\r\n'.encode()
        )
        (tmp / "list.csv").write_bytes(text)
        _fetch_cli(tmp / "list.csv", tmp / "out", 'fetch.allow=["127.0.0.1/32"]', "fetch.probe=false")
        asked = set(server.hits)
        webvid = ("\ufeffvideoid,contentUrl,duration,page_dir,name\n"
                  f'31,{u[0]},PT10S,1,"Aerial\nview, a city"\n32,{u[1]},PT10S,1,A dog\n')  # fmt: skip
        (tmp / "results_10M_train.csv").write_text(webvid, encoding="utf-8")
        _fetch_cli(tmp / "results_10M_train.csv", tmp / "webvid", 'fetch.allow=["127.0.0.1/32"]', "fetch.probe=false")
    records = _fetched(tmp / "out")
    expect_ok = {0: good[0], 1: good[1], 2: good[2], 4: good[4], 7: "after a broken one"}
    for r in records:
        outcome.tried += 1
        if r["row"] in expect_ok:
            outcome.handled += int(r["status"] == "ok" and r["caption"] == expect_ok[r["row"]])
        else:
            outcome.handled += int(r["status"] == "bad row" and "(line " in r["detail"] and r["url"] == "")
    outcome.lost += 8 - len(records)
    wv = _fetched(tmp / "webvid")
    outcome.tried += 2
    want = [("31", "Aerial\nview, a city"), ("32", "A dog")]
    outcome.handled += sum((r["video_id"], r["caption"]) == pair for r, pair in zip(wv, want, strict=False))
    outcome.lost += 2 - len(wv)
    if any("41" in path or "two" in path for path in asked):
        outcome.handled = 0
    return outcome


def fetch_stops_cleanly(tmp: Path) -> Outcome:
    """``vlp fetch`` stopped: SIGTERM or SIGINT at three moments (downloads in flight, batches being probed and
    stored, just started): exit 143/130 and the one line, no traceback or asyncio complaint, no scratch folder left;
    SIGKILL, then a rerun: the rerun empties what the kill left and ends with every row; a second process on the
    same part: exit 2, one line naming the first; a server sending its headers a byte every 0.2 s: a timeout within
    a few seconds, not the attempt's 10 minutes."""
    from vlp.data.fetch.part import scratch_dir

    data = write_mp4(tmp / "a.mp4", num_frames=48, size=(160, 120)).read_bytes()
    outcome = Outcome()
    allow = ['fetch.allow=["127.0.0.1/32"]', "fetch.read_timeout_s=2", "fetch.progress=false", "fetch.batch=8",
             "fetch.min_bytes_per_s=0"]  # fmt: skip

    def command(listed: Path, out: Path) -> list[str]:
        return [sys.executable, "-m", "vlp.cli", "fetch", "--source", str(listed), "--out", str(out), *allow]

    with UrlServer({"a.mp4": data}) as server:
        urls = [server.url(f"/drip/a.mp4?n={i}") for i in range(3)] + [
            server.url(f"/v/a.mp4?n={i}") for i in range(300)
        ]
        listed = put(tmp / "list.txt", "\n".join(urls) + "\n")
        for i, (sig, after) in enumerate([(signal.SIGTERM, 0.3), (signal.SIGTERM, 4.0), (signal.SIGINT, 2.0)]):
            out = tmp / f"stopped-{i}"
            proc = subprocess.Popen(command(listed, out), stderr=subprocess.PIPE, text=True)
            time.sleep(after)
            proc.send_signal(sig)
            err = proc.communicate(timeout=120)[1]
            last = err.strip().splitlines()[-1] if err.strip() else ""
            clean = not any(w in err for w in ("Traceback", "Task was destroyed", "coroutine", "Exception ignored"))
            outcome.tried += 1
            said = last.endswith("interrupted; rerun the same command to run it again")
            gone = not Path(scratch_dir(str(out), 0, 1)).exists()
            outcome.handled += int(proc.returncode == 128 + sig and clean and said and gone)
        out = tmp / "killed"
        proc = subprocess.Popen(command(listed, out), stderr=subprocess.DEVNULL)
        scratch = Path(scratch_dir(str(out), 0, 1))
        deadline = time.monotonic() + 60
        while not any(scratch.glob("*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = subprocess.run(command(listed, out), capture_output=True, text=True, timeout=120)
        outcome.tried += 1
        outcome.handled += int(second.returncode == 2 and f"another process (pid {proc.pid})" in second.stderr)
        proc.kill()
        proc.wait()
        left = scratch.exists() and any(scratch.iterdir())
        rerun = subprocess.run(command(listed, out), capture_output=True, text=True, timeout=600)
        outcome.tried += 1
        done = rerun.returncode == 0 and len(_fetched(out)) == len(urls)
        outcome.handled += int(left and done and not scratch.exists())
        outcome.lost += len(urls) - len(_fetched(out)) if (out / "fetch.parquet").exists() else len(urls)
        start = time.monotonic()
        slow = _fetch_cli(put(tmp / "slow.txt", server.url("/slowhead/a.mp4") + "\n"), tmp / "slow", *allow)
        record = _fetched(tmp / "slow")[0]
        outcome.tried += 1
        outcome.handled += int(slow.returncode == 0 and record["status"] == "timeout" and time.monotonic() - start < 60)
    return outcome


def workers_with_their_parent(tmp: Path) -> Outcome:
    """``vlp ingest`` (``ingest.workers=2``), ``vlp extract-frames`` (``frames.workers=2``), ``vlp fetch``
    (``fetch.probe_workers=2``) and ``vlp data synth`` (workers=2): the parent SIGKILLed once two workers run (what
    the OOM killer or a pod eviction does); every worker gone within 10 s. A command whose workers were never seen
    counts as not handled."""
    from vlp.config import load_config
    from vlp.steps.ingest import ingest as ingest_step
    from vlp.steps.synth import synth

    cfg = load_config(TINY, ["synth.num_videos=48"])
    synth(str(tmp / "raw"), cfg)
    ingest_step(str(tmp / "raw"), str(tmp / "dataset"), cfg)
    data = write_mp4(tmp / "a.mp4").read_bytes()
    outcome = Outcome()
    vlp = [sys.executable, "-m", "vlp.cli"]
    with UrlServer({"a.mp4": data}) as server:
        listed = put(tmp / "list.txt", "\n".join(server.url(f"/v/a.mp4?n={i}") for i in range(2000)) + "\n")
        commands = {
            "ingest": [*vlp, "ingest", "--source", str(tmp / "raw"), "--out", str(tmp / "o1"), "ingest.workers=2"],
            "extract-frames": [*vlp, "extract-frames", "--dataset", str(tmp / "dataset"), "--out", str(tmp / "o2"),
                               "--config", str(TINY), "frames.workers=2"],
            "fetch": [*vlp, "fetch", "--source", str(listed), "--out", str(tmp / "o3"), 'fetch.allow=["127.0.0.1/32"]',
                      "fetch.probe_workers=2", "fetch.batch=200", "fetch.progress=false"],
            "data synth": [*vlp, "data", "synth", "--out", str(tmp / "o4"), "--config", str(TINY), "synth.workers=2",
                           "synth.num_videos=64"],
        }  # fmt: skip
        for name, cmd in commands.items():
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            workers: set[int] = set()
            deadline = time.monotonic() + 120
            while len(workers) < 2 and proc.poll() is None and time.monotonic() < deadline:
                workers = child_pids(proc.pid)
                time.sleep(0.01)
            proc.kill()
            proc.wait()
            end = time.monotonic() + 10
            while living(workers) and time.monotonic() < end:
                time.sleep(0.1)
            left = living(workers)
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            print(f"  {name}: {len(workers)} workers seen, {len(left)} alive 10 s after the parent's SIGKILL",
                  file=sys.stderr, flush=True)  # fmt: skip
            outcome.tried += 1
            outcome.handled += int(len(workers) >= 2 and not left)
    return outcome


def outputs_that_cannot_be_written(tmp: Path) -> Outcome:
    """Every command that writes, its output an existing file, a path under a file, or a link to nothing; and the
    query commands given a file for an index: exit 2 with one line naming the path, nothing written."""
    uris = _tiny_index(tmp)
    put(tmp / "afile", "not a folder")
    (tmp / "dangling").symlink_to(tmp / "nowhere")
    data = ["--dataset", uris["dataset"], "--frames", uris["frames"], "--config", str(TINY)]
    writers = [["data", "synth", "--config", str(TINY)], ["ingest", "--source", uris["raw"]],
               ["extract-frames", "--dataset", uris["dataset"], "--config", str(TINY)],
               ["mine-entities", "--dataset", uris["dataset"], "--config", str(TINY)],
               ["index", "--model", uris["model"], "--frames", uris["frames"], "--config", str(TINY)],
               ["evaluate-retrieval", "--model", uris["model"], *data], ["pretrain", "--model", "albef", *data],
               ["finetune-retrieval", "--model", "ts2net", *data],
               ["fetch", "--source", str(tmp / "afile")]]  # fmt: skip
    outcome = Outcome()
    for argv in writers:
        for out in (tmp / "afile", tmp / "afile" / "below", tmp / "dangling"):
            before = sorted(p.name for p in tmp.iterdir())
            code, err = _cli([*argv, "--out", str(out)])
            outcome.tried += 1
            said = _one_line(err, f"vlp {argv[0]}: error: the output {out} ")
            outcome.handled += int(code == 2 and said and sorted(p.name for p in tmp.iterdir()) == before)
    for argv in (["search", "--index", str(tmp / "afile"), "a star"], ["serve", "--index", str(tmp / "afile")],
                 ["answer", "--model", uris["model"], "--index", str(tmp / "afile"), "v", "what?"]):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "vlp.cli", *argv], capture_output=True, text=True, timeout=120)
        outcome.tried += 1
        outcome.handled += int(done.returncode == 2 and _one_line(done.stderr, f"vlp {argv[0]}: error: "))
    return outcome


def numbers_and_yaml(tmp: Path) -> Outcome:
    """Values that are not finite numbers (``.inf``, ``1.0e+309``, ``.nan``, ``-.inf``; as overrides and in a YAML
    file) for the training keys the battery poisoned runs with, and YAML aliases nested nine deep, nine wide (a
    billion-laughs file of under 1 KB) under an unknown section and under a typed key: exit 2 with one line of at
    most 400 characters, within 20 s, nothing written."""
    keys = ["pretrain.lr=.inf", "pretrain.lr=1.0e+309", "pretrain.weight_decay=.inf", "pretrain.grad_clip=.nan",
            "pretrain.eps=.inf", "retrieval.lr=-.inf", "fetch.timeout_s=.inf",
            "ingest.max_duration_s=.nan"]  # fmt: skip
    outcome = Outcome()
    configs: list[list[str]] = []
    for i, key in enumerate(keys):
        section, rest = key.split(".", 1)
        name, value = rest.split("=", 1)
        configs.append([key])
        configs.append(["--config", str(put(tmp / f"c{i}.yaml", f"{section}:\n  {name}: {value}\n"))])
    laughs = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
    )
    indented = "".join(f"    {line}\n" for line in laughs.splitlines())
    configs.append(["--config", str(put(tmp / "unknown.yaml", f"bogus:\n  laughs:\n{indented}"))])
    configs.append(["--config", str(put(tmp / "typed.yaml", f"pretrain:\n  batch_size:\n{indented}"))])
    for i, extra in enumerate(configs):
        out = tmp / f"out-{i}"
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "vlp.cli", "extract-frames", "--dataset", str(tmp / "none"),
                               "--out", str(out), *extra], capture_output=True, text=True, timeout=120)  # fmt: skip
        lines = done.stderr.strip().splitlines()
        says = "finite" if i < 2 * len(keys) else "YAML"
        outcome.tried += 1
        outcome.handled += int(done.returncode == 2 and len(lines) == 1 and len(lines[0]) <= 400 and says in lines[0]
                               and time.monotonic() - start < 20 and not out.exists())  # fmt: skip
    return outcome


def training_poison_and_links(tmp: Path) -> Outcome:
    """Training that diverges (ALBEF with ``pretrain.lr=1.0e+30``, a checkpoint every step): exit 2 with one line
    naming the step, and no checkpoint of it or after; the newest checkpoint of a healthy run given a NaN weight: the
    rerun warns naming it, resumes from the one before and ends as the straight run; that checkpoint's directory, then
    ``checkpoints/`` itself, replaced by a link to a copy outside ``--out``: exit 2 with one line, the copy unchanged.
    lost = checkpoints written at or after a diverged step."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from vlp.train.checkpoint import MODEL_FILE

    data = _tiny_world(tmp)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def pretrain(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        argv = ["pretrain", "--model", "albef", *data, "--out", str(out), "pretrain.ckpt_every=1", *extra]
        return subprocess.run([sys.executable, "-m", "vlp.cli", *argv], capture_output=True, text=True, timeout=900,
                              env=env)  # fmt: skip

    def steps(out: Path) -> list[int]:
        return sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*"))

    outcome = Outcome(tried=4)
    diverged = pretrain(tmp / "diverged", "pretrain.lr=1.0e+30", "pretrain.max_steps=4")
    said = diverged.stderr.strip().splitlines()[-1] if diverged.stderr.strip() else ""
    at = int(said.split("diverged at step ")[1].split()[0]) if "diverged at step " in said else 0
    late = [s for s in steps(tmp / "diverged") if s >= at]
    outcome.handled += int(diverged.returncode == 2 and _one_line(diverged.stderr, "vlp pretrain: error: ") and at > 0
                           and not late)  # fmt: skip
    outcome.lost += len(late)
    straight = pretrain(tmp / "straight", "pretrain.max_steps=3")
    pretrain(tmp / "poisoned", "pretrain.max_steps=3")
    newest = tmp / "poisoned" / "checkpoints" / "step-000003" / MODEL_FILE
    with safe_open(str(newest), "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118 (safe_open has no iter)
    first = next(name for name, t in tensors.items() if t.is_floating_point())
    tensors[first].view(-1)[0] = float("nan")
    save_file(tensors, str(newest), metadata=meta)
    rerun = pretrain(tmp / "poisoned", "pretrain.max_steps=3")
    last = Path("checkpoints") / "step-000003" / MODEL_FILE
    same = (tmp / "poisoned" / last).read_bytes() == (tmp / "straight" / last).read_bytes()
    outcome.handled += int(straight.returncode == rerun.returncode == 0 and "step-000003" in rerun.stderr and same)
    for i, linked in enumerate(("checkpoints/step-000003", "checkpoints")):
        out, outside = tmp / f"linked-{i}", tmp / f"outside-{i}"
        shutil.copytree(tmp / "straight", out)
        shutil.move(out / linked, outside)
        (out / linked).symlink_to(outside, target_is_directory=True)
        before = {p: p.read_bytes() for p in sorted(outside.rglob("*")) if p.is_file()}
        done = pretrain(out, "pretrain.max_steps=4")
        after = {p: p.read_bytes() for p in sorted(outside.rglob("*")) if p.is_file()}
        outcome.handled += int(done.returncode == 2 and _one_line(done.stderr, "vlp pretrain: error: ")
                               and "symbolic link" in done.stderr and before == after)  # fmt: skip
    return outcome


def sizes_a_family_lacks(tmp: Path) -> Outcome:
    """``model.preset`` naming no size of the family (an unknown name, another family's size, an empty string, 10,000
    characters), as an override and in a config file, for each family: exit 2 with one line of at most 400
    characters that names the family's sizes, nothing written."""
    from vlp.registry import names, spec

    outcome = Outcome()
    for family in names():
        sizes = list(spec(family).sizes)
        if not sizes:
            continue
        elsewhere = [s for other in names() for s in spec(other).sizes if s not in sizes][:1]
        for i, bad in enumerate(["huge", *elsewhere, "", "x" * 10_000]):
            for how in ("override", "file"):
                out = tmp / f"{family}-{i}-{how}"
                file = put(tmp / f"{family}-{i}.yaml", f"model:\n  preset: '{bad}'\n")
                given = [f"model.preset={bad}"] if how == "override" else ["--config", str(file)]
                argv = ["finetune-retrieval", "--model", family, "--dataset", str(tmp / "none"), "--frames",
                        str(tmp / "none"), "--out", str(out), *given]  # fmt: skip
                done = subprocess.run([sys.executable, "-m", "vlp.cli", *argv], capture_output=True, text=True,
                                      timeout=120)  # fmt: skip
                lines = done.stderr.strip().splitlines()
                outcome.tried += 1
                outcome.handled += int(done.returncode == 2 and len(lines) == 1 and len(lines[0]) <= 400
                                       and f"is not a size of {family}: {', '.join(sizes)}" in lines[0]
                                       and not out.exists())  # fmt: skip
    return outcome


def bf16_by_measurement(tmp: Path) -> Outcome:
    """Training and evaluation asked for bf16 on a CPU the probe calls slow (forced: ``VLP_CPU_BF16=slow``): exit 2
    with one line that gives the setting to change, before the first update (no checkpoint, no model)."""
    data = _tiny_world(tmp)
    env = {k: v for k, v in os.environ.items() if k != "VLP_ALLOW_SLOW_BF16"} | {"VLP_CPU_BF16": "slow"}
    outcome = Outcome()
    asks = [["pretrain", "--model", "albef", *data, "pretrain.cpu_bf16=true"],
            ["finetune-retrieval", "--model", "ts2net", *data, "retrieval.cpu_bf16=true"]]  # fmt: skip
    for i, argv in enumerate(asks):
        out = tmp / f"out-{i}"
        done = subprocess.run([sys.executable, "-m", "vlp.cli", *argv, "--out", str(out)], capture_output=True,
                              text=True, timeout=600, env=env)  # fmt: skip
        outcome.tried += 1
        wrote = (out / "checkpoints").exists() or (out / "model.json").exists()
        outcome.handled += int(done.returncode == 2 and _one_line(done.stderr, f"vlp {argv[0]}: error: ")
                               and "cpu_bf16" in done.stderr and not wrote)  # fmt: skip
    return outcome


def serve_secrets_and_bytes(tmp: Path) -> Outcome:
    """``vlp serve`` with a token: the token sent nine ways (as a bearer and basic credential, in ``?token=``,
    ``&access_token=``, ``?Auth_Token=``, in a path, as the search text, in a header of its own, two Authorization
    headers) and a search for secret words; then not-text bytes (not UTF-8, a NUL, an overlong form, past U+10FFFF) in
    a parameter's name and value on five routes, without the token. Every answer as designed, and no line of the
    server's log shows the token, its percent-encoded form or the searched words."""
    import base64
    import http.client
    import urllib.parse

    uris, token = _tiny_index(tmp), "battery-Tk!0123456789/abcdef"
    quoted = urllib.parse.quote(token, safe="")
    outcome = Outcome()
    secret = "zebra+umbrella+quartz"
    with _serving(tmp, uris, token) as url:
        good = f"Bearer {token}"
        asks: list[tuple[str, str | None, int]] = [
            (f"/api/search?q={secret}&k=2", good, 200),
            (f"/api/search?q={secret}", "Basic " + base64.b64encode(f"me:{token}".encode()).decode(), 200),
            (f"/api/search?q=star&token={quoted}", None, 400), (f"/api/search?q=star&access_token={quoted}", None, 400),
            (f"/api/search?Auth_Token={quoted}&q=star", good, 400), (f"/api/clips/{quoted}/thumbnail.jpg", None, 401),
            (f"/api/search?q={quoted}", good, 400), (f"/api/search?q={secret}", f"Token {token}", 401),
        ]  # fmt: skip
        for path, auth, want in asks:
            status, _, raw = _http(url + path, None, auth)
            outcome.tried += 1
            outcome.handled += int(status == want and (status == 200 or _one_line_error(raw)))
        host, port = urllib.parse.urlsplit(url).netloc.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.putrequest("GET", f"/api/search?q={secret}")
        conn.putheader("Authorization", good)
        conn.putheader("Authorization", "Bearer wrong-0123456789abcdef")
        conn.putheader("X-Api-Key", token)
        conn.endheaders()
        resp = conn.getresponse()
        outcome.tried += 1
        outcome.handled += int(resp.status == 400 and _one_line_error(resp.read()))
        conn.close()
        routes = ["/api/search", "/healthz", "/v2/models/vlp-search", "/api/clips/x/thumbnail.jpg", "/no/such/route"]
        for route in routes:
            for bad in ("%ff", "%ED%B2%80", "%C3%28", "%00", "%C0%AF", "%F4%90%80%80"):
                for query in (f"q=a{bad}b", f"a{bad}b=1"):
                    status, _, raw = _http(f"{url}{route}?{query}")
                    outcome.tried += 1
                    outcome.handled += int(status == 400 and _one_line_error(raw))
        log = (tmp / "serve.log").read_text(errors="replace")
    outcome.tried += 1
    leaked = [word for word in (token, quoted, "zebra", "umbrella", "quartz") if word in log]
    outcome.handled += int(not leaked and "Traceback" not in log)
    return outcome


CASES: list[tuple[str, Callable[[Path], Outcome], float]] = [
    ("corrupt media", corrupt_media, 120),
    ("hostile paths", hostile_paths, 60),
    ("oversize declared frames", oversize_declared, 60),
    ("unusable paths (NUL, control, long)", unusable_paths, 120),
    ("one id, two files", duplicate_ids, 60),
    ("oversize text", oversize_text, 120),
    ("still image named as video", still_image_as_video, 60),
    ("manifest edited after ingest", edited_manifest, 120),
    ("crashing decoder", lambda t: bad_decoder(t, "crash"), 120),
    ("hanging decoder", lambda t: bad_decoder(t, "hang"), 120),
    ("truncated checkpoints", truncated_checkpoints, 120),
    ("hostile checkpoint files", hostile_checkpoints, 300),
    ("config out of range", config_out_of_range, 300),
    ("MLflow killed mid-run", mlflow_killed, 300),
    ("MLflow down at the step's end, then sync", mlflow_down_at_the_end, 300),
    ("secret in the config parameter", secret_in_config, 60),
    ("S3 5xx / resets / outage", s3_faults, 300),
    ("kill -9 + resume", kill_and_resume, 600),
    ("serve: credentials and the model-repository routes", serve_access, 600),
    ("text that is not text (HTTP, CLI, configs)", text_not_text, 900),
    ("links out of a store", links_out_of_a_store, 600),
    ("a video is a video (>= 2 frames, a duration)", video_is_a_video, 120),
    ("refusals exit 2 (200 runs of each path)", exit_codes, 900),
    ("fetch: the loopback spelled every way", loopback_spellings, 300),
    ("fetch: lists that are CSV", lists_as_csv, 300),
    ("fetch: stopped, killed, twice at once, a slow head", fetch_stops_cleanly, 900),
    ("workers end with their parent (SIGKILL)", workers_with_their_parent, 600),
    ("outputs that cannot be written", outputs_that_cannot_be_written, 600),
    ("numbers that are not finite, YAML bombs", numbers_and_yaml, 600),
    ("training that diverges, poisoned or linked checkpoints", training_poison_and_links, 900),
    ("a size the family lacks", sizes_a_family_lacks, 600),
    ("bf16 on a CPU that runs it slowly", bf16_by_measurement, 600),
    ("serve: secrets out of the log, query bytes", serve_secrets_and_bytes, 600),
]


def _on_alarm(*_: object) -> None:
    raise TimeoutError("the case ran past its limit")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/vlp-fault-battery", help="scratch directory (emptied first)")
    parser.add_argument("--only", nargs="*", default=[], help="run the cases whose names contain one of these")
    args = parser.parse_args(argv)
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    torch.set_num_threads(1)
    rows, totals = [], {"tried": 0, "handled": 0, "crashes": 0, "hangs": 0, "lost": 0}
    for i, (name, case, limit) in enumerate(CASES):
        if args.only and not any(word in name for word in args.only):
            continue
        tmp = out / f"case{i}"
        tmp.mkdir(parents=True)
        start, crash, hang = time.monotonic(), 0, 0
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.alarm(int(limit))
        try:
            result = case(tmp)
        except TimeoutError:
            result, hang = Outcome(1, 0, 0), 1
        except Exception:
            traceback.print_exc()
            result, crash = Outcome(1, 0, 0), 1
        finally:
            signal.alarm(0)
        seconds = time.monotonic() - start
        rows.append((name, result.tried, result.handled, crash, hang, result.lost, seconds))
        for key, value in zip(("tried", "handled", "crashes", "hangs", "lost"), rows[-1][1:6], strict=True):
            totals[key] += value
        print(f"{name}: {result.handled}/{result.tried} handled ({seconds:.1f} s)", file=sys.stderr, flush=True)
    print("| case | tried | handled as designed | crashes | hangs | records lost | s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, tried, handled, crash, hang, lost, seconds in rows:
        print(f"| {name} | {tried} | {handled} | {crash} | {hang} | {lost} | {seconds:.1f} |")
    print(f"| **total** | {totals['tried']} | {totals['handled']} | {totals['crashes']} | {totals['hangs']} | "
          f"{totals['lost']} | |")  # fmt: skip
    ok = totals["handled"] == totals["tried"] and not (totals["crashes"] or totals["hangs"] or totals["lost"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
