"""Configuration of the FSDP2 training engine.

``FSDPConfig`` (and the shared ``OptimConfig``) are the run config's ``fsdp_config`` (and ``optim``) nodes
themselves; ``FSDPEngineConfig`` gathers them with the role's model and micro-batching settings, under
verl's key names (``ppo_micro_batch_size_per_gpu``, ``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from verl.core.checks import check_literals
from verl.engines.dtypes import parse_dtype
from verl.engines.fsdp.lora import LoRAConfig
from verl.engines.fsdp.ulysses import check_supported
from verl.engines.optim_config import OptimConfig

Dtype = Literal["fp32", "bf16", "fp16"]


@dataclass
class FSDPConfig:
    """Sharding, precision and offload (verl: ``<role>.fsdp_config``). This class is the run config's
    ``fsdp_config`` node of every role, and what the engine reads."""

    #: Keep sharded parameters in host memory between phases (moved to the device inside train/eval mode).
    param_offload: bool = False
    #: Keep optimizer state in host memory outside train mode.
    optimizer_offload: bool = False
    #: Free the gathered parameters of each block after its forward (re-gathered for backward).
    reshard_after_forward: bool = True
    #: dtype of the sharded master parameters and the optimizer state.
    model_dtype: Dtype = "fp32"
    #: dtype the blocks compute in. "auto": fp32 on CPU, bf16 on accelerators that support it.
    param_dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    #: dtype gradients are reduced in across ranks.
    reduce_dtype: Dtype = "fp32"
    #: Ranks one copy of the model is sharded over (verl's key); the ranks are split into world/fsdp_size
    #: replicas (HSDP: shard within a replica, all-reduce gradients across replicas). -1: shard over all.
    fsdp_size: int = -1

    def __post_init__(self) -> None:
        if self.fsdp_size == 0 or self.fsdp_size < -1:
            raise ValueError(f"fsdp_size={self.fsdp_size} must be a positive rank count or -1 (all ranks)")
        check_literals(self)

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
    #: Ulysses sequence parallelism (verl's key): each micro-batch's packed row is split over this many
    #: neighbouring ranks, which hold one data-parallel batch between them. Needs use_remove_padding and
    #: sdpa; the model's attention heads must divide over the ranks. 1: off.
    ulysses_sequence_parallel_size: int = 1
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
    #: LoRA adapters on the frozen base model (verl's model.lora_rank, ...); lora_rank=0: full fine-tuning.
    lora: LoRAConfig = field(default_factory=LoRAConfig)

    def __post_init__(self) -> None:
        if isinstance(self.lora, dict):
            self.lora = LoRAConfig(**self.lora)
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
        check_supported(
            self.ulysses_sequence_parallel_size,
            use_remove_padding=self.use_remove_padding,
            attn_implementation=self.attn_implementation,
        )

    @property
    def shares_prompts(self) -> bool:
        """Prompt sharing needs the packed layout and our varlen sdpa (flash/eager kernels would treat
        each response as a sequence of its own)."""
        return self.share_prompts and self.use_remove_padding and self.attn_implementation == "sdpa"

    def micro_batching(self, forward_only: bool) -> tuple[int, int, bool]:
        """(micro-batch size in sequences, token budget, whether the budget rules) for a training or a
        forward-only pass."""
        # A sequence-parallel rank holds 1/sp of a micro-batch's tokens: the budget per GPU covers sp times
        # as many (verl multiplies it the same way).
        sp = self.ulysses_sequence_parallel_size
        if forward_only:
            dynamic = self.log_prob_use_dynamic_bsz
            return (
                self.log_prob_micro_batch_size_per_gpu or self.ppo_micro_batch_size_per_gpu,
                (self.log_prob_max_token_len_per_gpu or self.ppo_max_token_len_per_gpu) * sp,
                self.use_dynamic_bsz if dynamic is None else dynamic,
            )
        return self.ppo_micro_batch_size_per_gpu, self.ppo_max_token_len_per_gpu * sp, self.use_dynamic_bsz
