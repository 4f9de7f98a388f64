"""A LoRA adapter served in place by the hf rollout: PEFT's LoRA layers injected into the rollout's own
model, computing ``W x + scale * B A x`` without merging (what the LoRA actor computes in training, so
the rollout's log-probs match the trainer's recomputation as closely as with full fine-tuning).

The base weights stay where they are (sent once by the hybrid engine; with ``share_weight_storage`` in a
one-rank hybrid engine on CPU they are the actor's own frozen tensors), and each sync copies the adapter's
few tensors into the injected layers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from verl.core.engine import LoRAAdapter
from verl.engines.lora_layout import ADAPTER_NAME, injected_param_name

#: The adapter settings that fix the injected layers' shapes and scale: a new adapter must keep them.
_STRUCTURE_KEYS = ("r", "lora_alpha", "target_modules", "exclude_modules", "use_rslora", "use_dora", "fan_in_fan_out")


def structure(config: dict[str, Any]) -> dict[str, Any]:
    return {key: config.get(key) for key in _STRUCTURE_KEYS}


def inject_lora_layers(model: nn.Module, config: dict[str, Any]) -> None:
    """Wrap ``model``'s target layers with PEFT's LoRA layers (in place, no ``PeftModel`` around it)."""
    import peft

    if config.get("use_dora") or config.get("fan_in_fan_out"):
        raise ValueError("the hf rollout serves plain LoRA adapters only (no DoRA, no fan_in_fan_out)")
    values = {k: v for k, v in config.items() if k not in ("peft_type", "task_type", "auto_mapping")}
    peft_config = peft.LoraConfig(**{**values, "lora_dropout": 0.0, "inference_mode": True})
    peft.inject_adapter_in_model(peft_config, model, adapter_name=ADAPTER_NAME)
    model.requires_grad_(False).eval()


def load_adapter_tensors(model: nn.Module, adapter: LoRAAdapter) -> None:
    """Copy the adapter's tensors into the injected layers; every injected LoRA weight must be given."""
    params = {name: p for name, p in model.named_parameters() if ".lora_A." in name or ".lora_B." in name}
    given = set()
    with torch.no_grad():
        for key, tensor in adapter.tensors.items():
            name = injected_param_name(key)
            target = params.get(name)
            if target is None:
                raise KeyError(f"update_adapter: {key!r} names no LoRA layer of the rollout model")
            if target.shape != tensor.shape:
                raise ValueError(
                    f"update_adapter: {key!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
                )
            target.copy_(tensor)
            given.add(name)
    missing = sorted(set(params) - given)
    if missing:
        raise ValueError(f"update_adapter: the adapter lacks {len(missing)} LoRA weights, e.g. {missing[:3]}")
