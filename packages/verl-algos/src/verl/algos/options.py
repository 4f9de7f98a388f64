"""Reading options from whatever config object the caller has.

The algorithm functions are called by trainers with typed dataclasses, by tests with plain dicts, and
by users with OmegaConf nodes. ``option(config, "policy_loss.clip_cov_ratio", 0.0002)`` reads a dotted
path from any of them and falls back to the default when a level is missing or the value is None
(verl's configs use None for "use the default").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MISSING = object()


def _child(node: Any, name: str) -> Any:
    if node is None:
        return _MISSING
    if isinstance(node, Mapping):
        return node.get(name, _MISSING)
    try:  # OmegaConf DictConfig is not a Mapping subclass but supports .get
        getter = node.get
    except AttributeError:
        return getattr(node, name, _MISSING)
    try:
        return getter(name, _MISSING)
    except TypeError:  # a .get with another signature: treat as an attribute container
        return getattr(node, name, _MISSING)


def option(config: Any, path: str, default: Any = None) -> Any:
    """``config.<path>`` (dotted), or ``default`` when any level is missing or the value is None."""
    node = config
    for name in path.split("."):
        node = _child(node, name)
        if node is _MISSING or node is None:
            return default
    return node
