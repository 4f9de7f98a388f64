"""The actor-loss settings: what the policy losses and :func:`verl.algos.losses.actor.compute_actor_loss`
read. These dataclasses are the run config's nodes themselves (the ``actor_rollout_ref.actor`` section
extends :class:`ActorLossConfig`; ``policy_loss`` is :class:`PolicyLossConfig`), under verl's key names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from verl.core.checks import check_finite, check_literals, check_positive
from verl.core.config import as_node

LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@dataclass
class PolicyLossConfig:
    """verl's ``actor.policy_loss``: which loss, and the Clip-Cov / KL-Cov options."""

    #: A registered policy loss: vanilla, gspo, gpg, clip_cov, kl_cov, cispo, sapo, geo_mean, or a plugin's.
    loss_mode: str = "vanilla"
    #: Clip-Cov: share of valid tokens detached, among those with clip_cov_lb < covariance < clip_cov_ub.
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    #: KL-Cov: share of valid tokens (largest covariance) that get the KL penalty, and its coefficient.
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1

    def __post_init__(self) -> None:
        check_positive("policy_loss.clip_cov_ratio", self.clip_cov_ratio)
        check_positive("policy_loss.kl_cov_ratio", self.kl_cov_ratio)
        for key in ("clip_cov_lb", "clip_cov_ub", "ppo_kl_coef"):
            check_finite(f"policy_loss.{key}", getattr(self, key))


@dataclass
class ActorLossConfig:
    """The loss keys of verl's ``actor_rollout_ref.actor`` section."""

    #: PPO's clip range; ``clip_ratio_low``/``clip_ratio_high`` override each side (DAPO's clip-higher).
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    #: Dual-clip bound on the loss of negative-advantage tokens (must exceed 1).
    clip_ratio_c: float = 3.0
    loss_agg_mode: LossAggMode = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    #: A registered KL estimator (kl/k1, abs, mse/k2, low_var_kl/k3, full, ...).
    kl_loss_type: str = "low_var_kl"
    #: SAPO's gate temperatures (policy_loss.loss_mode=sapo) for positive / negative advantages, as verl.
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)

    def __post_init__(self) -> None:
        self.policy_loss = as_node(PolicyLossConfig, self.policy_loss, "policy_loss")
        check_positive("clip_ratio", self.clip_ratio)
        for key in ("entropy_coeff", "kl_loss_coef", "clip_ratio_c"):
            check_finite(key, getattr(self, key))
        check_positive("tau_pos", self.tau_pos)
        check_positive("tau_neg", self.tau_neg)
        check_literals(self)

    @property
    def clip_ratios(self) -> tuple[float, float]:
        """(low, high) clip ranges, each defaulting to ``clip_ratio``."""
        low, high = self.clip_ratio_low, self.clip_ratio_high
        return (self.clip_ratio if low is None else low), (self.clip_ratio if high is None else high)


def actor_loss_config(config: ActorLossConfig | Mapping[str, Any] | None) -> ActorLossConfig:
    """The config a policy loss reads: the run's actor section as it is, defaults for None, or a mapping
    of these keys (a direct caller's), checked strictly."""
    return as_node(ActorLossConfig, config, "the actor loss config")
