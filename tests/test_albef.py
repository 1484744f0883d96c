"""ALBEF: momentum model and queues on hand cases, distillation against hand-computed values, every gradient,
and the pre-train -> fine-tune -> evaluate path through the same steps as ALPRO."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import split_rows
from vlp import storage
from vlp.data import manifest
from vlp.data.video_text import normalize_answer
from vlp.losses import distill
from vlp.models.albef.model import FAMILY, Albef, AlbefConfig, AlbefOutput, albef_losses, albef_step
from vlp.models.albef.queue import QueueRows
from vlp.models.albef.spec import AlbefSettings
from vlp.models.family import PretrainBatch, StepContext, TextVocab
from vlp.models.tokenizer import train_wordpiece
from vlp.settings import ModelConfig

CAPTIONS = ["a red circle moves left", "a blue square bounces", "a green star drifts", "a yellow cube spins"]
TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


@pytest.fixture(scope="module")
def tok():
    return train_wordpiece(CAPTIONS * 4, vocab_size=60)


def _batch(tok, ids=(0, 1, 2, 3)) -> PretrainBatch:
    enc = tok(CAPTIONS, padding="max_length", truncation=True, max_length=10, return_tensors="pt")
    video = torch.randn(4, 2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    return PretrainBatch(video, enc["input_ids"], enc["attention_mask"], video_index=torch.tensor(ids))


def _model(tok, **overrides) -> Albef:
    torch.manual_seed(0)
    return Albef(AlbefConfig.tiny(vocab_size=len(tok), **({"queue_size": 8} | overrides)))


def _ctx(tok, seed=0) -> StepContext:
    return StepContext(vocab=TextVocab.of(tok), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- momentum model and queues


def test_the_teacher_starts_as_a_copy_and_moves_by_ema_only(tok):
    model = _model(tok, momentum=0.9)
    online, teacher = dict(model.online.named_parameters()), dict(model.momentum.named_parameters())
    assert online.keys() == teacher.keys()
    assert all(torch.equal(online[k], teacher[k]) for k in online) and not any(
        p.requires_grad for p in teacher.values()
    )
    with torch.no_grad():
        for k, p in online.items():
            p.fill_(1.0)
            teacher[k].fill_(3.0)
    model.momentum_update()
    assert all(torch.allclose(p, torch.full_like(p, 0.9 * 3.0 + 0.1 * 1.0)) for p in teacher.values())
    # an eval forward leaves it, a training forward updates it once more (online weights are still 1.0)
    model.eval()
    model(_batch(tok), _ctx(tok))
    assert all(torch.allclose(p, torch.full_like(p, 2.8)) for p in teacher.values())
    model.train()
    with torch.no_grad():
        model(_batch(tok), _ctx(tok))
    assert all(torch.allclose(p, torch.full_like(p, 0.9 * 2.8 + 0.1 * 1.0)) for p in teacher.values())


def test_enqueue_writes_whole_batches_at_the_pointer_and_wraps(tok):
    model = _model(tok, queue_size=8)
    feats = [F.normalize(torch.randn(4, 32), dim=1) for _ in range(3)]
    for i, f in enumerate(feats):
        model.enqueue(f, -f, torch.arange(4) + 10 * i)
    assert int(model.queue_ptr) == 4  # 0 -> 4 -> 0 -> 4
    assert torch.equal(model.image_queue[:, :4], feats[2].t()) and torch.equal(model.image_queue[:, 4:], feats[1].t())
    assert torch.equal(model.text_queue[:, :4], -feats[2].t())
    assert model.idx_queue.tolist() == [20, 21, 22, 23, 10, 11, 12, 13]
    with pytest.raises(ValueError, match="queue_size 8 must be a multiple of the global batch 3"):
        model.enqueue(feats[0][:3], feats[0][:3], torch.arange(3))
    with pytest.raises(ValueError, match="multiple of the global batch 6"):
        FAMILY.prepare(AlbefConfig.tiny(vocab_size=10, queue_size=8), 5, 6)  # refused before training starts


def test_a_training_forward_scores_against_the_queue_then_enqueues(tok):
    model = _model(tok, queue_size=8, same_video="positive")
    before = model.text_queue.clone()
    out = model(_batch(tok, ids=(5, 5, 6, 7)), _ctx(tok))
    assert isinstance(out, AlbefOutput) and out.itc_i2t.shape == (4, 4 + 8) and out.itm_logits.shape == (12, 2)
    with torch.no_grad():  # the student's text columns: momentum batch features, then the queue as it was
        image_feat, _ = model.online.encode_video(_batch(tok).video)
    assert torch.allclose(out.itc_i2t[:, 4:], image_feat @ before / out.temp, atol=1e-5)
    # clips 0 and 1 are one clip: each other's positive; the queue's ids (-1 at start) never are
    assert out.itc_positives[:, :4].tolist()[0] == [True, True, False, False] and not out.itc_positives[:, 4:].any()
    assert model.idx_queue[:4].tolist() == [5, 5, 6, 7] and int(model.queue_ptr) == 4
    assert int(model.steps) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_queue_rows_are_the_cat_bit_for_bit_and_kept_between_steps(dtype):
    """QueueRows.with_batch returns torch.cat([feat, queue.t().to(feat)]) (values, dtype, strides) through writes,
    wraps, batch sizes and writes it did not make; its rows are rebuilt only where it must."""
    g = torch.Generator().manual_seed(0)
    queue, rows = torch.randn(8, 12, generator=g), QueueRows()
    built, ptr = [], 0
    for step, b in enumerate([4, 4, 2, 4, 6] * 2):
        if step == 7:
            queue[:, 3] = 5.0  # written around it (a test, a hook): rebuilt
        if step == 8:
            queue.copy_(torch.randn(8, 12, generator=g))  # as load_state_dict writes a buffer: rebuilt
        feat = torch.randn(b, 8, generator=g).to(dtype)
        before = rows.rebuilds
        got, want = rows.with_batch(queue, feat), torch.cat([feat, queue.t().to(feat)])
        assert torch.equal(got, want) and got.dtype == want.dtype and got.stride() == want.stride(), step
        if rows.rebuilds > before:
            built.append(step)
        rows.write(queue, ptr, torch.randn(4, 8, generator=g))  # the enqueued (gathered) batch: 4 columns
        ptr = (ptr + 4) % 12
    assert built == [0, 4, 7, 8]  # the first read, the first batch of 6 (room made once), the two outside writes
    other = torch.randn(8, 12, generator=g)  # another tensor (a buffer replaced, a model moved): rebuilt
    feat = torch.randn(4, 8, generator=g)
    assert torch.equal(rows.with_batch(other, feat), torch.cat([feat, other.t()])) and rows.rebuilds == 5
    assert rows.with_batch(other, feat.to(torch.float64)).dtype == torch.float64 and rows.rebuilds == 6  # dtype


def test_a_graph_kept_across_a_second_queue_read_fails_loudly():
    """The rows are reused: a backward after the next step's read refuses (autograd's check), never miscomputes."""
    queue, rows = torch.randn(8, 12), QueueRows()
    x = torch.randn(2, 8, requires_grad=True)
    loss = (x @ rows.with_batch(queue, torch.randn(2, 8)).t()).sum()
    rows.with_batch(queue, torch.randn(2, 8))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


class _CatRows(QueueRows):
    """The released code's step: the batch and the transposed queue concatenated afresh."""

    def with_batch(self, queue, feat):
        return torch.cat([feat, queue.t().to(feat)])


