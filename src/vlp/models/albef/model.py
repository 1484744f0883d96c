"""ALBEF (Align before Fuse, arXiv 2107.07651): align the unimodal towers, then fuse with cross-attention, with
momentum distillation, on vlp's frame shards.

- Visual tower: a ViT over each frame (:class:`vlp.models.layers.vit.FrameViT`; ViT-B/16 from DeiT in the paper
  preset), its [CLS] averaged over frames and projected to ``embed_dim``, L2-normalised.
- Text tower: BERT layers 1-6 (:class:`vlp.models.text.TextEncoder`), [CLS] projected and normalised.
- Multimodal encoder: BERT layers 7-12 with cross-attention to the visual tokens in every layer
  (:class:`vlp.models.layers.cross.CrossFusionEncoder`); the cross-attention starts random, as in ALBEF.
- Heads: ITM (``Linear(width, 2)`` on the fused [CLS]) and BERT's MLM head tied to the word embeddings.
- Momentum model: an EMA copy (momentum 0.995) of both towers, the fusion, the projections and the MLM head,
  never trained by gradient, updated at the start of every training forward (as the released code); feature
  queues of its last ``queue_size`` image / text features (and their clip ids), random unit vectors at start
  (as the code). Momentum weights, queues, the queue pointer and the step counter are buffers or frozen
  parameters of the module, so a checkpoint holds them and a resume continues exactly.

One pre-training step (eq. 5, the unweighted sum of the enabled terms; random draws in this order: ITM
negatives, MLM masks):

1. **ITC** (eq. 1-2, 6): each local image against the momentum texts of the batch then the text queue (and
   each text against the images), targets ``alpha * softmax(teacher) + (1 - alpha) * y``;
2. **ITM** (eq. 4): the fused positives and, per image and per text, one negative drawn from the ITC softmax
   over the local batch (``itm_negatives_from="local"``, the code) or the global batch (``"global"``, the
   paper: "from the same batch", with features gathered from every rank);
3. **MLM** (eq. 3, 7): 15% of the tokens masked (80/10/10), predicted from the fused sequence against
   ``(1 - alpha) * one_hot + alpha * teacher``, the teacher the momentum model's fused pass on the same masks.

``alpha`` ramps linearly from 0 to ``alpha`` over ``alpha_ramp_steps`` training forwards (ALBEF: the first
epoch), counted by the model's own step buffer. The module's ``forward`` returns :class:`AlbefOutput`; the
losses are :func:`albef_losses`, functions of it (:mod:`vlp.losses.distill`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlp import losses
from vlp.data.video_text import CLIP_MEAN, CLIP_STD
from vlp.losses import distill
from vlp.models.albef.queue import QueueRows
from vlp.models.albef.spec import KINDS, AlbefSettings
from vlp.models.albef.towers import LOSS_TERMS, AlbefConfig, Towers
from vlp.models.family import (
    ForwardAnswers,
    LrGroups,
    PretrainBatch,
    StepContext,
    Task,
    TextVocab,
    TwoTowerMethods,
    bert_text,
    built,
    generator_on,
    init_revisions,
    rgb,
    size,
    size_weights,
)
from vlp.models.layers.cross import AnswerDecoder
from vlp.models.layers.vit import FrameOutput, FrameViTConfig
from vlp.settings import qa_section, retrieval_section
from vlp.weights import load_pretrained_weights, read_model_weights

log = logging.getLogger("vlp")


class Albef(nn.Module):
    """ALBEF with its momentum model and queues (see the module docstring)."""

    image_queue: Tensor  # buffers (registered in __init__; declared for the type checker)
    text_queue: Tensor
    idx_queue: Tensor
    queue_ptr: Tensor
    steps: Tensor

    def __init__(self, cfg: AlbefConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.online = Towers(cfg, load=True)
        self.momentum = Towers(cfg, load=False)
        self.momentum.load_state_dict(self.online.state_dict())  # the teacher starts as a copy (ALBEF copy_params)
        self.momentum.requires_grad_(False)
        self.temp = nn.Parameter(torch.tensor(float(cfg.init_temp)))
        self.itm_head = nn.Linear(cfg.text.width, 2) if "itm" in cfg.losses else None
        if self.online.fusion is not None and self.itm_head is None and "mlm" not in cfg.losses:
            raise ValueError("a fusion encoder without ITM or MLM would get no gradient")
        if self.online.visual.time_embed is not None and not cfg.fused:
            self.online.visual.time_embed.requires_grad_(False)  # only the fused tokens read it
        if "itc" not in cfg.losses:  # the projections then only weight ITM's negative draw, without a gradient
            for p in (*self.online.vision_proj.parameters(), *self.online.text_proj.parameters(), self.temp):
                p.requires_grad_(False)
        m = cfg.queue_size
        self.register_buffer("image_queue", F.normalize(torch.randn(cfg.embed_dim, m), dim=0))
        self.register_buffer("text_queue", F.normalize(torch.randn(cfg.embed_dim, m), dim=0))
        self.register_buffer("idx_queue", torch.full((m,), -1, dtype=torch.long))
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))  # training forwards: alpha's ramp
        self.queue_rows = {"image_queue": QueueRows(), "text_queue": QueueRows()}  # the cat's rows, kept (queue.py)

    def temperature(self) -> Tensor:
        return losses.clamp_temperature(self.temp) if self.cfg.temp_clamp else self.temp

    def alpha(self) -> float:
        """This forward's distillation weight (0 without MoD)."""
        if not self.cfg.distill:
            return 0.0
        if self.cfg.alpha_ramp_steps < 0:
            raise ValueError("alpha_ramp_steps=-1 (one epoch) must be resolved first: family.prepare(config, ...)")
        return distill.alpha_at(int(self.steps), self.cfg.alpha, self.cfg.alpha_ramp_steps)

    @torch.no_grad()
    def momentum_update(self) -> None:
        """``p_m <- m * p_m + (1 - m) * p`` for every momentum parameter (ALBEF ``_momentum_update``)."""
        m = self.cfg.momentum
        for online, teacher in zip(self.online.parameters(), self.momentum.parameters(), strict=True):
            teacher.mul_(m).add_(online.detach(), alpha=1.0 - m)

    @torch.no_grad()
    def enqueue(self, image_feat: Tensor, text_feat: Tensor, idx: Tensor) -> None:
        """Write a gathered batch of momentum features (and clip ids) at the pointer; the oldest are overwritten."""
        n, size = image_feat.shape[0], self.cfg.queue_size
        if size == 0:
            return
        self.cfg.check_queue(n)
        ptr = int(self.queue_ptr)
        self.queue_rows["image_queue"].write(self.image_queue, ptr, image_feat)
        self.queue_rows["text_queue"].write(self.text_queue, ptr, text_feat)
        self.idx_queue[ptr : ptr + n] = idx
        self.queue_ptr.fill_((ptr + n) % size)

    def fuse(self, text_tokens: Tensor, text_mask: Tensor, visual_tokens: Tensor) -> Any:
        if self.online.fusion is None:
            raise ValueError(f"this ALBEF has no multimodal encoder: losses {list(self.cfg.losses)} use none")
        return self.online.fusion(text_tokens, text_mask, visual_tokens)

    def forward(self, batch: PretrainBatch, ctx: StepContext | None = None) -> AlbefOutput:
        return albef_forward(self, batch, ctx or StepContext())


