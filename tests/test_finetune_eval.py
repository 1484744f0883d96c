"""finetune-retrieval/-qa and evaluate-retrieval/-qa on the tiny synthetic world, local and s3://."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from vlp import storage
from vlp.cli import main
from vlp.config import Config, ConfigError, load_config, parse_override
from vlp.steps.evaluate import evaluate_qa, evaluate_retrieval
from vlp.steps.finetune import finetune_qa, finetune_retrieval
from vlp.steps.mine_entities import mine_entities
from vlp.steps.pretrain import build_prompt_bank, pretrain, pretrain_prompter

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


@pytest.fixture(scope="module")
def pretrained(tiny_world, tmp_path_factory) -> dict[str, str]:
    """A 3-step ALPRO pre-training (all four objectives) on the tiny world."""
    root = tmp_path_factory.mktemp("finetune")
    cfg = load_config(TINY)
    uris = dict(tiny_world, **{k: str(root / k) for k in ("entities", "prompter", "bank", "alpro")})
    mine_entities(uris["dataset"], uris["entities"], cfg)
    pretrain_prompter(uris["dataset"], uris["frames"], uris["prompter"], cfg)
    build_prompt_bank(uris["prompter"], uris["entities"], uris["bank"], cfg)
    pretrain(uris["dataset"], uris["frames"], uris["alpro"], cfg, {"prompter": uris["prompter"], "bank": uris["bank"]})
    return uris


def _json(uri: str) -> dict:
    return json.loads(storage.read_text(uri))


def test_finetune_retrieval_then_evaluate(pretrained, tmp_path):
    cfg = load_config(TINY)
    ft = str(tmp_path / "ret")
    summary = finetune_retrieval(pretrained["dataset"], pretrained["frames"], pretrained["alpro"], ft, cfg)
    assert summary["steps"] == 2
    assert set(summary["metrics"]) >= {"train/loss_vtc", "train/loss_vtm"}
    assert "train/loss_pem" not in summary["metrics"] and "train/loss_mlm" not in summary["metrics"]
    doc = _json(f"{ft}/model.json")
    assert doc["kind"] == "alpro_retrieval" and doc["config"]["num_entities"] == 0
    out = str(tmp_path / "ret_eval")
    result = evaluate_retrieval(pretrained["dataset"], pretrained["frames"], ft, out, cfg)
    m = _json(f"{out}/metrics.json")
    assert m == pytest.approx(result["metrics"])
    assert bool(result["warnings"]) == (m["t2v_r1"] < m["vtc_t2v_r1"])  # VTM that hurts the ranking is flagged
    assert m["vtm_loss_prior"] == pytest.approx(0.6365, abs=1e-4) and m["vtm_loss"] > 0  # held-out VTM, vs prior
    assert 0 <= m["vtm_pos_acc"] <= 100 and 0 <= m["vtm_neg_acc"] <= 100
    for direction in ("t2v", "v2t"):
        assert 0 <= m[f"{direction}_r1"] <= m[f"{direction}_r5"] <= m[f"{direction}_r10"] <= 100
        candidates = m["num_videos"] if direction == "t2v" else m["num_texts"]
        assert 1 <= m[f"{direction}_medr"] <= candidates and 1 <= m[f"{direction}_meanr"] <= candidates
    ranks = storage.read_parquet(f"{out}/ranks.parquet")
    assert ranks.num_rows == m["num_texts"]
    assert m["t2v_r1"] == pytest.approx(100 * sum(r == 1 for r in ranks["t2v_rank"].to_pylist()) / ranks.num_rows)
    from vlp.eval.retrieval import chance_metrics

    texts = storage.read_parquet(f"{out}/ranks.parquet")["video_id"].to_pylist()
    position = {v: i for i, v in enumerate(sorted(set(texts)))}
    assert {k: m[k] for k in m if k.startswith("chance_")} == chance_metrics(
        torch.tensor([position[v] for v in texts]), len(position)
    )
    report = Path(out, "report.md").read_text()
    assert f"{m['t2v_r1']:.2f}" in report
    for row in ("| vtc text → video |", "| chance text → video |", "| chance video → text |"):
        assert row in report, row  # the VTC-only ranking and chance sit next to the re-ranked figures
    assert f"| chance text → video | {m['chance_t2v_r1']:.2f} |" in report
    assert Path(out, "report.html").stat().st_size > 0


def _eval(pretrained: dict, model: str, out: Path, *overrides: str) -> dict:
    cfg = load_config(TINY, overrides)
    return evaluate_retrieval(pretrained["dataset"], pretrained["frames"], model, str(out), cfg)


def test_topk_with_k_at_least_n_is_full_scoring(pretrained, tmp_path):
    """k >= the number of items re-ranks every pair once: the full N x N scoring of the released code."""
    full = _eval(pretrained, pretrained["alpro"], tmp_path / "a", "retrieval.rerank_k=1000")["metrics"]
    assert full["pairs_scored"] == full["num_texts"] * full["num_videos"]
    n = int(full["num_texts"])
    exact = _eval(pretrained, pretrained["alpro"], tmp_path / "b", f"retrieval.rerank_k={n}")["metrics"]
    assert exact == full
    top1 = _eval(pretrained, pretrained["alpro"], tmp_path / "c", "retrieval.rerank_k=1")["metrics"]
    assert top1["pairs_scored"] < full["pairs_scored"]
    assert top1["vtc_t2v_r1"] == full["vtc_t2v_r1"], "the contrastive ranking does not depend on k"


def test_a_vtm_head_that_hurts_the_ranking_is_flagged(pretrained, tmp_path, monkeypatch):
    """An anti-oracle VTM head (true pairs score lowest) drops R@1 to 0: the step warns, metrics keep VTC's."""
    from vlp.steps import evaluate

    first = _eval(pretrained, pretrained["alpro"], tmp_path / "a", "retrieval.split=train", "retrieval.rerank_k=1000")
    videos = storage.read_parquet(str(tmp_path / "a" / "ranks.parquet"))["video_id"].to_pylist()
    position = {v: i for i, v in enumerate(sorted(set(videos)))}
    text_video = torch.tensor([position[v] for v in videos])
    assert first["metrics"]["vtc_t2v_r1"] > 0, "the precondition: VTC ranks some caption's clip first"

    def anti_oracle(*_):
        def score(t, v):
            match = torch.where(text_video[t] == v, -9.0, 9.0)  # (P,)
            return torch.stack([-match, match], dim=1)

        return score

    monkeypatch.setattr(evaluate, "_pair_scorer", anti_oracle)
    bad = _eval(pretrained, pretrained["alpro"], tmp_path / "b", "retrieval.split=train", "retrieval.rerank_k=1000")
    m = bad["metrics"]
    assert m["t2v_r1"] == 0.0 and m["vtc_t2v_r1"] == first["metrics"]["vtc_t2v_r1"]
    assert len(bad["warnings"]) == 1 and "lowers text->video R@1" in bad["warnings"][0]
    assert not first["warnings"] or first["metrics"]["t2v_r1"] < first["metrics"]["vtc_t2v_r1"]
    assert m["vtm_neg_acc"] == 0.0 and m["vtm_pos_acc"] == 0.0 and m["vtm_loss"] > 2 * m["vtm_loss_prior"]


