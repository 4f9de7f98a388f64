"""Configuration of the FSDP2 training engine.

Field names follow verl's keys so the trainer can map ``actor_rollout_ref.actor.*`` (and ``critic.*``)
onto them one to one: ``optim.lr``, ``optim.lr_warmup_steps_ratio``, ``optim.lr_scheduler_type``,
``ppo_micro_batch_size_per_gpu``, ``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu``,
``fsdp_config.param_offload``, ``model.enable_gradient_checkpointing``, ``model.use_remove_padding``...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from verl.engines.dtypes import parse_dtype

LR_SCHEDULES = ("constant", "cosine")


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule (verl: ``actor_rollout_ref.actor.optim``)."""

    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    #: Gradient clipping (max global L2 norm); <= 0 disables clipping but the norm is still reported.
    clip_grad: float = 1.0
    #: Warmup length in optimizer steps; negative: use ``lr_warmup_steps_ratio * total_training_steps``.
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    #: Needed by the cosine schedule and by the warmup ratio; the trainer sets it.
    total_training_steps: int = -1
    #: "constant" (after warmup) or "cosine" (decays to ``min_lr_ratio * lr`` at ``total_training_steps``).
    lr_scheduler_type: str = "constant"
    min_lr_ratio: float = 0.0
    #: Cosine half-periods over the decay: 0.5 is one half cosine, from lr down to the minimum.
    num_cycles: float = 0.5

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # command-line overrides arrive as lists
        if self.lr_scheduler_type not in LR_SCHEDULES:
            raise ValueError(
                f"optim.lr_scheduler_type={self.lr_scheduler_type!r} is unknown; use one of {list(LR_SCHEDULES)}"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not 0.0 <= self.lr_warmup_steps_ratio <= 1.0:
            raise ValueError(f"optim.lr_warmup_steps_ratio must be in [0, 1], got {self.lr_warmup_steps_ratio}")

    def warmup_steps(self) -> int:
        if self.lr_warmup_steps >= 0:
            return self.lr_warmup_steps
        if self.lr_warmup_steps_ratio > 0:
            if self.total_training_steps <= 0:
                raise ValueError(
                    "optim.lr_warmup_steps_ratio needs optim.total_training_steps (> 0); "
                    "set it, or give optim.lr_warmup_steps directly"
                )
            return int(self.lr_warmup_steps_ratio * self.total_training_steps)
        return 0


@dataclass
class FSDPConfig:
    """Sharding, precision and offload (verl: ``actor_rollout_ref.actor.fsdp_config``)."""

    #: Keep sharded parameters in host memory between phases (moved to the device inside train/eval mode).
    param_offload: bool = False
    #: Keep optimizer state in host memory outside train mode.
    optimizer_offload: bool = False
    #: Free the gathered parameters of each block after its forward (re-gathered for backward).
    reshard_after_forward: bool = True
    #: dtype of the sharded master parameters and the optimizer state.
    model_dtype: str = "fp32"
    #: dtype the blocks compute in. "auto": fp32 on CPU, bf16 on accelerators that support it.
    param_dtype: str = "auto"
    #: dtype gradients are reduced in across ranks.
    reduce_dtype: str = "fp32"
    #: Ranks one copy of the model is sharded over (verl's key); the ranks are split into world/fsdp_size
    #: replicas (HSDP: shard within a replica, all-reduce gradients across replicas). -1: shard over all.
    fsdp_size: int = -1

    def resolved_param_dtype(self, device_name: str, bf16_supported: bool) -> torch.dtype:
        if self.param_dtype == "auto":
            return torch.bfloat16 if device_name != "cpu" and bf16_supported else torch.float32
        return parse_dtype(self.param_dtype, "fsdp_config.param_dtype")


@dataclass
class FSDPEngineConfig:
    """Everything :class:`~verl.engines.fsdp.FSDPEngine` needs."""

    #: Local folder of a Hugging Face model (config.json + safetensors). Nothing is downloaded.
    model_path: str = ""
    #: Folder with the tokenizer to copy on export (default: ``model_path``).
    tokenizer_path: str | None = None
    trust_remote_code: bool = False
    #: "sdpa" works everywhere (packing by position ids, block-diagonal mask); "flash_attention_2" on GPUs.
    attn_implementation: str = "sdpa"
    enable_gradient_checkpointing: bool = False
    #: Pack variable-length sequences without pad tokens ("remove padding").
    use_remove_padding: bool = True
    #: With packing and sdpa: compute a prompt shared by several responses (GRPO's n samples) once per
    #: micro-batch instead of once per response. Exact (same attention); fewer tokens through the model.
    share_prompts: bool = True
    #: Attributes set on the model's Hugging Face config before it is built (verl's model.override_config).
    override_config: dict[str, Any] = field(default_factory=dict)

    #: Fixed micro-batch size (sequences) when ``use_dynamic_bsz`` is off.
    ppo_micro_batch_size_per_gpu: int = 4
    #: Micro-batches by a token budget instead of a sequence count.
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    #: Forward-only (log-prob / value) micro-batching; None: the training values above.
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool | None = None
    log_prob_max_token_len_per_gpu: int | None = None
    #: Tokens per chunk when turning logits into log-probs/entropy (bounds the float [tokens, vocab] temporaries).
    logprob_chunk_size: int = 1024

    seed: int = 42
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)

    def __post_init__(self) -> None:
        if isinstance(self.optim, dict):
            self.optim = OptimConfig(**self.optim)
        if isinstance(self.fsdp_config, dict):
            self.fsdp_config = FSDPConfig(**self.fsdp_config)
        if self.ppo_micro_batch_size_per_gpu < 1:
            raise ValueError(f"ppo_micro_batch_size_per_gpu must be >= 1, got {self.ppo_micro_batch_size_per_gpu}")
        if self.ppo_max_token_len_per_gpu < 1:
            raise ValueError(f"ppo_max_token_len_per_gpu must be >= 1, got {self.ppo_max_token_len_per_gpu}")
        if self.logprob_chunk_size < 1:
            raise ValueError(f"logprob_chunk_size must be >= 1, got {self.logprob_chunk_size}")
        parse_dtype(self.fsdp_config.model_dtype, "fsdp_config.model_dtype")
        parse_dtype(self.fsdp_config.reduce_dtype, "fsdp_config.reduce_dtype")
        if self.fsdp_config.param_dtype != "auto":
            parse_dtype(self.fsdp_config.param_dtype, "fsdp_config.param_dtype")

    @property
    def shares_prompts(self) -> bool:
        """Prompt sharing needs the packed layout and our varlen sdpa (flash/eager kernels would treat
        each response as a sequence of its own)."""
        return self.share_prompts and self.use_remove_padding and self.attn_implementation == "sdpa"

    def micro_batching(self, forward_only: bool) -> tuple[int, int, bool]:
        """(micro-batch size in sequences, token budget, whether the budget rules) for a training or a
        forward-only pass."""
        if forward_only:
            dynamic = self.log_prob_use_dynamic_bsz
            return (
                self.log_prob_micro_batch_size_per_gpu or self.ppo_micro_batch_size_per_gpu,
                self.log_prob_max_token_len_per_gpu or self.ppo_max_token_len_per_gpu,
                self.use_dynamic_bsz if dynamic is None else dynamic,
            )
        return self.ppo_micro_batch_size_per_gpu, self.ppo_max_token_len_per_gpu, self.use_dynamic_bsz
