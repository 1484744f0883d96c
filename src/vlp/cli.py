"""``vlp <step>``: the command line and the container entrypoint, one subcommand per pipeline step.

Every step takes input/output URIs (local paths or ``s3://bucket/prefix``), ``--config FILE``
and trailing ``section.key=value`` overrides, prints a JSON summary on stdout and exits 0 on
success, 2 on bad usage or bad input, 1 on an unexpected failure. ``vlp tracking sync OUT`` (not a
step) sends a training output's MLflow run what it lacks of ``OUT/metrics.jsonl`` and ends the run;
it exits 1 when the tracking server cannot take it. ``vlp search`` (not a step) prints the hits of a query as a
table, or as a JSON list with ``--json``; its query and any overrides follow the options. ``vlp answer`` (not a
step) prints a QA model's top answers to a question about one clip as a table, or as JSON with ``--json``; its clip,
question and any overrides follow the options. ``vlp serve`` (not a step) serves an index over HTTP until it is
stopped (docs/guides/serve.md).

Ctrl-C (SIGINT) or SIGTERM stops a command without a traceback: one line on stderr says where it stopped and
that the same command goes on (a training step: from its newest checkpoint), a training step's MLflow run ends
KILLED, and the exit code is 130 (SIGINT) or 143 (SIGTERM). ``vlp serve`` stops that way too, once its open
requests are answered; its line says it stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vlp import __version__
from vlp.models import family as families
from vlp.signals import interrupt_on_signals, signal_exception
from vlp.text import invalid_utf8

if TYPE_CHECKING:
    from vlp.config import Config

EPILOG = (
    "Overrides: trailing section.key=value pairs, e.g. frames.num_frames=8 storage.endpoint_url=http://127.0.0.1:9000"
)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        action="append",
        default=None,
        help="YAML config file (default: built-in defaults); repeat to layer files, later ones win key by key",
    )
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")


# --------------------------------------------------------------------------- the commands' arguments


def _synth_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")
    p.add_argument("--num-videos", type=int, default=None, help="number of clips (default: synth.num_videos)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: synth.seed)")


def _sync_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="training step output directory or s3:// prefix (holds metrics.jsonl)")
    p.add_argument("--status", choices=["FINISHED", "FAILED", "KILLED"], default="",
                   help="end the run so (default: FINISHED when OUT has summary.json, else the status the step "
                   "recorded; a step that has not finished stays RUNNING)")  # fmt: skip


def _fetch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", required=True, help="URL list: a WebVid CSV, a CSV with a url column, a JSONL of "
                   "{\"url\": ...}, or one URL per line (local or s3://)")  # fmt: skip
    p.add_argument("--out", required=True, help="output directory or s3:// prefix (a raw dataset for vlp ingest)")
    p.add_argument("--format", dest="fetch_format", default=None, help="auto|webvid|urls (default: fetch.format)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--part", type=_part, default=None, metavar="I/N", help="fetch only part I of N of the rows")
    group.add_argument("--merge-parts", type=int, default=0, metavar="N", help="gather the N finished parts of OUT")


def _ingest_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", required=True, help="dataset directory, or an annotation file (jsonl/json/csv)")
    p.add_argument("--out", required=True, help="output dataset directory or s3:// prefix")
    p.add_argument("--format", default=None, help="auto|synth|alpro|lavis|webvid|msrvtt (default: ingest.format)")
    p.add_argument("--video-root", default=None, help="where relative video paths of an annotation file live")
    _fan_out(p, "probe only part I of N of the files, into OUT/probes.parquet", "a --part output to merge")


def _extract_frames_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, help="ingested dataset directory or s3:// prefix")
    p.add_argument("--out", required=True, help="output frames directory or s3:// prefix")
    _fan_out(p, "extract only part I of N of the shards (no index)", "a --part output to merge")


def _data_frames_out_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, help="ingested dataset directory or s3:// prefix")
    p.add_argument("--frames", required=True, help="extract-frames output")
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")


def _build_prompt_bank_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompter", required=True, help="pretrain-prompter output")
    p.add_argument("--entities", required=True, help="mine-entities output")
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")


def _pretrain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", dest="family", choices=_pretraining(), help="model family (default: model.family)")
    p.add_argument("--dataset", required=True, help="ingested dataset directory or s3:// prefix")
    p.add_argument("--frames", required=True, help="extract-frames output")
    for flag, one in families.pretrain_flags().items():  # what the families' pre-training reads (their specs)
        readers = " or ".join(s.title for s in families.specs().values() if one.name in s.pretrain_inputs)
        metavar = flag.removeprefix("--").replace("-", "_").upper()
        p.add_argument(flag, dest=f"input_{one.name}", metavar=metavar, default="", help=f"{one.help} ({readers})")
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")


def _mine_entities_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, help="ingested dataset directory or s3:// prefix")
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")


def _import_checkpoint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", required=True, help="checkpoint file (.pt/.pth/.bin/.safetensors), local or s3://")
    p.add_argument("--out", required=True, help="output model directory or s3:// prefix")
    p.add_argument("--family", dest="ckpt_family", default="auto", choices=["auto", *families.names()],
                   help="which model the file holds (default: from the keys)")  # fmt: skip
    p.add_argument("--format", dest="ckpt_format", default="auto",
                   help="key layout: auto (detected) or one of the family importer's formats (ALPRO: alpro, lavis; "
                   "ALBEF: albef, lavis; TS2-Net: ts2net)")  # fmt: skip
    p.add_argument("--kind", default="auto",
                   help="what to build: auto or one of the family importer's kinds (ALPRO: alpro, alpro_retrieval, "
                   "alpro_qa, prompter; ALBEF: albef, albef_retrieval; TS2-Net: ts2net_retrieval); auto: ALPRO: "
                   "classifier -> QA, PEM head/prompter -> pre-trained, else retrieval; ALBEF: MLM head -> "
                   "pre-trained, else retrieval")  # fmt: skip
    p.add_argument("--tokenizer", default="",
                   help="the weights' tokenizer: hub name or local/s3:// dir (default: bert-base-uncased; TS2-Net: "
                   "openai/clip-vit-base-patch32)")  # fmt: skip
    p.add_argument("--answers", default="", help="QA: answer vocabulary, a JSON list or ALPRO's train_ans2label.json")
    p.add_argument("--video-heads", type=int, default=0, help="ViT attention heads (default: width / 64)")
    p.add_argument("--text-heads", type=int, default=0, help="BERT attention heads (default: width / 64)")
    p.add_argument("--fusion-layers", type=int, default=0, help="BERT layers that fuse (default: half, ALPRO's 6/12)")
    p.add_argument("--max-len", type=int, default=40, help="text length for fine-tuning/evaluation (default: 40)")
    p.add_argument("--num-frames", type=int, default=4,
                   help="ALBEF: frames per clip its zero-started time embedding is sized for; TS2-Net: frames per "
                   "clip (default: 4)")  # fmt: skip


def _data_frames(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, help="ingested dataset directory or s3:// prefix")
    p.add_argument("--frames", required=True, help="extract-frames output")


def _finetune_retrieval_args(p: argparse.ArgumentParser) -> None:
    _data_frames(p)
    p.add_argument("--pretrained", default="", help="`vlp pretrain` output to start from (default: none: "
                   "the `model` section's weights, e.g. TS2-Net's CLIP, or random init)")  # fmt: skip
    p.add_argument("--model", dest="family", choices=families.names(),
                   help="without --pretrained: the model family (default: model.family)")  # fmt: skip
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")


def _finetune_qa_args(p: argparse.ArgumentParser) -> None:
    _data_frames(p)
    p.add_argument("--pretrained", required=True, help="`vlp pretrain` output to start from")
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")


def _evaluate_args(p: argparse.ArgumentParser) -> None:
    _data_frames(p)
    p.add_argument("--model", required=True, help="fine-tuned output (or, for zero-shot, a pretrain output)")
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")


def _index_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="the model that encodes the clips (what evaluate-retrieval takes)")
    p.add_argument("--frames", required=True, help="extract-frames output: every clip, unless --dataset is given")
    p.add_argument("--out", required=True, help="the index: a directory or s3:// prefix (made, or added to)")
    p.add_argument("--dataset", default="", help="ingested dataset: index only the clips of its --split")
    p.add_argument("--split", default="", help="with --dataset: the split to index (default: retrieval.split)")


def _search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", required=True, help="a `vlp index` output")
    p.add_argument("query", help="the text to search for")
    p.add_argument("-k", type=_top_k, default=10, help="hits to return, 1..1000 (default: 10)")
    p.add_argument("--json", action="store_true", help="print the hits as a JSON list instead of a table")


def _answer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a `vlp finetune-qa` output")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--frames", default="", help="extract-frames output: the clip is one of its video ids")
    where.add_argument("--index", default="", help="a `vlp index` output: the clip is a video id of its frames store")
    p.add_argument("clip", metavar="VIDEO_OR_ID",
                   help="a video id (with --frames or --index), else a video file, local or s3://")  # fmt: skip
    p.add_argument("question", help="the question to answer")
    p.add_argument("-k", type=_top_k, default=5, help="answers to list, 1..1000 (default: 5)")
    p.add_argument("--json", action="store_true", help="print the answers as JSON instead of a table")


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", required=True, help="a `vlp index` output")
    p.add_argument("--qa-model", default="", help="a QA model for POST /api/answer (default: none: that route is 404)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; 0.0.0.0 in a pod)")
    p.add_argument("--port", type=_port, default=8080, help="TCP port (default: 8080; 0: a free one, logged)")


def _pretraining() -> list[str]:
    """The registered families that ``vlp pretrain`` trains."""
    return [name for name, spec in families.specs().items() if spec.pretrains]


# --------------------------------------------------------------------------- what each command runs
# Each imports its step when called: `vlp search` must not import the training code, nor `vlp ingest` torch, and
# `vlp --help` imports neither (`python -X importtime`: this module 0.07 s, the config loader alone 0.28 s).


def _run_synth(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.synth import synth

    return synth(args.out, cfg)


def _run_sync(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp import storage, tracking
    from vlp.inputs import check_output

    storage.configure(cfg.storage)
    check_output(args.out)  # it updates OUT's summary.json and tracking.json
    return tracking.sync(cfg.tracking, args.out, args.status)


def _run_fetch(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.fetch import fetch, fetch_merge, fetch_part

    if args.part:
        return fetch_part(args.source, args.out, cfg, *args.part)
    if args.merge_parts:
        return fetch_merge(args.source, args.out, cfg, args.merge_parts)
    return fetch(args.source, args.out, cfg)


def _run_ingest(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.ingest import ingest, ingest_part

    if args.part:
        return ingest_part(args.source, args.out, cfg, *args.part)
    return ingest(args.source, args.out, cfg, probes=args.merge)


def _run_extract_frames(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.extract_frames import extract_frames, extract_frames_part

    if args.part:
        return extract_frames_part(args.dataset, args.out, cfg, *args.part)
    return extract_frames(args.dataset, args.out, cfg, parts=args.merge)


def _run_mine_entities(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.mine_entities import mine_entities

    return mine_entities(args.dataset, args.out, cfg)


def _run_pretrain_prompter(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.pretrain import pretrain_prompter

    return pretrain_prompter(args.dataset, args.frames, args.out, cfg)


def _run_build_prompt_bank(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.pretrain import build_prompt_bank

    return build_prompt_bank(args.prompter, args.entities, args.out, cfg)


def _run_pretrain(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.pretrain import pretrain

    named = {one.name: getattr(args, f"input_{one.name}") for one in families.pretrain_flags().values()}
    return pretrain(args.dataset, args.frames, args.out, cfg, {name: uri for name, uri in named.items() if uri})


def _run_import_checkpoint(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.import_checkpoint import import_checkpoint

    return import_checkpoint(args.source, args.out, cfg, fmt=args.ckpt_format, kind=args.kind,
                             tokenizer=args.tokenizer, answers=args.answers, video_heads=args.video_heads,
                             text_heads=args.text_heads, fusion_layers=args.fusion_layers, max_len=args.max_len,
                             family=args.ckpt_family, num_frames=args.num_frames)  # fmt: skip


def _run_finetune_retrieval(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.finetune import finetune_retrieval

    return finetune_retrieval(args.dataset, args.frames, args.pretrained, args.out, cfg)


def _run_finetune_qa(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.finetune import finetune_qa

    return finetune_qa(args.dataset, args.frames, args.pretrained, args.out, cfg)


def _run_evaluate_retrieval(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.evaluate import evaluate_retrieval

    return evaluate_retrieval(args.dataset, args.frames, args.model, args.out, cfg)


def _run_evaluate_qa(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.evaluate import evaluate_qa

    return evaluate_qa(args.dataset, args.frames, args.model, args.out, cfg)


def _run_index(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.steps.index import index_clips

    return index_clips(args.model, args.frames, args.out, cfg, dataset=args.dataset, split=args.split)


def _run_search(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.index.query import search

    _check_dirs(args, "index")
    return {"hits": [hit.as_dict() for hit in search(args.index, args.query, args.k, cfg)]}


def _run_answer(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.index.answer import answer

    _check_dirs(args, "model", "frames", "index")
    found = answer(args.model, args.clip, args.question, args.k, cfg, frames=args.frames, index=args.index)
    return {"clip": args.clip, "question": args.question, "answers": [a.as_dict() for a in found]}


def _run_serve(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    # here: a command imports what it runs, and nothing of the other commands
    from vlp.serve.server import serve

    _check_dirs(args, "index", "qa_model")
    serve(args.index, cfg, qa_model=args.qa_model, host=args.host, port=args.port)
    return {}


# what a query command's directories are made by: (flag, what to do when one is a file)
_DIRS = {
    "index": ("--index", "pass the output of `vlp index`"),
    "model": ("--model", "pass a model directory (the output of a training step or of `vlp import-checkpoint`)"),
    "qa_model": ("--qa-model", "pass the output of `vlp finetune-qa` (or of `vlp import-checkpoint`)"),
    "frames": ("--frames", "pass the output of `vlp extract-frames`"),
}


def _check_dirs(args: argparse.Namespace, *names: str) -> None:
    """Refuse a directory a query command reads (``--index``, ``--model``, ...) that is a file, before it loads
    anything (:func:`vlp.inputs.check_input_dir`); the steps check theirs with their other inputs."""
    from vlp.inputs import check_input_dir  # here: with the command that reads it

    for name in names:
        if getattr(args, name):
            check_input_dir(getattr(args, name), *_DIRS[name])


# --------------------------------------------------------------------------- the command table


@dataclass(frozen=True)
class Command:
    """One ``vlp`` command: its name, its ``--help`` line (a function: a family's title is read when the parser is
    built), its arguments (``--config`` and the overrides are added to every command) and what it runs."""

    name: str
    help: Callable[[], str] | str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Config], dict[str, Any]]


def _pretrain_help() -> str:
    return f"pre-train {' or '.join(families.spec(name).title for name in _pretraining())} (model.family)"


# `vlp data synth` and `vlp tracking sync`: commands of a command group
GROUPS: dict[str, tuple[str, str, list[Command]]] = {
    "data": ("dataset utilities (synth)", "data_command", [
        Command("synth", "write the synthetic video world (mp4 + images + manifests)", _synth_args, _run_synth),
    ]),
    "tracking": ("MLflow tracking utilities (sync)", "tracking_command", [
        Command("sync", "send a training output's MLflow run what it lacks of OUT/metrics.jsonl, in step order, and "
                "end it with the step's status (a finished step: FINISHED); running it again sends nothing twice",
                _sync_args, _run_sync),
    ]),
}  # fmt: skip
COMMANDS: list[Command] = [
    Command("fetch", "download a URL list's videos (WebVid CSV, url list) into storage, as a raw dataset for "
            "ingest; rejects with reasons (docs/guides/fetch.md)", _fetch_args, _run_fetch),
    Command("ingest", "validate + probe a dataset into the manifest schema, with rejects", _ingest_args, _run_ingest),
    Command("extract-frames", "sparse frames -> Parquet shards of JPEGs + index", _extract_frames_args,
            _run_extract_frames),
    Command("pretrain-prompter", "train the prompter (video-text dual encoder, VTC only)", _data_frames_out_args,
            _run_pretrain_prompter),
    Command("build-prompt-bank", "12 templates x mined entities through the frozen prompter", _build_prompt_bank_args,
            _run_build_prompt_bank),
    Command("pretrain", _pretrain_help, _pretrain_args, _run_pretrain),
    Command("mine-entities", "top-M caption nouns (spaCy) -> entity vocabulary", _mine_entities_args,
            _run_mine_entities),
    Command("import-checkpoint", "released ALPRO / ALBEF / TS2-Net weights (salesforce/ALPRO, salesforce/ALBEF, "
            "LAVIS, yuqi657/ts2_net) -> a model directory for finetune-*/evaluate-*", _import_checkpoint_args,
            _run_import_checkpoint),
    Command("finetune-retrieval", "fine-tune for text-video retrieval (VTC/ITC + VTM/ITM; section `retrieval`)",
            _finetune_retrieval_args, _run_finetune_retrieval),
    Command("finetune-qa", "fine-tune for open-ended video QA (ALPRO: a classifier; ALBEF: an answer decoder; "
            "section `qa`)", _finetune_qa_args, _run_finetune_qa),
    Command("evaluate-retrieval", "R@1/5/10, MdR, MnR both ways; top-k VTM re-ranking; zero-shot on a pretrain "
            "output", _evaluate_args, _run_evaluate_retrieval),
    Command("evaluate-qa", "QA accuracy overall and per answer type; predictions + report", _evaluate_args,
            _run_evaluate_qa),
    Command("index", "encode a collection's clips with a retrieval or pre-trained model into a searchable index "
            "(adds the clips it lacks; docs/guides/search.md)", _index_args, _run_index),
    Command("search", "the clips of an index that best match a text (docs/guides/search.md)", _search_args,
            _run_search),
    Command("answer", "a QA fine-tuned model's most probable answers to a question about one clip, as evaluate-qa "
            "predicts them (docs/guides/search.md)", _answer_args, _run_answer),
    Command("serve", "serve an index's search (and a QA model's answers) over HTTP: KServe's inference protocols and "
            "a JSON API on one port, until Ctrl-C or SIGTERM (docs/guides/serve.md)", _serve_args, _run_serve),
]  # fmt: skip


def _add(sub: Any, command: Command) -> None:
    text = command.help() if callable(command.help) else command.help
    p = sub.add_parser(command.name, help=text, epilog=EPILOG)
    command.arguments(p)
    _common(p)
    p.set_defaults(run=command.run)


def build_parser() -> argparse.ArgumentParser:
    """``vlp``'s parser: a subcommand per entry of :data:`GROUPS` (with its own subcommands) and :data:`COMMANDS`;
    the parsed arguments' ``run`` is the chosen command's."""
    parser = argparse.ArgumentParser(
        prog="vlp", description="Video-language pre-training pipeline steps.", epilog=EPILOG
    )
    parser.add_argument("--version", action="version", version=f"vlp {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="STEP")
    for name, (text, dest, commands) in GROUPS.items():
        group = sub.add_parser(name, help=text).add_subparsers(dest=dest, required=True, metavar="COMMAND")
        for command in commands:
            _add(group, command)
    for command in COMMANDS:
        _add(sub, command)
    return parser


def _port(text: str) -> int:
    """``--port``: an integer in 0..65535."""
    if not text.strip().isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number in 0..65535, got {text!r}")
    return int(text)


def _top_k(text: str) -> int:
    """``-k``: an integer in 1..1000."""
    from vlp.index.query import MAX_K  # here: parsing a command line imports no torch unless -k is given

    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_K:
        raise argparse.ArgumentTypeError(f"expected an integer in 1..{MAX_K}, got {text!r}")
    return int(text)


def _part(text: str) -> tuple[int, int]:
    """``I/N`` (0 <= I < N) as ``(I, N)``."""
    index, sep, count = text.partition("/")
    if not (sep and index.isdigit() and count.isdigit() and 0 <= int(index) < int(count)):
        raise argparse.ArgumentTypeError(f"expected I/N with 0 <= I < N, e.g. 0/4; got {text!r}")
    return int(index), int(count)


def _fan_out(p: argparse.ArgumentParser, part_help: str, merge_help: str) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--part", type=_part, default=None, metavar="I/N", help=part_help)
    group.add_argument("--merge", action="append", default=[], metavar="PART", help=f"{merge_help} (repeat: one each)")


def _cli_overrides(args: argparse.Namespace) -> list[str]:
    """Flags that are shortcuts for config keys, turned into overrides (they win over the file)."""
    pairs = {
        "synth.num_videos": getattr(args, "num_videos", None),
        "synth.seed": getattr(args, "seed", None),
        "ingest.format": getattr(args, "format", None),
        "fetch.format": getattr(args, "fetch_format", None),
        "ingest.video_root": getattr(args, "video_root", None),
        "model.family": getattr(args, "family", None),
    }
    return [f"{k}={json.dumps(v)}" for k, v in pairs.items() if v is not None]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load the config (files, overrides, then the flags that stand for config keys) and run the parsed command."""
    from vlp.config import load_config  # here: `vlp --help` and a usage error import no config (pyarrow, yaml)

    cfg = load_config(args.config, [*args.overrides, *_cli_overrides(args)])
    return args.run(args, cfg)


