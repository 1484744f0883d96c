"""TimeSformer video encoder with divided space-time attention, built from timm's ViT parts (written here:
:mod:`vlp.models.layers.blocks`).

The encoder follows ALPRO (arXiv 2112.09583, §3.1) and TimeSformer (Bertasius et al., 2021): sparse frames are
patchified, each block applies temporal attention (each patch position attends over time), then spatial attention
(each frame attends over its patches and the video [CLS] token), then an MLP. The output is the video [CLS] token
followed by the patch tokens mean-pooled over time, so a 224 px input always gives 1 + 14 x 14 = 197 tokens.

Parameter names match a timm ViT (``cls_token``, ``pos_embed``, ``patch_embed.proj``, ``blocks.{i}.norm1/attn/
norm2/mlp``, ``norm``), plus the temporal parts ``time_embed`` and ``blocks.{i}.temporal_norm1/temporal_attn/
temporal_fc``, so a ViT checkpoint maps onto the spatial path one to one (see :func:`load_vit_weights`).

CLS handling (as in facebookresearch/TimeSformer and salesforce/ALPRO ``src/modeling/timesformer/vit.py``): there
is one [CLS] token per video. It takes no part in temporal attention and gets no time embedding. In the spatial step
it is copied into every frame, attends with that frame's patches, and the T per-frame [CLS] attention outputs are
averaged into one residual update; the MLP then runs on the single [CLS] token and all patch tokens. The final
LayerNorm is applied before the temporal mean, as in ALPRO's ``forward_features(pooling='temporal')``.

Paper vs released code (choices exposed as config fields):

- Initialisation. Paper: ViT-B/16 pre-trained on ImageNet-21k for both spatial and temporal blocks (§3.4). The
  ``paper`` preset names ``vit_base_patch16_224.orig_in21k``. The released ALPRO code loads timm's default
  ``vit_base_patch16_224`` (its ``default_cfgs`` URL is the in21k -> in1k fine-tuned checkpoint, timm tag
  ``vit_base_patch16_224.orig_in21k_ft_in1k``); pass that name as ``init`` to follow the code.
- ``temporal_fc`` starts at zero in every block. The TimeSformer source zeroes it only for blocks with counter
  ``i > 0``, but its counter also counts the enclosing ``ModuleList``, so in effect every block is zeroed too.
- Embedding resizing. The released code resizes ``pos_embed`` and ``time_embed`` with ``nearest`` interpolation
  (and, when loading a ViT, over the flattened 1D patch sequence). Here the defaults are 2D ``bicubic`` over the
  patch grid (``pos_interp``) and 1D ``linear`` over time (``time_interp``); ``"nearest"`` is available for both.
- Stochastic depth is applied to the reshaped batches as in TimeSformer: per (video, patch position) for the
  temporal residual, per (video, frame) for the spatial residual and per video for the MLP residual.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vlp.models.layers.blocks import Attention, DropPath, Mlp, PatchEmbed, layer_norm, trunc_normal_
from vlp.models.tokenizer import (
    PretrainedUnavailableError,
    check_no_revision,
    file_record,
    hub_download,
    remember_upstream,
)

_CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")
# Parameters of a timm ViT that a token encoder has no use for (classification head and its pooling norm).
_IGNORED_PREFIXES = ("head.", "head_drop.", "fc_norm.")


def vit_size_problems(cfg: object) -> list[str]:
    """What is wrong with a ViT-style config's ``img_size``, ``patch_size``, ``width``, ``heads``, ``num_frames``,
    ``depth`` and ``drop_path`` (empty when nothing is)."""
    c: Any = cfg
    problems = []
    if c.patch_size < 1 or c.img_size % c.patch_size:
        problems.append(f"img_size={c.img_size} must be a positive multiple of patch_size={c.patch_size}")
    if c.heads < 1 or c.width % c.heads:
        problems.append(f"width={c.width} must be divisible by heads={c.heads}")
    if c.num_frames < 1 or c.depth < 1:
        problems.append(f"num_frames={c.num_frames} and depth={c.depth} must be >= 1")
    if not 0.0 <= c.drop_path < 1.0:
        problems.append(f"drop_path={c.drop_path} must be in [0, 1)")
    return problems


@dataclass(frozen=True)
class TimeSformerConfig:
    """Size and initialisation of a :class:`TimeSformer`.

    Attributes:
        img_size: Side of the square training frames in pixels (sets the size of ``pos_embed``).
        patch_size: Side of a square patch in pixels.
        num_frames: Frames per clip the time embedding is sized for (other counts are interpolated).
        width: Token width C.
        depth: Number of divided space-time blocks.
        heads: Attention heads (same for temporal and spatial attention).
        mlp_ratio: MLP hidden width as a multiple of ``width``.
        drop_path: Stochastic depth rate of the last block (linearly increasing from 0 over the blocks).
        grad_checkpointing: Recompute each block in the backward pass to save activation memory.
        init: ``""`` for random init, else a timm model name (needs hub access) or the local path of a timm ViT
            (or TimeSformer) state dict in ``.safetensors``, ``.bin``, ``.pth`` or ``.pt`` format.
        init_revision: Hub revision (branch, tag or commit sha) of the repository a timm name's weights live in
            (``timm/<name>``); ``""`` = its default branch (``main``) as it is at load time. Either way the commit
            loaded is recorded in the model directory's ``lineage.upstream.video``; set this to that sha to
            start from exactly the same weights again.
        pos_interp: Mode for resizing ``pos_embed`` over the 2D patch grid (``"bicubic"``; code: ``"nearest"``).
        time_interp: Mode for resizing ``time_embed`` over frames (``"linear"``; code: ``"nearest"``).
    """

    img_size: int = 224
    patch_size: int = 16
    num_frames: int = 4
    width: int = 768
    depth: int = 12
    heads: int = 12
    mlp_ratio: float = 4.0
    drop_path: float = 0.1
    grad_checkpointing: bool = False
    init: str = ""
    pos_interp: str = "bicubic"
    time_interp: str = "linear"
    init_revision: str = ""

    def __post_init__(self) -> None:
        problems = vit_size_problems(self)
        if self.init_revision and not self.init:
            problems.append(f"init_revision={self.init_revision!r} needs init (a timm name): set both or neither")
        if self.pos_interp not in ("nearest", "bilinear", "bicubic"):
            problems.append(f"pos_interp={self.pos_interp!r} must be one of 'nearest', 'bilinear', 'bicubic'")
        if self.time_interp not in ("nearest", "linear"):
            problems.append(f"time_interp={self.time_interp!r} must be 'nearest' or 'linear'")
        if problems:
            raise ValueError("invalid TimeSformerConfig: " + "; ".join(problems))

    @property
    def grid(self) -> int:
        """Patches per side at ``img_size``."""
        return self.img_size // self.patch_size

    @classmethod
    def tiny(cls, **overrides: Any) -> TimeSformerConfig:
        """2 layers, width 64, 32 px frames in 8 px patches, 2 frames: seconds on a CPU (tests)."""
        base = cls(img_size=32, patch_size=8, num_frames=2, width=64, depth=2, heads=2, drop_path=0.0)
        return replace(base, **overrides)

    @classmethod
    def paper(cls, **overrides: Any) -> TimeSformerConfig:
        """ViT-B/16 at 224 px, 4 pre-training frames, drop path 0.1, ImageNet-21k init (ALPRO §3.4)."""
        base = cls(init="vit_base_patch16_224.orig_in21k")
        return replace(base, **overrides)


@dataclass
class VideoEncoderOutput:
    """Outputs of :class:`TimeSformer`.

    Attributes:
        tokens: (B, 1 + N, C) the video [CLS] token then the N patch tokens averaged over time, after the final norm.
        frame_tokens: (B, T, N, C) the normalised patch tokens of every frame before the temporal mean.
        grid: Patch grid (rows, cols) of the input, N = rows * cols.
    """

    tokens: Tensor
    frame_tokens: Tensor
    grid: tuple[int, int]


class DividedSTBlock(nn.Module):
    """Temporal attention, then spatial attention, then MLP (TimeSformer "divided space-time" block).

    Args:
        dim: Token width C.
        heads: Attention heads.
        mlp_ratio: MLP hidden width as a multiple of ``dim``.
        drop_path: Stochastic depth rate of the three residual branches.
    """

    def __init__(self, dim: int, heads: int, *, mlp_ratio: float = 4.0, drop_path: float = 0.0) -> None:
        super().__init__()
        self.temporal_norm1 = layer_norm(dim)
        self.temporal_attn = Attention(dim, num_heads=heads, qkv_bias=True)
        self.temporal_fc = nn.Linear(dim, dim)
        self.norm1 = layer_norm(dim)
        self.attn = Attention(dim, num_heads=heads, qkv_bias=True)
        self.norm2 = layer_norm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, cls: Tensor, patches: Tensor) -> tuple[Tensor, Tensor]:
        """Update the video [CLS] token (B, 1, C) and the patch tokens (B, T, N, C); returns both, same shapes."""
        B, T, N, C = patches.shape
        # Temporal: every patch position attends over the T frames; [CLS] is left out.
        xt = patches.permute(0, 2, 1, 3).reshape(B * N, T, C)  # (B*N, T, C)
        res_t = self.temporal_fc(self.drop_path(self.temporal_attn(self.temporal_norm1(xt))))  # (B*N, T, C)
        patches = patches + res_t.reshape(B, N, T, C).permute(0, 2, 1, 3)  # (B, T, N, C)

        # Spatial: every frame attends over its own patches plus a copy of the video [CLS] token.
        xs = torch.cat([cls.unsqueeze(1).expand(B, T, 1, C), patches], dim=2).reshape(B * T, 1 + N, C)
        res_s = self.drop_path(self.attn(self.norm1(xs))).reshape(B, T, 1 + N, C)  # (B, T, 1+N, C)
        cls = cls + res_s[:, :, 0].mean(dim=1, keepdim=True)  # (B, 1, C): per-frame [CLS] updates averaged
        patches = patches + res_s[:, :, 1:]  # (B, T, N, C)

        # MLP over the one [CLS] token and all T*N patch tokens of each video.
        x = torch.cat([cls, patches.reshape(B, T * N, C)], dim=1)  # (B, 1+T*N, C)
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x[:, :1], x[:, 1:].reshape(B, T, N, C)


class TimeSformer(nn.Module):
    """Video encoder: (B, T, 3, H, W) frames -> [CLS] + time-averaged patch tokens (B, 1 + H*W/P^2, C).

    Frame counts other than ``config.num_frames`` and frame sizes other than ``config.img_size`` (any multiple of
    the patch size, also non-square) are handled by interpolating ``time_embed`` and ``pos_embed`` on the fly.

    Args:
        config: Sizes and initialisation; with ``config.init`` set, weights are loaded by :func:`load_vit_weights`.
    """

    def __init__(self, config: TimeSformerConfig) -> None:
        super().__init__()
        self.config = config
        self.width = config.width
        self.grad_checkpointing = config.grad_checkpointing
        C, g = config.width, config.grid
        self.patch_embed = PatchEmbed(config.patch_size, 3, C)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, C))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + g * g, C))
        self.time_embed = nn.Parameter(torch.zeros(1, config.num_frames, C))
        rates = torch.linspace(0, config.drop_path, config.depth).tolist()
        self.blocks = nn.ModuleList(
            DividedSTBlock(C, config.heads, mlp_ratio=config.mlp_ratio, drop_path=r) for r in rates
        )
        self.norm = layer_norm(C)
        self._init_weights()
        if config.init:
            load_vit_weights(self, config.init, revision=config.init_revision)

    def _init_weights(self) -> None:
        trunc_normal_(self.pos_embed, std=0.02)
        trunc_normal_(self.cls_token, std=0.02)
        for m in self.blocks.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        for blk in self.blocks:  # temporal branch starts as the identity
            assert isinstance(blk, DividedSTBlock)
            nn.init.zeros_(blk.temporal_fc.weight)
            nn.init.zeros_(blk.temporal_fc.bias)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Turn per-block activation recomputation on or off."""
        self.grad_checkpointing = enable

    def no_weight_decay(self) -> set[str]:
        """Names of embedding parameters usually excluded from weight decay."""
        return {"pos_embed", "cls_token", "time_embed"}

    def forward(self, video: Tensor) -> VideoEncoderOutput:
        """Encode a batch of clips.

        Args:
            video: (B, T, 3, H, W) float frames, H and W multiples of ``config.patch_size``.

        Returns:
            :class:`VideoEncoderOutput` with ``tokens`` (B, 1 + N, C), N = (H / P) * (W / P), for any T.
        """
        B, T, gh, gw = self._check_input(video)
        N, C = gh * gw, self.width
        pos = resample_pos_embed(self.pos_embed, (gh, gw), self.config.pos_interp)  # (1, 1+N, C)
        time = _resample_time_embed(self.time_embed, T, self.config.time_interp)  # (1, T, C)
        x = self.patch_embed(video.flatten(0, 1)).reshape(B, T, N, C)  # (B, T, N, C)
        patches = x + pos[:, None, 1:] + time[:, :, None]  # (B, T, N, C)
        cls = self.cls_token.expand(B, -1, -1) + pos[:, :1]  # (B, 1, C)
        for blk in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                cls, patches = checkpoint(blk, cls, patches, use_reentrant=False)
            else:
                cls, patches = blk(cls, patches)
        cls, patches = self.norm(cls), self.norm(patches)
        tokens = torch.cat([cls, patches.mean(dim=1)], dim=1)  # (B, 1+N, C)
        return VideoEncoderOutput(tokens=tokens, frame_tokens=patches, grid=(gh, gw))

    def _check_input(self, video: Tensor) -> tuple[int, int, int, int]:
        P = self.config.patch_size
        if video.ndim != 5 or video.shape[2] != 3:
            hint = ""
            if video.ndim == 5 and video.shape[1] == 3:
                hint = " It looks channels-first (B, 3, T, H, W); use video.permute(0, 2, 1, 3, 4)."
            raise ValueError(f"TimeSformer expects video of shape (B, T, 3, H, W), got {tuple(video.shape)}.{hint}")
        B, T, _, H, W = video.shape
        if B < 1 or T < 1 or H < P or W < P or H % P or W % P:
            raise ValueError(
                f"TimeSformer got video of shape {tuple(video.shape)}: need B, T >= 1 and H, W positive multiples of "
                f"the patch size {P}; resize or crop the frames (e.g. to {self.config.img_size} px)."
            )
        return B, T, H // P, W // P


