"""Config text to dataclasses and back, strictly: what every config section is loaded with.

:func:`load_yaml` parses a config's YAML text in time and memory bounded by its length (aliases, nesting and size
limited); :func:`from_dict` builds a section dataclass from the parsed mapping, checking every key and value against
the type hints, and raises :class:`ConfigError` naming the dotted key on an unknown key, a value of the wrong type or
a number that is not finite (``inf``, ``nan``, ``1.0e+309``; a float field that takes them says so with
:data:`NONFINITE`); :func:`to_dict` is its inverse. A section that loads or writes part of itself its own way defines
``__config_load__(data, prefix)`` / ``__config_dump__(data)`` (the ``model`` section: its families' sections). An
error quotes a value through :func:`quote`, cut to :data:`QUOTE_CHARS` characters.

This module is the bottom of the configuration: it imports nothing of vlp, so a section can live with the code it
configures (``vlp.storage``, ``vlp.data.frames``, ...) and :mod:`vlp.config` gathers them into one ``Config``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

T = TypeVar("T")

# What a config text (a file, an override, a run parameter) may hold; the shipped files: < 5 KiB, < 300 values
MAX_YAML_CHARS = 1 << 18
MAX_YAML_NODES = 10_000  # mappings, lists, values and aliases as written (~150 us each to parse on a busy CPU)
MAX_YAML_DEPTH = 32  # mappings and lists nested in one another, aliases written out (a config: 4)
MAX_ALIAS_GROWTH = 100_000  # the nodes and scalar characters that all aliases (*name) of one text add, written out
QUOTE_CHARS = 200  # of a value quoted in an error message
NONFINITE = "nonfinite"  # field(metadata={NONFINITE: True}): a float key that takes inf, -inf and nan (none does)
INT_BITS = 64  # an integer key holds a signed 64-bit value


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key."""


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters with the full length said."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's digits limit for text
        return f"<a {type(value).__name__} too long to print>"
    return clip(text, limit)


