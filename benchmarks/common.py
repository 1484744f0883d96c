"""What the benchmark scripts share; the one module a script imports besides vlp (no script imports another).

A script in ``benchmarks/<group>/`` puts this folder on ``sys.path`` in one line after its other imports::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
    import common

so every script still runs as ``python benchmarks/<group>/<script>.py`` from any folder. Only the standard library
is imported here at the top: torch, vlp and the rest load inside the functions that use them, so a script sets its
threads and environment before they load.

Sections: paths; captions, model sizes and clocks of the step benchmarks; synthetic worlds; the ablations' runs and
reports; the parity fixtures; the fault battery's media, hostile checkpoint files and misbehaving servers (copied
from the tests' helpers, which scripts do not import); a web server of videos with faults (``vlp fetch``'s tests
and benchmark).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import json
import math
import os
import random
import re
import resource
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import torch

    from vlp.config import Config
    from vlp.models.albef.model import AlbefConfig
    from vlp.models.alpro.model import AlproConfig

# --------------------------------------------------------------------------- paths

ROOT = Path(__file__).resolve().parents[1]  # the repo root
CONFIGS = ROOT / "configs"
FIXTURES = ROOT / "tests" / "fixtures"  # data files (checkpoints, reference outputs): read, never imported

# --------------------------------------------------------------------------- the step benchmarks

WORDS = ["red", "blue", "green", "circle", "square", "star", "moving", "left", "right", "over", "the", "grass", "sand",
         "water", "snow", "sky", "road"]  # fmt: skip


def captions(count: int, words: int) -> list[str]:
    """``count`` captions of ``words`` words of :data:`WORDS` each (the same list on every call)."""
    return [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(words)) for i in range(count)]


def alpro_config(preset: str, frames: int, entities: int, vocab: int) -> AlproConfig:
    """ALPRO at ``tiny``, ``small`` or ``paper`` size (TimeSformer-B + BERT-base split 6 + 6), random weights."""
    from vlp.models.alpro.model import AlproConfig, small_towers
    from vlp.models.layers.timesformer import TimeSformerConfig
    from vlp.models.text import TextConfig

    if preset == "tiny":
        video, text, dim = TimeSformerConfig.tiny(num_frames=frames), TextConfig.tiny(vocab_size=vocab), 32
    elif preset == "small":
        (video, text), dim = small_towers(112, frames, vocab, 30), 256
    else:
        video = TimeSformerConfig.paper(num_frames=frames, init="", drop_path=0.1)
        text, dim = TextConfig.paper(vocab_size=vocab, init=""), 256
    return AlproConfig(video, text, embed_dim=dim, num_entities=entities)


def albef_config(preset: str, img_size: int, frames: int, vocab: int, queue: int) -> AlbefConfig:
    """ALBEF at ``tiny`` or ``paper`` size (ViT-B/16 + BERT-base split 6 + 6, 256-d projections), random weights."""
    from vlp.models.albef.model import AlbefConfig
    from vlp.models.layers.vit import FrameViTConfig
    from vlp.models.text import TextConfig

    if preset == "tiny":
        video = FrameViTConfig.tiny(img_size=img_size or 32, num_frames=frames)
        return AlbefConfig(video, TextConfig.tiny(vocab_size=vocab), embed_dim=32, queue_size=queue)
    video = FrameViTConfig.paper(init="", img_size=img_size or 224, num_frames=frames)
    text = TextConfig.paper(vocab_size=max(vocab, 30522), init="")  # bert-base-uncased's 30,522 rows (MLM logits)
    return AlbefConfig(video, text, embed_dim=256, queue_size=queue)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU. Call it before reading a clock."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_rss_mib() -> float:
    """This process's resident-memory high-water mark (``ru_maxrss``: it only grows), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def peak_memory_mib(device: torch.device) -> float:
    """Peak allocated GPU memory on CUDA, else :func:`peak_rss_mib`, MiB."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mib()


# --------------------------------------------------------------------------- synthetic worlds


def done(out: str) -> bool:
    """Whether the step that writes ``out`` finished (it writes ``summary.json`` last)."""
    from vlp import storage

    return storage.exists(storage.join(out, "summary.json"))


def build_world(root: str, cfg: Config, entities: bool = False) -> dict[str, str]:
    """synth -> ingest -> extract-frames (-> mine-entities) under ``root`` with ``cfg``; a step whose output is
    :func:`done` is skipped. Returns the outputs' URIs: ``raw``, ``dataset``, ``frames`` (, ``entities``)."""
    from vlp.steps.extract_frames import extract_frames
    from vlp.steps.ingest import ingest
    from vlp.steps.synth import synth

    uris = {k: f"{root}/{k}" for k in ("raw", "dataset", "frames", *(["entities"] if entities else []))}
    steps: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
        ("raw", synth, (uris["raw"], cfg)),
        ("dataset", ingest, (uris["raw"], uris["dataset"], cfg)),
        ("frames", extract_frames, (uris["dataset"], uris["frames"], cfg)),
    ]
    if entities:
        from vlp.steps.mine_entities import mine_entities

        steps.append(("entities", mine_entities, (uris["dataset"], uris["entities"], cfg)))
    for name, fn, fn_args in steps:
        if not done(uris[name]):
            fn(*fn_args)
    return uris


