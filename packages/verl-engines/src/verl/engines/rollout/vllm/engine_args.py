"""verl's rollout keys as the arguments of ``vllm.LLM``, on the platform the engine runs on.

Each verl key vLLM understands goes to vLLM where it means something on this device; left unset
(None) it is left to vLLM's own default. On CPU some of them mean nothing, and those are reported in
one log line (:func:`no_effect_on`) instead of being dropped silently:

=========================== ===================================== ===================================
verl key (rollout.*)        vLLM argument                         on CPU
=========================== ===================================== ===================================
dtype                       dtype                                 applied ("auto": fp32, as the actor)
load_format                 load_format ("hf" is vLLM's "auto")   applied
max_model_len               max_model_len                         applied (default: prompt+response)
max_num_seqs                max_num_seqs                          applied
max_num_batched_tokens      max_num_batched_tokens                applied
enable_chunked_prefill      enable_chunked_prefill                applied
enable_prefix_caching       enable_prefix_caching                 applied
enforce_eager               enforce_eager                         applied (False: torch.compile)
disable_log_stats           disable_log_stats                     applied
tensor_model_parallel_size  tensor_parallel_size                  applied (1 only, in-process)
model.lora_rank > 0         enable_lora, max_loras=1,             applied (the adapter is served as a
                            max_lora_rank                         LoRA request, see ``lora``)
gpu_memory_utilization      gpu_memory_utilization                no effect: the KV cache is sized
                                                                  from the batch (see ``kv_cache``)
free_cache_engine           enable_sleep_mode                     no effect: no sleep mode on CPU
cudagraph_capture_sizes     cudagraph_capture_sizes               no effect: no CUDA graphs on CPU
=========================== ===================================== ===================================

An ``engine_kwargs`` key named like one of these verl keys sets it (``engine_kwargs.max_num_seqs``); the
other ``engine_kwargs`` are vLLM's own arguments, applied last.
"""

from __future__ import annotations

from typing import Any

from verl.engines.rollout.vllm.config import VLLMRolloutConfig

#: The verl keys that have no effect on CPU, and why.
NO_EFFECT_ON_CPU = {
    "gpu_memory_utilization": "the KV cache is sized from the batch, or by engine_kwargs.kv_cache_memory_bytes",
    "free_cache_engine": "vLLM has no sleep mode on CPU; KV cache and weights stay allocated",
    "cudagraph_capture_sizes": "no CUDA graphs on CPU",
}
#: verl key -> vLLM argument, for the keys passed only when set (None: vLLM's default).
OPTIONAL_ARGS = {
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "enable_prefix_caching": "enable_prefix_caching",
    "cudagraph_capture_sizes": "cudagraph_capture_sizes",
}


def vllm_args(
    cfg: VLLMRolloutConfig,
    device_type: str,
    dtype: str,
    sleep: bool,
    kv_cache_bytes: int | None,
    max_lora_rank: int | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for this config on ``device_type``; ``engine_kwargs`` last.
    ``max_lora_rank``: vLLM's LoRA slot size for ``cfg.lora_rank`` (see ``lora.max_lora_rank``)."""
    on_cpu = device_type == "cpu"
    args: dict[str, Any] = {
        "model": cfg.model_path,
        "tokenizer": cfg.tokenizer_path or cfg.model_path,
        "trust_remote_code": cfg.trust_remote_code,
        "load_format": cfg.vllm_load_format,
        "dtype": dtype,
        "seed": cfg.seed,
        "enforce_eager": cfg.enforce_eager,
        "tensor_parallel_size": cfg.tensor_model_parallel_size,
        "enable_sleep_mode": sleep,
        # Sampled tokens' log-probs after temperature: what the trainer recomputes.
        "logprobs_mode": "processed_logprobs",
        "disable_log_stats": cfg.disable_log_stats,
    }
    if not on_cpu:
        args["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    for key, arg in OPTIONAL_ARGS.items():
        value = getattr(cfg, key)
        if value is not None and not (on_cpu and key in NO_EFFECT_ON_CPU):
            args[arg] = value
    max_model_len = cfg.resolved_max_model_len()
    if max_model_len is not None:
        args["max_model_len"] = max_model_len
    if kv_cache_bytes is not None:
        args["kv_cache_memory_bytes"] = kv_cache_bytes
    if cfg.override_config:  # the same model config the actor trains
        args["hf_overrides"] = dict(cfg.override_config)
    if cfg.lora_rank:  # one adapter at a time: the actor's current one (see ``lora``)
        args.update(enable_lora=True, max_loras=1, max_lora_rank=max_lora_rank)
    args.update(cfg.passthrough_kwargs())
    return args


def no_effect_on(cfg: VLLMRolloutConfig, device_type: str) -> dict[str, str]:
    """``{"key=value": why}`` of the verl keys this config carries that mean nothing on ``device_type``."""
    if device_type != "cpu":
        return {}
    return {f"{key}={getattr(cfg, key)}": why for key, why in NO_EFFECT_ON_CPU.items() if getattr(cfg, key) is not None}
