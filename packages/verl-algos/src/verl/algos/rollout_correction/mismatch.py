"""Off-policy diagnostics between the training policy's and the rollout engine's log-probs."""

from __future__ import annotations

import torch

from verl.algos.data.masked import as_float_mask, masked_mean
from verl.algos.rollout_correction.importance import SAFETY_BOUND


@torch.no_grad()
def offpolicy_metrics(
    train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """verl's rollout-correction diagnostics (keys without the ``rollout_corr/`` prefix), with
    d = log pi_train - log pi_rollout per token:

    - ``kl``: mean of -d (KL(rollout || train), k1); ``k3_kl``: mean of exp(d) - d - 1;
    - ``training_ppl`` / ``rollout_ppl``: mean over sequences of exp(-mean_t log pi); ``*_log_ppl`` the
      same without the exp; ``log_ppl_diff`` (mean, abs mean, max, min): per-sequence difference of the
      rollout and training mean log-probs; ``ppl_ratio``: mean of its exp;
    - ``chi2_token``: mean_t exp(d)^2 - 1; ``chi2_seq``: mean_i (prod_t exp(d_t))^2 - 1 (log of the product clamped to +-20).

    Token means are over valid tokens, sequence means over non-empty sequences (0 when there are none).
    """
    mask = as_float_mask(response_mask, train_log_prob)
    nonempty = mask.sum(dim=-1) > 0
    if not bool(nonempty.any()):
        return {}
    d = train_log_prob - rollout_log_prob
    lengths = mask.sum(dim=-1).clamp(min=1)
    train_mean = (train_log_prob * mask).sum(dim=-1)[nonempty] / lengths[nonempty]
    rollout_mean = (rollout_log_prob * mask).sum(dim=-1)[nonempty] / lengths[nonempty]
    log_ppl_diff = rollout_mean - train_mean
    d_safe = d.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_sum = (d * mask).sum(dim=-1)[nonempty].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "kl": float(masked_mean(-d, mask)),
        "k3_kl": float(masked_mean(torch.exp(d_safe) - d_safe - 1, mask)),
        "training_ppl": float(torch.exp(-train_mean).mean()),
        "training_log_ppl": float((-train_mean).mean()),
        "rollout_ppl": float(torch.exp(-rollout_mean).mean()),
        "rollout_log_ppl": float((-rollout_mean).mean()),
        "log_ppl_diff": float(log_ppl_diff.mean()),
        "log_ppl_abs_diff": float(log_ppl_diff.abs().mean()),
        "log_ppl_diff_max": float(log_ppl_diff.max()),
        "log_ppl_diff_min": float(log_ppl_diff.min()),
        "ppl_ratio": float(torch.exp(log_ppl_diff).mean()),
        "chi2_token": float(masked_mean(torch.exp(d_safe).square(), mask) - 1.0),
        "chi2_seq": float(torch.exp(2.0 * seq_sum).mean() - 1.0),
    }