def cached_world(
    world: str,
    cfg: Config,
    recipe: dict[str, Any],
    marker: str,
    hint: str,
    check: Callable[[str], None] | None = None,
) -> tuple[str, str]:
    """``(dataset, frames)`` of the world in ``world``: reused when the ``recipe`` written to its ``marker`` file
    matches, else built with :func:`build_world` (then ``check(dataset)``, then the marker). A world built with
    another recipe is an error that ends with ``hint``: caches beside a world belong to it, never rebuild in place."""
    from vlp import storage

    dataset, frames, doc = storage.join(world, "dataset"), storage.join(world, "frames"), storage.join(world, marker)
    if storage.exists(doc):
        found = json.loads(storage.read_text(doc))
        if found != recipe:
            raise SystemExit(f"{world} holds a world built with {found}, not {recipe}; {hint}")
        print(f"reusing the world in {world}", flush=True)
        return dataset, frames
    start = time.perf_counter()
    build_world(world, cfg)
    if check is not None:
        check(dataset)
    storage.write_text(doc, json.dumps(recipe, indent=2) + "\n")
    print(f"built the world in {world} ({time.perf_counter() - start:.0f} s)", flush=True)
    return dataset, frames


# --------------------------------------------------------------------------- ablations: runs

ABLATION_BASE = CONFIGS / "pipeline-local.yaml"  # the main job's settings, where the figures clear chance


def run_overrides(args: argparse.Namespace, seed: int) -> list[str]:
    """The overrides of the main job's config every ablation row with pre-training starts from: quiet steps, no
    images, ``--clips``, the step counts given (``--pretrain-steps``, ``--finetune-steps``, ``--qa-steps``; 0 = the
    main job's) and this seed for pre-training and both fine-tunings."""
    o = ["synth.num_images=0", "ingest.progress=false", "frames.progress=false", "pretrain.progress=false"]
    if args.clips:
        o.append(f"synth.num_videos={args.clips}")
    if args.pretrain_steps:
        o.append(f"pretrain.max_steps={args.pretrain_steps}")
    o.append(f"pretrain.seed={seed}")
    for task, steps in (("retrieval", args.finetune_steps), ("qa", args.qa_steps)):
        o += [f"{task}.seed={seed}", f"{task}.progress=false"]
        o += [f"{task}.max_steps={steps}"] if steps else []
    return o


def ablation_world(args: argparse.Namespace, root: str) -> dict[str, str]:
    """The ablations' world under ``root`` (the main job's, ``--clips`` clips), with its mined entities."""
    from vlp.config import load_config

    return build_world(root, load_config(ABLATION_BASE, run_overrides(args, 0)), entities=True)


def ablation_parser(doc: str, out: str, report: str, rows: list[str]) -> argparse.ArgumentParser:
    """The arguments every ablation script takes (each adds its own step counts)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", default=out)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rows", nargs="+", default=rows, choices=rows)
    p.add_argument("--clips", type=int, default=0, help="clips in the world (0 = the main job's)")
    p.add_argument("--report", default=report)
    p.add_argument("--report-only", action="store_true", help="rewrite the report from the results; train nothing")
    p.add_argument("--notes", default="", help="a Markdown file appended to the report (a reading of this run)")
    return p


def load_units(root: str) -> list[dict[str, Any]]:
    """Every finished unit's result under ``<root>/results/`` (one JSON file per unit, so units can run in
    parallel processes)."""
    from vlp import storage

    return [json.loads(storage.read_text(u)) for u in storage.list_files(f"{root}/results", suffix=".json")]


def row_tag(row: str) -> str:
    """``row`` as a file or directory name: runs of anything but letters and digits become one ``_``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", row).strip("_")


