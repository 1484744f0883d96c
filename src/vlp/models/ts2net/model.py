"""TS2-Net (Token Shift and Selection, arXiv 2207.07852): CLIP for text-video retrieval, fine-tuned from CLIP.

- Towers: CLIP (:class:`vlp.models.layers.clip.Clip`: transformers' ``CLIPModel``, its names, random draws and
  arithmetic): the vision tower encodes every frame, the text tower's output at
  the query's last token ([EOS]) is the query. Weights by hub name (``openai/clip-vit-base-patch32``, ViT-B/16
  with ``model.ts2net.clip_patch=16``) or a local path; random only as an explicit choice (tiny configs in tests).
- **Token shift** (:mod:`vlp.models.layers.shift`) in the last ``shift_last`` vision blocks (the paper: 2, blocks
  11-12): a forward pre-hook shifts the attention input; the block's residual carries the unshifted tokens (so
  the state dict keeps CLIP's key names).
- **Token selection**: every frame token (after CLIP's ``post_layernorm`` and projection) is scored by LayerNorm +
  MLP ``C -> C/2``, the reduced [CLS] concatenated to every token, ``C -> C/2 -> 1``; ``select="code"`` scores
  the patches with tanh and keeps [CLS] + the top 3 patches (slots in frame order), ``"paper"`` scores all N + 1
  tokens with a softmax over them and keeps the top 4 (slots by score, so slot 0 is the frame's most informative
  token); ``"none"`` keeps [CLS] alone (the "token shift only" row of Table 3). Training selects with the
  perturbed top-k (:mod:`vlp.models.layers.topk`, sigma 0.05, 500 draws); at inference ``select_eval="hard"``
  takes the hard top-k (deterministic scores, the sigma -> 0 limit), ``"noise"`` keeps the 500 draws as the code.
- **Frame aggregation** (the code's ``seqTransf``): the selected tokens of all frames plus a learned position
  embedding through ``aggregator_layers`` CLIP blocks (no causal mask), initialised from the first text blocks
  and the text position embedding when the widths match (as the code), plus a residual; each frame is then its
  slot-0 token. ``aggregator_layers=0`` skips it. Its LayerNorms use ``aggregator_ln_eps`` (the code's 1e-12;
  a CLIP block's default is CLIP's 1e-5, which a ``model.json`` without the key keeps).
- **Score** (:mod:`vlp.losses.frames`): per-frame cosine with the query weighted by ``softmax(lambda * s)``
  (lambda 4; ``frame_norm="l2"`` divides ``s`` by its norm over frames first, as the code), or the mean-pooled
  cosine (``frame_pool="mean"``: CLIP4Clip's baseline). Symmetric InfoNCE with CLIP's trainable logit scale:
  the module's ``forward`` returns a :class:`TS2NetOutput`, and the family's ``train_step`` scores it with
  :func:`vlp.losses.frames.ts2net_losses`.

A clip always has ``T`` frames here (the frame sampler repeats frames of short clips), so no frame mask is needed.
Parameters under ``clip.`` are CLIP's; the selector, the aggregator and its position embedding are new modules
(the learning-rate split of the code: ``retrieval.backbone_lr_mult``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vlp.data.video_text import CLIP_MEAN, CLIP_STD
from vlp.losses import frames as frame_losses
from vlp.models.family import (
    Encoded,
    LrGroups,
    PretrainBatch,
    Size,
    StepContext,
    Task,
    init_revisions,
    size,
    size_weights,
)
from vlp.models.layers.clip import Clip, ClipEncoderLayer, ClipTower
from vlp.models.layers.shift import token_shift
from vlp.models.layers.topk import hard_topk, perturbed_topk
from vlp.models.text import read_bert_state_dict
from vlp.models.ts2net.spec import HUB, KINDS, TS2NetSettings
from vlp.settings import retrieval_section
from vlp.weights import load_pretrained_weights

if TYPE_CHECKING:
    from vlp.settings import ModelConfig, QAConfig, RetrievalConfig

log = logging.getLogger("vlp")
# The aggregator's LayerNorm eps of a model.json written before ``aggregator_ln_eps`` existed: such a model was
# trained and evaluated with a CLIP block's default, CLIP's 1e-5
LEGACY_AGGREGATOR_LN_EPS = 1e-5


def _check_revision(tower: str, init: str, revision: str) -> None:
    if revision and not init:
        raise ValueError(f"CLIP {tower} init_revision {revision!r} is set but init is empty (random init): name the "
                         "hub weights (model.video_init / text_init) or clear the revision")  # fmt: skip


@dataclass(frozen=True)
class ClipVisionConfig:
    """The CLIP vision tower's sizes; ``init`` = weights (hub name / path; ``""`` = random); ``init_revision`` =
    the hub revision of a hub ``init`` (branch, tag or commit sha; ``""`` = the default branch, ``main``, as it is
    at load time). The commit loaded is recorded in the model directory's ``lineage.upstream``; set
    ``init_revision`` to it to start from exactly the same CLIP again."""

    img_size: int = 224
    patch_size: int = 32
    width: int = 768
    layers: int = 12
    heads: int = 12
    num_frames: int = 12  # frames per clip in training (the paper: 12)
    init: str = ""
    init_revision: str = ""

    def __post_init__(self) -> None:
        _check_revision("video", self.init, self.init_revision)

    @property
    def num_tokens(self) -> int:
        return (self.img_size // self.patch_size) ** 2 + 1


@dataclass(frozen=True)
class ClipTextConfig:
    """The CLIP text tower's sizes (``max_len`` = its position embeddings: 77 in CLIP); ``init`` and
    ``init_revision`` as :class:`ClipVisionConfig`'s (one checkpoint holds both towers)."""

    vocab_size: int = 49408
    max_len: int = 77
    width: int = 512
    layers: int = 12
    heads: int = 8
    init: str = ""
    init_revision: str = ""

    def __post_init__(self) -> None:
        _check_revision("text", self.init, self.init_revision)


