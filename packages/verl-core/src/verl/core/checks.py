"""Value checks for config dataclasses (their ``__post_init__``): each raises ``ValueError`` naming the
field relative to its node, which ``build_config`` prefixes with the node's full key path."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any


def check_choice(key: str, value: Any, choices: list[Any] | tuple[Any, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")


def check_literals(node: Any) -> None:
    """Every ``Literal[...]`` field of the dataclass instance ``node`` holds one of its choices (OmegaConf
    checks them when a key is set; this covers objects built directly)."""
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        choices = _literal_choices(hints[f.name])
        value = getattr(node, f.name)
        if choices is not None and not (value is None and None in choices):
            check_choice(f.name, value, tuple(c for c in choices if c is not None))


def _literal_choices(hint: Any) -> tuple[Any, ...] | None:
    """The choices of ``Literal[...]`` or ``Literal[...] | None`` (None among them), else None."""
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    args = typing.get_args(hint)
    literals = [a for a in args if typing.get_origin(a) is typing.Literal]
    if len(literals) == 1 and type(None) in args and len(args) == 2:
        return (*typing.get_args(literals[0]), None)
    return None


def check_positive(key: str, value: float, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        hint = "" if math.isfinite(value) else " and finite (a NaN or inf cannot train)"
        raise ValueError(f"{key}={value!r} must be {'>= 0' if allow_zero else '> 0'}{hint}")


def check_positive_fields(config: object, *names: str, allow_zero: bool = False) -> None:
    """:func:`check_positive` on each named field of ``config`` that is set (a None is "not given")."""
    for name in names:
        value = getattr(config, name)
        if value is not None:
            check_positive(name, value, allow_zero)


def check_finite(key: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{key}={value!r} must be a finite number")


def check_range(key: str, value: float, low: float, high: float, low_open: bool = False) -> None:
    """``low <= value <= high`` (``low < value`` with ``low_open``)."""
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        raise ValueError(f"{key}={value!r} must be in {'(' if low_open else '['}{low}, {high}]")