def hits_table(hits: list[dict[str, Any]]) -> str:
    """Search hits as a plain-text table: rank, video_id, score (``-`` where the clip was not re-ranked),
    similarity."""
    rows = [("rank", "video_id", "score", "similarity")]
    rows += [(str(h["rank"]), h["video_id"], "-" if h["score"] is None else f"{h['score']:.4f}",
              f"{h['similarity']:.4f}") for h in hits]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]  # fmt: skip
    return "\n".join(line.rstrip() for line in lines) if hits else "no clips in the index"


def answers_table(answers: list[dict[str, Any]]) -> str:
    """Answers as a plain-text table: rank, answer, probability."""
    rows = [("rank", "answer", "probability")]
    rows += [(str(a["rank"]), a["answer"], f"{a['probability']:.4f}") for a in answers]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]  # fmt: skip
    return "\n".join(line.rstrip() for line in lines) if answers else "no answer has a probability above 0"


def _interrupted(command: str, exc: KeyboardInterrupt) -> int:
    """Say on stderr where ``command`` stopped and how to go on (rank 0 alone under torchrun); the exit code of the
    signal (128 + its number)."""
    loop = sys.modules.get("vlp.train.loop")  # not imported: nothing trained (and torch stays unimported)
    training = None
    # a second Ctrl-C while the first was handled hides the training's in __context__
    seen: KeyboardInterrupt | None = exc
    while loop is not None and seen is not None and training is None:
        training = seen if isinstance(seen, loop.TrainingInterrupted) else None
        seen = seen.__context__ if isinstance(seen.__context__, KeyboardInterrupt) else None
    if training is not None:
        said = f"interrupted at step {training.step}; rerun the same command to resume from step {training.resume_step}"
    elif command == "serve":  # the way a server ends
        said = "stopped"
    else:
        said = "interrupted; rerun the same command to run it again"
    if os.environ.get("RANK", "0") == "0":  # under torchrun rank 0 says it for every rank
        print(f"vlp {command}: {said}", file=sys.stderr)
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    invalid = _invalid_argument(args)
    if invalid:  # bytes that are not UTF-8 (sys.argv holds them as lone surrogates): refused before anything runs
        print(f"vlp {args.command}: error: {invalid}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    seen: list[int] = []
    try:
        with interrupt_on_signals() as seen:
            summary = run(args)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: not a failure, and no traceback
        return _interrupted(args.command, exc)
    except Exception as exc:
        if seen:  # an error the signal caused (e.g. in a worker process it stopped): an interruption all the same
            return _interrupted(args.command, signal_exception(seen[0]))
        return _failed(args, exc)
    if seen:  # stopped, though the raise was lost on the way (the step may have finished: a rerun says so)
        return _interrupted(args.command, signal_exception(seen[0]))
    summary.pop("config", None)
    if args.command == "serve":  # uvicorn returned without a signal: it stopped on its own (a failed startup)
        print("vlp serve: error: the HTTP server stopped without being asked to (its log above says why)",
              file=sys.stderr)  # fmt: skip
        return 1
    if args.command == "search":  # not a step: hits, no summary
        print(json.dumps(summary["hits"], indent=2) if args.json else hits_table(summary["hits"]))
        return 0
    if args.command == "answer":  # not a step: answers, no summary
        print(json.dumps(summary, indent=2) if args.json else answers_table(summary["answers"]))
        return 0
    print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    return 0


def _invalid_argument(args: argparse.Namespace) -> str | None:
    """What is wrong with the first argument that is not valid UTF-8 text (:func:`vlp.text.invalid_utf8`), or None."""
    for name, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            problem = invalid_utf8(item) if isinstance(item, str) else None
            if problem:
                return f"the argument {name} {problem}"
    return None


def _failed(args: argparse.Namespace, exc: Exception) -> int:
    """The one line and exit code of an expected failure; anything else is re-raised (a traceback: a bug)."""
    # here (with what follows): the error types of modules a command may not have imported (pyarrow, boto3)
    from vlp.config import ConfigError
    from vlp.data.manifest import ManifestError
    from vlp.storage import StorageError
    from vlp.tracking import TrackingError

    weights = sys.modules.get("vlp.weights")  # not imported: no weights were read (and torch stays out)
    damaged = weights is not None and isinstance(exc, weights.DamagedCheckpointError)
    if damaged or isinstance(exc, (ConfigError, ManifestError, FileNotFoundError, ValueError)):
        print(f"vlp {args.command}: error: {exc}", file=sys.stderr)  # a damaged file's error names the file
        return 2
    if isinstance(exc, TrackingError):  # the MLflow server is down or refused: nothing is lost, run it again later
        print(f"vlp {args.command}: tracking error: {exc}", file=sys.stderr)
        return 1
    if isinstance(exc, StorageError):  # e.g. a missing bucket, bad credentials, an unreachable endpoint
        if args.verbose:
            logging.error("storage error", exc_info=exc)
        print(f"vlp {args.command}: storage error: {exc}", file=sys.stderr)
        return 1
    raise exc


if __name__ == "__main__":
    sys.exit(main())
