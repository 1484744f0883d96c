"""TS2-Net: token shift, perturbed top-k, token selection, frame scores, the model's outputs and losses, its
gradients, the aggregator's LayerNorm eps and DDP loss."""

from __future__ import annotations

import faulthandler
import math
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from vlp.losses.frames import frame_contrastive_loss, frame_scores, mean_pool_scores, ts2net_losses
from vlp.models.family import PretrainBatch, StepContext
from vlp.models.layers.shift import shift_positions, token_shift
from vlp.models.layers.topk import hard_topk, perturbed_topk
from vlp.models.ts2net.model import FAMILY, TS2Net, TS2NetConfig, TS2NetOutput

# --------------------------------------------------------------------------- token shift


def _labelled(clips: int, frames: int, tokens: int, channels: int = 2) -> torch.Tensor:
    """x[b*T + t, n, c] = 1000 b + 100 t + n + c / 10: every entry names its clip, frame, token and channel."""
    b = torch.arange(clips).view(-1, 1, 1, 1) * 1000
    t = torch.arange(frames).view(1, -1, 1, 1) * 100
    n = torch.arange(tokens).view(1, 1, -1, 1).float()
    c = torch.arange(channels).view(1, 1, 1, -1) / 10
    return (b + t + n + c).float().reshape(clips * frames, tokens, channels)


def test_code_shift_moves_whole_tokens_at_the_released_positions():
    x = _labelled(2, 3, 50)  # ViT-B/32 at 224 px: 49 patches + [CLS]
    left, right = shift_positions(50, "code")
    assert left.tolist() == [1, 8, 15, 22, 29, 36, 43] and right.tolist() == [4, 11, 18, 25, 32, 39, 46]
    y = token_shift(x, 3, "code").reshape(2, 3, 50, 2)
    src = x.reshape(2, 3, 50, 2)
    for b in range(2):
        for t in range(3):
            for n in range(50):
                if n in left.tolist() and t > 0:
                    want = src[b, t - 1, n]  # from the previous frame
                elif n in right.tolist() and t < 2:
                    want = src[b, t + 1, n]  # from the next frame
                else:
                    want = src[b, t, n]  # [CLS], unshifted positions and the edge frames keep their own
                assert torch.equal(y[b, t, n], want), (b, t, n)
    assert torch.equal(y[:, :, 0], src[:, :, 0])  # [CLS] never moves
    assert not torch.equal(y, src) and y.shape == src.shape


def test_code_shift_at_vit_b16_moves_7_plus_7_of_196_patches():
    left, right = shift_positions(197, "code")
    assert (len(left), len(right)) == (7, 7) and left[1] - left[0] == 28 and int(right[0]) == 4


def test_paper_shift_moves_the_ratio_of_patches_half_each_way():
    left, right = shift_positions(50, "paper", ratio=0.25)
    moved = torch.cat([left, right])
    assert len(moved) == 12 and len(set(moved.tolist())) == 12 and 0 not in moved.tolist()  # round(0.25 * 49)
    assert abs(len(left) - len(right)) <= 1 and moved.max() <= 49
    y = token_shift(_labelled(1, 2, 50), 2, "paper", ratio=0.25).reshape(2, 50, 2)
    src = _labelled(1, 2, 50).reshape(2, 50, 2)
    assert torch.equal(y[1, left], src[0, left]) and torch.equal(y[0, right], src[1, right])
    kept = [n for n in range(50) if n not in moved.tolist()]
    assert torch.equal(y[:, kept], src[:, kept])
    assert len(torch.cat(shift_positions(50, "paper", ratio=0.5))) == 24  # round(0.5 * 49) = 24


def test_channel_shift_moves_channel_slices_of_every_token_and_keeps_edges():
    x = _labelled(1, 3, 5, channels=16)
    y = token_shift(x, 3, "channel", channel_div=8).reshape(3, 5, 16)
    src = x.reshape(3, 5, 16)
    assert torch.equal(y[1:, :, :2], src[:-1, :, :2]) and torch.equal(y[0, :, :2], src[0, :, :2])
    assert torch.equal(y[:-1, :, 2:4], src[1:, :, 2:4]) and torch.equal(y[2, :, 2:4], src[2, :, 2:4])
    assert torch.equal(y[:, :, 4:], src[:, :, 4:])


