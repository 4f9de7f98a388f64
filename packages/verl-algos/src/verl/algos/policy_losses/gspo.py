"""GSPO: PPO clipping on a sequence-level importance ratio."""

from __future__ import annotations

import logging

import torch

from verl.algos.losses.aggregation import LossNormalizer, agg_loss, micro_mean
from verl.algos.masked import as_float_mask, masked_mean
from verl.algos.policy_losses.registry import apply_is_weights, clip_ratios, register_policy_loss

logger = logging.getLogger(__name__)
_warned_agg_mode = False


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "seq-mean-token-mean",
    normalizer: LossNormalizer | None = None,
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071).

    The importance ratio of response i is the length-normalized sequence likelihood ratio::

        s_i = exp( (1/|y_i|) * sum_t (log_prob_{i,t} - old_log_prob_{i,t}) )

    used per token as s_{i,t} = sg[s_i] * pi_t / sg[pi_t] (same value, the gradient flows through each
    token's log-prob; log clamped at 10), then l = max(-A s, -A clip(s, 1 - low, 1 + high)). The
    objective averages per sequence first, so the aggregation is always ``seq-mean-token-mean``
    (a different ``loss_agg_mode`` is overridden, with a one-time warning).
    Config: ``clip_ratio``/``clip_ratio_low``/``clip_ratio_high`` (the paper uses tiny ranges, e.g. 3e-4/4e-4).
    """
    global _warned_agg_mode
    if loss_agg_mode != "seq-mean-token-mean" and not _warned_agg_mode:
        logger.warning(
            "policy_loss.loss_mode=gspo aggregates with seq-mean-token-mean; ignoring loss_agg_mode=%s", loss_agg_mode
        )
        _warned_agg_mode = True
    low, high = clip_ratios(config)
    mask = as_float_mask(response_mask, log_prob)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(unclipped, clipped)
    pg_losses = apply_is_weights(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean", normalizer)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": micro_mean(pg_losses, response_mask, "seq-mean-token-mean"),
            "actor/pg_clipfrac": float(masked_mean((clipped > unclipped).float(), response_mask)),
            "actor/pg_clipfrac_lower": 0.0,
            "actor/ppo_kl": float(masked_mean(-log_ratio, response_mask)),
        }
    return loss, metrics
