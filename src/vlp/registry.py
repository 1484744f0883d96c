"""The family registry: a family's name -> its :class:`FamilySpec`, found without importing any model code.

A family (ALPRO, ALBEF, TS2-Net) is a package ``vlp.models.<name>`` whose ``spec`` module (no torch import) holds its
:class:`FamilySpec`; :func:`specs` finds every such package on first use (importing only the ``spec`` modules). A
family defined elsewhere (a test, a user's package) joins with :func:`register`. The CLI's choices, the config's
``model.<family>`` sections and checks, the compiled pre-training DAGs, ``import-checkpoint --family auto`` and the
docs table all read it; :func:`get` imports a family's code (:class:`vlp.models.family.Family`) when a step needs it.

This module imports nothing of vlp (the spec modules are imported by name, on first use), so the configuration can
read it below the models; :mod:`vlp.models.family`, the contract a family meets, re-exports it for family authors.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from vlp.models.family import Family, PretrainHook

Task = Literal["retrieval", "qa"]
FROM_DATA = ("dataset", "frames")  # what every pre-training DAG has made before a family's own steps
DEFAULT_PRETRAIN_COMPONENT = "components.training:pretrain"  # its inputs besides the data: prompter, bank


@dataclass(frozen=True)
class Prepared:
    """Something a family's pre-training DAG makes before ``vlp pretrain``, by a step of its own: an input
    pre-training reads, or one made on the way to it (ALPRO: entities -> prompter -> prompt bank).

    Attributes:
        name: what it is called: the output of the KFP component that makes it, the parameter a later component
            takes it by, and its key in :func:`vlp.steps.pretrain.pretrain`'s ``inputs``.
        step: the step that makes it: its KFP task's name and its pipeline config entry (``steps.<step>``:
            resources, image); a step no built-in DAG has takes the config's ``defaults``.
        component: that step's KFP component, ``"module:attribute"`` (imported when a DAG is compiled), or the
            component itself.
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
    component: Any
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
        settings: the dataclass of its ``model.<name>`` section (every key with a default; an optional class
            attribute ``RANGES`` maps keys to :mod:`vlp.ranges` ranges that :func:`vlp.config.validate` checks).
        load: ``"module:attribute"`` of its :class:`vlp.models.family.Family` object (imported on first use), or a
            function returning it.
        pretrains: whether ``vlp pretrain`` trains it, and so whether it has a compiled pre-training DAG
            (TS2-Net: no, it fine-tunes CLIP; ``finetune-retrieval`` starts it from named weights).
        prepared: what its pre-training DAG makes before ``vlp pretrain``, in order (:class:`Prepared`); those with
            a ``flag`` are what pre-training reads besides the dataset and the frames (:attr:`pretrain_inputs`).
            ALPRO: mined entities -> a frozen prompter -> its prompt bank (PEM); ALBEF: nothing.
        pretrain_component: the KFP component that pre-trains it, ``"module:attribute"`` or the component: it takes
            ``dataset``, ``frames``, one input per :attr:`pretrain_inputs` name, ``family`` and the steps'
            ``config``, ``overrides``, ``data_root``, ``nproc``, ``launch``. ``""``: the shared one
            (:data:`DEFAULT_PRETRAIN_COMPONENT`), whose inputs are ``prompter`` and ``bank``.
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
    pretrain_component: Any = ""
    importer: str = ""
    pretraining: Any = ""
    randaug: tuple[tuple[str, tuple[str, ...]], ...] = ()
    tasks: tuple[Task, ...] = ("retrieval", "qa")
    kinds: Kinds | None = None
    sizes: Mapping[str, Size] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.prepared or self.pretrain_component) and not self.pretrains:
            raise ValueError(f"{self.name}: prepared inputs or a pretrain component without pretrains")
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


DEFAULT_FAMILY = "alpro"  # model.family when a config does not say (its pre-training DAG is vlp-pretrain)
# The keys of the ``model`` section every family reads (vlp.settings.ModelConfig's fields, which a test holds equal):
# a family of one of these names would make ``model.<name>`` mean two things.
SHARED_MODEL_KEYS = frozenset({
    "family", "preset", "img_size", "num_frames", "max_len", "vocab_size", "tokenizer", "video_init", "text_init",
    "video_init_revision", "text_init_revision", "tokenizer_revision", "embed_dim", "losses", "pixel_mean",
    "pixel_std", "families",
})  # fmt: skip
_registered: dict[str, FamilySpec] = {}
_found = False


def _find() -> None:
    """Register every package under ``vlp.models`` that has a ``spec`` module (once)."""
    global _found
    if _found:
        return
    models = importlib.import_module("vlp.models")  # by name, as the spec modules: the registry sits below them

    for info in sorted(pkgutil.iter_modules(models.__path__), key=lambda m: m.name):
        if info.ispkg and (Path(info.module_finder.path) / info.name / "spec.py").is_file():  # type: ignore[union-attr]
            spec = importlib.import_module(f"vlp.models.{info.name}.spec").SPEC
            _registered.setdefault(spec.name, spec)
    _found = True


