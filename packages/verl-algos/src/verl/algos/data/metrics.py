"""Batch-level metrics under verl's names."""

from __future__ import annotations

import torch

from verl.algos.data.fields import response_mask_of
from verl.algos.data.masked import masked_var
from verl.core.protocol import DataProto


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def compute_data_metrics(data: DataProto, use_critic: bool = False) -> dict[str, float]:
    """verl's per-step data metrics: ``critic/score/*`` (sequence sums of token_level_scores),
    ``critic/rewards/*``, ``critic/advantages/*`` and ``critic/returns/*`` (over valid tokens),
    ``critic/values/*`` and ``critic/vf_explained_var`` (with a critic), ``response_length/*`` with
    ``clip_ratio`` (share of responses that hit the length limit) and ``prompt_length/*``."""
    batch = data.batch
    keys = set(batch.keys())
    mask = response_mask_of(data).bool()
    metrics: dict[str, float] = {}
    if "token_level_scores" in keys:
        metrics.update(_stats("critic/score", batch["token_level_scores"].sum(-1)))
    if "token_level_rewards" in keys:
        metrics.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)))
    for key in ("advantages", "returns"):
        if key in keys:
            metrics.update(_stats(f"critic/{key}", batch[key][mask]))
    if use_critic and "values" in keys:
        values = batch["values"]
        metrics.update(_stats("critic/values", values[mask]))
        if "returns" in keys:
            returns = batch["returns"]
            residual_var = masked_var(returns - values, mask)
            return_var = masked_var(returns, mask)
            metrics["critic/vf_explained_var"] = float(1.0 - residual_var / (return_var + 1e-5))
    lengths = mask.sum(-1).float()
    max_len = mask.shape[-1]
    metrics.update(_stats("response_length", lengths))
    metrics["response_length/clip_ratio"] = float((lengths >= max_len).float().mean())
    if "attention_mask" in keys and "responses" in keys:
        prompt_mask = batch["attention_mask"][:, : -batch["responses"].shape[1]]
        prompt_lengths = prompt_mask.sum(-1).float()
        metrics.update(_stats("prompt_length", prompt_lengths))
        metrics["prompt_length/clip_ratio"] = float((prompt_lengths >= prompt_mask.shape[-1]).float().mean())
    return metrics


__all__ = ["compute_data_metrics"]


def rollout_mismatch_metrics(
    rollout_log_probs: torch.Tensor, train_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout engine's log-probs are from the training engine's on the same tokens
    (engine numerics, precision, sampling tweaks): large values make PPO's ratio off-policy."""
    mask = response_mask.bool()
    if not mask.any():
        return {}
    rollout, train = rollout_log_probs[mask], train_log_probs[mask]
    diff = (rollout - train).abs()
    prob_diff = (rollout.exp() - train.exp()).abs()
    return {
        "training/rollout_log_prob_diff_mean": float(diff.mean()),
        "training/rollout_log_prob_diff_max": float(diff.max()),
        "training/rollout_probs_diff_mean": float(prob_diff.mean()),
        "training/rollout_probs_diff_max": float(prob_diff.max()),
    }
