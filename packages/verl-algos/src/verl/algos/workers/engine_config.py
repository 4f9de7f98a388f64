"""Building a training engine's config from the run config.

Engines name their config fields after verl's keys (``optim``, ``fsdp_config``, ``megatron``,
``ppo_micro_batch_size_per_gpu``, ...), and the run config's ``optim``, ``fsdp_config`` and ``megatron``
nodes *are* the engine's classes (:class:`~verl.engines.optim_config.OptimConfig`,
:class:`~verl.engines.fsdp.config.FSDPConfig`, :class:`~verl.engines.megatron.config.MegatronConfig`): a
worker hands the role's objects over as they are. The workers offer every engine the same role settings
(:func:`training_engine_values`); the engine the strategy selects takes what its ``config_class`` declares
(:func:`training_engine_config`), and a setting it does not take that the user changed is named in a
warning, never dropped silently. :func:`engine_config` itself is strict: a key the class does not declare
is an error that names it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import Any

from verl.algos.config.schema import ModelConfig
from verl.engines.fsdp.config import FSDPConfig
from verl.engines.fsdp.lora import LoRAConfig
from verl.engines.optim_config import OptimConfig

logger = logging.getLogger(__name__)


def engine_config(config_class: type, values: dict[str, Any]) -> Any:
    """``config_class(**values)``; a key it does not declare is an error naming the key and the class."""
    if not dataclasses.is_dataclass(config_class):
        raise TypeError(f"an engine's config_class must be a dataclass, got {config_class!r}")
    declared = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(values) - declared)
    if unknown:
        raise ValueError(
            f"{config_class.__module__}.{config_class.__name__} takes no {', '.join(unknown)}: this engine "
            "cannot honour these settings; choose an engine that has them or leave them at their defaults"
        )
    return config_class(**values)


#: What every training engine must take from the workers: the model, the optimizer and the training
#: micro-batch (an engine without them cannot run a role at all; ``verl train`` refuses it before Ray starts).
REQUIRED_FIELDS = ("model_path", "optim", "ppo_micro_batch_size_per_gpu")


@dataclass(frozen=True)
class Setting:
    """A value the workers pass that a user set: its run-config key and that key's default, so that an
    engine which does not take it can name it instead of dropping it silently."""

    value: Any
    key: str
    default: Any


def role_setting(config: Any, key: str) -> Setting:
    """``key`` (a dotted path of the run config ``config``) with its value and its schema default."""
    return Setting(_get(config, key), key, _get(_defaults(type(config)), key))


@functools.cache
def _defaults(config_class: type) -> Any:
    return config_class()


def _get(node: Any, key: str) -> Any:
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _changed(setting: Setting) -> list[tuple[str, Any]]:
    """(key, value) of what differs from the default: the node's fields for a typed node."""
    value, default = setting.value, setting.default
    if dataclasses.is_dataclass(value) and type(value) is type(default):
        return [
            item
            for f in dataclasses.fields(value)
            for item in _changed(Setting(getattr(value, f.name), f"{setting.key}.{f.name}", getattr(default, f.name)))
        ]
    return [] if value == default else [(setting.key, value)]


def missing_required(config_class: type) -> list[str]:
    """The fields of :data:`REQUIRED_FIELDS` that ``config_class`` does not declare."""
    declared = {f.name for f in dataclasses.fields(config_class)}
    return [name for name in REQUIRED_FIELDS if name not in declared]


def training_engine_config(config_class: type, values: dict[str, Any], engine: str) -> Any:
    """The training engine's config from the workers' ``values`` (plain values or :class:`Setting`\\ s).

    The engine takes the keys its ``config_class`` declares (strictly: :func:`engine_config`). A role
    setting it does not declare is another engine's knob (``fsdp_config`` for megatron, ``megatron`` for
    FSDP, token-budget micro-batching for an engine with fixed micro-batches): when the user changed it
    from its default it is named in a warning, never dropped silently. Plain values the engine does not
    declare (paths, the run's seed) are not the user's role settings and are left out quietly."""
    missing = missing_required(config_class)
    if missing:
        raise ValueError(
            f"the {engine} engine ({config_class.__module__}.{config_class.__name__}) takes no "
            f"{', '.join(missing)}: the PPO workers cannot drive it"
        )
    declared = {f.name for f in dataclasses.fields(config_class)}
    unread = [
        item
        for name, value in values.items()
        if name not in declared and isinstance(value, Setting)
        for item in _changed(value)
    ]
    if unread:
        logger.warning(
            "%s: the %s training engine does not take these (another engine's settings, or a feature it lacks); "
            "they have no effect",
            ", ".join(f"{key}={value!r}" for key, value in unread),
            engine,
        )
    plain = {name: value.value if isinstance(value, Setting) else value for name, value in values.items()}
    return engine_config(config_class, {name: value for name, value in plain.items() if name in declared})


