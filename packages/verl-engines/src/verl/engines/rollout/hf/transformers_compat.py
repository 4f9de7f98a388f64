"""What differs between the transformers releases we support (``transformers>=4.51``), in one place.

- The forward's cache argument: ``cache`` from 5.2x on (``past_key_values`` is then deprecated), before
  that ``past_key_values``.
- The static (preallocated) KV cache the fast decode path builds on: ``StaticCache(config=...,
  max_cache_len=...)`` whose layers allocate lazily and keep their write position themselves
  (``cumulative_length``), so a step needs no ``cache_position``. Older releases lack it; the engine then
  decodes with the plain (dynamic cache) loop and says so once.
"""

from __future__ import annotations

import functools
import inspect

import torch

_FORWARD_PARAMETERS: dict[type, frozenset[str]] = {}


def _forward_parameters(model_type: type[torch.nn.Module]) -> frozenset[str]:
    if model_type not in _FORWARD_PARAMETERS:
        _FORWARD_PARAMETERS[model_type] = frozenset(inspect.signature(model_type.forward).parameters)
    return _FORWARD_PARAMETERS[model_type]


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name under which ``model.forward`` takes its KV cache."""
    return "cache" if "cache" in _forward_parameters(type(model)) else "past_key_values"


def output_cache(output):
    """The KV cache a forward returned (``cache`` from 5.2x on, ``past_key_values`` before)."""
    return output.cache if "cache" in output else output.past_key_values


@functools.cache
def static_cache_unsupported_reason() -> str | None:
    """None when this transformers has the self-positioning StaticCache, else why not."""
    import transformers

    try:
        from transformers.cache_utils import StaticLayer
    except ImportError:
        return f"transformers {transformers.__version__} has no StaticLayer"
    if not hasattr(StaticLayer(max_cache_len=1), "cumulative_length"):
        return f"transformers {transformers.__version__}'s StaticLayer needs cache_position"
    return None


def new_static_cache(config, max_cache_len: int):
    from transformers import StaticCache

    return StaticCache(config=config, max_cache_len=max_cache_len)
