"""Clip-Cov and KL-Cov: entropy-preserving PPO variants that act on high-covariance tokens."""

from __future__ import annotations

import torch

from verl.algos.losses.aggregation import LossNormalizer, agg_loss, micro_mean
from verl.algos.masked import masked_mean
from verl.algos.options import option
from verl.algos.policy_losses.registry import apply_is_weights, clip_ratios, register_policy_loss


def _token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-token centered product (A - mean A)(log_prob - mean log_prob), means over valid tokens."""
    lp = log_prob.detach()
    return (advantages - masked_mean(advantages, valid)) * (lp - masked_mean(lp, valid))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    normalizer: LossNormalizer | None = None,
    config=None,
    generator: torch.Generator | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models", arXiv:2505.22617).

    Entropy collapses because of tokens whose log-prob and advantage covary strongly. Among valid
    tokens not already clipped by PPO, those with clip_cov_lb < cov < clip_cov_ub are candidates; a
    random subset of max(1, int(clip_cov_ratio * N_valid)) of them is detached (loss weight 0). The
    rest get the PPO clipped loss max(-A rho, -A clip(rho, 1-low, 1+high)).
    Config ``policy_loss.``: ``clip_cov_ratio`` (2e-4), ``clip_cov_lb`` (1.0), ``clip_cov_ub`` (5.0).
    ``actor/pg_clipfrac`` is the share of detached tokens.
    """
    cov_ratio = float(option(config, "policy_loss.clip_cov_ratio", 0.0002))
    cov_lb = float(option(config, "policy_loss.clip_cov_lb", 1.0))
    cov_ub = float(option(config, "policy_loss.clip_cov_ub", 5.0))
    if cov_ratio <= 0:
        raise ValueError(f"policy_loss.clip_cov_ratio={cov_ratio} must be > 0")
    low, high = clip_ratios(config)
    valid = response_mask.bool()
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    with torch.no_grad():
        cov = _token_covariance(advantages, log_prob, valid)
        clipped_by_ppo = (clipped > unclipped) & valid
        candidates = (cov > cov_lb) & (cov < cov_ub) & valid & ~clipped_by_ppo
        positions = torch.nonzero(candidates)
        budget = max(int(cov_ratio * int(valid.sum())), 1)
        if len(positions) > budget:
            pick = torch.randperm(len(positions), generator=generator, device="cpu")[:budget]
            positions = positions[pick.to(positions.device)]
        keep = torch.ones_like(advantages)
        keep[positions[:, 0], positions[:, 1]] = 0.0
    pg_losses = torch.maximum(unclipped, clipped) * keep
    pg_losses = apply_is_weights(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, normalizer)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": micro_mean(pg_losses, response_mask, loss_agg_mode),
            "actor/pg_clipfrac": float(masked_mean((keep == 0).float(), response_mask)),
            "actor/pg_clipfrac_lower": 0.0,
            "actor/ppo_kl": float(masked_mean(-log_ratio, response_mask)),
        }
    return loss, metrics


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    normalizer: LossNormalizer | None = None,
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617).

    No ratio clipping. The k = max(1, int(kl_cov_ratio * N_valid)) valid tokens with the largest
    covariance (A - mean A)(log_prob - mean log_prob) get a KL penalty::

        l = -A * rho + ppo_kl_coef * |log_prob - old_log_prob|    (top-k tokens)
        l = -A * rho                                               (other tokens)

    Config ``policy_loss.``: ``kl_cov_ratio`` (2e-4), ``ppo_kl_coef`` (0.1, verl's config default). ``actor/ppo_kl`` reports
    the mean |log-ratio|, as verl does.
    """
    kl_ratio = float(option(config, "policy_loss.kl_cov_ratio", 0.0002))
    kl_coef = float(option(config, "policy_loss.ppo_kl_coef", 0.1))
    if kl_ratio <= 0:
        raise ValueError(f"policy_loss.kl_cov_ratio={kl_ratio} must be > 0")
    valid = response_mask.bool()
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    pg_plain = -advantages * ratio
    pg_penalized = pg_plain + kl_coef * log_ratio.abs()
    penalize = torch.zeros_like(valid)
    n_valid = int(valid.sum())
    if n_valid:
        with torch.no_grad():
            # Covariance over the valid tokens only; masked ones can never be selected.
            cov = _token_covariance(advantages, log_prob, valid).masked_fill(~valid, float("-inf"))
            k = max(1, int(n_valid * kl_ratio))
            top = torch.topk(cov.flatten(), k).indices
            penalize.view(-1)[top] = True
    pg_losses = torch.where(penalize, pg_penalized, pg_plain)
    pg_losses = apply_is_weights(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, normalizer)
    with torch.no_grad():
        metrics = {
            "actor/pg_loss": micro_mean(pg_losses, response_mask, loss_agg_mode),
            "actor/pg_clipfrac": 0.0,
            "actor/pg_clipfrac_lower": 0.0,
            "actor/ppo_kl": float(masked_mean(log_ratio.abs(), response_mask)),
        }
    return loss, metrics
