"""Rollout-correction bypass mode (``algorithm.rollout_correction.bypass_mode=true``): the old log-probs
are the rollout engine's, and the loss is PPO-clip or REINFORCE against them."""

from __future__ import annotations

from typing import Any

import torch

from verl.algos.losses.aggregation import LossNormalizer, agg_loss, micro_mean
from verl.algos.masked import masked_mean
from verl.algos.options import option
from verl.algos.policy_losses.ppo import compute_policy_loss_vanilla
from verl.algos.policy_losses.registry import apply_is_weights, register_policy_loss


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    normalizer: LossNormalizer | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE with optional importance weights, no ratio and no clip::

        l = -sg[w] * A * log_prob        (w = truncated pi_theta / pi_rollout; 1 without IS)

    ``actor/ppo_kl`` is the mean of log pi_rollout - log pi_theta."""
    pg_losses = apply_is_weights(-advantages * log_prob, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, normalizer)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": micro_mean(pg_losses, response_mask, loss_agg_mode),
            "actor/pg_clipfrac": 0.0,
            "actor/pg_clipfrac_lower": 0.0,
            "actor/ppo_kl": float(masked_mean(rollout_log_prob - log_prob, response_mask)),
        }
    return loss, metrics


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    normalizer: LossNormalizer | None = None,
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
    rollout_correction: Any = None,
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

    loss_type = option(rollout_correction, "loss_type", "ppo_clip")
    # rejected tokens keep their place in the denominator, with or without a global normalizer
    normalizer = normalizer or LossNormalizer.from_mask(response_mask)
    weights, kept_mask, corr_metrics = rollout_correction_and_mask(
        log_prob, old_log_prob, response_mask, rollout_correction
    )
    if loss_type == "reinforce":
        loss, metrics = compute_policy_loss_reinforce(
            old_log_prob,
            log_prob,
            advantages,
            kept_mask,
            loss_agg_mode=loss_agg_mode,
            normalizer=normalizer,
            rollout_is_weights=weights,
        )
    elif loss_type == "ppo_clip":
        loss, metrics = compute_policy_loss_vanilla(
            old_log_prob,
            log_prob,
            advantages,
            kept_mask,
            loss_agg_mode=loss_agg_mode,
            normalizer=normalizer,
            config=config,
        )
    else:
        raise ValueError(
            f"algorithm.rollout_correction.loss_type={loss_type!r}: choose ppo_clip or reinforce for bypass mode"
        )
    metrics.update(corr_metrics)
    return loss, metrics
