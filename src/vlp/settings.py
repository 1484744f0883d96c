"""Config sections of the model and the training steps (``model``, ``pretrain``, ``retrieval``, ``qa``, ``index``).

Plain dataclasses, no torch import: :mod:`vlp.config` composes them with the data sections, the models read the
``model`` section, the training code its schedule. They sit below the models (ARCHITECTURE.md) and read only the
family registry (each family's ``model.<name>`` section) and :mod:`vlp.schema`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

from vlp.ranges import BETAS, COUNT, CROP, PIXELS, RATE, SHARE, SIZE, STD, TEXT, at_least, ranged
from vlp.registry import DEFAULT_FAMILY, size, spec, specs
from vlp.schema import ConfigError, clip, from_dict, quote

log = logging.getLogger("vlp")


@dataclass
class ModelConfig:
    """Which model to build, and from what: the keys every family reads, and each family's own section.

    ``model.<family>`` (``model.alpro``, ``model.albef``, ``model.ts2net``, ...) holds the keys one family reads
    (its ``spec`` module's settings dataclass); :meth:`own` is the section of ``family``. Every registered
    family's section is loaded and range-checked, so one step config serves several families (the compiled
    pre-training DAGs of ALPRO and ALBEF share one). A family key written flat, ``model.num_entities`` (the layout
    before family sections), still loads into each section that has it, with a warning naming the new key.
    """

    family: str = DEFAULT_FAMILY  # a registered family (vlp.registry.names()): alpro, albef, ts2net
    # one of the family's sizes, the table in its spec module (vlp.models.spec.Size): tiny: width 64 (tests); small:
    # width 256 (CPU runs); small-pretrained: all-MiniLM-L6-v2's text (width 384, installed from PyPI,
    # vlp.models.pretrained) and a width-384 video tower (CPU runs; ALPRO and ALBEF); paper
    preset: str = "tiny"
    # frame side fed to the video tower (frames are resized on the fly if stored larger)
    img_size: int = ranged(32, COUNT)
    num_frames: int = ranged(4, COUNT)  # frames per clip (ALPRO pre-training: 4); at most frames.num_frames
    max_len: int = ranged(30, TEXT)  # text tokens incl. [CLS]/[SEP] (ALPRO pre-training: 30; fine-tuning 40/50)
    vocab_size: int = ranged(1000, COUNT)  # WordPiece size when the tokenizer is trained from the captions
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
    embed_dim: int = ranged(256, COUNT)  # VTC projection size
    # [] = the family's objectives (ALPRO: vtc, pem, mlm, vtm, eq. 6; ALBEF: itc, mlm, itm, eq. 5)
    losses: list[str] = field(default_factory=list)
    # Pixel normalisation, stored with the model. [] = the family's: ALPRO 0.5/0.5, which suits the paper's timm
    # in21k ViT init (the released ALPRO configs and checkpoints use CLIP's; imported checkpoints set those);
    # ALBEF CLIP's, as its released code
    pixel_mean: list[float] = ranged(list, PIXELS)
    pixel_std: list[float] = ranged(list, STD)
    # every registered family's own section, by name (model.<name> in a config file); defaults where not given
    families: dict[str, Any] = field(default_factory=lambda: family_sections({}))

    def __post_init__(self) -> None:
        self.families = family_sections(self.families)
        if self.family in specs() and spec(self.family).sizes:  # an unknown family: vlp.config.validate names it
            try:
                size(self.family, self.preset)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None

    def own(self) -> Any:
        """The section of :attr:`family` (its ``spec``'s settings dataclass)."""
        if self.family not in self.families:
            spec(self.family)  # an unknown family: the error lists the known ones
        return self.families[self.family]

    @classmethod
    def __config_load__(cls, data: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        """``data`` (a ``model`` mapping) with each ``model.<family>`` mapping loaded into ``families``, and flat
        family keys (the old layout) moved into every family section that has them, with a warning."""
        known = specs()
        if "families" in data:
            raise ConfigError(f"{prefix}.families is not a key: a family's keys go under {prefix}.<family>, e.g. "
                              f"{prefix}.{next(iter(known))}")  # fmt: skip
        shared = {f.name for f in fields(cls) if f.name != "families"}
        sections = {name: dict(data[name]) if isinstance(data.get(name), Mapping) else data.get(name)
                    for name in known if name in data}  # fmt: skip
        rest = {key: value for key, value in data.items() if key not in sections}
        for key in [k for k in rest if k not in shared]:
            owners = [name for name, one in known.items() if key in {f.name for f in fields(one.settings)}]
            if not owners:
                valid = sorted(shared) + [f"{name} (a section)" for name in known]
                raise ConfigError(f"unknown config key {quote(f'{prefix}.{key}')} in section {prefix!r}; valid keys: "
                                  f"{valid}")  # fmt: skip
            value = rest.pop(key)
            for name in owners:
                section = sections.setdefault(name, {})
                if isinstance(section, dict) and key in section and section[key] != value:
                    raise ConfigError(f"{prefix}.{key}={quote(value)} and {prefix}.{name}.{key}={quote(section[key])} "
                                      f"disagree: keep {prefix}.{name}.{key}")  # fmt: skip
                if isinstance(section, dict):
                    section.setdefault(key, value)
            new = " and ".join(f"{prefix}.{name}.{key}" for name in owners)
            log.warning("config key %s.%s is now %s: move it there (the old layout still loads)", prefix, key, new)
        loaded: dict[str, Any] = {name: from_dict(known[name].settings, section, f"{prefix}.{name}")
                                  for name, section in sections.items()}  # fmt: skip
        return {**rest, "families": loaded}

    def __config_dump__(self, data: dict[str, Any]) -> dict[str, Any]:
        """The mapping a config file would hold: the shared keys and ``family``'s own section as ``<family>``."""
        sections = data.pop("families")
        return {**data, self.family: sections.get(self.family, {})}


def family_sections(given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` sections completed with the defaults of every registered family that it lacks."""
    return {name: given[name] if name in given else one.settings() for name, one in specs().items()} | dict(given)


@dataclass
class OptimSettings:
    """AdamW, its learning-rate schedule and gradient clipping (:class:`vlp.train.optim.OptimConfig` adds what is
    not a config value); the defaults are ALPRO pre-training's."""

    lr: float = ranged(1e-4, RATE)  # peak learning rate, reached at the end of warm-up (paper: 1e-4)
    # AdamW, matrices only (paper: 1e-3); 0 = one group without decay (ALPRO's code)
    weight_decay: float = ranged(1e-3, SIZE)
    betas: list[float] = ranged(lambda: [0.9, 0.98], BETAS)  # AdamW (ALPRO, ALBEF and TS2-Net code)
    eps: float = ranged(1e-8, RATE)  # AdamW (TS2-Net code: 1e-6)
    warmup_ratio: float = ranged(0.05, SHARE)  # share of updates spent warming up linearly
    # absolute warm-up length in updates; 0 = warmup_ratio (ALBEF paper: 1,000; code: 2,000)
    warmup_steps: int = ranged(0, at_least(0, " (0 = warmup_ratio)"))
    schedule: Literal["linear", "cosine"] = "linear"  # after warm-up (ALPRO: linear to 0; ALBEF: cosine)
    min_lr_ratio: float = ranged(0.0, SHARE)  # the lr the decay ends at, as a share of lr (ALBEF: 0.1 = 1e-5 / 1e-4)
    warmup_start_ratio: float = ranged(0.0, SHARE)  # the lr the warm-up starts at, as a share of lr (ALBEF's code: 0.1)
    grad_clip: float = 20.0  # max global gradient norm (<= 0: no clipping)
    # learning-rate factor of the fusion encoder and the heads (random-init parts)
    fusion_lr_mult: float = ranged(1.0, RATE)
    # learning-rate factor of a pre-trained backbone (TS2-Net: CLIP, code 1e-3)
    backbone_lr_mult: float = ranged(1.0, RATE)
    # AdamW's kernels: "foreach" = all parameters of a group per op (bitwise equal to "loop"; docs/results/speed.md),
    # "fused" = one kernel per group (fastest; rounds differently), "loop" = one parameter at a time
    adamw: Literal["foreach", "fused", "loop"] = "foreach"


@dataclass
class LoopSettings:
    """How long :func:`vlp.train.loop.train` runs, how it logs and checkpoints (:class:`vlp.train.loop.TrainConfig`
    adds where it writes and what it is called)."""

    max_steps: int = ranged(100, COUNT)  # optimiser updates (the schedule spans them)
    grad_accum: int = ranged(1, COUNT)  # micro-batches per update
    log_every: int = ranged(10, COUNT)  # updates between metric logs (the last update is always logged)
    # updates between checkpoints (0 = at the end only); a resume loses at most this many
    ckpt_every: int = ranged(500, at_least(0, " (0 = at the end only)"))
    keep_last: int = ranged(2, COUNT)  # complete checkpoints kept (older ones are deleted once a newer one is complete)
    seed: int = 0  # global RNGs are seeded with seed + rank at start
    bf16: bool = True  # bf16 autocast of forward + loss on CUDA
    # bf16 autocast on the CPU: faster at paper size on CPUs with AMX/avx512_bf16, slower at tiny size
    # (docs/results/speed.md)
    cpu_bf16: bool = False
    # what the C allocator does with freed memory: "keep" = glibc keeps it for the next step's tensors (no page
    # faults at every step; resident memory stays at its peak), "release" = glibc's defaults (vlp.host_memory)
    freed_memory: Literal["keep", "release"] = "keep"
    grad_checkpointing: bool = False  # recompute activations in backward (the towers that support it): less memory
    # torch.compile each transformer block (training, and the section's evaluation); eager with a warning where
    # torch.compile cannot run (docs/results/speed.md)
    compile: bool = False
    progress: bool = True  # a tqdm bar on a terminal, else one line per logged interval; false: nothing


@dataclass
class LoaderSettings:
    """How training batches are read (docs/reference/input.md)."""

    batch_size: int = ranged(8, COUNT)  # clips per micro-batch per process
    # The epoch order: "global" = a seeded permutation of all pairs (the paper's; a clip is a random read);
    # "shards" = shards in a seeded order, pairs mixed in a buffer of shuffle_buffer (docs/reference/input.md)
    order: Literal["global", "shards"] = "global"
    # order=shards: pairs mixed at a time (>= the pairs of a rank: a full permutation)
    shuffle_buffer: int = ranged(4096, COUNT)
    # loader processes building batches ahead of the training (0 = on the training thread)
    num_workers: int = ranged(2, at_least(0, " (0 = on the training thread)"))
    prefetch: int = ranged(2, COUNT)  # batches each loader worker builds ahead
    # damaged clips skipped (and counted) before the step fails (0 = fail at the first)
    max_bad_share: float = ranged(0.01, SHARE)


@dataclass
class TrainingSchedule(LoaderSettings, LoopSettings, OptimSettings):
    """The training schedule, declared once: what pre-training, retrieval and QA fine-tuning share (each section
    extends it and sets its own defaults). The steps hand it to the loop as is
    (:meth:`vlp.train.loop.TrainConfig.of`, :meth:`vlp.train.optim.OptimConfig.of` take their parts)."""

    sample_mode: Literal["rand", "uniform", "headtail"] = "rand"  # temporal sampler of a training clip
    randaug: bool = True  # temporally consistent RandAugment(2, 5)
    # its op list: "" = the model family's own (ALPRO's; ALBEF's paper's), or a preset any family lists by name
    # (alpro, albef_paper, albef_code: vlp.registry.randaug_presets)
    randaug_ops: str = ""
    crop_scale: list[float] = ranged(list, CROP)  # [lo, hi] random resized crop per clip; [] = none
    hflip: bool = False  # random left-right flip per clip (ALBEF's code; breaks "left"/"right" captions)
    caption_clean: bool = False  # ALBEF's code: lower case, punctuation out, at most 30 words (the paper: none)

    @classmethod
    def __config_load__(cls, data: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        """``data`` with the keys that were renamed or folded into others mapped to their new form, each with a
        warning: ``alpro_code_weight_decay: true`` is ``weight_decay: 0``."""
        data = dict(data)
        if "alpro_code_weight_decay" in data:
            old = data.pop("alpro_code_weight_decay")
            if old is True:
                if data.get("weight_decay", 0) not in (0, 0.0):
                    decay = data["weight_decay"]
                    raise ConfigError(f"{prefix}.alpro_code_weight_decay=true (no weight decay) and {prefix}."
                                      f"weight_decay={quote(decay)} disagree: keep {prefix}.weight_decay")  # fmt: skip
                data["weight_decay"] = 0.0
            elif old is not False:
                raise ConfigError(f"{prefix}.alpro_code_weight_decay: expected true/false, got {quote(old)}")
            log.warning("config key %s.alpro_code_weight_decay is gone: %s", prefix,
                        f"{prefix}.weight_decay: 0 is the released ALPRO code's one group without decay" if old
                        else "false was the default; remove it")  # fmt: skip
        return data


@dataclass
class PretrainConfig(TrainingSchedule):
    """``pretrain-prompter`` and ``pretrain``: the schedule (defaults: ALPRO pre-training) and batch grouping."""

    group_by: str = ""  # "" = random batches (paper); "qa:scene" = batches that share a scene (docs/results/pem.md)
    # with group_by: the share of batches that are grouped (the rest are random)
    group_fraction: float = ranged(1.0, SHARE)
    # with group_by: group only the first N epochs, then random batches (0 = every epoch)
    group_epochs: int = ranged(0, at_least(0, " (0 = every epoch)"))


@dataclass
class FinetuneConfig(TrainingSchedule):
    """What retrieval and QA fine-tuning share: the schedule, and the clips and texts of fine-tuning and evaluation.

    Defaults are the paper's MSRVTT-retrieval row of ALPRO Table 9; ``configs/finetune/*.yaml`` hold the rows
    (``grad_clip``: 20 as config_release's didemo_ret / msvd_qa, 5 in msrvtt_ret / msrvtt_qa). ``num_workers``
    loads the evaluation's clips too; ``max_bad_share`` is training's only: evaluation never skips a damaged test
    clip, it fails.
    """

    epochs: float = ranged(5.0, RATE)  # passes over the training pairs (paper: 5 / 10 / 10 / 15)
    # optimiser updates; 0 = epochs x updates per epoch
    max_steps: int = ranged(0, at_least(0, " (0 = epochs x updates per epoch)"))
    lr: float = ranged(2.5e-5, RATE)  # paper: 2.5e-5 MSRVTT, 4e-5 DiDeMo, 5e-5 QA
    warmup_ratio: float = ranged(0.1, SHARE)
    num_frames: int = ranged(8, COUNT)  # paper: 8 for retrieval, 16 for QA
    max_len: int = ranged(40, TEXT)  # text tokens (paper: 40; DiDeMo paragraphs 50)
    sample_mode: Literal["rand", "uniform", "headtail"] = "headtail"  # app. A.2: N/2 frames from each half
    eval_mode: Literal["rand", "uniform", "headtail"] = "uniform"  # inference: uniform, no augmentation
    eval_batch_size: int = ranged(32, COUNT)  # clips / texts / fused pairs per forward at evaluation
    # the evaluation's forwards: fp32, or bf16 autocast (features, scores and metrics stay fp32; docs/results/speed.md)
    eval_precision: Literal["fp32", "bf16"] = "fp32"
    split: str = "test"  # the split the evaluate step scores
    seed: int = 42  # app. A.2


@dataclass
class RetrievalConfig(FinetuneConfig):
    """``finetune-retrieval`` and ``evaluate-retrieval``: the fine-tuning objectives and the evaluation's ranking.

    Its keys name what an objective does, not one family's word for it (ALPRO's VTC / VTM, ALBEF's ITC / ITM):
    each family maps them to its own terms (its ``task_config``). The ALPRO words the section used before still
    load, with a warning naming the new form (``RENAMED``, ``OLD_VALUES``).
    """

    # the fine-tuning objectives: "contrastive" (text-clip similarity; ALPRO VTC, ALBEF ITC, TS2-Net's loss) and
    # "matching" (a binary matched-or-not head on the fused pair; ALPRO VTM, ALBEF ITM)
    losses: list[Literal["contrastive", "matching"]] = field(default_factory=lambda: ["contrastive", "matching"])
    paragraph: bool = False  # DiDeMo: one text per video = its captions concatenated in caption_id order
    # the matching head re-ranks the contrastive top-k per query; >= #items = full N x N scoring (ALPRO code)
    rerank_k: int = ranged(16, COUNT)
    # a re-ranked pair's score: "match" = the matching head's probability (ALPRO code); "match_plus_sim" = its
    # logit plus the pair's similarity (LAVIS)
    score_rule: Literal["match", "match_plus_sim"] = "match"
    # fine-tuning's matching negatives and same-clip rules (as model.<family>'s; they replace the pre-trained model's)
    matching_negatives: Literal["hard", "uniform", "mixed"] = "hard"  # hard, uniform, or mixed (hard w.p. below)
    matching_hard_fraction: float = ranged(0.5, SHARE)  # matching_negatives=mixed: the share of hard draws
    # another caption of the same clip: a negative of the contrastive loss, or a positive (ALBEF's shared targets)
    same_clip_contrastive: Literal["negative", "positive"] = "negative"
    same_clip_matching: Literal["draw", "exclude"] = "draw"  # another caption of the clip: a drawable negative or not
    report_examples: int = ranged(4, SIZE)  # queries shown with their top-5 videos in the report
    # test-time re-scoring of a similarity ranking with the test set's own statistics (vlp.eval.retrieval.rescore;
    # families that do not re-rank): dual softmax (CAMoE) or inverted softmax (QB-Norm); off by default
    rescore: Literal["none", "dual_softmax", "inverted_softmax"] = "none"
    rescore_scale: float = ranged(100.0, RATE)

    # old key -> new key: the names the section had when it spoke ALPRO's vocabulary
    RENAMED: ClassVar[dict[str, str]] = {
        "vtm_negatives": "matching_negatives",
        "vtm_hard_fraction": "matching_hard_fraction",
        "same_video_vtc": "same_clip_contrastive",
        "same_video_vtm": "same_clip_matching",
        "k": "rerank_k",
    }
    # key -> {old value: new value}: ALPRO's (and ALBEF's) loss names, and the score rules named after ITM
    OLD_VALUES: ClassVar[dict[str, dict[str, str]]] = {
        "losses": {"vtc": "contrastive", "itc": "contrastive", "vtm": "matching", "itm": "matching"},
        "score_rule": {"itm": "match", "itm_plus_sim": "match_plus_sim"},
    }

    @classmethod
    def __config_load__(cls, data: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        """``data`` with each old key (:data:`RENAMED`) moved to its new name and each old value (:data:`OLD_VALUES`)
        replaced by its new one, each with a warning naming the new form; then the schedule's own old keys.

        Raises:
            ConfigError: an old key and its new key both given, with different values (naming both).
        """

        data = dict(data)
        for key, values in cls.OLD_VALUES.items():
            given = data.get(key)
            items = given if isinstance(given, list) else [given]
            if not any(isinstance(v, str) and v in values for v in items):
                continue
            mapped = [values.get(v, v) if isinstance(v, str) else v for v in items]
            data[key] = mapped if isinstance(given, list) else mapped[0]
            log.warning("config value %s=%s is now %s=%s: the old value still loads", prefix + "." + key,
                        _yaml(given), prefix + "." + key, _yaml(data[key]))  # fmt: skip
        for old, new in cls.RENAMED.items():
            if old not in data:
                continue
            value = data.pop(old)
            if new in data and data[new] != value:
                raise ConfigError(f"{prefix}.{old}={quote(value)} and {prefix}.{new}={quote(data[new])} disagree: "
                                  f"{old} is the old name of {new}; keep {prefix}.{new}")  # fmt: skip
            data[new] = value
            log.warning("config key %s.%s is now %s.%s: rename it (the old name still loads)", prefix, old, prefix, new)
        return super().__config_load__(data, prefix)


def _yaml(value: Any) -> str:
    """``value`` as a config file writes it: ``[contrastive, matching]``, ``match``."""
    return clip(f"[{', '.join(map(str, value))}]" if isinstance(value, list) else str(value))


@dataclass
class QAConfig(FinetuneConfig):
    """``finetune-qa`` and ``evaluate-qa`` (open-ended QA as classification over frequent answers, ALPRO §4.1)."""

    epochs: float = 10.0
    lr: float = 5e-5
    grad_accum: int = 2
    num_frames: int = 16
    # the most frequent training answers (code: all train answers, >= 1,500; MSVD 2,423)
    answer_vocab: int = ranged(1500, COUNT)
    answer_len: int = ranged(8, TEXT)  # ALBEF: answer tokens incl. [CLS] / [SEP] its decoder scores
    answer_topk: int = ranged(128, COUNT)  # ALBEF: candidates ranked per question by the decoder (VQA.yaml k_test)


@dataclass
class IndexConfig:
    """``vlp index`` and ``vlp search`` (docs/guides/search.md): what a clip index stores and how search reads it.

    Clips are sampled and encoded as ``evaluate-retrieval`` does, with the ``retrieval`` section's ``num_frames``,
    ``eval_mode``, ``seed`` and ``eval_batch_size``; a query is encoded with its ``max_len`` and re-ranked with its
    ``rerank_k`` and ``score_rule``.
    """

    # a clip's token features (Encoded.tokens) are stored when they hold at most this many floats; else the exact
    # stage of a search encodes its candidate clips again from the frames (0 = never store them)
    max_token_floats: int = ranged(65536, at_least(0, " (0 = never store tokens)"))
    # from this many clips on, `vlp index` builds an ANN index; below, search is exact
    ann_min_rows: int = ranged(50000, COUNT)
    # a `vlp index` run that adds clips to an index with an ANN index adds them to it (its partitions and quantiser
    # as they are) while the rows it has never been built over stay under this share of the table; at or above it,
    # it builds the ANN index again over every row (0 = always rebuild)
    ann_rebuild_share: float = ranged(0.25, SHARE)
    candidates: int = ranged(50, COUNT)  # clips the first stage hands the exact stage (at least -k of them)
    # the longest query or question `vlp search`, `vlp answer` and `vlp serve` take, in characters (vlp.text)
    max_text_chars: int = ranged(1000, COUNT)


def retrieval_section(section: RetrievalConfig | QAConfig) -> RetrievalConfig:
    """``section`` as the ``retrieval`` section ``task_config`` reads for retrieval (a TypeError otherwise: a bug)."""
    if not isinstance(section, RetrievalConfig):
        raise TypeError(f"retrieval fine-tuning reads the retrieval section, got {type(section).__name__}")
    return section


def qa_section(section: RetrievalConfig | QAConfig) -> QAConfig:
    """``section`` as the ``qa`` section ``task_config`` reads for QA (a TypeError otherwise: a bug)."""
    if not isinstance(section, QAConfig):
        raise TypeError(f"QA fine-tuning reads the qa section, got {type(section).__name__}")
    return section
