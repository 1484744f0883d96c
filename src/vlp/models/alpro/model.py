"""ALPRO (Align and Prompt, arXiv 2112.09583): unimodal towers, fusion, heads, and the pre-training losses.

Modules return typed outputs (:class:`AlproOutput`); the objectives are functions in :mod:`vlp.losses`,
combined by :func:`alpro_losses`. :func:`alpro_step` (forward, then the losses) is the step function the
training loop calls, and :data:`FAMILY` is ALPRO as a :class:`vlp.models.family.Family`.

- :class:`DualEncoder`: TimeSformer video tower + 6-layer BERT text tower, each projected to a shared
  normalised ``embed_dim`` space, with a learnable temperature (init 0.07, clamped to [0.001, 0.5]).
  It is both the *prompter* (trained with VTC only, then frozen) and the unimodal half of ALPRO.
- :class:`Alpro`: a :class:`DualEncoder` + the multimodal encoder (last 6 BERT layers over
  ``[text; video]`` tokens) + the MLM head (tied to the word embeddings), the binary VTM head on the
  fused text [CLS], and the PEM MLP ``width -> 2*width -> M`` (ReLU between, as the released code's
  ``mpm_head``; the paper only says "e.g. MLP") on box-pooled fused video tokens.

One pre-training step (eq. 6, the unweighted sum of the enabled terms):

1. unimodal features -> **VTC** over the gathered global batch (computed by the losses, from the features);
2. **VTM**: one hard negative text per video and one video per text from the in-batch similarity
   softmax, positive excluded; the ``3B`` pairs are fused once; labels ``[1]*B + [0]*2B``;
3. **PEM**: a random box (30-50% of the frame, snapped to the patch grid, same in every frame); the
   frozen prompter embeds the crop and scores it against the prompt bank -> soft pseudo-label; the
   fused video tokens of the *positive* pairs inside the box are mean-pooled -> MLP -> soft CE;
4. **MLM**: 15% of the text tokens masked (80/10/10), fused with the unmasked video, predicted.

The PEM fused tokens are those of the positive VTM pairs (the first ``B`` rows), so PEM costs no
extra fusion pass; MLM needs one (its text is corrupted).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlp import losses
from vlp.models.alpro.spec import KINDS, SIZES, AlproSettings
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
from vlp.models.layers.timesformer import TimeSformer, TimeSformerConfig, VideoEncoderOutput
from vlp.models.text import MLMHead, MultimodalEncoder, TextConfig, TextEncoder, TextOutput, load_bert_weights
from vlp.settings import retrieval_section
from vlp.weights import load_pretrained_weights

if TYPE_CHECKING:
    from vlp.settings import ModelConfig, QAConfig, RetrievalConfig

LOSS_TERMS = ("vtc", "pem", "mlm", "vtm")
# model.json keys of removed switches (docs/results/speed.md) that a saved config may hold and none needs: the frozen
# prompter's crop size and precision (pre-training only) and VTM's pass for [CLS] alone (the full pass's scores to
# float rounding)
DROPPED_KEYS = ("pem_prompter_size", "pem_prompter_precision", "vtm_fusion")


@dataclass(frozen=True)
class AlproConfig:
    """Sizes and objective switches of an ALPRO model (and of its prompter)."""

    video: TimeSformerConfig = field(default_factory=TimeSformerConfig.tiny)
    text: TextConfig = field(default_factory=TextConfig.tiny)
    embed_dim: int = 256  # VTC projection size (paper: 256)
    init_temp: float = 0.07  # learnable VTC temperature, clamped to [0.001, 0.5] (ALPRO code)
    num_entities: int = 0  # M, the prompt-bank size; 0 = no PEM head
    losses: tuple[str, ...] = LOSS_TERMS  # enabled terms of eq. 6 (Table 1 ablations switch them off)
    mlm_prob: float = 0.15  # share of non-special text tokens masked for MLM
    mlm_logits: Literal["all", "masked"] = "all"  # MLM's logits at every text position, or the masked ones alone
    pem_area: tuple[float, float] = (0.3, 0.5)  # PEM box area, fraction of the frame (paper §3.4)
    pem_ratio: tuple[float, float] = (0.3, 1 / 0.3)  # PEM box aspect ratio h/w (ALPRO code)
    pem_rule: Literal["paper", "official_code"] = "paper"  # pseudo-label discard rule (see vlp.losses.entity)
    pem_threshold: float = 0.2  # discard threshold of the rule
    pem_crop: Literal["resize", "zero_outside"] = "resize"  # prompter input: real crop, or frame blacked outside
    # Per-channel normalisation of [0, 1] pixels the model was trained with (it belongs to the weights: data
    # steps read it from here). 0.5/0.5 = timm's ImageNet-21k ViT-B/16, the paper's init; the released ALPRO
    # configs use CLIP's (0.48145466, 0.4578275, 0.40821073) / (0.26862954, 0.26130258, 0.27577711).
    pixel_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    pixel_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # VTM negatives: "hard" (paper and code: drawn by in-batch VTC similarity), "uniform", or "mixed" (hard with
    # probability vtm_hard_fraction). At CPU scale hard draws are ~90% same-scene clips
    # (benchmarks/probes/vtm_probe.py).
    vtm_negatives: Literal["hard", "uniform", "mixed"] = "hard"
    vtm_hard_fraction: float = 0.5
    # Another caption of the same clip in the batch: ALPRO treats it as a VTC negative and may draw it as a VTM
    # negative ("negative" / "draw"); ALBEF makes it a VTC positive and never draws it ("positive" / "exclude").
    same_video_vtc: Literal["negative", "positive"] = "negative"
    same_video_vtm: Literal["draw", "exclude"] = "draw"

    def __post_init__(self) -> None:
        unknown = sorted(set(self.losses) - set(LOSS_TERMS))
        if unknown or not self.losses:
            raise ValueError(f"losses must be a non-empty subset of {LOSS_TERMS}, got {list(self.losses)}")
        if "pem" in self.losses and self.num_entities < 1:
            raise ValueError("PEM needs num_entities >= 1 (the prompt-bank size); set it or drop 'pem' from losses")
        if self.vtm_negatives not in losses.matching.NEGATIVES or not 0.0 <= self.vtm_hard_fraction <= 1.0:
            raise ValueError(
                f"vtm_negatives must be one of {losses.matching.NEGATIVES} and vtm_hard_fraction in [0, 1], got "
                f"{self.vtm_negatives!r} / {self.vtm_hard_fraction}"
            )
        if self.same_video_vtc not in ("negative", "positive") or self.same_video_vtm not in ("draw", "exclude"):
            raise ValueError(
                f"same_video_vtc must be 'negative' or 'positive' and same_video_vtm 'draw' or 'exclude', got "
                f"{self.same_video_vtc!r} / {self.same_video_vtm!r}"
            )
        if self.mlm_logits not in ("all", "masked"):
            raise ValueError(f"mlm_logits must be 'all' or 'masked', got {self.mlm_logits!r}")
        if len(self.pixel_mean) != 3 or len(self.pixel_std) != 3 or min(self.pixel_std) <= 0:
            raise ValueError(f"pixel_mean/pixel_std need 3 values, std > 0: {self.pixel_mean} / {self.pixel_std}")

    def black(self) -> Tensor:
        """``(3,)``: a black pixel after normalisation (what ``pem_crop=zero_outside`` fills with)."""
        return -torch.tensor(self.pixel_mean) / torch.tensor(self.pixel_std)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, keep_init: bool = False) -> AlproConfig:
        """The config ``dataclasses.asdict`` gave (a ``model.json``'s ``config``); the towers' ``init`` (and its
        revision) is cleared unless ``keep_init``: a saved model's weights come from its checkpoint, so rebuilding
        it must not fetch its starting weights again (``model.json`` keeps them, and ``lineage.upstream`` the
        commit or file digest they resolved to). Keys of :data:`DROPPED_KEYS` are left out."""
        cleared = {} if keep_init else {"init": "", "init_revision": ""}
        data = {key: value for key, value in data.items() if key not in DROPPED_KEYS}
        video = TimeSformerConfig(**(data["video"] | cleared))
        text_fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in (data["text"] | cleared).items()
        }
        text = TextConfig(**text_fields)
        fields: dict[str, Any] = dict(data) | {"video": video, "text": text, "losses": tuple(data["losses"])}
        fields |= {key: tuple(data[key]) for key in ("pem_area", "pem_ratio", "pixel_mean", "pixel_std") if key in data}
        return cls(**fields)

    @classmethod
    def tiny(cls, vocab_size: int, **overrides: Any) -> AlproConfig:
        """2+2 text layers of width 64, a 2-layer width-64 TimeSformer on 32 px frames: seconds on a CPU."""
        base: dict[str, Any] = {
            "video": TimeSformerConfig.tiny(),
            "text": TextConfig.tiny(vocab_size=vocab_size),
            "embed_dim": 32,
        }
        return cls(**(base | overrides))


class DualEncoder(nn.Module):
    """Video and text towers projected to one normalised space (the prompter, and ALPRO's unimodal half)."""

    def __init__(
        self, video: TimeSformerConfig, text: TextConfig, *, embed_dim: int, init_temp: float, load_text: bool = True
    ) -> None:
        """``video.init`` / ``text.init`` name the starting weights (the video tower loads its own; the text
        tower takes BERT's embeddings and first ``text_layers`` layers unless ``load_text`` is False)."""
        super().__init__()
        self.video = TimeSformer(video)
        self.text = TextEncoder(text)
        if text.init and load_text:
            load_bert_weights(self.text, None, text.init, revision=text.init_revision)
        self.video_proj = nn.Linear(self.video.width, embed_dim)
        self.text_proj = nn.Linear(self.text.width, embed_dim)
        self.temp = nn.Parameter(torch.tensor(float(init_temp)))

    def temperature(self) -> Tensor:
        """The clamped temperature (0-d)."""
        return losses.clamp_temperature(self.temp)

    def encode_video(self, video: Tensor) -> tuple[Tensor, VideoEncoderOutput]:
        """``(B, T, 3, H, W)`` -> (unit-norm ``(B, D)`` feature, encoder output)."""
        out = self.video(video)
        return F.normalize(self.video_proj(out.tokens[:, 0]), dim=-1), out

    def encode_text(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, TextOutput]:
        """``(B, L)`` ids + mask -> (unit-norm ``(B, D)`` feature, encoder output)."""
        out = self.text(input_ids, attention_mask)
        return F.normalize(self.text_proj(out.tokens[:, 0]), dim=-1), out

    def forward(self, batch: PretrainBatch, ctx: StepContext | None = None) -> AlproOutput:
        """Prompter pre-training: the unimodal features VTC scores (:func:`alpro_losses`)."""
        video_feat, _ = self.encode_video(batch.video)
        text_feat, _ = self.encode_text(batch.input_ids, batch.attention_mask)
        return AlproOutput(terms=("vtc",), video_feat=video_feat, text_feat=text_feat, temp=self.temperature())


class Alpro(nn.Module):
    """ALPRO: :class:`DualEncoder` + multimodal encoder + MLM, VTM and PEM heads."""

    def __init__(self, cfg: AlproConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.dual = DualEncoder(cfg.video, cfg.text, embed_dim=cfg.embed_dim, init_temp=cfg.init_temp, load_text=False)
        width = cfg.text.width
        # Only what the enabled objectives use is built: DDP (find_unused_parameters=False) requires every
        # parameter to get a gradient. VTC alone needs no fusion; MLM, VTM and PEM all fuse.
        fused = bool(set(cfg.losses) & {"mlm", "vtm", "pem"})
        self.fusion = MultimodalEncoder(cfg.text, video_width=self.dual.video.width) if fused else None
        self.mlm_head = MLMHead(cfg.text, self.dual.text.word_embeddings) if "mlm" in cfg.losses else None
        self.vtm_head = nn.Linear(width, 2) if "vtm" in cfg.losses else None
        if "vtc" not in cfg.losses:  # the projections then only rank VTM's hard negatives, without a gradient
            for p in (*self.dual.video_proj.parameters(), *self.dual.text_proj.parameters(), self.dual.temp):
                p.requires_grad_(False)
        self.pem_head = (
            nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, cfg.num_entities))
            if "pem" in cfg.losses
            else None
        )
        if cfg.text.init:  # BERT layers 1..6 -> text tower, 7..12 -> fusion (ALPRO §3.4), MLM head from BERT's
            load_bert_weights(
                self.dual.text, self.fusion, cfg.text.init, mlm_head=self.mlm_head, revision=cfg.text.init_revision
            )

    def fuse(self, text_tokens: Tensor, text_mask: Tensor, video_tokens: Tensor) -> Any:
        """``[text; video]`` through the multimodal encoder -> :class:`vlp.models.text.FusionOutput`."""
        if self.fusion is None:
            raise ValueError(f"this ALPRO has no multimodal encoder: losses {list(self.cfg.losses)} use none")
        return self.fusion(text_tokens, text_mask, video_tokens)

    def forward(self, batch: PretrainBatch, ctx: StepContext | None = None) -> AlproOutput:
        """Everything the enabled objectives score, for one batch (:func:`alpro_forward`)."""
        return alpro_forward(self, batch, ctx or StepContext())


class AlproQA(nn.Module):
    """ALPRO for open-ended video QA: the question and the clip fused, an MLP over the fused [CLS] -> answer logits.

    The classifier follows the released code (``Linear(h, 2h), ReLU, Linear(2h, A)``). Parameter names of the
    towers and the fusion match :class:`Alpro` (``dual.*``, ``fusion.*``), so a pre-trained ALPRO checkpoint loads
    into it with only the classifier left at its initialisation.
    """

    def __init__(self, cfg: AlproConfig, num_answers: int) -> None:
        super().__init__()
        if num_answers < 1:
            raise ValueError(f"AlproQA needs at least one answer class, got {num_answers}")
        self.cfg = cfg
        self.dual = DualEncoder(cfg.video, cfg.text, embed_dim=cfg.embed_dim, init_temp=cfg.init_temp, load_text=False)
        width = cfg.text.width
        self.fusion = MultimodalEncoder(cfg.text, video_width=self.dual.video.width)
        if cfg.text.init:
            load_bert_weights(self.dual.text, self.fusion, cfg.text.init, revision=cfg.text.init_revision)
        self.classifier = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, num_answers))

    def forward(self, video: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """``(B, T, 3, H, W)`` clips + ``(B, L)`` question ids/mask -> ``(B, A)`` answer logits."""
        video_out = self.dual.video(video)
        text_out = self.dual.text(input_ids, attention_mask)
        fused = self.fusion(text_out.tokens, text_out.attention_mask, video_out.tokens)
        return self.classifier(fused.cls)


def vtm_logits(model: Alpro, text_tokens: Tensor, text_mask: Tensor, video_tokens: Tensor) -> Tensor:
    """Fuse aligned rows of ``(P, L, C)`` text tokens and ``(P, 1+N, C)`` video tokens -> ``(P, 2)`` VTM logits."""
    if model.vtm_head is None:
        raise ValueError(f"this ALPRO has no VTM head: it was built for losses {list(model.cfg.losses)}")
    return model.vtm_head(model.fuse(text_tokens, text_mask, video_tokens).cls)


@dataclass
class PemContext:
    """What PEM needs besides the model (``StepContext.extra``): the frozen prompter and its prompt bank."""

    prompter: DualEncoder
    bank_video: Tensor  # (M, D) video-template entity embeddings
    bank_image: Tensor | None = None  # (M, D) image-template entity embeddings, for still images


@dataclass
class AlproOutput:
    """What one ALPRO forward pass produces for the losses (:func:`alpro_losses`); unused terms stay None.

    Attributes:
        terms: the enabled objectives, in eq. 6's order of the config.
        video_feat, text_feat: ``(B, D)`` unit-norm projected [CLS] features (VTC).
        temp: the clamped temperature (0-d).
        vtc_positives: ``(B, W*B)`` bool, pairs VTC counts as positive (``same_video_vtc="positive"``), or None
            for the diagonal.
        vtm_logits: ``(3B, 2)`` match logits in :func:`vlp.losses.matching.vtm_pair_indices` order.
        pem_logits, pem_target, pem_keep: ``(B, M)`` entity logits, ``(B, M)`` prompter pseudo-labels, ``(B,)``
            which pseudo-labels the discard rule keeps.
        mlm_logits, mlm_labels: ``(B, L, V)`` and ``(B, L)`` (-100 = not masked); with ``mlm_logits="masked"`` the
            masked positions' alone, ``(P, V)`` and ``(P,)``.
    """

    terms: tuple[str, ...]
    video_feat: Tensor
    text_feat: Tensor
    temp: Tensor
    vtc_positives: Tensor | None = None
    vtm_logits: Tensor | None = None
    pem_logits: Tensor | None = None
    pem_target: Tensor | None = None
    pem_keep: Tensor | None = None
    mlm_logits: Tensor | None = None
    mlm_labels: Tensor | None = None


def alpro_losses(out: AlproOutput, ctx: StepContext | None = None) -> dict[str, Tensor]:
    """The enabled ALPRO objectives of one forward pass; ``"loss"`` is their unweighted sum (eq. 6).

    ``ctx.gather`` / ``ctx.rank`` give VTC its global batch (identity / 0 on one process).

    Returns:
        ``{"temp", "loss_vtc", "loss_vtm", "loss_pem", "pem_kept", "loss_mlm", "loss"}`` (enabled terms only).
    """
    ctx = ctx or StepContext()
    result = {"temp": out.temp.detach()}
    if "vtc" in out.terms:
        result["loss_vtc"] = losses.vtc_loss(
            out.video_feat, out.text_feat, out.temp, gather=ctx.gather, rank=ctx.rank, positives=out.vtc_positives
        )
    if "vtm" in out.terms:
        result["loss_vtm"] = losses.vtm_loss(built(out.vtm_logits, "vtm_logits"))
    if "pem" in out.terms:
        keep = built(out.pem_keep, "pem_keep")
        result["loss_pem"] = losses.pem_loss(
            built(out.pem_logits, "pem_logits"), built(out.pem_target, "pem_target"), keep
        )
        result["pem_kept"] = keep.float().mean().detach()
    if "mlm" in out.terms:
        result["loss_mlm"] = losses.mlm_loss(built(out.mlm_logits, "mlm_logits"), built(out.mlm_labels, "mlm_labels"))
    first, *rest = (result[f"loss_{term}"] for term in out.terms)  # the config allows no empty losses
    result["loss"] = sum(rest, first)
    return result


def alpro_step(model: nn.Module, batch: PretrainBatch, ctx: StepContext | None = None) -> dict[str, Tensor]:
    """One training step's losses: the module's forward (``model`` may be DDP-wrapped), then :func:`alpro_losses`."""
    return alpro_losses(model(batch, ctx), ctx)


def alpro_forward(model: Alpro, batch: PretrainBatch, ctx: StepContext) -> AlproOutput:
    """The forward pass of every enabled ALPRO objective (the module's ``forward``; DDP needs it there).

    Random draws (``ctx.generator``, else the global generator) come in a fixed order: VTM negatives, PEM boxes,
    MLM masks. ``ctx.extra`` must be a :class:`PemContext` when PEM is enabled, and ``ctx.vocab`` set for MLM.
    """
    cfg, generator = model.cfg, ctx.generator
    video_feat, video_out = model.dual.encode_video(batch.video)  # (B, D), tokens (B, 1+N, C)
    text_feat, text_out = model.dual.encode_text(batch.input_ids, batch.attention_mask)  # (B, D), (B, L, C)
    out = AlproOutput(
        terms=tuple(cfg.losses), video_feat=video_feat, text_feat=text_feat, temp=model.dual.temperature()
    )
    if "vtc" in cfg.losses and cfg.same_video_vtc == "positive":
        ids = _video_index(batch)
        out.vtc_positives = ids[:, None] == ctx.gather_nograd(ids)[None, :]  # (B, W*B)
    positive = None
    if "vtm" in cfg.losses or "pem" in cfg.losses:
        exclude = None
        if cfg.same_video_vtm == "exclude":
            ids = _video_index(batch)
            exclude = ids[:, None] == ids[None, :]  # (B, B)
        positive, out.vtm_logits = _vtm(model, video_feat, text_feat, out.temp, video_out, text_out, generator, exclude)
    if "pem" in cfg.losses:
        if not isinstance(ctx.extra, PemContext):
            raise ValueError("PEM is enabled but no prompter/prompt bank was given: StepContext(extra=PemContext(...))")
        fused_video = built(positive, "the fused positive pairs")
        out.pem_logits, out.pem_target, out.pem_keep = _pem(model, batch, fused_video, video_out, ctx.extra, generator)
    if "mlm" in cfg.losses:
        if ctx.vocab is None:
            raise ValueError("MLM is enabled but the step has no vocabulary: StepContext(vocab=TextVocab.of(tok))")
        out.mlm_logits, out.mlm_labels = _mlm(model, batch, video_out, ctx.vocab, generator)
    return out


def _vtm(
    model: Alpro,
    video_feat: Tensor,
    text_feat: Tensor,
    temp: Tensor,
    video_out: VideoEncoderOutput,
    text_out: TextOutput,
    generator: torch.Generator | None,
    exclude: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Fuse positives (and, with VTM, 2B hard negatives); returns (fused positive video tokens, VTM logits)."""
    b = video_feat.shape[0]
    if "vtm" not in model.cfg.losses:
        fused = model.fuse(text_out.tokens, text_out.attention_mask, video_out.tokens)
        return fused.video, None
    with torch.no_grad():
        sim = video_feat @ text_feat.t() / temp  # (B, B) local similarities
        cfg = model.cfg
        neg_t, neg_v = losses.sample_hard_negatives(
            sim, sim.t(), generator_on(generator, sim), mode=cfg.vtm_negatives, hard_fraction=cfg.vtm_hard_fraction,
            exclude=exclude,
        )  # fmt: skip
    t_idx, v_idx = losses.matching.vtm_pair_indices(neg_t, neg_v)  # (3B,), (3B,)
    fused = model.fuse(text_out.tokens[t_idx], text_out.attention_mask[t_idx], video_out.tokens[v_idx])
    return fused.video[:b], built(model.vtm_head, "vtm_head")(fused.cls)  # (B, 1+N, C), (3B, 2)


def prompter_features(cfg: AlproConfig, prompter: DualEncoder, video: Tensor, pixel_boxes: Tensor) -> Tensor:
    """The frozen prompter's unit-norm ``(B, D)`` fp32 features of each clip's box (ALPRO Fig. 3): the box cut out
    of ``(B, T, 3, H, W)`` frames as ``cfg.pem_crop`` says, at the frame size, encoded in the step's precision (an
    enclosing autocast applies). No gradient flows."""
    crops = losses.entity.crop_frames(video, pixel_boxes, mode=cfg.pem_crop, fill=cfg.black())
    with torch.no_grad():
        feat, _ = prompter.encode_video(crops)
    return feat.float()


def _pem(
    model: Alpro,
    batch: PretrainBatch,
    fused_video: Tensor,
    video_out: VideoEncoderOutput,
    pem: PemContext,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Prompting entity modeling on the positive pairs' fused video tokens: (logits, pseudo-labels, keep)."""
    cfg = model.cfg
    b = batch.video.shape[0]
    gh, gw = video_out.grid
    boxes = losses.sample_pem_boxes(
        b, gh, gw, patch_size=cfg.video.patch_size, area=cfg.pem_area, ratio=cfg.pem_ratio, generator=generator
    )
    with torch.no_grad():
        crop_feat = prompter_features(cfg, pem.prompter, batch.video, boxes.pixel_boxes)  # (B, D)
        bank = pem.bank_video.to(crop_feat)
        if pem.bank_image is not None and batch.is_image is not None:
            bank = torch.where(batch.is_image[:, None, None], pem.bank_image.to(crop_feat), bank)  # (B, M, D)
            sims = torch.einsum("bd,bmd->bm", crop_feat, bank)
            pseudo = F.softmax(sims / pem.prompter.temperature(), dim=-1)  # (B, M)
        else:
            pseudo = losses.pseudo_labels(crop_feat, bank, pem.prompter.temperature())  # (B, M)
        keep = losses.pem_keep_mask(pseudo, rule=cfg.pem_rule, threshold=cfg.pem_threshold)  # (B,)
    patch_tokens = fused_video[:, 1:]  # (B, N, C): drop the video [CLS]
    pooled = losses.pool_box_tokens(patch_tokens, boxes.token_mask.to(patch_tokens.device))  # (B, C)
    return built(model.pem_head, "pem_head")(pooled), pseudo, keep  # (B, M), (B, M), (B,)


def _mlm(
    model: Alpro, batch: PretrainBatch, video_out: VideoEncoderOutput, vocab: TextVocab, gen: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Masked language modeling from the fused sequence with the unmasked video: (logits, labels)."""
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
    text_out = model.dual.text(masked_ids, batch.attention_mask)
    fused = model.fuse(text_out.tokens, batch.attention_mask, video_out.tokens)
    head = built(model.mlm_head, "mlm_head")
    if model.cfg.mlm_logits == "masked":  # the positions with a loss alone: (P, V), (P,)
        scored = labels != losses.IGNORE_INDEX
        return head(fused.text[scored]), labels[scored]
    return head(fused.text), labels  # (B, L, V), (B, L)


def _video_index(batch: PretrainBatch) -> Tensor:
    if batch.video_index is None:
        raise ValueError("same_video_vtc='positive' / same_video_vtm='exclude' need batch.video_index (clip ids)")
    return batch.video_index.to(batch.input_ids.device)


# --------------------------------------------------------------------------- the family


def small_towers(img_size: int, num_frames: int, vocab_size: int, max_len: int) -> tuple[Any, Any]:
    """The ``small`` size's towers (:data:`vlp.models.alpro.spec.SIZES`) at random init."""
    chosen = SIZES["small"]
    video = TimeSformerConfig(img_size=img_size, num_frames=num_frames, **chosen.video_sizes(img_size))
    return video, bert_text(chosen, vocab_size, max_len, "")


class AlproFamily(TwoTowerMethods, ForwardAnswers):
    """ALPRO as a :class:`vlp.models.family.Family`: a prompter, then VTC + PEM + MLM + VTM; VTM re-ranks."""

    name = "alpro"
    kinds = KINDS  # declared with the family's spec, where the registry reads them without this module
    default_losses: tuple[str, ...] = LOSS_TERMS
    lr_groups = LrGroups(fusion=("fusion.", "vtm_head.", "mlm_head.", "pem_head.", "classifier."))

    def weights(self, model: ModelConfig) -> tuple[str, str]:
        """``(video, text)`` starting weights of a ``model`` config section (``""`` = random init)."""
        return size_weights(model, size(self.name, model.preset))

    def config(self, model: ModelConfig, vocab_size: int, num_entities: int = 0) -> AlproConfig:
        """The ALPRO config of a ``model`` config section (:class:`vlp.settings.ModelConfig`; ALPRO's own
        keys from ``model.alpro``, :class:`vlp.models.alpro.spec.AlproSettings`) at the size ``model.preset``
        names (:data:`vlp.models.alpro.spec.SIZES`)."""
        own: AlproSettings = model.families[self.name]
        chosen = size(self.name, model.preset)
        video_init, text_init = size_weights(model, chosen)
        video_rev, text_rev = init_revisions(model)
        frames = {"img_size": model.img_size, "num_frames": model.num_frames} | chosen.video_sizes(model.img_size)
        video = TimeSformerConfig(**frames, init=video_init, init_revision=video_rev)
        text = bert_text(chosen, vocab_size, model.max_len, text_init)
        return AlproConfig(
            video,
            replace(text, init_revision=text_rev),
            embed_dim=model.embed_dim,
            num_entities=num_entities,
            losses=tuple(model.losses or LOSS_TERMS),
            pem_rule=own.pem_rule,
            pem_crop=own.pem_crop,
            pixel_mean=rgb(model.pixel_mean or AlproConfig.pixel_mean),
            pixel_std=rgb(model.pixel_std or AlproConfig.pixel_std),
            vtm_negatives=own.vtm_negatives,
            vtm_hard_fraction=own.vtm_hard_fraction,
            same_video_vtc=own.same_video_vtc,
            same_video_vtm=own.same_video_vtm,
            mlm_logits=own.mlm_logits,
        )

    def config_from_dict(self, data: dict[str, Any]) -> AlproConfig:
        return AlproConfig.from_dict(data)

    def build(self, kind: str, config: AlproConfig, num_answers: int = 0) -> nn.Module:
        if kind == self.kinds.prompter:
            return DualEncoder(config.video, config.text, embed_dim=config.embed_dim, init_temp=config.init_temp)
        if kind == self.kinds.qa:
            return AlproQA(config, num_answers)
        if kind in (self.kinds.pretrained, self.kinds.retrieval):
            return Alpro(config)
        raise ValueError(f"ALPRO has no {kind!r} model; its kinds are {self.kinds.all()}")

    def task_config(self, config: AlproConfig, task: Task, section: RetrievalConfig | QAConfig) -> AlproConfig:
        """Fine-tuning drops the pre-training heads (no PEM entities); retrieval takes its losses (contrastive: VTC,
        matching: VTM) and its VTM negative and same-clip rules from ``section``; QA keeps the towers and the fusion
        only."""
        if task == "qa":
            return replace(config, num_entities=0, losses=("vtc",))
        section = retrieval_section(section)
        terms = {"contrastive": "vtc", "matching": "vtm"}
        return replace(
            config,
            num_entities=0,
            losses=tuple(terms[t] for t in section.losses),
            vtm_negatives=section.matching_negatives,
            vtm_hard_fraction=section.matching_hard_fraction,
            same_video_vtc=section.same_clip_contrastive,
            same_video_vtm=section.same_clip_matching,
        )

    def prepare(self, config: AlproConfig, batches_per_epoch: int, global_batch: int) -> AlproConfig:
        return config

    def init_from(self, model: nn.Module, checkpoint: str, task: Task) -> list[str]:
        """The towers and the fusion from the starting model; QA's classifier keeps its initialisation."""

        return load_pretrained_weights(checkpoint, model, allow_missing=("classifier.",) if task == "qa" else ())

    def train_step(self, model: nn.Module, batch: PretrainBatch, ctx: StepContext) -> dict[str, Tensor]:
        return alpro_step(model, batch, ctx)

    def set_answers(self, model: nn.Module, answers: list[str], tokenizer: Any) -> None:
        """Nothing to do: the classifier's rows are the answers, in ``answers.json``'s order."""

    def qa_step(self, model: nn.Module, batch: dict[str, Tensor], ctx: StepContext) -> dict[str, Tensor]:
        """Cross-entropy of the answer classifier (ALPRO §4.1)."""
        logits = model(batch["video"], batch["input_ids"], batch["attention_mask"])
        label = batch["label"].to(logits.device)
        loss = F.cross_entropy(logits, label)
        acc = (logits.argmax(-1) == label).float().mean()
        return {"loss": loss, "loss_qa": loss.detach(), "train_acc": acc.detach()}

    def towers(self, model: nn.Module) -> Any:
        return model.dual

    def reranks(self, model: nn.Module) -> bool:
        """Whether VTM re-ranks: a model trained without VTM ranks by similarity alone."""
        return getattr(model, "vtm_head", None) is not None

    def pair_logits(self, model: nn.Module, text_tokens: Tensor, text_mask: Tensor, video_tokens: Tensor) -> Tensor:
        return vtm_logits(cast(Alpro, model), text_tokens, text_mask, video_tokens)  # what build made for retrieval


FAMILY = AlproFamily()
if TYPE_CHECKING:  # mypy holds the family to the protocols it meets: the core one, QA and re-ranking
    from vlp.models.family import AnswersQuestions, PairScorer

    _qa: AnswersQuestions[AlproConfig] = FAMILY
    _reranking: PairScorer[AlproConfig] = FAMILY