def resample_pos_embed(pos_embed: Tensor, grid: tuple[int, int], mode: str) -> Tensor:
    """Resize (1, 1 + g*g, C) position embeddings to (1, 1 + gh*gw, C); the [CLS] position is kept as is."""
    n_old = pos_embed.shape[1] - 1
    g = math.isqrt(n_old)
    if g * g != n_old:
        raise ValueError(
            f"pos_embed has {pos_embed.shape[1]} positions; expected 1 class position + a square patch grid "
            "(checkpoints without a class position or with register tokens are not supported)"
        )
    if (g, g) == tuple(grid):
        return pos_embed
    C = pos_embed.shape[-1]
    old = pos_embed[:, 1:].float().reshape(1, g, g, C).permute(0, 3, 1, 2)  # (1, C, g, g)
    smooth = mode in ("bilinear", "bicubic")
    new = F.interpolate(old, size=grid, mode=mode, align_corners=False if smooth else None, antialias=smooth)
    new = new.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], C).to(pos_embed.dtype)  # (1, gh*gw, C)
    return torch.cat([pos_embed[:, :1], new], dim=1)


def _resample_time_embed(time_embed: Tensor, num_frames: int, mode: str) -> Tensor:
    """Resize (1, T0, C) time embeddings to (1, num_frames, C) by 1D interpolation over frames."""
    if time_embed.shape[1] == num_frames:
        return time_embed
    old = time_embed.float().transpose(1, 2)  # (1, C, T0)
    new = F.interpolate(old, size=num_frames, mode=mode, align_corners=False if mode == "linear" else None)
    return new.transpose(1, 2).to(time_embed.dtype)  # (1, T, C)