def save_unit(root: str, result: dict[str, Any]) -> None:
    from vlp import storage

    storage.write_text(
        f"{root}/results/seed{result['seed']}-{row_tag(str(result['row']))}.json", json.dumps(result) + "\n"
    )


def run_units(args: argparse.Namespace, rows: list[str], unit_fn: Any, root: str) -> list[dict[str, Any]]:
    """Every unit's result, in seed and row order: the finished ones from ``<root>/results/``, the others run by
    ``unit_fn(seed, row)`` (unless ``--report-only``) and saved one file each as they finish."""
    results = load_units(root)
    finished = {(r["seed"], r["row"]) for r in results}
    for seed in [] if args.report_only else args.seeds:
        for row in args.rows:
            if (seed, row) not in finished:
                one = unit_fn(seed, row)
                results.append(one)
                save_unit(root, one)
                print(json.dumps(one), flush=True)
    return sorted(results, key=lambda r: (r["seed"], rows.index(r["row"])))


def ablation_results(
    args: argparse.Namespace, rows: list[str], cfg: Config, world_args: argparse.Namespace, unit: Any
) -> list[dict[str, Any]]:
    """An ablation script's run: storage configured from ``cfg``, the world built under ``<out>/data`` from
    ``world_args`` (not with ``--report-only``), then :func:`run_units` with ``unit(uris, seed, row, root)``."""
    from vlp import storage

    root = args.out.rstrip("/")
    storage.configure(cfg.storage)
    uris = {} if args.report_only else ablation_world(world_args, f"{root}/data")
    return run_units(args, rows, lambda seed, row: unit(uris, seed, row, root), root)


# --------------------------------------------------------------------------- ablations: reports


def mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def welch_t(a: list[float], b: list[float]) -> float:
    """Welch's t statistic of mean(a) - mean(b) (nan with fewer than 2 values each)."""
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    return diff / math.sqrt(va + vb) if va + vb > 0 else math.copysign(math.inf, diff) if diff else 0.0


def row_cells(rows: list[dict[str, Any]], columns: tuple[tuple[str, str], ...], digits: dict[str, int]) -> str:
    """One Markdown table row's cells: mean ± sample std over seeds of each column (``–`` when absent; the value
    alone where one seed has it: one value has no spread)."""
    cells = []
    for key, _ in columns:
        values = [r.get(key, float("nan")) for r in rows]  # results of older runs lack some keys
        m, s = mean_std(values)
        d = digits.get(key, 2 if key.endswith("loss") else 1)
        single = sum(not math.isnan(v) for v in values) == 1
        cells.append("–" if math.isnan(m) else f"{m:.{d}f}" if single else f"{m:.{d}f} ± {s:.{d}f}")
    return " | ".join(cells)


def results_table(
    first: str,
    by_row: dict[str, list[dict[str, Any]]],
    columns: tuple[tuple[str, str], ...],
    digits: dict[str, int],
    skip_empty: bool = False,
) -> list[str]:
    """The report's results table: a header (``first`` names the row column), one row per ablation row with
    :func:`row_cells` and the number of seeds (``skip_empty``: rows without a result are left out)."""
    return [
        f"| {first} | " + " | ".join(name for _, name in columns) + " | n |",
        "|---|" + "---|" * (len(columns) + 1),
        *(
            f"| {row} | {row_cells(rs, columns, digits)} | {len(rs)} |"
            for row, rs in by_row.items()
            if rs or not skip_empty
        ),
    ]


def direction_test(claim: str, key: str, a: list[float], b: list[float]) -> str:
    """A "holds here?" table row: ``mean(a) - mean(b)`` and its Welch t, read in the metric's direction (a rank
    is better lower); no test when a side does not vary over seeds (e.g. at a floor)."""
    sign = -1 if key.endswith("medr") else 1
    diff, t = statistics.fmean(a) - statistics.fmean(b), welch_t(a, b)
    if len(set(a)) == 1 or len(set(b)) == 1:
        verdict, shown = "no test: one side is the same in every seed (a floor)", "n/a"
    else:
        verdict = "yes" if sign * t > 4.3 else "no (reversed)" if sign * t < -4.3 else "not resolved"
        shown = f"{t:+.1f}"
    return f"| {claim} | {key} | {diff:+.1f} | {shown} | {verdict} |"