def test_one_frame_and_bad_inputs():
    x = torch.randn(3, 50, 4)
    assert torch.equal(token_shift(x, 1, "code"), x)
    with pytest.raises(ValueError, match="clips of 2 frames"):
        token_shift(x, 2, "code")
    with pytest.raises(ValueError, match="unknown shift mode"):
        token_shift(x, 3, "tsm")


def test_a_token_shift_commutes_with_layer_norm():
    # the shift feeds the attention after the block's LayerNorm; before or after is the same for whole tokens
    x, norm = torch.randn(6, 17, 8), torch.nn.LayerNorm(8)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    for mode in ("code", "paper"):
        torch.testing.assert_close(norm(token_shift(x, 3, mode)), token_shift(norm(x), 3, mode))


# --------------------------------------------------------------------------- perturbed top-k


def test_perturbed_topk_converges_to_the_hard_topk():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 9, generator=g)
    hard = hard_topk(scores, 3)
    assert torch.equal(hard.sum(dim=-1), torch.ones(5, 3)) and torch.equal(hard.sum(dim=(1, 2)), torch.full((5,), 3.0))
    errors = [
        (perturbed_topk(scores, 3, draws=400, sigma=s, generator=torch.Generator().manual_seed(1)) - hard).abs().max()
        for s in (1.0, 0.1, 1e-4)
    ]
    assert errors[0] > errors[1] > errors[2] and errors[2] == 0
    soft = perturbed_topk(scores, 3, draws=400, sigma=0.5, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(soft.sum(dim=-1), torch.ones(5, 3))  # each slot is a distribution over tokens
    by_score = hard_topk(scores, 3, order="score")
    assert torch.equal(by_score[:, 0].argmax(-1), scores.argmax(-1))  # slot 0 = the best token


def _expected_y(scores: torch.Tensor, noise: torch.Tensor, k: int, sigma: float) -> torch.Tensor:
    idx = torch.topk(scores + sigma * noise, k, dim=-1).indices.sort(-1).values
    return F.one_hot(idx, scores.shape[-1]).float().mean(0)  # (k, n)


def test_perturbed_topk_backward_matches_a_finite_difference_of_the_expectation():
    # d/ds <g, E[y(s)]> by central differences with common random numbers (200k draws), against the backward's
    # estimate; the code's diagonal estimator misses the off-diagonal terms and does not match
    torch.manual_seed(0)
    n, k, sigma, h = 4, 2, 0.5, 0.05
    scores = torch.tensor([[0.3, -0.2, 0.1, 0.0]])
    g = torch.tensor([[[1.0, -2.0, 0.5, 3.0], [0.0, 1.0, -1.0, 2.0]]])  # (1, k, n)
    noise = torch.randn(200_000, n)
    fd = torch.zeros(n)
    for d in range(n):
        e = torch.zeros(n)
        e[d] = h
        plus, minus = _expected_y(scores[0] + e, noise, k, sigma), _expected_y(scores[0] - e, noise, k, sigma)
        fd[d] = ((plus - minus) * g[0]).sum() / (2 * h)
    grads = {}
    for rule in ("full", "code"):
        s = scores.clone().requires_grad_(True)
        y = perturbed_topk(s, k, draws=200_000, sigma=sigma, backward=rule, generator=torch.Generator().manual_seed(3))
        (y * g).sum().backward()
        grads[rule] = s.grad[0]
    scale = fd.abs().max()
    assert (grads["full"] - fd).abs().max() < 0.05 * scale, (grads["full"], fd)
    assert (grads["code"] - fd).abs().max() > 0.2 * scale, (grads["code"], fd)


def test_topk_refuses_bad_arguments():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        perturbed_topk(torch.randn(2, 3), 4)
    with pytest.raises(ValueError, match="sigma > 0"):
        perturbed_topk(torch.randn(2, 3), 1, sigma=0.0)


# --------------------------------------------------------------------------- frame scores and loss


def test_frame_score_is_the_softmax_weighted_sum_computed_by_hand():
    text = torch.tensor([[1.0, 0.0]])
    frames = F.normalize(torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]), dim=-1)  # cosines 1, 0, 0.7071
    s = [1.0, 0.0, 1 / math.sqrt(2)]
    w = [math.exp(4 * v) for v in s]
    want = sum(wi * si for wi, si in zip(w, s, strict=True)) / sum(w)
    torch.testing.assert_close(frame_scores(text, frames, 4.0, normalise=False), torch.tensor([[want]]))
    norm = math.sqrt(sum(v * v for v in s))
    w = [math.exp(4 * v / norm) for v in s]
    want_code = sum(wi * si for wi, si in zip(w, s, strict=True)) / sum(w)
    torch.testing.assert_close(frame_scores(text, frames, 4.0, normalise=True), torch.tensor([[want_code]]))
    torch.testing.assert_close(mean_pool_scores(text, frames), F.normalize(frames.mean(1), dim=-1)[:, :1].t())
    big_t, big_f = F.normalize(torch.randn(7, 5), dim=-1), F.normalize(torch.randn(4, 3, 5), dim=-1)
    torch.testing.assert_close(frame_scores(big_t, big_f, chunk=3), frame_scores(big_t, big_f))