def load_vit_weights(model: TimeSformer, source: str | os.PathLike[str], *, revision: str = "") -> list[str]:
    """Initialise a :class:`TimeSformer` from a timm ViT (or a TimeSformer) checkpoint.

    Spatial weights are copied one to one. Temporal attention and its norm start as copies of the spatial ones
    (unless the checkpoint has its own), ``temporal_fc`` and ``time_embed`` start at zero, so a static clip is
    encoded exactly as the ViT encodes the image. ``pos_embed`` is resized over the 2D patch grid (class position
    kept) and ``time_embed`` over frames when the sizes differ, with the modes set in ``model.config``.

    Args:
        model: The encoder to fill, in place.
        source: Local path of a state dict (``.safetensors`` read with safetensors; ``.bin``/``.pth``/``.pt``
            read with ``torch.load(weights_only=True)``, optionally wrapped under ``"model"``/``"state_dict"``),
            or a timm model name (see :func:`read_vit_state_dict`).
        revision: Hub revision of a timm name's weights (``""`` = the default branch).

    Returns:
        Checkpoint keys that were deliberately not used (classification head).

    Raises:
        FileNotFoundError: ``source`` looks like a path but does not exist.
        RuntimeError: a timm model name could not be loaded (e.g. offline, or no such revision); the message says
            to pass a path.
        ValueError: the checkpoint is unreadable or does not fit the model (width, depth, patch size, extra parts),
            or a revision was given with a path.
    """
    state = read_vit_state_dict(source, revision)
    mapped, ignored = _map_vit_state_dict(state, model, str(source))
    model.load_state_dict(mapped, strict=True)
    return ignored


