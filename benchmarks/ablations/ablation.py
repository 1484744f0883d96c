"""ALPRO Table 1 (pre-training objectives) and Table 5 (prompt ensembling), in miniature, on the synthetic world.

For every seed: one prompter and two prompt banks (12-template ensemble / one template), then one
pre-training per row, each fine-tuned and evaluated for retrieval and QA (and evaluated zero-shot):

    none              no pre-training: fine-tuning starts from random weights
    mlm+vtm           ALPRO w/o VTC and PEM
    mlm+vtm+pem       + PEM
    mlm+vtm+vtc       + VTC
    all               VTC + PEM + MLM + VTM (ALPRO)
    all, 1 template   as "all", with a prompt bank built from one template (Table 5, w/o ensembling)

Writes ``<out>/results.jsonl`` (one line per seed x row; a re-run skips finished units) and the report
``docs/results/ablation.md`` (mean +- sample std over seeds, and the paper's directions with Welch t statistics).

    python benchmarks/ablations/ablation.py --out runs/ablation --seeds 0 1 2      # `make ablation`
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from vlp import storage
from vlp.config import Config, load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common

ROWS: dict[str, tuple[list[str], bool]] = {  # row -> (pre-training losses, prompt ensembling)
    "none": ([], True),
    "mlm+vtm": (["mlm", "vtm"], True),
    "mlm+vtm+pem": (["mlm", "vtm", "pem"], True),
    "mlm+vtm+vtc": (["mlm", "vtm", "vtc"], True),
    "all": (["vtc", "pem", "mlm", "vtm"], True),
    "all, 1 template": (["vtc", "pem", "mlm", "vtm"], False),
}


def settings(args: argparse.Namespace, seed: int, extra: list[str] = ()) -> Config:
    """The ablation's config: the main job's (configs/pipeline-local.yaml) with this run's seed and size."""
    return load_config(common.ABLATION_BASE, [*common.run_overrides(args, seed), *extra])


def random_init(uris: dict[str, str], prompter: str, out: str, cfg: Config) -> None:
    """The "none" row: an ALPRO output with random weights (same shapes as the pre-trained rows)."""
    import torch

    from vlp.models import directory
    from vlp.models.alpro.model import Alpro
    from vlp.steps.pretrain import model_config
    from vlp.train.checkpoint import save_checkpoint

    tok = directory.describe(prompter, ("prompter",)).tokenizer()
    model_cfg = model_config(cfg.model, len(tok), 0, ["vtc", "mlm", "vtm"])
    torch.manual_seed(cfg.pretrain.seed)
    ckpt = save_checkpoint(storage.join(out, "checkpoints"), 0, Alpro(model_cfg), None, None)
    directory.save(out, kind="alpro", config=model_cfg, checkpoint=ckpt, tokenizer=tok, steps=0, entities=[])
    storage.write_text(storage.join(out, "summary.json"), json.dumps({"step": "random_init"}) + "\n")