def finite(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if not math.isnan(r.get(key, float("nan")))]


def direction_tests(
    directions: tuple[tuple[str, str, str, str], ...], by_row: dict[str, list[dict[str, Any]]]
) -> list[str]:
    """:func:`direction_test` rows of ``(claim, metric, better row, worse row)``, where both rows have results."""
    tests = []
    for claim, key, better, worse in directions:
        a, b = finite(by_row[better], key), finite(by_row[worse], key)
        if a and b:
            tests.append(direction_test(f"{claim}: {better} vs {worse}", key, a, b))
    return tests


def directions_section(tests: list[str]) -> list[str]:
    """The report's "paper's directions" section around the :func:`direction_test` rows."""
    return ["", "## The paper's directions, here", "",
            "Welch's t of the difference of means over seeds; with 3 seeds |t| > 4.3 is roughly p < 0.05 "
            "(two-sided, 2 degrees of freedom), so smaller values are not evidence either way. A comparison "
            "where one side does not vary over seeds is not tested. The table runs "
            f"{len(tests)} tests: at p < 0.05 each, about {0.05 * len(tests):.1f} would pass by chance alone.", "",
            "| claim | metric | difference | t | holds here? |", "|---|---|---|---|---|", *tests]  # fmt: skip


def write_report(lines: list[str], args: argparse.Namespace, path: Path) -> str:
    """The report's text with the ``--notes`` reading appended, written to ``path``."""
    if args.notes:
        lines = [*lines, "", Path(args.notes).read_text(encoding="utf-8").rstrip()]
    text = "\n".join(lines) + "\n"
    path.write_text(text, encoding="utf-8")
    return text


# --------------------------------------------------------------------------- parity fixtures

PARITY_WORDS = ["red", "blue", "green", "circle", "square", "moves", "left", "a", "the", "spins", "two", "bounce",
                "over", "grass", "sand", "star"]  # fmt: skip


def parity_tokenizer(d: Path) -> str:
    """A bert-base-uncased-style directory (vocab.txt + tokenizer_config.json) with the parity fixtures' 120 ids."""
    d.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + PARITY_WORDS
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
    return str(d)


def max_diffs(got: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, float]:
    """The largest ``|got - reference|`` of each output (in float64)."""
    return {k: float((got[k].detach().double() - reference[k].double()).abs().max()) for k in got}


# --------------------------------------------------------------------------- fault battery: media and files