def read_vit_state_dict(source: str | os.PathLike[str], revision: str = "") -> dict[str, Tensor]:
    """The tensors of a ViT checkpoint file, or of a timm model name's pretrained weights.

    A timm name whose pretrained config names a hub repository (``timm/<name>``: nearly all), or an
    ``hf-hub:<repo>`` name, is fetched from there (``model.safetensors``, else ``pytorch_model.bin``) at
    ``revision`` (``""`` = the default branch), resolved to a commit first; other timm names are created by timm
    with ``pretrained=True`` (URL weights; no revision). Where the tensors came from is noted
    for the model directory's lineage (:func:`vlp.models.tokenizer.remember_upstream`): the repo, revision and
    commit, a file's SHA-256, or the URL.
    """

    path = Path(source).expanduser()
    if path.is_file():
        check_no_revision(str(source), revision)
        state = _read_checkpoint_file(path)
        remember_upstream(str(source), "", file_record(path))
        return state
    text = str(source)
    is_hub_name = text.startswith(("hf-hub:", "hf_hub:"))
    if text.endswith(_CHECKPOINT_SUFFIXES) or path.exists() or (not is_hub_name and ("/" in text or os.sep in text)):
        raise FileNotFoundError(f"ViT checkpoint {text!r} is not a file; pass a state dict file {_CHECKPOINT_SUFFIXES}")
    return _read_timm_weights(text, revision)


