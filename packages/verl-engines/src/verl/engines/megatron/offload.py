"""Moving the megatron engine's parameters, gradient buffers and optimizer state off and onto the device.

- Parameters move by ``param.data = copy``: the Parameter objects (which megatron's DDP hooks and the
  optimizer's state are keyed on) stay the same; megatron's own RL offload moves its optimizer this way.
- Gradients live in DDP's contiguous buffers; megatron frees them (``offload_grad_buffers``: storage
  resized to 0, every ``main_grad`` view kept) and reallocates them zeroed (``restore_grad_buffers``), so
  gradients are not kept across an offload: it happens between updates.
- Optimizer state moves like the FSDP engine's (``verl.engines.fsdp.offload.move_optimizer_state``); in
  mixed precision the fp32 main parameters move with it.

Copies are real (``copy=True``) also from host to host, so the CPU runs the accelerator's code path. The
distributed optimizer keeps parameters in flat buffers and is not handled here (refused by the engine).
"""

from __future__ import annotations

from typing import Any

import torch

from verl.engines.fsdp.offload import move_optimizer_state


def move_params(chunks: list[torch.nn.Module], device: torch.device | str) -> None:
    with torch.no_grad():
        for chunk in chunks:
            for param in chunk.parameters():
                param.data = param.data.to(device, copy=True)


def free_grad_buffers(chunks: list[Any], optimizer: Any) -> None:
    optimizer.zero_grad()  # param.grad may alias the buffers (the optimizer's prepare_grads)
    for chunk in chunks:
        chunk.offload_grad_buffers(synchronize=False, empty_cache=False)


def restore_grad_buffers(chunks: list[Any]) -> None:
    for chunk in chunks:
        chunk.restore_grad_buffers(synchronize=False)


def move_optimizer(optimizer: Any, model_params: set[torch.nn.Parameter], device: torch.device | str) -> None:
    """The torch optimizers' state, and their parameters that are not model parameters (fp32 main copies
    in mixed precision), to ``device``."""
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(sub, "optimizer", None)
        if inner is None:
            continue
        move_optimizer_state(inner, device)
        with torch.no_grad():
            for group in inner.param_groups:
                for param in group["params"]:
                    if param not in model_params:
                        param.data = param.data.to(device, copy=True)
