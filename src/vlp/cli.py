"""``vlp <step>``: the command line and the container entrypoint, one subcommand per pipeline step.

Every step takes input/output URIs (local paths or ``s3://bucket/prefix``), ``--config FILE``
and trailing ``section.key=value`` overrides, prints a JSON summary on stdout and exits 0 on
success, 2 on bad usage or bad input, 1 on an unexpected failure. ``vlp tracking sync OUT`` (not a
step) sends a training output's MLflow run what it lacks of ``OUT/metrics.jsonl`` and ends the run;
it exits 1 when the tracking server cannot take it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from vlp import __version__
from vlp.models.family import NAMES as FAMILY_NAMES

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlp", description="Video-language pre-training pipeline steps.", epilog=EPILOG
    )
    parser.add_argument("--version", action="version", version=f"vlp {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="STEP")

    data = sub.add_parser("data", help="dataset utilities (synth)")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="COMMAND")
    p = data_sub.add_parser("synth", help="write the synthetic video world (mp4 + images + manifests)", epilog=EPILOG)
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")
    p.add_argument("--num-videos", type=int, default=None, help="number of clips (default: synth.num_videos)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: synth.seed)")
    _common(p)

    track = sub.add_parser("tracking", help="MLflow tracking utilities (sync)")
    track_sub = track.add_subparsers(dest="tracking_command", required=True, metavar="COMMAND")
    p = track_sub.add_parser(
        "sync",
        help="send a training output's MLflow run what it lacks of OUT/metrics.jsonl, in step order, and end it "
        "with the step's status (a finished step: FINISHED); running it again sends nothing twice",
        epilog=EPILOG,
    )
    p.add_argument("out", help="training step output directory or s3:// prefix (holds metrics.jsonl)")
    p.add_argument("--status", choices=["FINISHED", "FAILED", "KILLED"], default="",
                   help="end the run so (default: FINISHED when OUT has summary.json, else the status the step "
                   "recorded; a step that has not finished stays RUNNING)")  # fmt: skip
    _common(p)

    p = sub.add_parser(
        "ingest", help="validate + probe a dataset into the manifest schema, with rejects", epilog=EPILOG
    )
    p.add_argument("--source", required=True, help="dataset directory, or an annotation file (jsonl/json/csv)")
    p.add_argument("--out", required=True, help="output dataset directory or s3:// prefix")
    p.add_argument("--format", default=None, help="auto|synth|alpro|lavis|webvid|msrvtt (default: ingest.format)")
    p.add_argument("--video-root", default=None, help="where relative video paths of an annotation file live")
    _fan_out(p, "probe only part I of N of the files, into OUT/probes.parquet", "a --part output to merge")
    _common(p)

    p = sub.add_parser("extract-frames", help="sparse frames -> Parquet shards of JPEGs + index", epilog=EPILOG)
    p.add_argument("--dataset", required=True, help="ingested dataset directory or s3:// prefix")
    p.add_argument("--out", required=True, help="output frames directory or s3:// prefix")
    _fan_out(p, "extract only part I of N of the shards (no index)", "a --part output to merge")
    _common(p)

    p = sub.add_parser(
        "pretrain-prompter", help="train the prompter (video-text dual encoder, VTC only)", epilog=EPILOG
    )
    p.add_argument("--dataset", required=True, help="ingested dataset directory or s3:// prefix")
    p.add_argument("--frames", required=True, help="extract-frames output")
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")
    _common(p)

    p = sub.add_parser(
        "build-prompt-bank", help="12 templates x mined entities through the frozen prompter", epilog=EPILOG
    )
    p.add_argument("--prompter", required=True, help="pretrain-prompter output")
    p.add_argument("--entities", required=True, help="mine-entities output")
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")
    _common(p)

    p = sub.add_parser(
        "pretrain", help="pre-train ALPRO (VTC + PEM + MLM + VTM) or ALBEF (ITC + MLM + ITM, distilled)", epilog=EPILOG
    )
    p.add_argument("--model", dest="family", choices=FAMILY_NAMES, help="model family (default: model.family)")
    p.add_argument("--dataset", required=True, help="ingested dataset directory or s3:// prefix")
    p.add_argument("--frames", required=True, help="extract-frames output")
    p.add_argument("--prompter", default="", help="pretrain-prompter output (ALPRO; ALBEF uses none)")
    p.add_argument("--prompt-bank", default="", help="build-prompt-bank output (ALPRO with PEM)")
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")
    _common(p)

    p = sub.add_parser("mine-entities", help="top-M caption nouns (spaCy) -> entity vocabulary", epilog=EPILOG)
    p.add_argument("--dataset", required=True, help="ingested dataset directory or s3:// prefix")
    p.add_argument("--out", required=True, help="output directory or s3:// prefix")
    _common(p)

    p = sub.add_parser(
        "import-checkpoint",
        help="released ALPRO / ALBEF / TS2-Net weights (salesforce/ALPRO, salesforce/ALBEF, LAVIS, yuqi657/ts2_net) "
        "-> a model directory for finetune-*/evaluate-*",
        epilog=EPILOG,
    )
    p.add_argument("--source", required=True, help="checkpoint file (.pt/.pth/.bin/.safetensors), local or s3://")
    p.add_argument("--out", required=True, help="output model directory or s3:// prefix")
    p.add_argument("--family", dest="ckpt_family", default="auto", choices=["auto", "alpro", "albef", "ts2net"],
                   help="which model the file holds (default: from the keys)")  # fmt: skip
    p.add_argument("--format", dest="ckpt_format", default="auto",
                   choices=["auto", "alpro", "albef", "lavis", "ts2net"],
                   help="key layout (default: detected; ALPRO, ALBEF: their own or lavis)")  # fmt: skip
    p.add_argument("--kind", default="auto",
                   choices=["auto", "alpro", "alpro_retrieval", "alpro_qa", "prompter", "albef", "albef_retrieval",
                            "ts2net_retrieval"],
                   help="what to build: pre-trained, retrieval, QA, or the pre-trained ALPRO file's prompter "
                   "(default: ALPRO: classifier -> QA, PEM head/prompter -> pre-trained, else retrieval; "
                   "ALBEF: MLM head -> pre-trained, else retrieval)")  # fmt: skip
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
    _common(p)

    for name, what, source in (
        ("finetune-retrieval", "fine-tune for text-video retrieval (VTC/ITC + VTM/ITM; section `retrieval`)",
         "pretrained"),
        ("finetune-qa", "fine-tune for open-ended video QA (ALPRO: a classifier; ALBEF: an answer decoder; section "
         "`qa`)", "pretrained"),
        ("evaluate-retrieval", "R@1/5/10, MdR, MnR both ways; top-k VTM re-ranking; zero-shot on a pretrain output",
         "model"),
        ("evaluate-qa", "QA accuracy overall and per answer type; predictions + report", "model"),
    ):  # fmt: skip
        p = sub.add_parser(name, help=what, epilog=EPILOG)
        p.add_argument("--dataset", required=True, help="ingested dataset directory or s3:// prefix")
        p.add_argument("--frames", required=True, help="extract-frames output")
        if name == "finetune-retrieval":
            p.add_argument("--pretrained", default="", help="`vlp pretrain` output to start from (default: none: "
                           "the `model` section's weights, e.g. TS2-Net's CLIP, or random init)")  # fmt: skip
            p.add_argument("--model", dest="family", choices=FAMILY_NAMES,
                           help="without --pretrained: the model family (default: model.family)")  # fmt: skip
        elif source == "pretrained":
            p.add_argument("--pretrained", required=True, help="`vlp pretrain` output to start from")
        else:
            p.add_argument("--model", required=True, help="fine-tuned output (or, for zero-shot, a pretrain output)")
        p.add_argument("--out", required=True, help="output directory or s3:// prefix")
        _common(p)
    return parser


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
        "ingest.video_root": getattr(args, "video_root", None),
        "model.family": getattr(args, "family", None),
    }
    return [f"{k}={json.dumps(v)}" for k, v in pairs.items() if v is not None]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from vlp.config import load_config

    cfg = load_config(args.config, [*args.overrides, *_cli_overrides(args)])
    if args.command == "data":
        from vlp.steps.synth import synth

        return synth(args.out, cfg)
    if args.command == "tracking":
        from vlp import storage, tracking

        storage.configure(cfg.storage)
        return tracking.sync(cfg.tracking, args.out, args.status)
    if args.command == "ingest":
        from vlp.steps.ingest import ingest, ingest_part

        if args.part:
            return ingest_part(args.source, args.out, cfg, *args.part)
        return ingest(args.source, args.out, cfg, probes=args.merge)
    if args.command == "extract-frames":
        from vlp.steps.extract_frames import extract_frames, extract_frames_part

        if args.part:
            return extract_frames_part(args.dataset, args.out, cfg, *args.part)
        return extract_frames(args.dataset, args.out, cfg, parts=args.merge)
    if args.command == "mine-entities":
        from vlp.steps.mine_entities import mine_entities

        return mine_entities(args.dataset, args.out, cfg)
    if args.command == "pretrain-prompter":
        from vlp.steps.pretrain import pretrain_prompter

        return pretrain_prompter(args.dataset, args.frames, args.out, cfg)
    if args.command == "build-prompt-bank":
        from vlp.steps.pretrain import build_prompt_bank

        return build_prompt_bank(args.prompter, args.entities, args.out, cfg)
    if args.command == "pretrain":
        from vlp.steps.pretrain import pretrain

        return pretrain(args.dataset, args.frames, args.prompter, args.prompt_bank, args.out, cfg)
    if args.command == "import-checkpoint":
        from vlp.steps.import_checkpoint import import_checkpoint

        return import_checkpoint(
            args.source,
            args.out,
            cfg,
            fmt=args.ckpt_format,
            kind=args.kind,
            tokenizer=args.tokenizer,
            answers=args.answers,
            video_heads=args.video_heads,
            text_heads=args.text_heads,
            fusion_layers=args.fusion_layers,
            max_len=args.max_len,
            family=args.ckpt_family,
            num_frames=args.num_frames,
        )
    if args.command in ("finetune-retrieval", "finetune-qa"):
        from vlp.steps import finetune

        fn = finetune.finetune_retrieval if args.command == "finetune-retrieval" else finetune.finetune_qa
        return fn(args.dataset, args.frames, args.pretrained, args.out, cfg)
    if args.command in ("evaluate-retrieval", "evaluate-qa"):
        from vlp.steps import evaluate

        fn = evaluate.evaluate_retrieval if args.command == "evaluate-retrieval" else evaluate.evaluate_qa
        return fn(args.dataset, args.frames, args.model, args.out, cfg)
    raise AssertionError(f"unhandled command {args.command}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from vlp.config import ConfigError
    from vlp.data.manifest import ManifestError
    from vlp.storage import StorageError
    from vlp.tracking import TrackingError

    try:
        summary = run(args)
    except (ConfigError, ManifestError, FileNotFoundError, ValueError) as exc:
        print(f"vlp {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except TrackingError as exc:  # the MLflow server is down or refused: nothing is lost, run it again later
        print(f"vlp {args.command}: tracking error: {exc}", file=sys.stderr)
        return 1
    except StorageError as exc:  # e.g. a missing bucket, bad credentials, an unreachable endpoint
        if args.verbose:
            logging.exception("storage error")
        print(f"vlp {args.command}: storage error: {exc}", file=sys.stderr)
        return 1
    summary.pop("config", None)
    print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
