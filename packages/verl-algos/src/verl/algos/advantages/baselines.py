"""Outcome advantages with other group baselines: RLOO (leave-one-out), OPO (length-weighted), GPG."""

from __future__ import annotations

import torch

from verl.algos.advantages.registry import register_adv_estimator
from verl.algos.masked import as_float_mask, group_rows


@register_adv_estimator(["rloo", "rloo_vectorized"], needs=("index",))
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index=None,
    values=None,
    config=None,
    **kw,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs", arXiv:2402.14740).

    The baseline of response i is the mean score of the *other* n-1 responses of its group::

        A_i = s_i - (sum_{j != i} s_j) / (n - 1)  =  n / (n - 1) * (s_i - mean_G(s))

    A group of one response has no other responses: A = s (baseline 0, as in verl's ``rloo``).
    ``rloo_vectorized`` is an alias: verl's vectorized version of the same estimator gives such a
    group A = 0 instead; here both names keep the loop version's A = s.
    """
    scores = token_level_rewards.sum(dim=-1)
    adv = scores.clone()
    for rows in group_rows(index).values():
        n = len(rows)
        if n > 1:
            s = scores[rows]
            adv[rows] = (s - s.mean()) * n / (n - 1)
    adv = adv.unsqueeze(-1) * as_float_mask(response_mask, token_level_rewards)
    return adv, adv


@register_adv_estimator("opo", needs=("index",))
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index=None,
    values=None,
    config=None,
    **kw,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv:2505.23585).

    The optimal baseline for sequence-level rewards weights each response by its length L_j (valid
    tokens), since the gradient norm grows with length::

        b = sum_j L_j * s_j / sum_j L_j ,     A_i = s_i - b

    A group of one response gets baseline 0 (verl). A group whose responses are all empty has no
    weights; its advantages are zero anyway (no valid tokens).
    """
    mask = as_float_mask(response_mask, token_level_rewards)
    lengths = mask.sum(dim=-1)
    scores = token_level_rewards.sum(dim=-1)
    adv = scores.clone()
    for rows in group_rows(index).values():
        if len(rows) > 1:
            s, ln = scores[rows], lengths[rows]
            baseline = (ln * s).sum() / ln.sum().clamp(min=1)
            adv[rows] = s - baseline
    adv = adv.unsqueeze(-1) * mask
    return adv, adv


@register_adv_estimator("gpg", needs=("index",))
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index=None,
    values=None,
    config=None,
    **kw,
) -> tuple[torch.Tensor, torch.Tensor]:
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
    scores = token_level_rewards.sum(dim=-1)
    centered = torch.zeros_like(scores)
    invalid = 0
    for rows in group_rows(index).values():
        s = scores[rows]
        if bool((s == s[0]).all()):
            invalid += len(rows)
            continue
        centered[rows] = s - s.mean()
    total = scores.shape[0]
    alpha = total / (total - invalid) if total > invalid else 1.0
    adv = (alpha * centered / f_norm).unsqueeze(-1) * as_float_mask(response_mask, token_level_rewards)
    return adv, adv
