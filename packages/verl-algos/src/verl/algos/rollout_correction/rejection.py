"""Rejection sampling: mask tokens or whole sequences whose divergence between the training and the
rollout policy leaves the configured bounds (a hard trust region, where PPO's clip is a soft one)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from verl.algos.data.masked import as_float_mask, masked_mean
from verl.algos.rollout_correction.importance import SAFETY_BOUND

#: ``rollout_rs`` options: level (token, seq_sum, seq_mean, seq_max) x divergence (k1, k2, k3).
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


@dataclass(frozen=True)
class RejectionRule:
    option: str
    #: k1: bounds on the ratio (compared in log space); k2/k3: lower is None, upper bounds the divergence
    lower: float | None
    upper: float


def _parse_one(option: str, spec: str) -> RejectionRule:
    where = f"rollout_correction.rollout_rs_threshold for {option}"
    if option.endswith("k1"):
        low_text, sep, high_text = spec.partition("_")
        try:
            upper = float(high_text if sep else low_text)
            lower = float(low_text) if sep else 1.0 / upper
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"{where}: {spec!r} is not a ratio bound or 'lower_upper' pair (e.g. 0.5_2.0)") from None
        if lower <= 0 or upper <= 0 or lower > upper:
            raise ValueError(f"{where}: bounds {spec!r} must be positive with lower <= upper")
        return RejectionRule(option, lower, upper)
    if "_" in spec:
        raise ValueError(f"{where}: {spec!r}: a k2/k3 divergence takes one upper bound, not a 'lower_upper' pair")
    try:
        upper = float(spec)
    except ValueError:
        raise ValueError(f"{where}: {spec!r} is not a number") from None
    if upper <= 0:
        raise ValueError(f"{where}: {spec!r} must be > 0")
    return RejectionRule(option, None, upper)


def parse_rs_options(rollout_rs: str, rollout_rs_threshold: str | float | None) -> list[RejectionRule]:
    """verl's ``rollout_rs`` ("token_k1,seq_mean_k3": every listed criterion must pass) and its
    thresholds: one shared, or one per option, comma-separated. A k1 option takes ``lower_upper`` ratio
    bounds (a single value X means 1/X .. X); k2/k3 take one upper bound."""
    options = list(dict.fromkeys(o.strip() for o in str(rollout_rs).split(",") if o.strip()))
    unknown = [o for o in options if o not in RS_OPTIONS]
    if not options or unknown:
        raise ValueError(
            f"rollout_correction.rollout_rs={rollout_rs!r}: unknown option(s) {unknown}; "
            f"choose from {list(RS_OPTIONS)} (comma-separated) or null (off)"
        )
    if rollout_rs_threshold is None:
        raise ValueError(
            f"rollout_correction.rollout_rs={rollout_rs!r} needs rollout_rs_threshold (e.g. 0.5_2.0 for a k1 "
            "option, 0.01 for k2/k3)"
        )
    specs = [s.strip() for s in str(rollout_rs_threshold).split(",") if s.strip()]
    if len(specs) == 1:
        specs = specs * len(options)
    if len(specs) != len(options):
        raise ValueError(
            f"rollout_correction.rollout_rs_threshold={rollout_rs_threshold!r}: give one threshold for all "
            f"options or one per option ({len(options)})"
        )
    return [_parse_one(o, s) for o, s in zip(options, specs, strict=True)]


def _token_divergence(kind: str, log_ratio: torch.Tensor) -> torch.Tensor:
    d = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d.square()
    return torch.exp(d) - 1.0 - d


def _statistic(option: str, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token statistic (sequence levels broadcast their per-sequence value to every token)."""
    level, kind = option.rsplit("_", 1)
    per_token = _token_divergence(kind, log_ratio)
    if level == "token":
        return per_token
    if level == "seq_sum":
        per_seq = (per_token * mask).sum(dim=-1)
    elif level == "seq_mean":
        per_seq = (per_token * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    else:  # seq_max
        per_seq = per_token.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
        per_seq = torch.where(torch.isinf(per_seq), torch.zeros_like(per_seq), per_seq)
    return per_seq.unsqueeze(-1).expand_as(log_ratio)


@torch.no_grad()
def rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str,
    rollout_rs_threshold: str | float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` with the rejected tokens set to 0 (same dtype), and metrics.

    ``log_ratio`` = log pi_train - log pi_rollout (clamped to +-20). Statistics: k1 = -d, k2 = d^2 / 2,
    k3 = exp(d) - 1 - d per token; ``seq_sum``/``seq_mean``/``seq_max`` aggregate them over a sequence's
    valid tokens and reject the whole sequence. A k1 statistic is kept when
    log(lower) <= k1 <= log(upper); k2/k3 when <= upper. Metrics: ``rollout_rs_masked_fraction`` (valid
    tokens rejected), ``rollout_rs_seq_masked_fraction`` (sequences with a rejected token), and per
    option ``rollout_rs_<option>_mean`` (the statistic's mean over valid tokens) and ``_masked_fraction``.
    """
    rules = parse_rs_options(rollout_rs, rollout_rs_threshold)
    mask = as_float_mask(response_mask, log_ratio)
    keep = torch.ones_like(mask, dtype=torch.bool)
    metrics: dict[str, float] = {}
    for rule in rules:
        stat = _statistic(rule.option, log_ratio, mask)
        if rule.lower is not None:  # k1: ratio bounds, in log space
            option_keep = (stat >= math.log(rule.lower)) & (stat <= math.log(rule.upper))
        else:
            option_keep = stat <= rule.upper
        keep &= option_keep
        metrics[f"rollout_rs_{rule.option}_mean"] = float(masked_mean(stat, mask))
        metrics[f"rollout_rs_{rule.option}_masked_fraction"] = float(masked_mean((~option_keep).float(), mask))
    valid = mask.bool()
    rejected = valid & ~keep
    nonempty = valid.any(dim=-1)
    metrics["rollout_rs_masked_fraction"] = float(masked_mean(rejected.float(), mask))
    metrics["rollout_rs_seq_masked_fraction"] = (
        float(rejected.any(dim=-1)[nonempty].float().mean()) if bool(nonempty.any()) else 0.0
    )
    return response_mask.masked_fill(~keep, 0), metrics
