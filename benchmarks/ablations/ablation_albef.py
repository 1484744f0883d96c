"""ALBEF Table 1 (the effect of its components), in miniature, on the synthetic world.

For every seed, one ALBEF pre-training per row, each fine-tuned and evaluated for retrieval and QA (and
evaluated zero-shot), on the main job's world and schedule (configs/pipeline-local.yaml, ``model.family=albef``;
the model keeps ALBEF's momentum 0.995 and 65,536-entry queue):

    none                  no pre-training: fine-tuning starts from random weights (the trivial baseline)
    mlm+itm               MLM + ITM, ITM negatives drawn uniformly (there is no ITC to draw hard ones from)
    itc+mlm+itm           + ITC (against batch + queue)
    itc+mlm+itm_hard      + ITM negatives drawn from the ITC softmax
    itc+mlm+itm_hard+mod  + momentum distillation (ALBEF)

Fine-tuning is the same in every row (the main job's: ITC + ITM with mixed ITM negatives) except for MoD: a row
without it is pre-trained and fine-tuned without it, the MoD row distils in both (the paper's Table 1 separates MoD
in pre-training from MoD in fine-tuning, two rows that are one here). Retrieval is reported twice: ranked by ITC alone
and re-ranked by ITM (ALBEF's evaluation), side by side.

Writes ``<out>/results/seed<N>-<row>.json`` (one file per unit; a re-run skips finished units) and the report
``docs/results/ablation-albef.md`` (mean +- sample std over seeds, the paper's directions with Welch t statistics).

    python benchmarks/ablations/ablation_albef.py --out runs/ablation-albef --seeds 0 1 2      # `make ablation-albef`
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

from vlp import storage
from vlp.config import Config, load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common

ROWS: dict[str, tuple[list[str], str, bool]] = {  # row -> (pre-training losses, ITM negatives, distillation)
    "none": ([], "hard", True),
    "mlm+itm": (["mlm", "itm"], "uniform", False),
    "itc+mlm+itm": (["itc", "mlm", "itm"], "uniform", False),
    "itc+mlm+itm_hard": (["itc", "mlm", "itm"], "hard", False),
    "itc+mlm+itm_hard+mod": (["itc", "mlm", "itm"], "hard", True),
}


def settings(args: argparse.Namespace, seed: int, row: str = "itc+mlm+itm_hard+mod") -> Config:
    """The main job's config with ``model.family=albef``, this seed and the row's pre-training objectives.

    Fine-tuning is the main job's in every row (ITC + ITM, mixed ITM negatives), with or without MoD as the row."""
    losses, negatives, distill = ROWS[row]
    o = ["model.family=albef", f"model.losses={json.dumps(losses)}", f"model.albef.vtm_negatives={negatives}"]
    # the main job's RandAugment ops (ALPRO's), as docs/results/ablation-albef.md was measured; ALBEF's own are
    # albef_paper
    o += [f"{section}.randaug_ops=alpro" for section in ("pretrain", "retrieval", "qa")]
    o.append(f"model.albef.distill={str(distill).lower()}")
    return load_config(common.ABLATION_BASE, [*common.run_overrides(args, seed), *o])


def random_init(dataset: str, out: str, cfg: Config) -> None:
    """The "none" row: an ALBEF model directory with random weights (the same shapes as the pre-trained rows)."""
    import torch

    from vlp.models import directory
    from vlp.steps.common import family_of, step_tokenizer
    from vlp.steps.pretrain import model_config
    from vlp.train.checkpoint import save_checkpoint

    fam = family_of(cfg.model)
    tok = step_tokenizer(cfg, dataset, out)  # WordPiece on the training captions, as pre-training trains it
    model_cfg = model_config(cfg.model, len(tok), 0, list(fam.default_losses))
    torch.manual_seed(cfg.pretrain.seed)
    ckpt = save_checkpoint(storage.join(out, "checkpoints"), 0, fam.build(fam.kinds.pretrained, model_cfg), None, None)
    directory.save(out, kind=fam.kinds.pretrained, config=model_cfg, checkpoint=ckpt, tokenizer=tok, steps=0,
                   lineage={"dataset": dataset}, entities=[])  # fmt: skip
    storage.write_text(storage.join(out, "summary.json"), json.dumps({"step": "random_init"}) + "\n")