def test_zero_shot_is_evaluate_on_a_pretrain_output(pretrained, tmp_path):
    result = _eval(pretrained, pretrained["alpro"], tmp_path / "zs")
    assert result["model_kind"] == "alpro"
    assert storage.exists(str(tmp_path / "zs" / "report.html"))


def test_finetune_qa_then_evaluate_counts_oov_as_wrong(pretrained, tmp_path):
    cfg = load_config(TINY, ["qa.answer_vocab=3"])  # a 3-answer vocabulary leaves most test answers out
    ft = str(tmp_path / "qa")
    summary = finetune_qa(pretrained["dataset"], pretrained["frames"], pretrained["alpro"], ft, cfg)
    assert summary["answers"] == 3 and 0 < summary["train_answer_coverage"] < 1
    answers = _json(f"{ft}/answers.json")
    out = str(tmp_path / "qa_eval")
    result = evaluate_qa(pretrained["dataset"], pretrained["frames"], ft, out, cfg)
    preds = storage.read_parquet(f"{out}/predictions.parquet").to_pylist()
    assert all(p["prediction"] in answers for p in preds)
    n_correct = sum(p["prediction"] == p["answer"] for p in preds)
    assert not any(p["correct"] for p in preds if not p["in_vocab"]), "an OOV answer can never be right"
    m = result["metrics"]
    assert m["accuracy"] == pytest.approx(n_correct / len(preds))
    assert m["oov_rate"] == pytest.approx(sum(not p["in_vocab"] for p in preds) / len(preds))
    assert m["oov_rate"] > 0
    # the baselines: the training split's most frequent answer (here also the vocabulary's first), and chance
    assert result["baseline"] == {"majority_answer": answers[0], "majority_from": "train split"}
    assert m["majority_accuracy"] == pytest.approx(sum(p["answer"] == answers[0] for p in preds) / len(preds))
    assert m["chance_accuracy"] == pytest.approx((1 - m["oov_rate"]) / len(answers))
    assert (
        f"majority-answer baseline (always {answers[0]!r}) (%) | {100 * m['majority_accuracy']:.2f}"
        in (Path(out) / "report.md").read_text()
    )
    types = {p["answer_type"] for p in preds}
    assert all(f"acc_{t}" in m for t in types)
    assert "accuracy" in Path(out, "report.md").read_text().lower()