@dataclass
class TS2NetConfig:
    """A TS2-Net model: CLIP's sizes and the shift, selection, aggregation and score rules (module docstring)."""

    video: ClipVisionConfig = field(default_factory=ClipVisionConfig)
    text: ClipTextConfig = field(default_factory=ClipTextConfig)
    embed_dim: int = 512
    shift_mode: Literal["code", "paper", "channel", "none"] = "code"
    shift_last: int = 2  # shift in the last N vision blocks (the paper's best: 11-12 of 12)
    shift_ratio: float = 0.25  # shift_mode="paper": share of patch tokens moved
    channel_div: int = 8  # shift_mode="channel": 1/8 of the channels each way
    select: Literal["code", "paper", "none"] = "code"
    select_k: int = 0  # picks per frame; 0 = the rule's (code: 3 patches besides [CLS]; paper: 4 of N + 1)
    select_draws: int = 500
    select_sigma: float = 0.05
    select_eval: Literal["hard", "noise"] = "hard"
    select_backward: Literal["full", "code"] = "full"  # vlp.models.layers.topk: the Jacobian or the code's diagonal
    aggregator_layers: int = 4  # 0 = none (CLIP4Clip's meanP)
    aggregator_positions: int = 77  # position embeddings of the aggregator (code: CLIP's 77 text positions)
    # its LayerNorms' eps: the code's 1e-12 (modules/module_cross.py's blocks, modules/until_module.py's LayerNorm);
    # a CLIP block's default is CLIP's 1e-5 (what a model.json without this key was trained with)
    aggregator_ln_eps: float = 1e-12
    frame_pool: Literal["weighted", "mean"] = "weighted"
    frame_lambda: float = 4.0
    frame_norm: Literal["l2", "none"] = "l2"  # code: s / ||s|| over frames before the softmax; paper: none
    init_logit_scale: float = math.log(1 / 0.07)  # CLIP's (random init only; loaded weights bring theirs)
    score_chunk: int = 256  # queries scored at a time at evaluation (memory: chunk x clips x frames)
    pixel_mean: tuple[float, float, float] = CLIP_MEAN
    pixel_std: tuple[float, float, float] = CLIP_STD

    def __post_init__(self) -> None:
        if self.shift_mode not in ("code", "paper", "channel", "none") or not 0 <= self.shift_last <= self.video.layers:
            raise ValueError(f"shift_mode must be code / paper / channel / none and shift_last in [0, "
                             f"{self.video.layers}], got {self.shift_mode!r} / {self.shift_last}")  # fmt: skip
        if self.select not in ("code", "paper", "none") or self.select_k < 0:
            raise ValueError(f"select must be code / paper / none and select_k >= 0, got {self.select!r} / "
                             f"{self.select_k}")  # fmt: skip
        if self.picks > self.video.num_tokens - (1 if self.select == "code" else 0):
            raise ValueError(f"select_k {self.picks} exceeds the {self.video.num_tokens} tokens of a frame")
        if self.frame_pool not in ("weighted", "mean") or self.frame_norm not in ("l2", "none"):
            raise ValueError(f"frame_pool must be weighted / mean and frame_norm l2 / none, got {self.frame_pool!r} "
                             f"/ {self.frame_norm!r}")  # fmt: skip
        if self.aggregator_layers < 0 or self.select_eval not in ("hard", "noise"):
            raise ValueError(f"need aggregator_layers >= 0 and select_eval hard / noise, got "
                             f"{self.aggregator_layers} / {self.select_eval!r}")  # fmt: skip
        if not self.aggregator_ln_eps > 0:
            raise ValueError(f"aggregator_ln_eps must be > 0, got {self.aggregator_ln_eps}")

    @property
    def picks(self) -> int:
        """Tokens the selector picks per frame (besides [CLS] under the code's rule)."""
        return self.select_k or {"code": 3, "paper": 4, "none": 0}[self.select]

    @property
    def tokens_per_frame(self) -> int:
        """Tokens per frame after selection (what the aggregator sees)."""
        return {"code": self.picks + 1, "paper": self.picks, "none": 1}[self.select]

    def build_clip(self) -> Clip:
        """CLIP of these sizes, randomly initialised (``init`` weights are loaded over it)."""
        v, t = self.video, self.text
        text = ClipTower(width=t.width, layers=t.layers, heads=t.heads, intermediate=4 * t.width)
        vision = ClipTower(width=v.width, layers=v.layers, heads=v.heads, intermediate=4 * v.width)
        return Clip(text, t.vocab_size, t.max_len, vision, v.img_size, v.patch_size, self.embed_dim,
                    self.init_logit_scale)  # fmt: skip

    def to_hf(self) -> Any:
        """transformers' ``CLIPConfig`` of these sizes: what ``tests/test_clip_layers.py`` builds transformers' CLIP
        from, to compare with :meth:`build_clip`'s."""
        from transformers import CLIPConfig, CLIPTextConfig, CLIPVisionConfig

        v, t = self.video, self.text
        vision = CLIPVisionConfig(hidden_size=v.width, intermediate_size=4 * v.width, num_hidden_layers=v.layers,
                                  num_attention_heads=v.heads, image_size=v.img_size, patch_size=v.patch_size,
                                  projection_dim=self.embed_dim)  # fmt: skip
        text = CLIPTextConfig(vocab_size=t.vocab_size, hidden_size=t.width, intermediate_size=4 * t.width,
                              num_hidden_layers=t.layers, num_attention_heads=t.heads,
                              max_position_embeddings=t.max_len, projection_dim=self.embed_dim, bos_token_id=0,
                              eos_token_id=1, pad_token_id=0)  # fmt: skip
        return CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=self.embed_dim,
                          logit_scale_init_value=self.init_logit_scale)  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, keep_init: bool = False) -> TS2NetConfig:
        """The config ``asdict`` gave; the towers' ``init`` (and revision) is cleared unless ``keep_init`` (weights
        come from the checkpoint). A config saved before ``aggregator_ln_eps`` existed has the eps its model was
        trained with, CLIP's 1e-5 (:data:`LEGACY_AGGREGATOR_LN_EPS`), not today's default."""
        cleared = {} if keep_init else {"init": "", "init_revision": ""}
        fields: dict[str, Any] = dict(data) | {
            "video": ClipVisionConfig(**(data["video"] | cleared)),
            "text": ClipTextConfig(**(data["text"] | cleared)),
        }
        fields.setdefault("aggregator_ln_eps", LEGACY_AGGREGATOR_LN_EPS)
        fields |= {key: tuple(data[key]) for key in ("pixel_mean", "pixel_std") if key in data}
        return cls(**fields)

    @classmethod
    def tiny(cls, vocab_size: int, **overrides: Any) -> TS2NetConfig:
        """2 + 2 layers of width 64, 32 px frames in 8 px patches, 4 frames, 16 draws: seconds on a CPU (tests)."""
        base: dict[str, Any] = {
            "video": ClipVisionConfig(img_size=32, patch_size=8, width=64, layers=2, heads=2, num_frames=4),
            "text": ClipTextConfig(vocab_size=vocab_size, max_len=24, width=64, layers=2, heads=2),
            "embed_dim": 64,
            "aggregator_layers": 2,
            "select_draws": 16,
        }
        return cls(**(base | overrides))


