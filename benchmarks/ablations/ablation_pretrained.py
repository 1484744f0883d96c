"""A pretrained text start against the random tiny model, on the main job's world (issue 28).

For every seed and row, the main job's chain on its world and schedule (``configs/pipeline-local.yaml``): for ALPRO
the prompter and its prompt bank, pre-training, zero-shot evaluation, retrieval fine-tuning and evaluation, QA
fine-tuning and evaluation; ALBEF (``--family albef``) has no prompter. Rows:

    tiny                      the main job's model and schedule: width 64, random init, WordPiece trained on the
                              captions, fp32
    small-pretrained          all-MiniLM-L6-v2's layers 1-3 as the text tower and 4-6 as the fusion, its tokenizer, a
                              random width-384 video tower (``model.preset=small-pretrained``), the main job's steps,
                              bf16 autocast, learning rates lowered for the pretrained text (:data:`PRETRAINED`)
    small-pretrained, 10 min  as small-pretrained with fewer steps (:data:`BUDGET`): what fits the main job's budget
                              of 10 minutes on 2 cores

``--pretrained-set`` adds overrides to both pretrained rows.

Recorded per unit: the held-out VTM / ITM loss after fine-tuning and its label prior; text -> video R@1 re-ranked by
the fusion head and by similarity alone, fine-tuned and zero-shot; QA accuracy and the majority answer's; chance;
the wall time of each stage. Writes ``<out>/results/seed<N>-<row>.json`` (a re-run skips finished units) and the
report ``docs/results/pretrained-start.md`` (``docs/results/pretrained-start-albef.md`` for ALBEF).

    python benchmarks/ablations/ablation_pretrained.py --out runs/ablation-pretrained --seeds 0 1 2
    python benchmarks/ablations/ablation_pretrained.py --family albef --out runs/ablation-pretrained-albef --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from vlp import storage
from vlp.config import Config, load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common

# The pretrained rows' settings: bf16 autocast on the CPU (1.3x the fp32 speed of this model here), and learning rates
# between the main job's (for a model from scratch) and the papers' (1e-4 and below, for fully pretrained towers):
# the video tower still starts random. Chosen once, not tuned.
PRETRAINED = ["model.preset=small-pretrained", "pretrain.lr=0.0003", "retrieval.lr=0.0002", "qa.lr=0.0002",
              "pretrain.cpu_bf16=true", "retrieval.cpu_bf16=true", "qa.cpu_bf16=true"]  # fmt: skip
# Steps sized to the main job's 10 minutes, leaving about 2 for the data steps, the index and the report (the whole
# DAG with them was not timed), at this model's speed here: prompter 0.6 s, pre-training 2.0-2.3 s, retrieval 1.2 s,
# QA 0.8 s a step (batch 32, bf16).
BUDGET = ["pretrain.max_steps=80", "retrieval.max_steps=100", "qa.max_steps=75"]
ROWS: dict[str, list[str]] = {"tiny": [], "small-pretrained": PRETRAINED,
                              "small-pretrained, 10 min": PRETRAINED + BUDGET}  # fmt: skip


def settings(args: argparse.Namespace, seed: int, row: str = "tiny") -> Config:
    """The main job's config for ``args.family`` with this seed, the row's preset and the row's own overrides."""
    o = [*common.run_overrides(args, seed), f"model.family={args.family}"]
    o += ROWS[row] + (args.pretrained_set if ROWS[row] else [])  # last: BUDGET's steps win over --pretrain-steps
    return load_config(common.ABLATION_BASE, o)


