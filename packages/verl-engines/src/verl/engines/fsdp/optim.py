"""AdamW and the learning-rate schedules: linear warmup, then constant or cosine decay."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

from verl.engines.optim_config import OptimConfig


def lr_multiplier(
    step: int,
    *,
    warmup_steps: int,
    schedule: str,
    total_steps: int = -1,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
) -> float:
    """The factor applied to the peak lr after ``step`` optimizer steps.

    Warmup rises linearly from 1/warmup to 1 over ``warmup_steps`` (never 0: the first update must
    move the weights). "constant" then stays at 1. "cosine" follows
    ``min + (1 - min) * (1 + cos(2*pi*num_cycles*progress)) / 2`` where progress runs 0 -> 1 from the end
    of warmup to ``total_steps`` and is held at 1 afterwards.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        if total_steps <= 0:
            raise ValueError("the cosine lr schedule needs optim.total_training_steps > 0")
        decay_steps = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        cosine = 0.5 * (1.0 + math.cos(2.0 * math.pi * num_cycles * progress))
        return min_lr_ratio + (1.0 - min_lr_ratio) * cosine
    raise ValueError(f"unknown lr schedule {schedule!r}; use 'constant' or 'cosine'")


def schedule_fn(config: OptimConfig) -> Callable[[int], float]:
    warmup = config.warmup_steps()
    if config.lr_scheduler_type == "cosine" and config.total_training_steps <= 0:
        raise ValueError("optim.lr_scheduler_type='cosine' needs optim.total_training_steps > 0")

    def fn(step: int) -> float:
        return lr_multiplier(
            step,
            warmup_steps=warmup,
            schedule=config.lr_scheduler_type,
            total_steps=config.total_training_steps,
            min_lr_ratio=config.min_lr_ratio,
            num_cycles=config.num_cycles,
        )

    return fn


def build_optimizer(params: Iterable[torch.nn.Parameter], config: OptimConfig) -> torch.optim.AdamW:
    # fused: one kernel pass over each parameter's state instead of ~10 elementwise passes (the step is
    # memory-bound: on CPU it halves the optimizer's share of an update).
    return torch.optim.AdamW(
        [p for p in params if p.requires_grad],
        lr=config.lr,
        betas=(config.betas[0], config.betas[1]),
        eps=config.eps,
        weight_decay=config.weight_decay,
        fused=True,
    )


def build_lr_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig) -> LambdaLR:
    return LambdaLR(optimizer, lr_lambda=schedule_fn(config))
