"""Config sections of the training steps (``model``, ``pretrain``): plain dataclasses, no torch import.

They live apart from the code that uses them so that :mod:`vlp.config` can compose them without
importing torch for the data steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class ModelConfig:
    """Which model to build, and from what (the family's presets; most keys are ALPRO's, see each family)."""

    family: str = "alpro"  # vlp.models.family: alpro, albef or ts2net
    preset: Literal["tiny", "small", "paper"] = "tiny"  # tiny: width 64 (tests); small: width 256 (CPU runs); paper
    img_size: int = 32  # frame side fed to the video tower (frames are resized on the fly if stored larger)
    num_frames: int = 4  # frames per clip (ALPRO pre-training: 4)
    max_len: int = 30  # text tokens incl. [CLS]/[SEP] (ALPRO pre-training: 30; fine-tuning 40/50)
    vocab_size: int = 1000  # WordPiece size when the tokenizer is trained from the captions
    # "" = the text weights' own tokenizer when text weights are loaded (bert-base-uncased's for the paper
    # preset), else WordPiece trained on the training captions; "wordpiece" = always train; else a dir / hub name
    tokenizer: str = ""
    # "" = the preset's weights (paper: timm vit_base_patch16_224.orig_in21k and bert-base-uncased; tiny and
    # small: random init); "random" = random init; else a timm ViT name / a BERT name, or a local path
    video_init: str = ""
    text_init: str = ""
    # Hub revision (branch, tag or commit) of a hub-named video_init / text_init / tokenizer; "" = the repository's
    # default branch as it is at load time. The commit loaded is recorded in model.json's lineage.upstream: set it
    # here to start again from exactly the same weights. tokenizer_revision "" = text_init_revision when the
    # tokenizer is the text weights' own.
    video_init_revision: str = ""
    text_init_revision: str = ""
    tokenizer_revision: str = ""
    embed_dim: int = 256  # VTC projection size
    # [] = the family's objectives (ALPRO: vtc, pem, mlm, vtm, eq. 6; ALBEF: itc, mlm, itm, eq. 5)
    losses: list[str] = field(default_factory=list)
    pem_rule: Literal["paper", "official_code"] = "paper"  # PEM pseudo-label discard rule
    pem_crop: Literal["resize", "zero_outside"] = "resize"  # prompter input: real crop, or black outside (code)
    # Pixel normalisation, stored with the model. [] = the family's: ALPRO 0.5/0.5, which suits the paper's timm
    # in21k ViT init (the released ALPRO configs and checkpoints use CLIP's; imported checkpoints set those);
    # ALBEF CLIP's, as its released code
    pixel_mean: list[float] = field(default_factory=list)
    pixel_std: list[float] = field(default_factory=list)
    # VTM negatives: hard (paper, code), uniform, or mixed (hard with probability vtm_hard_fraction); and what
    # another caption of the same clip is: a VTC negative / drawable VTM negative (ALPRO) or not (ALBEF)
    vtm_negatives: Literal["hard", "uniform", "mixed"] = "hard"
    vtm_hard_fraction: float = 0.5
    same_video_vtc: Literal["negative", "positive"] = "negative"
    same_video_vtm: Literal["draw", "exclude"] = "draw"
    bank_renormalize: bool = False  # re-normalise each entity's ensembled prompt embedding (code: False)
    prompt_ensemble: bool = True  # 12 templates per entity (paper); False = one template (Table 5 ablation)
    num_entities: int = 1000  # prompt-bank size M: the top-M mined entities (fewer if fewer were mined)
    # ALBEF (vlp.models.albef): momentum model, queues, distillation, where ITM's negatives come from, frames
    momentum: float = 0.995
    queue_size: int = 65536  # a multiple of the global batch
    distill: bool = True  # momentum distillation (MoD)
    alpha: float = 0.4
    alpha_ramp_steps: int = -1  # -1 = one epoch of training batches (ALBEF); 0 = alpha from the first step
    itm_negatives_from: Literal["global", "local"] = "global"  # paper: the batch; released code: the local batch
    temporal: Literal["concat", "mean"] = "concat"  # frame tokens the fusion sees: all frames', or their mean
    # TS2-Net (vlp.models.ts2net): CLIP's patch (paper preset: ViT-B/32 or /16), token shift, token selection,
    # frame aggregation and the frame score; defaults are the released code's where it differs from the paper
    clip_patch: Literal[32, 16] = 32
    shift_mode: Literal["code", "paper", "channel", "none"] = "code"  # token positions by stride / by ratio
    shift_last: int = 2  # shift in the last N vision blocks (paper: blocks 11-12)
    shift_ratio: float = 0.25  # shift_mode=paper: share of patch tokens moved
    select: Literal["code", "paper", "none"] = "code"  # code: [CLS] + top-3 patches, tanh; paper: top-4, softmax
    select_k: int = 0  # 0 = the rule's
    select_eval: Literal["hard", "noise"] = "hard"  # inference: hard top-k, or the 500 noisy draws (code)
    select_backward: Literal["full", "code"] = "full"  # perturbed top-k gradient: Jacobian, or the code's diagonal
    aggregator_layers: int = 4  # frame aggregator blocks (code: 4, from CLIP's text blocks); 0 = none
    aggregator_positions: int = 77  # its position embeddings (code: CLIP's 77); frames x tokens per frame must fit
    # its LayerNorms' eps: the code's 1e-12 (modules/module_cross.py's blocks take modules/until_module.py's
    # LayerNorm); transformers' CLIPEncoderLayer has CLIP's 1e-5 (a model.json without the key loads with 1e-5)
    aggregator_ln_eps: float = 1e-12
    frame_pool: Literal["weighted", "mean"] = "weighted"  # softmax(lambda * s)-weighted frames, or mean-pooled
    frame_lambda: float = 4.0
    frame_norm: Literal["l2", "none"] = "l2"  # code: s / ||s|| over frames before the softmax; paper: none


# The ``model`` keys only one family reads (the rest are shared or ALPRO's and ALBEF's both)
FAMILY_KEYS: dict[str, tuple[str, ...]] = {
    "alpro": ("pem_rule", "pem_crop", "bank_renormalize", "prompt_ensemble", "num_entities", "same_video_vtm"),
    "albef": ("momentum", "queue_size", "distill", "alpha", "alpha_ramp_steps", "itm_negatives_from", "temporal"),
    "ts2net": ("clip_patch", "shift_mode", "shift_last", "shift_ratio", "select", "select_k", "select_eval",
               "select_backward", "aggregator_layers", "aggregator_positions", "aggregator_ln_eps", "frame_pool",
               "frame_lambda", "frame_norm"),
}  # fmt: skip


def ignored_model_keys(model: ModelConfig) -> list[str]:
    """The ``model`` keys set away from their defaults that belong to another family than ``model.family``."""
    default = ModelConfig()
    return [key for family, keys in FAMILY_KEYS.items() if family != model.family for key in keys
            if getattr(model, key) != getattr(default, key)]  # fmt: skip


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
    warmup_steps: int = 0  # absolute warm-up length in updates; 0 = warmup_ratio (ALBEF paper: 1,000; code: 2,000)
    schedule: Literal["linear", "cosine"] = "linear"  # after warm-up (ALPRO: linear to 0; ALBEF: cosine)
    min_lr_ratio: float = 0.0  # the lr the decay ends at, as a share of lr (ALBEF: 0.1 = 1e-5 / 1e-4)
    warmup_start_ratio: float = 0.0  # the lr the warm-up starts at, as a share of lr (ALBEF's code: 0.1)
    grad_clip: float = 20.0  # max global gradient norm
    sample_mode: Literal["rand", "uniform", "headtail"] = "rand"  # temporal sampler (code: headtail)
    randaug: bool = True  # temporally consistent RandAugment(2, 5)
    randaug_ops: Literal["alpro", "albef_paper", "albef_code"] = "alpro"  # vlp.data.video_text.RANDAUG_OPS
    crop_scale: list[float] = field(default_factory=list)  # [lo, hi] random resized crop per clip; [] = none
    hflip: bool = False  # random left-right flip per clip (ALBEF's code; breaks "left"/"right" captions)
    caption_clean: bool = False  # ALBEF's code: lower case, punctuation out, at most 30 words (the paper: none)
    # The epoch order: "global" = a seeded permutation of all pairs (the paper's; a clip is a random read);
    # "shards" = shards in a seeded order, pairs mixed in a buffer of shuffle_buffer (docs/input.md)
    order: Literal["global", "shards"] = "global"
    shuffle_buffer: int = 4096  # order=shards: pairs mixed at a time (>= the pairs of a rank: a full permutation)
    num_workers: int = 2  # loader processes building batches ahead of the training (0 = on the training thread)
    prefetch: int = 2  # batches each loader worker builds ahead
    max_bad_share: float = 0.01  # damaged clips skipped (and counted) before the step fails (0 = fail at the first)
    group_by: str = ""  # "" = random batches (paper); "qa:scene" = batches that share a scene (docs/pem.md)
    group_fraction: float = 1.0  # with group_by: the share of batches that are grouped (the rest are random)
    group_epochs: int = 0  # with group_by: group only the first N epochs, then random batches (0 = every epoch)
    log_every: int = 10  # updates between metric logs
    ckpt_every: int = 500  # updates between checkpoints (0 = at the end only); a resume loses at most this many
    seed: int = 0
    bf16: bool = True  # bf16 autocast on CUDA (ignored on CPU)
    progress: bool = True  # a tqdm bar on a terminal, else one line per logged interval; false: nothing
    fusion_lr_mult: float = 1.0  # learning-rate factor of the fusion encoder and the heads (random-init parts)
    backbone_lr_mult: float = 1.0  # learning-rate factor of a pre-trained backbone (TS2-Net: CLIP, code 1e-3)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # AdamW (ALPRO, ALBEF and TS2-Net code)
    eps: float = 1e-8  # AdamW (TS2-Net code: 1e-6)


@dataclass
class FinetuneConfig:
    """What retrieval and QA fine-tuning share (field names match :class:`PretrainConfig` where they overlap).

    Defaults are the paper's MSRVTT-retrieval row of ALPRO Table 9; ``configs/finetune/*.yaml`` hold the rows.
    """

    epochs: float = 5.0  # passes over the training pairs (paper: 5 / 10 / 10 / 15)
    max_steps: int = 0  # optimiser updates; 0 = epochs x updates per epoch
    batch_size: int = 8  # per process per micro-batch (paper: 64 / 96 global)
    grad_accum: int = 1  # paper: 1 for retrieval, 2 for QA
    lr: float = 2.5e-5  # paper: 2.5e-5 MSRVTT, 4e-5 DiDeMo, 5e-5 QA
    weight_decay: float = 1e-3
    alpro_code_weight_decay: bool = False  # reproduce the released code: no weight decay at all
    warmup_ratio: float = 0.1
    warmup_steps: int = 0  # absolute warm-up length in updates; 0 = warmup_ratio (ALBEF paper: 1,000; code: 2,000)
    schedule: Literal["linear", "cosine"] = "linear"  # after warm-up (ALPRO: linear to 0; ALBEF: cosine)
    min_lr_ratio: float = 0.0  # the lr the decay ends at, as a share of lr (ALBEF: 0.1 = 1e-5 / 1e-4)
    warmup_start_ratio: float = 0.0  # the lr the warm-up starts at, as a share of lr (ALBEF's code: 0.1)
    grad_clip: float = 20.0  # config_release didemo_ret / msvd_qa (msrvtt_ret / msrvtt_qa: 5.0, configs/finetune)
    num_frames: int = 8  # paper: 8 for retrieval, 16 for QA
    max_len: int = 40  # text tokens (paper: 40; DiDeMo paragraphs 50)
    sample_mode: Literal["rand", "uniform", "headtail"] = "headtail"  # app. A.2: N/2 frames from each half
    eval_mode: Literal["rand", "uniform", "headtail"] = "uniform"  # inference: uniform, no augmentation
    randaug: bool = True  # temporally consistent RandAugment(2, 5)
    randaug_ops: Literal["alpro", "albef_paper", "albef_code"] = "alpro"  # vlp.data.video_text.RANDAUG_OPS
    crop_scale: list[float] = field(default_factory=list)  # [lo, hi] random resized crop per clip; [] = none
    hflip: bool = False  # random left-right flip per clip (ALBEF's code; breaks "left"/"right" captions)
    caption_clean: bool = False  # ALBEF's code: lower case, punctuation out, at most 30 words (the paper: none)
    eval_batch_size: int = 32  # clips / texts / fused pairs per forward at evaluation
    order: Literal["global", "shards"] = "global"  # as pretrain.order
    shuffle_buffer: int = 4096  # as pretrain.shuffle_buffer
    num_workers: int = 2  # loader processes, in training and in the evaluation's clip encoding (0 = none)
    prefetch: int = 2  # batches each loader worker builds ahead
    max_bad_share: float = 0.01  # as pretrain.max_bad_share; evaluation never skips: a damaged test clip fails
    split: str = "test"  # the split the evaluate step scores
    log_every: int = 10
    ckpt_every: int = 500  # updates between checkpoints (0 = at the end only)
    seed: int = 42  # app. A.2
    bf16: bool = True
    progress: bool = True  # as in pretrain; evaluation shows a bar on a terminal only
    fusion_lr_mult: float = 1.0  # learning-rate factor of the fusion encoder and the heads
    backbone_lr_mult: float = 1.0  # learning-rate factor of a pre-trained backbone (TS2-Net: CLIP, code 1e-3)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # AdamW (ALPRO, ALBEF and TS2-Net code)
    eps: float = 1e-8  # AdamW (TS2-Net code: 1e-6)


@dataclass
class RetrievalConfig(FinetuneConfig):
    """``finetune-retrieval`` (VTC + VTM, ALPRO §4.1) and ``evaluate-retrieval``."""

    losses: list[str] = field(default_factory=lambda: ["vtc", "vtm"])  # fine-tuning objectives
    paragraph: bool = False  # DiDeMo: one text per video = its captions concatenated in caption_id order
    k: int = 16  # VTM re-ranks the top-k candidates per query; k >= #items = full N x N scoring (ALPRO code)
    score_rule: Literal["itm", "itm_plus_sim"] = "itm"  # VTM probability (ALPRO code) or logit + sim (LAVIS)
    # fine-tuning's VTM negatives and same-clip rule (as model.*; they replace the pre-trained model's)
    vtm_negatives: Literal["hard", "uniform", "mixed"] = "hard"
    vtm_hard_fraction: float = 0.5
    same_video_vtc: Literal["negative", "positive"] = "negative"
    same_video_vtm: Literal["draw", "exclude"] = "draw"
    report_examples: int = 4  # queries shown with their top-5 videos in the report
    # test-time re-scoring of a similarity ranking with the test set's own statistics (vlp.eval.retrieval.rescore;
    # families that do not re-rank): dual softmax (CAMoE) or inverted softmax (QB-Norm); off by default
    rescore: Literal["none", "dual_softmax", "inverted_softmax"] = "none"
    rescore_scale: float = 100.0


@dataclass
class QAConfig(FinetuneConfig):
    """``finetune-qa`` and ``evaluate-qa`` (open-ended QA as classification over frequent answers, ALPRO §4.1)."""

    epochs: float = 10.0
    lr: float = 5e-5
    grad_accum: int = 2
    num_frames: int = 16
    answer_vocab: int = 1500  # the most frequent training answers (code: all train answers, >= 1,500; MSVD 2,423)
    answer_len: int = 8  # ALBEF: answer tokens incl. [CLS] / [SEP] its decoder scores
    answer_topk: int = 128  # ALBEF: candidates ranked per question by the decoder (VQA.yaml k_test)