def put(path: Path, data: bytes | str) -> Path:
    """Write ``data`` (text as UTF-8) to ``path``, creating its folders; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def write_mp4(path: str | Path, num_frames: int = 24, fps: int = 12, size: tuple[int, int] = (64, 48)) -> Path:
    """A real h264 mp4 (vlp's own encoder, :func:`vlp.data.synth.encode.encode_mp4`) whose frame ``i`` is filled
    with grey level ``(i * 10) % 250``."""
    import numpy as np

    from vlp.data.synth.encode import encode_mp4

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    width, height = size
    frames = np.stack([np.full((height, width, 3), (i * 10) % 250, np.uint8) for i in range(num_frames)])
    encode_mp4(frames, fps, str(path))
    return path


def png_header(path: str | Path, width: int, height: int) -> Path:
    """A PNG whose header declares ``width x height``; its pixel data is a stub, so nothing may decode it.

    What a decompression bomb looks like to a size check that reads headers only.
    """
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")
    path = Path(path)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)
    return path


def _safetensors(path: Path, header: dict, body: bytes = b"", declared: int | None = None) -> Path:
    """A file in the safetensors layout: 8-byte little-endian header length, JSON header, tensor bytes."""
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if declared is None else declared) + raw + body)
    return path


def _declares_8_gib(path: Path) -> Path:
    """A PyTorch zip whose pickle declares a 2^31-element float tensor stored in a 16-byte record."""
    import torch

    small = path.with_name("small.pt")
    torch.save({"w": torch.zeros(4)}, small)
    big = b"J" + struct.pack("<i", 2**31 - 1)  # BININT 2^31 - 1 instead of BININT1 4: the storage and the shape
    with zipfile.ZipFile(small) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as dst:
        for name in src.namelist():
            data = src.read(name)
            if name.endswith("data.pkl"):
                assert data.count(b"K\x04") == 2, "the pickle of a 4-element tensor names its size twice"
                data = data.replace(b"K\x04", big)
            dst.writestr(name, data)
    return path


def _misshapen_alpro(path: Path) -> Path:
    """A well-formed safetensors file with ALPRO's keys, one matrix replaced by a scalar."""
    import torch
    from safetensors.torch import save_file

    from vlp.models.importing import read_checkpoint

    state, _ = read_checkpoint(str(FIXTURES / "alpro_parity" / "lavis_retrieval.pt"))
    state = {k: v.clone() for k, v in state.items()}
    state["vision_proj.weight"] = torch.tensor(1.0)
    save_file(state, str(path))
    return path


def _random_bytes(path: Path) -> Path:
    path.write_bytes(random.Random(path.name).randbytes(4096))
    return path


class _Payload:  # stands for any object a pickle could carry
    pass


def _arbitrary_objects(path: Path) -> Path:
    import torch

    torch.save({"model": {"w": torch.zeros(1)}, "config": _Payload()}, path)
    return path


class _RunsOnLoad:  # a pickle that would run a command when unpickled: it must never be
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _code_on_load(path: Path) -> Path:
    import torch

    torch.save({"model": {"w": torch.zeros(1)}, "hook": _RunsOnLoad(path.with_name("ran"))}, path)
    return path


HUGE_LAYER = "visual_encoder.model.blocks.0.mlp.fc1.weight"  # its rows are read as the MLP width
HOSTILE_CHECKPOINTS: dict[str, tuple[Callable[[Path], Path], str]] = {  # file name -> (how to make it, the error)
    "random.safetensors": (_random_bytes, "not a safetensors file: it declares a"),
    "header_length_4tib.safetensors": (
        lambda p: _safetensors(p, {}, declared=1 << 42),
        "declares a 4,398,046,511,104-byte header in 10 bytes",
    ),
    "tensor_of_4tib.safetensors": (
        lambda p: _safetensors(
            p, {"w": {"dtype": "F32", "shape": [1 << 20, 1 << 20], "data_offsets": [0, 1 << 42]}}, b"\0" * 16
        ),
        "not a valid safetensors file",
    ),
    "offsets_past_the_end.safetensors": (
        lambda p: _safetensors(p, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8),
        "not a valid safetensors file",
    ),
    "empty_tensor_declares_a_huge_layer.safetensors": (
        lambda p: _safetensors(p, {HUGE_LAYER: {"dtype": "F32", "shape": [10**9, 0], "data_offsets": [0, 0]}}),
        f"1 empty tensor(s), e.g. ['{HUGE_LAYER}']",
    ),
    "misshapen.safetensors": (_misshapen_alpro, "its tensors do not form the model their names suggest"),
    "random.pth": (_random_bytes, "not a PyTorch file of tensors only"),
    "arbitrary_objects.pth": (_arbitrary_objects, "(Unsupported global: GLOBAL "),
    "code_on_load.pth": (_code_on_load, "(Trying to load unsupported GLOBAL "),
    "declares_8_gib.pth": (_declares_8_gib, "(record size (16 bytes) does not match expected size"),
}

# --------------------------------------------------------------------------- fault battery: misbehaving servers

# faults(method, path) -> None (forward), "503" (answer 503 SlowDown), "reset" (drop the connection) or "truncate"
# (forward, then send the headers and only half the body before closing: a transfer cut off mid-way)
Fault = Callable[[str, str], str | None]


class FaultyProxy:
    """``with FaultyProxy(upstream_url, faults) as url:`` an endpoint that misbehaves as ``faults`` decides."""

    def __init__(self, upstream: str, faults: Fault) -> None:
        self.upstream = urlsplit(upstream)
        self.faults = faults
        self.injected: list[tuple[str, str, str]] = []  # (method, path, fault) in order
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fault = proxy.faults(self.command, self.path)
                if fault:
                    with proxy._lock:
                        proxy.injected.append((self.command, self.path, fault))
                if fault == "reset":  # RST instead of FIN: the client sees "connection reset by peer"
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if fault == "503":
                    payload = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status)
                for key, value in resp.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fault == "truncate":
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.connection.close()
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> str:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def fail_first(n: int, fault: str, key_part: str, method: str = "GET") -> Fault:
    """A policy that answers the first ``n`` ``method`` requests for paths containing ``key_part`` with ``fault``."""
    seen = {"n": 0}
    lock = threading.Lock()

    def policy(req_method: str, path: str) -> str | None:
        if req_method != method or key_part not in path:
            return None
        with lock:
            seen["n"] += 1
            return fault if seen["n"] <= n else None

    return policy


