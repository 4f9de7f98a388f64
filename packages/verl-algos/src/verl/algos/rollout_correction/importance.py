"""Truncated importance-sampling weights pi_train / pi_rollout, per token or per sequence."""

from __future__ import annotations

import torch

from verl.algos.data.masked import as_float_mask, masked_mean

#: |log-ratio| bound before exponentiating (exp(20) ~ 5e8), as in verl.
SAFETY_BOUND = 20.0
IS_LEVELS = ("token", "sequence")


def _global_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean over every data-parallel rank (all-reduce of sum and count when distributed)."""
    stats = torch.stack([(values * weights).sum(), weights.sum()]).double()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(stats)
    return (stats[0] / stats[1].clamp(min=1e-8)).to(values.dtype)


@torch.no_grad()
def rollout_is_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    threshold: float,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated IS weights (TIS) from ``log_ratio`` = log pi_train - log pi_rollout, [batch, length].

    - ``token``:    w_t = min(exp(d_t), threshold)                  (biased, low variance)
    - ``sequence``: w_i = min(exp(sum_t d_t), threshold) on every token of i   (unbiased before truncation)

    Log-ratios are clamped to +-20 before exp. Weights are 0 outside the mask and carry no gradient.
    ``batch_normalize`` rescales them to mean 1 (over valid tokens for token level, over non-empty
    sequences for sequence level; over all data-parallel ranks when distributed).
    Metrics (of the weights before truncation): ``rollout_is_mean``/``_max``/``_min``,
    ``rollout_is_ratio_fraction_high`` (> threshold), ``_fraction_low`` (< 1/threshold), and
    ``rollout_is_eff_sample_size`` = 1 / mean((w / mean w)^2) of the truncated weights.
    """
    if level not in IS_LEVELS:
        raise ValueError(f"rollout_correction.rollout_is={level!r}: choose one of {list(IS_LEVELS)} or null (off)")
    if not threshold > 0:
        raise ValueError(f"rollout_correction.rollout_is_threshold={threshold} must be > 0")
    mask = as_float_mask(response_mask, log_ratio)
    if level == "token":
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        seq_log_ratio = (log_ratio * mask).sum(dim=-1, keepdim=True)
        raw = torch.exp(seq_log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * mask
    valid = mask.bool()
    weights = raw.clamp(max=threshold)
    metrics = {
        "rollout_is_mean": float(masked_mean(raw, mask)),
        "rollout_is_max": float(raw[valid].max()) if valid.any() else 0.0,
        "rollout_is_min": float(raw[valid].min()) if valid.any() else 0.0,
        "rollout_is_ratio_fraction_high": float(masked_mean((raw > threshold).float(), mask)),
        "rollout_is_ratio_fraction_low": float(masked_mean((raw < 1.0 / threshold).float(), mask)),
    }
    mean_w = masked_mean(weights, mask)
    second = masked_mean((weights / mean_w.clamp(min=1e-8)).square(), mask)
    metrics["rollout_is_eff_sample_size"] = float(1.0 / second) if valid.any() else 0.0
    if batch_normalize:
        if level == "token":
            norm = _global_mean(weights, mask)
        else:
            nonempty = (mask.sum(dim=-1) > 0).to(weights.dtype)
            norm = _global_mean(weights.max(dim=-1).values, nonempty)
        if norm > 1e-8:
            weights = weights / norm
        metrics["rollout_is_batch_norm_factor"] = float(norm) if norm > 1e-8 else 1.0
    return weights.detach(), metrics
