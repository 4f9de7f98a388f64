"""The optimizer of a training engine: AdamW, gradient clipping and the learning-rate schedule.

This one class is the ``optim`` node of every training role in the run config (``actor_rollout_ref.actor.
optim``, ``critic.optim``, SFT's ``optim``), under verl's key names, and what the engine builds its
optimizer from: the object the command line sets is the object the engine reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from verl.core.checks import check_literals, check_positive, check_range


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule (verl: ``<role>.optim``)."""

    lr: float = 1e-6
    #: Warmup length in optimizer steps; -1: ``lr_warmup_steps_ratio * total_training_steps``.
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    #: After warmup: "constant", or "cosine" (decays to ``min_lr_ratio * lr`` at ``total_training_steps``).
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = 0.0
    #: Cosine half-periods over the decay: 0.5 is one half cosine, from lr down to the minimum.
    num_cycles: float = 0.5
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    #: Gradient clipping: the largest global L2 norm (verl: ``optim.clip_grad``, or the role's ``grad_clip``).
    clip_grad: float = 1.0
    #: The run's optimizer steps, for the cosine schedule and the warmup ratio. -1: the trainer sets it from
    #: the run's length before any worker starts (:meth:`fill_total_training_steps`), the one field written
    #: after the config is built.
    total_training_steps: int = -1

    def __post_init__(self) -> None:
        check_positive("lr", self.lr)
        check_literals(self)
        check_range("lr_warmup_steps_ratio", self.lr_warmup_steps_ratio, 0.0, 1.0)
        check_range("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check_positive("weight_decay", self.weight_decay, allow_zero=True)
        check_positive("eps", self.eps)
        check_positive("clip_grad", self.clip_grad)
        if len(self.betas) != 2:
            raise ValueError(f"betas={list(self.betas)!r} must be two numbers, e.g. [0.9, 0.999]")
        if not all(0.0 <= beta < 1.0 for beta in self.betas):
            raise ValueError(f"betas={list(self.betas)!r} must each be in [0, 1)")

    def fill_total_training_steps(self, steps: int) -> None:
        """Set ``total_training_steps`` to the run's length when the user left it at -1."""
        if self.total_training_steps < 0:
            self.total_training_steps = steps

    def warmup_steps(self) -> int:
        if self.lr_warmup_steps >= 0:
            return self.lr_warmup_steps
        if self.lr_warmup_steps_ratio > 0:
            if self.total_training_steps <= 0:
                raise ValueError(
                    "optim.lr_warmup_steps_ratio needs optim.total_training_steps (> 0); "
                    "set it, or give optim.lr_warmup_steps directly"
                )
            return int(self.lr_warmup_steps_ratio * self.total_training_steps)
        return 0
