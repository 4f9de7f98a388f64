"""A LoRA actor's adapter served by vLLM as a LoRA request, on top of base weights sent once.

verl does the same on GPUs. vLLM loads a LoRA request's adapter from a PEFT folder when it first meets its
id, so each new adapter is written (a few MB) to a folder this engine owns (under ``/dev/shm`` where it
exists: memory, not disk), registered under a new id, and the previous one is removed from vLLM and from
the folder. Every generation then carries the current request.

vLLM sizes its LoRA slots by ``max_lora_rank``, which it accepts only from a fixed set of ranks (1, 8, 16,
32, ...): the smallest of them that holds the actor's rank is used.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import typing
import weakref

from verl.core.engine import LoRAAdapter
from verl.engines.lora_layout import write_adapter_files

_FALLBACK_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def max_lora_rank(vllm, rank: int) -> int:
    """The smallest ``max_lora_rank`` this vLLM accepts that holds adapters of ``rank``."""
    try:
        from vllm.config.lora import MaxLoRARanks

        allowed = tuple(typing.get_args(MaxLoRARanks)) or _FALLBACK_RANKS
    except ImportError:  # an older layout of vLLM's config: its documented ranks
        allowed = _FALLBACK_RANKS
    fitting = [r for r in allowed if r >= rank]
    if not fitting:
        raise ValueError(
            f"actor_rollout_ref.model.lora_rank={rank}: vLLM {vllm.__version__} serves LoRA ranks up to "
            f"{max(allowed)}; use a smaller rank or the hf rollout"
        )
    return min(fitting)


class AdapterServer:
    """The current adapter of one vLLM engine, as the ``LoRARequest`` its generations carry."""

    def __init__(self, llm, vllm_lora_request_class, slot_rank: int):
        self.llm = llm
        self._request_class = vllm_lora_request_class
        self.slot_rank = slot_rank
        self.request = None
        self._serial = 0
        shm = "/dev/shm"
        self.root = tempfile.mkdtemp(prefix="verl-vllm-lora-", dir=shm if os.access(shm, os.W_OK) else None)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)

    def serve(self, adapter: LoRAAdapter) -> None:
        rank = int(adapter.config.get("r", 0))
        if not 0 < rank <= self.slot_rank:
            raise ValueError(
                f"update_adapter: the adapter's rank {rank} does not fit the engine's LoRA slots (rank "
                f"{self.slot_rank}, from rollout lora_rank); build the engine with the actor's lora_rank"
            )
        self._serial += 1
        folder = os.path.join(self.root, f"v{self._serial}")
        write_adapter_files(folder, adapter.config, adapter.tensors)
        previous = self.request
        self.request = self._request_class(f"verl_actor_v{adapter.version}", self._serial, folder)
        if previous is not None:
            if previous.lora_int_id in self.llm.llm_engine.list_loras():
                self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def close(self) -> None:
        self._cleanup()