def test_frame_loss_is_the_symmetric_cross_entropy_of_the_scaled_scores():
    g = torch.Generator().manual_seed(0)
    text = F.normalize(torch.randn(4, 6, generator=g), dim=-1)
    frames = F.normalize(torch.randn(4, 3, 6, generator=g), dim=-1)
    scale = torch.tensor(math.log(20.0))
    logits = 20.0 * frame_scores(text, frames)
    want = (F.cross_entropy(logits, torch.arange(4)) + F.cross_entropy(logits.t(), torch.arange(4))) / 2
    torch.testing.assert_close(frame_contrastive_loss(text, frames, scale, frame_scores), want)


# --------------------------------------------------------------------------- the model


def _batch(seed: int = 0, b: int = 3, frames: int = 4) -> PretrainBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (b, 10), generator=g)
    mask = torch.ones(b, 10, dtype=torch.long)
    mask[-1, 6:] = 0
    return PretrainBatch(torch.randn(b, frames, 3, 32, 32, generator=g), ids, mask)


@pytest.mark.parametrize("select", ["code", "paper", "none"])
def test_every_parameter_gets_a_gradient(select):
    torch.manual_seed(0)
    model = TS2Net(TS2NetConfig.tiny(vocab_size=100, select=select)).train()
    out = FAMILY.train_step(model, _batch(), StepContext(generator=torch.Generator().manual_seed(0)))
    out["loss"].backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not missing, missing
    assert math.isfinite(out["loss"].item())


@pytest.mark.parametrize("pool", ["weighted", "mean"])
def test_forward_returns_named_outputs_and_the_loss_is_a_function_of_them(pool):
    torch.manual_seed(0)
    model = TS2Net(TS2NetConfig.tiny(vocab_size=100, frame_pool=pool, frame_lambda=3.0)).train()
    batch = _batch()
    out = model(batch, StepContext(generator=torch.Generator().manual_seed(0)))
    assert isinstance(out, TS2NetOutput) and out.text.shape == (3, 64) and out.frames.shape == (3, 4, 64)
    assert out.logit_scale is model.clip.logit_scale  # the trainable parameter: the loss's gradient reaches it
    assert (out.frame_pool, out.frame_lambda, out.frame_norm) == (pool, 3.0, "l2")
    losses = ts2net_losses(out)
    # the symmetric InfoNCE over the model's own score (what forward computed before it returned named outputs)
    want = frame_contrastive_loss(out.text, out.frames, model.clip.logit_scale, model.score)
    assert set(losses) == {"loss", "loss_itc", "logit_scale"}
    torch.testing.assert_close(losses["loss"], want, atol=0, rtol=0)
    assert losses["loss"].requires_grad and not losses["loss_itc"].requires_grad
    assert float(losses["logit_scale"]) == pytest.approx(1 / 0.07)
    # the step the loop calls: the same numbers on the same draws
    step = FAMILY.train_step(model, batch, StepContext(generator=torch.Generator().manual_seed(0)))
    assert {k: float(v.detach()) for k, v in step.items()} == {k: float(v.detach()) for k, v in losses.items()}
    other = TS2NetOutput(out.text, out.frames, out.logit_scale, "weighted" if pool == "mean" else "mean")
    assert float(ts2net_losses(other)["loss"].detach()) != float(losses["loss"].detach())  # the output's rule counts


