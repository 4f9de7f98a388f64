"""Moving FSDP2 parameters and optimizer state between the device and host memory.

Moves are real copies into fresh storage (``copy=True``) that drop the old storage, also when source
and target are the same device type: on CPU this keeps the code path (and its bit-exactness test)
identical to the accelerator one, at the price of a copy nobody needs there, so CPU configs leave
offload off. FSDP2 re-registers its sharded parameters after ``Module._apply`` (see
``FSDPModule._apply``), which is why the model moves through ``_apply`` and not by editing ``.data``.
"""

from __future__ import annotations

import torch
from torch import nn


def move_module(module: nn.Module, device: torch.device | str) -> None:
    """Copy parameters, buffers and gradients of ``module`` to ``device`` (new storage)."""
    with torch.no_grad():
        module._apply(lambda t: t.to(device, copy=True))


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Copy optimizer state tensors to ``device``. Scalar state (AdamW's ``step``) stays where the
    optimizer keeps it: non-capturable AdamW expects it on the host."""
    with torch.no_grad():
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    state[key] = value.to(device, copy=True)