def register(spec: FamilySpec) -> FamilySpec:
    """Add a family to the registry (a package outside ``vlp.models``, a test); a taken name is an error."""
    _find()
    if not re.fullmatch(r"[a-z][a-z0-9_]*", spec.name):
        raise ValueError(f"a family name is lower case letters, digits and _, got {spec.name!r}")
    if spec.name in SHARED_MODEL_KEYS:
        raise ValueError(f"a family cannot be called {spec.name!r}: model.{spec.name} is a shared key")
    if spec.name in _registered and _registered[spec.name] is not spec:
        raise ValueError(f"a model family named {spec.name!r} is already registered")
    taken = randaug_presets().keys() & {name for name, _ in spec.randaug}
    if taken and _registered.get(spec.name) is not spec:
        raise ValueError(f"{spec.name}: RandAugment presets {sorted(taken)} are another family's")
    for one in spec.prepared:  # `vlp pretrain` has one option per flag, whichever family it names
        other = pretrain_flags().get(one.flag)
        if one.flag and other is not None and other.name != one.name and _registered.get(spec.name) is not spec:
            raise ValueError(f"{spec.name}: {one.flag} names another family's {other.name!r}, not {one.name!r}")
    _registered[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a family :func:`register` added (tests clean up with it)."""
    _registered.pop(name, None)


def specs() -> dict[str, FamilySpec]:
    """Every registered family's spec, by name (the built-in ones in name order, then registered ones)."""
    _find()
    return dict(_registered)


def names() -> tuple[str, ...]:
    """The registered families' names (the CLI's choices)."""
    return tuple(specs())


def spec(name: str) -> FamilySpec:
    """The spec of the family called ``name``; an unknown name is an error that lists the known ones."""
    known = specs()
    if name not in known:
        raise ValueError(f"unknown model family {name!r}; choose one of {sorted(known)}")
    return known[name]


def size(name: str, preset: str) -> Size:
    """The size called ``preset`` (``model.preset``) of the family called ``name``; a name its table lacks is an
    error that lists the sizes it has."""
    sizes = spec(name).sizes
    if preset not in sizes:
        shown = repr(preset)[:100] + ("..." if len(repr(preset)) > 100 else "")
        raise ValueError(f"model.preset={shown} is not a size of {name}: {', '.join(sizes)}")
    return sizes[preset]


def families() -> dict[str, Family]:
    """Every registered family, by name (each imported on first use)."""
    return {name: one.family() for name, one in specs().items()}


def get(name: str) -> Family:
    """The family called ``name``; an unknown name is an error that lists the known ones."""
    return spec(name).family()


def kinds(name: str) -> Kinds:
    """The kinds of the family called ``name``: its spec's, else its family object's (imported to be asked)."""
    one = spec(name)
    return one.kinds if one.kinds is not None else one.family().kinds


def of_kind(kind: str) -> Family:
    """The family that has models of ``kind``: found by the kinds the specs declare, so that reading one model
    directory imports its family alone; a family whose spec declares none is imported to be asked."""
    for name in sorted(specs(), key=lambda n: specs()[n].kinds is None):  # the declared ones first
        if kind in kinds(name).all():
            return get(name)
    known = sorted(k for name in specs() for k in kinds(name).all())
    raise ValueError(f"unknown model kind {kind!r}; known kinds: {known}")


def pretrain_flags() -> dict[str, Prepared]:
    """``vlp pretrain``'s options for prepared inputs, every registered family's, by flag (a flag names one input
    in every family that reads it)."""
    return {one.flag: one for spec in specs().values() for one in spec.prepared if one.flag}


def randaug_presets() -> dict[str, tuple[str, ...]]:
    """Every registered family's RandAugment op lists (timm op names), by preset name."""
    return {name: ops for one in specs().values() for name, ops in one.randaug}


def randaug_ops(preset: str, family: str) -> tuple[str, ...]:
    """The op list a training section's ``randaug_ops`` names: ``preset`` (any family's), or for ``""`` the
    default of ``family`` (its spec's first list; the default family's for a family that lists none)."""
    if preset:
        known = randaug_presets()
        if preset not in known:
            raise ValueError(
                f'unknown RandAugment preset {preset!r}; choose one of {sorted(known)} or "" (the family\'s)'
            )
        return known[preset]
    for name in (family or DEFAULT_FAMILY, DEFAULT_FAMILY):
        if spec(name).randaug:
            return spec(name).randaug[0][1]
    raise ValueError(f"neither {family!r} nor {DEFAULT_FAMILY!r} lists a RandAugment preset")
