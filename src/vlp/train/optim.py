"""AdamW with decoupled weight decay, linear warm-up then linear or cosine decay, and gradient clipping.

Weight decay: paper vs released code
------------------------------------
The ALPRO paper trains with AdamW and weight decay 0.001 (§3.4), and the released configs set
``"weight_decay": 0.001``. The released pre-training code never uses that value:
``setup_e2e_optimizer`` in ``src/optimization/utils.py`` of salesforce/ALPRO builds
``AdamW(model.parameters(), lr=opts.learning_rate, betas=opts.betas)`` without a
``weight_decay`` argument, and its AdamW (``src/optimization/adamw.py``, the Hugging Face copy
inherited from ClipBERT) defaults to ``weight_decay=0.0``. So every parameter, in one group, is
trained with *no* weight decay. ``weight_decay: 0`` reproduces that (one group, as the code builds);
the default applies the configured decay, as the paper says.

Which parameters are decayed (default mode)
--------------------------------------------
Decayed: every trainable parameter with at least two dimensions (linear / conv / embedding
matrices). Not decayed, following the usual BERT/ViT practice (timm, LAVIS, HF examples):

* parameters with fewer than two dimensions: biases, normalisation scales, scalar temperatures;
* every parameter of a normalisation module (``LayerNorm``, ``GroupNorm``, ``BatchNorm*``,
  ``RMSNorm``, ``InstanceNorm*``), whatever its shape;
* parameters whose name contains one of ``OptimConfig.no_decay_keywords`` (default: the
  position / time embeddings and the class token of ViT/TimeSformer), and parameters a module
  lists in a timm-style ``no_weight_decay()`` method (names relative to that module).

Other differences from the released code's AdamW: it adds ``eps`` (default there 1e-6) to
``sqrt(v)`` *before* bias correction, and decays with the already-updated weights; we use
``torch.optim.AdamW`` (``eps`` added after bias correction, decay applied first). ``eps`` is a
config value; the other two differences are of order ``eps`` and ``lr * wd`` and are left.

Learning-rate schedule
----------------------
``f(s) = s / W`` for ``s < W``, else ``max(0, (T - s) / (T - W))`` with ``W`` warm-up steps and
``T`` total optimiser steps (the ``warmup_linear`` of the ALPRO/ClipBERT code, ``W = int(ratio * T)``).
``schedule_index`` says which ``s`` the ``u``-th update (``u = 1..T``) uses:

* ``"one_based"`` (default; the ALPRO code sets the lr from its already incremented
  ``global_step``): ``s = u``, so the first update already moves (lr ``1/W``) and the last has lr 0;
* ``"zero_based"`` (Hugging Face ``get_linear_schedule_with_warmup``): ``s = u - 1``, so the first
  update has lr 0 and the last ``1 / (T - W)``.

ALBEF (§3.5 and its code) decays along a cosine to ``min_lr_ratio`` (1e-5 / 1e-4) and, in the code, warms up
from ``warmup_start_ratio`` (1e-5 / 1e-4) over 2,000 iterations; the paper says 1,000. ``schedule="cosine"``,
``min_lr_ratio``, ``warmup_start_ratio`` and ``warmup_steps`` express both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from vlp.settings import OptimSettings

# the ``adamw`` config value -> torch.optim.AdamW's arguments that pick its kernels
ADAMW_KERNELS: dict[str, dict[str, bool]] = {"foreach": {"foreach": True}, "fused": {"fused": True},
                                             "loop": {"foreach": False}}  # fmt: skip

_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
    nn.LocalResponseNorm,
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
)


@dataclass
class OptimConfig(OptimSettings):
    """The optimiser settings of a config section (:class:`vlp.settings.OptimSettings`: AdamW, the schedule,
    clipping; defaults: the ALPRO pre-training config) and the parts that are not config values: which update
    index the schedule reads, and which parameters the no-decay and lr-factor groups take."""

    schedule_index: Literal["one_based", "zero_based"] = "one_based"  # see module docstring
    no_decay_keywords: tuple[str, ...] = ("pos_embed", "time_embed", "cls_token")
    # the parameters fusion_lr_mult scales (the multimodal encoder and the heads, which start from random weights
    # when the towers do not) and those backbone_lr_mult scales (a pre-trained backbone tuned gently beside new
    # modules): the model family's (vlp.models.family.LrGroups; the steps pass them), none by default
    fusion_prefixes: tuple[str, ...] = ()
    backbone_prefixes: tuple[str, ...] = ()

    @classmethod
    def of(cls, section: OptimSettings, **internals: Any) -> OptimConfig:
        """The optimiser settings of a config section (any :class:`OptimSettings`, e.g. ``cfg.pretrain``) as
        they are, plus ``internals`` (the fields that are not config values)."""
        return cls(**{f.name: getattr(section, f.name) for f in fields(OptimSettings)}, **internals)

    def __post_init__(self) -> None:
        if self.lr < 0:
            raise ValueError(f"OptimConfig.lr must be >= 0, got {self.lr}")
        if self.fusion_lr_mult <= 0 or self.backbone_lr_mult <= 0:
            raise ValueError(f"OptimConfig.fusion_lr_mult and backbone_lr_mult must be > 0, got "
                             f"{self.fusion_lr_mult} / {self.backbone_lr_mult}")  # fmt: skip
        if self.weight_decay < 0:
            raise ValueError(f"OptimConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"OptimConfig.betas must be two values in [0, 1), got {self.betas}")
        # AdamW's first update hands float32 kernels lr / (1 - beta1) and lr * weight_decay for each group
        scale = max(self.fusion_lr_mult, self.backbone_lr_mult, 1.0) * max(1 / (1 - self.betas[0]), self.weight_decay)
        if not self.lr * scale <= torch.finfo(torch.float32).max:  # also inf and nan
            raise ValueError(f"OptimConfig.lr={self.lr:g} is too large: AdamW's first update scales a step by "
                             f"{self.lr * scale:g}, past float32's largest value; a learning rate is a small "
                             "number such as 1e-4")  # fmt: skip
        if not 0.0 <= self.warmup_ratio <= 1.0:
            raise ValueError(f"OptimConfig.warmup_ratio must be in [0, 1], got {self.warmup_ratio}")
        if self.warmup_steps < 0:
            raise ValueError(f"OptimConfig.warmup_steps must be >= 0 (0 = warmup_ratio), got {self.warmup_steps}")
        if self.schedule not in ("linear", "cosine") or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"OptimConfig.schedule must be 'linear' or 'cosine' and min_lr_ratio in [0, 1], got "
                             f"{self.schedule!r} / {self.min_lr_ratio}")  # fmt: skip
        if not 0 <= self.warmup_start_ratio <= 1:
            raise ValueError(f"OptimConfig.warmup_start_ratio must be in [0, 1], got {self.warmup_start_ratio}")
        if self.adamw not in ADAMW_KERNELS:
            raise ValueError(f"OptimConfig.adamw must be one of {list(ADAMW_KERNELS)}, got {self.adamw!r}")
        if self.schedule_index not in ("one_based", "zero_based"):
            raise ValueError(
                f"OptimConfig.schedule_index must be 'one_based' or 'zero_based', got {self.schedule_index!r}"
            )


def split_decay_params(model: nn.Module, no_decay_keywords: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """Names of the trainable parameters that get weight decay and of those that do not.

    Args:
        model: The module whose ``named_parameters()`` are split (frozen ones are left out).
        no_decay_keywords: Substrings of parameter names that exempt them from decay.

    Returns:
        ``(decay_names, no_decay_names)``, each in ``named_parameters()`` order.
    """
    keywords = tuple(no_decay_keywords)
    exempt: set[str] = set()
    for mod_name, module in model.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        if isinstance(module, _NORM_TYPES):
            exempt.update(prefix + n for n, _ in module.named_parameters(recurse=False))
        listed = getattr(module, "no_weight_decay", None)
        if callable(listed):
            exempt.update(prefix + n for n in listed())
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim < 2 or name in exempt or any(k in name for k in keywords):
            no_decay.append(name)
        else:
            decay.append(name)
    return decay, no_decay


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of ``model`` (see the module docstring for the groups).

    Args:
        model: The (unwrapped) model.
        cfg: Optimiser settings.

    Returns:
        ``torch.optim.AdamW`` with two groups (decay, no decay), or one group when ``cfg.weight_decay`` is 0;
        with ``fusion_lr_mult != 1`` each is split again, the parameters under ``fusion_prefixes`` getting
        ``lr * fusion_lr_mult``, and likewise with ``backbone_lr_mult != 1`` for ``backbone_prefixes``. Empty
        groups are omitted.

    Raises:
        ValueError: if the model has no trainable parameter.
    """
    params = dict(model.named_parameters())
    groups: list[dict[str, Any]]
    if cfg.weight_decay == 0:  # nothing to exempt from decay: one group (what the released ALPRO code builds)
        groups = [{"params": [p for p in params.values() if p.requires_grad], "weight_decay": 0.0}]
    else:
        decay, no_decay = split_decay_params(model, cfg.no_decay_keywords)
        groups = [
            {"params": [params[n] for n in decay], "weight_decay": cfg.weight_decay},
            {"params": [params[n] for n in no_decay], "weight_decay": 0.0},
        ]
    names = {id(p): n for n, p in params.items()}
    for mult, prefixes in ((cfg.fusion_lr_mult, cfg.fusion_prefixes), (cfg.backbone_lr_mult, cfg.backbone_prefixes)):
        if mult == 1.0:
            continue
        split = []
        for g in groups:
            inside = [p for p in g["params"] if names[id(p)].startswith(prefixes)]
            rest = [p for p in g["params"] if not names[id(p)].startswith(prefixes)]
            split += [g | {"params": rest}, g | {"params": inside, "lr": g.get("lr", cfg.lr) * mult}]
        groups = split
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ValueError("build_optimizer: the model has no trainable parameter (all requires_grad=False?)")
    kernels = ADAMW_KERNELS[cfg.adamw]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]), eps=cfg.eps, **kernels)


