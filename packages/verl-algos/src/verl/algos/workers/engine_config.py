"""Building an engine's config from the run config.

Engines name their config fields after verl's keys (``optim.lr``, ``fsdp_config.param_offload``,
``ppo_micro_batch_size_per_gpu``, ...). A worker gathers the role's values under those names and keeps the
ones the engine's ``config_class`` declares: the same worker code drives any backend, and a backend that
lacks a knob simply does not receive it.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def _as_dict(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _as_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def fit_to(config_class: type, values: dict[str, Any]) -> Any:
    """``config_class(**values)`` restricted (recursively, for dataclass fields) to its own fields."""
    if not dataclasses.is_dataclass(config_class):
        return values
    kwargs: dict[str, Any] = {}
    hints = {f.name: f for f in dataclasses.fields(config_class)}
    for name, field in hints.items():
        if name not in values:
            continue
        value = _as_dict(values[name])
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if isinstance(value, dict) and dataclasses.is_dataclass(default):
            value = fit_to(type(default), value)
        kwargs[name] = value
    return config_class(**kwargs)


def training_engine_values(
    *,
    model_path: str,
    model: Any,
    optim: Any,
    fsdp_config: Any,
    micro_batch_size: int,
    use_dynamic_bsz: bool,
    max_token_len: int,
    grad_clip: float,
    seed: int,
    forward_micro_batch_size: int | None = None,
    forward_use_dynamic_bsz: bool | None = None,
    forward_max_token_len: int | None = None,
) -> dict[str, Any]:
    """The verl-named values every training engine may read, for one role."""
    optim_values = _as_dict(optim)
    optim_values["clip_grad"] = grad_clip
    return {
        "model_path": model_path,
        "tokenizer_path": model.tokenizer_path or model_path,
        "trust_remote_code": model.trust_remote_code,
        "enable_gradient_checkpointing": model.enable_gradient_checkpointing,
        "use_remove_padding": model.use_remove_padding,
        "share_prompts": model.share_prompts,
        "override_config": dict(model.override_config),
        "ppo_micro_batch_size_per_gpu": micro_batch_size,
        "use_dynamic_bsz": use_dynamic_bsz,
        "ppo_max_token_len_per_gpu": max_token_len,
        "log_prob_micro_batch_size_per_gpu": forward_micro_batch_size,
        "log_prob_use_dynamic_bsz": forward_use_dynamic_bsz,
        "log_prob_max_token_len_per_gpu": forward_max_token_len,
        "seed": seed,
        "optim": optim_values,
        "fsdp_config": _as_dict(fsdp_config),
    }
