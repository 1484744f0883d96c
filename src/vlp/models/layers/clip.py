"""CLIP's two towers, written here: TS2-Net is built from these modules.

They are the modules transformers' ``CLIPModel`` (5.x, ``modeling_clip``) builds, with its parameter names (a
transformers CLIP checkpoint and every TS2-Net model directory load unchanged), its construction and initialisation
order (a seeded random build gives the same weights: :class:`Clip` draws as ``CLIPModel`` does) and its arithmetic
on its default attention path (``sdpa``): the same operations in the same order, so a forward and a backward give
the same bits (``tests/test_clip_layers.py`` compares them with transformers'). Importing transformers' model code
costs about 2 s of start-up (it pulls ``torch._dynamo`` and ``torch.distributed.tensor``) in every process that
builds a model; this module imports torch alone.

The text tower attends causally: with no padding in the batch through ``scaled_dot_product_attention``'s
``is_causal``, else with a boolean mask of the real keys up to each query (:func:`vlp.models.layers.bert.causal_mask`),
as transformers does. Neither tower pools: TS2-Net reads the text tower's last real token and every vision token.
In bf16 on the CPU attention runs as explicit matmuls, faster there than torch's kernel
(:mod:`vlp.models.layers.attention`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vlp.models.layers.attention import attend
from vlp.models.layers.bert import causal_mask

__all__ = ["Clip", "ClipEncoderLayer", "ClipTower"]


@dataclass(frozen=True)
class ClipTower:
    """One tower's sizes (transformers' ``CLIPTextConfig`` / ``CLIPVisionConfig`` fields of the same meaning)."""

    width: int  # hidden_size
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    intermediate: int  # intermediate_size
    layer_norm_eps: float = 1e-5


class ClipAttention(nn.Module):
    """Multi-head attention with separate ``q_proj`` / ``k_proj`` / ``v_proj`` and an ``out_proj``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        self.embed_dim, self.num_heads, self.head_dim = width, heads, width // heads
        self.scale = self.head_dim**-0.5
        self.k_proj = nn.Linear(width, width)  # transformers' construction order: k, v, q, out
        self.v_proj = nn.Linear(width, width)
        self.q_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, hidden_states: Tensor, mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        causal = is_causal and mask is None and q.shape[2] > 1
        out = attend(q, k, v, mask, scale=self.scale, is_causal=causal)
        out = out.reshape(out.shape[0], -1, q.shape[2], v.shape[-1]).transpose(1, 2).contiguous()
        return self.out_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous())


class ClipMLP(nn.Module):
    """``fc1``, quick GELU (``x * sigmoid(1.702 x)``), ``fc2``."""

    def __init__(self, width: int, intermediate: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, intermediate)
        self.fc2 = nn.Linear(intermediate, width)

    def forward(self, x: Tensor) -> Tensor:
        x = self.fc1(x)
        return self.fc2(x * torch.sigmoid(1.702 * x))


class ClipEncoderLayer(nn.Module):
    """A pre-norm CLIP block: ``x + self_attn(layer_norm1(x))``, then ``x + mlp(layer_norm2(x))``."""

    def __init__(self, tower: ClipTower) -> None:
        super().__init__()
        self.self_attn = ClipAttention(tower.width, tower.heads)
        self.layer_norm1 = nn.LayerNorm(tower.width, eps=tower.layer_norm_eps)
        self.mlp = ClipMLP(tower.width, tower.intermediate)
        self.layer_norm2 = nn.LayerNorm(tower.width, eps=tower.layer_norm_eps)

    def forward(self, x: Tensor, mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x), mask, is_causal)
        return x + self.mlp(self.layer_norm2(x))


class ClipEncoder(nn.Module):
    """A tower's blocks; ``grad_checkpointing`` recomputes each block's activations in the backward (training)."""

    def __init__(self, tower: ClipTower) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ClipEncoderLayer(tower) for _ in range(tower.layers))
        self.grad_checkpointing = False

    def forward(self, x: Tensor, mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        for layer in self.layers:
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, mask, is_causal, use_reentrant=False)
            else:
                x = layer(x, mask, is_causal)
        return x


class ClipTextEmbeddings(nn.Module):
    position_ids: Tensor  # (1, max_len), a buffer outside the state dict

    def __init__(self, vocab_size: int, max_len: int, width: int) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(max_len, width)
        self.register_buffer("position_ids", torch.arange(max_len).expand((1, -1)), persistent=False)

    def forward(self, input_ids: Tensor) -> Tensor:
        length, limit = input_ids.shape[-1], self.position_embedding.weight.shape[0]
        if length > limit:
            raise ValueError(f"text of {length} tokens exceeds the text tower's {limit} positions")
        return self.token_embedding(input_ids) + self.position_embedding(self.position_ids[:, :length])


class ClipTextTransformer(nn.Module):
    """Token ids ``(B, L)`` and their mask -> ``(B, L, C)`` states after the final LayerNorm (causal attention)."""

    def __init__(self, tower: ClipTower, vocab_size: int, max_len: int) -> None:
        super().__init__()
        self.embeddings = ClipTextEmbeddings(vocab_size, max_len, tower.width)
        self.encoder = ClipEncoder(tower)
        self.final_layer_norm = nn.LayerNorm(tower.width, eps=tower.layer_norm_eps)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.embeddings(input_ids)
        mask = None if bool(attention_mask.to(torch.bool).all()) else causal_mask(attention_mask, "sdpa", x.dtype)
        return self.final_layer_norm(self.encoder(x, mask, is_causal=True))