class TokenSelector(nn.Module):
    """Scores and softly picks tokens per frame (module docstring): ``(R, N + 1, D)`` -> ``(R, K', D)``."""

    def __init__(self, cfg: TS2NetConfig) -> None:
        super().__init__()
        dim, half = cfg.embed_dim, cfg.embed_dim // 2
        self.cfg = cfg
        self.reduce = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, half, bias=False), nn.GELU())
        self.score = nn.Sequential(nn.Linear(2 * half, half, bias=False), nn.GELU(), nn.Linear(half, 1, bias=False))

    def scores(self, tokens: Tensor) -> Tensor:
        """``(R, N + 1)`` token scores: tanh (code) or a softmax over the frame's tokens (paper). Always in fp32: under
        bf16 autocast its 8-bit mantissa would make near-equal scores tie or swap, and the picks are discrete."""
        with torch.autocast(tokens.device.type, enabled=False):
            reduced = self.reduce(tokens.float())
            joined = torch.cat([reduced, reduced[:, :1].expand_as(reduced)], dim=-1)
            raw = self.score(joined).squeeze(-1)
            return torch.softmax(raw, dim=-1) if self.cfg.select == "paper" else torch.tanh(raw)

    def forward(self, tokens: Tensor, generator: torch.Generator | None = None) -> Tensor:
        cfg = self.cfg
        scores = self.scores(tokens)
        pool = tokens[:, 1:] if cfg.select == "code" else tokens
        scores = scores[:, 1:] if cfg.select == "code" else scores
        order: Literal["index", "score"] = "index" if cfg.select == "code" else "score"
        if self.training or cfg.select_eval == "noise":
            picks = perturbed_topk(scores, cfg.picks, draws=cfg.select_draws, sigma=cfg.select_sigma, order=order,
                                   backward=cfg.select_backward, generator=generator)  # fmt: skip
        else:
            picks = hard_topk(scores, cfg.picks, order=order)
        chosen = torch.einsum("rkn,rnd->rkd", picks.to(tokens.dtype), pool)
        return torch.cat([tokens[:, :1], chosen], dim=1) if cfg.select == "code" else chosen


