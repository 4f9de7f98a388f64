"""Rollout-correction bypass mode (``algorithm.rollout_correction.bypass_mode=true``): the old log-probs
are the rollout engine's, and the loss is PPO-clip or REINFORCE against them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from verl.algos.losses.aggregation import LossNormalizer
from verl.algos.policy_losses.config import ActorLossConfig
from verl.algos.policy_losses.ppo import vanilla_token_loss
from verl.algos.policy_losses.registry import (
    Aggregation,
    PolicyLossInputs,
    TokenLoss,
    finish_token_loss,
    register_aggregating_loss,
)
from verl.algos.rollout_correction.config import RolloutCorrectionConfig, rollout_correction_config


@register_aggregating_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    inputs: PolicyLossInputs,
    config: ActorLossConfig,
    aggregation: Aggregation,
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
    normalizer = aggregation.normalizer or LossNormalizer.from_mask(inputs.response_mask)
    weights, kept_mask, corr_metrics = rollout_correction_and_mask(
        inputs.log_prob, inputs.old_log_prob, inputs.response_mask, correction
    )
    kept = dataclasses.replace(inputs, response_mask=kept_mask)
    if correction.loss_type == "reinforce":
        # l = -sg[w] * A * log pi_theta on the kept tokens (no ratio, no clip); actor/ppo_kl is the mean of
        # log pi_rollout - log pi_theta
        reinforce = TokenLoss(pg_losses=-kept.advantages * kept.log_prob)
        loss, metrics = finish_token_loss(reinforce, kept, aggregation.mode, normalizer, weights)
    else:  # ppo_clip (the config's Literal allows no other): the ratio is the correction, no weights
        loss, metrics = finish_token_loss(vanilla_token_loss(kept, config), kept, aggregation.mode, normalizer, None)
    metrics.update(corr_metrics)
    return loss, metrics
