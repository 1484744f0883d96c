"""The family registry: a family's name -> its :class:`~vlp.models.spec.FamilySpec`, read without importing any
model code.

The built-in families (ALPRO, ALBEF, TS2-Net) are the ``SPEC`` of their ``vlp.models.<name>.spec`` modules (no torch),
imported here in :data:`BUILT_IN`; a family defined elsewhere (a test, a user's package) joins with
:func:`register`. The CLI's choices, the config's ``model.<family>`` sections and checks, the compiled pre-training
DAGs, ``import-checkpoint --family auto`` and the docs table all read it; :func:`get` imports a family's code
(:class:`vlp.models.family.Family`) when a step needs it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from vlp.models.albef.spec import SPEC as ALBEF
from vlp.models.alpro.spec import SPEC as ALPRO
from vlp.models.spec import FamilySpec, Kinds, Prepared, Size
from vlp.models.ts2net.spec import SPEC as TS2NET

if TYPE_CHECKING:
    from vlp.models.family import Family

BUILT_IN = (ALBEF, ALPRO, TS2NET)  # in name order; a new family's spec joins here

DEFAULT_FAMILY = "alpro"  # model.family when a config does not say (its pre-training DAG is vlp-pretrain)
# The keys of the ``model`` section every family reads (vlp.settings.ModelConfig's fields, which a test holds equal):
# a family of one of these names would make ``model.<name>`` mean two things.
SHARED_MODEL_KEYS = frozenset({
    "family", "preset", "img_size", "num_frames", "max_len", "vocab_size", "tokenizer", "video_init", "text_init",
    "video_init_revision", "text_init_revision", "tokenizer_revision", "embed_dim", "losses", "pixel_mean",
    "pixel_std", "families",
})  # fmt: skip
_registered: dict[str, FamilySpec] = {one.name: one for one in BUILT_IN}


def register(spec: FamilySpec) -> FamilySpec:
    """Add a family to the registry (a package outside ``vlp.models``, a test); a taken name is an error."""
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