def test_the_aggregators_layernorm_eps_is_a_config_value_and_an_old_model_json_keeps_clips():
    from dataclasses import asdict

    from vlp.config import ConfigError, load_config
    from vlp.settings import ModelConfig

    def eps(model: TS2Net) -> set[float]:
        return {m.eps for m in model.aggregator.modules() if isinstance(m, torch.nn.LayerNorm)}

    torch.manual_seed(0)
    code = TS2Net(TS2NetConfig.tiny(vocab_size=100))
    assert code.cfg.aggregator_ln_eps == 1e-12 and eps(code) == {1e-12}  # the released code's cross blocks
    text_eps = {m.eps for m in code.clip.text_model.modules() if isinstance(m, torch.nn.LayerNorm)}
    assert text_eps == {1e-5}  # CLIP's own towers keep CLIP's
    clip = TS2Net(TS2NetConfig.tiny(vocab_size=100, aggregator_ln_eps=1e-5))
    assert eps(clip) == {1e-5}
    clip.load_state_dict(code.state_dict())  # the eps is no weight: the same keys and shapes
    video = _batch().video
    with torch.no_grad():
        assert not torch.equal(code.eval().encode_video(video), clip.eval().encode_video(video))
    assert FAMILY.config(ModelConfig(family="ts2net"), vocab_size=100).aggregator_ln_eps == 1e-12
    section = load_config(None, ["model.family=ts2net", "model.ts2net.aggregator_ln_eps=1.0e-5"]).model
    assert FAMILY.config(section, vocab_size=100).aggregator_ln_eps == 1e-5
    saved = asdict(code.cfg)
    assert FAMILY.config_from_dict(saved) == code.cfg  # a model.json written now keeps 1e-12
    del saved["aggregator_ln_eps"]  # a model.json written before the key existed: trained with CLIP's 1e-5
    assert FAMILY.config_from_dict(saved).aggregator_ln_eps == 1e-5
    with pytest.raises(ValueError, match="aggregator_ln_eps must be > 0"):
        TS2NetConfig.tiny(vocab_size=10, aggregator_ln_eps=0.0)
    with pytest.raises(ConfigError, match=r"model.ts2net.aggregator_ln_eps=-1.0 must be > 0"):
        load_config(None, ["model.ts2net.aggregator_ln_eps=-1"])


def test_shift_hooks_act_on_the_last_blocks_only_and_only_across_frames():
    torch.manual_seed(0)
    shifted = TS2Net(TS2NetConfig.tiny(vocab_size=100, shift_last=1)).eval()
    plain = TS2Net(TS2NetConfig.tiny(vocab_size=100, shift_mode="none")).eval()
    plain.load_state_dict(shifted.state_dict())  # same keys: the shift lives in hooks, not modules
    video = _batch().video
    with torch.no_grad():
        assert not torch.allclose(shifted.frame_tokens(video), plain.frame_tokens(video))
        one = video[:, :1]  # a one-frame clip has no neighbour to shift from
        torch.testing.assert_close(shifted.frame_tokens(one), plain.frame_tokens(one))


def test_selection_is_deterministic_at_inference_and_keeps_cls_first():
    torch.manual_seed(0)
    model = TS2Net(TS2NetConfig.tiny(vocab_size=100)).eval()
    video = _batch().video
    with torch.no_grad():
        torch.testing.assert_close(model.encode_video(video), model.encode_video(video))
        tokens = model.frame_tokens(video)
        chosen = model.selector(tokens)
    assert chosen.shape == (12, 4, 64) and torch.equal(chosen[:, 0], tokens[:, 0])
    picked = [int((tokens[r] == chosen[r, j]).all(-1).nonzero()) for r in range(2) for j in range(1, 4)]
    assert all(p > 0 for p in picked)  # three patch tokens, never [CLS] again


def test_text_query_is_the_last_real_token():
    torch.manual_seed(0)
    model = TS2Net(TS2NetConfig.tiny(vocab_size=100)).eval()
    b = _batch()
    with torch.no_grad():
        query, hidden = model.encode_text(b.input_ids, b.attention_mask)
        want = F.normalize(model.clip.text_projection(hidden[2, 5]), dim=-1)  # 6 real tokens in the last row
    torch.testing.assert_close(query[2], want)


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="shift_last"):
        TS2NetConfig.tiny(vocab_size=10, shift_last=3)
    with pytest.raises(ValueError, match="exceeds"):
        TS2NetConfig.tiny(vocab_size=10, select_k=17)