class FrameAggregator(nn.Module):
    """CLIP blocks over the selected tokens of all frames, with positions and a residual (the code's seqTransf)."""

    def __init__(self, cfg: TS2NetConfig) -> None:
        super().__init__()
        block = ClipTower(width=cfg.embed_dim, layers=cfg.aggregator_layers, heads=cfg.text.heads,
                          intermediate=4 * cfg.embed_dim, layer_norm_eps=cfg.aggregator_ln_eps)  # fmt: skip
        self.positions = nn.Embedding(cfg.aggregator_positions, cfg.embed_dim)
        nn.init.normal_(self.positions.weight, std=0.01)
        self.layers = nn.ModuleList(ClipEncoderLayer(block) for _ in range(cfg.aggregator_layers))
        self.grad_checkpointing = False  # recompute each block in the backward (training only)

    def init_from_text(self, text_model: Any) -> bool:
        """Copy the first text blocks and text positions (the code's init) when the widths match; True if done.
        ``text_model`` is CLIP's text tower (:class:`vlp.models.layers.clip.ClipTextTransformer`)."""
        text_layers = text_model.encoder.layers
        if len(text_layers) < len(self.layers) or text_layers[0].self_attn.embed_dim != self.positions.embedding_dim:
            return False
        with torch.no_grad():
            for mine, theirs in zip(self.layers, text_layers, strict=False):
                mine.load_state_dict(theirs.state_dict())
            source = text_model.embeddings.position_embedding.weight
            rows = min(source.shape[0], self.positions.num_embeddings)
            self.positions.weight[:rows] = source[:rows]
        return True

    def forward(self, tokens: Tensor) -> Tensor:
        """``(B, L, D)`` -> ``(B, L, D)``."""
        if tokens.shape[1] > self.positions.num_embeddings:
            raise ValueError(
                f"{tokens.shape[1]} selected tokens per clip exceed the aggregator's {self.positions.num_embeddings} "
                "positions: raise model.ts2net.aggregator_positions (or use fewer frames / picks)"
            )
        x = tokens + self.positions.weight[: tokens.shape[1]]
        for layer in self.layers:
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        return x + tokens