def test_training_steps_with_kept_rows_are_the_cat_steps_bit_for_bit(tok):
    """Three training steps (each enqueues) with the kept rows and with a fresh cat: every ITC score, every loss and
    every weight, queue and momentum weight after them bit for bit; the kept rows were built once."""
    runs = []
    for rows in (QueueRows, _CatRows):
        model = _model(tok, queue_size=8)
        model.queue_rows = {"image_queue": rows(), "text_queue": rows()}
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
        torch.manual_seed(1)
        scores = []
        for step in range(3):
            out = model(_batch(tok), _ctx(tok, seed=step))
            loss = albef_losses(out, _ctx(tok))["loss"]
            scores += [out.itc_i2t.detach(), out.itc_t2i.detach(), out.itc_i2t_m, out.itc_t2i_m, loss.detach()]
            opt.zero_grad()
            loss.backward()
            opt.step()
        runs.append((scores, model.state_dict(), model.queue_rows["text_queue"].rebuilds))
    (kept, kept_state, builds), (cat, cat_state, _) = runs
    assert all(torch.equal(a, b) for a, b in zip(kept, cat, strict=True))
    assert kept_state.keys() == cat_state.keys() and all(torch.equal(kept_state[k], cat_state[k]) for k in kept_state)
    assert builds == 1


# --------------------------------------------------------------------------- distillation


def test_alpha_ramps_linearly_over_the_first_steps():
    assert [distill.alpha_at(s, 0.4, 4) for s in range(6)] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.4])
    assert distill.alpha_at(0, 0.4, 0) == 0.4
    assert distill.alpha_at(2, 0.0, 4) == 0.0 and distill.alpha_at(2, 1.0, 4) == 0.5  # both ends of [0, 1] allowed
    for step, alpha, ramp in [(-1, 0.4, 4), (0, 0.4, -1), (0, -0.1, 4), (0, 1.01, 4), (0, 1.5, 0)]:
        message = rf"^need step >= 0, ramp_steps >= 0 and alpha in \[0, 1\], got {step}, {ramp}, {alpha}$"
        with pytest.raises(ValueError, match=message):
            distill.alpha_at(step, alpha, ramp)
    cfg = FAMILY.prepare(AlbefConfig.tiny(vocab_size=10, queue_size=8, alpha_ramp_steps=-1), 7, 4)
    assert cfg.alpha_ramp_steps == 7  # -1 = one epoch of batches
    with pytest.raises(ValueError, match="prepare"):
        Albef(AlbefConfig.tiny(vocab_size=10, queue_size=8, alpha_ramp_steps=-1)).alpha()


def test_itc_targets_mix_the_teacher_and_the_truth():
    teacher = torch.tensor([[0.0, math.log(3.0)], [math.log(3.0), 0.0]])  # softmax rows: [1/4, 3/4], [3/4, 1/4]
    targets = distill.itc_targets(teacher, torch.eye(2, dtype=torch.bool), alpha=0.4)
    assert targets.flatten().tolist() == pytest.approx([0.4 * 0.25 + 0.6, 0.4 * 0.75, 0.4 * 0.75, 0.4 * 0.25 + 0.6])
    two = distill.itc_targets(torch.zeros(1, 4), torch.tensor([[True, True, False, False]]), alpha=0.0)
    assert two.tolist() == [[0.5, 0.5, 0.0, 0.0]]  # several positives share the truth (ALBEF fine-tuning)
    with pytest.raises(ValueError, match="positive in every row"):
        distill.itc_targets(torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.bool), 0.4)


