"""ALBEF's config and towers (:class:`AlbefConfig`, :class:`Towers`): what one set of ALBEF's weights is made of, which
the pre-training model (online and momentum copies) and the QA model (:mod:`vlp.models.albef.model`) build on."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import torch.nn.functional as F
from torch import Tensor, nn

from vlp import losses
from vlp.data.video_text import CLIP_MEAN, CLIP_STD
from vlp.models.layers.cross import CrossFusionEncoder
from vlp.models.layers.vit import FrameOutput, FrameViT, FrameViTConfig
from vlp.models.text import MLMHead, TextConfig, TextEncoder, load_bert_weights

_VIT_FIELDS = {f.name for f in fields(FrameViTConfig)}
LOSS_TERMS = ("itc", "mlm", "itm")


@dataclass(frozen=True)
class AlbefConfig:
    """Sizes, objectives and momentum settings of an ALBEF model."""

    video: FrameViTConfig = field(default_factory=FrameViTConfig.tiny)
    text: TextConfig = field(default_factory=TextConfig.tiny)
    embed_dim: int = 256  # ITC projection size (paper: 256)
    init_temp: float = 0.07  # learnable temperature (code: 0.07; the paper gives no initial value)
    temp_clamp: bool = True  # code: clamp to [0.001, 0.5] at every forward; the paper states no bound
    losses: tuple[str, ...] = LOSS_TERMS
    mlm_prob: float = 0.15
    mlm_logits: Literal["all", "masked"] = "all"  # MLM's logits at every text position, or the masked ones alone
    momentum: float = 0.995
    queue_size: int = 65536  # M; must be a multiple of the global batch (checked before training)
    distill: bool = True  # momentum distillation (MoD) of ITC and MLM; False = the ground truth alone
    alpha: float = 0.4
    alpha_ramp_steps: int = 0  # training forwards over which alpha ramps from 0; -1 = one epoch (set by prepare)
    itm_negatives: Literal["hard", "uniform", "mixed"] = "hard"  # "uniform": the "w/o hard negatives" ablation
    itm_hard_fraction: float = 0.5
    itm_negatives_from: Literal["global", "local"] = "global"  # paper: the (global) batch; code: the local one
    # Another caption of the same clip: an ITC negative ("negative", ALBEF pre-training) or a positive that
    # shares the target with the own pair and is never an ITM negative ("positive", ALBEF retrieval fine-tuning,
    # with the clip-id queue)
    same_video: Literal["negative", "positive"] = "negative"
    answer_len: int = 8  # QA: answer tokens incl. [CLS] / [SEP] (the answer list's token ids are model buffers)
    answer_topk: int = 128  # QA: candidates the decoder scores per question, by first-token probability (code)
    pixel_mean: tuple[float, float, float] = CLIP_MEAN  # ALBEF's code normalises with CLIP's (the paper states none)
    pixel_std: tuple[float, float, float] = CLIP_STD

    def __post_init__(self) -> None:
        if self.mlm_logits not in ("all", "masked"):
            raise ValueError(f"mlm_logits must be 'all' or 'masked', got {self.mlm_logits!r}")
        unknown = sorted(set(self.losses) - set(LOSS_TERMS))
        if unknown or not self.losses:
            hint = " (ALBEF names them itc, mlm, itm; pem is ALPRO's)" if unknown else ""
            raise ValueError(f"losses must be a non-empty subset of {LOSS_TERMS}, got {list(self.losses)}{hint}")
        if not 0.0 <= self.momentum < 1.0 or not 0.0 <= self.alpha <= 1.0 or self.alpha_ramp_steps < -1:
            raise ValueError(
                f"need momentum in [0, 1), alpha in [0, 1], alpha_ramp_steps >= -1; got {self.momentum}, "
                f"{self.alpha}, {self.alpha_ramp_steps}"
            )
        if self.queue_size < 0:
            raise ValueError(f"queue_size must be >= 0 (0 = in-batch ITC only), got {self.queue_size}")
        if self.itm_negatives not in losses.matching.NEGATIVES or self.itm_negatives_from not in ("global", "local"):
            raise ValueError(
                f"itm_negatives must be one of {losses.matching.NEGATIVES} and itm_negatives_from 'global' or "
                f"'local', got {self.itm_negatives!r} / {self.itm_negatives_from!r}"
            )
        if self.same_video not in ("negative", "positive"):
            raise ValueError(f"same_video must be 'negative' or 'positive', got {self.same_video!r}")
        if len(self.pixel_mean) != 3 or len(self.pixel_std) != 3 or min(self.pixel_std) <= 0:
            raise ValueError(f"pixel_mean/pixel_std need 3 values, std > 0: {self.pixel_mean} / {self.pixel_std}")

    @property
    def fused(self) -> bool:
        return bool(set(self.losses) & {"mlm", "itm"})

    def check_queue(self, global_batch: int) -> None:
        """Refuse a queue the global batch does not divide (every enqueue writes one whole gathered batch)."""
        if self.queue_size and (global_batch < 1 or self.queue_size % global_batch):
            raise ValueError(
                f"ALBEF's queue_size {self.queue_size} must be a multiple of the global batch {global_batch} "
                "(batch_size x processes): change model.albef.queue_size or the batch size"
            )

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, keep_init: bool = False) -> AlbefConfig:
        """The config ``dataclasses.asdict`` gave; the towers' ``init`` (and revision) is cleared unless
        ``keep_init``."""
        cleared = {} if keep_init else {"init": "", "init_revision": ""}
        video = FrameViTConfig(**(data["video"] | {k: v for k, v in cleared.items() if k in _VIT_FIELDS}))
        text_fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in (data["text"] | cleared).items()
        }
        text = TextConfig(**text_fields)
        fields: dict[str, Any] = dict(data) | {"video": video, "text": text, "losses": tuple(data["losses"])}
        fields |= {key: tuple(data[key]) for key in ("pixel_mean", "pixel_std") if key in data}
        return cls(**fields)

    @classmethod
    def tiny(cls, vocab_size: int, **overrides: Any) -> AlbefConfig:
        """2 + 2 text layers and a 2-layer ViT, width 64, 32 px frames, a 32-entry queue: seconds on a CPU."""
        base: dict[str, Any] = {"text": TextConfig.tiny(vocab_size=vocab_size), "embed_dim": 32, "queue_size": 32}
        return cls(**(base | overrides))


class Towers(nn.Module):
    """One set of ALBEF's weights: visual and text towers, projections, fusion, MLM head (online or momentum)."""

    def __init__(self, cfg: AlbefConfig, *, load: bool, projections: bool = True, mlm: bool | None = None) -> None:
        super().__init__()
        self.visual = FrameViT(cfg.video if load else replace(cfg.video, init=""))
        self.text = TextEncoder(cfg.text)
        if projections:  # ITC's (QA has no use for them)
            self.vision_proj = nn.Linear(self.visual.width, cfg.embed_dim)
            self.text_proj = nn.Linear(cfg.text.width, cfg.embed_dim)
        fused = cfg.fused or not projections
        self.fusion = CrossFusionEncoder(cfg.text, visual_width=self.visual.width) if fused else None
        with_mlm = "mlm" in cfg.losses if mlm is None else mlm
        self.mlm_head = MLMHead(cfg.text, self.text.word_embeddings) if with_mlm else None
        if load and cfg.text.init:  # BERT layers 1..6 -> text, 7..12 -> fusion (cross-attention stays random)
            load_bert_weights(
                self.text, self.fusion, cfg.text.init, mlm_head=self.mlm_head, revision=cfg.text.init_revision
            )

    def encode_video(self, video: Tensor) -> tuple[Tensor, FrameOutput]:
        out = self.visual(video)
        return F.normalize(self.vision_proj(out.cls), dim=-1), out

    def encode_text(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Any]:
        out = self.text(input_ids, attention_mask)
        return F.normalize(self.text_proj(out.tokens[:, 0]), dim=-1), out