def warmup_steps_for(cfg: OptimConfig, total_steps: int) -> int:
    """Warm-up length in optimiser steps: ``cfg.warmup_steps``, or when 0, ``int(cfg.warmup_ratio * total_steps)``."""
    return cfg.warmup_steps if cfg.warmup_steps else int(cfg.warmup_ratio * total_steps)


def linear_warmup_decay(
    step: int,
    warmup_steps: int,
    total_steps: int,
    *,
    shape: str = "linear",
    floor: float = 0.0,
    start: float = 0.0,
) -> float:
    """Schedule factor ``f(step)``: from ``start`` up to 1 during warm-up (``start + (1 - start) * step / W``),
    then down to ``floor`` at ``total_steps``, linearly (``shape="linear"``) or along half a cosine (``"cosine"``).
    With the defaults: ``step / W``, then linear decay to 0 (the ALPRO code)."""
    if step < warmup_steps:
        return start + (1.0 - start) * step / warmup_steps
    if total_steps <= warmup_steps:
        return floor
    done = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    left = 1.0 - done if shape == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))
    return floor + (1.0 - floor) * left


class LinearWarmupDecay:
    """The schedule as a callable object, so ``LambdaLR.state_dict()`` stores its numbers, not a function."""

    def __init__(
        self, warmup_steps: int, total_steps: int, offset: int, shape: str = "linear", floor: float = 0.0,
        start: float = 0.0,
    ) -> None:  # fmt: skip
        self.warmup_steps, self.total_steps, self.offset = warmup_steps, total_steps, offset
        self.shape, self.floor, self.start = shape, floor, start

    def __call__(self, updates_done: int) -> float:
        return linear_warmup_decay(
            updates_done + self.offset, self.warmup_steps, self.total_steps, shape=self.shape, floor=self.floor,
            start=self.start,
        )  # fmt: skip


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int) -> LambdaLR:
    """Linear warm-up then linear (or cosine) decay over ``total_steps`` optimiser steps (``step()`` per update).

    Args:
        optimizer: The optimiser whose groups' ``lr`` is scaled.
        cfg: Supplies the warm-up length and ``schedule_index``.
        total_steps: Number of optimiser updates of the whole run (not micro-batches).

    Raises:
        ValueError: if ``total_steps < 1`` or the warm-up is longer than the run.
    """
    if total_steps < 1:
        raise ValueError(f"build_scheduler: total_steps must be >= 1, got {total_steps}")
    warmup = warmup_steps_for(cfg, total_steps)
    if warmup > total_steps:
        raise ValueError(f"warm-up ({warmup} steps) is longer than the run ({total_steps} steps); lower warmup_steps")
    offset = 1 if cfg.schedule_index == "one_based" else 0
    schedule = LinearWarmupDecay(warmup, total_steps, offset, cfg.schedule, cfg.min_lr_ratio, cfg.warmup_start_ratio)
    return LambdaLR(optimizer, schedule)


def clip_gradients(parameters: Iterable[Tensor], max_norm: float | None) -> Tensor:
    """Clip the global L2 norm of the gradients in place to ``max_norm`` (no clipping when None or <= 0).

    Returns:
        The total gradient norm *before* clipping, a scalar tensor (for logging).
    """
    params = [p for p in parameters if p.grad is not None]
    if max_norm is None or max_norm <= 0:
        if not params:
            return torch.zeros(())
        norms = torch.stack([g.detach().float().norm(2) for p in params if (g := p.grad) is not None])  # (P,)
        return norms.norm(2)
    return torch.nn.utils.clip_grad_norm_(params, max_norm)
