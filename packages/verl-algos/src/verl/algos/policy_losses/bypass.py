"""Rollout-correction bypass mode (``algorithm.rollout_correction.bypass_mode=true``): the old log-probs
are the rollout engine's, and the loss is PPO-clip or REINFORCE against them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from verl.algos.losses.aggregation import LossNormalizer
from verl.algos.policy_losses.config import ActorLossConfig
from verl.algos.policy_losses.ppo import compute_policy_loss_vanilla
from verl.algos.policy_losses.registry import PolicyLossInputs, TokenLoss, finish_token_loss, register_policy_loss
from verl.algos.rollout_correction.config import RolloutCorrectionConfig, rollout_correction_config


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    normalizer: LossNormalizer | None = None,
    config: ActorLossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    rollout_correction: RolloutCorrectionConfig | Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's bypass-mode loss. ``old_log_prob`` *is* the rollout's log-probs here (the trainer put
    them there). Per micro-batch, against the current policy pi_theta (detached):

    1. IS weights w = pi_theta / pi_rollout (``rollout_is`` token or sequence, truncated at
       ``rollout_is_threshold``, optionally batch-normalized) and the rejection mask (``rollout_rs``,
       ``rollout_rs_threshold``), see :mod:`verl.algos.rollout_correction`;
    2. ``loss_type=ppo_clip``: the vanilla PPO loss with ratio pi_theta / pi_rollout on the kept tokens
       (the ratio is the IS correction, so no weights are applied, which would count it twice);
       ``loss_type=reinforce``: l = -sg[w] A log pi_theta on the kept tokens.

    Rejected tokens stay in the global normalizer (they contribute 0), so the loss does not depend on how
    the mini-batch is split. ``rollout_correction``: the ``algorithm.rollout_correction`` section;
    ``rollout_is_weights`` (decoupled mode's) is ignored. Reports the ``rollout_corr/*`` metrics.
    """
    from verl.algos.rollout_correction.modes import rollout_correction_and_mask

    correction = rollout_correction_config(rollout_correction)
    # rejected tokens keep their place in the denominator, with or without a global normalizer
    normalizer = normalizer or LossNormalizer.from_mask(response_mask)
    weights, kept_mask, corr_metrics = rollout_correction_and_mask(log_prob, old_log_prob, response_mask, correction)
    if correction.loss_type == "reinforce":
        # l = -sg[w] * A * log pi_theta on the kept tokens (no ratio, no clip); actor/ppo_kl is the mean of
        # log pi_rollout - log pi_theta
        inputs = PolicyLossInputs(old_log_prob, log_prob, advantages, kept_mask)
        reinforce = TokenLoss(pg_losses=-advantages * log_prob)
        loss, metrics = finish_token_loss(reinforce, inputs, loss_agg_mode, normalizer, weights)
    else:  # ppo_clip (the config's Literal allows no other)
        loss, metrics = compute_policy_loss_vanilla(
            old_log_prob,
            log_prob,
            advantages,
            kept_mask,
            loss_agg_mode=loss_agg_mode,
            normalizer=normalizer,
            config=config,
        )
    metrics.update(corr_metrics)
    return loss, metrics
