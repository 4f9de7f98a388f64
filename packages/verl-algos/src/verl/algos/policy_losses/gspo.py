"""GSPO: PPO clipping on a sequence-level importance ratio."""

from __future__ import annotations

import torch

from verl.algos.data.masked import as_float_mask
from verl.algos.policy_losses.config import ActorLossConfig
from verl.algos.policy_losses.registry import PolicyLossInputs, TokenLoss, register_token_loss


@register_token_loss("gspo", aggregation="seq-mean-token-mean")
def compute_policy_loss_gspo(x: PolicyLossInputs, config: ActorLossConfig) -> TokenLoss:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071).

    The importance ratio of response i is the length-normalized sequence likelihood ratio::

        s_i = exp( (1/|y_i|) * sum_t (log_prob_{i,t} - old_log_prob_{i,t}) )

    used per token as s_{i,t} = sg[s_i] * pi_t / sg[pi_t] (same value, the gradient flows through each
    token's log-prob; log clamped at 10), then l = max(-A s, -A clip(s, 1 - low, 1 + high)). The
    objective averages per sequence first, so the aggregation is always ``seq-mean-token-mean``
    (a different ``loss_agg_mode`` is overridden, with a one-time warning).

    Config: ``clip_ratio``/``clip_ratio_low``/``clip_ratio_high`` (the paper uses tiny ranges, e.g. 3e-4/4e-4).
    """
    low, high = config.clip_ratios
    mask = as_float_mask(x.response_mask, x.log_prob)
    log_ratio = x.log_prob - x.old_log_prob
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    token_log_ratio = x.log_prob - x.log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))
    unclipped = -x.advantages * ratio
    clipped = -x.advantages * torch.clamp(ratio, 1 - low, 1 + high)
    return TokenLoss(pg_losses=torch.maximum(unclipped, clipped), clipped=clipped > unclipped, kl=-log_ratio)
