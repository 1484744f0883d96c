"""ALPRO's text encoder and multimodal (fusion) encoder: one 12-layer BERT cut in two.

* :class:`TextEncoder` = BERT embeddings + the first ``text_layers`` BERT layers (paper: 6).
* :class:`MultimodalEncoder` = the remaining ``fusion_layers`` BERT layers (paper: 6), run as plain
  *self-attention* over the concatenation ``[text tokens; video tokens]`` (ALPRO), not cross-attention
  (ALBEF). Order and mask follow salesforce/ALPRO (``src/modeling/alpro_models.py``, ``compute_vtm`` /
  ``compute_mlm``; ``xbert.py`` ``mode='fusion'``):

  - the sequence is ``cat([text_embeds, video_embeds], dim=1)``: text first, so position 0 of the fused
    sequence is the text [CLS] (used by the VTM head) and the video part starts at ``L`` with the video
    [CLS] at ``L`` (PEM pools ``[L + 1:]``);
  - the mask is ``cat([text_padding_mask, ones(N)], dim=1)``, bidirectional: every query (text or video,
    padded or not) attends to every real text token and every video token, never to text padding;
  - nothing is added to the concatenation: no embedding layer, no type/modality embedding, no extra
    LayerNorm (position embeddings were already added inside each unimodal encoder, as the paper says).

  When the video width differs from the text width, a linear projection maps video tokens to the text width
  first (ALPRO's ViT-B and BERT-base are both 768 wide, so it is the identity there).

Both halves are built from BERT's embeddings and layers (:mod:`vlp.models.layers.bert`: transformers' modules,
names and arithmetic, without its model code's imports) so a BERT checkpoint splits exactly
(:func:`load_bert_weights`: layers ``0..text_layers-1`` -> text, the rest -> fusion; applied to text alone, text
then fusion reproduces the full BertModel). :class:`MLMHead` is BERT's MLM head with the decoder
tied to the text encoder's word embeddings; ALPRO applies it to the *text part of the fused* sequence.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vlp import storage
from vlp.models.layers.bert import BertDims, BertEmbeddings, BertLayer, BertPredictionHeadTransform, padding_mask
from vlp.models.tokenizer import check_no_revision, file_record, hub_download, looks_like_path, remember_upstream

if TYPE_CHECKING:
    from transformers import BertConfig

__all__ = [
    "FusionOutput",
    "LoadReport",
    "MLMHead",
    "MultimodalEncoder",
    "TextConfig",
    "TextEncoder",
    "TextOutput",
    "build_text_model",
    "load_bert_weights",
]


@dataclass
class TextConfig:
    """Sizes of the BERT that is split into the text and multimodal encoders.

    ``max_len`` is the tokenizer truncation length (the ALPRO code uses 30 in pre-training, 40 in MSRVTT
    fine-tuning); ``max_positions`` is the size of the position table (512 for any BERT checkpoint).
    ``init`` names a BERT checkpoint (hub id such as ``bert-base-uncased``, a local directory or file, or an
    ``s3://`` file) loaded by :func:`build_text_model`; empty = random init. ``init_revision`` is the hub
    revision of a hub ``init`` (branch, tag or commit sha); ``""`` = the repository's default branch (``main``)
    as it is at load time. Either way the commit loaded is recorded in the model directory's
    ``lineage.upstream.text``; set ``init_revision`` to that sha to start from exactly the same weights again.
    ``vocab_size`` must equal the tokenizer's ``len(tok)`` when the tokenizer is trained with
    :func:`vlp.models.tokenizer.train_wordpiece`.
    """

    vocab_size: int = 30522
    width: int = 768
    text_layers: int = 6
    fusion_layers: int = 6
    heads: int = 12
    intermediate: int = 3072
    max_len: int = 40
    init: str = ""
    grad_checkpointing: bool = False
    max_positions: int = 512
    type_vocab_size: int = 2
    dropout: float = 0.1  # hidden and attention-probability dropout, as bert-base-uncased
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    init_std: float = 0.02
    attn_implementation: str = "sdpa"  # or "eager"; numerically equivalent
    init_revision: str = ""  # hub revision of ``init``; "" = its default branch (the commit is recorded as lineage)

    def __post_init__(self) -> None:
        if self.init_revision and not self.init:
            raise ValueError(
                f"text init_revision {self.init_revision!r} is set but init is empty (random init): name the hub "
                "weights (model.text_init) or clear the revision"
            )
        if self.width % self.heads:
            raise ValueError(f"text width {self.width} is not divisible by heads {self.heads}")
        if self.text_layers < 1 or self.fusion_layers < 0:
            raise ValueError(
                f"need text_layers >= 1 and fusion_layers >= 0, got {self.text_layers}/{self.fusion_layers}"
            )
        if not 0 < self.max_len <= self.max_positions:
            raise ValueError(f"max_len {self.max_len} must be in (0, max_positions={self.max_positions}]")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"attn_implementation must be 'sdpa' or 'eager', got {self.attn_implementation!r}")

    @classmethod
    def tiny(cls, **overrides: object) -> TextConfig:
        """2 text + 2 fusion layers, width 64: seconds on a CPU (tests, the embedded default run)."""
        base: dict[str, object] = {
            "vocab_size": 1000,
            "width": 64,
            "text_layers": 2,
            "fusion_layers": 2,
            "heads": 4,
            "intermediate": 256,
            "max_len": 32,
            "max_positions": 64,
        }
        return cls(**(base | overrides))  # type: ignore[arg-type]

    @classmethod
    def paper(cls, **overrides: object) -> TextConfig:
        """BERT-base split 6 + 6, initialised from ``bert-base-uncased`` (ALPRO §3.4)."""
        return cls(**({"init": "bert-base-uncased"} | overrides))  # type: ignore[arg-type]

    def dims(self) -> BertDims:
        """What BERT's layers (:mod:`vlp.models.layers.bert`) read of these sizes."""
        return BertDims(
            width=self.width,
            heads=self.heads,
            intermediate=self.intermediate,
            vocab_size=self.vocab_size,
            max_positions=self.max_positions,
            type_vocab_size=self.type_vocab_size,
            pad_token_id=self.pad_token_id,
            dropout=self.dropout,
            layer_norm_eps=self.layer_norm_eps,
            attn="eager" if self.attn_implementation == "eager" else "sdpa",
        )

    def to_bert_config(self) -> BertConfig:
        """The transformers ``BertConfig`` of the whole (unsplit) BERT these sizes describe: a BERT checkpoint of
        these sizes (tests build transformers' BERT from it to compare)."""
        # transformers loads where a BERT of its own is made, not with this module: vlp's models are built from
        # vlp.models.layers.bert
        from transformers import BertConfig

        # attn_implementation is a keyword of PretrainedConfig, which BertConfig takes through **kwargs: its signature
        # does not name it, hence the ignore
        return BertConfig(  # type: ignore[call-arg]
            vocab_size=self.vocab_size,
            hidden_size=self.width,
            num_hidden_layers=self.text_layers + self.fusion_layers,
            num_attention_heads=self.heads,
            intermediate_size=self.intermediate,
            hidden_dropout_prob=self.dropout,
            attention_probs_dropout_prob=self.dropout,
            max_position_embeddings=self.max_positions,
            type_vocab_size=self.type_vocab_size,
            layer_norm_eps=self.layer_norm_eps,
            pad_token_id=self.pad_token_id,
            initializer_range=self.init_std,
            attn_implementation=self.attn_implementation,
        )


@dataclass
class TextOutput:
    """Output of :class:`TextEncoder`."""

    tokens: Tensor  # (B, L, C)
    attention_mask: Tensor  # (B, L), 1 = real token, 0 = padding

    @property
    def cls(self) -> Tensor:  # (B, C)
        return self.tokens[:, 0]


@dataclass
class FusionOutput:
    """Output of :class:`MultimodalEncoder` over ``[text; video]``."""

    tokens: Tensor  # (B, L + N, C)
    attention_mask: Tensor  # (B, L + N)
    text_len: int  # L

    @property
    def text(self) -> Tensor:  # (B, L, C), a view
        return self.tokens[:, : self.text_len]

    @property
    def video(self) -> Tensor:  # (B, N, C), a view; video [CLS] first when the video encoder emits one
        return self.tokens[:, self.text_len :]

    @property
    def cls(self) -> Tensor:  # (B, C): the text [CLS] at position 0, input of the VTM head
        return self.tokens[:, 0]


def init_bert_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT initialisation: normal(0, std) linear/embedding weights, zero biases and padding row, unit LayerNorm."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class _BertStack(nn.Module):
    """A run of BertLayers with the bidirectional padding mask and optional gradient checkpointing."""

    def __init__(self, cfg: TextConfig, count: int) -> None:
        super().__init__()
        self.dims = cfg.dims()
        self.layers = nn.ModuleList(BertLayer(self.dims) for _ in range(count))
        self.grad_checkpointing = cfg.grad_checkpointing

    def run_layers(self, x: Tensor, mask: Tensor) -> Tensor:  # (B, S, C), (B, S) -> (B, S, C)
        attn = padding_mask(mask, x.shape[1], self.dims.attn, x.dtype)
        for layer in self.layers:
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, attn, use_reentrant=False)
            else:
                x = layer(x, attn)
        return x


