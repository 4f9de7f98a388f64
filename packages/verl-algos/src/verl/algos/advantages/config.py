"""The advantage keys of verl's ``algorithm`` section: what the estimators read. The run config's
``algorithm`` node extends :class:`AdvantageConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verl.core.checks import check_range
from verl.core.config import as_node


@dataclass
class AdvantageConfig:
    #: A registered estimator: gae, grpo, grpo_passk, rloo, opo, gpg, reinforce_plus_plus,
    #: reinforce_plus_plus_baseline, remax, optimal_token_baseline, or a plugin's.
    adv_estimator: str = "grpo"
    #: Discount (gae, reinforce_plus_plus).
    gamma: float = 1.0
    #: GAE's lambda.
    lam: float = 1.0
    #: GRPO divides by the group's std; false is Dr.GRPO (the mean is subtracted only).
    norm_adv_by_std_in_grpo: bool = True

    def __post_init__(self) -> None:
        check_range("gamma", self.gamma, 0.0, 1.0)
        check_range("lam", self.lam, 0.0, 1.0)


def advantage_config(config: AdvantageConfig | Mapping[str, Any] | None) -> AdvantageConfig:
    """What an estimator reads: the run's ``algorithm`` node as it is, defaults for None, or a mapping of
    these keys (a direct caller's), checked strictly."""
    return as_node(AdvantageConfig, config, "the advantage config (algorithm)")