def itm_logits(model: Albef, text_tokens: Tensor, text_mask: Tensor, visual_tokens: Tensor) -> Tensor:
    """Fuse aligned rows of text tokens and visual tokens -> ``(P, 2)`` ITM logits."""
    if model.itm_head is None:
        raise ValueError(f"this ALBEF has no ITM head: it was built for losses {list(model.cfg.losses)}")
    return model.itm_head(model.fuse(text_tokens, text_mask, visual_tokens).cls)


class AlbefQA(nn.Module):
    """ALBEF for open-ended video QA (ALBEF §5, VQA as generation): the question fused with the clip, an answer
    decoder started from the fusion layers, trained with the answers' LM loss (distilled from a momentum copy when
    ``distill``), answering by ranking the ``answer_topk`` candidates of the answer list that the decoder's first
    token prefers by their full likelihood (ALBEF ``rank_answer``)."""

    answer_ids: Tensor  # buffers (registered in __init__; declared for the type checker)
    answer_mask: Tensor
    steps: Tensor

    def __init__(self, cfg: AlbefConfig, num_answers: int) -> None:
        super().__init__()
        if num_answers < 1:
            raise ValueError(f"AlbefQA needs at least one answer, got {num_answers}")
        self.cfg = cfg
        self.online = Towers(cfg, load=False, projections=False, mlm=False)
        self.decoder = AnswerDecoder(cfg.text, states_width=cfg.text.width)
        self.momentum: Towers | None = None
        self.momentum_decoder: AnswerDecoder | None = None
        if cfg.distill:
            self.momentum = Towers(cfg, load=False, projections=False, mlm=False).requires_grad_(False)
            self.momentum_decoder = AnswerDecoder(cfg.text, states_width=cfg.text.width).requires_grad_(False)
        self.register_buffer("answer_ids", torch.zeros(num_answers, cfg.answer_len, dtype=torch.long))
        self.register_buffer("answer_mask", torch.zeros(num_answers, cfg.answer_len, dtype=torch.long))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def sync_momentum(self) -> None:
        """The momentum copies start equal to the online weights (after those are loaded)."""
        if self.momentum is not None:
            self.momentum.load_state_dict(self.online.state_dict())
            built(self.momentum_decoder, "momentum_decoder").load_state_dict(self.decoder.state_dict())

    @torch.no_grad()
    def momentum_update(self) -> None:
        m = self.cfg.momentum
        teachers = built(self.momentum, "momentum"), built(self.momentum_decoder, "momentum_decoder")  # distill only
        pairs = [(self.online, teachers[0]), (self.decoder, teachers[1])]
        for online, teacher in pairs:
            for p, q in zip(online.parameters(), teacher.parameters(), strict=True):
                q.mul_(m).add_(p.detach(), alpha=1.0 - m)

    def set_answers(self, answers: list[str], tokenizer: Any) -> None:
        """Tokenise the answer list into the ``answer_ids`` / ``answer_mask`` buffers (saved with the weights)."""
        enc = tokenizer(answers, padding="max_length", truncation=True, max_length=self.cfg.answer_len,
                        return_tensors="pt")  # fmt: skip
        if enc["input_ids"].shape != self.answer_ids.shape:
            raise ValueError(f"{len(answers)} answers do not fit the {tuple(self.answer_ids.shape)} answer buffer")
        self.answer_ids.copy_(enc["input_ids"])
        self.answer_mask.copy_(enc["attention_mask"])

    def _question(self, towers: Towers, video: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        visual = towers.visual(video)
        text = towers.text(input_ids, attention_mask)
        return built(towers.fusion, "fusion")(text.tokens, attention_mask, visual.tokens).tokens  # (B, Lq, C)

    def forward(
        self, video: Tensor, input_ids: Tensor, attention_mask: Tensor, labels: Tensor | None = None
    ) -> AlbefQAOutput | Tensor:
        """Training (``labels``: answer indices): :class:`AlbefQAOutput` for :func:`albef_qa_losses`. Inference:
        ``(B, A)`` answer scores, the candidates' log-likelihoods and ``-inf`` for answers not ranked."""
        states = self._question(self.online, video, input_ids, attention_mask)
        if labels is None:
            return self.rank_answers(states, attention_mask)
        alpha = 0.0
        if self.cfg.distill:
            if self.cfg.alpha_ramp_steps < 0:
                raise ValueError("alpha_ramp_steps=-1 (one epoch) must be resolved first: family.prepare(config, ...)")
            alpha = distill.alpha_at(int(self.steps), self.cfg.alpha, self.cfg.alpha_ramp_steps)
        if self.training:
            self.steps.add_(1)
        ids, mask = self.answer_ids[labels], self.answer_mask[labels]
        logits = self.decoder(ids, mask, states, attention_mask)
        teacher = None
        if self.cfg.distill:
            with torch.no_grad():
                if self.training:
                    self.momentum_update()
                states_m = self._question(built(self.momentum, "momentum"), video, input_ids, attention_mask)
                teacher = built(self.momentum_decoder, "momentum_decoder")(ids, mask, states_m, attention_mask)
        return AlbefQAOutput(logits=logits, answer_ids=ids, answer_mask=mask, teacher=teacher, alpha=alpha)

    @torch.no_grad()
    def rank_answers(self, states: Tensor, states_mask: Tensor) -> Tensor:
        """``(B, A)``: the top-``answer_topk`` answers by first-token probability, scored by that log-probability
        plus their log-likelihood (ALBEF ``rank_answer``); ``-inf`` for the others."""
        b, a = states.shape[0], self.answer_ids.shape[0]
        k = min(self.cfg.answer_topk, a)
        start = self.answer_ids[:1, :1].expand(b, 1)  # the [CLS] every answer starts with
        first = self.decoder(start, torch.ones_like(start), states, states_mask)[:, 0].float().log_softmax(-1)
        first_prob = first.gather(1, self.answer_ids[:, 1][None, :].expand(b, a))  # (B, A)
        top = first_prob.topk(k, dim=1).indices  # (B, k)
        ids, mask = self.answer_ids[top].flatten(0, 1), self.answer_mask[top].flatten(0, 1)  # (B*k, La)
        rep = lambda x: x.repeat_interleave(k, dim=0)  # noqa: E731
        logits = self.decoder(ids, mask, rep(states), rep(states_mask))
        # as ALBEF's rank_answer: the first token's log-probability plus the answer's log-likelihood (which holds
        # that first token too, so it counts twice, as in the released code)
        scores = distill.answer_log_likelihood(logits, ids, mask).view(b, k) + first_prob.gather(1, top)
        out = torch.full((b, a), float("-inf"), device=states.device)
        return out.scatter(1, top, scores)


@dataclass
class AlbefQAOutput:
    """One training forward of :class:`AlbefQA`: decoder logits of each question's answer (and the teacher's)."""

    logits: Tensor  # (B, La, V)
    answer_ids: Tensor  # (B, La)
    answer_mask: Tensor  # (B, La)
    teacher: Tensor | None
    alpha: float


def albef_qa_losses(out: AlbefQAOutput) -> dict[str, Tensor]:
    """The answer LM loss (distilled when the output has a teacher) and its alpha."""
    loss = distill.answer_lm_loss(out.logits, out.answer_ids, out.answer_mask, out.teacher, out.alpha)
    return {"loss": loss, "loss_qa": loss.detach(), "alpha": torch.tensor(out.alpha)}


@dataclass
class AlbefOutput:
    """What one ALBEF forward pass produces for :func:`albef_losses`; unused terms stay None.

    Attributes:
        terms: the enabled objectives.
        alpha: this forward's distillation weight.
        temp: the (clamped) temperature.
        itc_i2t, itc_t2i: ``(B, B + M)`` student similarities / temperature against the momentum batch + queue.
        itc_i2t_m, itc_t2i_m: the momentum model's, on the same grid.
        itc_positives: ``(B, B + M)`` bool positives of each row.
        itm_logits: ``(3B, 2)`` in :func:`vlp.losses.matching.vtm_pair_indices` order.
        mlm_logits, mlm_labels, mlm_teacher: ``(B, L, V)``, ``(B, L)``, ``(B, L, V)`` (teacher None without MoD); with
            ``mlm_logits="masked"`` the masked positions' alone, ``(P, V)``, ``(P,)``, ``(P, V)``.
    """

    terms: tuple[str, ...]
    alpha: float
    temp: Tensor
    itc_i2t: Tensor | None = None
    itc_t2i: Tensor | None = None
    itc_i2t_m: Tensor | None = None
    itc_t2i_m: Tensor | None = None
    itc_positives: Tensor | None = None
    itm_logits: Tensor | None = None
    mlm_logits: Tensor | None = None
    mlm_labels: Tensor | None = None
    mlm_teacher: Tensor | None = None


def albef_losses(out: AlbefOutput, ctx: StepContext | None = None) -> dict[str, Tensor]:
    """ITC + MLM + ITM of one forward pass (eq. 5), each in the paper's logged form (:mod:`vlp.losses.distill`).

    Returns:
        ``{"temp", "alpha", "loss_itc", "loss_itm", "loss_mlm", "loss"}`` (enabled terms only).
    """
    result = {"temp": out.temp.detach(), "alpha": torch.tensor(out.alpha)}
    if "itc" in out.terms:
        i2t, t2i = built(out.itc_i2t, "itc_i2t"), built(out.itc_t2i, "itc_t2i")
        i2t_m, t2i_m = built(out.itc_i2t_m, "itc_i2t_m"), built(out.itc_t2i_m, "itc_t2i_m")
        positives = built(out.itc_positives, "itc_positives")
        result["loss_itc"] = distill.itc_distill_loss(i2t, t2i, i2t_m, t2i_m, positives, out.alpha)
    if "itm" in out.terms:
        result["loss_itm"] = losses.vtm_loss(built(out.itm_logits, "itm_logits"))
    if "mlm" in out.terms:
        logits, labels = built(out.mlm_logits, "mlm_logits"), built(out.mlm_labels, "mlm_labels")
        result["loss_mlm"] = distill.mlm_distill_loss(logits, labels, out.mlm_teacher, out.alpha)
    first, *rest = (result[f"loss_{term}"] for term in out.terms)  # the config allows no empty losses
    result["loss"] = sum(rest, first)
    return result


def albef_step(model: nn.Module, batch: PretrainBatch, ctx: StepContext | None = None) -> dict[str, Tensor]:
    """One training step's losses: the module's forward (``model`` may be DDP-wrapped), then :func:`albef_losses`."""
    return albef_losses(model(batch, ctx), ctx)


def _clip_ids(batch: PretrainBatch) -> Tensor:
    if batch.video_index is None:
        raise ValueError("same_video='positive' needs batch.video_index (clip ids)")
    return batch.video_index.to(batch.input_ids.device)


def albef_forward(model: Albef, batch: PretrainBatch, ctx: StepContext) -> AlbefOutput:
    """Everything ALBEF's enabled objectives score for one batch (the module's ``forward``)."""
    cfg, generator = model.cfg, ctx.generator
    b = batch.input_ids.shape[0]
    temp, alpha = model.temperature(), model.alpha()
    if model.training:
        model.steps.add_(1)
    image_feat, visual = model.online.encode_video(batch.video)  # (B, D), tokens (B, S, C)
    text_feat, text = model.online.encode_text(batch.input_ids, batch.attention_mask)  # (B, D), (B, L, C)
    out = AlbefOutput(terms=tuple(cfg.losses), alpha=alpha, temp=temp)
    same_clip = cfg.same_video == "positive"
    idx = _clip_ids(batch) if same_clip else torch.arange(b, device=batch.input_ids.device)
    with torch.no_grad():
        if model.training:
            model.momentum_update()
        image_feat_m, visual_m = model.momentum.encode_video(batch.video)
        text_feat_m, _ = model.momentum.encode_text(batch.input_ids, batch.attention_mask)
        # (B + M, D): torch.cat([image_feat_m, model.image_queue.t().to(image_feat_m)]), without transposing the queue
        image_all = model.queue_rows["image_queue"].with_batch(model.image_queue, image_feat_m)
        text_all = model.queue_rows["text_queue"].with_batch(model.text_queue, text_feat_m)
        if same_clip:
            positives = idx[:, None] == torch.cat([idx, model.idx_queue])[None, :]  # (B, B + M)
        else:
            positives = torch.eye(b, image_all.shape[0], dtype=torch.bool, device=idx.device)
        out.itc_i2t_m, out.itc_t2i_m = image_feat_m @ text_all.t() / temp, text_feat_m @ image_all.t() / temp
    out.itc_i2t, out.itc_t2i = image_feat @ text_all.t() / temp, text_feat @ image_all.t() / temp
    out.itc_positives = positives
    if model.training and cfg.queue_size:  # every rank writes the same gathered batch: the queues stay equal
        gather = ctx.gather_nograd
        images, texts = gather(image_feat_m), gather(text_feat_m)
        ids = gather(idx) if same_clip else torch.full((images.shape[0],), -1, device=idx.device)
        model.enqueue(images, texts, ids)
    if "itm" in cfg.losses:
        feats = (image_feat, text_feat, image_feat_m, text_feat_m)
        out.itm_logits = _itm(model, out, feats, visual.tokens, text, idx, same_clip, ctx)
    if "mlm" in cfg.losses:
        if ctx.vocab is None:
            raise ValueError("MLM is enabled but the step has no vocabulary: StepContext(vocab=TextVocab.of(tok))")
        out.mlm_logits, out.mlm_labels, out.mlm_teacher = _mlm(model, batch, visual, visual_m, ctx.vocab, generator)
    return out


def _itm(
    model: Albef,
    out: AlbefOutput,
    feats: tuple[Tensor, Tensor, Tensor, Tensor],
    visual_tokens: Tensor,
    text: Any,
    idx: Tensor,
    same_clip: bool,
    ctx: StepContext,
) -> Tensor:
    """The fused positives and one hard negative per image and per text -> ``(3B, 2)`` ITM logits.

    ``feats`` = (online image, online text, momentum image, momentum text) features. As in ALBEF, an image's
    negative text is drawn from softmax(image · momentum texts / temp) and a text's negative image from
    softmax(text · momentum images / temp): the two ITC grids of the batch.
    """
    cfg, b = model.cfg, visual_tokens.shape[0]
    tokens, mask, vis, offset = text.tokens, text.attention_mask, visual_tokens, 0
    image, txt, image_m, text_m = (f.detach() for f in feats)
    pool_idx = idx
    if cfg.itm_negatives_from == "global" and ctx.world > 1:
        # the paper: negatives from the whole batch; tokens gathered with gradient (they are fused), features
        # and ids without (they only weight the draw)
        tokens, vis = ctx.gather(tokens), ctx.gather(vis)
        mask, pool_idx = ctx.gather_nograd(mask), ctx.gather_nograd(idx)
        image, txt, image_m, text_m = (ctx.gather_nograd(f) for f in (image, txt, image_m, text_m))
        offset = ctx.rank * b
    with torch.no_grad():
        sim_i2t, sim_t2i = image @ text_m.t() / out.temp, txt @ image_m.t() / out.temp  # (P, P) each
        exclude = pool_idx[:, None] == pool_idx[None, :] if same_clip else None
        neg_t, neg_v = losses.sample_hard_negatives(
            sim_i2t, sim_t2i, generator_on(ctx.generator, sim_i2t), mode=cfg.itm_negatives,
            hard_fraction=cfg.itm_hard_fraction, exclude=exclude,
        )  # fmt: skip
        rows = torch.arange(b, device=sim_i2t.device) + offset
        neg_t, neg_v = neg_t[rows], neg_v[rows]
    t_idx = torch.cat([rows, rows, neg_t])  # (3B,): positives, (t_i, v_neg), (t_neg, v_i)
    v_idx = torch.cat([rows, neg_v, rows])
    return itm_logits(model, tokens[t_idx], mask[t_idx], vis[v_idx])


def _mlm(
    model: Albef,
    batch: PretrainBatch,
    visual: FrameOutput,
    visual_m: FrameOutput,
    vocab: TextVocab,
    gen: torch.Generator | None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Masked tokens predicted from the fused sequence; the momentum model's prediction on the same masks."""
    specials = torch.tensor(vocab.special_ids, device=batch.input_ids.device)
    special = (batch.input_ids.unsqueeze(-1) == specials).any(-1)  # (B, L)
    masked_ids, labels = losses.mask_tokens(
        batch.input_ids.cpu(),
        vocab_size=vocab.size,
        mask_token_id=vocab.mask_token_id,
        special_mask=special.cpu() | ~batch.attention_mask.bool().cpu(),
        prob=model.cfg.mlm_prob,
        generator=gen,
    )
    masked_ids, labels = masked_ids.to(batch.input_ids.device), labels.to(batch.input_ids.device)
    # the positions scored: every one (released code), or the masked ones alone, the only ones with a loss
    scored = labels != losses.IGNORE_INDEX if model.cfg.mlm_logits == "masked" else None
    text = model.online.text(masked_ids, batch.attention_mask)
    fused = model.fuse(text.tokens, batch.attention_mask, visual.tokens).text
    logits = built(model.online.mlm_head, "mlm_head")(fused if scored is None else fused[scored])
    teacher = None
    if model.cfg.distill:
        with torch.no_grad():
            text_m = model.momentum.text(masked_ids, batch.attention_mask)
            fused_m = built(model.momentum.fusion, "fusion")(text_m.tokens, batch.attention_mask, visual_m.tokens)
            teacher = built(model.momentum.mlm_head, "mlm_head")(
                fused_m.text if scored is None else fused_m.text[scored]
            )
    return logits, labels if scored is None else labels[scored], teacher


# --------------------------------------------------------------------------- the family


if TYPE_CHECKING:
    from vlp.settings import ModelConfig, QAConfig, RetrievalConfig


class AlbefFamily(TwoTowerMethods, ForwardAnswers):
    """ALBEF as a :class:`vlp.models.family.Family`: ITC + MLM + ITM with momentum distillation; ITM re-ranks."""

    name = "albef"
    kinds = KINDS  # declared with the family's spec, where the registry reads them without this module
    default_losses: tuple[str, ...] = LOSS_TERMS
    # the fusion encoder and the heads (the online model's: the momentum copy is not trained), and the QA decoder
    lr_groups = LrGroups(fusion=("online.fusion.", "online.mlm_head.", "itm_head.", "decoder."))

    def weights(self, model: ModelConfig) -> tuple[str, str]:
        return size_weights(model, size(self.name, model.preset))

    def config(self, model: ModelConfig, vocab_size: int, num_entities: int = 0) -> AlbefConfig:
        """The ALBEF config of a ``model`` config section (:class:`vlp.settings.ModelConfig`) at the size
        ``model.preset`` names (:data:`vlp.models.albef.spec.SIZES`)."""
        if num_entities:
            raise ValueError("ALBEF has no prompt-entity head (PEM is ALPRO's)")
        own: AlbefSettings = model.families[self.name]
        chosen = size(self.name, model.preset)
        video_init, text_init = size_weights(model, chosen)
        video_rev, text_rev = init_revisions(model)
        frames = {"img_size": model.img_size, "num_frames": model.num_frames} | chosen.video_sizes(model.img_size)
        video = FrameViTConfig(**frames, init=video_init, init_revision=video_rev, temporal=own.temporal)
        text = bert_text(chosen, vocab_size, model.max_len, text_init)
        return AlbefConfig(
            video,
            replace(text, init_revision=text_rev),
            embed_dim=model.embed_dim,
            losses=tuple(model.losses or LOSS_TERMS),
            momentum=own.momentum,
            queue_size=own.queue_size,
            distill=own.distill,
            alpha=own.alpha,
            alpha_ramp_steps=own.alpha_ramp_steps,
            itm_negatives=own.vtm_negatives,
            itm_hard_fraction=own.vtm_hard_fraction,
            itm_negatives_from=own.itm_negatives_from,
            same_video=own.same_video_vtc,
            mlm_logits=own.mlm_logits,
            pixel_mean=rgb(model.pixel_mean) if model.pixel_mean else CLIP_MEAN,
            pixel_std=rgb(model.pixel_std) if model.pixel_std else CLIP_STD,
        )

    def config_from_dict(self, data: dict[str, Any]) -> AlbefConfig:
        return AlbefConfig.from_dict(data)

    def build(self, kind: str, config: AlbefConfig, num_answers: int = 0) -> nn.Module:
        if kind in (self.kinds.pretrained, self.kinds.retrieval):
            return Albef(config)
        if kind == self.kinds.qa:
            return AlbefQA(config, num_answers)
        raise ValueError(f"ALBEF has no {kind!r} model; its kinds are {self.kinds.all()}")

    def task_config(self, config: AlbefConfig, task: Task, section: RetrievalConfig | QAConfig) -> AlbefConfig:
        """Retrieval fine-tuning: ITC + ITM (the section's losses: contrastive is ITC, matching ITM) with
        distillation, and the section's negative and same-clip rules (``same_clip_contrastive`` is ``same_video``,
        which rules ITM's negatives too; ALBEF has no ``same_clip_matching`` of its own)."""
        if task == "qa":  # the code ramps alpha over the first QA epoch too
            section = qa_section(section)
            return replace(
                config,
                alpha_ramp_steps=-1,
                queue_size=0,
                answer_len=section.answer_len,
                answer_topk=section.answer_topk,
            )  # QA has no queue (nor ITC)
        section = retrieval_section(section)
        terms = {"contrastive": "itc", "matching": "itm"}
        return replace(
            config,
            losses=tuple(terms[t] for t in section.losses),
            alpha_ramp_steps=-1,  # the code ramps alpha over the first fine-tuning epoch too
            itm_negatives=section.matching_negatives,
            itm_hard_fraction=section.matching_hard_fraction,
            same_video=section.same_clip_contrastive,
        )

    def prepare(self, config: AlbefConfig, batches_per_epoch: int, global_batch: int) -> AlbefConfig:
        """Alpha's ramp of one epoch (``alpha_ramp_steps=-1``) and the queue check, before the first step."""
        config.check_queue(global_batch)
        if config.alpha_ramp_steps < 0:
            config = replace(config, alpha_ramp_steps=max(1, batches_per_epoch))
        return config

    def init_from(self, model: nn.Module, checkpoint: str, task: Task) -> list[str]:
        """Retrieval: every weight, the momentum model and the queues from the starting model. QA: the towers and
        the fusion, the answer decoder as a copy of the fusion (and its LM head from the MLM head), as ALBEF's VQA
        does; the momentum copies start equal. Alpha's ramp restarts."""

        if task == "retrieval":
            skipped = load_pretrained_weights(checkpoint, model)
        else:
            new = ("decoder.", "momentum_decoder.", "momentum.", "answer_ids", "answer_mask")
            skipped = load_pretrained_weights(checkpoint, model, allow_missing=new)
            mlm = {k.removeprefix("online.mlm_head."): v for k, v in read_model_weights(checkpoint).items()
                   if k.startswith("online.mlm_head.")}  # fmt: skip
            if not mlm:
                log.warning(
                    "finetune_qa: %s has no MLM head (a retrieval model); the answer decoder's LM head starts from "
                    "its tied word embeddings with a random transform", checkpoint,
                )  # fmt: skip
            qa = cast(AlbefQA, model)  # what build made for QA
            qa.decoder.init_from(qa.online.text, built(qa.online.fusion, "fusion"), mlm)
            qa.sync_momentum()
        cast(Albef | AlbefQA, model).steps.zero_()
        return skipped

    def set_answers(self, model: nn.Module, answers: list[str], tokenizer: Any) -> None:
        cast(AlbefQA, model).set_answers(answers, tokenizer)

    def qa_step(self, model: nn.Module, batch: dict[str, Tensor], ctx: StepContext) -> dict[str, Tensor]:
        out = model(batch["video"], batch["input_ids"], batch["attention_mask"], batch["label"])
        return albef_qa_losses(out)

    def train_step(self, model: nn.Module, batch: PretrainBatch, ctx: StepContext) -> dict[str, Tensor]:
        return albef_step(model, batch, ctx)

    def towers(self, model: nn.Module) -> Any:
        return model.online

    def reranks(self, model: nn.Module) -> bool:
        return getattr(model, "itm_head", None) is not None

    def pair_logits(self, model: nn.Module, text_tokens: Tensor, text_mask: Tensor, video_tokens: Tensor) -> Tensor:
        return itm_logits(cast(Albef, model), text_tokens, text_mask, video_tokens)  # what build made for retrieval


FAMILY = AlbefFamily()
if TYPE_CHECKING:  # mypy holds the family to the protocols it meets: the core one, QA and re-ranking
    from vlp.models.family import AnswersQuestions, PairScorer

    _qa: AnswersQuestions[AlbefConfig] = FAMILY
    _reranking: PairScorer[AlbefConfig] = FAMILY
