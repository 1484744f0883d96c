"""Dataclasses from mappings and back, strictly: what every config section is loaded with.

:func:`from_dict` builds a section dataclass from a parsed YAML mapping, checking every key and value against the
type hints, and raises :class:`ConfigError` naming the dotted key on an unknown key or a value of the wrong type;
:func:`to_dict` is its inverse. A section that loads or writes part of itself its own way defines
``__config_load__(data, prefix)`` / ``__config_dump__(data)`` (the ``model`` section: its families' sections).

This module is the bottom of the configuration: it imports nothing of vlp, so a section can live with the code it
configures (``vlp.storage``, ``vlp.data.frames``, ...) and :mod:`vlp.config` gathers them into one ``Config``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key."""


def from_dict(cls: type[T], data: Mapping[str, Any] | None, prefix: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, checking keys and types recursively."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    load = getattr(cls, "__config_load__", None)
    if load is not None:  # a section that loads parts of itself (ModelConfig: its family sections)
        data = load(data, prefix or "config")
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"from_dict builds a dataclass, got {cls!r}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        where = f" in section {prefix!r}" if prefix else ""
        raise ConfigError(f"unknown config key {_join(prefix, unknown[0])!r}{where}; valid keys: {sorted(names)}")
    kwargs = {name: _coerce(hints[name], value, _join(prefix, name)) for name, value in data.items()}
    return cls(**kwargs)


def to_dict(obj: Any) -> dict[str, Any]:
    """Plain-dict view of a config dataclass (for logging and saving next to outputs), laid out as a config file:
    ``from_dict(type(obj), to_dict(obj))`` rebuilds everything a step reads (the ``model`` section keeps the
    section of its own family only, :meth:`vlp.settings.ModelConfig.__config_dump__`)."""
    data = {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    dump = getattr(obj, "__config_dump__", None)
    return dump(data) if dump is not None else data


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
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