def test_soft_cross_entropy_is_over_the_last_dimension_for_any_leading_shape():
    gen = torch.Generator().manual_seed(1)
    logits, targets = torch.randn(2, 3, 4, generator=gen), torch.rand(2, 3, 4, generator=gen).softmax(-1)
    rows = [-(targets[i, j] * logits[i, j].log_softmax(0)).sum() for i in range(2) for j in range(3)]
    assert float(distill.soft_cross_entropy(logits, targets)) == pytest.approx(float(sum(rows) / 6), rel=1e-6)


def test_the_paper_and_code_forms_differ_by_the_teacher_entropy_with_the_same_gradient():
    gen = torch.Generator().manual_seed(0)
    student = torch.randn(3, 5, generator=gen, requires_grad=True)
    teacher = torch.randn(3, 5, generator=gen)
    positives = torch.eye(3, 5, dtype=torch.bool)
    grads, values = {}, {}
    for form in ("paper", "code"):
        loss = distill.itc_distill_loss(student, student, teacher, teacher, positives, 0.4, form=form)
        (grads[form],) = torch.autograd.grad(loss, student)
        values[form] = float(loss.detach())
    q = teacher.softmax(dim=1)
    entropy = float(-(q * q.log()).sum(dim=1).mean())
    assert values["code"] - values["paper"] == pytest.approx(0.4 * entropy, rel=1e-5)
    assert torch.allclose(grads["paper"], grads["code"])
    # by hand: -sum(mix * log_softmax(student)) averaged over rows, mix = 0.4 q + 0.6 one-hot
    mix = 0.4 * q + 0.6 * positives.float()
    assert values["code"] == pytest.approx(float(-(mix * student.detach().log_softmax(1)).sum(1).mean()), rel=1e-6)
    default = float(distill.itc_distill_loss(student, student, teacher, teacher, positives, 0.4).detach())
    assert default == values["paper"]  # the logged value is the paper's unless asked
    message = r"^the four logit grids must have one shape, got \(3, 5\) and others$"
    with pytest.raises(ValueError, match=message):  # the teacher's grid alone is off
        distill.itc_distill_loss(student, student, teacher[:, :4], teacher, positives, 0.4)


def test_mlm_distillation_by_hand():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])  # (1, 2, 3)
    labels = torch.tensor([[-100, 1]])  # only position 1 is masked
    teacher = torch.tensor([[[0.0, 0.0, 0.0], [0.0, 0.0, math.log(2.0)]]])  # q = [1/4, 1/4, 1/2] there
    p = torch.tensor([0.0, 1.0, 0.0]).log_softmax(0)
    q = torch.tensor([0.25, 0.25, 0.5])
    hard, soft_ce = float(-p[1]), float(-(q * p).sum())
    kl = soft_ce - float(-(q * q.log()).sum())
    assert float(distill.mlm_distill_loss(logits, labels, teacher, 0.4)) == pytest.approx(0.6 * hard + 0.4 * kl)
    assert float(distill.mlm_distill_loss(logits, labels, teacher, 0.4, form="code")) == pytest.approx(
        0.6 * hard + 0.4 * soft_ce
    )
    assert float(distill.mlm_distill_loss(logits, labels, None, 0.4)) == pytest.approx(hard)
    assert float(distill.mlm_distill_loss(logits, labels, teacher, 1.0)) == pytest.approx(kl)  # the teacher alone
    nothing = torch.full_like(labels, -100)  # no masked token: zero, still on the graph
    leaf = logits.clone().requires_grad_(True)
    zero = distill.mlm_distill_loss(leaf, nothing, teacher, 0.4)
    assert float(zero.detach()) == 0.0 and zero.requires_grad


# --------------------------------------------------------------------------- the model


@pytest.mark.parametrize("terms", [("itc", "mlm", "itm"), ("mlm", "itm"), ("itm",), ("itc", "itm"), ("itc",)])
def test_every_trainable_parameter_gets_a_gradient_for_any_terms(tok, terms):
    """What DDP without unused parameters needs: every trainable parameter learns, whichever terms are on."""
    model = _model(tok, alpha_ramp_steps=0, losses=terms)
    out = albef_step(model, _batch(tok), _ctx(tok))
    assert {k for k in out if k.startswith("loss_")} == {f"loss_{t}" for t in terms}
    out["loss"].backward()
    assert [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None] == []
    frozen = {n for n, p in model.online.named_parameters() if not p.requires_grad}
    assert ("itc" in terms) == (not {n for n in frozen if "_proj." in n}) and model.temp.requires_grad == (
        "itc" in terms
    )


def test_every_trainable_parameter_learns_and_no_momentum_parameter_does(tok):
    model = _model(tok, alpha_ramp_steps=0)  # alpha 0.4 from the first step: the distillation terms are live
    out = albef_step(model, _batch(tok), _ctx(tok))
    assert {k for k in out if k.startswith("loss_")} == {"loss_itc", "loss_itm", "loss_mlm"}
    assert float(out["alpha"]) == pytest.approx(0.4) and float(out["temp"]) == pytest.approx(0.07)
    out["loss"].backward()
    no_grad = [
        n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.isfinite().all())
    ]
    assert not no_grad, no_grad
    assert all(p.grad is None and not p.requires_grad for p in model.momentum.parameters())
    from vlp.train.optim import OptimConfig, build_optimizer

    opt = build_optimizer(model, OptimConfig(lr=1e-3))
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert not any(id(p) in in_opt for p in model.momentum.parameters())