class TextEncoder(_BertStack):
    """BERT embeddings + the first ``cfg.text_layers`` BERT layers."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__(cfg, count=cfg.text_layers)
        self.cfg = cfg
        self.width = cfg.width
        self.embeddings = BertEmbeddings(self.dims)
        init_bert_weights(self, cfg.init_std)

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> TextOutput:
        """Encode token ids.

        Args:
            input_ids: (B, L) token ids, [CLS] first.
            attention_mask: (B, L), 1 for real tokens and 0 for padding; ``None`` = no padding.
            token_type_ids: (B, L) segment ids; ``None`` = all zeros (as ALPRO).

        Returns:
            :class:`TextOutput` with tokens (B, L, C) and the mask used.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (B, L), got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.cfg.max_positions:
            raise ValueError(f"text length {input_ids.shape[1]} exceeds max_positions={self.cfg.max_positions}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)  # (B, L, C)
        return TextOutput(tokens=self.run_layers(x, attention_mask), attention_mask=attention_mask)


class MultimodalEncoder(_BertStack):
    """The last ``cfg.fusion_layers`` BERT layers as self-attention over ``[text; video]`` (see module docstring)."""

    def __init__(self, cfg: TextConfig, *, video_width: int | None = None) -> None:
        super().__init__(cfg, count=cfg.fusion_layers)
        self.cfg = cfg
        self.width = cfg.width
        vw = video_width or cfg.width
        self.video_proj: nn.Module = nn.Linear(vw, cfg.width) if vw != cfg.width else nn.Identity()
        init_bert_weights(self, cfg.init_std)

    def forward(
        self,
        text_tokens: Tensor,
        text_mask: Tensor,
        video_tokens: Tensor | None = None,
        video_mask: Tensor | None = None,
    ) -> FusionOutput:
        """Fuse text and video tokens.

        Args:
            text_tokens: (B, L, C) text-encoder output.
            text_mask: (B, L), 1 = real token.
            video_tokens: (B, N, Cv) video-encoder tokens (video [CLS] first); ``None`` = text only.
            video_mask: (B, N); ``None`` = all ones (ALPRO never pads video tokens).

        Returns:
            :class:`FusionOutput` over the concatenated sequence (B, L + N, C).
        """
        b, text_len = text_mask.shape
        if text_tokens.shape[:2] != (b, text_len):
            raise ValueError(f"text tokens {tuple(text_tokens.shape)} do not match text mask {tuple(text_mask.shape)}")
        x, mask = text_tokens, text_mask
        if video_tokens is not None:
            if video_tokens.dim() != 3 or video_tokens.shape[0] != b:
                raise ValueError(f"video tokens must be (B={b}, N, C), got {tuple(video_tokens.shape)}")
            v = self.video_proj(video_tokens)  # (B, N, C)
            if video_mask is None:
                video_mask = torch.ones(v.shape[:2], dtype=text_mask.dtype, device=v.device)
            x = torch.cat([x, v.to(x.dtype)], dim=1)  # (B, L + N, C): text first, as ALPRO
            mask = torch.cat([mask, video_mask.to(mask.dtype)], dim=1)  # (B, L + N)
        return FusionOutput(tokens=self.run_layers(x, mask), attention_mask=mask, text_len=text_len)


class MLMHead(nn.Module):
    """BERT's MLM head (dense -> GELU -> LayerNorm -> vocabulary), decoder tied to the word embeddings.

    With ``word_embeddings`` given, the decoder weight *is* that embedding's weight; the embedding is held by
    reference and not registered here, so the tied tensor appears once in ``state_dict`` (safetensors refuses
    shared tensors) under its owner, the text encoder. Without it, the head owns an untied decoder weight.
    """

    def __init__(self, cfg: TextConfig, word_embeddings: nn.Embedding | None = None) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(cfg.dims())
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self._tied: tuple[nn.Embedding, ...] = ()
        self.decoder_weight: nn.Parameter | None = None
        if word_embeddings is not None:
            if tuple(word_embeddings.weight.shape) != (cfg.vocab_size, cfg.width):
                raise ValueError(f"word embeddings {tuple(word_embeddings.weight.shape)} do not match the config")
            self._tied = (word_embeddings,)
        else:
            self.decoder_weight = nn.Parameter(torch.empty(cfg.vocab_size, cfg.width))
        init_bert_weights(self.transform, cfg.init_std)
        if self.decoder_weight is not None:
            nn.init.normal_(self.decoder_weight, std=cfg.init_std)

    @property
    def weight(self) -> Tensor:  # (V, C)
        return self._tied[0].weight if self._tied else self.decoder_weight  # type: ignore[return-value]

    def forward(self, hidden: Tensor) -> Tensor:  # (..., C) -> (..., V) logits
        return F.linear(self.transform(hidden), self.weight, self.bias)


def build_text_model(
    cfg: TextConfig, *, video_width: int | None = None
) -> tuple[TextEncoder, MultimodalEncoder, MLMHead]:
    """Text encoder, multimodal encoder and tied MLM head; loads ``cfg.init`` when it is set."""
    text = TextEncoder(cfg)
    fusion = MultimodalEncoder(cfg, video_width=video_width)
    head = MLMHead(cfg, text.word_embeddings)
    if cfg.init:
        load_bert_weights(text, fusion, cfg.init, mlm_head=head, revision=cfg.init_revision)
    return text, fusion, head


# --------------------------------------------------------------------------- checkpoint loading


@dataclass
class LoadReport:
    """What :func:`load_bert_weights` did."""

    source: str
    loaded: list[str] = dataclasses.field(default_factory=list)  # model keys filled from the checkpoint
    ignored: list[str] = dataclasses.field(default_factory=list)  # checkpoint keys with no place here (pooler, NSP)
    not_in_checkpoint: list[str] = dataclasses.field(default_factory=list)  # kept at init (video_proj, MLM head)


_IGNORED = re.compile(
    r"(^|\.)(position_ids|token_type_ids)$|^pooler\.|^cls\.seq_relationship\.|^cls\.predictions\.decoder\.bias$"
)


def load_bert_weights(
    text_enc: TextEncoder,
    fusion_enc: nn.Module | None,
    source: str | os.PathLike[str] | dict[str, Tensor],
    *,
    mlm_head: MLMHead | None = None,
    revision: str = "",
) -> LoadReport:
    """Split a BERT checkpoint into the text encoder (embeddings + first layers) and the fusion encoder.

    Accepts BertModel keys (``embeddings.*``, ``encoder.layer.i.*``), BertForMaskedLM / BertForPreTraining keys
    (``bert.`` prefix, ``cls.predictions.*`` -> ``mlm_head``) and the old ``LayerNorm.gamma/beta`` names.
    The checkpoint must hold exactly ``text_layers + fusion_layers`` layers.

    Args:
        text_enc: receives ``embeddings`` and layers ``0 .. text_layers - 1``.
        fusion_enc: receives layers ``text_layers ..`` (its ``video_proj`` and ``crossattention`` parts are not BERT
            and keep their init); None when there is no fusion (a dual encoder): those layers are then ignored.
        source: a state dict, a local ``.safetensors``/``.bin`` file or directory (``model.safetensors`` or
            ``pytorch_model.bin``), an ``s3://`` file, or a hub id (offline -> :class:`PretrainedUnavailableError`).
        mlm_head: receives ``cls.predictions.transform.*`` and ``cls.predictions.bias`` when present (and the
            decoder weight when the head is untied; a tied head reads the word embeddings).
        revision: the hub revision of a hub id (``""`` = the default branch); see :func:`read_bert_state_dict`.

    Raises:
        ValueError: layer count, vocabulary or shape mismatch, or BERT weights missing from the checkpoint.
    """
    name = "<state dict>" if isinstance(source, dict) else str(source)
    state = source if isinstance(source, dict) else read_bert_state_dict(name, revision)
    targets = _target_params(text_enc, fusion_enc, mlm_head)
    n_layers = text_enc.cfg.text_layers + text_enc.cfg.fusion_layers
    report = LoadReport(source=name)
    found_layers: set[int] = set()
    new_values: dict[str, Tensor] = {}
    for raw_key, value in state.items():
        key = _normalise_key(raw_key)
        layer = re.match(r"encoder\.layer\.(\d+)\.", key)
        if layer:
            found_layers.add(int(layer.group(1)))
        target = _map_key(key, text_enc.cfg.text_layers)
        if target is None or target not in targets:
            report.ignored.append(raw_key)
            continue
        if tuple(value.shape) != tuple(targets[target].shape):
            hint = " (vocabulary differs: use the checkpoint's own tokenizer)" if "word_embeddings" in target else ""
            raise ValueError(
                f"{name}: {raw_key} has shape {tuple(value.shape)}, model expects "
                f"{tuple(targets[target].shape)} for {target}{hint}"
            )
        new_values[target] = value
    if found_layers and found_layers != set(range(n_layers)):
        raise ValueError(
            f"{name}: checkpoint has {len(found_layers)} BERT layers, the config splits "
            f"{n_layers} (text_layers + fusion_layers)"
        )
    # not BERT: the fusion's video projection (ALPRO), its cross-attention (ALBEF; random, as ALBEF starts it)
    required = [k for k in targets if not k.startswith(("fusion.video_proj.", "mlm.")) and ".crossattention." not in k]
    missing = [k for k in required if k not in new_values]
    if missing:
        raise ValueError(
            f"{name}: BERT weights missing from the checkpoint: {missing[:8]}{' ...' if len(missing) > 8 else ''}"
        )
    with torch.no_grad():
        for k, v in new_values.items():
            targets[k].copy_(v.to(targets[k].dtype))
    report.loaded = sorted(new_values)
    report.not_in_checkpoint = sorted(k for k in targets if k not in new_values)
    return report


def _target_params(text_enc: TextEncoder, fusion_enc: nn.Module | None, head: MLMHead | None) -> dict[str, Tensor]:
    out = {f"text.{k}": v for k, v in text_enc.state_dict(keep_vars=True).items()}
    if fusion_enc is not None:
        out |= {f"fusion.{k}": v for k, v in fusion_enc.state_dict(keep_vars=True).items()}
    if head is not None:
        out |= {f"mlm.{k}": v for k, v in head.state_dict(keep_vars=True).items()}  # decoder_weight if untied
    return out


def _normalise_key(key: str) -> str:
    key = key.removeprefix("module.").removeprefix("bert.")
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))


