"""The contract every registered model family keeps (issue 25), and a guard that shared code names no family.

The contract cases are parametrised over :func:`vlp.models.family.names`, so a family joins them by being
registered; the checks are plain functions (``check_*``) that another test module can run on a family it
registers itself (tests/test_toy_family.py does). Each runs on the family's tiny preset, built from a ``model``
config section as the steps build it: gradients of one training step, a model directory's save -> load round
trip, the evaluation methods' shapes, and a killed-then-resumed training run that ends bit-identical to a
straight one.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch

from vlp.data.entities import ENTITIES_PARQUET, entities_table
from vlp.data.loader import ResumableSampler, SamplerBatches
from vlp.models import directory, family
from vlp.models.family import Encoded, PretrainBatch, PretrainExtras, StepContext, TextVocab
from vlp.models.tokenizer import train_wordpiece
from vlp.settings import ModelConfig, RetrievalConfig
from vlp.train.loop import TrainConfig, enable_grad_checkpointing, train
from vlp.train.optim import OptimConfig
from vlp.weights import save_model_weights

ROOT = Path(__file__).resolve().parents[1]
CAPTIONS = [
    "a red circle moves left", "a blue square bounces", "a green star drifts", "a yellow cube spins",
    "two red squares collide", "a blue circle grows", "a green cube falls", "a yellow star shrinks",
]  # fmt: skip
FRAMES, SIZE, MAX_LEN, BATCH = 2, 32, 12, 4
# eval_precision=bf16: features, similarities and match probabilities, per unit of their scale (measured on the
# tiny presets: at most 4.4e-3)
EVAL_BF16_ATOL = 0.02


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread for the module


@pytest.fixture(scope="module")
def tok() -> Any:
    return train_wordpiece(CAPTIONS * 4, vocab_size=60)


def model_section(name: str, losses: list[str] | None = None) -> ModelConfig:
    """The ``model`` config section of ``name``'s tiny preset at this module's sizes (random init); ``losses``: the
    objectives (default: the family's)."""
    return ModelConfig(family=name, preset="tiny", img_size=SIZE, num_frames=FRAMES, max_len=MAX_LEN, embed_dim=16,
                       losses=losses or [])  # fmt: skip


def model_config(name: str, role: str, vocab_size: int, losses: list[str] | None = None) -> Any:
    """The family's config of a ``role`` model, built as the steps build it: ``config`` from the section (with 4
    entities where the family pre-trains from a prompt bank, whose size that is), then for retrieval
    ``task_config`` with the ``retrieval`` section, then ``prepare`` for 2 batches of 4 per epoch."""
    fam = family.get(name)
    cfg = fam.config(model_section(name, losses), vocab_size, 4 if "bank" in family.spec(name).pretrain_inputs else 0)
    if role == "retrieval":
        cfg = fam.task_config(cfg, "retrieval", RetrievalConfig(num_frames=FRAMES, max_len=MAX_LEN))
    return fam.prepare(cfg, 2, BATCH)


def kind_of(name: str, role: str) -> str:
    return getattr(family.get(name).kinds, role)


def cases() -> list[Any]:
    """(family, role) for every registered family: its retrieval model, and its pre-trained one if it pre-trains
    (with what its pre-training hook opens from the inputs made before it, :func:`pretrain_extras`)."""
    found = []
    for name, spec in family.specs().items():
        if spec.pretrains:
            found.append(pytest.param(name, "pretrained"))
        found.append(pytest.param(name, "retrieval"))
    return found


_EXTRAS: dict[str, PretrainExtras] = {}


def pretrain_extras(name: str, tok: Any) -> PretrainExtras:
    """What ``name``'s pre-training hook opens from the inputs its DAG makes first (none without a hook), as
    ``vlp pretrain`` gets it: a randomly initialised prompter saved as a model directory, and a prompt bank its
    hook builds from it over four entities. Made once per family in a temporary directory."""
    spec = family.spec(name)
    hook = spec.load_pretraining()
    if hook is None:
        return PretrainExtras()
    if name not in _EXTRAS:
        fam, root = family.get(name), Path(tempfile.mkdtemp(prefix=f"vlp-contract-{name}-"))
        inputs = {}
        if "prompter" in spec.pretrain_inputs:
            cfg = fam.config(dataclasses.replace(model_section(name), losses=["vtc"]), len(tok), 0)
            torch.manual_seed(0)
            prompter = fam.build(fam.kinds.prompter, cfg)
            inputs["prompter"] = str(root / "prompter")
            directory.save(inputs["prompter"], kind=fam.kinds.prompter, config=cfg, tokenizer=tok, steps=0,
                           checkpoint=save_model_weights(str(root / "prompter" / "weights"), prompter))  # fmt: skip
        if "bank" in spec.pretrain_inputs:
            (root / "entities").mkdir()
            table = entities_table([("circle", 9), ("square", 7), ("star", 5), ("cube", 3)])
            pq.write_table(table, root / "entities" / ENTITIES_PARQUET)
            inputs["bank"] = str(root / "bank")
            hook.build_bank(inputs["prompter"], str(root / "entities"), inputs["bank"],
                            SimpleNamespace(model=model_section(name)))  # fmt: skip
        extras = hook.load(inputs, fam.default_losses, "cpu")
        assert spec.pretrain_inputs and (extras.context is not None or extras.tokenizer is not None)
        _EXTRAS[name] = extras
    return _EXTRAS[name]


def batch_of(tok: Any, indices: list[int] | range, seed: int = 3) -> PretrainBatch:
    """Captions ``indices`` and random clips for them (clip ``i``'s frames depend on ``i`` and ``seed`` only)."""
    enc = tok([CAPTIONS[i] for i in indices], padding="max_length", truncation=True, max_length=MAX_LEN,
              return_tensors="pt")  # fmt: skip
    clips = [torch.randn(FRAMES, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed * 100 + i))
             for i in indices]  # fmt: skip
    return PretrainBatch(torch.stack(clips), enc["input_ids"], enc["attention_mask"],
                         video_index=torch.tensor(list(indices)))  # fmt: skip


