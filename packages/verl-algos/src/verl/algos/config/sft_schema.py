"""``verl sft`` configuration (verl's SFT key names where they exist)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.algos.config.schema import ModelConfig
from verl.algos.config.sequence_parallel import check_sequence_parallel
from verl.algos.run.config import RunLoopConfig
from verl.core.checks import check_positive_fields
from verl.engines.fsdp.config import FSDPConfig
from verl.engines.optim_config import OptimConfig


@dataclass
class SFTDataConfig:
    train_files: list[str] = field(default_factory=lambda: ["builtin:arithmetic"])
    val_files: list[str] = field(default_factory=lambda: ["builtin:arithmetic"])
    #: A column holding chat messages (or a string), dotted for nested fields.
    prompt_key: str = "prompt"
    #: The target text, dotted for nested fields (built-in tasks carry ``extra_info.solution``).
    response_key: str = "extra_info.solution"
    #: verl's nested lookups: the prompt is row[prompt_key][k1][k2]... (likewise the response).
    prompt_dict_keys: list[str] | None = None
    response_dict_keys: list[str] | None = None
    #: Extra keyword arguments of the tokenizer's apply_chat_template, as verl.
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_prompt_length: int = 128
    max_response_length: int = 64
    train_batch_size: int = 32
    micro_batch_size_per_gpu: int = 16
    val_max_samples: int | None = 128
    shuffle: bool = True
    seed: int = 42
    builtin: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_positive_fields(
            self, "train_batch_size", "micro_batch_size_per_gpu", "max_prompt_length", "max_response_length"
        )


@dataclass
class SFTTrainerConfig(RunLoopConfig):
    """``verl sft``'s trainer section: the run loop's keys (``verl train``'s, with SFT's defaults)."""

    experiment_name: str = "sft"


@dataclass
class SFTConfig:
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, lr_scheduler_type="cosine"))
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    use_dynamic_bsz: bool = False
    max_token_len_per_gpu: int = 8192
    #: Ulysses sequence parallelism (verl's key): groups of this many ranks split each micro-batch's packed
    #: tokens and count as one data-parallel rank. 1: off.
    ulysses_sequence_parallel_size: int = 1
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)

    def __post_init__(self) -> None:
        check_positive_fields(self, "max_token_len_per_gpu", "ulysses_sequence_parallel_size")
        self._check_sequence_parallel()
        if (
            self.use_dynamic_bsz
            and self.max_token_len_per_gpu < self.data.max_prompt_length + self.data.max_response_length
        ):
            raise ValueError(
                f"max_token_len_per_gpu={self.max_token_len_per_gpu} is shorter than one sequence "
                f"(data.max_prompt_length + data.max_response_length = "
                f"{self.data.max_prompt_length + self.data.max_response_length}); raise max_token_len_per_gpu"
            )

    def _check_sequence_parallel(self) -> None:
        check_sequence_parallel(
            "ulysses_sequence_parallel_size",
            self.ulysses_sequence_parallel_size,
            self.trainer.nnodes * self.trainer.n_gpus_per_node,
            "trainer.nnodes x trainer.n_gpus_per_node",
            "fsdp_config.fsdp_size",
            self.fsdp_config.fsdp_size,
            "model.use_remove_padding",
            self.model.use_remove_padding,
        )
