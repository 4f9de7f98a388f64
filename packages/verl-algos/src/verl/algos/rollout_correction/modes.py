"""The two operating modes of ``algorithm.rollout_correction`` on a batch, and the checks before Ray.

- Decoupled (``bypass_mode=false``): three policies. The trainer recomputes the old log-probs, then, once
  per batch, compares them with the rollout's: importance weights go into the batch as
  ``rollout_is_weights`` (every policy loss multiplies its per-token loss by them) and rejected tokens
  leave ``response_mask`` (before the advantages, as in verl).
- Bypass (``bypass_mode=true``): two policies. The rollout's log-probs are the old log-probs (no
  old-log-prob pass) and the policy loss is ``bypass_mode``: PPO-clip against pi_rollout (``loss_type=
  ppo_clip``; the ratio already is the IS weight) or REINFORCE with explicit truncated IS weights
  (``loss_type=reinforce``), with rejection applied per micro-batch against the current policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from verl.algos.rollout_correction.config import RolloutCorrectionConfig, rollout_correction_config
from verl.algos.rollout_correction.importance import rollout_is_weights
from verl.algos.rollout_correction.mismatch import offpolicy_metrics
from verl.algos.rollout_correction.rejection import parse_rs_options, rollout_rejection_mask
from verl.core.protocol import DataProto


def check_rollout_correction(cfg: Any) -> None:
    """The interplay of ``algorithm.rollout_correction`` with the rest of the config (its own values are
    checked by its node), before Ray starts (``verl train`` and ``verl config show``)."""
    rc: RolloutCorrectionConfig = cfg.algorithm.rollout_correction
    key = "algorithm.rollout_correction"
    loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if rc.rollout_rs is not None:
        try:
            parse_rs_options(rc.rollout_rs, rc.rollout_rs_threshold)
        except ValueError as exc:
            raise ValueError(f"algorithm.{exc}") from None
    active = rc.bypass_mode or rc.decoupled
    if active and not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        raise ValueError(
            f"{key} needs the rollout engine's log-probs: set actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    if rc.bypass_mode and loss_mode not in ("vanilla", "bypass_mode"):
        raise ValueError(
            f"{key}.bypass_mode=true replaces the policy loss with bypass_mode ({key}.loss_type=ppo_clip or "
            f"reinforce), so actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} would be ignored: set "
            "loss_mode=vanilla, or use decoupled mode (bypass_mode=false) to keep that loss"
        )
    if loss_mode == "bypass_mode" and not rc.bypass_mode:
        raise ValueError(
            "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode treats the old log-probs as the rollout's: "
            f"set {key}.bypass_mode=true (which selects that loss), or pick another loss_mode"
        )
    if rc.bypass_mode and cfg.algorithm.adv_estimator == "optimal_token_baseline":
        raise ValueError(
            f"algorithm.adv_estimator=optimal_token_baseline needs the actor's log-prob pass (pi and sum of pi^2 "
            f"per token), which {key}.bypass_mode=true skips: use decoupled mode (bypass_mode=false)"
        )
    if not rc.bypass_mode and rc.loss_type != "ppo_clip":
        raise ValueError(
            f"{key}.loss_type={rc.loss_type!r} applies in bypass mode only: set {key}.bypass_mode=true, or leave "
            "loss_type=ppo_clip"
        )


def rollout_correction_and_mask(
    train_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_correction: RolloutCorrectionConfig | Mapping[str, Any],
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """(IS weights or None, the mask after rejection, metrics under ``rollout_corr/``) for
    log pi_train vs log pi_rollout; with neither IS nor RS configured only the diagnostics."""
    rc = rollout_correction_config(rollout_correction)
    log_ratio = (train_log_prob - rollout_log_prob).detach()
    metrics: dict[str, float] = {}
    weights = None
    if rc.rollout_is is not None:
        weights, is_metrics = rollout_is_weights(
            log_ratio, response_mask, rc.rollout_is, rc.rollout_is_threshold, rc.rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask
    if rc.rollout_rs is not None:
        mask, rs_metrics = rollout_rejection_mask(log_ratio, response_mask, rc.rollout_rs, rc.rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(offpolicy_metrics(train_log_prob.detach(), rollout_log_prob, response_mask))
    return weights, mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}


def _rollout_log_probs(batch: DataProto) -> torch.Tensor:
    if batch.batch is None or "rollout_log_probs" not in batch.batch.keys():
        raise ValueError(
            "algorithm.rollout_correction needs 'rollout_log_probs' in the batch: set "
            "actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    return batch.batch["rollout_log_probs"]


def apply_decoupled_correction(
    batch: DataProto, rollout_correction: RolloutCorrectionConfig | Mapping[str, Any]
) -> dict[str, float]:
    """Decoupled mode on the driver, after the old-log-prob pass: adds ``rollout_is_weights`` (when
    ``rollout_is`` is set), removes rejected tokens from ``response_mask``; returns the metrics."""
    t = batch.batch
    if "old_log_probs" not in t.keys():
        raise ValueError("decoupled rollout correction needs 'old_log_probs' (the old-log-prob pass) in the batch")
    weights, mask, metrics = rollout_correction_and_mask(
        t["old_log_probs"], _rollout_log_probs(batch), t["response_mask"], rollout_correction
    )
    t["response_mask"] = mask
    if weights is not None:
        t["rollout_is_weights"] = weights
    return metrics


def apply_bypass_mode(batch: DataProto) -> None:
    """Bypass mode: the rollout's log-probs become the old log-probs (the old-log-prob pass is skipped)."""
    batch.batch["old_log_probs"] = _rollout_log_probs(batch).clone()