# --------------------------------------------------------------------------- DDP

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cfg() -> TS2NetConfig:
    return TS2NetConfig.tiny(vocab_size=100, select="none")  # no random draws: ranks and one process agree


def _worker(rank: int, port: int, out_dir: str) -> None:
    from vlp import distributed

    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(120, exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD))  # fmt: skip
    distributed.init_from_env("gloo", timeout_s=60)
    torch.manual_seed(0)
    model = distributed.wrap_ddp(TS2Net(_cfg()).train())
    full = _batch(b=4)
    mine = slice(2 * rank, 2 * rank + 2)
    batch = PretrainBatch(full.video[mine], full.input_ids[mine], full.attention_mask[mine])
    ctx = StepContext(gather=distributed.all_gather_with_grad, rank=rank, world=WORLD)
    loss = FAMILY.train_step(model, batch, ctx)["loss"]
    loss.backward()
    grads = {f"g.{n}": p.grad for n, p in model.module.named_parameters()}
    save_file({"loss": loss.detach(), "mean": distributed.all_reduce_mean(loss)} | grads,
              str(Path(out_dir) / f"rank{rank}.safetensors"))  # fmt: skip
    distributed.cleanup()


def test_two_process_loss_and_gradients_equal_one_process_on_the_gathered_batch(tmp_path):
    mp.set_forkserver_preload(["torch", "torch._dynamo", "torch.nn.parallel"])
    mp.start_processes(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True, start_method="forkserver")
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(WORLD)]
    torch.manual_seed(0)
    model = TS2Net(_cfg()).train()
    loss = FAMILY.train_step(model, _batch(b=4), StepContext())["loss"]
    loss.backward()
    for out in ranks:
        torch.testing.assert_close(out["mean"], loss.detach())
        for name, p in model.named_parameters():
            torch.testing.assert_close(out[f"g.{name}"], p.grad, atol=1e-6, rtol=1e-4, msg=lambda m, n=name: f"{n} {m}")
    assert ranks[0]["loss"] != ranks[1]["loss"]


# --------------------------------------------------------------------------- steps: fine-tune from the model section


def _steps_cfg(*overrides: str):
    from vlp.config import load_config

    tiny = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
    return load_config(tiny, ["model.family=ts2net", "retrieval.num_frames=2", *overrides])


def test_finetune_retrieval_starts_ts2net_from_the_model_section_and_evaluates(tiny_world, tmp_path):
    import json

    from vlp import storage
    from vlp.steps.evaluate import evaluate_retrieval
    from vlp.steps.finetune import finetune_retrieval

    cfg = _steps_cfg()
    out, ev = str(tmp_path / "ret"), str(tmp_path / "eval")
    summary = finetune_retrieval(tiny_world["dataset"], tiny_world["frames"], "", out, cfg)
    assert summary["steps"] == cfg.retrieval.max_steps and "train/loss_itc" in summary["metrics"]
    doc = json.loads(storage.read_text(f"{out}/model.json"))
    assert doc["kind"] == "ts2net_retrieval" and doc["lineage"]["video_init"] == "random"
    assert doc["config"]["shift_mode"] == "code" and doc["config"]["video"]["num_frames"] == 2
    m = evaluate_retrieval(tiny_world["dataset"], tiny_world["frames"], out, ev, cfg)["metrics"]
    assert m["t2v_r1"] == m["vtc_t2v_r1"] and m["pairs_scored"] == 0  # ranked by the frame score, nothing re-ranks
    assert "vtm_loss" not in m and 0 <= m["t2v_r1"] <= m["t2v_r5"] <= 100
    again = evaluate_retrieval(tiny_world["dataset"], tiny_world["frames"], out, str(tmp_path / "again"), cfg)
    assert again["metrics"] == m  # hard top-k at inference: the same scores every time
    dual = _steps_cfg("retrieval.rescore=dual_softmax", "retrieval.rescore_scale=50")
    r = evaluate_retrieval(tiny_world["dataset"], tiny_world["frames"], out, str(tmp_path / "dual"), dual)["metrics"]
    assert {k: v for k, v in r.items() if k.startswith("vtc_")} == {k: v for k, v in m.items() if k.startswith("vtc_")}
    assert r["t2v_meanr"] != m["t2v_meanr"]  # the test set's own statistics moved the ranking


