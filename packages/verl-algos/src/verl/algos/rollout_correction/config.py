"""verl's ``algorithm.rollout_correction`` section: this class is the run config's node and what the
correction code reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from verl.core.checks import check_literals
from verl.core.config import as_node


@dataclass
class RolloutCorrectionConfig:
    """Defaults from verl's YAML: off."""

    #: Importance weights pi_train / pi_rollout: null (off), "token" or "sequence".
    rollout_is: Literal["token", "sequence"] | None = None
    rollout_is_threshold: float = 2.0
    #: Rejection: comma-separated token_k1..k3, seq_sum_k1..k3, seq_mean_k1..k3, seq_max_k2/k3; null: off.
    rollout_rs: str | None = None
    #: One threshold for all rollout_rs options or one per option ("0.5_2.0" ratio bounds for k1).
    rollout_rs_threshold: str | float | None = None
    #: true: the rollout's log-probs are the old log-probs (no old-log-prob pass), loss bypass_mode.
    bypass_mode: bool = False
    #: Bypass mode's loss: "ppo_clip" or "reinforce".
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"
    rollout_is_batch_normalize: bool = False

    def __post_init__(self) -> None:
        check_literals(self)
        if not self.rollout_is_threshold > 0:
            raise ValueError(f"rollout_is_threshold={self.rollout_is_threshold} must be > 0 (typical: 2.0 to 5.0)")

    @property
    def decoupled(self) -> bool:
        """IS weights or rejection against recomputed old log-probs (needs the old-log-prob pass)."""
        return not self.bypass_mode and (self.rollout_is is not None or self.rollout_rs is not None)


def rollout_correction_config(value: RolloutCorrectionConfig | Mapping[str, Any] | None) -> RolloutCorrectionConfig:
    return as_node(RolloutCorrectionConfig, value, "algorithm.rollout_correction")
