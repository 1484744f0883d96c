"""Typed configuration: dataclasses loaded from YAML, with ``key=value`` overrides.

Every section of a config file is a dataclass. Loading is strict: an unknown key, a value of
the wrong type, a number that is not finite (``inf``, ``nan``, ``1.0e+309``) or a malformed override
raises :class:`ConfigError` naming the dotted key, so a typo never silently falls back to a default.
So does a count, size or rate out of the range declared beside its key (:func:`vlp.ranges.ranged`,
e.g. ``pretrain.batch_size=0 must be >= 1``): :func:`validate` runs at the end of :func:`load_config`,
and again when a step starts, before it writes anything. YAML text, a file's or an override's, is read by
:func:`vlp.schema.load_yaml`: aliases, nesting and size are bounded.

Example::

    cfg = load_config("configs/default.yaml", ["frames.num_frames=8", "storage.endpoint_url=http://127.0.0.1:9000"])
    cfg.frames.num_frames  # 8
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from vlp.data.entities import EntitiesConfig
from vlp.data.fetch.config import FetchConfig
from vlp.data.frames import FramesConfig
from vlp.data.ingest import IngestConfig
from vlp.data.synth import SynthConfig
from vlp.ranges import ranges_of
from vlp.registry import names, randaug_presets
from vlp.schema import MAX_YAML_CHARS, clip, load_yaml, nonfinite_values, quote
from vlp.schema import ConfigError as ConfigError  # the loader's public names: vlp.config.ConfigError, ...
from vlp.schema import from_dict as from_dict
from vlp.schema import to_dict as to_dict
from vlp.settings import IndexConfig, ModelConfig, PretrainConfig, QAConfig, RetrievalConfig
from vlp.storage import StorageConfig
from vlp.text import invalid_utf8
from vlp.tracking import TrackingConfig


@dataclass
class Config:
    """The whole project configuration: one section per concern."""

    storage: StorageConfig = field(default_factory=StorageConfig)
    synth: SynthConfig = field(default_factory=SynthConfig)
    fetch: FetchConfig = field(default_factory=FetchConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    frames: FramesConfig = field(default_factory=FramesConfig)
    entities: EntitiesConfig = field(default_factory=EntitiesConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    qa: QAConfig = field(default_factory=QAConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    index: IndexConfig = field(default_factory=IndexConfig)


def load_config(path: str | Path | Sequence[str | Path] | None = None, overrides: Iterable[str] = ()) -> Config:
    """Load YAML ``path`` (or several, later files overriding earlier ones key by key; ``None`` = defaults),
    then apply ``key=value`` overrides in order."""
    paths = [] if path is None else [path] if isinstance(path, str | Path) else list(path)
    data: dict[str, Any] = {}
    for one in paths:
        layer = _read_yaml(one)
        for section, keys in layer.items():
            if isinstance(keys, Mapping):
                _forget_other_names(data, section, keys)
        _merge(data, layer)
    for item in overrides:
        key, value = parse_override(item)
        section, _, name = key.partition(".")
        _forget_other_names(data, section, [name])
        _set_dotted(data, key, value)
    cfg = from_dict(Config, data)  # unknown keys first, each mapping's before its values
    _check_text(data)
    validate(cfg)
    return cfg


def _check_text(node: Any, where: str = "") -> None:
    """Every key and string value of a loaded config is valid text (:func:`vlp.text.invalid_utf8`): a YAML escape such
    as ``"\\udc80"`` or an override from a non-UTF-8 command line would otherwise reach a path, a log line or a file
    name as a string no encoder takes."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            name = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and (problem := invalid_utf8(key)):
                raise ConfigError(f"the config key {quote(name)} {problem}")
            _check_text(value, name)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_text(value, f"{where}[{i}]")
    elif isinstance(node, str) and (problem := invalid_utf8(node)):
        raise ConfigError(f"{where}: the value {problem}")


def _read_yaml(path: str | Path) -> dict[str, Any]:
    if not Path(path).is_file():
        what = "is a directory" if Path(path).is_dir() else "does not exist"
        raise ConfigError(f"config file {path} {what}: --config takes a YAML file, e.g. configs/default.yaml")
    with open(path, "rb") as file:
        data = file.read(MAX_YAML_CHARS + 1)
    if len(data) > MAX_YAML_CHARS:
        raise ConfigError(f"config file {path} is larger than {MAX_YAML_CHARS:,} bytes: a config holds settings, "
                          "not data")  # fmt: skip
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: the byte 0x{data[exc.start]:02x} at offset {exc.start}") from None
    loaded = load_yaml(text, str(path))
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(loaded).__name__}")
    return loaded or {}


def _forget_other_names(data: dict[str, Any], section: str, keys: Iterable[str]) -> None:
    """Before a later file or override sets ``keys`` of ``section``: drop what ``data`` holds under each key's other
    name (old or new, the section class's ``RENAMED``), so the later value wins as it would under one name. Both
    names in one file are for the section's ``__config_load__`` to judge."""
    held = data.get(section)
    hint = get_type_hints(Config).get(section)
    renamed: dict[str, str] = getattr(hint, "RENAMED", {})
    if not renamed or not isinstance(held, dict):
        return
    other = renamed | {new: old for old, new in renamed.items()}
    for key in keys:
        if key in other:
            held.pop(other[key], None)


