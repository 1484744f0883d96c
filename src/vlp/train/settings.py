"""Config sections of the training steps (``model``, ``pretrain``): plain dataclasses, no torch import.

They live apart from the code that uses them so that :mod:`vlp.config` can compose them without
importing torch for the data steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class ModelConfig:
    """Which ALPRO-family model to build, and from what."""

    preset: Literal["tiny", "small", "paper"] = "tiny"  # tiny: width 64 (tests); small: width 256 (CPU runs); paper
    img_size: int = 32  # frame side fed to the video tower (frames are resized on the fly if stored larger)
    num_frames: int = 4  # frames per clip (ALPRO pre-training: 4)
    max_len: int = 30  # text tokens incl. [CLS]/[SEP] (ALPRO pre-training: 30; fine-tuning 40/50)
    vocab_size: int = 1000  # WordPiece size when the tokenizer is trained from the captions
    tokenizer: str = ""  # tokenizer dir / hub name; "" = train WordPiece on the training captions
    video_init: str = ""  # timm ViT name or local path for the video tower ("" = random init)
    text_init: str = ""  # BERT name or local path for the text + fusion layers ("" = random init)
    embed_dim: int = 256  # VTC projection size
    losses: list[str] = field(default_factory=lambda: ["vtc", "pem", "mlm", "vtm"])  # terms of eq. 6
    pem_rule: Literal["paper", "official_code"] = "paper"  # PEM pseudo-label discard rule
    pem_crop: Literal["resize", "zero_outside"] = "resize"  # prompter input: real crop, or zeroed outside
    bank_renormalize: bool = False  # re-normalise each entity's ensembled prompt embedding (code: False)
    num_entities: int = 1000  # prompt-bank size M: the top-M mined entities (fewer if fewer were mined)


@dataclass
class PretrainConfig:
    """Optimisation and data settings of ``pretrain-prompter`` and ``pretrain``."""

    max_steps: int = 100  # optimiser updates
    batch_size: int = 8  # clips per micro-batch per process (paper: 256 global)
    grad_accum: int = 1  # micro-batches per update
    lr: float = 1e-4  # peak learning rate (paper: 1e-4)
    weight_decay: float = 1e-3  # AdamW weight decay (paper: 1e-3; the released code applies none)
    alpro_code_weight_decay: bool = False  # reproduce the released code: no weight decay at all
    warmup_ratio: float = 0.05  # share of updates spent warming up linearly
    grad_clip: float = 20.0  # max global gradient norm
    sample_mode: Literal["rand", "uniform", "headtail"] = "rand"  # temporal sampler (code: headtail)
    randaug: bool = True  # temporally consistent RandAugment(2, 5)
    log_every: int = 10  # updates between metric logs
    ckpt_every: int = 0  # updates between checkpoints (0 = at the end only)
    seed: int = 0
    bf16: bool = True  # bf16 autocast on CUDA (ignored on CPU)
    progress: bool = True  # tqdm bar
