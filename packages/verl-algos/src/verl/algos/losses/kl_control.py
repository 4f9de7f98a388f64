"""KL penalty in the reward (``algorithm.use_kl_in_reward``) and its coefficient controllers
(``algorithm.kl_ctrl.type``: fixed or adaptive)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from verl.algos.data.fields import response_mask_of
from verl.algos.data.masked import masked_mean
from verl.algos.losses.kl import kl_penalty
from verl.core.checks import check_literals, check_positive
from verl.core.config import as_node
from verl.core.protocol import DataProto
from verl.core.registry import Registry


@dataclass
class KLControlConfig:
    """verl's ``algorithm.kl_ctrl``: the coefficient of the KL penalty in the reward."""

    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = 0.001
    #: Adaptive: samples over which the coefficient moves toward ``target_kl``.
    horizon: int = 10000
    target_kl: float = 0.1

    def __post_init__(self) -> None:
        check_literals(self)
        check_positive("kl_coef", self.kl_coef, allow_zero=True)
        check_positive("horizon", self.horizon)
        check_positive("target_kl", self.target_kl)


#: ``algorithm.kl_ctrl.type`` -> controller class, built from the kl_ctrl config.
KL_CONTROLLERS: Registry[type] = Registry("KL controller")


@KL_CONTROLLERS.register("fixed")
class FixedKLController:
    """beta stays ``kl_coef``."""

    def __init__(self, kl_coef: float = 0.001, **_: Any):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


@KL_CONTROLLERS.register("adaptive")
class AdaptiveKLController:
    """Proportional controller of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human
    Preferences", arXiv:1909.08593)::

        e = clip(KL / target_kl - 1, -0.2, 0.2) ;   beta <- beta * (1 + e * n_steps / horizon)

    ``n_steps`` is the number of samples in the batch just seen.
    """

    def __init__(self, kl_coef: float = 0.001, target_kl: float = 0.1, horizon: int = 10000, **_: Any):
        if horizon is None or horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon={horizon} must be > 0 for the adaptive controller")
        if target_kl is None or target_kl <= 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl={target_kl} must be > 0 for the adaptive controller")
        self.value = float(kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + error * n_steps / self.horizon


def build_kl_controller(kl_ctrl: KLControlConfig | Mapping[str, Any] | None = None):
    """A controller from the ``algorithm.kl_ctrl`` config (type, kl_coef, target_kl, horizon)."""
    config = as_node(KLControlConfig, kl_ctrl, "algorithm.kl_ctrl")
    cls = KL_CONTROLLERS.get(config.type)
    return cls(kl_coef=config.kl_coef, target_kl=config.target_kl, horizon=config.horizon)


def apply_kl_penalty(data: DataProto, kl_ctrl, kl_penalty_type: str = "kl") -> tuple[DataProto, dict[str, float]]:
    """token_level_rewards = token_level_scores - beta * KL(old_log_probs || ref_log_prob) per valid
    token, then the controller sees the batch's mean sequence KL.

    Reads ``token_level_scores``, ``old_log_probs``, ``ref_log_prob``, ``response_mask``; writes
    ``token_level_rewards``. Metrics: ``actor/reward_kl_penalty`` (mean over sequences of each
    sequence's mean token KL) and ``actor/reward_kl_penalty_coeff`` (the beta used).
    (Without ``use_kl_in_reward`` the trainer copies token_level_scores to token_level_rewards.)
    """
    batch = data.batch
    for key in ("token_level_scores", "old_log_probs", "ref_log_prob"):
        if batch is None or key not in batch.keys():
            raise ValueError(f"apply_kl_penalty needs {key!r} in the batch (fields: {data.keys()})")
    mask = response_mask_of(data).to(batch["token_level_scores"].dtype)
    kld = kl_penalty(batch["old_log_probs"], batch["ref_log_prob"], kl_penalty_type) * mask
    beta = kl_ctrl.value
    batch["token_level_rewards"] = batch["token_level_scores"] - beta * kld
    current_kl = float(torch.mean(masked_mean(kld, mask, dim=-1)))
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