def build(
    name: str, role: str, tok: Any, seed: int = 0, losses: list[str] | None = None
) -> tuple[Any, torch.nn.Module]:
    cfg = model_config(name, role, len(tok), losses)
    torch.manual_seed(seed)
    return cfg, family.get(name).build(kind_of(name, role), cfg)


def step_context(tok: Any, name: str = "", role: str = "retrieval") -> StepContext:
    """The context a training step gives a family on one process (draws from the global generator, which the
    training loop seeds and checkpoints); pre-training adds what the family's hook opened (:func:`pretrain_extras`)."""
    extra = pretrain_extras(name, tok).context if role == "pretrained" else None
    return StepContext(vocab=TextVocab.of(tok), extra=extra)


# --------------------------------------------------------------------------- the checks


def check_gradients(name: str, role: str, tok: Any, losses: list[str] | None = None) -> dict[str, float]:
    """One ``train_step`` + backward: a finite loss; every parameter that requires grad gets a finite gradient,
    none that does not (a momentum copy, a frozen part) gets one: what DDP needs. ``losses``: the objectives
    (default: the family's). Returns the step's losses."""
    fam = family.get(name)
    _, model = build(name, role, tok, losses=losses)
    model.train()
    torch.manual_seed(1)
    losses = fam.train_step(model, batch_of(tok, range(BATCH)), step_context(tok, name, role))
    values = {k: float(v.detach()) for k, v in losses.items()}
    assert "loss" in values and all(torch.isfinite(torch.tensor(list(values.values())))), values
    losses["loss"].backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    frozen = [(n, p) for n, p in model.named_parameters() if not p.requires_grad]
    assert trainable, f"{name} {role}: nothing to train"
    no_grad = [n for n, p in trainable if p.grad is None]
    assert not no_grad, f"{name} {role}: trainable parameters the step gives no gradient: {no_grad}"
    bad = [n for n, p in trainable if not torch.isfinite(p.grad).all()]
    assert not bad, f"{name} {role}: non-finite gradients: {bad}"
    assert sum(float(p.grad.abs().sum()) for _, p in trainable) > 0, f"{name} {role}: all gradients are zero"
    leaked = [n for n, p in frozen if p.grad is not None]
    assert not leaked, f"{name} {role}: parameters that require no grad got one: {leaked}"
    return values


