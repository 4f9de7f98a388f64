"""Loading Hugging Face models from a local folder: causal LMs (actor, reference, rollout) and value
models (a causal LM backbone with a scalar head per token, for PPO critics and reward models)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from verl.core.engine.model_types import LANGUAGE_MODEL, VALUE_MODEL

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)


def check_model_folder(path: str) -> None:
    if not path:
        raise ValueError(
            "no model path given; set the model path (e.g. actor_rollout_ref.model.path) to a local folder"
        )
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"model path {path!r} is not a local folder; verl loads models from disk only "
            "(download or convert the model first)"
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"model folder {path!r} has no config.json; is it a Hugging Face model folder?")


def load_config(
    path: str,
    model_type: str = LANGUAGE_MODEL,
    trust_remote_code: bool = False,
    overrides: dict[str, Any] | None = None,
):
    """The model's Hugging Face config, with verl's ``model.override_config`` applied (attributes of the
    config, e.g. ``{"attention_dropout": 0.0}``); an attribute the config lacks is an error."""
    from transformers import AutoConfig

    check_model_folder(path)
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    for key, value in (overrides or {}).items():
        if not hasattr(config, key):
            raise ValueError(
                f"model.override_config.{key}: the {type(config).__name__} of {path} has no attribute {key!r}"
            )
        setattr(config, key, value)
    if model_type == VALUE_MODEL:
        # One value per token; no dropout on the head (it would make values noisy targets).
        config.num_labels = 1
        config.classifier_dropout = 0.0
    return config


def model_class(model_type: str):
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    if model_type == LANGUAGE_MODEL:
        return AutoModelForCausalLM
    if model_type == VALUE_MODEL:
        return AutoModelForTokenClassification
    raise ValueError(f"unknown model_type {model_type!r}; use {LANGUAGE_MODEL!r} or {VALUE_MODEL!r}")


def load_model(
    path: str,
    model_type: str = LANGUAGE_MODEL,
    *,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
    weights: bool = True,
    config_overrides: dict[str, Any] | None = None,
) -> PreTrainedModel:
    """The model in ``path`` on the host, in ``dtype``.

    ``weights=False`` builds it from the config with random weights (a rollout engine whose weights
    arrive from the trainer). A value model loaded from a causal-LM folder gets a freshly initialised
    scalar head (seed torch first so every rank initialises it identically). ``config_overrides``: see
    :func:`load_config`.
    """
    config = load_config(path, model_type, trust_remote_code, config_overrides)
    cls = model_class(model_type)
    if not weights:
        model = cls.from_config(
            config, dtype=dtype, attn_implementation=attn_implementation, trust_remote_code=trust_remote_code
        )
    else:
        model = cls.from_pretrained(
            path,
            config=config,
            dtype=dtype,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
        )
    return model


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder block's activations in backward (non-reentrant checkpointing)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated decoder blocks: what FSDP shards one unit at a time.

    Uses the model's ``_no_split_modules`` (class names transformers declares for exactly this), else
    the largest ``nn.ModuleList``.
    """
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if blocks:
        return blocks
    lists: list[nn.ModuleList] = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError(f"cannot find the transformer blocks of {type(model).__name__} to shard")
    sizes = [len(blocks) for blocks in lists]
    return list(lists[sizes.index(max(sizes))])


def tied_embeddings(model: nn.Module) -> bool:
    get_out, get_in = getattr(model, "get_output_embeddings", None), getattr(model, "get_input_embeddings", None)
    out = get_out() if callable(get_out) else None
    inp = get_in() if callable(get_in) else None
    return out is not None and inp is not None and out.weight is inp.weight


def named_weights(model: nn.Module):
    """(name, tensor) of the parameters (tied ones once) and persistent buffers: what a state dict
    holds, with Hugging Face names."""
    yield from model.named_parameters()
    for module_name, module in model.named_modules():
        for buffer_name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer_name not in module._non_persistent_buffers_set:
                yield (f"{module_name}.{buffer_name}" if module_name else buffer_name), buffer
