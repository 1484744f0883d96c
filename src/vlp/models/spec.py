"""What a model family declares about itself, without importing its model code (no torch): its
:class:`FamilySpec` (name, config section, sizes, kinds, the steps its pre-training DAG runs first) and the config
keys the families with video-text matching share (:class:`VTMSettings`). Each family's ``spec`` module builds its
spec from these; :mod:`vlp.registry` holds the specs; :mod:`vlp.models.family` re-exports them for family authors.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from vlp.ranges import SHARE, ranged

if TYPE_CHECKING:
    from vlp.models.family import Family, PretrainHook

Task = Literal["retrieval", "qa"]
FROM_DATA = ("dataset", "frames")  # what every pre-training DAG has made before a family's own steps


@dataclass(frozen=True)
class Prepared:
    """Something a family's pre-training DAG makes before ``vlp pretrain``, by a step of its own: an input
    pre-training reads, or one made on the way to it (ALPRO: entities -> prompter -> prompt bank).

    Attributes:
        name: what it is called: the output of the KFP component that makes it, the parameter a later component
            takes it by, and its key in :func:`vlp.steps.pretrain.pretrain`'s ``inputs``.
        step: the step that makes it: its KFP task's name, its pipeline config entry (``steps.<step>``:
            resources, image; a step no built-in DAG has takes the config's ``defaults``) and the key of its KFP
            component in the DAG side's table (``pipelines.pretrain.COMPONENTS``).
        reads: the component's inputs: ``"dataset"``, ``"frames"`` or the ``name`` of something made before it,
            each passed as the parameter of that name.
        flag: ``vlp pretrain``'s option that names it (``--prompter``); ``""``: pre-training does not read it (it
            is made for a later step only, as ALPRO's entities are for its prompt bank).
        help: that option's help (the CLI adds the titles of the families that read it).
        title: how the DAG's description names it (default: ``name``).
        trains: whether its step trains (its task gets ``nproc`` and, on several nodes, ``launch``).
    """

    name: str
    step: str
    reads: tuple[str, ...] = FROM_DATA
    flag: str = ""
    help: str = ""
    title: str = ""
    trains: bool = False


@dataclass(frozen=True)
class Size:
    """One of a family's sizes, a value of ``model.preset``: its towers' dimensions and the weights it starts from.
    A family's ``spec`` module holds its sizes in a table (:attr:`FamilySpec.sizes`), as timm's ``default_cfgs``
    and open_clip's ``model_configs`` do: a new size is one entry, which its model module reads.

    Attributes:
        video: keyword arguments of the family's video tower config (``patch_size``, ``width``, ``depth``, ...).
            The ``model`` section's ``img_size`` and ``num_frames`` are the tower's unless a key here fixes them.
        text: the same for its text tower config (over the tokenizer's vocabulary and ``model.max_len``).
        weights: ``(video, text)`` weights it starts from: a timm or hub name, or ``"all-MiniLM-L6-v2"`` (the
            installed copy); ``""`` = random init. ``model.video_init`` / ``model.text_init`` replace them.
        text_from_weights: the text tower takes the sizes of its text weights (their ``config.json``), its first
            ``text["text_layers"]`` layers as the text encoder and the rest as the fusion; the tokenizer must be
            the weights' own.
        fine_patch: ``(side, patch)``: frames of at most ``side`` pixels are cut into ``patch`` pixel patches in
            place of ``video["patch_size"]``; ``(0, 0)``: no such rule.
        embed_dim: the projection size this size fixes (CLIP's 512); ``0`` = ``model.embed_dim``.
    """

    video: Mapping[str, Any] = field(default_factory=dict)
    text: Mapping[str, Any] = field(default_factory=dict)
    weights: tuple[str, str] = ("", "")
    text_from_weights: bool = False
    fine_patch: tuple[int, int] = (0, 0)
    embed_dim: int = 0

    def video_sizes(self, img_size: int) -> dict[str, Any]:
        """:attr:`video` for frames of ``img_size`` pixels (:attr:`fine_patch` applied)."""
        side, patch = self.fine_patch
        return {**self.video, "patch_size": patch} if patch and img_size <= side else dict(self.video)


class Kinds(NamedTuple):
    """The ``model.json`` kinds of one family's models."""

    pretrained: str  # what ``vlp pretrain`` writes (zero-shot retrieval evaluates it)
    retrieval: str  # ``vlp finetune-retrieval``
    qa: str  # ``vlp finetune-qa``; "" = the family has no QA model (it is no :class:`AnswersQuestions`)
    prompter: str = ""  # ALPRO's frozen VTC prompter (``vlp pretrain-prompter``); "" = the family has none

    def all(self) -> tuple[str, ...]:
        return tuple(k for k in self if k)


@dataclass(frozen=True)
class FamilySpec:
    """What the registry knows of a family without importing it (no torch).

    Attributes:
        name: ``model.family``'s value and the name of its config section, ``model.<name>``.
        title: how the docs and the CLI's help write it.
        paper: where it was published (the docs table).
        settings: the dataclass of its ``model.<name>`` section (every key with a default; a count, size or rate
            with its range, :func:`vlp.ranges.ranged`, which :func:`vlp.config.validate` checks).
        load: ``"module:attribute"`` of its :class:`vlp.models.family.Family` object (imported on first use), or a
            function returning it.
        pretrains: whether ``vlp pretrain`` trains it, and so whether it has a compiled pre-training DAG
            (TS2-Net: no, it fine-tunes CLIP; ``finetune-retrieval`` starts it from named weights).
        prepared: what its pre-training DAG makes before ``vlp pretrain``, in order (:class:`Prepared`); those with
            a ``flag`` are what pre-training reads besides the dataset and the frames (:attr:`pretrain_inputs`).
            ALPRO: mined entities -> a frozen prompter -> its prompt bank (PEM); ALBEF: nothing.
        importer: the module that maps its released checkpoints (:class:`vlp.models.importing.Importer`);
            ``""`` = ``vlp import-checkpoint`` does not read this family's files.
        pretraining: what opens its ``pretrain_inputs`` (:class:`vlp.models.family.PretrainHook`): a module's name
            (imported on first use) or the object itself; required with them.
        randaug: its RandAugment op lists, ``(preset name, timm op names)``, its default first; a training section's
            ``randaug_ops`` names one (any family's), or is ``""`` for the model's family's default.
        tasks: the fine-tuning tasks it has models for (``"retrieval"``, ``"qa"``), which its pre-training DAG
            fine-tunes and evaluates; ``"qa"`` exactly when its family object answers questions (the contract test
            holds the two together).
        kinds: the ``model.json`` kinds of its models (:class:`Kinds`), which its family object's ``kinds`` must
            equal (the contract test holds them so; the built-in families take theirs from here): what
            :func:`of_kind` and :func:`kinds` read without importing the family's model code, so that reading a
            model directory imports one family. ``None``: the family is imported to be asked.
        sizes: its sizes by name, the values ``model.preset`` takes (:class:`Size`; :func:`size` looks one up);
            empty: the family reads no ``model.preset`` (its sizes come from the ``model`` section alone).
    """

    name: str
    title: str
    paper: str
    settings: type
    load: str | Callable[[], Family]
    pretrains: bool
    prepared: tuple[Prepared, ...] = ()
    importer: str = ""
    pretraining: Any = ""
    randaug: tuple[tuple[str, tuple[str, ...]], ...] = ()
    tasks: tuple[Task, ...] = ("retrieval", "qa")
    kinds: Kinds | None = None
    sizes: Mapping[str, Size] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.prepared and not self.pretrains:
            raise ValueError(f"{self.name}: prepared inputs without pretrains")
        self._check_prepared()
        if "retrieval" not in self.tasks or set(self.tasks) - {"retrieval", "qa"}:
            raise ValueError(f"{self.name}: tasks are retrieval and optionally qa, got {self.tasks}")
        if bool(self.pretrain_inputs) != bool(self.pretraining):
            raise ValueError(f"{self.name}: pretrain_inputs and a pretraining hook go together")

    def _check_prepared(self) -> None:
        """Each prepared step reads what the data steps or an earlier one made; names, steps and flags are unique;
        everything made is read by pre-training or by a later step."""
        made: list[str] = list(FROM_DATA)
        for one in self.prepared:
            missing = [r for r in one.reads if r not in made]
            if missing:
                raise ValueError(f"{self.name}: {one.name} reads {missing}, made neither by the data steps nor "
                                 f"before it (made so far: {made})")  # fmt: skip
            if one.name in made:
                raise ValueError(f"{self.name}: {one.name!r} is made twice (or is a data step's name)")
            if one.flag and not re.fullmatch(r"--[a-z][a-z0-9-]*", one.flag):
                raise ValueError(f"{self.name}: {one.name}'s flag must look like --name, got {one.flag!r}")
            made.append(one.name)
        for key in ("step", "flag"):
            values = [getattr(one, key) for one in self.prepared if getattr(one, key)]
            if len(values) != len(set(values)):
                raise ValueError(f"{self.name}: two prepared inputs share a {key}: {values}")
        read = {r for one in self.prepared for r in one.reads} | set(self.pretrain_inputs)
        unread = [one.name for one in self.prepared if one.name not in read]
        if unread:
            raise ValueError(f"{self.name}: {unread} made but read by nothing (give it a flag, or drop it)")

    @property
    def pretrain_inputs(self) -> tuple[str, ...]:
        """What ``vlp pretrain`` reads besides the dataset and the frames: the prepared inputs with a flag."""
        return tuple(one.name for one in self.prepared if one.flag)

    def load_pretraining(self) -> PretrainHook | None:
        """Its pre-training hook (a module's import: torch), or None when its pre-training reads only the pairs."""
        if not self.pretraining:
            return None
        return importlib.import_module(self.pretraining) if isinstance(self.pretraining, str) else self.pretraining

    def load_importer(self) -> Any:
        """Its importer module (imports torch), or None when it has none."""
        return importlib.import_module(self.importer) if self.importer else None

    def family(self) -> Family:
        if callable(self.load):
            return self.load()
        module, _, attribute = self.load.partition(":")
        return getattr(importlib.import_module(module), attribute)


@dataclass
class VTMSettings:
    """Video-text matching's negatives, what another caption of the same clip is, and where MLM scores the
    vocabulary: the keys of the families with a VTM / ITM head and MLM (their ``model.<family>`` sections extend
    this)."""

    # hard (paper, code), uniform, or mixed (hard with probability vtm_hard_fraction)
    vtm_negatives: Literal["hard", "uniform", "mixed"] = "hard"
    vtm_hard_fraction: float = ranged(0.5, SHARE)
    same_video_vtc: Literal["negative", "positive"] = "negative"  # another caption of the clip in VTC / ITC
    # MLM's vocabulary logits at every text position (released code) or at the masked ones alone, the only ones with
    # a loss: the same loss and gradients to float rounding, with about 85% of the MLM head's FLOPs and the (B, L, V)
    # logits gone (docs/results/speed.md); not bit for bit the same sums, so "all" keeps every recorded figure
    mlm_logits: Literal["all", "masked"] = "all"
