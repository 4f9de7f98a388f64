"""The rollout-engine interface: generation backends (hf, vllm, sglang) behind one API.

Batches are ``DataProto``s. The input carries left-padded ``input_ids``, ``attention_mask`` and
``position_ids`` of the prompts ([batch, prompt_length]). The output has, per generated sample
(``n`` per prompt, interleaved: prompt 0's samples first):

- ``prompts`` [B*n, prompt_length] (left-padded), ``responses`` [B*n, response_length] (right-padded
  with the pad token),
- ``input_ids`` = prompts ++ responses, ``attention_mask`` and ``position_ids`` over the whole sequence,
- ``response_mask`` [B*n, response_length]: 1 for generated tokens up to and including eos/stop,
- ``rollout_log_probs`` [B*n, response_length] when ``SamplingParams.logprobs`` is set,

and the input's non-tensor fields repeated ``n`` times in the same order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from verl.core.engine.adapter import LoRAAdapter
from verl.core.protocol import DataProto

if TYPE_CHECKING:
    from verl.core.engine.requests import RequestStream


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off (verl's convention)
    max_new_tokens: int = 512
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    do_sample: bool = True  # False: greedy (validation)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.do_sample and self.temperature <= 0:
            raise ValueError("SamplingParams.temperature must be > 0 when sampling; set do_sample=False for greedy")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return not self.do_sample


class RolloutEngine(ABC):
    """Interface every generation backend implements."""

    #: Whether ``sleep``/``wake_up`` really release device memory on this backend and device.
    supports_sleep: bool = False
    #: Whether :meth:`update_adapter` serves a LoRA adapter on top of the base weights (then a LoRA
    #: actor sends its base weights once and only the adapter after each update).
    supports_lora_adapters: bool = False
    #: Whether :meth:`sleep` discarded the weights (the next sync must send them all again).
    weights_discarded: bool = False
    #: Whether :meth:`request_stream` takes requests one by one into running generation (continuous
    #: batching; see :mod:`verl.core.engine.requests`).
    supports_request_stream: bool = False

    @abstractmethod
    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """Generate ``sampling.n`` responses per prompt; see the module docstring for the layout."""

    def request_stream(self) -> RequestStream:
        """Requests that join and leave generation one by one (only with :attr:`supports_request_stream`)."""
        raise NotImplementedError(f"{type(self).__name__} generates batches only; use generate()")

    @abstractmethod
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (Hugging Face names, full tensors, one at a time) in place."""

    def update_adapter(self, adapter: LoRAAdapter) -> None:
        """Serve ``adapter`` on top of the base weights from now on (replacing the previous adapter).
        Only engines with :attr:`supports_lora_adapters`; the others get merged weights instead."""
        raise NotImplementedError(f"{type(self).__name__} does not serve LoRA adapters; send merged weights")

    @abstractmethod
    def sleep(self) -> bool:
        """Release device memory (KV cache, weights) between rollouts. Returns False, and logs once,
        where the backend cannot (an allowed no-op that must be reported, never faked)."""

    @abstractmethod
    def wake_up(self) -> bool:
        """Retake what :meth:`sleep` released. Returns False where sleep is not supported."""
