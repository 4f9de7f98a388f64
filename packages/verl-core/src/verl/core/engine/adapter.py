"""A LoRA adapter as it travels from a training engine to a rollout engine.

A LoRA actor's base weights never change, so after the rollout engine has them once, each weight sync
only needs the adapter: a few MB instead of the whole model. The adapter travels in PEFT's own layout
(the keys of ``adapter_model.safetensors`` and the fields of ``adapter_config.json``), which every
engine that serves adapters reads (vLLM's LoRA requests, PEFT itself); core knows nothing of PEFT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class LoRAAdapter:
    #: The contents of PEFT's ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``, ...).
    config: dict[str, Any]
    #: Full (unsharded) tensors under PEFT's file keys (``base_model.model.<module>.lora_A.weight``).
    tensors: dict[str, torch.Tensor]
    #: A new, increasing number for every adapter a training engine hands out (starting at 1): a rollout
    #: engine that serves adapters by id (vLLM's ``lora_int_id``) uses it as the id.
    version: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())
