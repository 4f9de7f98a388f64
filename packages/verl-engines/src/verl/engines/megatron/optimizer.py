"""megatron's optimizer under verl's ``OptimConfig``, stepped with verl's contract, and verl's lr schedule.

What is chosen, and why:

- ``get_megatron_optimizer`` with Adam in AdamW mode (``decoupled_weight_decay``): lr, betas, eps, weight
  decay and clip norm from :class:`~verl.engines.optim_config.OptimConfig`. Weight decay applies to every
  parameter (``config_overrides={}``), norms and biases included, as the FSDP engine's AdamW does;
  megatron's default would exempt them, and then the two engines would train different models.
- :func:`clip_and_step` instead of megatron's ``step()``: the FP32 optimizer steps even when the norm is
  inf/nan; verl's contract is to skip that update and report the norm.
- :class:`LRSchedule`: the FSDP engine's schedule function (``verl.engines.fsdp.optim.schedule_fn``) applied
  to megatron's param groups, not megatron's ``OptimizerParamScheduler``, so both engines follow the same
  curve from the same config.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from verl.engines.fsdp.optim import schedule_fn
from verl.engines.optim_config import OptimConfig


def build_megatron_optimizer(
    chunks: list[torch.nn.Module],
    config: OptimConfig,
    *,
    params_dtype: torch.dtype,
    use_distributed_optimizer: bool = False,
):
    """megatron's optimizer over the DDP-wrapped ``chunks`` (fp32: ``FP32Optimizer``; bf16/fp16 or
    the distributed optimizer: fp32 main params in megatron's mixed-precision optimizers)."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=config.lr,
        min_lr=0.0,
        weight_decay=config.weight_decay,
        adam_beta1=config.betas[0],
        adam_beta2=config.betas[1],
        adam_eps=config.eps,
        decoupled_weight_decay=True,
        clip_grad=config.clip_grad,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        params_dtype=params_dtype,
        use_distributed_optimizer=use_distributed_optimizer,
    )
    return get_megatron_optimizer(opt_config, chunks, config_overrides={})


def _sub_optimizers(optimizer) -> list[Any]:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def clip_and_step(optimizer, clip_grad: float) -> float:
    """Move gradients where the optimizer reads them, compute the global pre-clip L2 norm (over the
    model-parallel group, TP duplicates and the tied embedding counted once), clip to ``clip_grad``
    and step; a non-finite norm (or megatron's own inf check in mixed precision) skips the update.
    Returns the norm."""
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    if optimizer.prepare_grads():  # mixed precision found inf/nan while unscaling
        return float("inf")
    grad_norm = float(optimizer.get_grad_norm())
    if not math.isfinite(grad_norm):
        return grad_norm
    for sub in _sub_optimizers(optimizer):
        if getattr(sub, "is_stub_optimizer", False):
            continue
        params = sub.get_parameters()
        if params:
            clip_grad_by_total_norm_fp32(params, max_norm=clip_grad, total_norm=grad_norm)
    optimizer.step_with_ready_grads()
    return grad_norm


def param_groups(optimizer) -> list[dict[str, Any]]:
    """Every param group of the torch optimizers inside megatron's (possibly chained) optimizer."""
    groups: list[dict[str, Any]] = []
    for sub in _sub_optimizers(optimizer):
        inner = getattr(sub, "optimizer", None)
        if inner is not None:
            groups.extend(inner.param_groups)
    return groups


class LRSchedule:
    """``lr = OptimConfig.lr * schedule_fn(config)(step)`` on every param group, like the FSDP engine's
    ``LambdaLR``: the multiplier of step 0 applies at construction, each :meth:`step` advances one."""

    def __init__(self, optimizer, config: OptimConfig):
        self.optimizer = optimizer
        self.peak_lr = config.lr
        self.fn = schedule_fn(config)
        self.last_step = 0
        self._apply()

    def _apply(self) -> None:
        lr = self.peak_lr * self.fn(self.last_step)
        for group in param_groups(self.optimizer):
            group["lr"] = lr

    @property
    def lr(self) -> float:
        return self.peak_lr * self.fn(self.last_step)

    def step(self) -> float:
        self.last_step += 1
        self._apply()
        return self.lr

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_step = int(state["last_step"])
        self._apply()