class MlflowServer:
    """``mlflow server --workers 1`` on a fixed loopback port and sqlite file, so it can be killed and restarted."""

    def __init__(
        self,
        root: Path,
        artifacts: list[str] | None = None,
        env: dict[str, str] | None = None,
        extra: list[str] | None = None,
    ) -> None:
        """``artifacts``: the server's artifact flags (default: a local ``--default-artifact-root``); ``extra``:
        more flags (e.g. ``--app-name basic-auth``)."""
        self.extra = list(extra or [])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.root, self.url, self.proc = root, f"http://127.0.0.1:{self.port}", None
        self.artifacts = artifacts or ["--default-artifact-root", (root / "artifacts").as_uri()]
        self.env = {**os.environ, **(env or {})}

    def start(self) -> None:
        cmd = [str(Path(sys.executable).with_name("mlflow")), "server", "--workers", "1", "--host", "127.0.0.1",
               "--port", str(self.port), "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
               *self.artifacts, "--allowed-hosts", f"127.0.0.1:{self.port},localhost:{self.port}",
               *self.extra]  # fmt: skip
        log = open(self.root / "mlflow.log", "ab")  # noqa: SIM115 - the server process owns it
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start: {(self.root / 'mlflow.log').read_text()[-3000:]}")
            time.sleep(0.3)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # as an OOM kill or a node loss would
            self.proc.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- a web server of videos, with faults


