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
``docs/ablation.md`` (mean +- sample std over seeds, and the paper's directions with Welch t statistics).

    python benchmarks/ablation.py --out runs/ablation --seeds 0 1 2      # `make ablation`
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import time
from pathlib import Path
from typing import Any

from vlp import storage
from vlp.config import Config, load_config

ROWS: dict[str, tuple[list[str], bool]] = {  # row -> (pre-training losses, prompt ensembling)
    "none": ([], True),
    "mlm+vtm": (["mlm", "vtm"], True),
    "mlm+vtm+pem": (["mlm", "vtm", "pem"], True),
    "mlm+vtm+vtc": (["mlm", "vtm", "vtc"], True),
    "all": (["vtc", "pem", "mlm", "vtm"], True),
    "all, 1 template": (["vtc", "pem", "mlm", "vtm"], False),
}
ROOT = Path(__file__).resolve().parents[1]


BASE = ROOT / "configs" / "pipeline-local.yaml"  # the main job's settings, where the figures clear chance


def settings(args: argparse.Namespace, seed: int, extra: list[str] = ()) -> Config:
    """The ablation's config: the main job's (configs/pipeline-local.yaml) with this run's seed and size."""
    o = ["synth.num_images=0", "ingest.progress=false", "frames.progress=false", "pretrain.progress=false"]
    if args.clips:
        o.append(f"synth.num_videos={args.clips}")
    if args.pretrain_steps:
        o.append(f"pretrain.max_steps={args.pretrain_steps}")
    o.append(f"pretrain.seed={seed}")
    for task, steps in (("retrieval", args.finetune_steps), ("qa", args.qa_steps)):
        o += [f"{task}.seed={seed}", f"{task}.progress=false"]
        o += [f"{task}.max_steps={steps}"] if steps else []
    return load_config(BASE, [*o, *extra])


def done(out: str) -> bool:
    return storage.exists(storage.join(out, "summary.json"))


def data(args: argparse.Namespace, root: str) -> dict[str, str]:
    from vlp.steps.extract_frames import extract_frames
    from vlp.steps.ingest import ingest
    from vlp.steps.mine_entities import mine_entities
    from vlp.steps.synth import synth

    cfg = settings(args, 0)
    uris = {k: f"{root}/{k}" for k in ("raw", "dataset", "frames", "entities")}
    steps = (
        ("raw", synth, (uris["raw"], cfg)),
        ("dataset", ingest, (uris["raw"], uris["dataset"], cfg)),
        ("frames", extract_frames, (uris["dataset"], uris["frames"], cfg)),
        ("entities", mine_entities, (uris["dataset"], uris["entities"], cfg)),
    )
    for name, fn, fn_args in steps:
        if not done(uris[name]):
            fn(*fn_args)
    return uris


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
    if not done(out["alpro"]):
        if losses:
            pretrain(uris["dataset"], uris["frames"], f"{base}/prompter", bank, out["alpro"], cfg)
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
    if not done(f"{base}/prompter"):
        pretrain_prompter(uris["dataset"], uris["frames"], f"{base}/prompter", cfg)
    for name, ensemble in (("bank", True), ("bank_single", False)):
        if not done(f"{base}/{name}"):
            one = settings(args, seed, [f"model.alpro.prompt_ensemble={str(ensemble).lower()}"])
            build_prompt_bank(f"{base}/prompter", uris["entities"], f"{base}/{name}", one)


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


def directions_section(tests: list[str]) -> list[str]:
    """The report's "paper's directions" section around the :func:`direction_test` rows."""
    return ["", "## The paper's directions, here", "",
            "Welch's t of the difference of means over seeds; with 3 seeds |t| > 4.3 is roughly p < 0.05 "
            "(two-sided, 2 degrees of freedom), so smaller values are not evidence either way. A comparison "
            "where one side does not vary over seeds is not tested. The table runs "
            f"{len(tests)} tests: at p < 0.05 each, about {0.05 * len(tests):.1f} would pass by chance alone.", "",
            "| claim | metric | difference | t | holds here? |", "|---|---|---|---|---|", *tests]  # fmt: skip


def finite(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if not math.isnan(r.get(key, float("nan")))]


def load_units(root: str) -> list[dict[str, Any]]:
    """Every finished unit's result under ``<root>/results/`` (one JSON file per unit, so units can run in
    parallel processes: ``benchmarks/ablation_albef.py``, ``benchmarks/ablation_ts2net.py``)."""
    return [json.loads(storage.read_text(u)) for u in storage.list_files(f"{root}/results", suffix=".json")]


def row_tag(row: str) -> str:
    """``row`` as a file or directory name: runs of anything but letters and digits become one ``_``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", row).strip("_")


def save_unit(root: str, result: dict[str, Any]) -> None:
    storage.write_text(
        f"{root}/results/seed{result['seed']}-{row_tag(str(result['row']))}.json", json.dumps(result) + "\n"
    )


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


def write_report(lines: list[str], args: argparse.Namespace, path: Path) -> str:
    """The report's text with the ``--notes`` reading appended, written to ``path``."""
    if args.notes:
        lines = [*lines, "", Path(args.notes).read_text(encoding="utf-8").rstrip()]
    text = "\n".join(lines) + "\n"
    path.write_text(text, encoding="utf-8")
    return text


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
        "Generated by `make ablation` (`benchmarks/ablation.py`); do not edit by hand, re-run it.",
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
        "| pre-training | " + " | ".join(name for _, name in COLUMNS) + " | n |",
        "|---|" + "---|" * (len(COLUMNS) + 1),
    ]
    for row, rs in by_row.items():
        lines.append(f"| {row} | {row_cells(rs, COLUMNS, {})} | {len(rs)} |")
    tests = []
    for claim, key, better, worse in DIRECTIONS:
        a, b = finite(by_row[better], key), finite(by_row[worse], key)
        if a and b:
            tests.append(direction_test(f"{claim}: {better} vs {worse}", key, a, b))
    lines += directions_section(tests)
    return write_report(lines, args, path)


def main() -> None:
    p = ablation_parser(__doc__, "runs/ablation", str(ROOT / "docs" / "ablation.md"), list(ROWS))
    p.add_argument("--pretrain-steps", type=int, default=0, help="prompter and pre-training steps (0 = the main job's)")
    p.add_argument("--finetune-steps", type=int, default=0, help="retrieval fine-tuning steps (0 = the main job's)")
    p.add_argument("--qa-steps", type=int, default=0, help="QA fine-tuning steps (0 = the main job's)")
    args = p.parse_args()
    start = time.perf_counter()
    root = args.out.rstrip("/")
    storage.configure(settings(args, 0).storage)
    uris = {} if args.report_only else data(args, f"{root}/data")
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