def test_qa_model_reloads_and_predicts_what_the_trained_model_predicts(pretrained, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    import vlp.steps.finetune as finetune_module
    from vlp.data.video_text import VideoQADataset
    from vlp.inference import text_length
    from vlp.models.alpro.model import FAMILY
    from vlp.models.tokenizer import load_tokenizer
    from vlp.steps.evaluate import _predict_qa
    from vlp.steps.finetune import task_data

    trained = {}
    real_train = finetune_module.train_model

    def keep_the_model(model, *args, **kwargs):  # the model object training updated, before anything is saved
        trained["model"] = model
        return real_train(model, *args, **kwargs)

    monkeypatch.setattr(finetune_module, "train_model", keep_the_model)
    cfg = load_config(TINY)
    ft = str(tmp_path / "qa")
    finetune_qa(pretrained["dataset"], pretrained["frames"], pretrained["alpro"], ft, cfg)
    model = trained["model"].eval()
    doc = _json(f"{ft}/model.json")
    saved = load_file(f"{ft}/{doc['checkpoint']}/model.safetensors")
    in_memory = model.state_dict()
    assert saved.keys() == in_memory.keys() and all(torch.equal(saved[k], in_memory[k]) for k in saved)

    evaluate_qa(pretrained["dataset"], pretrained["frames"], ft, str(tmp_path / "e1"), cfg)  # reloads from disk
    written = storage.read_parquet(str(tmp_path / "e1" / "predictions.parquet")).to_pylist()
    data = task_data(VideoQADataset, cfg.qa, pretrained["dataset"], pretrained["frames"], model.cfg,
                     cfg.qa.split, training=False)  # fmt: skip
    tok = load_tokenizer(f"{ft}/tokenizer")
    length = text_length(cfg.qa, model.cfg)
    preds, confidence = _predict_qa(FAMILY, model, tok, data, length, cfg.qa.eval_batch_size, cfg)
    answers = json.loads(Path(ft, "answers.json").read_text())
    assert [r["prediction"] for r in written] == [answers[i] for i in preds]
    assert [r["confidence"] for r in written] == pytest.approx(confidence, abs=1e-6)


def test_wrong_model_kind_is_a_clear_error(pretrained, tmp_path):
    with pytest.raises(ValueError, match="finetune-qa"):
        evaluate_qa(pretrained["dataset"], pretrained["frames"], pretrained["alpro"], str(tmp_path / "x"),
                    load_config(TINY))  # fmt: skip
    args = ["--dataset", pretrained["dataset"], "--frames", pretrained["frames"], "--config", str(TINY)]
    code = main(["evaluate-retrieval", *args, "--model", str(tmp_path / "nowhere"), "--out", str(tmp_path / "y")])
    assert code == 2


def _unchecked(*overrides: str) -> Config:
    """The tiny config with ``overrides`` set after loading, unchecked, as a caller building it in Python would."""
    cfg = load_config(TINY)
    for key, value in map(parse_override, overrides):
        section, name = key.split(".")
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: value})})
    return cfg


