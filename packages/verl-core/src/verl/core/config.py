"""Typed configuration: dataclasses, YAML recipes and ``a.b.c=value`` command-line overrides.

The schema is a tree of dataclasses. A run's config is the schema's defaults, then each YAML source in
order, then the overrides. Every key is checked against the schema before anything runs: an unknown key
names the nearest valid ones, and a value of the wrong type names the key and the expected type.
Dataclass ``__post_init__`` methods validate values (ranges, choices) when the final object is built; their
messages start with the field name relative to their own node ("lr=-1 must be >= 0"), and the error
reported names the full path ("actor_rollout_ref.actor.optim.lr=-1 must be >= 0").
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")


class ConfigError(ValueError):
    """A config problem the user can fix; the message names the key and what to do."""


#: An override that removes a key (Hydra's ``~key`` or ``~key=value``): the key goes back to its default.
DELETE = object()


def parse_override(text: str) -> tuple[str, Any]:
    """``"a.b.c=value"`` -> ("a.b.c", value), with the value read as YAML (numbers, bools, lists).

    Hydra's prefixes are understood: ``+key=value`` and ``++key=value`` set a key like ``key=value`` (every
    schema key already exists, so "add" and "force add" mean "set"); ``~key`` (optionally ``~key=value``)
    returns the key to its default, given as the value :data:`DELETE`."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if key.startswith("~") and key[1:]:
        return key[1:], DELETE
    key = key.lstrip("+")
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form key.path=value (e.g. data.train_batch_size=16)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str):
        # YAML 1.1 reads "1e-5" (no dot) as a string; learning rates are written exactly like that.
        try:
            value = float(value) if value.strip().lower() not in ("nan", "inf", "-inf", "infinity") else value
        except ValueError:
            pass
    return key, value


def schema_keys(schema: type, prefix: str = "") -> list[str]:
    """Every dotted key path of a dataclass schema (nested dataclasses expanded)."""
    keys: list[str] = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        path = f"{prefix}{f.name}"
        keys.append(path)
        sub = _dataclass_type(hints.get(f.name))
        if sub is not None:
            keys.extend(schema_keys(sub, prefix=f"{path}."))
    return keys


def _dataclass_type(hint: Any) -> type | None:
    # Type hints name dataclass types, never instances (is_dataclass accepts both).
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                return arg
    return None


def _open_keys(schema: type, prefix: str = "") -> list[str]:
    """Key paths whose values are free-form dicts (any sub-key is allowed below them)."""
    out: list[str] = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        hint = hints.get(f.name)
        sub = _dataclass_type(hint)
        if sub is not None:
            out.extend(_open_keys(sub, prefix=f"{prefix}{f.name}."))
        elif typing.get_origin(hint) in (dict, Mapping) or hint in (dict, Any):
            out.append(f"{prefix}{f.name}")
    return out


def check_key(schema: type, key: str, source: str) -> None:
    valid = schema_keys(schema)
    if key in valid or any(key.startswith(open_key + ".") for open_key in _open_keys(schema)):
        return
    raise ConfigError(_unknown_key_message(schema, key, source))


def _unknown_key_message(schema: type, key: str, source: str) -> str:
    valid = schema_keys(schema)
    # A section that is a prefix of the key (``data`` for ``data.foo``) is no suggestion: the user named it.
    candidates = [k for k in valid if not key.startswith(k + ".")]
    near = difflib.get_close_matches(key, candidates, n=3, cutoff=0.5)
    leaf = key.rsplit(".", 1)[-1]
    near += [k for k in valid if k.rsplit(".", 1)[-1] == leaf and k not in near][:3]
    hint = f" Did you mean: {', '.join(near)}?" if near else ""
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    siblings = [k for k in valid if k.startswith(parent + ".") and k.count(".") == key.count(".")] if parent else []
    if siblings and not near:
        hint = f" Valid keys under {parent}: {', '.join(siblings)}."
    return f"unknown config key {key!r} (from {source}).{hint}"


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for k, v in data.items():
        path = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            yield from _flatten(v, prefix=f"{path}.")
        else:
            yield path, v


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys, got {type(data).__name__}")
    return data


class ForeignKeys(Protocol):
    """Keys outside the schema that a caller still accepts (another project's names for the same settings).

    ``translate`` is asked about every key the schema does not have; it returns the schema key and value to
    set instead, ``None`` when the key is accepted but sets nothing (it records why), or raises
    :class:`ConfigError` when the key or value cannot be honoured. A key it does not know is left to the
    usual unknown-key error (``translate`` raises ``KeyError``)."""

    def translate(self, key: str, value: Any, source: str) -> tuple[str, Any] | None: ...


def _updates(sources: Iterable[tuple[str, Mapping[str, Any]]], overrides: Iterable[str]) -> list[tuple[str, Any, str]]:
    """Every (key, value, source) in the order they apply; a ``~key`` drops what came before it."""
    updates: list[tuple[str, Any, str]] = []
    for name, mapping in sources:
        updates.extend((k, v, name) for k, v in _flatten(mapping))
    for text in overrides:
        key, value = parse_override(text)
        if value is DELETE:
            updates = [u for u in updates if u[0] != key and not u[0].startswith(key + ".")]
        else:
            updates.append((key, value, "the command line"))
    return updates