def unit(args: argparse.Namespace, uris: dict[str, str], seed: int, row: str, root: str) -> dict[str, Any]:
    """One seed x row: (prompter, bank,) pre-training, zero-shot evaluation, both fine-tunings and evaluations."""
    from vlp.steps.evaluate import evaluate_qa, evaluate_retrieval
    from vlp.steps.finetune import finetune_qa, finetune_retrieval
    from vlp.steps.pretrain import build_prompt_bank, pretrain, pretrain_prompter

    cfg = settings(args, seed, row)
    base = f"{root}/seed{seed}/{common.row_tag(row)}"
    out = {k: f"{base}/{k}" for k in ("prompter", "bank", "pretrained", "zs", "ret", "ret_eval", "qa", "qa_eval")}
    seconds: dict[str, float] = {}

    def timed(name: str, fn: Any, *fn_args: Any) -> Any:
        start = time.perf_counter()
        result = fn(*fn_args)
        seconds[name] = round(time.perf_counter() - start, 1)
        return result

    prompter = bank = ""
    if args.family == "alpro":
        prompter, bank = out["prompter"], out["bank"]
        if not common.done(prompter):
            timed("prompter_s", pretrain_prompter, uris["dataset"], uris["frames"], prompter, cfg)
        if not common.done(bank):
            timed("bank_s", build_prompt_bank, prompter, uris["entities"], bank, cfg)
    if not common.done(out["pretrained"]):
        inputs = {"prompter": prompter, "bank": bank}
        timed("pretrain_s", pretrain, uris["dataset"], uris["frames"], out["pretrained"], cfg, inputs)
    zs = timed("zs_eval_s", evaluate_retrieval, uris["dataset"], uris["frames"], out["pretrained"], out["zs"], cfg)
    timed("ret_ft_s", finetune_retrieval, uris["dataset"], uris["frames"], out["pretrained"], out["ret"], cfg)
    ret = timed("ret_eval_s", evaluate_retrieval, uris["dataset"], uris["frames"], out["ret"], out["ret_eval"], cfg)
    timed("qa_ft_s", finetune_qa, uris["dataset"], uris["frames"], out["pretrained"], out["qa"], cfg)
    qa = timed("qa_eval_s", evaluate_qa, uris["dataset"], uris["frames"], out["qa"], out["qa_eval"], cfg)
    zs, ret, qa = zs["metrics"], ret["metrics"], qa["metrics"]
    model = json.loads(storage.read_text(storage.join(out["pretrained"], "model.json")))
    return {
        "seed": seed,
        "row": row,
        "family": args.family,
        "ft_t2v_r1": ret["t2v_r1"],  # the similarity top-k re-ranked by the fusion head (retrieval.score_rule)
        "ft_sim_t2v_r1": ret["vtc_t2v_r1"],  # similarity alone
        "ft_t2v_r5": ret["t2v_r5"],
        "ft_sim_t2v_r5": ret["vtc_t2v_r5"],
        "ft_match_loss": ret.get("vtm_loss", float("nan")),  # held-out VTM / ITM loss, hard negatives
        "match_prior": ret.get("vtm_loss_prior", float("nan")),  # a head that knows only the label ratio
        "ft_match_pos_acc": ret.get("vtm_pos_acc", float("nan")),
        "ft_match_neg_acc": ret.get("vtm_neg_acc", float("nan")),
        "zs_t2v_r1": zs["t2v_r1"],
        "zs_sim_t2v_r1": zs["vtc_t2v_r1"],
        "zs_match_loss": zs.get("vtm_loss", float("nan")),  # the pre-trained head, before fine-tuning
        "qa_acc": 100 * qa["accuracy"],
        "qa_majority": 100 * qa["majority_accuracy"],
        "chance_r1": 100 / ret["num_videos"],
        "num_videos": ret["num_videos"],
        "num_texts": ret["num_texts"],
        "upstream": model.get("lineage", {}).get("upstream", {}),
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
        **seconds,
        "total_s": round(sum(seconds.values()), 1),
    }


COLUMNS = (("ft_sim_t2v_r1", "FT t2v R@1, similarity only"), ("ft_t2v_r1", "FT t2v R@1, re-ranked"),
           ("ft_sim_t2v_r5", "FT t2v R@5, similarity only"), ("ft_t2v_r5", "FT t2v R@5, re-ranked"),
           ("ft_match_loss", "FT held-out match loss"), ("match_prior", "its label prior"),
           ("zs_sim_t2v_r1", "ZS t2v R@1, similarity only"), ("zs_t2v_r1", "ZS t2v R@1, re-ranked"),
           ("qa_acc", "QA acc"), ("qa_majority", "QA majority baseline"),
           ("total_s", "wall s (all stages)"))  # fmt: skip
TIMES = ("prompter_s", "bank_s", "pretrain_s", "zs_eval_s", "ret_ft_s", "ret_eval_s", "qa_ft_s", "qa_eval_s")


def row_settings(args: argparse.Namespace, row: str) -> str:
    """A Markdown table row: what ``row`` runs (preset, steps, learning rates, precision)."""
    c = settings(args, 0, row)
    steps = f"{c.pretrain.max_steps} / {c.retrieval.max_steps} / {c.qa.max_steps}"
    lrs = f"{c.pretrain.lr:g} / {c.retrieval.lr:g} / {c.qa.lr:g}"
    return f"| {row} | {c.model.preset} | {steps} | {lrs} | {'bf16' if c.pretrain.cpu_bf16 else 'fp32'} |"


