"""Outcome advantages with other group baselines: RLOO (leave-one-out), OPO (length-weighted), GPG."""

from __future__ import annotations

import torch

from verl.algos.advantages.config import AdvantageConfig
from verl.algos.advantages.registry import EstimatorInputs, register_outcome_estimator


@register_outcome_estimator(["rloo", "rloo_vectorized"])
def compute_rloo_outcome_advantage(x: EstimatorInputs, config: AdvantageConfig, **kw) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs", arXiv:2402.14740).

    The baseline of response i is the mean score of the *other* n-1 responses of its group::

        A_i = s_i - (sum_{j != i} s_j) / (n - 1)  =  n / (n - 1) * (s_i - mean_G(s))

    A group of one response has no other responses: A = s (baseline 0, as in verl's ``rloo``).
    ``rloo_vectorized`` is an alias: verl's vectorized version of the same estimator gives such a
    group A = 0 instead; here both names keep the loop version's A = s.
    """
    adv = x.scores.clone()
    for rows in x.groups:
        n = len(rows)
        if n > 1:
            s = x.scores[rows]
            adv[rows] = (s - s.mean()) * n / (n - 1)
    return adv


@register_outcome_estimator("opo")
def compute_opo_outcome_advantage(x: EstimatorInputs, config: AdvantageConfig, **kw) -> torch.Tensor:
    """OPO (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv:2505.23585).

    The optimal baseline for sequence-level rewards weights each response by its length L_j (valid
    tokens), since the gradient norm grows with length::

        b = sum_j L_j * s_j / sum_j L_j ,     A_i = s_i - b

    A group of one response gets baseline 0 (verl). A group whose responses are all empty has no
    weights; its advantages are zero anyway (no valid tokens).
    """
    lengths = x.mask.sum(dim=-1)
    adv = x.scores.clone()
    for rows in x.groups:
        if len(rows) > 1:
            s, ln = x.scores[rows], lengths[rows]
            baseline = (ln * s).sum() / ln.sum().clamp(min=1)
            adv[rows] = s - baseline
    return adv


@register_outcome_estimator("gpg")
def compute_gpg_outcome_advantage(x: EstimatorInputs, config: AdvantageConfig, **kw) -> torch.Tensor:
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv:2504.02546), with its accurate-gradient-estimation correction.

    Over the batch of B responses, M of which lie in groups whose scores are all equal (they carry
    no signal: their group-relative advantage is 0)::

        A_i = alpha * (s_i - mean_G(s)) / F_norm ,     alpha = B / (B - M)

    alpha rescales the batch-mean gradient so that the useless samples do not dilute it. F_norm is the
    ``f_norm`` keyword argument (the paper's default 1.0, as verl's function; no config key sets it). A group of one response counts as
    all-equal (A = 0). This follows the paper; verl's function computes alpha from the number of
    non-zero rewards instead.
    """
    f_norm = float(kw.get("f_norm", 1.0))
    centered = torch.zeros_like(x.scores)
    invalid = 0
    for rows in x.groups:
        s = x.scores[rows]
        if bool((s == s[0]).all()):
            invalid += len(rows)
            continue
        centered[rows] = s - s.mean()
    total = x.scores.shape[0]
    alpha = total / (total - invalid) if total > invalid else 1.0
    return alpha * centered / f_norm