def test_ts2net_is_not_pretrained_and_has_no_qa(tiny_world, tmp_path, capsys):
    """Neither QA step calls into TS2-Net: both refuse its model, saying what to run instead, before writing."""
    from vlp.cli import main
    from vlp.models import family
    from vlp.steps.evaluate import evaluate_qa
    from vlp.steps.finetune import finetune_qa, finetune_retrieval
    from vlp.steps.pretrain import pretrain

    fam = family.get("ts2net")
    assert fam.kinds.qa == "" and not isinstance(fam, family.AnswersQuestions | family.PairScorer)
    assert not any(hasattr(fam, m) for m in ("set_answers", "qa_step", "qa_logits", "reranks", "pair_logits"))
    cfg = _steps_cfg()
    with pytest.raises(ValueError, match="ts2net is not pre-trained"):
        pretrain(tiny_world["dataset"], tiny_world["frames"], str(tmp_path / "pre"), cfg)
    out = str(tmp_path / "ret")
    finetune_retrieval(tiny_world["dataset"], tiny_world["frames"], "", out, _steps_cfg("retrieval.max_steps=1"))
    said = (r"model family ts2net has no QA model: finetune-qa and evaluate-qa need a model of a family that has one "
            r"\(albef, alpro\); a ts2net model \(ts2net_clip, ts2net_retrieval\) is for retrieval: "
            r"`vlp finetune-retrieval` and `vlp evaluate-retrieval`")  # fmt: skip
    for step in (finetune_qa, evaluate_qa):
        with pytest.raises(ValueError, match=said):
            step(tiny_world["dataset"], tiny_world["frames"], out, str(tmp_path / step.__name__), cfg)
        assert not (tmp_path / step.__name__).exists()
    tiny = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
    where = ["--dataset", tiny_world["dataset"], "--frames", tiny_world["frames"], "--config", str(tiny)]
    assert main(["evaluate-qa", *where, "--model", out, "--out", str(tmp_path / "cli")]) == 2
    assert "error: model family ts2net has no QA model" in capsys.readouterr().err
    assert not (tmp_path / "cli").exists()


def test_the_msrvtt_config_is_the_papers_and_codes_row():
    from vlp.config import load_config
    from vlp.models.ts2net.model import FAMILY

    root = Path(__file__).resolve().parents[1] / "configs"
    cfg = load_config([root / "default.yaml", root / "ts2net" / "msrvtt.yaml"])
    r = cfg.retrieval
    assert (r.lr, tuple(r.betas), r.eps, r.weight_decay) == (1e-4, (0.9, 0.98), 1e-6, 0.2)
    assert r.lr * r.backbone_lr_mult == pytest.approx(1e-7)  # CLIP's parameters
    assert (r.batch_size * 8, r.epochs, r.num_frames, r.max_len, r.grad_clip, r.warmup_ratio) == (
        128,
        5,
        12,
        32,
        1.0,
        0.1,
    )
    model = FAMILY.config(cfg.model, vocab_size=49408)
    assert model.video.init == model.text.init == "openai/clip-vit-base-patch32" and model.video.patch_size == 32
    assert (model.shift_last, model.picks, model.tokens_per_frame, model.aggregator_layers) == (2, 3, 4, 4)
    assert model.embed_dim == 512 and model.video.num_tokens == 50


def test_the_didemo_row_sizes_the_aggregator_for_64_frames():
    from vlp.config import load_config
    from vlp.models.ts2net.model import FAMILY

    root = Path(__file__).resolve().parents[1] / "configs"
    files = [root / "default.yaml", root / "ts2net" / "msrvtt.yaml", root / "ts2net" / "didemo.yaml"]
    cfg = load_config(files)
    assert cfg.retrieval.paragraph and (cfg.retrieval.num_frames, cfg.retrieval.max_len) == (64, 64)
    model = FAMILY.config(cfg.model, vocab_size=49408)
    assert model.aggregator_positions >= 64 * model.tokens_per_frame
    tiny = TS2NetConfig.tiny(vocab_size=100, aggregator_positions=4)
    with pytest.raises(ValueError, match="exceed the aggregator's 4 positions"):
        TS2Net(tiny).eval().encode_video(torch.randn(1, 4, 3, 32, 32))


# ------------------------------------------------------------------------------------ hub revisions and lineage