def unit(args: argparse.Namespace, uris: dict[str, str], seed: int, row: str, root: str) -> dict[str, Any]:
    """Pre-train (row), fine-tune + evaluate retrieval and QA, evaluate zero-shot; returns the metrics."""
    from vlp.steps.evaluate import evaluate_qa, evaluate_retrieval
    from vlp.steps.finetune import finetune_qa, finetune_retrieval
    from vlp.steps.pretrain import pretrain

    losses = ROWS[row][0]
    tag = row.replace("+", "_")
    out = {k: f"{root}/seed{seed}/{tag}/{k}" for k in ("albef", "zs", "ret", "ret_eval", "qa", "qa_eval")}
    cfg = settings(args, seed, row)
    start = time.perf_counter()
    if not common.done(out["albef"]):
        if losses:
            pretrain(uris["dataset"], uris["frames"], out["albef"], cfg)
        else:
            random_init(uris["dataset"], out["albef"], cfg)
    pre_s = time.perf_counter() - start
    zs = evaluate_retrieval(uris["dataset"], uris["frames"], out["albef"], out["zs"], cfg)["metrics"]
    finetune_retrieval(uris["dataset"], uris["frames"], out["albef"], out["ret"], cfg)
    ret = evaluate_retrieval(uris["dataset"], uris["frames"], out["ret"], out["ret_eval"], cfg)["metrics"]
    finetune_qa(uris["dataset"], uris["frames"], out["albef"], out["qa"], cfg)
    qa = evaluate_qa(uris["dataset"], uris["frames"], out["qa"], out["qa_eval"], cfg)["metrics"]
    return {
        "seed": seed,
        "row": row,
        "ft_t2v_r1": ret["t2v_r1"],  # ITC top-k re-ranked by ITM (retrieval.score_rule)
        "ft_itc_t2v_r1": ret["vtc_t2v_r1"],  # ITC alone
        "ft_v2t_r1": ret["v2t_r1"],
        "ft_itc_v2t_r1": ret["vtc_v2t_r1"],
        "ft_t2v_r5": ret["t2v_r5"],
        "ft_t2v_medr": ret["t2v_medr"],
        "ft_itc_t2v_medr": ret["vtc_t2v_medr"],
        "ft_itm_loss": ret.get("vtm_loss", float("nan")),  # held-out, hard negatives; the 1:2 prior is 0.64
        "zs_t2v_r1": zs["t2v_r1"] if losses else float("nan"),
        "zs_itc_t2v_r1": zs["vtc_t2v_r1"] if losses else float("nan"),
        "qa_acc": 100 * qa["accuracy"],
        "qa_majority": 100 * qa["majority_accuracy"],
        "chance_r1": 100 / ret["num_videos"],
        "num_videos": ret["num_videos"],
        "num_texts": ret["num_texts"],
        "chance_medr": ret["chance_t2v_medr"],
        "pretrain_s": round(pre_s, 1),
        "total_s": round(time.perf_counter() - start, 1),
    }


COLUMNS = (("ft_itc_t2v_r1", "FT t2v R@1, ITC only"), ("ft_t2v_r1", "FT t2v R@1, ITM re-ranked"),
           ("ft_itc_v2t_r1", "FT v2t R@1, ITC only"), ("ft_v2t_r1", "FT v2t R@1, re-ranked"),
           ("ft_itc_t2v_medr", "FT t2v MdR, ITC only"), ("ft_t2v_medr", "FT t2v MdR, re-ranked"),
           ("ft_itm_loss", "FT held-out ITM loss (prior 0.64)"),
           ("zs_itc_t2v_r1", "ZS t2v R@1, ITC only"), ("zs_t2v_r1", "ZS t2v R@1, re-ranked"),
           ("qa_acc", "QA acc"), ("qa_majority", "QA majority baseline"))  # fmt: skip