def _resolve_key(
    schema: type, key: str, value: Any, source: str, foreign: ForeignKeys | None
) -> tuple[str, Any] | None:
    try:
        check_key(schema, key, source)
        return key, value
    except ConfigError:
        if foreign is None:
            raise
        try:
            translated = foreign.translate(key, value, source)
        except KeyError:
            raise ConfigError(_unknown_key_message(schema, key, source)) from None
    if translated is not None:
        check_key(schema, translated[0], source)
    return translated


def _as_list_if_expected(schema: type, key: str, value: Any) -> Any:
    """A single value where the schema takes a list (``data.train_files=a.parquet``: verl's "a path or a
    list of paths") is a list of one."""
    if value is None or isinstance(value, (list, tuple)) or _is_node_reference(value):
        return value
    hint = _hint_at(schema, key)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    return [value] if typing.get_origin(hint) is list else value


def _is_node_reference(value: Any) -> bool:
    """``${other.key}`` alone (it may name a list); ``${oc.env:...}`` and text around one are strings."""
    text = value.strip() if isinstance(value, str) else ""
    return text.startswith("${") and text.endswith("}") and text.count("${") == 1 and not text.startswith("${oc.")


def build_config(
    schema: type[T],
    sources: Iterable[tuple[str, Mapping[str, Any]]] = (),
    overrides: Iterable[str] = (),
    foreign: ForeignKeys | None = None,
) -> T:
    """Defaults of ``schema``, then each (name, mapping) source, then ``key=value`` overrides; keys the
    schema lacks go to ``foreign`` (if given) before they are refused."""
    cfg: DictConfig = OmegaConf.structured(schema)
    for key, value, source in _updates(sources, overrides):
        resolved = _resolve_key(schema, key, value, source, foreign)
        if resolved is None:
            continue
        key, value = resolved
        if key in schema_keys(schema):
            value = _as_list_if_expected(schema, key, value)
        try:
            OmegaConf.update(cfg, key, value, merge=True)
        except OmegaConfBaseException as exc:
            expected = _expected_type(schema, key)
            raise ConfigError(
                f"bad value for {key!r} (from {source}): {value!r}"
                + (f"; expected {expected}" if expected else "")
                + f" ({str(getattr(exc, 'msg', exc)).splitlines()[0]})"
            ) from None
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config: {exc}") from None
    except (ValueError, TypeError) as exc:  # __post_init__ validation, with field names relative to its node
        where = _failing_node(cfg, schema)
        raise ConfigError(f"{where}.{exc}" if where else str(exc)) from None
    if not isinstance(obj, schema):  # a structured config converts to its schema's dataclass, always
        raise ConfigError(f"invalid config: OmegaConf built a {type(obj).__name__}, not a {schema.__name__}")
    return obj


def _failing_node(cfg: DictConfig, schema: type) -> str:
    """The deepest dataclass node whose construction fails, as a dotted path ('' for the root)."""
    paths = [k for k in schema_keys(schema) if _dataclass_type(_hint_at(schema, k)) is not None]
    for path in sorted(paths, key=lambda p: -p.count(".")):
        node = OmegaConf.select(cfg, path)
        try:
            OmegaConf.to_object(node)
        except (ValueError, TypeError):
            return path
        except OmegaConfBaseException:
            continue
    return ""


def _hint_at(schema: type, key: str) -> Any:
    node: Any = schema
    hint: Any = None
    for part in key.split("."):
        hint = typing.get_type_hints(node)[part]
        node = _dataclass_type(hint)
    return hint


def _expected_type(schema: type, key: str) -> str | None:
    node: Any = schema
    for part in key.split("."):
        if not dataclasses.is_dataclass(node):
            return None
        hints = typing.get_type_hints(node)
        if part not in hints:
            return None
        node = _dataclass_type(hints[part]) or hints[part]
    if typing.get_origin(node) is typing.Literal:
        return "one of: " + ", ".join(map(str, typing.get_args(node)))
    return getattr(node, "__name__", None) or str(node).replace("typing.", "")


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def as_node(schema: type[T], value: T | Mapping[str, Any] | None, where: str) -> T:
    """A config node as the code that owns it reads it: an instance of ``schema`` (the run config's node)
    as it is, the defaults for None, and a mapping (a direct caller's) built into ``schema``, where a key
    the node does not declare is an error naming it (``where``: the node's key path, for the message)."""
    if value is None:
        return schema()
    if isinstance(value, schema):
        return value
    if isinstance(value, Mapping):
        declared = {f.name for f in dataclasses.fields(schema)}  # type: ignore[arg-type]
        unknown = sorted(set(value) - declared)
        if unknown:
            raise ConfigError(f"{where} has no key(s) {unknown}; its keys: {sorted(declared)}")
        return schema(**value)
    raise TypeError(f"{where} must be a {schema.__name__} (or a mapping of its keys), got {type(value).__name__}")