@dataclass
class TS2NetOutput:
    """What one TS2-Net training forward produces for :func:`vlp.losses.frames.ts2net_losses`.

    Attributes:
        text: ``(B, D)`` unit-norm queries (the projected [EOS] states).
        frames: ``(B, T, D)`` unit-norm frame features (after selection and aggregation).
        logit_scale: CLIP's trainable log inverse temperature (0-d); the logits are ``exp(logit_scale) * score``.
        frame_pool, frame_lambda, frame_norm: the score rule (:class:`TS2NetConfig`'s).
    """

    text: Tensor
    frames: Tensor
    logit_scale: Tensor
    frame_pool: Literal["weighted", "mean"] = "weighted"
    frame_lambda: float = 4.0
    frame_norm: Literal["l2", "none"] = "l2"


class TS2Net(nn.Module):
    """CLIP with token shift, token selection and frame aggregation (module docstring)."""

    def __init__(self, cfg: TS2NetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.clip = cfg.build_clip()
        self.selector = TokenSelector(cfg) if cfg.select != "none" else None  # "none": [CLS] alone
        self.aggregator = FrameAggregator(cfg) if cfg.aggregator_layers else None
        self._init_new_modules()
        v, t = cfg.video, cfg.text
        source, revision = (v.init, v.init_revision) if v.init else (t.init, t.init_revision)
        if v.init and t.init and (v.init, v.init_revision) != (t.init, t.init_revision):
            raise ValueError(f"one CLIP checkpoint holds both towers; got {v.init!r} (revision {v.init_revision!r}) "
                             f"and {t.init!r} (revision {t.init_revision!r})")  # fmt: skip
        if source:
            load_clip_weights(self.clip, source, revision)
        copied = self.aggregator is None or self.aggregator.init_from_text(self.clip.text_model)
        if source and not copied:  # CLIP's weights were there to copy (without them, e.g. a model built to be
            # loaded from its directory, every part starts random and the line would mislead)
            log.info("ts2net: the aggregator (width %d) starts random: the text tower's width differs or it has "
                     "fewer blocks", cfg.embed_dim)  # fmt: skip
        self._frames = cfg.video.num_frames
        layers = [cast(ClipEncoderLayer, layer) for layer in self.clip.vision_model.encoder.layers]
        if cfg.shift_mode != "none":
            for layer in layers[len(layers) - cfg.shift_last :]:
                layer.self_attn.register_forward_pre_hook(self._shift_hook, with_kwargs=True)

    def _init_new_modules(self) -> None:
        for module in self.selector.modules() if self.selector is not None else ():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    def _shift_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        cfg, mode = self.cfg, self.cfg.shift_mode
        if mode == "none":  # never: the hook is registered for a shifting mode only
            return args, kwargs
        if args:  # hidden_states passed positionally
            args = (token_shift(args[0], self._frames, mode, cfg.shift_ratio, cfg.channel_div), *args[1:])
        else:
            hidden = kwargs["hidden_states"]
            kwargs = kwargs | {
                "hidden_states": token_shift(hidden, self._frames, mode, cfg.shift_ratio, cfg.channel_div)
            }
        return args, kwargs

    def frame_tokens(self, video: Tensor) -> Tensor:
        """``(B, T, 3, H, W)`` -> ``(B * T, N + 1, D)`` projected CLIP tokens of every frame (shift applied)."""
        self._frames = video.shape[1]
        tokens = self.clip.vision_model.post_layernorm(self.clip.vision_model(video.flatten(0, 1)))
        return self.clip.visual_projection(tokens)

    def encode_video(self, video: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``(B, T, 3, H, W)`` -> ``(B, T, D)`` unit-norm frame features."""
        b, t = video.shape[:2]
        tokens = self.frame_tokens(video)
        chosen = self.selector(tokens, generator) if self.selector is not None else tokens[:, :1]  # (B*T, K', D)
        per_frame = chosen.shape[1]
        seq = chosen.reshape(b, t * per_frame, -1)
        if self.aggregator is not None:
            seq = self.aggregator(seq)
        frames = seq.reshape(b, t, per_frame, -1)[:, :, 0]
        return F.normalize(frames, dim=-1)

    def encode_text(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """``(unit-norm query (B, D), token states (B, L, C))``: the query is the last real token's ([EOS])."""
        hidden = self.clip.text_model(input_ids, attention_mask)
        last = attention_mask.sum(dim=1).clamp(min=1) - 1
        query = self.clip.text_projection(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
        return F.normalize(query, dim=-1), hidden

    def score(self, text: Tensor, frames: Tensor, chunk: int = 0) -> Tensor:
        """``(Q, V)`` text-video scores (without the logit scale)."""
        cfg = self.cfg
        if cfg.frame_pool == "mean":
            return frame_losses.mean_pool_scores(text, frames)
        return frame_losses.frame_scores(text, frames, cfg.frame_lambda, cfg.frame_norm == "l2", chunk=chunk)

    def forward(self, batch: PretrainBatch, ctx: StepContext) -> TS2NetOutput:
        """The features the loss scores (:func:`vlp.losses.frames.ts2net_losses`); ``ctx.generator`` draws the
        selection's noise (None = the global generator)."""
        cfg = self.cfg
        frames = self.encode_video(batch.video, ctx.generator if ctx is not None else None)
        text, _ = self.encode_text(batch.input_ids, batch.attention_mask)
        return TS2NetOutput(text, frames, self.clip.logit_scale, cfg.frame_pool, cfg.frame_lambda, cfg.frame_norm)


_CLIP_REMEDY = ("Set model.video_init / text_init to a local directory/file or s3:// URI holding model.safetensors, "
                "or to 'random' for a random init.")  # fmt: skip


def load_clip_weights(clip: nn.Module, source: str, revision: str = "") -> None:
    """Load a CLIP checkpoint in transformers' layout (hub name at ``revision``, ``""`` = the default branch;
    directory, ``.safetensors`` / ``.bin`` file or ``s3://`` URI) into ``clip`` (:class:`vlp.models.layers.clip.Clip`),
    every shape checked. Where it came from (hub commit or file SHA-256) is noted for the model directory's lineage.

    Raises:
        ValueError: a missing weight or a shape the config does not have (the message names it), or a revision
            given with a path.
        PretrainedUnavailableError: a hub name (or revision) that is neither cached nor reachable, or not on the hub.
    """

    raw = read_bert_state_dict(source, revision, what="CLIP weights", remedy=_CLIP_REMEDY)
    state = {k.removeprefix("module.").removeprefix("clip."): v for k, v in raw.items()}
    own = clip.state_dict()
    wrong = [f"{k}: {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items()
             if k in own and tuple(v.shape) != tuple(own[k].shape)]  # fmt: skip
    if wrong:
        raise ValueError(f"{source}: CLIP weights do not fit the configured sizes: {wrong[:4]} (checkpoint vs model)")
    missing = sorted(k for k in own if k not in state and not k.endswith("position_ids"))
    if missing:
        raise ValueError(f"{source}: not a transformers CLIP checkpoint; missing {missing[:6]}")
    clip.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)


def clip_size(chosen: Size, patch: int) -> Size:
    """``chosen`` with ``model.ts2net.clip_patch`` = ``patch``: a size that starts from OpenAI's CLIP takes its
    ViT-B/``patch`` (that patch and those weights); one from random init keeps its own patch."""
    if not set(chosen.weights) & set(HUB.values()):
        return chosen
    return replace(chosen, video={**chosen.video, "patch_size": patch}, weights=(HUB[patch], HUB[patch]))


class TS2NetFamily:
    """TS2-Net as a :class:`vlp.models.family.Family`: fine-tuned from CLIP for retrieval, ranked by the frame score.
    It has neither a QA model (``kinds.qa`` is ``""``) nor a fused pair scorer, so it meets neither
    :class:`vlp.models.family.AnswersQuestions` nor :class:`vlp.models.family.PairScorer`."""

    name = "ts2net"
    # no step writes a "ts2net_clip" model today: fine-tuning starts from the model section's CLIP weights, and a
    # zero-shot TS2-Net (CLIP with a random selector and aggregator) is not offered; the kind keeps the slot
    kinds = KINDS  # declared with the family's spec, where the registry reads them without this module
    default_losses: tuple[str, ...] = ("itc",)
    lr_groups = LrGroups(backbone=("clip.",))  # the code's coef_lr: CLIP slower than the selector and aggregator

    def weights(self, model: ModelConfig) -> tuple[str, str]:
        return size_weights(model, self._size(model))

    def _size(self, model: ModelConfig) -> Size:
        """The size ``model.preset`` names (:data:`vlp.models.ts2net.spec.SIZES`) at ``model.ts2net.clip_patch``."""
        return clip_size(size(self.name, model.preset), model.families[self.name].clip_patch)

    def config(self, model: ModelConfig, vocab_size: int, num_entities: int = 0) -> TS2NetConfig:
        """The TS2-Net config of a ``model`` config section (:class:`vlp.settings.ModelConfig`)."""
        if num_entities:
            raise ValueError("TS2-Net has no prompt-entity head (PEM is ALPRO's)")
        own: TS2NetSettings = model.families[self.name]
        chosen = self._size(model)
        video_init, text_init = size_weights(model, chosen)
        video_rev, text_rev = init_revisions(model)
        rules: dict[str, Any] = {
            "shift_mode": own.shift_mode,
            "shift_last": own.shift_last,
            "shift_ratio": own.shift_ratio,
            "select": own.select,
            "select_k": own.select_k,
            "select_eval": own.select_eval,
            "select_backward": own.select_backward,
            "aggregator_layers": own.aggregator_layers,
            "aggregator_positions": own.aggregator_positions,
            "aggregator_ln_eps": own.aggregator_ln_eps,
            "frame_pool": own.frame_pool,
            "frame_lambda": own.frame_lambda,
            "frame_norm": own.frame_norm,
            "pixel_mean": tuple(model.pixel_mean) if model.pixel_mean else CLIP_MEAN,
            "pixel_std": tuple(model.pixel_std) if model.pixel_std else CLIP_STD,
        }
        frames = {"img_size": model.img_size, "num_frames": model.num_frames} | chosen.video_sizes(model.img_size)
        video = ClipVisionConfig(**frames, init=video_init, init_revision=video_rev)
        texts = {"vocab_size": vocab_size, "max_len": model.max_len} | dict(chosen.text)
        text = ClipTextConfig(**texts, init=text_init, init_revision=text_rev)
        return TS2NetConfig(video, text, embed_dim=chosen.embed_dim or model.embed_dim, **rules)

    def config_from_dict(self, data: dict[str, Any]) -> TS2NetConfig:
        return TS2NetConfig.from_dict(data)

    def build(self, kind: str, config: TS2NetConfig, num_answers: int = 0) -> nn.Module:
        if kind in (self.kinds.pretrained, self.kinds.retrieval):
            return TS2Net(config)
        raise ValueError(f"TS2-Net is a retrieval model; it has no {kind!r} model (its kinds: {self.kinds.all()})")

    def task_config(self, config: TS2NetConfig, task: Task, section: RetrievalConfig | QAConfig) -> TS2NetConfig:
        if task != "retrieval":
            raise ValueError("TS2-Net is a text-video retrieval model: it has no QA head (finetune-qa needs ALPRO or "
                             "ALBEF)")  # fmt: skip
        section = retrieval_section(section)
        unknown = sorted(set(section.losses) - {"contrastive"})
        if unknown:
            log.warning("ts2net: retrieval.losses %s ignored: TS2-Net trains its contrastive loss only", unknown)
        return replace(config, video=replace(config.video, num_frames=section.num_frames))

    def prepare(self, config: TS2NetConfig, batches_per_epoch: int, global_batch: int) -> TS2NetConfig:
        return config

    def init_from(self, model: nn.Module, checkpoint: str, task: Task) -> list[str]:

        return load_pretrained_weights(checkpoint, model)

    def train_step(self, model: nn.Module, batch: PretrainBatch, ctx: StepContext) -> dict[str, Tensor]:
        """The module's forward (``model`` may be DDP-wrapped), then :func:`vlp.losses.frames.ts2net_losses` on its
        :class:`TS2NetOutput` over ``ctx``'s gathered batch."""
        ctx = ctx or StepContext()
        return frame_losses.ts2net_losses(model(batch, ctx), gather=ctx.gather, rank=ctx.rank)

    def encode_video(self, model: nn.Module, video: Tensor) -> Encoded:
        frames = _own(model).encode_video(video)
        return Encoded(F.normalize(frames.mean(dim=1), dim=-1), frames)

    def encode_text(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Encoded:
        query, hidden = _own(model).encode_text(input_ids, attention_mask)
        return Encoded(query, hidden, attention_mask)

    def similarity(self, model: nn.Module, texts: Encoded, videos: Encoded) -> Tensor:
        """The frame score of every (text, clip) pair from the encoded frames, ``score_chunk`` queries at a time."""
        net = _own(model)
        return net.score(texts.feat, videos.tokens, chunk=net.cfg.score_chunk)


def _own(model: nn.Module) -> TS2Net:
    """The family's methods receive the module its ``build`` made (unwrapped at evaluation): a :class:`TS2Net`."""
    return cast(TS2Net, model)


FAMILY = TS2NetFamily()
if TYPE_CHECKING:  # mypy holds the family to the protocol it meets (no QA model, no pair scorer)
    from vlp.models.family import Family

    _contract: Family[TS2NetConfig] = FAMILY