DIRECTIONS = (  # (claim, metric, better row, worse row)
    ("ITC helps retrieval", "ft_t2v_r1", "itc+mlm+itm", "mlm+itm"),
    ("ITC helps retrieval", "ft_itc_t2v_r1", "itc+mlm+itm", "mlm+itm"),
    ("ITC helps zero-shot retrieval", "zs_itc_t2v_r1", "itc+mlm+itm", "mlm+itm"),
    ("ITC helps QA", "qa_acc", "itc+mlm+itm", "mlm+itm"),
    ("hard negatives help retrieval", "ft_t2v_r1", "itc+mlm+itm_hard", "itc+mlm+itm"),
    ("hard negatives help QA", "qa_acc", "itc+mlm+itm_hard", "itc+mlm+itm"),
    ("MoD helps retrieval", "ft_t2v_r1", "itc+mlm+itm_hard+mod", "itc+mlm+itm_hard"),
    ("MoD helps retrieval", "ft_itc_t2v_r1", "itc+mlm+itm_hard+mod", "itc+mlm+itm_hard"),
    ("MoD helps retrieval", "ft_itc_v2t_r1", "itc+mlm+itm_hard+mod", "itc+mlm+itm_hard"),
    ("MoD helps QA", "qa_acc", "itc+mlm+itm_hard+mod", "itc+mlm+itm_hard"),
    ("pre-training helps retrieval", "ft_t2v_r1", "itc+mlm+itm_hard+mod", "none"),
    ("pre-training helps QA", "qa_acc", "itc+mlm+itm_hard+mod", "none"),
    ("ITM re-ranking beats ITC alone (ALBEF §4)", "ft_t2v_r1", "itc+mlm+itm_hard+mod", "itc+mlm+itm_hard+mod|itc"),
)


def report(results: list[dict[str, Any]], args: argparse.Namespace, path: Path, wall_s: float) -> str:
    by_row = {row: [r for r in results if r["row"] == row] for row in ROWS}
    seeds = sorted({r["seed"] for r in results})
    c, first = settings(args, 0), results[0]
    lines = [
        "# Ablation: ALBEF Table 1 in miniature",
        "",
        "Generated by `make ablation-albef` (`benchmarks/ablations/ablation_albef.py`); do not edit by hand, "
        "re-run it.",
        "",
        f"Setting: the main job's (`configs/pipeline-local.yaml`) with `model.family=albef`: synthetic world, "
        f"{c.synth.num_videos} clips at {c.model.img_size} px ({100 * c.synth.test_fraction:.0f}% test: "
        f"{first['num_videos']:.0f} clips, {first['num_texts']:.0f} captions), {c.model.preset} preset, "
        f"{c.model.num_frames} frames, batch {c.pretrain.batch_size}, momentum {c.model.own().momentum}, queue "
        f"{c.model.own().queue_size}, alpha {c.model.own().alpha} ramped over the first epoch. Pre-training "
        f"{c.pretrain.max_steps} "
        f"steps at lr {c.pretrain.lr}; fine-tuning {c.retrieval.max_steps} (retrieval, lr {c.retrieval.lr}, ITC + "
        f"ITM) / {c.qa.max_steps} (QA, lr {c.qa.lr}, answer decoder) steps; retrieval re-ranks the ITC top-"
        f"{c.retrieval.rerank_k} by `{c.retrieval.score_rule}`. Seeds {seeds}. Mean ± sample std over seeds. "
        f"Chance: R@1 "
        f"{first['chance_r1']:.1f}%, MdR {first['chance_medr']:.1f}. The {len(results)} pre-train + fine-tune + "
        f"evaluate units took {sum(r['total_s'] for r in results) / 60:.0f} min in all on this machine's 2 CPU cores "
        + (
            "(the report was rewritten from the results)."
            if args.report_only
            else f"(this call: {wall_s / 60:.0f} min)."
        ),
        "",
    ]
    lines += common.results_table("pre-training", by_row, COLUMNS, {})
    tests = []
    for claim, key, better, worse in DIRECTIONS:
        worse_row, _, worse_key = worse.partition("|")  # "row|itc": the same row, ranked by ITC alone
        a = common.finite(by_row[better], key)
        b = common.finite(by_row[worse_row], f"ft_{worse_key}_t2v_r1" if worse_key else key)
        against = f"{worse_row}, ITC only" if worse_key else worse
        if a and b:
            tests.append(common.direction_test(f"{claim}: {better} vs {against}", key, a, b))
    lines += common.directions_section(tests)
    return common.write_report(lines, args, path)


def main() -> None:
    report_path = str(common.ROOT / "docs" / "results" / "ablation-albef.md")
    p = common.ablation_parser(__doc__, "runs/ablation-albef", report_path, list(ROWS))
    p.add_argument("--pretrain-steps", type=int, default=0, help="pre-training steps (0 = the main job's)")
    p.add_argument("--finetune-steps", type=int, default=0, help="retrieval fine-tuning steps (0 = the main job's)")
    p.add_argument("--qa-steps", type=int, default=0, help="QA fine-tuning steps (0 = the main job's)")
    args = p.parse_args()
    start = time.perf_counter()
    results = common.ablation_results(args, list(ROWS), settings(args, 0), args, functools.partial(unit, args))
    print(report(results, args, Path(args.report), time.perf_counter() - start))


if __name__ == "__main__":
    main()
