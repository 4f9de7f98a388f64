"""Configuration of the ``hf`` rollout engine (verl keys: ``actor_rollout_ref.rollout.*``; the engine's own
knobs also arrive through ``actor_rollout_ref.rollout.engine_kwargs``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.engines.dtypes import parse_dtype

LOAD_FORMATS = ("hf", "dummy")
#: "static": preallocated KV cache, left padding trimmed, each prompt prefilled once and its cache shared
#: by its n samples, finished rows dropped from the batch (the default). "dynamic": transformers'
#: DynamicCache grown by concatenation, every sample prefilled on its own (the plain reference loop).
CACHE_IMPLEMENTATIONS = ("static", "dynamic")


@dataclass
class HFServingConfig:
    """The hf engine's settings that verl's rollout section holds flat beside the sampling settings; the
    run schema's rollout node extends this class, and so does :class:`HFRolloutConfig`."""

    #: Sequences (prompts x n) decoded together; bounds the KV cache and logits memory.
    micro_batch_size: int = 64

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1:
            raise ValueError(f"rollout.micro_batch_size must be >= 1, got {self.micro_batch_size}")


@dataclass
class HFRolloutConfig(HFServingConfig):
    """verl keys: ``actor_rollout_ref.rollout.{name=hf, dtype, load_format, micro_batch_size, ...}``; the
    decode path's own knobs (``cache_implementation``, ...) arrive through ``rollout.engine_kwargs``."""

    model_path: str = ""
    #: Folder of the tokenizer (needed for stop strings only); default ``model_path``.
    tokenizer_path: str | None = None
    #: "auto": fp32 on CPU, bf16 on accelerators that support it.
    dtype: str = "auto"
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    #: Attributes set on the model's Hugging Face config (verl's model.override_config, as the actor has them).
    override_config: dict[str, Any] = field(default_factory=dict)
    #: "hf": weights from ``model_path``; "dummy": random weights, to be replaced by ``update_weights``.
    load_format: str = "hf"
    #: Alias incoming tensors of matching dtype/device instead of copying them (see the engine's docstring).
    share_weight_storage: bool = True
    #: 1: sleep moves weights to host memory; 2: sleep drops them until the next ``update_weights``.
    sleep_level: int = 1
    #: Overrides of the tokenizer's / generation config's special tokens.
    pad_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    #: The decode path, one of :data:`CACHE_IMPLEMENTATIONS` (transformers' name for the KV cache kind).
    cache_implementation: str = "static"
    #: Compile the one-token decode step (static cache only) with ``torch.compile``. None: where the
    #: platform says it pays (``platform.decode_compile_options()``: CUDA graphs on CUDA; not on CPU,
    #: where the step is bound by its matmuls and compiling costs about a minute per run).
    compile_decode: bool | None = None
    #: Run the fp32 linear layers through oneDNN with weights reordered once per ``generate`` (CPU, eager
    #: decode; q/k/v and gate/up as one product each; see ``packed_linear``). None (default): wherever
    #: possible, for each generate whose free memory holds the copy (2x faster decode than MKL's F.linear
    #: on an AMD EPYC, a wash on an Intel Xeon); true: always (an error where impossible); false: never.
    packed_linear: bool | None = None
    #: Decode the n samples of a prompt against one copy of the prompt's keys and values instead of n
    #: copies (static cache, eager CPU decode attention; see ``shared_prefix``), for micro-batches whose
    #: prompts have the same number (>= 2) of samples, until a quarter of the rows have finished. None
    #: (default): for prompts of at least 128 tokens (where it pays: 27% faster decode at ~500 tokens, 4%
    #: slower at ~40); true: for any prompt (an error where impossible); false: never.
    shared_prefix: bool | None = None
    #: Run the RMSNorms, the rotary embedding, the one-query decode attention and the static cache's update
    #: through verl's fused C++ CPU kernels (static cache, eager CPU fp32 step; see ``cpu_kernels``), and with
    #: ``packed_linear`` a Llama-layout decoder layer's decode step as direct calls (``fused_layer``; over a
    #: static cache one C++ call per layer), built on first use with the machine's C++ compiler (~40 s once
    #: per machine and environment). None (default):
    #: wherever possible (without a compiler: a warning, and the torch operations); true: always (an error
    #: where impossible); false: never.
    cpu_kernels: bool | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"rollout.load_format={self.load_format!r} is unknown; use one of {list(LOAD_FORMATS)}")
        if self.sleep_level not in (1, 2):
            raise ValueError(f"rollout.sleep_level must be 1 or 2, got {self.sleep_level}")
        if self.dtype != "auto":
            parse_dtype(self.dtype, "rollout.dtype")
        if self.cache_implementation not in CACHE_IMPLEMENTATIONS:
            raise ValueError(
                f"rollout cache_implementation={self.cache_implementation!r} is unknown; use one of "
                f"{list(CACHE_IMPLEMENTATIONS)} (set it as actor_rollout_ref.rollout.engine_kwargs.cache_implementation)"
            )
        if self.packed_linear and self.compile_decode:
            raise ValueError(
                "rollout packed_linear=true and compile_decode=true exclude each other (packed weights are for "
                "the eager step); drop one of the two"
            )
        if self.shared_prefix and (self.compile_decode or self.cache_implementation != "static"):
            raise ValueError(
                "rollout shared_prefix=true needs cache_implementation='static' and an eager decode step "
                "(compile_decode unset or false); drop one of them"
            )
        if self.cpu_kernels and (self.compile_decode or self.cache_implementation != "static"):
            raise ValueError(
                "rollout cpu_kernels=true needs cache_implementation='static' and an eager decode step "
                "(compile_decode unset or false); drop one of them"
            )
        if self.compile_decode and self.cache_implementation != "static":
            raise ValueError(
                "rollout compile_decode=true needs cache_implementation='static' (a compiled step needs a "
                "preallocated cache); drop one of the two"
            )