def clip(text: str, limit: int = QUOTE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with how many there were."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def load_yaml(text: str, source: str) -> Any:
    """``text`` parsed as YAML (the safe tags, as ``yaml.safe_load``) in time and memory bounded by its length.

    The text is at most :data:`MAX_YAML_CHARS` characters and :data:`MAX_YAML_NODES` nodes long; aliases
    (``*name``) load, but all of them in one text may add at most :data:`MAX_ALIAS_GROWTH` nodes and scalar
    characters once written out (a "billion laughs" text of under 1 KB would be a billion nodes); mappings and
    lists nest at most :data:`MAX_YAML_DEPTH` deep, aliases written out. Each limit is checked as the text is
    parsed, before a Python object is built, so a text past one fails in the time it takes to read up to the limit.

    Args:
        text: the YAML text.
        source: what the text is, for the message (a path, ``override pretrain.lr``).

    Raises:
        ConfigError: one line starting with ``source``: the text is not YAML, or past a limit.
    """
    if len(text) > MAX_YAML_CHARS:
        raise ConfigError(f"{source}: {len(text):,} characters of YAML, more than the {MAX_YAML_CHARS:,} a config "
                          "may hold")  # fmt: skip
    import yaml  # here: importing the schema (every config section does) loads no YAML parser

    loader = _bounded_loader()(text)
    loader.source = source
    try:
        return loader.get_single_data()
    except ConfigError:
        raise
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: a date or integer the constructor cannot make
        raise ConfigError(f"{source}: not valid YAML: {clip(' '.join(str(exc).split()), 300)}") from None
    finally:
        loader.dispose()


@functools.cache
def _bounded_loader() -> Any:
    """``yaml.SafeLoader`` that refuses a text past :data:`MAX_YAML_NODES` nodes or nested past
    :data:`MAX_YAML_DEPTH` while it composes it, and a document whose aliases grow it past :data:`MAX_ALIAS_GROWTH`
    before it builds a Python object of it."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        source = "YAML"
        depth = nodes = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.nodes += 1
            if self.nodes > MAX_YAML_NODES:
                raise ConfigError(f"{self.source}: more than {MAX_YAML_NODES:,} values, mappings and lists (line "
                                  f"{self._line()}); a config holds settings, not data")  # fmt: skip
            if self.depth >= MAX_YAML_DEPTH:
                raise ConfigError(f"{self.source}: mappings and lists nested more than {MAX_YAML_DEPTH} deep (line "
                                  f"{self._line()}); a config nests a few levels")  # fmt: skip
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def compose_document(self) -> Any:
            node = super().compose_document()
            if node is None:
                return None
            own: list[int] = [0]  # the size of the nodes as written, each once
            grown = _written_out(node, 0, {}, own, self.source) - own[0]
            if grown > MAX_ALIAS_GROWTH:
                raise ConfigError(f"{self.source}: its YAML aliases (*name) add {grown:,} nodes and characters once "
                                  f"written out, more than the {MAX_ALIAS_GROWTH:,} a config may add; write the "
                                  "values out, or use fewer aliases")  # fmt: skip
            return node

        def _line(self) -> int:
            return int(self.peek_event().start_mark.line) + 1

    return BoundedLoader


def _written_out(node: Any, depth: int, seen: dict[int, int], own: list[int], source: str) -> int:
    """The nodes and scalar characters of ``node`` with every alias under it written out (``seen``: those of each
    node met, by id; ``own[0]`` sums each node's own size once)."""
    if id(node) in seen:
        return seen[id(node)]
    if depth > MAX_YAML_DEPTH:
        raise ConfigError(f"{source}: YAML aliases nest mappings and lists more than {MAX_YAML_DEPTH} deep once "
                          "written out, or an alias (*name) lies inside its own anchor (&name)")  # fmt: skip
    value = node.value
    if isinstance(value, str):
        size = 1 + len(value)
        own[0] += size
    else:
        children = [part for item in value for part in (item if isinstance(item, tuple) else (item,))]
        own[0] += 1
        size = 1 + sum(_written_out(child, depth + 1, seen, own, source) for child in children)
    seen[id(node)] = size
    return size


def from_dict(cls: type[T], data: Mapping[str, Any] | None, prefix: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, checking keys and types recursively (each mapping's keys before its
    values)."""
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
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [key for key in data if key not in fields]  # the first one as written
    if unknown:
        where = f" in section {prefix!r}" if prefix else ""
        name = _join(prefix, unknown[0]) if isinstance(unknown[0], str) else unknown[0]
        raise ConfigError(f"unknown config key {quote(name)}{where}; valid keys: {sorted(fields)}")
    kwargs = {
        name: _coerce(hints[name], value, _join(prefix, name), fields[name].metadata.get(NONFINITE, False))
        for name, value in data.items()
    }
    return cls(**kwargs)


def nonfinite_values(section: Any, prefix: str) -> dict[str, Any]:
    """``{dotted key: value}`` of each float of dataclass ``section`` (nested sections and lists of floats included;
    a ``dict`` field's values are sections of their own) that is not finite though its key does not take that
    (:data:`NONFINITE`): the check :func:`from_dict` makes, for a section built in code."""
    found: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        value, key = getattr(section, f.name), _join(prefix, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            found |= nonfinite_values(value, key)
        elif not f.metadata.get(NONFINITE, False):
            items = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, float) and not math.isfinite(v) for v in items):
                found[key] = value
    return found


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


def _coerce(tp: Any, value: Any, key: str, nonfinite: bool = False) -> Any:
    """``value`` as type ``tp`` for config key ``key``; a float is finite unless ``nonfinite`` (the key's
    :data:`NONFINITE` mark)."""
    origin = get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # X | None: X's own message
            return _coerce(options[0], value, key, nonfinite)
        for arg in options:
            try:
                return _coerce(arg, value, key, nonfinite)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: {quote(value)} does not match {tp}")
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{key}: {quote(value)} is not one of {list(get_args(tp))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {quote(value)}")
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ConfigError(f"{key}: expected {len(args)} items, got {len(value)}")
            pairs = enumerate(zip(args, value, strict=True))
            return tuple(_coerce(a, v, f"{key}[{i}]", nonfinite) for i, (a, v) in pairs)
        item_tp = args[0] if args else Any
        items = [_coerce(item_tp, v, f"{key}[{i}]", nonfinite) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return dict(value)
    if tp is Any:
        return value
    return _scalar(tp, value, key, nonfinite)


def _scalar(tp: Any, value: Any, key: str, nonfinite: bool) -> Any:
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {_got(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {_got(value)}")
        try:
            number = float(value)
        except OverflowError:  # an integer past the largest float
            number = math.inf
        if not (nonfinite or math.isfinite(number)):
            raise ConfigError(f"{key}: expected a finite number, got {quote(value)}: this key takes no inf, nan or "
                              "number past 1.8e308")  # fmt: skip
        return number
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {_got(value)}")
        if value.bit_length() >= INT_BITS:
            raise ConfigError(f"{key}: {quote(value)} is past the range of a {INT_BITS}-bit integer")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {_got(value)}")
        return value
    raise ConfigError(f"{key}: unsupported config type {tp}")


def _got(value: Any) -> str:
    return f"{type(value).__name__} {quote(value)}"
