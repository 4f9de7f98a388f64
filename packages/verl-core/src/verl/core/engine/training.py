"""The training-engine interface: what a role worker needs from FSDP2, Megatron, ... backends.

A training engine owns one model shard per process (its parameters, optimizer and lr scheduler) and
runs the data-parallel computation of the process group it was started in. Role workers (actor,
critic, reference) drive it; they never see backend details.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch

from verl.core.engine.adapter import LoRAAdapter
from verl.core.protocol import DataProto

#: ``loss_fn(outputs, micro_batch) -> (loss, metrics)``. ``outputs`` holds per-token tensors aligned
#: with ``micro_batch.batch["responses"]`` ([micro_batch, response_length]): ``log_probs`` always,
#: ``entropy`` when requested, ``values`` for value models. The engine SUMS gradients over its
#: micro-batches and over data-parallel ranks (no division by the number of ranks), so the loss must
#: already be scaled for the global batch: one rank and N ranks then give the same gradient for the
#: same global batch. ``verl.algos.losses.aggregation.global_normalizer(..., dp_size=1)`` gives that scaling.
#: Each micro-batch's ``meta_info`` carries ``dp_size``, ``global_response_tokens`` and
#: ``global_num_sequences`` of the whole call.
LossFn = Callable[[dict[str, torch.Tensor], DataProto], tuple[torch.Tensor, dict[str, Any]]]


class TrainingEngine(ABC):
    """Interface every training backend implements."""

    @abstractmethod
    def initialize(self) -> None:
        """Build the model (from the configured local folder), shard it over this process group,
        create the optimizer and lr scheduler. Called once, inside the worker process."""

    # -- modes --------------------------------------------------------------------------------------
    @abstractmethod
    def train_mode(self) -> AbstractContextManager[None]:
        """Context in which parameters (and optimizer state) are on the device and the model is in
        train mode; on exit, whatever the config offloads goes back to host memory."""

    @abstractmethod
    def eval_mode(self) -> AbstractContextManager[None]:
        """Like :meth:`train_mode` for forward-only work (no optimizer state needed on device)."""

    # -- compute ------------------------------------------------------------------------------------
    @abstractmethod
    def forward_backward(self, batch: DataProto, loss_fn: LossFn) -> dict[str, Any]:
        """Split ``batch`` (this rank's shard) into micro-batches (fixed size, or by token budget when
        dynamic batching is on), run forward, call ``loss_fn`` on each, and backward. Gradients
        accumulate; no optimizer step. Returns the metrics ``loss_fn`` reported, as lists over
        micro-batches."""

    @abstractmethod
    def forward_only(self, batch: DataProto, compute_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Per-token ``log_probs`` of ``responses`` (and ``entropy`` if asked), or ``values`` for a value
        model, as [batch, response_length] tensors in the batch's row order. No graph is kept."""

    @abstractmethod
    def optimizer_zero_grad(self) -> None: ...

    @abstractmethod
    def optimizer_step(self) -> float:
        """Clip gradients to the configured norm, step the optimizer; returns the pre-clip grad norm.
        A non-finite norm skips the update (and is reported by the returned value)."""

    @abstractmethod
    def lr_scheduler_step(self) -> float:
        """Advance the lr schedule one step; returns the new learning rate."""

    # -- weights ------------------------------------------------------------------------------------
    @abstractmethod
    def named_full_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (Hugging Face name, full tensor) one parameter at a time, gathering each shard only
        when it is reached, so the whole unsharded model is never in memory at once. This is what a
        rollout engine's ``update_weights`` consumes."""

    def lora_adapter(self) -> LoRAAdapter | None:
        """A LoRA engine's current adapter (full tensors; collective: every rank calls), else None."""
        return None

    def named_base_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """A LoRA engine's frozen base weights, as :meth:`named_full_parameters` yields weights (Hugging
        Face names, one full tensor at a time), without the adapter merged in."""
        raise NotImplementedError(f"{type(self).__name__} has no LoRA adapter; use named_full_parameters")

    @abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Write model, optimizer, lr scheduler and RNG state under ``path`` (a directory), sharded,
        atomically (a partial write is never mistaken for a checkpoint). Collective: all ranks call."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote, possibly on a different number of ranks."""

    @abstractmethod
    def export_hf(self, path: str) -> None:
        """Write a Hugging Face folder (safetensors, config, tokenizer, generation config)."""

    # -- memory -------------------------------------------------------------------------------------
    @abstractmethod
    def offload_to_host(self, model: bool = True, optimizer: bool = True) -> None:
        """Move parameters and/or optimizer state to host memory, freeing device memory."""

    @abstractmethod
    def load_to_device(self, model: bool = True, optimizer: bool = True) -> None:
        """Inverse of :meth:`offload_to_host`; training continues bit-exactly."""

    # -- parallelism --------------------------------------------------------------------------------
    @property
    @abstractmethod
    def dp_rank(self) -> int: ...

    @property
    @abstractmethod
    def dp_size(self) -> int: ...

    @property
    def is_collect_rank(self) -> bool:
        """Whether this rank's outputs are the ones returned for its data-parallel rank. Every rank of a
        data-parallel replica runs the same calls (model-parallel engines need them all); exactly one
        per replica is collected (``Worker.set_dp_info``). Default: True (each rank is its own replica)."""
        return True

    @property
    @abstractmethod
    def dp_group(self) -> Any:
        """The torch.distributed process group of data parallelism (None for the default group)."""
