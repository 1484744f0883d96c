"""Typed configuration: dataclasses loaded from YAML, with ``key=value`` overrides.

Every section of a config file is a dataclass. Loading is strict: an unknown key, a value of
the wrong type or a malformed override raises :class:`ConfigError` naming the dotted key, so a
typo never silently falls back to a default.

Example::

    cfg = load_config("configs/default.yaml", ["frames.num_frames=8", "storage.endpoint_url=http://127.0.0.1:9000"])
    cfg.frames.num_frames  # 8
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

from vlp.data.entities import EntitiesConfig
from vlp.data.frames import FramesConfig
from vlp.data.ingest import IngestConfig
from vlp.data.synth import SynthConfig
from vlp.storage import StorageConfig
from vlp.tracking import TrackingConfig
from vlp.train.settings import ModelConfig, PretrainConfig, QAConfig, RetrievalConfig

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key."""


@dataclass
class Config:
    """The whole project configuration: one section per concern."""

    storage: StorageConfig = field(default_factory=StorageConfig)
    synth: SynthConfig = field(default_factory=SynthConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    frames: FramesConfig = field(default_factory=FramesConfig)
    entities: EntitiesConfig = field(default_factory=EntitiesConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    qa: QAConfig = field(default_factory=QAConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


def load_config(path: str | Path | Sequence[str | Path] | None = None, overrides: Iterable[str] = ()) -> Config:
    """Load YAML ``path`` (or several, later files overriding earlier ones key by key; ``None`` = defaults),
    then apply ``key=value`` overrides in order."""
    paths = [] if path is None else [path] if isinstance(path, str | Path) else list(path)
    data: dict[str, Any] = {}
    for one in paths:
        _merge(data, _read_yaml(one))
    for item in overrides:
        key, value = parse_override(item)
        _set_dotted(data, key, value)
    return from_dict(Config, data)


def _read_yaml(path: str | Path) -> dict[str, Any]:
    text = Path(path).read_text(encoding="utf-8")
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from exc
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(loaded).__name__}")
    return loaded or {}


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
        raise ConfigError(f"override {item!r} is not of the form section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: cannot parse value {raw!r}: {exc}") from exc
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
            raise ConfigError(f"override {key}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def from_dict(cls: type[T], data: Mapping[str, Any] | None, prefix: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, checking keys and types recursively."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        where = f" in section {prefix!r}" if prefix else ""
        raise ConfigError(f"unknown config key {_join(prefix, unknown[0])!r}{where}; valid keys: {sorted(names)}")
    kwargs = {name: _coerce(hints[name], value, _join(prefix, name)) for name, value in data.items()}
    return cls(**kwargs)


def to_dict(obj: Any) -> dict[str, Any]:
    """Plain-dict view of a config dataclass (for logging and saving next to outputs)."""
    return dataclasses.asdict(obj)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: {value!r} does not match {tp}")
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{key}: {value!r} is not one of {list(get_args(tp))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ConfigError(f"{key}: expected {len(args)} items, got {len(value)}")
            return tuple(_coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
        item_tp = args[0] if args else Any
        items = [_coerce(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {type(value).__name__} {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__} {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported config type {tp}")
