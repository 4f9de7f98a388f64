"""Configuration of the VeOmni training engine.

``VeOmniEngineConfig`` takes the FSDP engine's keys under verl's names (the role's ``fsdp_config``,
``ulysses_sequence_parallel_size``, micro-batching, ``optim``), so a role switches engines with
``strategy=veomni`` alone; what VeOmni adds is :attr:`VeOmniEngineConfig.expert_parallel_size`.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.engines.fsdp.config import FSDPEngineConfig


@dataclass
class VeOmniEngineConfig(FSDPEngineConfig):
    """Everything :class:`~verl.engines.veomni.VeOmniEngine` needs: the FSDP engine's settings plus
    VeOmni's expert parallelism."""

    #: Ranks the experts of an MoE model are spread over (VeOmni's ``ep`` mesh). 1: off. Needs an
    #: accelerator: VeOmni's token dispatch and fused MoE kernels have no CPU path.
    expert_parallel_size: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.expert_parallel_size < 1:
            raise ValueError(f"expert_parallel_size={self.expert_parallel_size} must be >= 1 (1: off)")
        if self.lora.enabled:
            raise ValueError(
                "the veomni engine does not train LoRA adapters (model.lora_rank > 0): use strategy=fsdp2 for LoRA"
            )