def unit(args: argparse.Namespace, uris: dict[str, str], seed: int, row: str, root: str) -> dict[str, Any]:
    """Pre-train (row), fine-tune + evaluate retrieval and QA, evaluate zero-shot; returns the metrics."""
    from vlp.steps.evaluate import evaluate_qa, evaluate_retrieval
    from vlp.steps.finetune import finetune_qa, finetune_retrieval
    from vlp.steps.pretrain import pretrain

    losses, ensemble = ROWS[row]
    base = f"{root}/seed{seed}"
    tag = row.replace(", ", "_").replace(" ", "_").replace("+", "_")
    out = {k: f"{base}/{tag}/{k}" for k in ("alpro", "zs", "ret", "ret_eval", "qa", "qa_eval")}
    cfg = settings(args, seed, [f"model.losses={json.dumps(losses or ['vtc'])}"])
    bank = f"{base}/bank" if ensemble else f"{base}/bank_single"
    start = time.perf_counter()
    if not common.done(out["alpro"]):
        if losses:
            pretrain(uris["dataset"], uris["frames"], out["alpro"], cfg, {"prompter": f"{base}/prompter", "bank": bank})
        else:
            random_init(uris, f"{base}/prompter", out["alpro"], cfg)
    pre_s = time.perf_counter() - start
    pre_metrics = json.loads(storage.read_text(storage.join(out["alpro"], "summary.json"))).get("metrics") or {}
    zs = evaluate_retrieval(uris["dataset"], uris["frames"], out["alpro"], out["zs"], cfg)["metrics"]
    finetune_retrieval(uris["dataset"], uris["frames"], out["alpro"], out["ret"], cfg)
    ret = evaluate_retrieval(uris["dataset"], uris["frames"], out["ret"], out["ret_eval"], cfg)["metrics"]
    finetune_qa(uris["dataset"], uris["frames"], out["alpro"], out["qa"], cfg)
    qa = evaluate_qa(uris["dataset"], uris["frames"], out["qa"], out["qa_eval"], cfg)["metrics"]
    return {
        "seed": seed,
        "row": row,
        "ft_t2v_r1": ret["t2v_r1"],
        "ft_vtc_t2v_r1": ret["vtc_t2v_r1"],  # the contrastive ranking the VTM head re-ranks
        "ft_t2v_r5": ret["t2v_r5"],
        "ft_t2v_medr": ret["t2v_medr"],
        "ft_vtc_t2v_medr": ret["vtc_t2v_medr"],
        "ft_v2t_r1": ret["v2t_r1"],
        "ft_vtm_loss": ret.get("vtm_loss", float("nan")),  # held-out, hard negatives; the 1:2 prior is 0.64
        "zs_t2v_r1": zs["t2v_r1"] if losses else float("nan"),
        "qa_acc": 100 * qa["accuracy"],
        "qa_majority": 100 * qa["majority_accuracy"],
        "pem_kept": pre_metrics.get("train/pem_kept", float("nan")),  # share of PEM crops kept, last log window
        "chance_r1": 100 / ret["num_videos"],
        "num_videos": ret["num_videos"],
        "num_texts": ret["num_texts"],
        "chance_medr": ret["chance_t2v_medr"],
        "pretrain_s": round(pre_s, 1),
        "total_s": round(time.perf_counter() - start, 1),
    }


def prompter_and_banks(args: argparse.Namespace, uris: dict[str, str], seed: int, root: str) -> None:
    from vlp.steps.pretrain import build_prompt_bank, pretrain_prompter

    base = f"{root}/seed{seed}"
    cfg = settings(args, seed)
    if not common.done(f"{base}/prompter"):
        pretrain_prompter(uris["dataset"], uris["frames"], f"{base}/prompter", cfg)
    for name, ensemble in (("bank", True), ("bank_single", False)):
        if not common.done(f"{base}/{name}"):
            one = settings(args, seed, [f"model.alpro.prompt_ensemble={str(ensemble).lower()}"])
            build_prompt_bank(f"{base}/prompter", uris["entities"], f"{base}/{name}", one)


COLUMNS = (("ft_t2v_r1", "FT t2v R@1"), ("ft_vtc_t2v_r1", "FT VTC-only t2v R@1"), ("ft_t2v_r5", "FT t2v R@5"),
           ("ft_t2v_medr", "FT t2v MdR"), ("ft_vtc_t2v_medr", "FT VTC-only t2v MdR"), ("ft_v2t_r1", "FT v2t R@1"),
           ("ft_vtm_loss", "FT held-out VTM loss (prior 0.64)"),
           ("zs_t2v_r1", "ZS t2v R@1"), ("qa_acc", "QA acc"), ("qa_majority", "QA majority baseline"),
           ("pem_kept", "PEM crops kept"))  # fmt: skip
DIRECTIONS = (  # (claim, metric, better row, worse row)
    ("VTC helps retrieval (Table 1)", "ft_t2v_r1", "mlm+vtm+vtc", "mlm+vtm"),
    ("VTC helps retrieval, with PEM on (Table 1)", "ft_t2v_r1", "all", "mlm+vtm+pem"),
    ("VTC helps retrieval (Table 1)", "ft_t2v_r5", "mlm+vtm+vtc", "mlm+vtm"),
    ("VTC helps retrieval (Table 1)", "ft_t2v_medr", "mlm+vtm+vtc", "mlm+vtm"),
    ("VTC helps retrieval, with PEM on (Table 1)", "ft_t2v_medr", "all", "mlm+vtm+pem"),
    ("PEM helps QA (Table 1)", "qa_acc", "mlm+vtm+pem", "mlm+vtm"),
    ("PEM helps QA, with VTC on (Table 1)", "qa_acc", "all", "mlm+vtm+vtc"),
    ("pre-training helps retrieval", "ft_t2v_r1", "all", "none"),
    ("pre-training helps QA", "qa_acc", "all", "none"),
    ("prompt ensembling helps retrieval (Table 5)", "ft_t2v_r1", "all", "all, 1 template"),
    ("prompt ensembling helps zero-shot (Table 5)", "zs_t2v_r1", "all", "all, 1 template"),
    ("prompt ensembling helps QA (Table 5)", "qa_acc", "all", "all, 1 template"),
)


