"""What a reward function may return, and how the managers turn it into a score.

A reward function has verl's signature ``fn(data_source, solution_str, ground_truth, extra_info=None)``
and returns a number (int, float, bool, numpy scalar, 0-d tensor) or a dict with a numeric ``score``
plus any extra per-sample metrics (``{"score": 1.0, "acc": True, "pred": "72"}``).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

ScoreFn = Callable[..., Any]


class RewardSetupError(RuntimeError):
    """A configuration problem (unknown data_source, bad reward function): stops the run instead of
    being counted as a per-sample failure."""


def describe_fn(fn: Any) -> str:
    """A readable name of a reward function for error messages."""
    name = getattr(fn, "verl_name", None)
    if name:
        return name
    module = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{qual}" if module else qual


def _as_number(value: Any) -> float | None:
    if isinstance(value, (bool, numbers.Real)):
        return float(value)
    item = getattr(value, "item", None)  # numpy scalars, 0-d arrays and tensors
    if callable(item) and getattr(value, "ndim", 0) == 0:
        try:
            out = item()
        except (TypeError, ValueError):
            return None
        if isinstance(out, (bool, numbers.Real)):
            return float(out)
    return None


def to_score(value: Any, fn: Any) -> tuple[float, dict[str, Any]]:
    """(score, extra metrics) from a reward function's return value; a clear error otherwise."""
    extras: dict[str, Any] = {}
    raw = value
    if isinstance(value, Mapping):
        if "score" not in value:
            raise RewardSetupError(
                f"reward function {describe_fn(fn)} returned a dict without a 'score' key: {value!r}. "
                "A dict reward must carry the numeric score under 'score' (other keys become metrics)."
            )
        extras = {k: v for k, v in value.items() if k != "score"}
        raw = value["score"]
    score = _as_number(raw)
    if score is None:
        hint = " (a function that ends without a return statement returns None)" if raw is None else ""
        raise RewardSetupError(
            f"reward function {describe_fn(fn)} returned {raw!r} (type {type(raw).__name__}){hint}; it must return a "
            "number or a dict with a numeric 'score'"
        )
    if not math.isfinite(score):
        raise RewardSetupError(
            f"reward function {describe_fn(fn)} returned {'NaN' if math.isnan(score) else score}; scores must be "
            "finite numbers"
        )
    return score, extras


def check_signature(fn: Any, params: tuple[str, ...]) -> None:
    """Fail at setup, not with every sample, when ``fn`` cannot take the keywords it will be given."""
    if not callable(fn):
        raise RewardSetupError(f"the reward function {fn!r} is not callable")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have no signature: trust them
        return
    try:
        signature.bind(**dict.fromkeys(params))
    except TypeError as e:
        raise RewardSetupError(
            f"reward function {describe_fn(fn)}{signature} cannot be called with the keywords {list(params)}: {e}"
        ) from None
