"""verl's config keys that our schema does not hold under the same path: accepted, translated or refused
by the rules in ``rules.py``, for every key of verl's own trainer configs (``upstream_*.yaml``)."""

from __future__ import annotations

import fnmatch
import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from verl.algos.config.verl_compat.rules import (
    EXTRA_UPSTREAM_KEYS,
    RULES,
    SFT_RULES,
    Alias,
    Internal,
    NoEffect,
    NotYet,
    Rule,
)
from verl.core.config import ConfigError

logger = logging.getLogger("verl.config")
HERE = Path(__file__).parent


@functools.cache
def upstream_defaults(kind: str) -> dict[str, Any]:
    """Every key of verl's ``kind`` ("ppo" or "sft") trainer config, flattened, with verl's default."""
    keys = yaml.safe_load((HERE / f"upstream_{kind}.yaml").read_text())
    return {**keys, **EXTRA_UPSTREAM_KEYS} if kind == "ppo" else keys


def rule_for(key: str, rules: list[tuple[str, Rule]]) -> Rule | None:
    return next((rule for pattern, rule in rules if fnmatch.fnmatchcase(key, pattern)), None)


def _upstream_key(key: str, defaults: dict[str, Any]) -> str | None:
    """``key`` itself, or the verl key of a free-form mapping it lies under (``engine_kwargs.vllm.x``)."""
    if key in defaults:
        return key
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if defaults.get(prefix, None) == {}:
            return prefix
    return None


def _leaves_feature_off(value: Any, verl_default: Any, rule: NotYet) -> bool:
    if value == verl_default or value in (None, False, 0, "", "disabled", "none", "null", *rule.off):
        return True
    return isinstance(value, (list, dict)) and not value


@dataclass
class VerlKeys:
    """The :class:`verl.core.config.ForeignKeys` of one config load; remembers what it accepted."""

    kind: str = "ppo"
    #: (key, value, why) of every accepted key that sets nothing here
    no_effect: list[tuple[str, Any, str]] = field(default_factory=list)

    def translate(self, key: str, value: Any, source: str) -> tuple[str, Any] | None:
        defaults = upstream_defaults(self.kind)
        upstream = _upstream_key(key, defaults)
        if upstream is None:
            raise KeyError(key)
        rule = rule_for(upstream, RULES if self.kind == "ppo" else SFT_RULES)
        if rule is None:
            raise KeyError(key)  # a verl key with no rule: the test of the rules keeps this from happening
        if isinstance(rule, Alias):
            mapped = rule.values.get(value, value) if isinstance(value, (str, bool)) else value
            return rule.target, mapped
        if isinstance(rule, NotYet) and not _leaves_feature_off(value, defaults[upstream], rule):
            raise ConfigError(
                f"{key}={value!r} (from {source}) asks for {rule.feature}, which verl has but this project "
                f"does not support yet; {rule.instead}"
            )
        why = "verl's internal plumbing" if isinstance(rule, Internal) else getattr(rule, "why", "feature off")
        if isinstance(rule, NotYet):
            why = f"{rule.feature} is off"
        self.no_effect.append((key, value, why))
        return None

    def report(self) -> list[str]:
        """One line per accepted key that has no effect here (the last value given for each)."""
        last = {key: (value, why) for key, value, why in self.no_effect}
        return [f"{key}={value!r}: no effect here ({why})" for key, (value, why) in last.items()]

    def log(self) -> None:
        lines = self.report()
        if lines:
            logger.warning("verl keys accepted with no effect here:\n  %s", "\n  ".join(lines))


__all__ = ["Alias", "Internal", "NoEffect", "NotYet", "VerlKeys", "rule_for", "upstream_defaults"]
