"""Classes named in the agent loops' config files (tools, interactions, loops): a registered short name, or
an import path to a user's class, as verl names them. One lookup, so that every file reports a missing or
wrong class the same way."""

from __future__ import annotations

import importlib
from typing import Any, TypeVar

from verl.core.registry import Registry, RegistryError

T = TypeVar("T")


def import_class(path: str, base: type[T], where: str, key: str, missing: str = "is not importable") -> type[T]:
    """The class at import path ``path``; a subclass of ``base`` or a ``ValueError`` naming ``where`` and ``key``."""
    module_name, _, attribute = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{where}: {key} {path!r} {missing} ({e})") from None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{where}: {path} is not a subclass of {base.__module__}.{base.__qualname__}")
    return cls


def registered_or_imported_class(registry: Registry[Any], class_name: str, base: type[T], where: str) -> type[T]:
    """``class_name`` from ``registry`` (its ``class_name`` key), else imported when it is a dotted path."""
    try:
        return registry.get(class_name=class_name)
    except RegistryError as not_registered:
        if "." not in class_name:
            raise ValueError(f"{where}: {not_registered}") from None
    return import_class(class_name, base, where, "class_name", missing="is neither registered nor importable")
