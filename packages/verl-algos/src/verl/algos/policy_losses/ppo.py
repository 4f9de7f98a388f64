"""The PPO clipped objective (with DAPO's asymmetric clip and dual-clip) and GPG's plain policy gradient."""

from __future__ import annotations

import torch

from verl.algos.policy_losses.config import ActorLossConfig
from verl.algos.policy_losses.registry import PolicyLossInputs, TokenLoss, register_token_loss


def vanilla_token_loss(x: PolicyLossInputs, config: ActorLossConfig) -> TokenLoss:
    """PPO-clip (Schulman et al. 2017, arXiv:1707.06347) with decoupled clip ranges (DAPO's
    clip-higher, Yu et al. 2025, arXiv:2503.14476) and dual-clip (Ye et al. 2020, arXiv:1912.09729).

    Per token, with ratio rho = exp(log_prob - old_log_prob) (log-ratio clamped to +-20)::

        l = max(-A * rho, -A * clip(rho, 1 - clip_ratio_low, 1 + clip_ratio_high))
        if A < 0:  l = min(l, -A * clip_ratio_c)          (dual-clip bounds the loss of bad actions)

    Metrics: ``actor/pg_clipfrac`` (share of tokens where the clipped term is the max),
    ``actor/pg_clipfrac_lower`` (share where dual-clip binds), ``actor/ppo_kl`` (mean of
    old_log_prob - log_prob). Config: ``clip_ratio`` (0.2), ``clip_ratio_low``, ``clip_ratio_high``,
    ``clip_ratio_c`` (3.0, must exceed 1).
    """
    low, high = config.clip_ratios
    clip_c = config.clip_ratio_c
    if clip_c <= 1.0:
        raise ValueError(f"clip_ratio_c={clip_c}: the dual-clip bound must be greater than 1.0 (verl's default is 3.0)")
    unclipped = -x.advantages * x.ratio
    clipped = -x.advantages * torch.clamp(x.ratio, 1 - low, 1 + high)
    clip_max = torch.maximum(unclipped, clipped)
    dual = -x.advantages * clip_c
    negative = x.advantages < 0
    return TokenLoss(
        pg_losses=torch.where(negative, torch.minimum(clip_max, dual), clip_max),
        clipped=clipped > unclipped,
        clipped_lower=(clip_max > dual) & negative,
        kl=-x.log_ratio,
    )


compute_policy_loss_vanilla = register_token_loss("vanilla")(vanilla_token_loss)


@register_token_loss("gpg")
def compute_policy_loss_gpg(x: PolicyLossInputs, config: ActorLossConfig) -> TokenLoss:
    """GPG (Chu et al. 2025, arXiv:2504.02546): the plain policy gradient, no ratio and no clipping::

        l = -A * log_prob

    Pair it with ``adv_estimator=gpg``. Clip metrics are 0; ``actor/ppo_kl`` is still reported.
    """
    return TokenLoss(pg_losses=-x.advantages * x.log_prob)
