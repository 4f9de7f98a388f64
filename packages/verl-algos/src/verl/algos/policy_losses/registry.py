"""The policy-loss registry (``actor_rollout_ref.actor.policy_loss.loss_mode``).

Every policy loss has the signature::

    loss, metrics = fn(old_log_prob, log_prob, advantages, response_mask, *,
                       loss_agg_mode="token-mean", normalizer=None, config=None, rollout_is_weights=None)

- tensors are [batch, response_length]; ``log_prob`` carries the gradient;
- ``loss_agg_mode`` and ``normalizer`` go to :func:`verl.algos.losses.aggregation.agg_loss`: the returned loss is
  this micro-batch's share of the global mini-batch loss (already scaled; the engine just sums);
- ``config`` is the actor config: ``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``,
  ``clip_ratio_c``, ``tau_pos``/``tau_neg``, and ``policy_loss.*`` (clip_cov_ratio, ...);
- ``rollout_is_weights``: [batch, response_length] truncated importance weights pi_old / pi_rollout
  (``algorithm.rollout_correction.rollout_is`` in decoupled mode, see :mod:`verl.algos.rollout_correction`),
  detached; each loss multiplies its per-token loss by them before aggregating, as verl's do;
- ``metrics``: floats under verl's names (``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``,
  ``actor/pg_clipfrac_lower``), each the micro-batch's own mean, for the trainer to average.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from verl.core.registry import Registry

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]

#: ``policy_loss.loss_mode`` name -> policy loss function.
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as ``name``; an unknown name lists the registered ones."""
    import verl.algos.policy_losses  # noqa: F401  (registers the built-ins)

    return POLICY_LOSSES.get(name)


def clip_ratios(config) -> tuple[float, float]:
    """(low, high) clip ranges: ``clip_ratio_low``/``clip_ratio_high``, each defaulting to ``clip_ratio``
    (0.2). DAPO's clip-higher is e.g. low 0.2, high 0.28."""
    from verl.algos.options import option

    base = float(option(config, "clip_ratio", 0.2))
    return float(option(config, "clip_ratio_low", base)), float(option(config, "clip_ratio_high", base))


def apply_is_weights(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """The per-token loss reweighted by the rollout-correction importance weights (no gradient through
    them: they change the measure the expectation is taken under, not the objective)."""
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights.detach()