def training_engine_values(
    *,
    model_path: str,
    model: ModelConfig,
    optim: OptimConfig | Setting,
    micro_batch_size: int | Setting,
    seed: int,
    fsdp_config: FSDPConfig | Setting | None = None,
    megatron: Any = None,
    use_dynamic_bsz: bool | Setting = False,
    max_token_len: int | Setting | None = None,
    forward_micro_batch_size: int | Setting | None = None,
    forward_use_dynamic_bsz: bool | Setting | None = None,
    forward_max_token_len: int | Setting | None = None,
    sequence_parallel: int | Setting | None = None,
    model_key: str | None = None,
) -> dict[str, Any]:
    """The verl-named values of one role that a training engine may take (the typed nodes as they are;
    values given as :class:`Setting` are named in a warning by an engine that does not take them).
    ``model_key``: where ``model`` sits in the run config (its fields become settings); ``fsdp_config`` /
    ``megatron``: the role's sections of those engines (None: the role has none)."""
    defaults = type(model)()

    def of_model(name: str) -> Any:
        value = getattr(model, name)
        return Setting(value, f"{model_key}.{name}", getattr(defaults, name)) if model_key else value

    def token_budget(flag: Any) -> Any:
        # Token-budget micro-batching on is what an engine with fixed micro-batches cannot honour (even
        # at the schema's default, True); off (False, or None: the training value) is what every engine runs.
        if isinstance(flag, Setting):
            return Setting(flag.value, flag.key, flag.value if not flag.value else False)
        return flag

    values = {
        "model_path": model_path,
        "tokenizer_path": model.tokenizer_path or model_path,
        "trust_remote_code": of_model("trust_remote_code"),
        "enable_gradient_checkpointing": of_model("enable_gradient_checkpointing"),
        "use_remove_padding": of_model("use_remove_padding"),
        "share_prompts": of_model("share_prompts"),
        "override_config": dict(model.override_config),
        "ppo_micro_batch_size_per_gpu": micro_batch_size,
        "use_dynamic_bsz": token_budget(use_dynamic_bsz),
        "ppo_max_token_len_per_gpu": max_token_len,
        "log_prob_micro_batch_size_per_gpu": forward_micro_batch_size,
        "log_prob_use_dynamic_bsz": token_budget(forward_use_dynamic_bsz),
        "log_prob_max_token_len_per_gpu": forward_max_token_len,
        "ulysses_sequence_parallel_size": sequence_parallel,
        "seed": seed,
        "optim": optim,
        "fsdp_config": fsdp_config,
        "megatron": megatron,
        "lora": lora_setting(model, model_key),
    }
    # A value left None was not given (the role has no such setting): the engine's default applies.
    return {name: value for name, value in values.items() if value is not None}


def lora_setting(model: ModelConfig, model_key: str | None) -> LoRAConfig | Setting:
    """The model node's LoRA keys as the engine's :class:`LoRAConfig`; as a setting named after the model
    node, so that an engine without LoRA names ``<model_key>.lora_rank`` (verl's key) when it is set."""
    lora = LoRAConfig(**{f.name: getattr(model, f.name) for f in dataclasses.fields(LoRAConfig)})
    return Setting(lora, model_key, LoRAConfig()) if model_key else lora


def megatron_layout_of(actor: Any, role: Any, role_key: str) -> Any:
    """``role``'s megatron section with the actor's parallel layout. The roles of a run share processes
    (the actor, the reference and the critic are colocated) and a process runs one megatron layout, so
    the reference and the critic follow ``actor_rollout_ref.actor.megatron``'s; a role that asks for a
    different one (a value neither its default nor the actor's) is an error."""
    default = type(role)()
    layout = {name: getattr(actor, name) for name in MEGATRON_LAYOUT}
    differs = [
        f"{role_key}.{name}={getattr(role, name)!r}"
        for name in MEGATRON_LAYOUT
        if getattr(role, name) not in (getattr(default, name), layout[name])
    ]
    if differs:
        raise ValueError(
            f"{', '.join(differs)}: the roles share processes and a process runs one megatron layout, "
            "actor_rollout_ref.actor.megatron's "
            f"({', '.join(f'{name}={value!r}' for name, value in layout.items())}); leave these unset"
        )
    return dataclasses.replace(role, **layout)


def engine_takes(config_class: type, name: str) -> bool:
    return name in {f.name for f in dataclasses.fields(config_class)}


ACTOR_MEGATRON = "actor_rollout_ref.actor.megatron"


def megatron_setting(config: Any, role_key: str) -> Setting:
    """A role's megatron section (``role_key``) as the megatron engine runs it: with the actor's parallel
    layout (:func:`megatron_layout_of`); its default likewise, so only what the user changed is named."""
    setting = role_setting(config, role_key)
    if role_key == ACTOR_MEGATRON:
        return setting
    actor = _get(config, ACTOR_MEGATRON)
    return Setting(
        megatron_layout_of(actor, setting.value, role_key),
        role_key,
        megatron_layout_of(actor, setting.default, role_key),
    )


#: The fields of a megatron section that lay out the process groups (one layout per process).
MEGATRON_LAYOUT = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
)


def rollout_engine_values(config_class: type, values: dict[str, Any], section: Any, engine: str) -> Any:
    """A rollout engine's config from the rollout section. verl keeps every serving engine's knobs in that
    one section (vLLM's scheduler, memory and graph settings sit beside the sampling settings), so an
    engine takes the keys its ``config_class`` declares. A key it does not declare that the user changed
    from its default (``section``: the run's rollout node) is named in a warning, never dropped silently:
    it is another engine's knob, and a verl script moved to this engine may still carry it."""
    declared = {f.name for f in dataclasses.fields(config_class)}
    defaults = type(section)()
    unread = sorted(
        key
        for key in set(values) - declared
        if hasattr(section, key) and getattr(section, key) != getattr(defaults, key)
    )
    if unread:
        settings = ", ".join(f"actor_rollout_ref.rollout.{key}={getattr(section, key)!r}" for key in unread)
        logger.warning(
            "%s: the %s rollout engine does not read these (another engine's settings); they have no effect",
            settings,
            engine,
        )
    return config_class(**{k: v for k, v in values.items() if k in declared})
