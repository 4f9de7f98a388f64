"""Configuration of the megatron training engine, under verl's key names.

``MegatronConfig`` is the run config's ``megatron`` node of a role (verl: ``actor_rollout_ref.actor.megatron``,
``critic.megatron``, ...) and what the engine reads; ``MegatronEngineConfig`` gathers it with the role's
model, micro-batching and the shared :class:`~verl.engines.optim_config.OptimConfig`, like
``FSDPEngineConfig`` does for FSDP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from verl.core.checks import check_literals
from verl.engines.optim_config import OptimConfig


@dataclass
class MegatronConfig:
    """Parallel layout, offload and precision of a megatron model (verl: ``<role>.megatron``)."""

    #: Ranks one layer's matrices are split over (TP). Must divide the attention heads, the KV heads
    #: (query groups) and the world size.
    tensor_model_parallel_size: int = 1
    #: Pipeline stages the layers are split over (PP); the layers must split evenly.
    pipeline_model_parallel_size: int = 1
    #: Model chunks per pipeline stage (interleaved 1F1B); None: one chunk per stage.
    virtual_pipeline_model_parallel_size: int | None = None
    #: Ranks a sequence is split over (CP). Only 1 is supported by this engine so far.
    context_parallel_size: int = 1
    #: Ranks the experts of an MoE layer are spread over (EP; Qwen2-MoE / Qwen3-MoE). Must divide the
    #: number of experts and the data-parallel size (experts are spread over data-parallel ranks).
    expert_model_parallel_size: int = 1
    #: Split the non-tensor-parallel activations (norms, dropout) over the TP ranks too (needs TP > 1).
    sequence_parallel: bool = False
    #: Shard the optimizer state over the data-parallel ranks (megatron's distributed optimizer).
    use_distributed_optimizer: bool = False
    #: Keep parameters / gradients / optimizer state in host memory between phases.
    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload: bool = False
    #: dtype of the parameters and the computation; "auto": fp32 on the CPU, bf16 on accelerators.
    params_dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    #: megatron pads the vocabulary to a multiple of this times TP (the padded logits are masked).
    make_vocab_size_divisible_by: int = 128
    #: Seed of megatron's RNG streams (data-parallel, tensor-parallel per TP rank, expert).
    seed: int = 42

    def __post_init__(self) -> None:
        check_literals(self)
        for name in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
            "expert_model_parallel_size",
            "make_vocab_size_divisible_by",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"megatron.{name}={getattr(self, name)} must be at least 1")
        vpp = self.virtual_pipeline_model_parallel_size
        if vpp is not None and (vpp < 1 or self.pipeline_model_parallel_size == 1):
            raise ValueError(
                f"megatron.virtual_pipeline_model_parallel_size={vpp} needs pipeline_model_parallel_size > 1 "
                "and a value >= 1 (or null for one chunk per stage)"
            )
        if self.context_parallel_size != 1:
            raise NotImplementedError(
                "megatron.context_parallel_size must be 1: the megatron engine does not support context parallelism yet"
            )
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            raise ValueError("megatron.sequence_parallel=true needs tensor_model_parallel_size > 1")


@dataclass
class MegatronEngineConfig:
    """Everything the megatron engine needs."""

    #: Local folder of a Hugging Face model (config.json + safetensors). Nothing is downloaded.
    model_path: str = ""
    #: Folder with the tokenizer to copy on export (default: ``model_path``).
    tokenizer_path: str | None = None
    #: Attributes set on the model's Hugging Face config before it is built (verl's model.override_config).
    override_config: dict[str, Any] = field(default_factory=dict)
    #: Micro-batch size (sequences) for training when ``use_dynamic_bsz`` is off.
    ppo_micro_batch_size_per_gpu: int = 4
    #: Micro-batches by a token budget (``ppo_max_token_len_per_gpu``) instead of a sequence count.
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    #: Forward-only (log-prob / value) micro-batching; None: the training values above.
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool | None = None
    log_prob_max_token_len_per_gpu: int | None = None
    optim: OptimConfig = field(default_factory=OptimConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)

    def __post_init__(self) -> None:
        if isinstance(self.optim, dict):
            self.optim = OptimConfig(**self.optim)
        if isinstance(self.megatron, dict):
            self.megatron = MegatronConfig(**self.megatron)
        for name in (
            "ppo_micro_batch_size_per_gpu",
            "log_prob_micro_batch_size_per_gpu",
            "ppo_max_token_len_per_gpu",
            "log_prob_max_token_len_per_gpu",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        dynamic = self.use_dynamic_bsz or bool(self.log_prob_use_dynamic_bsz)
        if dynamic and self.megatron.virtual_pipeline_model_parallel_size is not None:
            raise ValueError(
                "use_dynamic_bsz needs micro-batches of any size; with virtual pipeline stages megatron runs fixed "
                "shapes: turn one of them off"
            )

    def micro_batching(self, forward_only: bool) -> tuple[int, int, bool]:
        """(micro-batch size in sequences, token budget, whether the budget rules) for a training or a
        forward-only pass (the FSDP engine's rule)."""
        if forward_only:
            dynamic = self.log_prob_use_dynamic_bsz
            return (
                self.log_prob_micro_batch_size_per_gpu or self.ppo_micro_batch_size_per_gpu,
                self.log_prob_max_token_len_per_gpu or self.ppo_max_token_len_per_gpu,
                self.use_dynamic_bsz if dynamic is None else dynamic,
            )
        return self.ppo_micro_batch_size_per_gpu, self.ppo_max_token_len_per_gpu, self.use_dynamic_bsz