OUT_OF_RANGE = [  # (command, whether it starts from the pre-trained ALPRO (else TS2-Net from scratch), override, rule)
    ("finetune-retrieval", True, "retrieval.batch_size=0", ">= 1"),
    ("finetune-retrieval", False, "retrieval.batch_size=0", ">= 1"),  # from scratch: trains its tokenizer first
    ("finetune-retrieval", False, "retrieval.max_steps=-1", ">= 0 (0 = epochs x updates per epoch)"),
    ("finetune-retrieval", False, "pretrain.batch_size=0", ">= 1"),  # every section, not only the step's own
    ("finetune-qa", True, "qa.batch_size=0", ">= 1"),
    ("finetune-qa", True, "qa.max_steps=-1", ">= 0 (0 = epochs x updates per epoch)"),
    ("evaluate-retrieval", True, "retrieval.eval_batch_size=0", ">= 1"),
    ("evaluate-qa", True, "qa.eval_batch_size=0", ">= 1"),
]


@pytest.mark.parametrize(("command", "from_pretrained", "override", "must"), OUT_OF_RANGE)
def test_a_count_out_of_range_fails_before_the_step_writes_anything(
    command, from_pretrained, override, must, pretrained, tmp_path, capsys
):
    start = ["--model" if command.startswith("evaluate") else "--pretrained", pretrained["alpro"]]
    args = ["--dataset", pretrained["dataset"], "--frames", pretrained["frames"]]
    args += start if from_pretrained else ["--model", "ts2net"]
    out = tmp_path / "out"
    assert main([command, *args, "--out", str(out), "--config", str(TINY), override]) == 2
    message = f"invalid config: {override} must be {must}"
    assert capsys.readouterr().err.strip().splitlines() == [f"vlp {command}: error: {message}"]
    assert not out.exists()
    step = {"finetune-retrieval": finetune_retrieval, "finetune-qa": finetune_qa,
            "evaluate-retrieval": evaluate_retrieval, "evaluate-qa": evaluate_qa}[command]  # fmt: skip
    if from_pretrained:
        model, cfg = pretrained["alpro"], _unchecked(override)
    else:
        model, cfg = "", _unchecked(override, "model.family=ts2net")
    with pytest.raises(ConfigError, match=re.escape(message)):
        step(pretrained["dataset"], pretrained["frames"], model, str(out), cfg)
    assert not out.exists()


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["model.family=alpro"], "PEM needs num_entities >= 1"),  # ALPRO's pre-training objectives, from scratch
        (["model.losses=[vtc,vtm]", "model.img_size=30"], "img_size=30 must be a positive multiple of patch_size"),
        (["model.family=ts2net", "--frames=nowhere"], "nowhere/index.parquet does not exist"),
    ],
)
def test_retrieval_from_scratch_that_cannot_work_writes_no_tokenizer(overrides, says, pretrained, tmp_path, capsys):
    out = tmp_path / "out"
    frames = str(tmp_path / "nowhere") if "--frames=nowhere" in overrides else pretrained["frames"]
    args = ["--dataset", pretrained["dataset"], "--frames", frames, "--out", str(out), "--config", str(TINY)]
    assert main(["finetune-retrieval", *args, *(o for o in overrides if not o.startswith("--"))]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


def test_cli_chain_on_s3(pretrained, s3_bucket, s3_env):
    """finetune-retrieval -> evaluate-retrieval through the CLI with every output on s3://."""
    ft, ev = f"{s3_bucket}/ft", f"{s3_bucket}/ev"
    args = ["--dataset", pretrained["dataset"], "--frames", pretrained["frames"], "--config", str(TINY)]
    assert main(["finetune-retrieval", *args, "--pretrained", pretrained["alpro"], "--out", ft]) == 0
    assert main(["evaluate-retrieval", *args, "--model", ft, "--out", ev]) == 0
    m = json.loads(storage.read_text(f"{ev}/metrics.json"))
    assert m["num_texts"] > 0 and storage.exists(f"{ev}/report.html") and storage.exists(f"{ev}/ranks.parquet")
    assert torch.isfinite(torch.tensor(m["t2v_meanr"]))


PAPER = {  # ALPRO Tables 9 and 10: lr, global batch (8 GPUs), epochs, frames, text length, grad accumulation
    "msrvtt-ret": ("retrieval", 2.5e-5, 64, 5, 8, 40, 1),
    "didemo-ret": ("retrieval", 4e-5, 96, 10, 8, 50, 1),
    "msrvtt-qa": ("qa", 5e-5, 96, 10, 16, 40, 2),
    "msvd-qa": ("qa", 5e-5, 96, 15, 16, 40, 2),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_presets_layer_over_a_base_config(name):
    section, lr, batch, epochs, frames, length, accum = PAPER[name]
    base = TINY.parent / "default.yaml"
    cfg = load_config([base, TINY.parent / "finetune" / f"{name}.yaml"])
    s = getattr(cfg, section)
    assert (s.lr, s.epochs, s.num_frames, s.max_len, s.grad_accum) == (lr, epochs, frames, length, accum)
    assert s.batch_size * 8 * s.grad_accum == batch, "per-process batch x 8 GPUs x accumulation = the paper's batch"
    assert s.warmup_ratio == 0.1 and s.randaug and s.seed == 42
    assert cfg.model == load_config(base).model, "layering keeps the base file's other sections"
    assert cfg.retrieval.paragraph == (name == "didemo-ret")


def test_fine_tuning_and_evaluation_normalise_pixels_as_the_model_was_trained(pretrained):
    """The normalisation is the model's (an imported ALPRO expects CLIP's), not a data-side default."""
    import dataclasses

    from vlp.models import directory
    from vlp.steps.finetune import retrieval_data

    cfg = load_config(TINY)
    model_cfg = directory.describe(pretrained["alpro"]).config
    clip_mean, clip_std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    clip_cfg = dataclasses.replace(model_cfg, pixel_mean=clip_mean, pixel_std=clip_std)
    plain = retrieval_data(cfg, pretrained["dataset"], pretrained["frames"], model_cfg, "test", training=False)
    clipped = retrieval_data(cfg, pretrained["dataset"], pretrained["frames"], clip_cfg, "test", training=False)
    video = plain.pairs[0][0]
    rng = lambda: __import__("numpy").random.default_rng(0)  # noqa: E731
    a, b = plain.clip(video, rng()), clipped.clip(video, rng())
    assert not torch.allclose(a, b)
    mean, std = torch.tensor(clip_mean).view(1, 3, 1, 1), torch.tensor(clip_std).view(1, 3, 1, 1)
    torch.testing.assert_close(b * std + mean, a * 0.5 + 0.5)  # the same pixels, normalised two ways


def test_retrieval_fine_tuning_takes_its_negative_rules_and_fusion_lr(pretrained, tmp_path, monkeypatch):
    from vlp.train import loop

    built = []
    real = loop.build_optimizer

    def spy(model, optim_cfg):
        built.append(real(model, optim_cfg))
        return built[-1]

    monkeypatch.setattr(loop, "build_optimizer", spy)
    rules = ["retrieval.matching_negatives=mixed", "retrieval.same_clip_contrastive=positive",
             "retrieval.same_clip_matching=exclude", "retrieval.fusion_lr_mult=10"]  # fmt: skip
    cfg = load_config(TINY, rules)
    ft = str(tmp_path / "ret")
    summary = finetune_retrieval(pretrained["dataset"], pretrained["frames"], pretrained["alpro"], ft, cfg)
    assert summary["steps"] == 2 and summary["metrics"]["train/loss_vtm"] > 0
    doc = _json(f"{ft}/model.json")["config"]
    assert (doc["vtm_negatives"], doc["same_video_vtc"], doc["same_video_vtm"]) == ("mixed", "positive", "exclude")
    peaks = sorted({group["initial_lr"] for group in built[0].param_groups})  # the fusion and heads at 10x
    assert peaks == pytest.approx([cfg.retrieval.lr, 10 * cfg.retrieval.lr])


def test_rescoring_is_refused_for_a_model_that_re_ranks(pretrained, tmp_path):
    with pytest.raises(ValueError, match="re-ranks with its pair scorer"):
        _eval(pretrained, pretrained["alpro"], tmp_path / "zs", "retrieval.rescore=dual_softmax")
