"""KL estimators between the policy and the reference policy, and the KL loss (``actor.use_kl_loss``).

Per token, with d = log_prob - ref_log_prob (samples come from the policy), following Schulman,
"Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html):

- ``k1`` / ``kl``:          d                              (unbiased, high variance, can be < 0)
- ``abs``:                  |d|
- ``k2`` / ``mse``:         d^2 / 2                        (low variance, biased)
- ``k3`` / ``low_var_kl``:  exp(-d) - 1 + d                (unbiased, >= 0; -d clamped to +-20, the
                                                            result to [-10, 10] as in verl)

A trailing ``+`` (``k1+``, ``k3+``, ``low_var_kl+``, ...) is the straight-through variant: the forward
value of the named estimator with the gradient of k2, whose gradient d * grad(log_prob) is the unbiased
gradient of the KL when used as a loss (the k1/k3 values give unbiased estimates of the KL itself).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from verl.algos.losses.aggregation import LossNormalizer, agg_loss, micro_mean
from verl.core.registry import Registry

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: ``kl_loss_type`` / ``algorithm.kl_penalty`` name (without "+") -> estimator(log_prob, ref_log_prob).
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


@KL_ESTIMATORS.register(["k1", "kl"])
def kl_k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return log_prob - ref_log_prob


@KL_ESTIMATORS.register("abs")
def kl_abs(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return (log_prob - ref_log_prob).abs()


@KL_ESTIMATORS.register(["k2", "mse"])
def kl_k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (log_prob - ref_log_prob).square()


@KL_ESTIMATORS.register(["k3", "low_var_kl"])
def kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    neg_d = torch.clamp(ref_log_prob - log_prob, min=-20, max=20)
    return torch.clamp(torch.exp(neg_d) - neg_d - 1, min=-10, max=10)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_type: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate ``kl_type`` (see the module docstring), same shape as the inputs."""
    straight_through = kl_type.endswith("+")
    base = kl_type[:-1] if straight_through else kl_type
    if base == "full":
        raise ValueError(
            "kl type 'full' needs the whole vocabulary distribution and is not supported; use k1, k2 or k3"
        )
    value = KL_ESTIMATORS.get(base)(log_prob, ref_log_prob)
    if not straight_through or base in ("k2", "mse"):
        return value
    surrogate = kl_k2(log_prob, ref_log_prob)
    return surrogate - surrogate.detach() + value.detach()


def compute_kl_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_loss_type: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    normalizer: LossNormalizer | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The KL-to-reference loss term (before ``kl_loss_coef``), aggregated like the policy loss.
    Metric ``actor/kl_loss``: the micro-batch mean."""
    kld = kl_penalty(log_prob, ref_log_prob, kl_loss_type)
    loss = agg_loss(kld, response_mask, loss_agg_mode, normalizer)
    return loss, {"actor/kl_loss": micro_mean(kld, response_mask, loss_agg_mode)}