_TIMM_REMEDY = (
    "Without hub access, fetch the checkpoint elsewhere and pass its local path (.safetensors, .bin or .pth state "
    "dict of a timm ViT) instead of the model name."
)


def _read_timm_weights(name: str, revision: str) -> dict[str, Tensor]:
    """A timm name's pretrained weights: from its hub repository at ``revision``, else through timm (URL)."""
    import timm
    from timm.models import get_pretrained_cfg

    hub_name = name.startswith(("hf-hub:", "hf_hub:"))
    try:
        cfg = None if hub_name else get_pretrained_cfg(name)
    except RuntimeError as err:  # a known architecture with an unknown pretrained tag
        raise RuntimeError(f"timm has no pretrained weights {name!r} ({err}). {_TIMM_REMEDY}") from err
    hub_id = name[len("hf-hub:") :] if hub_name else getattr(cfg, "hf_hub_id", None) or ""
    if hub_id:
        repo, _, pinned = hub_id.partition("@")
        files: tuple[str, ...] = ("model.safetensors", "pytorch_model.bin")
        files = (cfg.hf_hub_filename,) if cfg is not None and cfg.hf_hub_filename else files
        try:
            path, record = hub_download(repo, files, revision or pinned, what="timm weights", remedy=_TIMM_REMEDY)
        except PretrainedUnavailableError as err:
            raise RuntimeError(f"could not fetch the pretrained weights of timm model {name!r}: {err}") from err
        remember_upstream(name, revision, record)
        return _read_checkpoint_file(Path(path))
    if revision:
        raise ValueError(
            f"timm model {name!r} has no hub repository, so revision {revision!r} cannot pin its weights: clear the "
            "revision or pass a local checkpoint file"
        )
    try:
        vit = timm.create_model(name, pretrained=True)
    except Exception as err:
        raise RuntimeError(
            f"could not create timm model {name!r} with pretrained weights ({type(err).__name__}: {err}). "
            + _TIMM_REMEDY
        ) from err
    remember_upstream(name, "", {"url": getattr(cfg, "url", "") or ""})
    return vit.state_dict()


