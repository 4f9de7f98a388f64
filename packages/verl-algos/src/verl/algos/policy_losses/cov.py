"""Clip-Cov and KL-Cov: entropy-preserving PPO variants that act on high-covariance tokens."""

from __future__ import annotations

import torch

from verl.algos.data.masked import masked_mean
from verl.algos.policy_losses.config import ActorLossConfig
from verl.algos.policy_losses.registry import PolicyLossInputs, TokenLoss, register_token_loss


def _token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-token centered product (A - mean A)(log_prob - mean log_prob), means over valid tokens."""
    lp = log_prob.detach()
    return (advantages - masked_mean(advantages, valid)) * (lp - masked_mean(lp, valid))


@register_token_loss("clip_cov")
def compute_policy_loss_clip_cov(
    x: PolicyLossInputs, config: ActorLossConfig, generator: torch.Generator | None = None
) -> TokenLoss:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models", arXiv:2505.22617).

    Entropy collapses because of tokens whose log-prob and advantage covary strongly. Among valid
    tokens not already clipped by PPO, those with clip_cov_lb < cov < clip_cov_ub are candidates; a
    random subset of max(1, int(clip_cov_ratio * N_valid)) of them is detached (loss weight 0). The
    rest get the PPO clipped loss max(-A rho, -A clip(rho, 1-low, 1+high)).

    Config ``policy_loss.``: ``clip_cov_ratio`` (2e-4), ``clip_cov_lb`` (1.0), ``clip_cov_ub`` (5.0).
    ``actor/pg_clipfrac`` is the share of detached tokens.
    """
    options = config.policy_loss
    low, high = config.clip_ratios
    valid = x.response_mask.bool()
    ratio = torch.exp(x.log_prob - x.old_log_prob)  # unclamped, as verl's clip_cov
    unclipped = -x.advantages * ratio
    clipped = -x.advantages * torch.clamp(ratio, 1 - low, 1 + high)
    with torch.no_grad():
        cov = _token_covariance(x.advantages, x.log_prob, valid)
        clipped_by_ppo = (clipped > unclipped) & valid
        candidates = (cov > options.clip_cov_lb) & (cov < options.clip_cov_ub) & valid & ~clipped_by_ppo
        positions = torch.nonzero(candidates)
        budget = max(int(options.clip_cov_ratio * int(valid.sum())), 1)
        if len(positions) > budget:
            pick = torch.randperm(len(positions), generator=generator, device="cpu")[:budget]
            positions = positions[pick.to(positions.device)]
        keep = torch.ones_like(x.advantages)
        keep[positions[:, 0], positions[:, 1]] = 0.0
    return TokenLoss(pg_losses=torch.maximum(unclipped, clipped) * keep, clipped=keep == 0)


@register_token_loss("kl_cov")
def compute_policy_loss_kl_cov(x: PolicyLossInputs, config: ActorLossConfig) -> TokenLoss:
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617).

    No ratio clipping. The k = max(1, int(kl_cov_ratio * N_valid)) valid tokens with the largest
    covariance (A - mean A)(log_prob - mean log_prob) get a KL penalty::

        l = -A * rho + ppo_kl_coef * |log_prob - old_log_prob|    (top-k tokens)
        l = -A * rho                                               (other tokens)

    Config ``policy_loss.``: ``kl_cov_ratio`` (2e-4), ``ppo_kl_coef`` (0.1, verl's config default). ``actor/ppo_kl`` reports
    the mean |log-ratio|, as verl does.
    """
    options = config.policy_loss
    valid = x.response_mask.bool()
    log_ratio = x.log_prob - x.old_log_prob  # unclamped, as verl's kl_cov
    pg_plain = -x.advantages * torch.exp(log_ratio)
    pg_penalized = pg_plain + options.ppo_kl_coef * log_ratio.abs()
    penalize = torch.zeros_like(valid)
    n_valid = int(valid.sum())
    if n_valid:
        with torch.no_grad():
            # Covariance over the valid tokens only; masked ones can never be selected.
            cov = _token_covariance(x.advantages, x.log_prob, valid).masked_fill(~valid, float("-inf"))
            k = max(1, int(n_valid * options.kl_cov_ratio))
            top = torch.topk(cov.flatten(), k).indices
            penalize.view(-1)[top] = True
    return TokenLoss(pg_losses=torch.where(penalize, pg_penalized, pg_plain), kl=log_ratio.abs())