def test_clip_by_hub_name_loads_the_revision_asked_for_and_records_its_commit(monkeypatch, tmp_path):
    """An offline cache holds a tiny CLIP as ``vlp-test/tiny-clip`` at ``main`` and another at tag ``v2``."""
    from dataclasses import asdict, replace

    from hub_cache import add_snapshot, commit_sha, offline_hub
    from vlp.models.tokenizer import PretrainedUnavailableError, upstream_of
    from vlp.models.ts2net.model import FAMILY
    from vlp.settings import ModelConfig

    cache = offline_hub(monkeypatch, tmp_path)
    cfg = TS2NetConfig.tiny(vocab_size=50)
    torch.manual_seed(0)
    clips = {"main": TS2Net(cfg).clip, "v2": TS2Net(cfg).clip}
    commits = {"main": commit_sha("clip main"), "v2": commit_sha("clip v2")}
    for ref, clip in clips.items():
        save_file({k: v.contiguous() for k, v in clip.state_dict().items()}, str(tmp_path / f"{ref}.safetensors"))
        (tmp_path / ref).mkdir()
        (tmp_path / f"{ref}.safetensors").rename(tmp_path / ref / "model.safetensors")
        add_snapshot(cache, "vlp-test/tiny-clip", tmp_path / ref, commit=commits[ref], refs=(ref,))

    def named(revision: str) -> TS2NetConfig:
        hub = {"init": "vlp-test/tiny-clip", "init_revision": revision}
        return replace(cfg, video=replace(cfg.video, **hub), text=replace(cfg.text, **hub))

    for revision, ref in (("", "main"), ("v2", "v2"), (commits["main"], "main")):
        model = TS2Net(named(revision))
        want = clips[ref].text_model.embeddings.token_embedding.weight
        assert torch.equal(model.clip.text_model.embeddings.token_embedding.weight, want), revision
        record = upstream_of("vlp-test/tiny-clip", revision)
        want_record = ("vlp-test/tiny-clip", revision or "main", commits[ref])
        assert (record["repo"], record["revision"], record["commit"]) == want_record
    with pytest.raises(PretrainedUnavailableError, match=r"CLIP weights 'vlp-test/tiny-clip' at revision 'v3'.*"
                       r"is not in the local cache .*main="):  # fmt: skip
        TS2Net(named("v3"))
    mixed = named("v2")
    with pytest.raises(ValueError, match="one CLIP checkpoint holds both towers"):
        TS2Net(replace(mixed, text=replace(mixed.text, init_revision="")))

    section = ModelConfig(family="ts2net", video_init="vlp-test/tiny-clip", text_init="vlp-test/tiny-clip")
    section.video_init_revision = section.text_init_revision = "v2"
    built = FAMILY.config(section, vocab_size=50)
    assert (built.video.init_revision, built.text.init_revision) == ("v2", "v2")
    loaded = TS2NetConfig.from_dict(asdict(built))
    assert (loaded.video.init, loaded.video.init_revision) == ("", "")  # a saved model never re-fetches
    random = ModelConfig(family="ts2net")
    random.text_init_revision = "v2"
    with pytest.raises(ValueError, match="init_revision 'v2' is set but init is empty"):
        FAMILY.config(random, vocab_size=50)


def test_the_aggregator_says_it_starts_random_only_where_clips_weights_could_have_started_it(tmp_path, caplog):
    """With CLIP's weights loaded and a text tower the aggregator cannot copy (another width), one line says so;
    a random build (a model built to load its directory's weights: a search, an evaluation) says nothing."""
    from dataclasses import replace

    cfg = TS2NetConfig.tiny(vocab_size=50, embed_dim=32)  # text width 64: nothing to copy
    torch.manual_seed(0)
    (tmp_path / "clip").mkdir()
    save_file({k: v.contiguous() for k, v in TS2Net(cfg).clip.state_dict().items()},
              str(tmp_path / "clip" / "model.safetensors"))  # fmt: skip
    line = "the aggregator (width 32) starts random"
    with caplog.at_level("INFO", logger="vlp"):
        TS2Net(cfg)
        assert line not in caplog.text
        init = {"init": str(tmp_path / "clip")}
        TS2Net(replace(cfg, video=replace(cfg.video, **init), text=replace(cfg.text, **init)))
    assert caplog.text.count(line) == 1