class ClipVisionEmbeddings(nn.Module):
    position_ids: Tensor  # (1, 1 + patches), a buffer outside the state dict

    def __init__(self, width: int, image_size: int, patch_size: int) -> None:
        super().__init__()
        self.embed_dim, self.image_size = width, image_size
        self.class_embedding = nn.Parameter(torch.randn(width))
        self.patch_embedding = nn.Conv2d(3, width, kernel_size=patch_size, stride=patch_size, bias=False)
        self.num_positions = (image_size // patch_size) ** 2 + 1
        self.position_embedding = nn.Embedding(self.num_positions, width)
        self.register_buffer("position_ids", torch.arange(self.num_positions).expand((1, -1)), persistent=False)

    def forward(self, pixel_values: Tensor) -> Tensor:
        batch, _, height, width = pixel_values.shape
        if height != self.image_size or width != self.image_size:
            raise ValueError(f"frames of {height}x{width} px do not match the vision tower's "
                             f"{self.image_size}x{self.image_size}")  # fmt: skip
        patches = self.patch_embedding(pixel_values.to(dtype=self.patch_embedding.weight.dtype))
        x = torch.cat([self.class_embedding.expand(batch, 1, -1), patches.flatten(2).transpose(1, 2)], dim=1)
        return x + self.position_embedding(self.position_ids)


class ClipVisionTransformer(nn.Module):
    """Images ``(B, 3, H, W)`` -> ``(B, 1 + N, C)`` tokens before ``post_layernorm`` (which the caller applies)."""

    def __init__(self, tower: ClipTower, image_size: int, patch_size: int) -> None:
        super().__init__()
        self.embeddings = ClipVisionEmbeddings(tower.width, image_size, patch_size)
        self.pre_layrnorm = nn.LayerNorm(tower.width, eps=tower.layer_norm_eps)  # sic: transformers' name
        self.encoder = ClipEncoder(tower)
        self.post_layernorm = nn.LayerNorm(tower.width, eps=tower.layer_norm_eps)

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.encoder(self.pre_layrnorm(self.embeddings(pixel_values)))


class Clip(nn.Module):
    """The text and vision towers, their projections to ``embed_dim`` and the logit scale (transformers' names),
    randomly initialised as transformers draws: each tower built and then initialised, children first (a generic draw
    for every Linear, Conv2d and Embedding, then CLIP's own draw over it per block), then the projections (a generic
    unit normal each, then CLIP's)."""

    def __init__(self, text: ClipTower, vocab_size: int, max_len: int, vision: ClipTower, image_size: int,
                 patch_size: int, embed_dim: int, logit_scale: float) -> None:  # fmt: skip
        super().__init__()
        self.text_model = ClipTextTransformer(text, vocab_size, max_len)
        _init_tower(self.text_model, text)
        self.vision_model = ClipVisionTransformer(vision, image_size, patch_size)
        _init_tower(self.vision_model, vision)
        self.visual_projection = nn.Linear(vision.width, embed_dim, bias=False)
        self.text_projection = nn.Linear(text.width, embed_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(logit_scale))
        with torch.no_grad():
            for projection in (self.visual_projection, self.text_projection):
                _generic(projection, 1.0)
            nn.init.normal_(self.text_projection.weight, std=text.width**-0.5)
            nn.init.normal_(self.visual_projection.weight, std=vision.width**-0.5)


@torch.no_grad()
def _init_tower(tower: nn.Module, sizes: ClipTower) -> None:
    for module in _children_first(tower):
        _generic(module, 0.02)
        _clip(module, sizes)


def _children_first(module: nn.Module) -> list[nn.Module]:
    order: list[nn.Module] = []
    for child in module.children():
        order += _children_first(child)
    return [*order, module]


def _generic(module: nn.Module, std: float) -> None:
    if isinstance(module, nn.Linear | nn.Conv2d):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=std)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def _clip(module: nn.Module, tower: ClipTower) -> None:
    deep = (2 * tower.layers) ** -0.5
    if isinstance(module, ClipTextEmbeddings):
        nn.init.normal_(module.token_embedding.weight, std=0.02)
        nn.init.normal_(module.position_embedding.weight, std=0.02)
    elif isinstance(module, ClipVisionEmbeddings):
        nn.init.normal_(module.class_embedding, std=module.embed_dim**-0.5)
        nn.init.normal_(module.patch_embedding.weight, std=0.02)
        nn.init.normal_(module.position_embedding.weight, std=0.02)
    elif isinstance(module, ClipAttention):
        for proj in (module.q_proj, module.k_proj, module.v_proj):
            nn.init.normal_(proj.weight, std=module.embed_dim**-0.5 * deep)
        nn.init.normal_(module.out_proj.weight, std=module.embed_dim**-0.5)
    elif isinstance(module, ClipMLP):
        nn.init.normal_(module.fc1.weight, std=(2 * tower.width) ** -0.5)
        nn.init.normal_(module.fc2.weight, std=tower.width**-0.5 * deep)