def _map_key(key: str, text_layers: int) -> str | None:
    """Checkpoint key (normalised) -> ``text.*`` / ``fusion.*`` / ``mlm.*`` target key, or None to ignore."""
    if _IGNORED.search(key):
        return None
    if key.startswith("embeddings."):
        return f"text.{key}"
    m = re.match(r"encoder\.layer\.(\d+)\.(.+)$", key)
    if m:
        i, rest = int(m.group(1)), m.group(2)
        return f"text.layers.{i}.{rest}" if i < text_layers else f"fusion.layers.{i - text_layers}.{rest}"
    if key == "cls.predictions.decoder.weight":  # the tied copy of the word embeddings; loaded only if untied
        return "mlm.decoder_weight"
    if key.startswith("cls.predictions."):
        return "mlm." + key.removeprefix("cls.predictions.")
    return None


_BERT_REMEDY = (
    "Set TextConfig.init (model.text_init) to a local directory/file or s3:// URI holding model.safetensors, or to "
    "'' for a random init."
)


def read_bert_state_dict(
    source: str, revision: str = "", *, what: str = "BERT weights", remedy: str = _BERT_REMEDY
) -> dict[str, Tensor]:
    """Tensors of a BERT checkpoint from a local/``s3://`` file or directory, or a hub id at ``revision``.

    Never unpickles arbitrary objects: safetensors first; ``.bin``/``.pt`` through ``torch.load(weights_only=True)``.
    Where the tensors came from is noted for the model directory's lineage
    (:func:`vlp.models.tokenizer.remember_upstream`): a hub id's repo, revision and resolved commit, a local or
    ``s3://`` file's SHA-256. ``what`` and ``remedy`` word the error of a hub id that cannot be fetched.

    Raises:
        FileNotFoundError: a path that holds no checkpoint.
        ValueError: a revision given with a path.
        PretrainedUnavailableError: a hub id (or revision) neither cached nor reachable, or not on the hub.
    """
    if looks_like_path(source) and storage.local_path(source) is None:  # an object store's file or directory
        check_no_revision(source, revision)
        is_file = source.endswith((".safetensors", ".bin", ".pt", ".pth"))
        with storage.local_copy(source if is_file else storage.join(source, "model.safetensors")) as path:
            return _read_recorded(source, path, "" if is_file else "model.safetensors")
    if looks_like_path(source):
        check_no_revision(source, revision)
        local = Path(source).expanduser()
        if local.is_dir():
            for fname in ("model.safetensors", "pytorch_model.bin"):
                if (local / fname).is_file():
                    return _read_recorded(source, str(local / fname), fname)
            raise FileNotFoundError(f"no BERT weights in {source!r}: expected model.safetensors or pytorch_model.bin")
        if not local.is_file():
            raise FileNotFoundError(f"no such BERT checkpoint: {source!r}")
        return _read_recorded(source, str(local))
    path, record = hub_download(source, ("model.safetensors", "pytorch_model.bin"), revision, what=what, remedy=remedy)
    remember_upstream(source, revision, record)
    return _read_file(path)


def _read_recorded(source: str, path: str, fname: str = "") -> dict[str, Tensor]:
    """The tensors of the local file ``path`` (the weights named ``source``), its SHA-256 noted as their upstream."""
    remember_upstream(source, "", file_record(path) | ({"file": fname} if fname else {}))
    return _read_file(path)


def _read_file(path: str) -> dict[str, Tensor]:
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state dict of tensors, got {type(state).__name__}")
    return {k: v for k, v in state.items() if isinstance(v, Tensor)}
