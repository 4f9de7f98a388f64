"""The policy-loss registry (``actor_rollout_ref.actor.policy_loss.loss_mode``).

Every registered policy loss has verl's signature::

    loss, metrics = fn(old_log_prob, log_prob, advantages, response_mask, *,
                       loss_agg_mode="token-mean", normalizer=None, config=None, rollout_is_weights=None)

- tensors are [batch, response_length]; ``log_prob`` carries the gradient;
- ``loss_agg_mode`` and ``normalizer`` go to :func:`verl.algos.losses.aggregation.agg_loss`: the returned loss is
  this micro-batch's share of the global mini-batch loss (already scaled; the engine just sums);
- ``config`` is the actor section, an :class:`~verl.algos.policy_losses.config.ActorLossConfig`
  (``clip_ratio*``, ``tau_pos``/``tau_neg``, ``policy_loss.*``); a mapping of those keys works too;
- ``rollout_is_weights``: [batch, response_length] truncated importance weights pi_old / pi_rollout
  (``algorithm.rollout_correction.rollout_is`` in decoupled mode, see :mod:`verl.algos.rollout_correction`),
  detached; each loss multiplies its per-token loss by them before aggregating, as verl's do;
- ``metrics``: floats under verl's names (``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``,
  ``actor/pg_clipfrac_lower``), each the micro-batch's own mean, for the trainer to average.

A loss that is a per-token loss (most are) is written as ``fn(inputs, config, **kw) -> TokenLoss`` and
registered with :func:`register_token_loss`, which does the rest once for all of them: the importance
weights, the aggregation, the four metrics. One that aggregates and reports itself (per sequence, or
after masking tokens) is ``fn(inputs, config, aggregation, **kw) -> (loss, metrics)``, registered with
:func:`register_aggregating_loss`. :func:`register_policy_loss` takes a function with the full signature
above (a plugin's verl-style loss).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from verl.algos.data.masked import masked_mean
from verl.algos.losses.aggregation import LossNormalizer, agg_loss, micro_mean
from verl.algos.policy_losses.config import ActorLossConfig, actor_loss_config
from verl.core.registry import Registry

logger = logging.getLogger(__name__)

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]

#: ``policy_loss.loss_mode`` name -> policy loss function.
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as ``name``; an unknown name lists the registered ones. (Importing this
    module imports :mod:`verl.algos.policy_losses` first, which registers the built-ins.)"""
    return POLICY_LOSSES.get(name)


@dataclass(frozen=True)
class PolicyLossInputs:
    """One micro-batch's tensors, [batch, response_length]; ``log_prob`` carries the gradient."""

    old_log_prob: torch.Tensor
    log_prob: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor

    @cached_property
    def log_ratio(self) -> torch.Tensor:
        """log pi_theta - log pi_old, clamped to +-20 so that exp() cannot overflow."""
        return torch.clamp(self.log_prob - self.old_log_prob, min=-20.0, max=20.0)

    @cached_property
    def ratio(self) -> torch.Tensor:
        return torch.exp(self.log_ratio)


@dataclass
class TokenLoss:
    """What a per-token policy loss computes; the registry turns it into the loss and verl's metrics."""

    #: The per-token loss, before importance weights and aggregation.
    pg_losses: torch.Tensor
    #: Per-token 0/1 for ``actor/pg_clipfrac`` and ``actor/pg_clipfrac_lower`` (None: 0).
    clipped: torch.Tensor | None = None
    clipped_lower: torch.Tensor | None = None
    #: Per-token values averaged into ``actor/ppo_kl`` (None: old_log_prob - log_prob).
    kl: torch.Tensor | None = None


TokenLossFn = Callable[..., TokenLoss]
_warned_aggregation: set[str] = set()


def aggregation_of(name: str, fixed: str | None, asked: str) -> str:
    if fixed is None or fixed == asked:
        return asked
    if name not in _warned_aggregation:
        logger.warning("policy_loss.loss_mode=%s defines its own aggregation; ignoring loss_agg_mode=%s", name, asked)
        _warned_aggregation.add(name)
    return fixed


