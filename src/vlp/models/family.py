"""What a model family gives the steps: the contract every family meets.

A family (ALPRO, ALBEF, TS2-Net) is a package ``vlp.models.<name>`` whose ``spec`` module (no torch import) holds
its :class:`vlp.models.spec.FamilySpec`: the name, its own config section (``model.<name>``, a dataclass), where its
:class:`Family` object lives, and whether ``vlp pretrain`` trains it. The registry (:mod:`vlp.registry`, whose
names this module repeats) lists the built-in specs; the CLI's choices, the compiled pre-training DAGs,
``import-checkpoint --family auto`` and the docs table all read it. A family defined elsewhere (a test, a user's
package) joins with :func:`register`. Shared code takes the family from the registry and calls the methods below,
an optional capability's only through the helper that asks for it; it names no family.

The contract, in the order a model's life uses it:

- ``name``, ``kinds`` (its ``model.json`` kinds), ``default_losses``, ``lr_groups`` (the parameters the sections'
  ``fusion_lr_mult`` and ``backbone_lr_mult`` scale, :class:`LrGroups`); whether it pre-trains is its spec's
  (``finetune-retrieval`` without ``--pretrained`` starts any family from the ``model`` section's weights).
- ``weights(model)`` -> ``(visual, text)`` starting weights a ``model`` config section names (its size's
  unless set; ``""`` = random init).
- ``config(model, vocab_size, num_entities)`` -> the family's model config from the step config's ``model``
  section, at the size ``model.preset`` names in the family's table (its spec's ``sizes``, :class:`Size`);
  ``config_from_dict`` rebuilds it from a ``model.json``. Every family config has ``pixel_mean``, ``pixel_std``
  (the normalisation its weights expect), ``video.img_size`` (frame side), ``text.max_len`` (text positions) and
  ``text.vocab_size``: the data steps read those, nothing else.
- ``build(kind, config, num_answers)`` -> a randomly initialised module of one of ``kinds``.
- ``task_config(config, task, section)`` -> the config of a model fine-tuned for ``task`` from a pre-trained one;
  ``prepare(config, batches_per_epoch, global_batch)`` -> the config once the training data is known (ALBEF:
  alpha's ramp of one epoch, and a queue the global batch divides, else a clear error before step 1);
  ``init_from(model, checkpoint, task)`` fills a fine-tuning model from the model it starts from (returns
  the checkpoint entries it skipped).
- ``train_step(model, batch, ctx)`` -> ``{"loss": ..., "loss_<term>": ...}`` for one pre-training or
  retrieval fine-tuning batch (the module's ``forward`` returns typed outputs; the family's loss functions
  take them).
- ``encode_video`` / ``encode_text`` -> :class:`Encoded`; ``similarity(model, texts, videos)`` -> the ``(T, V)``
  unimodal score matrix that ranks candidates.

Two capabilities are optional, each a protocol of its own that a family meets by having its methods; a family
without one does not define them (no method that only raises):

- :class:`AnswersQuestions`, a QA model (``kinds.qa`` names its kind; ``""`` = none, TS2-Net):
  ``set_answers(model, answers, tokenizer)`` gives a QA model its answer list, ``qa_step(model, batch, ctx)`` is
  one QA fine-tuning step's losses (ALPRO: a classifier's cross-entropy; ALBEF: the answer decoder's LM loss),
  ``qa_logits(model, video, ids, mask)`` -> ``(B, A)`` answer scores at evaluation. The steps take it through
  :func:`qa_of`, which refuses a family without one with a message that says what to run instead.
- :class:`PairScorer`, a fused re-ranking pass: ``pair_logits(model, text_tokens, text_mask, video_tokens)`` ->
  ``(P, 2)`` match logits, used when ``reranks(model)`` (a model trained without the match head returns False).
  Evaluation takes it through :func:`pair_scorer_of`; without one (TS2-Net, a dot-product family) it ranks by
  ``similarity`` alone.

The protocols are generic in the family's own config class (``Family[TS2NetConfig]``); each family module assigns
its family object to the protocols it meets under ``TYPE_CHECKING``, so mypy holds it to their signatures.

Modules never see a tokenizer: what MLM needs from it travels as a :class:`TextVocab`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, cast, runtime_checkable

from vlp import registry
from vlp.models.spec import FamilySpec as FamilySpec  # what a family declares (re-exported here for its authors)
from vlp.models.spec import Kinds as Kinds
from vlp.models.spec import Prepared as Prepared
from vlp.models.spec import Size as Size
from vlp.models.spec import Task as Task
from vlp.registry import size as size

if TYPE_CHECKING:
    from torch import Tensor, nn

    from vlp.models.text import TextConfig
    from vlp.settings import ModelConfig, QAConfig, RetrievalConfig

_T = TypeVar("_T")

# The registry (vlp.registry) sits below the configuration that reads it; its names are here for family authors.
DEFAULT_FAMILY = registry.DEFAULT_FAMILY
register, unregister, specs, spec, names = (
    registry.register,
    registry.unregister,
    registry.specs,
    registry.spec,
    registry.names,
)
families, get, of_kind = registry.families, registry.get, registry.of_kind
randaug_presets, randaug_ops = registry.randaug_presets, registry.randaug_ops
pretrain_flags = registry.pretrain_flags


class LrGroups(NamedTuple):
    """Which parameters (by name prefix) the learning-rate factors of a training section scale."""

    fusion: tuple[str, ...] = ()  # fusion_lr_mult: the multimodal encoder and the heads (random-init parts)
    backbone: tuple[str, ...] = ()  # backbone_lr_mult: a pre-trained backbone tuned gently beside new modules


@dataclass(frozen=True)
class TextVocab:
    """What a masked-language objective needs from the tokenizer: its size, [MASK] and the special ids."""

    size: int
    mask_token_id: int
    special_ids: tuple[int, ...]

    @classmethod
    def of(cls, tokenizer: Any) -> TextVocab:
        if tokenizer.mask_token_id is None:
            raise ValueError("the tokenizer has no [MASK] token: masked language modelling needs one")
        return cls(len(tokenizer), int(tokenizer.mask_token_id), tuple(int(i) for i in tokenizer.all_special_ids))


def _identity(x: Tensor) -> Tensor:
    return x


@dataclass
class StepContext:
    """Everything a training step needs besides the module and the batch.

    Attributes:
        vocab: the tokenizer's :class:`TextVocab` (required by masked-language objectives).
        gather: all-gather with gradient over ranks (identity on one process), for contrastive negatives.
        gather_nograd: all-gather without gradient (clip ids of the global batch, ALBEF's momentum features).
        rank: this process's rank (where its positives sit in the gathered batch).
        world: the number of processes.
        generator: CPU generator for masks, boxes and negatives (reproducible steps); None = the global one.
        extra: the family's own context (ALPRO: the frozen prompter and prompt bank for PEM).
    """

    vocab: TextVocab | None = None
    gather: Callable[[Tensor], Tensor] = _identity
    gather_nograd: Callable[[Tensor], Tensor] = _identity
    rank: int = 0
    world: int = 1
    generator: Any = None
    extra: Any = None


@dataclass
class PretrainBatch:
    """One tokenised batch of (clip, caption) pairs: pre-training and retrieval fine-tuning, every family."""

    video: Tensor  # (B, T, 3, H, W) normalised frames
    input_ids: Tensor  # (B, L)
    attention_mask: Tensor  # (B, L)
    is_image: Tensor | None = None  # (B,) bool: still images repeated into clips (image prompt templates)
    video_index: Tensor | None = None  # (B,) int64 clip identity: equal for two captions of one clip


@dataclass
class Encoded:
    """A unimodal encoder's output for a batch of clips or texts.

    Attributes:
        feat: ``(B, D)`` the pooled feature the similarity uses (unit-norm for contrastive families).
        tokens: ``(B, N, C)`` the token sequence a fusion pass or a token-level score reads.
        mask: ``(B, N)`` 1 = real token (texts); None for clips.
    """

    feat: Tensor
    tokens: Tensor
    mask: Tensor | None = None


class _FrameShape(Protocol):
    @property
    def img_size(self) -> int: ...


class _TextShape(Protocol):
    @property
    def max_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...


class FamilyConfig(Protocol):
    """What every family's model config has (each family's own dataclass): the data steps read these, nothing else."""

    @property
    def pixel_mean(self) -> tuple[float, float, float]: ...

    @property
    def pixel_std(self) -> tuple[float, float, float]: ...

    @property
    def video(self) -> _FrameShape: ...

    @property
    def text(self) -> _TextShape: ...


ConfigT = TypeVar("ConfigT", bound=FamilyConfig)


@runtime_checkable
class Family(Protocol[ConfigT]):
    """What every model family provides (see the module docstring for the order of use), generic in its own config
    class (``Family[AlproConfig]``; shared code, which never reads more than :class:`FamilyConfig`, writes
    ``Family``). A family with a QA model also meets :class:`AnswersQuestions`, one with a fused re-ranking pass
    :class:`PairScorer`."""

    name: str
    kinds: Kinds
    default_losses: tuple[str, ...]  # the objectives ``model.losses = []`` stands for
    lr_groups: LrGroups  # the parameters fusion_lr_mult and backbone_lr_mult scale

    def weights(self, model: ModelConfig) -> tuple[str, str]: ...

    def config(self, model: ModelConfig, vocab_size: int, num_entities: int = 0) -> ConfigT: ...

    def config_from_dict(self, data: dict[str, Any]) -> ConfigT: ...

    def build(self, kind: str, config: ConfigT, num_answers: int = 0) -> nn.Module: ...

    def task_config(self, config: ConfigT, task: Task, section: RetrievalConfig | QAConfig) -> ConfigT: ...

    def prepare(self, config: ConfigT, batches_per_epoch: int, global_batch: int) -> ConfigT: ...

    def init_from(self, model: nn.Module, checkpoint: str, task: Task) -> list[str]: ...

    def train_step(self, model: nn.Module, batch: PretrainBatch, ctx: StepContext) -> dict[str, Tensor]: ...

    def encode_video(self, model: nn.Module, video: Tensor) -> Encoded: ...

    def encode_text(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Encoded: ...

    def similarity(self, model: nn.Module, texts: Encoded, videos: Encoded) -> Tensor: ...


@runtime_checkable
class AnswersQuestions(Family[ConfigT], Protocol[ConfigT]):
    """A family with a QA model (``kinds.qa`` names its kind): what ``finetune-qa`` and ``evaluate-qa`` call.
    Shared code gets it through :func:`qa_of`, never by assuming a family has it."""

    def set_answers(self, model: nn.Module, answers: list[str], tokenizer: Any) -> None: ...

    def qa_step(self, model: nn.Module, batch: dict[str, Tensor], ctx: StepContext) -> dict[str, Tensor]: ...

    def qa_logits(self, model: nn.Module, video: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor: ...


@runtime_checkable
class PairScorer(Family[ConfigT], Protocol[ConfigT]):
    """A family with a fused pass that scores (text, clip) pairs, which re-ranks the similarity's top candidates
    when a model has it (``reranks``). Shared code gets it through :func:`pair_scorer_of`."""

    def reranks(self, model: nn.Module) -> bool: ...

    def pair_logits(self, model: nn.Module, text_tokens: Tensor, text_mask: Tensor, video_tokens: Tensor) -> Tensor: ...


def answers_questions(fam: Family) -> bool:
    """Whether ``fam`` has a QA model. A family whose ``kinds.qa`` and methods disagree is broken: a TypeError."""
    has = isinstance(fam, AnswersQuestions)
    if has != bool(fam.kinds.qa):
        missing = [m for m in ("set_answers", "qa_step", "qa_logits") if not callable(getattr(fam, m, None))]
        raise TypeError(
            f"model family {fam.name}: kinds.qa is {fam.kinds.qa!r} but "
            + (f"it lacks {missing}" if missing else "it has QA methods (a family without QA sets kinds.qa='')")
        )
    return has


def qa_of(fam: Family) -> AnswersQuestions:
    """``fam`` as a family with a QA model, what ``finetune-qa`` and ``evaluate-qa`` use.

    Raises:
        ValueError: the family has no QA model; the message names the families that have one and what ``fam``'s
            models are for instead.
    """
    if answers_questions(fam):
        return cast(AnswersQuestions, fam)  # what answers_questions checked
    with_qa = sorted(name for name, other in families().items() if answers_questions(other))
    made = [k for k in (fam.kinds.pretrained, fam.kinds.retrieval) if k]
    raise ValueError(
        f"model family {fam.name} has no QA model: finetune-qa and evaluate-qa need a model of a family that has "
        f"one ({', '.join(with_qa) or 'none is registered'}); a {fam.name} model ({', '.join(made)}) is for "
        "retrieval: `vlp finetune-retrieval` and `vlp evaluate-retrieval`"
    )


def pair_scorer_of(fam: Family, model: nn.Module) -> PairScorer | None:
    """``fam`` as the pair scorer that re-ranks ``model``'s similarity ranking, or None when the ranking is final
    (a family without a fused pass, or a model trained without its match head)."""
    return fam if isinstance(fam, PairScorer) and fam.reranks(model) else None


class TwoTowerMethods:
    """The evaluation methods of a family whose module keeps its unimodal towers behind :meth:`towers` (an object
    whose ``encode_video`` / ``encode_text`` return ``(unit-norm feature, output with .tokens)``) and ranks by the
    cosine similarity of the features (ALPRO, ALBEF)."""

    def towers(self, model: nn.Module) -> Any:
        raise NotImplementedError

    def encode_video(self, model: nn.Module, video: Tensor) -> Encoded:
        feat, out = self.towers(model).encode_video(video)
        return Encoded(feat, out.tokens)

    def encode_text(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Encoded:
        feat, out = self.towers(model).encode_text(input_ids, attention_mask)
        return Encoded(feat, out.tokens, out.attention_mask)

    def similarity(self, model: nn.Module, texts: Encoded, videos: Encoded) -> Tensor:
        """Cosine similarity of the projected [CLS] features (what the contrastive loss trains)."""
        return texts.feat @ videos.feat.t()


class ForwardAnswers:
    """``qa_logits`` of a family whose QA module's forward returns the ``(B, A)`` answer scores (ALPRO, ALBEF); a
    family without QA leaves this out (:func:`answers_questions`)."""

    def qa_logits(self, model: nn.Module, video: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return model(video, input_ids, attention_mask)


RANDOM = "random"  # model.video_init / text_init: random init even where the family's size names weights


def size_weights(model: ModelConfig, chosen: Size) -> tuple[str, str]:
    """``(visual, text)`` weight sources of a ``model`` config section at size ``chosen``: the size's weights unless
    ``model.video_init`` / ``model.text_init`` are set; ``"random"`` there, or ``""`` in the size, is random init."""

    # here: the family contract is read without torch or transformers (the CLI's choices, the config's checks)
    from vlp.models.pretrained import resolve_init

    def pick(value: str, default: str) -> str:
        return resolve_init(default if not value else "" if value == RANDOM else value)

    video, text = chosen.weights
    return pick(model.video_init, video), pick(model.text_init, text)


def bert_text(chosen: Size, vocab_size: int, max_len: int, init: str) -> TextConfig:
    """The :class:`vlp.models.text.TextConfig` of size ``chosen`` (ALPRO's and ALBEF's BERT split into a text and
    a fusion encoder), starting from ``init``: its ``text`` sizes, or with ``text_from_weights`` the sizes of its
    default text weights (their ``config.json``), whatever ``init`` is.

    Raises:
        ValueError: ``text_from_weights`` and a ``vocab_size`` other than the weights' own (another tokenizer).
    """
    # here: the family contract is read without torch or transformers (the CLI's choices, the config's checks)
    from vlp.models.pretrained import resolve_init, text_config
    from vlp.models.text import TextConfig

    if not chosen.text_from_weights:
        return TextConfig(**({"vocab_size": vocab_size, "max_len": max_len} | dict(chosen.text)), init=init)
    cfg = text_config(resolve_init(chosen.weights[1]), **({"max_len": max_len} | dict(chosen.text)), init=init)
    if vocab_size != cfg.vocab_size:
        raise ValueError(
            f"model.preset's text weights, {chosen.weights[1]}, have a vocabulary of {cfg.vocab_size:,} entries but "
            f"the tokenizer has {vocab_size:,}: leave model.tokenizer empty so the weights' own tokenizer is used"
        )
    return cfg


def init_revisions(model: ModelConfig) -> tuple[str, str]:
    """``(video, text)`` hub revisions of a ``model`` config section's starting weights: ``model.video_init_revision``
    / ``model.text_init_revision`` (branch, tag or commit sha); ``""`` = the repository's default branch, ``main``,
    as it is at load time. The commit actually loaded is recorded in the model directory's ``lineage.upstream``,
    so a run can be repeated exactly by setting it here."""
    return model.video_init_revision, model.text_init_revision


def rgb(values: Sequence[float]) -> tuple[float, float, float]:
    """A configured per-channel list (``model.pixel_mean``) as a family config's triple, which the config's own
    check refuses when it is not 3 values long."""
    return cast(tuple[float, float, float], tuple(values))


def built(part: _T | None, what: str) -> _T:
    """``part`` of a module or of its output that the enabled objectives make: a None is an objective enabled
    without it (a ValueError that names ``what``)."""
    if part is None:
        raise ValueError(f"{what} is missing: an objective that needs it is enabled but it was not built")
    return part


def generator_on(generator: Any, like: Tensor) -> Any:
    """``generator`` if it lives on ``like``'s device, else None (a CUDA tensor's draws need a CUDA generator)."""
    return generator if generator is None or generator.device == like.device else None


# --------------------------------------------------------------------------- what pre-training reads first


class InputCheck(NamedTuple):
    """One input a family's pre-training reads besides the pairs, for the step to check before it writes anything:
    a model directory when ``kinds`` is given, else a file (``remedy`` says how to make it)."""

    flag: str  # the command-line flag that names it (``--prompter``)
    uri: str
    kinds: tuple[str, ...] = ()
    remedy: str = ""


@dataclass
class PretrainExtras:
    """What a family's pre-training hook (:class:`PretrainHook`) opened from its ``pretrain_inputs`` for the step.

    Attributes:
        context: the family's part of the step context (:attr:`StepContext.extra`), on the training device.
        tokenizer: the tokenizer the model must share with an input (ALPRO: its prompter's); None = the step takes
            its own (:func:`vlp.steps.common.step_tokenizer`).
        entities: the entity names the model predicts (its config's ``num_entities``), saved in ``model.json``.
        lineage: the inputs named in the output's ``model.json`` (``{"prompter": <uri>}``).
        report: called on rank 0 after training with ``(dataset, frames, out, cfg, model_config)``; returns entries
            for the step's summary (ALPRO: PEM example figures).
    """

    context: Any = None
    tokenizer: Any = None
    entities: list[str] = field(default_factory=list)
    lineage: dict[str, str] = field(default_factory=dict)
    report: Callable[..., dict[str, Any]] | None = None


class PretrainHook(Protocol):
    """What turns a family's ``pretrain_inputs`` (name -> URI, "" = not given) into what its pre-training step
    needs (:attr:`FamilySpec.pretraining`: a module, or an object with these methods). A family whose inputs are
    made by a step of vlp's (ALPRO's prompt bank: ``vlp build-prompt-bank``) may offer that step's work too
    (ALPRO's ``build_bank``)."""

    def checks(self, inputs: Mapping[str, str], terms: Sequence[str]) -> list[InputCheck]:
        """The inputs that ``vlp pretrain`` with objectives ``terms`` reads; a missing required one is a
        ValueError that says which step makes it."""
        ...

    def load(self, inputs: Mapping[str, str], terms: Sequence[str], device: Any) -> PretrainExtras:
        """What :meth:`checks` named, opened (a model moved to ``device``)."""
        ...
