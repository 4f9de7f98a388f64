"""Rollout correction (``algorithm.rollout_correction``): the rollout engine samples from pi_rollout
(another kernel, dtype or a stale copy of the weights), the trainer optimizes pi_theta. verl's knobs:

- ``rollout_is`` (null | token | sequence) and ``rollout_is_threshold``: truncated importance weights
  pi_train / pi_rollout that multiply the per-token policy loss (:mod:`.importance`);
- ``rollout_rs`` (token_k1, seq_mean_k3, ... comma-separated) and ``rollout_rs_threshold``: rejection of
  tokens or whole sequences whose divergence leaves the bounds (:mod:`.rejection`);
- ``bypass_mode``: use the rollout's log-probs as the old log-probs (two policies, no old-log-prob pass)
  with the ``bypass_mode`` loss of ``loss_type`` ppo_clip or reinforce; off: decoupled mode, where the
  weights and the mask are computed once per batch against the recomputed old log-probs (:mod:`.modes`).

Off-policy diagnostics (KL, perplexities, chi^2) are in :mod:`.mismatch`. All metrics are reported under
``rollout_corr/``, as in verl.
"""

from verl.algos.rollout_correction.config import RolloutCorrectionConfig
from verl.algos.rollout_correction.importance import rollout_is_weights
from verl.algos.rollout_correction.mismatch import offpolicy_metrics
from verl.algos.rollout_correction.modes import (
    apply_bypass_mode,
    apply_decoupled_correction,
    check_rollout_correction,
    rollout_correction_and_mask,
)
from verl.algos.rollout_correction.rejection import parse_rs_options, rollout_rejection_mask

__all__ = [
    "RolloutCorrectionConfig",
    "apply_bypass_mode",
    "apply_decoupled_correction",
    "check_rollout_correction",
    "offpolicy_metrics",
    "parse_rs_options",
    "rollout_correction_and_mask",
    "rollout_is_weights",
    "rollout_rejection_mask",
]
