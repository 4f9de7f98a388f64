"""Moving the megatron engine's parameters, gradient buffers and optimizer state off and onto the device.

- Parameters move by ``param.data = copy``: the Parameter objects (which megatron's DDP hooks and the
  optimizer's state are keyed on) stay the same; megatron's own RL offload moves its optimizer this way.
  With the distributed optimizer the parameters are views into DDP's flat ``param_data`` buffers (the
  post-step all-gather writes there): the buffer's contents go to a host copy and its storage is resized
  to 0, every view kept, and it comes back by resizing and copying.
- Gradients live in DDP's contiguous buffers; megatron frees them (``offload_grad_buffers``: storage
  resized to 0, every ``main_grad`` view kept) and reallocates them zeroed (``restore_grad_buffers``), so
  gradients are not kept across an offload: it happens between updates.
- Optimizer state moves like the FSDP engine's (``verl.engines.fsdp.offload.move_optimizer_state``); in
  mixed precision the fp32 main parameters move with it.

Copies are real (``copy=True``) also from host to host, so the CPU runs the accelerator's code path.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.engines.fsdp.offload import move_optimizer_state


def move_params(chunks: list[Any], device: torch.device | str, to_host: bool) -> None:
    """Parameters to host memory (``to_host``) or back to ``device``."""
    with torch.no_grad():
        for chunk in chunks:
            buffers = [b for b in chunk.buffers + chunk.expert_parallel_buffers if b.param_data is not None]
            if buffers:  # distributed optimizer: the parameters are views into these
                for buffer in buffers:
                    (_release_flat_buffer if to_host else _restore_flat_buffer)(buffer)
                continue
            for param in chunk.parameters():
                param.data = param.data.to(device, copy=True)


#: (host copy, storage bytes) of a DDP ``param_data`` buffer while its device storage is released.
_HOST_COPY = "_verl_host_param_data"


def _release_flat_buffer(buffer: Any) -> None:
    data = buffer.param_data
    storage = data.untyped_storage()
    setattr(buffer, _HOST_COPY, (data.to("cpu", copy=True), storage.nbytes()))
    storage.resize_(0)


def _restore_flat_buffer(buffer: Any) -> None:
    host, nbytes = getattr(buffer, _HOST_COPY)
    buffer.param_data.untyped_storage().resize_(nbytes)
    buffer.param_data.copy_(host)
    setattr(buffer, _HOST_COPY, None)


def free_grad_buffers(chunks: list[Any], optimizer: Any) -> None:
    optimizer.zero_grad()  # param.grad may alias the buffers (the optimizer's prepare_grads)
    for chunk in chunks:
        chunk.offload_grad_buffers(synchronize=False, empty_cache=False)


def restore_grad_buffers(chunks: list[Any]) -> None:
    for chunk in chunks:
        chunk.restore_grad_buffers(synchronize=False)


def move_optimizer(optimizer: Any, model_params: set[torch.nn.Parameter], device: torch.device | str) -> None:
    """The torch optimizers' state, and their parameters that are separate fp32 copies of model parameters
    (mixed precision main parameters), to ``device``."""
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(sub, "optimizer", None)
        if inner is None:
            continue
        move_optimizer_state(inner, device)
        with torch.no_grad():
            for group in inner.param_groups:
                for param in group["params"]:
                    # Views (the distributed optimizer's fp32 shards of fp32 parameters) move with the
                    # parameter buffer they view; only separate fp32 copies move here.
                    if param not in model_params and param._base is None:
                        param.data = param.data.to(device, copy=True)