def report(results: list[dict[str, Any]], args: argparse.Namespace, path: Path, wall_s: float) -> str:
    by_row = {row: [r for r in results if r["row"] == row] for row in ROWS}
    seeds = sorted({r["seed"] for r in results})
    c = settings(args, 0)
    first = results[0]
    stages = [t for t in TIMES if any(t in r for r in results)]
    time_rows = [f"| {row} | {common.row_cells(rs, tuple((t, t) for t in stages), dict.fromkeys(stages, 0))} |"
                 for row, rs in by_row.items() if rs]  # fmt: skip
    tests = []
    for row, rs in by_row.items():
        a, b = common.finite(rs, "ft_t2v_r1"), common.finite(rs, "ft_sim_t2v_r1")
        if len(a) > 1 and len(b) > 1:
            tests.append(common.direction_test(f"{row}: re-ranking beats similarity alone", "ft_t2v_r1", a, b))
    for row in [r for r in ROWS if r != "tiny"]:
        for key in ("ft_t2v_r1", "ft_sim_t2v_r1", "zs_sim_t2v_r1", "qa_acc", "ft_match_loss"):
            a, b = common.finite(by_row[row], key), common.finite(by_row["tiny"], key)
            if len(a) > 1 and len(b) > 1:
                if key == "ft_match_loss":  # lower is better: compare the negatives
                    a, b, key = [-x for x in a], [-x for x in b], "ft_match_loss (negated)"
                tests.append(common.direction_test(f"{row} beats tiny", key, a, b))
    lines = [
        f"# A pretrained text start on the main job's world ({args.family.upper()})",
        "",
        f"Generated by `benchmarks/ablations/ablation_pretrained.py --family {args.family}`; do not edit by hand, "
        "re-run it.",
        "",
        f"The main job's world and settings (`configs/pipeline-local.yaml`, `model.family={args.family}`): "
        f"{c.synth.num_videos} synthetic clips at {c.model.img_size} px ({first['num_videos']:.0f} test clips, "
        f"{first['num_texts']:.0f} test captions), {c.model.num_frames} frames, batch {c.pretrain.batch_size}; "
        f"retrieval re-ranks the similarity top-{c.retrieval.rerank_k} by `{c.retrieval.score_rule}`. Each row "
        "(steps: prompter and pre-training / retrieval / QA fine-tuning; learning rates likewise):",
        "",
        "| row | preset | steps | learning rates | precision |",
        "|---|---|---|---|---|",
        *[row_settings(args, row) for row in ROWS],
        "",
        f"Extra overrides of the pretrained rows: {' '.join(f'`{o}`' for o in args.pretrained_set) or 'none'}. "
        f"Seeds {seeds}; mean ± sample std over seeds (the value alone for a row of one seed). Chance: R@1 "
        f"{first['chance_r1']:.1f}%. The held-out match "
        "loss is VTM's (ALPRO) or ITM's (ALBEF) on the test pairs with hard negatives; its label prior is the loss "
        "of a head that knows only the share of positives. Wall times are this machine's 2 cores, "
        f"`OMP_NUM_THREADS={first.get('threads') or 'unset'}`. "
        + ("The report was rewritten from the results." if args.report_only else f"This call: {wall_s / 60:.0f} min."),
        "",
        *common.results_table("row", by_row, COLUMNS, {"total_s": 0, "match_prior": 2}, skip_empty=True),
        "",
        "Wall seconds per stage (mean ± std over seeds; the value alone for one seed):",
        "",
        "| row | " + " | ".join(stages) + " |",
        "|---|" + "---|" * len(stages),
        *time_rows,
    ]
    section = common.directions_section(tests)
    section[1] = "## Differences"
    lines += section
    return common.write_report(lines, args, path)


def main() -> None:
    p = common.ablation_parser(__doc__, "runs/ablation-pretrained", "", list(ROWS))
    p.add_argument("--family", default="alpro", choices=["alpro", "albef"])
    p.add_argument("--pretrain-steps", type=int, default=0, help="(prompter and) pre-training steps (0 = main job's)")
    p.add_argument("--finetune-steps", type=int, default=0, help="retrieval fine-tuning steps (0 = the main job's)")
    p.add_argument("--qa-steps", type=int, default=0, help="QA fine-tuning steps (0 = the main job's)")
    p.add_argument("--pretrained-set", nargs="*", default=[], metavar="section.key=value",
                   help="overrides of the small-pretrained row only (e.g. pretrain.lr=0.0001)")  # fmt: skip
    args = p.parse_args()
    if not args.report:
        suffix = "" if args.family == "alpro" else f"-{args.family}"
        args.report = str(common.ROOT / "docs" / "results" / f"pretrained-start{suffix}.md")
    start = time.perf_counter()
    results = common.ablation_results(args, list(ROWS), settings(args, 0), args, functools.partial(unit, args))
    if results:
        print(report(results, args, Path(args.report), time.perf_counter() - start))


if __name__ == "__main__":
    main()