def _bomb(size: int) -> bytes:
    """gzip of ``size`` zero bytes, made in pieces (never ``size`` bytes in memory)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    block, out = bytes(1 << 20), []
    for _ in range(size // len(block)):
        out.append(comp.compress(block))
    out.append(comp.flush())
    return b"".join(out)


class UrlServer:
    """A loopback HTTP server of real video files with faults on chosen paths: what ``vlp fetch`` meets on the
    internet, for its tests (tests/test_fetch.py) and its benchmark (input/bench_fetch.py).

        with UrlServer({"a.mp4": data}) as server:
            server.url("/v/a.mp4")          # 200, video/mp4
            server.url("/u/a.mp4?n=7")      # the video with an MP4 `free` box naming the URL appended: other bytes for
                                            # every URL, still a valid video (the benchmark's distinct videos)
            server.url("/404/a.mp4")        # 404
            server.url("/flaky/2/a.mp4")    # 500 twice per path, then the video
            server.url("/429/a.mp4")        # 429 with Retry-After: 1 once per path, then the video
            server.url("/cut/a.mp4")        # a body cut off mid-transfer (half the bytes, then the connection closed)
            server.url("/lie/a.mp4")        # Content-Length twice the body's length
            server.url("/stall/a.mp4")      # headers and 1 KiB, then nothing for `stall_s`
            server.url("/drip/a.mp4")       # the video 512 bytes every 0.25 s
            server.url("/html/a.mp4")       # 200 with text/html
            server.url("/redirect/3/a.mp4") # a chain of 3 redirects, then the video
            server.url("/to?u=http://...")  # a redirect to any URL
            server.url("/bomb")             # gzip-encoded `bomb_bytes` zeros (1 GiB in about 1 MB), made at start
            server.url("/robots/noai/a.mp4")  # the video with `X-Robots-Tag: noai` (any value, "+" for a space)
            server.url("/slowhead/a.mp4")   # the status line and headers a byte every 0.2 s, then the video
            server.url("/gzip/a.mp4")       # the video, gzip-encoded (a legitimate compressed body)
            server.url("/noise")            # 200 video/mp4 of random bytes: not a decodable video

    ``server.hits`` counts requests per path; ``server.arrivals`` holds when each came.

    A context manager, listening on 127.0.0.1 on a free port.
    """

    def __init__(self, files: dict[str, bytes], stall_s: float = 30.0, bomb_bytes: int = 0) -> None:
        self.files, self.stall_s = files, stall_s
        self.hits: Counter[str] = Counter()
        self.arrivals: list[float] = []  # time.monotonic() of every request, in arrival order
        self.lock = threading.Lock()
        self._bomb: bytes | None = None
        self.bomb_bytes = bomb_bytes
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> UrlServer:
        if self.bomb_bytes:  # before the first request: a bomb made on demand would delay its response's head
            self._bomb = _bomb(self.bomb_bytes)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def _count(self, path: str) -> int:
        with self.lock:
            self.hits[path] += 1
            self.arrivals.append(time.monotonic())
            return self.hits[path]

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        parsed = urllib.parse.urlsplit(h.path)
        path, query = parsed.path, urllib.parse.parse_qs(parsed.query)
        n = self._count(h.path)
        parts = path.strip("/").split("/")
        kind, name = parts[0], parts[-1]
        data = self.files.get(name)
        try:
            if kind == "v" and data is not None:
                return self._send(h, 200, data)
            if kind == "u" and data is not None:
                tag = h.path.encode()
                return self._send(h, 200, data + (8 + len(tag)).to_bytes(4, "big") + b"free" + tag)
            if kind == "404":
                return self._send(h, 404, b"not here", "text/plain")
            if kind == "flaky" and data is not None:
                return self._send(h, 500, b"busy", "text/plain") if n <= int(parts[1]) else self._send(h, 200, data)
            if kind == "429" and data is not None:
                if n == 1:
                    return self._send(h, 429, b"slow down", "text/plain", {"Retry-After": "1"})
                return self._send(h, 200, data)
            if kind == "cut" and data is not None:
                self._head(h, 200, len(data))
                h.wfile.write(data[: len(data) // 2])
                h.wfile.flush()
                h.close_connection = True
                return None
            if kind == "lie" and data is not None:
                self._head(h, 200, 2 * len(data))
                h.wfile.write(data)
                h.wfile.flush()
                h.close_connection = True
                return None
            if kind == "stall" and data is not None:
                self._head(h, 200, len(data))
                h.wfile.write(data[:1024])
                h.wfile.flush()
                time.sleep(self.stall_s)
                h.close_connection = True
                return None
            if kind == "drip" and data is not None:
                self._head(h, 200, len(data))
                for i in range(0, len(data), 512):
                    h.wfile.write(data[i : i + 512])
                    h.wfile.flush()
                    time.sleep(0.25)
                return None
            if kind == "html":
                return self._send(h, 200, b"<html><body>a page, not a video</body></html>", "text/html")
            if kind == "redirect" and len(parts) == 3:
                left = int(parts[1])
                target = f"/redirect/{left - 1}/{name}" if left > 1 else f"/v/{name}"
                return self._send(h, 302, b"", "text/plain", {"Location": target})
            if kind == "to":  # the Location's bytes are the target's UTF-8 (http.server writes headers as Latin-1)
                target = query["u"][0].encode().decode("latin-1")
                return self._send(h, 302, b"", "text/plain", {"Location": target})
            if kind == "bomb" and self._bomb is not None:
                return self._send(h, 200, self._bomb, "video/mp4", {"Content-Encoding": "gzip"})
            if kind == "robots" and data is not None:
                return self._send(h, 200, data, "video/mp4", {"X-Robots-Tag": parts[1].replace("+", " ")})
            if kind == "slowhead" and data is not None:
                head = f"HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: {len(data)}\r\n\r\n".encode()
                for i in range(len(head)):
                    h.wfile.write(head[i : i + 1])
                    h.wfile.flush()
                    time.sleep(0.2)
                h.wfile.write(data)
                return None
            if kind == "gzip" and data is not None:
                return self._send(h, 200, gzip.compress(data), "video/mp4", {"Content-Encoding": "gzip"})
            if kind == "noise":
                return self._send(h, 200, bytes(range(256)) * 64, "video/mp4")
            return self._send(h, 404, b"no such path", "text/plain")
        except (BrokenPipeError, ConnectionResetError):
            return None

    @staticmethod
    def _head(h: BaseHTTPRequestHandler, code: int, length: int, ctype: str = "video/mp4",
              headers: dict[str, str] | None = None) -> None:  # fmt: skip
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(length))
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.end_headers()

    def _send(self, h: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str = "video/mp4",
              headers: dict[str, str] | None = None) -> None:  # fmt: skip
        self._head(h, code, len(body), ctype, headers)
        h.wfile.write(body)


# --------------------------------------------------------------------------- processes (Linux's /proc)


def child_pids(pid: int) -> set[int]:
    """The pids of the processes whose parent is ``pid`` now."""
    found = set()
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, IndexError):
            if entry.isdigit() and int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry))
    return found


def living(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (gone and zombie processes left out)."""
    alive = set()
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                alive.add(pid)
    return alive