def test_a_few_steps_reduce_the_contrastive_loss(tok):
    """ITC learns. From random init every clip (and every caption) gets nearly the same feature (cosine 0.95-0.99
    here), so a 0.995-momentum teacher's columns stay alike and ITC sits at ln(B) for many steps; a teacher that
    follows the student (momentum 0) shows the objective itself learning within 20 steps."""
    model = _model(tok, queue_size=0, losses=("itc",), distill=False, momentum=0.0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    batch, curve = _batch(tok), []
    for step in range(20):
        out = albef_step(model, batch, _ctx(tok, step))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        curve.append(float(out["loss_itc"].detach()))
    assert sum(curve[-4:]) < 0.8 * sum(curve[:4]), curve


def test_config_errors_are_clear(tok):
    with pytest.raises(ValueError, match="pem is ALPRO's"):
        AlbefConfig.tiny(vocab_size=10, losses=("itc", "pem"))
    with pytest.raises(ValueError, match="PEM is ALPRO's"):
        FAMILY.config(ModelConfig(family="albef"), 100, num_entities=5)
    section = ModelConfig(family="albef", embed_dim=32, families={"albef": AlbefSettings(queue_size=16)})
    cfg = FAMILY.config(section, len(tok))
    assert cfg.queue_size == 16
    assert cfg.losses == ("itc", "mlm", "itm") and cfg.pixel_mean == pytest.approx((0.48145466, 0.4578275, 0.40821073))
    assert FAMILY.config_from_dict(json.loads(json.dumps(__import__("dataclasses").asdict(cfg)))) == cfg
    with pytest.raises(ValueError, match="at least one answer"):
        FAMILY.build("albef_qa", cfg, 0)
    model = _model(tok)
    with pytest.raises(ValueError, match="no vocabulary"):
        model(_batch(tok), StepContext())


def test_the_losses_are_a_function_of_the_outputs(tok):
    model = _model(tok, alpha_ramp_steps=0)
    ctx = _ctx(tok)
    torch.manual_seed(1)
    out = model(_batch(tok), ctx)
    parts = {k: float(v.detach()) for k, v in albef_losses(out).items()}
    assert parts["loss"] == pytest.approx(parts["loss_itc"] + parts["loss_itm"] + parts["loss_mlm"])
    expected_itc = distill.itc_distill_loss(
        out.itc_i2t, out.itc_t2i, out.itc_i2t_m, out.itc_t2i_m, out.itc_positives, 0.4
    )
    assert parts["loss_itc"] == pytest.approx(float(expected_itc.detach()))


# --------------------------------------------------------------------------- through the steps


ALBEF = ["model.family=albef", "model.albef.queue_size=8", "model.albef.momentum=0.9"]


@pytest.fixture(scope="module")
def pretrained(tiny_world, tmp_path_factory) -> dict[str, str]:
    """A 3-step ALBEF pre-training on the tiny world (no prompter, no prompt bank)."""
    from vlp.config import load_config
    from vlp.steps.pretrain import pretrain

    out = str(tmp_path_factory.mktemp("albef") / "albef")
    summary = pretrain(tiny_world["dataset"], tiny_world["frames"], out, load_config(TINY, ALBEF))
    return dict(tiny_world, albef=out, summary=summary)


def test_pretrain_step_writes_an_albef_model_directory(pretrained):
    from safetensors.torch import load_file

    from vlp.models import directory

    info = directory.describe(pretrained["albef"])
    assert (info.kind, info.family.name) == ("albef", "albef") and info.config.queue_size == 8
    assert set(pretrained["summary"]["metrics"]) >= {
        "train/loss_itc",
        "train/loss_itm",
        "train/loss_mlm",
        "train/alpha",
    }
    # alpha ramps over one epoch of the tiny world's batches (batch 4), and the checkpoint holds the queues
    assert info.config.alpha_ramp_steps >= 1 and 0 < pretrained["summary"]["metrics"]["train/alpha"] <= 0.4
    weights = load_file(f"{info.checkpoint}/model.safetensors")
    assert {"image_queue", "text_queue", "idx_queue", "queue_ptr", "steps"} <= set(weights)
    assert int(weights["steps"]) == 3 and int(weights["queue_ptr"]) == (3 * 4) % 8
    model = info.load()
    assert torch.equal(model.text_queue, weights["text_queue"])


def test_resume_continues_exactly_including_the_queues(tiny_world, tmp_path):
    """A run that lost everything after its step-2 checkpoint resumes there and ends byte-identical."""
    import shutil

    from vlp.config import load_config
    from vlp.steps.pretrain import pretrain

    cfg = load_config(TINY, [*ALBEF, "pretrain.max_steps=4", "pretrain.ckpt_every=2"])
    last = Path("checkpoints") / "step-000004"
    for out in ("straight", "resumed"):
        pretrain(tiny_world["dataset"], tiny_world["frames"], str(tmp_path / out), cfg)
    shutil.rmtree(tmp_path / "resumed" / last)  # as if killed after the step-2 checkpoint
    (tmp_path / "resumed" / "model.json").unlink()
    again = pretrain(tiny_world["dataset"], tiny_world["frames"], str(tmp_path / "resumed"), cfg)
    assert again["resumed_from_step"] == 2 and again["steps"] == 4
    for name in ("model.safetensors", "optimizer.safetensors"):
        assert (tmp_path / "resumed" / last / name).read_bytes() == (tmp_path / "straight" / last / name).read_bytes()


@pytest.mark.slow
def test_kill_9_then_rerun_ends_where_the_uninterrupted_run_ends(tiny_world, tmp_path):
    """SIGKILL `vlp pretrain --model albef` after its second checkpoint; the rerun's weights (queues included),
    optimiser and metrics match the uninterrupted run's."""
    import sys

    from resume_check import kill_then_rerun

    def cmd(out: Path) -> list[str]:
        return [sys.executable, "-m", "vlp.cli", "pretrain", "--model", "albef", "--dataset", tiny_world["dataset"],
                "--frames", tiny_world["frames"], "--out", str(out), "--config", str(TINY), *ALBEF,
                "pretrain.max_steps=8", "pretrain.ckpt_every=1"]  # fmt: skip

    kill_then_rerun(cmd, tmp_path, kill_after=2, last=8)


def test_zero_shot_fine_tune_and_evaluate_through_the_shared_steps(pretrained, tmp_path):
    from vlp.config import load_config
    from vlp.models import directory
    from vlp.steps.evaluate import evaluate_retrieval
    from vlp.steps.finetune import finetune_retrieval

    cfg = load_config(TINY, [*ALBEF, "retrieval.same_clip_contrastive=positive"])
    ds, fr = pretrained["dataset"], pretrained["frames"]
    zero = evaluate_retrieval(ds, fr, pretrained["albef"], str(tmp_path / "zs"), cfg)
    assert zero["model_kind"] == "albef" and zero["metrics"]["pairs_scored"] > 0  # ITM re-ranks the ITC top-k
    ft = str(tmp_path / "ret")
    summary = finetune_retrieval(ds, fr, pretrained["albef"], ft, cfg)
    info = directory.describe(ft)
    assert info.kind == "albef_retrieval" and info.config.losses == ("itc", "itm")
    assert info.config.same_video == "positive" and summary["metrics"]["train/alpha"] < 0.4  # ramp restarted
    m = evaluate_retrieval(ds, fr, ft, str(tmp_path / "eval"), cfg)["metrics"]
    assert "vtc_t2v_r1" in m and "vtm_loss" in m
    # the figures are what the ranks score against the dataset's test split (3 training steps learn nothing:
    # tests/test_pipeline_local.py checks that ALBEF's DAG beats chance)
    captions = split_rows(ds, manifest.CAPTIONS)
    clips = {c["video_id"] for c in captions}
    ranks = storage.read_parquet(str(tmp_path / "eval" / "ranks.parquet")).to_pylist()
    assert sorted(r["video_id"] for r in ranks) == sorted(c["video_id"] for c in captions)  # each caption once
    assert (m["num_videos"], m["num_texts"]) == (len(clips), len(captions))
    assert m["chance_t2v_r1"] == pytest.approx(100 / len(clips)) and m["chance_t2v_r5"] == pytest.approx(
        100 * min(5, len(clips)) / len(clips)
    )
    for r in ranks:
        assert 1 <= r["t2v_rank"] <= len(clips) and (r["video_id"] in r["top5"]) == (r["t2v_rank"] <= 5), r
    for k in (1, 5):
        assert m[f"t2v_r{k}"] == pytest.approx(100 * sum(r["t2v_rank"] <= k for r in ranks) / len(ranks))


def _ddp_worker(rank: int, port: int, out_dir: str) -> None:
    """Two ALBEF steps on this rank's half of a batch of 8, global ITM negatives; saves the queues and weights."""
    import faulthandler
    import os

    from safetensors.torch import save_file

    from vlp import distributed

    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(240, exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")  # fmt: skip
    distributed.init_from_env("gloo", timeout_s=120)
    tok = train_wordpiece(CAPTIONS * 4, vocab_size=60)
    torch.manual_seed(0)
    model = Albef(AlbefConfig.tiny(vocab_size=len(tok), queue_size=16, itm_negatives_from="global"))
    ddp = distributed.wrap_ddp(model, broadcast_buffers=False)  # as the loop: equal queues by construction
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    enc = tok(CAPTIONS * 2, padding="max_length", truncation=True, max_length=10, return_tensors="pt")
    video = torch.randn(8, 2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    mine = slice(4 * rank, 4 * rank + 4)
    batch = PretrainBatch(video[mine], enc["input_ids"][mine], enc["attention_mask"][mine])
    ctx = StepContext(
        vocab=TextVocab.of(tok), gather=distributed.all_gather_with_grad, gather_nograd=distributed.all_gather_no_grad,
        rank=rank, world=2, generator=torch.Generator().manual_seed(rank),
    )  # fmt: skip
    torch.manual_seed(100 + rank)  # dropout differs per rank, as in training
    for _ in range(2):
        out = albef_step(ddp, batch, ctx)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    state = {
        k: v.detach().contiguous()
        for k, v in model.state_dict().items()
        if not k.startswith("online.text.embeddings.position_ids")
    }
    save_file(state, str(Path(out_dir) / f"rank{rank}.safetensors"))
    distributed.cleanup()


@pytest.mark.slow
def test_two_processes_keep_identical_queues_and_momentum_models(tmp_path):
    import socket

    import torch.multiprocessing as mp
    from safetensors.torch import load_file

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.set_forkserver_preload(["torch", "torch._dynamo", "torch.nn.parallel"])
    mp.start_processes(_ddp_worker, args=(port, str(tmp_path)), nprocs=2, join=True, start_method="forkserver")
    a, b = (load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(2))
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different  # queues, pointer, step counter, online and momentum weights
    assert int(a["queue_ptr"]) == 0 and int(a["steps"]) == 2  # 2 steps x a global batch of 8 fill the 16 slots
    # both ranks' features reached the queue: no column is left from the initial noise, all are distinct
    tok = train_wordpiece(CAPTIONS * 4, vocab_size=60)
    torch.manual_seed(0)
    noise = Albef(AlbefConfig.tiny(vocab_size=len(tok), queue_size=16)).image_queue
    queue = a["image_queue"]
    assert not (queue[:, :, None] == noise[:, None, :]).all(dim=0).any()
    assert len({tuple(col.tolist()) for col in queue.t()}) == 16
    assert torch.allclose(queue.norm(dim=0), torch.ones(16), atol=1e-5)


# --------------------------------------------------------------------------- QA: the answer decoder


def test_the_answer_decoder_is_causal_and_starts_as_the_fusion(tok):
    from vlp.models.layers.cross import AnswerDecoder

    model = _model(tok)
    cfg = model.cfg.text
    dec = AnswerDecoder(cfg, states_width=cfg.width).eval()
    dec.init_from(model.online.text, model.online.fusion, dict(model.online.mlm_head.state_dict()))
    fusion = model.online.fusion.layers[0].state_dict()
    assert all(torch.equal(v, fusion[k]) for k, v in dec.layers[0].state_dict().items())
    assert torch.equal(dec.embeddings.word_embeddings.weight, model.online.text.word_embeddings.weight)
    assert torch.equal(dec.lm_head.bias, model.online.mlm_head.bias)
    states, smask = torch.randn(2, 5, cfg.width), torch.ones(2, 5, dtype=torch.long)
    ids = torch.tensor([[2, 10, 11, 3], [2, 12, 3, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        a = dec(ids, mask, states, smask)
        later = ids.clone()
        later[:, 2] = 20  # a later token changes nothing before it
        b = dec(later, mask, states, smask)
    assert a.shape == (2, 4, cfg.vocab_size)
    assert torch.allclose(a[:, :2], b[:, :2], atol=1e-6) and not torch.allclose(a[:, 2], b[:, 2])


def test_answer_losses_by_hand():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = math.log(3.0)  # after [CLS]: p(token 2) = 3/6
    ids, mask = torch.tensor([[1, 2, 0]]), torch.tensor([[1, 1, 0]])  # [CLS] 2 [PAD]: one real target
    assert float(distill.answer_log_likelihood(logits, ids, mask)) == pytest.approx(math.log(0.5))
    assert float(distill.answer_lm_loss(logits, ids, mask)) == pytest.approx(-math.log(0.5))
    teacher = torch.zeros(1, 3, 4)  # uniform q: KL(q || p) at the one real position
    p = torch.tensor([1.0, 1.0, 3.0, 1.0]) / 6
    kl = float((0.25 * (torch.log(torch.tensor(0.25)) - p.log())).sum())
    got = float(distill.answer_lm_loss(logits, ids, mask, teacher, 0.4))
    assert got == pytest.approx(0.6 * -math.log(0.5) + 0.4 * kl)


def _answer_loss_by_loops(logits, ids, mask, teacher, alpha, form):
    """answer_lm_loss written out: per answer, per real target token t >= 1, (1 - a) CE + a (KL or CE)."""
    per_answer = []
    for n in range(ids.shape[0]):
        total = 0.0
        for t in range(1, ids.shape[1]):
            if not mask[n, t]:
                continue
            logp = torch.log_softmax(logits[n, t - 1].double(), dim=-1)
            hard = -float(logp[ids[n, t]])
            soft = 0.0
            if teacher is not None:
                q = torch.softmax(teacher[n, t - 1].double(), dim=-1)
                soft = -float((q * logp).sum()) + (float((q * q.log()).sum()) if form == "paper" else 0.0)
            total += (1 - alpha) * hard + alpha * soft
        per_answer.append(total)
    return sum(per_answer) / len(per_answer)


@pytest.mark.parametrize("form", ["paper", "code"])
def test_answer_lm_loss_matches_a_loop_over_answers_and_tokens(form):
    """Three answers of different lengths (the mean is over answers, each the sum over its own real tokens),
    teacher weights 0, 0.4 and 1; without a teacher, or without an alpha, it is the plain loss."""
    g = torch.Generator().manual_seed(0)
    logits, teacher = torch.randn(3, 5, 7, generator=g), torch.randn(3, 5, 7, generator=g)
    ids = torch.randint(1, 7, (3, 5), generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    plain = _answer_loss_by_loops(logits, ids, mask, None, 0.0, form)
    assert float(distill.answer_lm_loss(logits, ids, mask, form=form)) == pytest.approx(plain, rel=1e-5)
    assert float(distill.answer_lm_loss(logits, ids, mask, teacher, form=form)) == pytest.approx(plain, rel=1e-5)
    assert float(distill.answer_lm_loss(logits, ids, mask, None, 0.4, form=form)) == pytest.approx(plain, rel=1e-5)
    for alpha in (0.4, 1.0):
        want = _answer_loss_by_loops(logits, ids, mask, teacher, alpha, form)
        got = float(distill.answer_lm_loss(logits, ids, mask, teacher, alpha, form=form))
        assert got == pytest.approx(want, rel=1e-5), alpha
    lengths = [
        float(distill.answer_log_likelihood(logits[i : i + 1], ids[i : i + 1], mask[i : i + 1])) for i in range(3)
    ]
    assert distill.answer_log_likelihood(logits, ids, mask).tolist() == pytest.approx(lengths, rel=1e-6)


def test_answer_losses_refuse_shapes_that_disagree():
    logits, ids = torch.zeros(2, 4, 5), torch.ones(2, 4, dtype=torch.long)
    message = r"^logits \(2, 4, 5\), ids \(2, 4\), mask \(2, 3\) disagree$"
    with pytest.raises(ValueError, match=message):  # the mask alone is off
        distill.answer_lm_loss(logits, ids, torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"^logits \(2, 4, 5\), ids \(2, 3\), mask \(2, 3\) disagree$"):
        distill.answer_log_likelihood(logits, ids[:, :3], torch.ones(2, 3))


def test_ranking_keeps_the_first_token_top_k_and_scores_them_as_albef(tok):
    from vlp.models.albef.model import AlbefQA

    torch.manual_seed(0)
    cfg = AlbefConfig.tiny(vocab_size=len(tok), answer_topk=2, answer_len=4, alpha_ramp_steps=0)
    qa = AlbefQA(cfg, 3).eval()
    qa.set_answers(["red", "blue", "green"], tok)
    batch = _batch(tok)
    with torch.no_grad():
        scores = qa(batch.video, batch.input_ids, batch.attention_mask)
        states = qa._question(qa.online, batch.video, batch.input_ids, batch.attention_mask)
        full = [
            distill.answer_log_likelihood(
                qa.decoder(qa.answer_ids[[i] * 4], qa.answer_mask[[i] * 4], states, batch.attention_mask),
                qa.answer_ids[[i] * 4], qa.answer_mask[[i] * 4],
            )
            for i in range(3)
        ]  # fmt: skip
        start = qa.answer_ids[:1, :1].expand(4, 1)
        first = qa.decoder(start, torch.ones_like(start), states, batch.attention_mask)[:, 0].log_softmax(-1)
        first = first[:, qa.answer_ids[:, 1]]  # (4, 3): each answer's first-token log-probability
    assert scores.shape == (4, 3) and (scores == float("-inf")).sum(dim=1).tolist() == [1, 1, 1, 1]
    assert torch.equal(scores.isinf(), first == first.min(dim=1, keepdim=True).values)  # the least likely start
    ranked = scores.isfinite()
    expected = torch.stack(full, dim=1) + first  # ALBEF's score: first token + the whole answer
    assert torch.allclose(scores[ranked], expected[ranked], atol=1e-5)


def test_qa_fine_tuning_and_evaluation_through_the_shared_steps(pretrained, tmp_path):
    from vlp.config import load_config
    from vlp.models import directory
    from vlp.steps.evaluate import evaluate_qa
    from vlp.steps.finetune import finetune_qa

    cfg = load_config(TINY, [*ALBEF, "qa.max_steps=3"])
    ds, fr = pretrained["dataset"], pretrained["frames"]
    ft = str(tmp_path / "qa")
    summary = finetune_qa(ds, fr, pretrained["albef"], ft, cfg)
    assert summary["steps"] == 3 and {"train/loss_qa", "train/alpha"} <= set(summary["metrics"])
    info = directory.describe(ft)
    assert info.kind == "albef_qa" and info.config.alpha_ramp_steps >= 1
    model = info.load()
    answers = info.answers()
    tok = info.tokenizer()
    again = tok(answers, padding="max_length", truncation=True, max_length=info.config.answer_len)["input_ids"]
    assert model.answer_ids.tolist() == again  # the answer list travels in the weights
    result = evaluate_qa(ds, fr, ft, str(tmp_path / "eval"), cfg)
    m = result["metrics"]
    preds = storage.read_parquet(str(tmp_path / "eval" / "predictions.parquet")).to_pylist()
    assert {p["prediction"] for p in preds} <= set(answers)
    # accuracy and the majority baseline are what the predictions score against the dataset's test answers
    gold = {q["qa_id"]: normalize_answer(q["answer"]) for q in split_rows(ds, manifest.QA)}
    assert sorted(p["qa_id"] for p in preds) == sorted(gold)
    assert m["accuracy"] == pytest.approx(sum(p["prediction"] == gold[p["qa_id"]] for p in preds) / len(gold))
    guess = Counter(normalize_answer(q["answer"]) for q in split_rows(ds, manifest.QA, "train")).most_common(1)[0][0]
    assert result["baseline"]["majority_answer"] == guess
    expected = sum(g == guess for g in gold.values()) / len(gold) if guess in answers else 0.0
    assert m["majority_accuracy"] == pytest.approx(expected)
    assert m["chance_accuracy"] == pytest.approx(sum(g in answers for g in gold.values()) / len(gold) / len(answers))


def test_every_qa_parameter_learns_and_the_teacher_does_not(tok):
    from vlp.models.albef.model import AlbefQA, albef_qa_losses

    torch.manual_seed(0)
    qa = AlbefQA(AlbefConfig.tiny(vocab_size=len(tok), answer_len=4, alpha_ramp_steps=0), 3)
    qa.set_answers(["red", "blue", "green"], tok)
    qa.sync_momentum()
    batch = _batch(tok)
    out = albef_qa_losses(qa(batch.video, batch.input_ids, batch.attention_mask, torch.tensor([0, 1, 2, 0])))
    assert float(out["alpha"]) == pytest.approx(0.4)
    out["loss"].backward()
    assert [n for n, p in qa.named_parameters() if p.requires_grad and p.grad is None] == []
    assert all(p.grad is None for p in (*qa.momentum.parameters(), *qa.momentum_decoder.parameters()))


def test_frame_vit_pools_over_time_and_takes_any_frame_count():
    from vlp.models.layers.vit import FrameViT, FrameViTConfig

    torch.manual_seed(0)
    vit = FrameViT(FrameViTConfig.tiny(num_frames=2)).eval()
    clip = torch.randn(1, 4, 3, 32, 32)
    with torch.no_grad():
        out = vit(clip)  # 4 frames against a time embedding sized for 2: interpolated
        one = vit(clip[:, :1])
        vit.time_embed.copy_(torch.arange(2.0).view(1, 2, 1, 1).expand_as(vit.time_embed))
        shifted = vit(clip[:, :2])
    assert out.tokens.shape == (1, 4 * 17, 64) and torch.allclose(out.cls, out.frame_tokens[:, :, 0].mean(1))
    assert torch.allclose(one.tokens, one.frame_tokens[:, 0])  # an image: ALBEF's tokens (the embedding starts at 0)
    assert torch.allclose(shifted.tokens[:, 17:], shifted.frame_tokens[:, 1] + 1.0)  # frame 2 gets time_embed[1]
    mean = FrameViT(FrameViTConfig.tiny(temporal="mean"))
    assert mean.time_embed is None and mean(clip).tokens.shape == (1, 17, 64)


def test_frame_vit_loads_a_timm_name_at_a_hub_revision_and_records_the_commit(monkeypatch, tmp_path):
    """ALBEF's frame ViT pins hub weights as the TimeSformer does: an offline cache with two commits of
    ``timm/vit_tiny_patch16_224.augreg_in21k`` (tag ``v2`` holds other weights) stands in for the hub."""
    from safetensors.torch import save_file

    from hub_cache import add_snapshot, commit_sha, offline_hub
    from vlp.models.layers.vit import FrameViT, FrameViTConfig
    from vlp.models.tokenizer import upstream_of

    cache = offline_hub(monkeypatch, tmp_path)
    name, repo = "vit_tiny_patch16_224.augreg_in21k", "timm/vit_tiny_patch16_224.augreg_in21k"
    weights = {}
    for seed, label in ((0, "main"), (1, "v2")):
        torch.manual_seed(seed)
        state = {
            k: v.contiguous() for k, v in FrameViT(FrameViTConfig.tiny()).state_dict().items() if k != "time_embed"
        }
        (tmp_path / label).mkdir()
        save_file(state, str(tmp_path / label / "model.safetensors"))
        add_snapshot(cache, repo, tmp_path / label, commit=commit_sha(label), refs=(label,))
        weights[label] = state["patch_embed.proj.weight"]

    for revision, label in (("", "main"), ("v2", "v2"), (commit_sha("v2"), "v2")):
        vit = FrameViT(FrameViTConfig.tiny(init=name, init_revision=revision))
        assert torch.equal(vit.patch_embed.proj.weight, weights[label]), revision
        assert upstream_of(name, revision)["commit"] == commit_sha(label)
    with pytest.raises(RuntimeError, match="revision 'v3' is not in the local cache"):
        FrameViT(FrameViTConfig.tiny(init=name, init_revision="v3"))


def test_mlm_on_the_masked_positions_alone_gives_the_full_losses_and_gradients(tok):
    """``mlm_logits="masked"``: the student's and the momentum teacher's logits at the masked positions alone;
    MLM's distilled loss and every gradient equal the full computation's to float rounding, ITC and ITM bit for
    bit."""
    got = {}
    for mode in ("all", "masked"):
        model = _model(tok, mlm_logits=mode)
        out = albef_step(model, _batch(tok), _ctx(tok))
        out["loss"].backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        forward = model(_batch(tok), _ctx(tok))
        got[mode] = (out, grads, forward)
    (full, g_full, f_full), (masked, g_masked, f_masked) = got["all"], got["masked"]
    scored = f_full.mlm_labels != -100
    assert f_masked.mlm_logits.shape == f_masked.mlm_teacher.shape == (int(scored.sum()), len(tok))
    assert f_full.mlm_logits.shape == (*scored.shape, len(tok)) and 0 < int(scored.sum()) < scored.numel()
    for term in ("itc", "itm"):
        assert torch.equal(full[f"loss_{term}"], masked[f"loss_{term}"]), term
    torch.testing.assert_close(masked["loss_mlm"], full["loss_mlm"], rtol=1e-6, atol=0)
    assert g_full.keys() == g_masked.keys() and len(g_full) > 50
    for name, grad in g_full.items():
        torch.testing.assert_close(g_masked[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_mlm_logits_is_a_family_key_and_refuses_other_values(tok):
    from vlp.config import load_config
    from vlp.models import family

    cfg = load_config(TINY, ["model.albef.mlm_logits=masked", "model.alpro.mlm_logits=masked"])
    assert FAMILY.config(cfg.model, len(tok)).mlm_logits == "masked"
    assert family.get("alpro").config(cfg.model, len(tok), 4).mlm_logits == "masked"
    assert FAMILY.config(load_config(TINY).model, len(tok)).mlm_logits == "all"
    with pytest.raises(ValueError, match="mlm_logits"):
        load_config(TINY, ["model.albef.mlm_logits=sometimes"])
    with pytest.raises(ValueError, match="mlm_logits must be 'all' or 'masked'"):
        AlbefConfig.tiny(vocab_size=len(tok), mlm_logits="some")
