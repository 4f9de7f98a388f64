"""``verl sft`` configuration (verl's SFT key names where they exist)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.algos.config.schema import ModelConfig, _check_freq
from verl.core.checks import check_positive
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
        check_positive("train_batch_size", self.train_batch_size)
        check_positive("micro_batch_size_per_gpu", self.micro_batch_size_per_gpu)
        check_positive("max_prompt_length", self.max_prompt_length)
        check_positive("max_response_length", self.max_response_length)


@dataclass
class SFTTrainerConfig:
    project_name: str = "verl"
    experiment_name: str = "sft"
    logger: list[str] = field(default_factory=lambda: ["console", "file"])
    total_epochs: int = 1
    total_training_steps: int | None = None
    n_gpus_per_node: int = 1
    nnodes: int = 1
    save_freq: int = -1
    test_freq: int = -1
    default_local_dir: str = "outputs/${trainer.project_name}/${trainer.experiment_name}"
    resume_mode: str = "auto"
    resume_from_path: str | None = None
    #: As trainer.start_over of ``verl train``: move an earlier run's checkpoints aside and start fresh.
    start_over: bool = False
    ray_address: str | None = None
    ray_include_dashboard: bool = False
    seed: int = 42
    worker_timeout_s: float = 1800.0
    plot_curves: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.logger, str):
            self.logger = [self.logger]
        check_positive("total_epochs", self.total_epochs)
        if self.total_training_steps is not None:
            check_positive("total_training_steps", self.total_training_steps)
        _check_freq("save_freq", self.save_freq)
        _check_freq("test_freq", self.test_freq)
        check_positive("n_gpus_per_node", self.n_gpus_per_node)
        check_positive("nnodes", self.nnodes)
        check_positive("worker_timeout_s", self.worker_timeout_s)


@dataclass
class SFTConfig:
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, lr_scheduler_type="cosine"))
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    use_dynamic_bsz: bool = False
    max_token_len_per_gpu: int = 8192
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)

    def __post_init__(self) -> None:
        check_positive("max_token_len_per_gpu", self.max_token_len_per_gpu)
        if (
            self.use_dynamic_bsz
            and self.max_token_len_per_gpu < self.data.max_prompt_length + self.data.max_response_length
        ):
            raise ValueError(
                f"max_token_len_per_gpu={self.max_token_len_per_gpu} is shorter than one sequence "
                f"(data.max_prompt_length + data.max_response_length = "
                f"{self.data.max_prompt_length + self.data.max_response_length}); raise max_token_len_per_gpu"
            )
