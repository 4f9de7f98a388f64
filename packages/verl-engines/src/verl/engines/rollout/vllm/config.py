"""Configuration of the ``vllm`` rollout engine.

Fields carry verl's names (``actor_rollout_ref.rollout.{gpu_memory_utilization, enforce_eager,
free_cache_engine, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, enable_prefix_caching,
disable_log_stats, cudagraph_capture_sizes, tensor_model_parallel_size, dtype, max_model_len,
engine_kwargs}``; ``engine_args`` says which reach vLLM on which device). The worker adds the model
paths, ``load_format``, the data lengths and the run's generation calls (``generation_batches``), from
which the KV cache is sized on CPU (``kv_cache``). ``rollout.micro_batch_size`` does not apply: vLLM batches
continuously, bounded by ``max_num_seqs``. ``engine_kwargs`` are vLLM's own engine arguments
(``kv_cache_memory_bytes``, ``block_size``, ...), passed to ``vllm.LLM`` unchanged and last, except the
keys named like a field of this class: the worker spreads ``engine_kwargs`` over the config, so those
set the field (``engine_kwargs.dtype=bfloat16`` sets :attr:`VLLMRolloutConfig.dtype`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from verl.engines.rollout.vllm.kv_cache import GenerationBatch

#: ``load_format`` values: verl's "hf" is vLLM's "auto" (the checkpoint's safetensors/bin files).
LOAD_FORMATS = ("hf", "auto", "safetensors", "pt", "dummy")
WEIGHT_SYNCS = ("auto", "reload", "load_weights")
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")


@dataclass
class VLLMServingConfig:
    """vLLM's serving settings under verl's names and with verl's defaults. verl keeps them flat in the
    rollout section beside the sampling settings; the run schema's rollout node extends this class (so
    ``verl config show`` and the engine read one definition) and so does :class:`VLLMRolloutConfig`."""

    #: 1 only: the engine runs inside each training rank's process (see the package docstring).
    tensor_model_parallel_size: int = 1
    #: On GPUs, the fraction of device memory vLLM may take (weights + KV cache). No effect on CPU, where
    #: vLLM would read it as a fraction of host memory: the KV cache is sized from the batch instead.
    gpu_memory_utilization: float = 0.5
    #: Release the KV cache and weights between rollouts (vLLM sleep mode; GPUs only).
    free_cache_engine: bool = True
    #: No CUDA graphs / torch.compile: faster start. False compiles the model (torch.compile on CPU too).
    enforce_eager: bool = True
    #: vLLM's scheduler (null: vLLM's own default): sequences and tokens per engine step, chunked prefill
    #: and prefix caching (the n samples of a prompt share its KV blocks).
    max_num_seqs: int | None = 256
    max_num_batched_tokens: int | None = 8192
    enable_chunked_prefill: bool | None = True
    enable_prefix_caching: bool | None = True
    #: Longest prompt + response vLLM accepts; null: data.max_prompt_length + data.max_response_length
    #: (else the model's).
    max_model_len: int | None = None
    #: Batch sizes to capture CUDA graphs for (GPUs, enforce_eager=False); null: vLLM's.
    cudagraph_capture_sizes: list[int] | None = None
    disable_log_stats: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"rollout.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            _check_positive_or_none(f"rollout.{key}", getattr(self, key))


@dataclass
class VLLMRolloutConfig(VLLMServingConfig):
    """verl keys: ``actor_rollout_ref.rollout.{name=vllm, gpu_memory_utilization, enforce_eager, ...}``:
    the serving settings of :class:`VLLMServingConfig` and what the worker adds (paths, lengths, calls)."""

    model_path: str = ""
    #: Folder of the tokenizer; default ``model_path``.
    tokenizer_path: str | None = None
    trust_remote_code: bool = False
    #: "dummy": random weights until the first ``update_weights`` (what the hybrid engine uses);
    #: "hf"/"auto": the checkpoint's weights.
    load_format: str = "auto"
    #: "auto": fp32 on CPU (what the FSDP actor computes in there), bf16 on accelerators that support it.
    dtype: str = "auto"
    #: vLLM sleep level on GPUs: 1 offloads the weights to host memory, 2 discards them (the hybrid
    #: engine reloads them before every generation anyway, so 2 saves the host copy).
    sleep_level: int = 2
    #: How update_weights reaches vLLM. "reload": the worker's ``reload_weights(weights_iterator=...)``
    #: (vLLM's layer-wise reload; the only path that works on CPU, where vLLM repacks linear weights
    #: after loading). "load_weights": the model's in-place ``load_weights`` (GPUs). "auto": reload on
    #: CPU, load_weights elsewhere.
    weight_sync: str = "auto"
    #: ``data.max_prompt_length`` / ``data.max_response_length``: ``max_model_len`` defaults to their sum.
    prompt_length: int | None = None
    response_length: int | None = None
    #: The generation calls this engine serves in the run, as ``{"name", "prompts", "n"}`` (prompts on
    #: this engine, None when known only at run time): the CPU KV cache holds the largest (``kv_cache``).
    generation_batches: list[GenerationBatch] = field(default_factory=list)
    #: vLLM's engine seed (per-request seeds come from the sampling parameters).
    seed: int = 0
    #: The actor's LoRA rank (``actor_rollout_ref.model.lora_rank``): > 0 builds vLLM with LoRA, and the
    #: actor's adapter is served as a LoRA request on top of the base weights (``lora``).
    lora_rank: int = 0
    #: Overrides of the tokenizer's / generation config's special tokens.
    pad_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    #: Attributes set on the model's Hugging Face config (verl's model.override_config, as the actor has them).
    override_config: dict[str, Any] = field(default_factory=dict)
    #: vLLM engine arguments, passed to ``vllm.LLM`` (keys named like a field above are not).
    engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.engine_kwargs, dict):
            raise ValueError(f"rollout.engine_kwargs must be a mapping, got {type(self.engine_kwargs).__name__}")
        kwargs = dict(self.engine_kwargs)
        # verl's per-backend layout (engine_kwargs.vllm.<arg>, engine_kwargs.sglang.<arg>) is accepted too.
        kwargs.pop("sglang", None)
        section = dict(kwargs.pop("vllm", None) or {})
        own = {f.name for f in dataclasses.fields(self)} - {"engine_kwargs"}
        for key in own & set(section):
            setattr(self, key, section.pop(key))
        kwargs.update(section)
        for key in own & set(kwargs):  # engine_kwargs.max_num_seqs sets the field max_num_seqs
            setattr(self, key, kwargs[key])
        self.engine_kwargs = kwargs
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"rollout.load_format={self.load_format!r} is unknown; use one of {list(LOAD_FORMATS)}")
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"rollout.weight_sync={self.weight_sync!r} is unknown; use one of {list(WEIGHT_SYNCS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"rollout.dtype={self.dtype!r} is unknown; use one of {list(DTYPES)}")
        if self.sleep_level not in (1, 2):
            raise ValueError(f"rollout.sleep_level must be 1 or 2, got {self.sleep_level}")
        super().__post_init__()
        self.generation_batches = [
            b if isinstance(b, GenerationBatch) else GenerationBatch(**b) for b in self.generation_batches
        ]
        for batch in self.generation_batches:
            _check_positive_or_none(f"the {batch.name} batch's prompts", batch.prompts)
            _check_positive_or_none(f"the {batch.name} batch's n", batch.n)
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank={self.lora_rank} must be >= 0 (0: no LoRA)")
        if self.tensor_model_parallel_size != 1:
            raise ValueError(
                f"rollout.tensor_model_parallel_size={self.tensor_model_parallel_size}: the vllm rollout runs "
                "in-process, one vLLM engine per training rank, so only 1 is supported for now; "
                "use data parallelism (trainer.n_gpus_per_node) instead"
            )

    @property
    def vllm_load_format(self) -> str:
        return "auto" if self.load_format == "hf" else self.load_format

    def passthrough_kwargs(self) -> dict[str, Any]:
        """``engine_kwargs`` without the keys that are fields of this config (those set the field)."""
        own = {f.name for f in dataclasses.fields(self)}
        return {k: v for k, v in self.engine_kwargs.items() if k not in own}

    def resolved_max_model_len(self) -> int | None:
        if self.max_model_len is not None:
            return self.max_model_len
        if self.prompt_length and self.response_length:
            return self.prompt_length + self.response_length
        return None


def _check_positive_or_none(what: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{what} must be a positive integer (or null for the default), got {value!r}")