def report(results: list[dict[str, Any]], args: argparse.Namespace, path: Path, wall_s: float) -> str:
    by_row = {row: [r for r in results if r["row"] == row] for row in ROWS}
    seeds = sorted({r["seed"] for r in results})
    c = settings(args, 0)
    lines = [
        "# Ablation: ALPRO Table 1 and Table 5 in miniature",
        "",
        "Generated by `make ablation` (`benchmarks/ablations/ablation.py`); do not edit by hand, re-run it.",
        "",
        f"Setting: the main job's (`configs/pipeline-local.yaml`): synthetic world, {c.synth.num_videos} clips at "
        f"{c.model.img_size} px ({100 * c.synth.test_fraction:.0f}% test: {results[0]['num_videos']:.0f} clips, "
        f"{results[0]['num_texts']:.0f} captions), {c.model.preset} ALPRO preset, {c.model.num_frames} frames, batch "
        f"{c.pretrain.batch_size}. Prompter and pre-training {c.pretrain.max_steps} steps each at lr {c.pretrain.lr} "
        f"(VTM negatives: {c.model.own().vtm_negatives}); fine-tuning {c.retrieval.max_steps} (retrieval, lr "
        f"{c.retrieval.lr}, VTM negatives {c.retrieval.matching_negatives}, same-clip pairs "
        f"{c.retrieval.same_clip_matching}) "
        f"/ {c.qa.max_steps} (QA, lr {c.qa.lr}) steps; retrieval scores the VTC top-{c.retrieval.rerank_k} by "
        f"`{c.retrieval.score_rule}`. Seeds {seeds}. Mean ± sample std over seeds. Chance: R@1 "
        f"{results[0]['chance_r1']:.1f}%, MdR {results[0]['chance_medr']:.1f}. The {len(results)} pre-train + "
        f"fine-tune + evaluate units took {sum(r['total_s'] for r in results) / 60:.0f} min in all on this machine's "
        f"2 CPU cores (data and prompters not counted"
        + (
            "; the report was rewritten from results.jsonl)."
            if args.report_only
            else f"; this call: {wall_s / 60:.0f} min)."
        ),
        "",
        *common.results_table("pre-training", by_row, COLUMNS, {}),
        *common.directions_section(common.direction_tests(DIRECTIONS, by_row)),
    ]
    return common.write_report(lines, args, path)


def main() -> None:
    report_path = str(common.ROOT / "docs" / "results" / "ablation.md")
    p = common.ablation_parser(__doc__, "runs/ablation", report_path, list(ROWS))
    p.add_argument("--pretrain-steps", type=int, default=0, help="prompter and pre-training steps (0 = the main job's)")
    p.add_argument("--finetune-steps", type=int, default=0, help="retrieval fine-tuning steps (0 = the main job's)")
    p.add_argument("--qa-steps", type=int, default=0, help="QA fine-tuning steps (0 = the main job's)")
    args = p.parse_args()
    start = time.perf_counter()
    root = args.out.rstrip("/")
    storage.configure(settings(args, 0).storage)
    uris = {} if args.report_only else common.ablation_world(args, f"{root}/data")
    results_uri = f"{root}/results.jsonl"
    results = (
        [json.loads(x) for x in storage.read_text(results_uri).splitlines()] if storage.exists(results_uri) else []
    )
    finished = {(r["seed"], r["row"]) for r in results}
    for seed in [] if args.report_only else args.seeds:
        prompter_and_banks(args, uris, seed, root)
        for row in args.rows:
            if (seed, row) in finished:
                continue
            one = unit(args, uris, seed, row, root)
            results.append(one)
            storage.write_text(results_uri, "".join(json.dumps(r) + "\n" for r in results))
            print(json.dumps(one), flush=True)
    print(report(results, args, Path(args.report), time.perf_counter() - start))


if __name__ == "__main__":
    main()