def check_round_trip(name: str, role: str, tok: Any, out: Path) -> None:
    """Save a model directory after one update and load it: the same config (also through ``config_from_dict``
    of its dict), the same weights and buffers, the same encodings and similarities."""
    fam = family.get(name)
    cfg, model = build(name, role, tok)
    kind = kind_of(name, role)
    torch.manual_seed(1)
    fam.train_step(model.train(), batch_of(tok, range(BATCH)), step_context(tok, name, role))["loss"].backward()
    with torch.no_grad():
        for p in model.parameters():  # weights no fresh build has
            if p.grad is not None:
                p.sub_(0.1 * p.grad)
    assert fam.config_from_dict(dataclasses.asdict(cfg)) == cfg
    directory.save(str(out), kind=kind, config=cfg, checkpoint=save_model_weights(str(out / "weights"), model),
                   tokenizer=tok, steps=1)  # fmt: skip
    loaded, loaded_tok, info = directory.load(str(out))
    assert info.family is fam and info.kind == kind and info.doc["family"] == name and info.config == cfg
    assert type(loaded) is type(model) and not loaded.training and loaded_tok.get_vocab() == tok.get_vocab()
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    batch = batch_of(tok, range(BATCH, 2 * BATCH))
    with torch.no_grad():
        before, after = encode(fam, model.eval(), batch), encode(fam, loaded, batch)
    for a, b, what in zip(before, after, ("video", "text", "similarity"), strict=True):
        assert torch.equal(a, b), f"{name} {role}: the loaded model's {what} differs"


def encode(fam: Any, model: torch.nn.Module, batch: PretrainBatch) -> tuple[torch.Tensor, ...]:
    videos = fam.encode_video(model, batch.video)
    texts = fam.encode_text(model, batch.input_ids, batch.attention_mask)
    return videos.feat, texts.feat, fam.similarity(model, texts, videos)


def check_shapes(name: str, role: str, tok: Any) -> None:
    """``encode_video`` / ``encode_text`` give :class:`Encoded` ``(B, D)`` features of one width with token
    sequences (a text mask); ``similarity`` is ``(texts, videos)``; ``pair_logits`` is ``(P, 2)`` where the family
    re-ranks (:func:`family.pair_scorer_of`); ``kinds.qa`` names a QA kind, and the spec's ``tasks`` list QA, exactly
    when the family has the QA methods (:func:`family.answers_questions` raises on the first mismatch)."""
    fam = family.get(name)
    _, model = build(name, role, tok)
    model.eval()
    clips, captions = batch_of(tok, range(4)), batch_of(tok, range(3))  # 3 texts x 4 clips: no transposed result
    with torch.no_grad():
        videos = fam.encode_video(model, clips.video)
        texts = fam.encode_text(model, captions.input_ids, captions.attention_mask)
        sim = fam.similarity(model, texts, videos)
        assert isinstance(videos, Encoded) and isinstance(texts, Encoded)
        width = videos.feat.shape[1]
        assert videos.feat.shape == (4, width) and texts.feat.shape == (3, width)
        assert videos.tokens.ndim == 3 and videos.tokens.shape[0] == 4
        assert texts.tokens.shape[:2] == (3, MAX_LEN) and texts.mask.shape == (3, MAX_LEN)
        assert sim.shape == (3, 4) and torch.isfinite(sim).all()
        scorer = family.pair_scorer_of(fam, model)
        if scorer is not None:
            logits = scorer.pair_logits(model, texts.tokens[[0, 1, 2]], texts.mask[[0, 1, 2]], videos.tokens[[3, 0, 1]])
            assert logits.shape == (3, 2) and torch.isfinite(logits).all()
    assert family.answers_questions(fam) == bool(fam.kinds.qa) == ("qa" in family.spec(name).tasks)
    assert family.spec(name).kinds in (None, fam.kinds)  # what of_kind and kinds read before importing a family


class Killed(RuntimeError):
    pass


def killing(step_fn: Callable[..., Any], at_call: int) -> Callable[..., Any]:
    calls = {"n": 0}

    def wrapped(model: torch.nn.Module, batch: Any) -> Any:
        if calls["n"] == at_call:
            raise Killed(f"killed at micro-step {at_call}")
        calls["n"] += 1
        return step_fn(model, batch)

    return wrapped