def _read_checkpoint_file(path: Path) -> dict[str, Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            obj: object = load_file(str(path), device="cpu")
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(
            f"could not read ViT checkpoint {str(path)!r} ({type(err).__name__}: {err}); expected a plain state "
            "dict of tensors (safetensors, or a torch.save'd dict loadable with weights_only=True)"
        ) from err
    for key in ("model", "state_dict", "module"):
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
    if not isinstance(obj, Mapping) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(f"ViT checkpoint {str(path)!r} is not a mapping of parameter names to tensors")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def _map_vit_state_dict(
    state: Mapping[str, Tensor], model: TimeSformer, source: str
) -> tuple[dict[str, Tensor], list[str]]:
    """Turn a ViT (or TimeSformer) state dict into a complete TimeSformer state dict for ``model``."""
    cfg, target = model.config, model.state_dict()
    ignored = sorted(k for k in state if k.startswith(_IGNORED_PREFIXES))
    unknown = sorted(k for k in state if k not in target and k not in ignored)
    if unknown:
        raise ValueError(
            f"checkpoint {source!r} has parameters this TimeSformer cannot hold: {unknown[:8]}"
            f"{' ...' if len(unknown) > 8 else ''} (check depth={cfg.depth}; layer scale, register tokens and "
            "pre-norm ViTs are not supported)"
        )
    out = {k: v for k, v in state.items() if k in target}
    if "pos_embed" in out:
        out["pos_embed"] = resample_pos_embed(out["pos_embed"], (cfg.grid, cfg.grid), cfg.pos_interp)
    if "time_embed" in out:
        out["time_embed"] = _resample_time_embed(out["time_embed"], cfg.num_frames, cfg.time_interp)
    for key in target:  # temporal parts a ViT lacks: copies of the spatial ones, or zero
        spatial = key.replace("temporal_norm1", "norm1").replace("temporal_attn", "attn")
        if key not in out and spatial != key and spatial in out:
            out[key] = out[spatial].clone()
        elif key not in out and (".temporal_fc." in key or key == "time_embed"):
            out[key] = torch.zeros_like(target[key])
    missing = sorted(set(target) - set(out))
    wrong = [
        f"{k}: checkpoint {tuple(out[k].shape)} vs model {tuple(v.shape)}"
        for k, v in target.items()
        if k in out and out[k].shape != v.shape
    ]
    if missing or wrong:
        raise ValueError(
            f"checkpoint {source!r} does not fit TimeSformer(width={cfg.width}, depth={cfg.depth}, "
            f"patch_size={cfg.patch_size}): missing {missing[:8]}, shape mismatches {wrong[:4]}"
        )
    return {k: v.to(target[k].dtype) for k, v in out.items()}, ignored
