"""Names in PEFT's LoRA layout, shared by the training engine that trains an adapter and the rollout engines
that serve one.

Three namings meet here:

- Hugging Face weight names: ``model.layers.0.mlp.up_proj.weight`` (what weight sync carries);
- a model with PEFT's LoRA layers (wrapped in a ``PeftModel``, or injected in place): the base weight
  moves to ``...up_proj.base_layer.weight``, the adapter is ``...up_proj.lora_A.<adapter>.weight``,
  under ``base_model.model.`` when wrapped;
- PEFT's adapter file (``adapter_model.safetensors``): ``base_model.model.<module>.lora_A.weight``, no
  adapter name. That is the layout of :class:`verl.core.engine.LoRAAdapter` and of a PEFT folder.
"""

from __future__ import annotations

import json
import os

import torch

PEFT_ROOT = "base_model.model."
ADAPTER_NAME = "default"
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


def is_adapter_weight(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def hf_name(peft_name: str) -> str:
    """``base_model.model.model.layers.0.mlp.up_proj.base_layer.weight`` -> ``model.layers.0.mlp.up_proj.weight``."""
    return peft_name.removeprefix(PEFT_ROOT).replace(".base_layer.", ".")


def injected_param_name(file_key: str, adapter_name: str = ADAPTER_NAME) -> str:
    """A PEFT file key as the parameter of a model with the adapter injected in place (no ``PeftModel``):
    ``base_model.model.model.layers.0.q_proj.lora_A.weight`` -> ``model.layers.0.q_proj.lora_A.default.weight``."""
    name = file_key.removeprefix(PEFT_ROOT)
    for part in (".lora_A.", ".lora_B."):
        if part in name:
            head, tail = name.split(part, 1)
            return f"{head}{part}{adapter_name}.{tail}"
    raise ValueError(f"{file_key!r} is not a LoRA weight (lora_A / lora_B) in PEFT's file layout")


def write_adapter_files(path: str, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    """A PEFT adapter folder at ``path`` (created; files replaced), from an adapter's config and tensors."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, os.path.join(path, ADAPTER_WEIGHTS_FILE))
    with open(os.path.join(path, ADAPTER_CONFIG_FILE), "w") as f:
        json.dump(config, f, indent=2, default=str)