def _merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Deep-merge mappings: sections merge key by key, anything else is replaced."""
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def parse_override(item: str) -> tuple[str, Any]:
    """``"frames.size=224"`` -> ``("frames.size", 224)``; the value is parsed as YAML."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {quote(item)} is not of the form section.key=value")
    problem = invalid_utf8(item)
    if problem:
        raise ConfigError(f"override {clip(key)}: the text {problem}")
    value = load_yaml(raw, f"override {clip(key)}") if raw.strip() else ""
    return key, value


CREDENTIAL_KEYS = ("storage.access_key_id", "storage.secret_access_key")  # belong in a Secret, never in overrides


def credential_overrides(overrides: Iterable[str]) -> list[str]:
    """The keys of ``overrides`` that carry a credential: a storage key, or a URI with a password in it."""
    from urllib.parse import urlsplit

    found = []
    for item in overrides:
        key, _, value = str(item).partition("=")
        key = key.strip()
        if (key in CREDENTIAL_KEYS and value.strip().strip("'\"")) or (
            "://" in value and urlsplit(value.strip().strip("'\"")).password
        ):
            found.append(key)
    return found


def redact_overrides(overrides: Iterable[str]) -> list[str]:
    """``overrides`` fit to print: the value of every credential override replaced by ``***``."""
    items = [str(o) for o in overrides]
    secret = set(credential_overrides(items))
    return [f"{o.partition('=')[0]}=***" if o.partition("=")[0].strip() in secret else o for o in items]


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {clip(key)}: {quote(part)} is a value, not a section")
        node = child
    node[parts[-1]] = value


SAMPLED_FRAMES = {"pretrain": "model.num_frames", "retrieval": "retrieval.num_frames", "qa": "qa.num_frames"}


def check_sampled_frames(cfg: Config, section: str) -> None:
    """For a step that trains or evaluates with ``section``'s settings: the frames it samples per clip must be at
    most what ``extract-frames`` stores (``frames.num_frames``), else the sampler would repeat frames.

    Raises:
        ConfigError: naming both keys.
    """
    key = SAMPLED_FRAMES.get(section)
    if key is None:
        return
    name, field_name = key.split(".")
    sampled, stored = getattr(getattr(cfg, name), field_name), cfg.frames.num_frames
    if sampled > stored:
        raise ConfigError(f"invalid config: {key}={sampled} is more than frames.num_frames={stored}, the frames "
                          f"extract-frames stores per clip (the sampler would repeat frames): lower {key}, or raise "
                          "frames.num_frames and re-run extract-frames")  # fmt: skip


def validate(cfg: Config) -> None:
    """Check that every float of ``cfg`` is finite, and every count, size and rate against the range declared beside
    its key (:func:`vlp.ranges.ranged`; a number without one may take any value: a seed, ``grad_clip``), and
    ``synth`` against its own rules (ingest's limits are checked by :mod:`vlp.data.ingest` when its step starts).

    Raises:
        ConfigError: one line naming every key out of range, e.g. ``pretrain.batch_size=0 must be >= 1``, or not
            finite (``pretrain.lr=inf must be a finite number``).
    """
    sections = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    sections |= {f"model.{name}": own for name, own in cfg.model.families.items()}
    nonfinite: dict[str, Any] = {}  # every section's, synth's and ingest's too
    for name, section in sections.items():
        nonfinite |= nonfinite_values(section, name)
    problems = [f"{key}={quote(value)} must be a finite number" for key, value in nonfinite.items()]
    problems += [
        f"{name}.{key}={quote(value)} must be {what}"
        for name, section in sections.items()
        for key, (ok, what) in ranges_of(section).items()
        if f"{name}.{key}" not in nonfinite and not ok(value := getattr(section, key))
    ]
    if cfg.model.family not in cfg.model.families:
        problems.append(f"model.family={quote(cfg.model.family)} is not a registered family; choose one of "
                        f"{list(names())}")  # fmt: skip
    presets = randaug_presets()
    for name in ("pretrain", "retrieval", "qa"):
        if (ops := getattr(cfg, name).randaug_ops) and ops not in presets:
            problems.append(f'{name}.randaug_ops={quote(ops)} must be "" (the family\'s) or one of {sorted(presets)}')
    try:
        cfg.synth.validate()
    except ValueError as exc:
        problems.append(str(exc).removeprefix("invalid synth config: "))
    if cfg.pretrain.group_by and cfg.pretrain.order != "global":
        problems.append(f"pretrain.group_by={quote(cfg.pretrain.group_by)} needs pretrain.order=global (grouped "
                        "batches are cut from the global permutation)")  # fmt: skip
    if problems:
        raise ConfigError(f"invalid config: {'; '.join(problems)}")