def check_resume(name: str, role: str, tok: Any, root: Path, steps: int = 4) -> None:
    """``steps`` updates straight, against a run killed after ``steps // 2 + 1`` updates (a checkpoint every
    ``steps // 2``) and resumed in a fresh model, data and context: every weight and buffer bit-identical."""
    fam = family.get(name)

    def run(out: Path, seed: int, kill_at: int | None = None) -> tuple[torch.nn.Module, Any]:
        _, model = build(name, role, tok, seed=seed)
        ctx = step_context(tok, name, role)

        def step_fn(m: torch.nn.Module, b: PretrainBatch) -> dict[str, torch.Tensor]:
            return fam.train_step(m, b, ctx)

        sampler = ResumableSampler(len(CAPTIONS), seed=7, rank=0, world_size=1)
        data = SamplerBatches(sampler, lambda idx: batch_of(tok, list(idx), seed=idx.epoch + 3), BATCH)
        cfg = TrainConfig(out_dir=str(out), max_steps=steps, ckpt_every=steps // 2, log_every=1, seed=5,
                          progress=False, name="contract")  # fmt: skip
        optim = OptimConfig(lr=1e-3, warmup_ratio=0.25)
        result = train(model, step_fn if kill_at is None else killing(step_fn, kill_at), data, cfg, optim)
        return model, result

    straight, _ = run(root / "straight", seed=0)
    with pytest.raises(Killed):
        run(root / "killed", seed=0, kill_at=steps // 2 + 1)
    torch.manual_seed(999)  # a new process: other global draws, a fresh model of other initial weights
    resumed, result = run(root / "killed", seed=11)
    assert result.start_step == steps // 2 and result.step == steps
    want, got = straight.state_dict(), resumed.state_dict()
    assert want.keys() == got.keys()
    assert [k for k in want if not torch.equal(want[k], got[k])] == [], f"{name} {role}: the resumed run diverged"
    _, fresh = build(name, role, tok)
    assert any(not torch.equal(want[k], v) for k, v in fresh.state_dict().items()), "training changed nothing"


def check_precision_and_kernels(name: str, role: str, tok: Any, root: Path, steps: int = 3) -> None:
    """Three updates through :func:`train` from one seed in four ways. AdamW's ``foreach`` kernels end
    bit-identical to one parameter at a time (``loop``), its ``fused`` kernel within rounding of it; the forward under
    bf16 autocast on the CPU (``cpu_bf16``) gives every logged loss close to fp32's, yet not the same bits (autocast
    ran), and keeps fp32 weights. Close: within 1% at the first update (the same weights scored in two precisions),
    6% after it, where the two runs follow their own paths."""
    fam = family.get(name)

    def run(out: str, adamw: str, cpu_bf16: bool) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
        _, model = build(name, role, tok)
        ctx = step_context(tok, name, role)
        sampler = ResumableSampler(len(CAPTIONS), seed=7, rank=0, world_size=1)
        data = SamplerBatches(sampler, lambda idx: batch_of(tok, list(idx), seed=idx.epoch + 3), BATCH)
        cfg = TrainConfig(out_dir=str(root / out), max_steps=steps, log_every=1, seed=5, progress=False,
                          name="precision", cpu_bf16=cpu_bf16)  # fmt: skip
        train(model, lambda m, b: fam.train_step(m, b, ctx), data, cfg, OptimConfig(lr=1e-3, adamw=adamw))
        lines = [json.loads(line) for line in (root / out / "metrics.jsonl").read_text().splitlines()]
        logged = [{k: v for k, v in line.items() if k.startswith("train/loss")} for line in lines if "step" in line]
        return model.state_dict(), logged

    loop, loop_losses = run("loop", "loop", False)
    foreach, _ = run("foreach", "foreach", False)
    assert [k for k in loop if not torch.equal(loop[k], foreach[k])] == [], f"{name} {role}: foreach != loop"
    fused, fused_losses = run("fused", "fused", False)
    assert fused_losses == [pytest.approx(want, rel=1e-5) for want in loop_losses], f"{name} {role}: fused AdamW"
    # a key bias gets a gradient of rounding noise (softmax ignores it), which Adam scales to ~lr: there the
    # kernels may differ by up to the 3 x 1e-3 an update can move; everywhere else by 1% of one update's lr
    noise = re.compile(r"(k_proj|key|qkv)\.bias$")
    far = [k for k in loop if not torch.allclose(loop[k].float(), fused[k].float(), rtol=1e-4,
                                                 atol=3e-3 if noise.search(k) else 1e-5)]  # fmt: skip
    assert far == [], f"{name} {role}: the fused AdamW moved {far} beyond rounding"
    bf16, bf16_losses = run("bf16", "foreach", True)
    assert len(bf16_losses) == len(loop_losses) == steps and set(bf16_losses[0]) == set(loop_losses[0])
    assert all(v.dtype == loop[k].dtype for k, v in bf16.items()), "cpu_bf16 changed a stored dtype"
    for step, (want, got) in enumerate(zip(loop_losses, bf16_losses, strict=True)):
        # the first update scores the same weights; after it the two trajectories part (lr 1e-3 on a tiny model:
        # TS2-Net's contrastive loss, at logit scale 100, has parted by 3.8% at the third update)
        rel = 0.01 if step == 0 else 0.06
        assert got == pytest.approx(want, rel=rel, abs=0.01), f"{name} {role} update {step + 1}: bf16 vs fp32"
    assert bf16_losses != loop_losses, f"{name} {role}: cpu_bf16 left every loss bit-identical (no autocast?)"


def check_eval_precision(name: str, role: str, tok: Any) -> None:
    """``eval_precision: bf16`` through the evaluation's own encoders (:mod:`vlp.inference`): every clip and text
    feature, similarity and match probability of the fused pass stays within :data:`EVAL_BF16_ATOL` of fp32's on the
    same weights, comes back as fp32, and each forward's output (clips, texts, fused pass) differs from fp32's bits
    (autocast ran there)."""
    from vlp.config import Config
    from vlp.inference import encode_clips, encode_texts, pair_scorer

    fam = family.get(name)
    _, model = build(name, role, tok)
    model.eval()
    clips, captions = batch_of(tok, range(6)).video, [CAPTIONS[i] for i in range(5)]
    data = SimpleNamespace(clip=lambda video_id, rng: clips[int(video_id)], seed=0)

    def evaluate(precision: str) -> dict[str, torch.Tensor]:
        cfg = Config(retrieval=RetrievalConfig(num_workers=0, eval_precision=precision))
        videos = encode_clips(fam, model, data, [str(i) for i in range(len(clips))], 4, cfg)
        texts = encode_texts(fam, model, tok, captions, MAX_LEN, 4, precision)
        out = {"video": videos.feat, "text": texts.feat, "similarity": fam.similarity(model, texts, videos)}
        if family.pair_scorer_of(fam, model) is not None:
            score = pair_scorer(fam, model, texts, videos, precision)
            t, v = torch.tensor([0, 1, 2, 3, 4, 0]), torch.tensor([0, 1, 2, 3, 4, 5])
            out["match probability"] = score(t, v).softmax(-1)[:, 1]
        return out

    fp32, bf16 = evaluate("fp32"), evaluate("bf16")
    for what, want in fp32.items():
        got = bf16[what]
        assert got.dtype == torch.float32 and got.shape == want.shape, f"{name} {role}: {what}"
        scale = max(1.0, float(want.abs().max()))  # a similarity may carry its family's logit scale
        diff = float((got - want).abs().max()) / scale
        assert diff <= EVAL_BF16_ATOL, f"{name} {role}: bf16 moved the {what} by {diff:.3g} of {scale:.3g}"
    # each forward ran in bf16: the encoders and the fused pass each change bits (the similarity follows from them)
    same = [k for k in fp32 if k != "similarity" and torch.equal(fp32[k], bf16[k])]
    assert same == [], f"{name} {role}: bf16 left the {same} bit-identical (no autocast there?)"


def check_grad_checkpointing(name: str, role: str, tok: Any) -> None:
    """``grad_checkpointing`` reaches every transformer block the step trains (a module at ``...blocks.<i>`` or
    ``...layers.<i>`` with trainable weights): each one that runs, runs again in the backward (the recomputation),
    and the step's losses and gradients are those without it. Turned off again, nothing is recomputed."""
    fam = family.get(name)

    def step(checkpointing: str) -> tuple[dict[str, float], dict[str, torch.Tensor], dict[str, int]]:
        _, model = build(name, role, tok)
        model.train()
        if checkpointing != "off":
            assert enable_grad_checkpointing(model) > 0, f"{name} {role}: no part can recompute its activations"
        if checkpointing == "on, then off":
            enable_grad_checkpointing(model, enable=False)
        block = re.compile(r"\.(blocks|layers)\.\d+$")
        blocks = {n: m for n, m in model.named_modules()
                  if block.search(n) and any(p.requires_grad for p in m.parameters())}  # fmt: skip
        assert blocks, f"{name} {role}: no transformer block found"
        calls = dict.fromkeys(blocks, 0)
        # pre-hooks on the block and everything in it: the recomputation stops once it has what the backward
        # needs (before a forward hook would fire), and transformers' layers recompute ``forward``, not the call
        hooks = [sub.register_forward_pre_hook(lambda *_, n=n: calls.__setitem__(n, calls[n] + 1))
                 for n, m in blocks.items() for sub in m.modules()]  # fmt: skip
        ctx = step_context(tok, name, role)  # before seeding: the first call makes the pre-training inputs
        torch.manual_seed(1)
        losses = fam.train_step(model, batch_of(tok, range(BATCH)), ctx)
        losses["loss"].backward()
        for hook in hooks:
            hook.remove()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        return {k: float(v.detach()) for k, v in losses.items()}, grads, calls

    plain_losses, plain_grads, plain_calls = step("off")
    assert step("on, then off")[2] == plain_calls, f"{name} {role}: turned off, blocks still recompute"
    losses, grads, calls = step("on")
    assert losses == plain_losses, f"{name} {role}: checkpointing changed the losses"
    assert grads.keys() == plain_grads.keys()
    for k, g in grads.items():
        torch.testing.assert_close(g, plain_grads[k], rtol=1e-5, atol=1e-7, msg=f"{name} {role}: {k}")
    ran = [n for n, c in plain_calls.items() if c]
    assert ran, f"{name} {role}: no block ran"
    missed = [(n, plain_calls[n], calls[n]) for n in ran if calls[n] <= plain_calls[n]]
    assert missed == [], f"{name} {role}: blocks never recomputed: {missed}"


# --------------------------------------------------------------------------- every registered family


@pytest.mark.parametrize(("name", "role"), cases())
def test_every_trainable_parameter_gets_a_finite_gradient_and_no_frozen_one_does(name, role, tok):
    check_gradients(name, role, tok)


@pytest.mark.parametrize("losses", [["vtc", "pem", "mlm", "vtm"], ["vtc", "mlm"], ["mlm", "vtm"], ["vtc"]])
def test_alpro_pre_trained_with_a_subset_of_its_objectives_has_no_parameter_without_a_gradient(losses, tok):
    """What DDP refuses, a parameter that gets no gradient (tests/test_pretrain_steps.py trains one subset under
    torchrun): for ALPRO's Table 1 rows, only the enabled objectives' heads exist, and the step computes each."""
    values = check_gradients("alpro", "pretrained", tok, losses)
    assert sorted(k for k in values if k.startswith("loss_")) == sorted(f"loss_{t}" for t in losses), values


@pytest.mark.parametrize("name", family.names())
def test_save_then_load_gives_the_same_model(name, tok, tmp_path):
    check_round_trip(name, "retrieval", tok, tmp_path)


@pytest.mark.parametrize(("name", "role"), cases())
def test_encodings_and_similarity_have_the_contracts_shapes(name, role, tok):
    check_shapes(name, role, tok)


@pytest.mark.parametrize("name", family.names())
def test_a_killed_training_resumes_bit_identically(name, tok, tmp_path):
    check_resume(name, "retrieval", tok, tmp_path)


@pytest.mark.parametrize(("name", "role"), cases())
def test_adamw_kernels_agree_and_cpu_bf16_keeps_the_losses(name, role, tok, tmp_path):
    check_precision_and_kernels(name, role, tok, tmp_path)


@pytest.mark.parametrize(("name", "role"), cases())
def test_eval_precision_bf16_keeps_the_evaluations_scores(name, role, tok):
    check_eval_precision(name, role, tok)


@pytest.mark.parametrize(("name", "role"), cases())
def test_grad_checkpointing_recomputes_and_keeps_the_gradients(name, role, tok):
    check_grad_checkpointing(name, role, tok)


def test_the_gradient_check_catches_an_unreached_and_a_fed_frozen_parameter(tok, monkeypatch):
    """The gradient check is not vacuous: a trainable parameter the step never reaches, and a frozen one that
    gets a gradient, both fail it."""
    name = family.names()[0]
    fam = family.get(name)
    real = type(fam).build

    def with_unused(self, kind, config, num_answers=0):
        model = real(self, kind, config, num_answers)
        model.register_parameter("unused_for_the_test", torch.nn.Parameter(torch.zeros(2)))
        return model

    monkeypatch.setattr(type(fam), "build", with_unused)
    with pytest.raises(AssertionError, match=r"gives no gradient: .*unused_for_the_test"):
        check_gradients(name, "retrieval", tok)

    def frozen_but_fed(self, kind, config, num_answers=0):
        model = real(self, kind, config, num_answers)
        first = next(iter(model.parameters())).requires_grad_(False)
        first.grad = torch.zeros_like(first)
        return model

    monkeypatch.setattr(type(fam), "build", frozen_but_fed)
    with pytest.raises(AssertionError, match="require no grad got one"):
        check_gradients(name, "retrieval", tok)


# --------------------------------------------------------------------------- shared code names no family

# Every shared module but vlp.registry, the one place that lists the built-in families (BUILT_IN: their specs).
SHARED = ["src/vlp/steps", "src/vlp/train", "src/vlp/eval", "src/vlp/data", "src/vlp/index", "src/vlp/serve",
          "src/vlp/cli.py", "src/vlp/config.py", "src/vlp/settings.py", "src/vlp/schema.py", "src/vlp/report.py",
          "src/vlp/inference.py", "src/vlp/inputs.py", "src/vlp/distributed.py", "src/vlp/rng.py", "pipelines",
          "components"]  # fmt: skip

# Family names shared code must keep, each with why; an entry is (file, what the guard reports). The guard fails
# on a leak not listed here, and on a listed one that is gone: delete its entry then, so the list only shrinks.
KNOWN_LEAKS = {
    # a KFP component's default is shipped as source text: it cannot name vlp.models.family.DEFAULT_FAMILY
    ("components/training.py", "<module>: default 'alpro' of pretrain"),
}  # fmt: skip

# Not leaks: the same word meaning something else (ALPRO's annotation-file format for `vlp ingest`); they stay,
# but are listed so that a new use of the word is looked at.
HOMONYMS = {
    ("src/vlp/data/ingest/readers.py", "<module>: dict key 'alpro'"),
    ("src/vlp/data/ingest/readers.py", "_detect: a literal lists 'alpro'"),
    ("src/vlp/data/ingest/records.py", "<module>: a literal lists 'alpro'"),
    ("src/vlp/data/ingest/records.py", "IngestConfig: a literal lists 'alpro'"),
}

PREFIX = re.compile(r"[a-z_][a-z0-9_.]*\.")  # a parameter-name prefix, e.g. "fusion."
MODULE = re.compile(r"vlp\.models\.[a-z0-9_.]+(:\w+)?")  # a module (and attribute) named in a string


class LeakFinder(ast.NodeVisitor):
    """What in one module names a family: ``<scope>: <what>`` for (a) an import of ``vlp.models.<family>`` (any
    submodule; also ``from vlp.models import <family>`` and such a module named in a string), (b) a family's name
    compared with, as a dict key, as a default (of a parameter, a dataclass field, a ``default=`` keyword) or in a
    tuple / list / set literal (a hand-written family list), and (c) a tuple of parameter-name prefixes (the
    names of some family's modules)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names, self.scope, self.found = set(names), [], []

    def _add(self, what: str) -> None:
        self.found.append(f"{'.'.join(self.scope) or '<module>'}: {what}")

    def _is_name(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in self.names

    def _family_module(self, module: str) -> bool:
        parts = module.split(".")
        return len(parts) >= 3 and parts[:2] == ["vlp", "models"] and parts[2] in self.names

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None and self._is_name(default):
                self._add(f"default {default.value!r} of {node.name}")
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and stmt.value is not None and self._is_name(stmt.value):
                self._add(f"default {stmt.value.value!r} of {ast.unparse(stmt.target)}")
        self.generic_visit(node)
        self.scope.pop()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if self._family_module(alias.name):
                self._add(f"imports {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if self._family_module(module):
            self._add(f"imports {module}")
        elif module == "vlp.models":
            for alias in node.names:
                if alias.name in self.names:
                    self._add(f"imports vlp.models.{alias.name}")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and MODULE.fullmatch(node.value) and self._family_module(node.value):
            self._add(f"names the module {node.value}")

    def visit_Compare(self, node: ast.Compare) -> None:
        for side in [node.left, *node.comparators]:
            for item in side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]:
                if self._is_name(item):
                    self._add(f"compares with {item.value!r}")
            if not isinstance(side, (ast.Tuple, ast.List, ast.Set)):
                self.visit(side)

    def visit_Dict(self, node: ast.Dict) -> None:
        for key in node.keys:
            if key is not None and self._is_name(key):
                self._add(f"dict key {key.value!r}")
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg == "default" and self._is_name(node.value):
            self._add(f"default= {node.value.value!r}")
        self.generic_visit(node)

    def visit_Tuple(self, node: ast.Tuple | ast.List | ast.Set) -> None:
        strings = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if strings and len(strings) == len(node.elts) and all(PREFIX.fullmatch(s) for s in strings):
            self._add(f"parameter-name prefixes {ast.unparse(node)}")
        for item in node.elts:
            if self._is_name(item):
                self._add(f"a literal lists {item.value!r}")
        self.generic_visit(node)

    visit_List = visit_Set = visit_Tuple


def leaks(source: str, names: tuple[str, ...]) -> list[str]:
    finder = LeakFinder(names)
    finder.visit(ast.parse(source))
    return finder.found


def shared_leaks(names: tuple[str, ...]) -> set[tuple[str, str]]:
    """``(file, what)`` of every leak in the shared modules."""
    found = set()
    for where in SHARED:
        path = ROOT / where
        for module in [path] if path.is_file() else sorted(path.rglob("*.py")):
            rel = module.relative_to(ROOT).as_posix()
            found.update((rel, what) for what in leaks(module.read_text(encoding="utf-8"), names))
    return found


def test_shared_modules_name_no_family_beyond_the_known_leaks():
    found = shared_leaks(family.names())
    new = sorted(found - KNOWN_LEAKS - HOMONYMS)
    assert not new, f"shared code names a model family (go through vlp.models.family): {new}"
    gone = sorted((KNOWN_LEAKS | HOMONYMS) - found)
    assert not gone, f"these listed leaks are gone: delete them from KNOWN_LEAKS / HOMONYMS: {gone}"


def test_the_leak_finder_sees_each_kind_of_leak():
    source = """
import vlp.models.ts2net.model
from vlp.models import alpro
from vlp.models.albef.importer import remap
from vlp.models.family import get
LOAD = "vlp.models.ts2net.model:FAMILY"

def run(family="albef", other="alpro_retrieval"):
    if family == "alpro" or family in ("ts2net", "x"):
        return {"albef": 1}
    return ("fusion.", "vtm_head.")

class Section:
    family: str = "ts2net"
    kind: str = "albef_qa"
"""
    assert leaks(source, ("albef", "alpro", "ts2net")) == [
        "<module>: imports vlp.models.ts2net.model",
        "<module>: imports vlp.models.alpro",
        "<module>: imports vlp.models.albef.importer",
        "<module>: names the module vlp.models.ts2net.model:FAMILY",
        "<module>: default 'albef' of run",
        "run: compares with 'alpro'",
        "run: compares with 'ts2net'",
        "run: dict key 'albef'",
        "run: parameter-name prefixes ('fusion.', 'vtm_head.')",
        "Section: default 'ts2net' of family",
    ]
    assert leaks("from vlp.models import family, directory\nx = family.get(cfg.family)\n", ("alpro",)) == []