def finish_token_loss(
    out: TokenLoss,
    inputs: PolicyLossInputs,
    loss_agg_mode: str,
    normalizer: LossNormalizer | None,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The rollout-correction weights (no gradient through them: they change the measure the expectation
    is taken under, not the objective), the aggregation over the global batch, and the metrics."""
    pg_losses = out.pg_losses if rollout_is_weights is None else out.pg_losses * rollout_is_weights.detach()
    mask = inputs.response_mask
    loss = agg_loss(pg_losses, mask, loss_agg_mode, normalizer)
    with torch.no_grad():
        kl = inputs.old_log_prob - inputs.log_prob if out.kl is None else out.kl

        def share(flags: torch.Tensor | None) -> float:
            return 0.0 if flags is None else float(masked_mean(flags.float(), mask))

        metrics = {
            "actor/pg_loss": micro_mean(pg_losses, mask, loss_agg_mode),
            "actor/pg_clipfrac": share(out.clipped),
            "actor/pg_clipfrac_lower": share(out.clipped_lower),
            "actor/ppo_kl": float(masked_mean(kl, mask)),
        }
    return loss, metrics


@dataclass(frozen=True)
class Aggregation:
    """How a micro-batch's loss joins the global mini-batch's: verl's keyword arguments of a policy loss."""

    #: ``loss_agg_mode`` (see :func:`verl.algos.losses.aggregation.agg_loss`).
    mode: str = "token-mean"
    normalizer: LossNormalizer | None = None
    #: Decoupled rollout correction's truncated importance weights pi_old / pi_rollout (detached), or None.
    rollout_is_weights: torch.Tensor | None = None


#: ``call(inputs, config, aggregation, **kwargs) -> (loss, metrics)``, behind verl's signature.
InputsLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]


def with_verl_signature(call: InputsLossFn, default_mode: str = "token-mean") -> PolicyLoss:
    """``call`` as a policy loss with verl's signature: the tensors become :class:`PolicyLossInputs`, the
    config an :class:`ActorLossConfig`, the keyword arguments an :class:`Aggregation`."""

    def policy_loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        loss_agg_mode: str = default_mode,
        normalizer: LossNormalizer | None = None,
        config: ActorLossConfig | None = None,
        rollout_is_weights: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        inputs = PolicyLossInputs(old_log_prob, log_prob, advantages, response_mask)
        aggregation = Aggregation(loss_agg_mode, normalizer, rollout_is_weights)
        return call(inputs, actor_loss_config(config), aggregation, **kwargs)

    return policy_loss


def register_aggregating_loss(name: str) -> Callable[[InputsLossFn], PolicyLoss]:
    """Register ``fn(inputs: PolicyLossInputs, config: ActorLossConfig, aggregation: Aggregation, **kw) ->
    (loss, metrics)`` as the policy loss ``name`` with verl's signature: for a loss that aggregates and
    reports itself (one defined per sequence, or one that masks tokens first)."""

    def decorator(fn: InputsLossFn) -> PolicyLoss:
        return POLICY_LOSSES.register(name)(functools.wraps(fn)(with_verl_signature(fn)))

    return decorator


def register_token_loss(name: str, *, aggregation: str | None = None) -> Callable[[TokenLossFn], PolicyLoss]:
    """Register ``fn(inputs: PolicyLossInputs, config: ActorLossConfig, **kw) -> TokenLoss`` as the policy
    loss ``name`` with verl's signature. ``aggregation``: the loss_agg_mode the objective is defined with
    (GSPO's and SAPO's average per sequence); another asked-for mode is overridden, with a one-time warning."""

    def decorator(fn: TokenLossFn) -> PolicyLoss:
        def finished(inputs: PolicyLossInputs, config: ActorLossConfig, agg: Aggregation, **kwargs):
            mode = aggregation_of(name, aggregation, agg.mode)
            return finish_token_loss(fn(inputs, config, **kwargs), inputs, mode, agg.normalizer, agg.rollout_is_weights)

        policy_loss = functools.wraps(fn)(with_verl_signature(finished, aggregation or "token-mean"))
        policy_loss.token_loss = fn  # type: ignore[attr-defined]
        return POLICY_LOSSES.register(name)(policy_loss)

    return decorator
