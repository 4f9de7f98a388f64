"""The advantage-estimator registry (``algorithm.adv_estimator``).

Every estimator has the same signature, so the trainer calls any of them the same way::

    advantages, returns = fn(token_level_rewards, response_mask, index=None, values=None, config=None, **kw)

- ``token_level_rewards``: [batch, response_length] float; outcome rewards sit on the last valid token.
- ``response_mask``: [batch, response_length], 1 on valid response tokens.
- ``index``: one prompt uid per row (numpy object array); responses sharing a uid form a group.
- ``values``: [batch, response_length] critic values (GAE only).
- ``config``: the ``algorithm`` node, an :class:`~verl.algos.advantages.config.AdvantageConfig` (``gamma``,
  ``lam``, ``norm_adv_by_std_in_grpo``); a mapping of those keys works too.
- ``**kw``: estimator-specific tensors such as ``reward_baselines`` (ReMax), ``old_log_probs`` and
  ``sum_pi_squared`` (the optimal token baseline); others ignore them.

Both outputs are [batch, response_length] and zero outside ``response_mask``. Estimators run under
``torch.no_grad()``: advantages are targets, not part of the graph.

Register a new one with ``@register_adv_estimator("name", needs=("index",))``; ``needs`` names the
batch fields beyond rewards and mask that :func:`~verl.algos.advantages.apply.compute_advantage` must
find (``index`` is the non-tensor ``uid``), ``optional`` those it passes when the batch has them. A list
of names registers aliases (verl's ``grpo_vectorized`` is our ``grpo``). The built-ins are written as
``fn(inputs: EstimatorInputs, config: AdvantageConfig, **kw)`` and registered with
:func:`register_outcome_estimator` (one advantage per response, broadcast to its tokens) or
:func:`register_token_estimator` (advantages and returns per token), which give them verl's signature.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from verl.algos.advantages.config import AdvantageConfig, advantage_config
from verl.algos.data.masked import as_float_mask, group_rows
from verl.core.registry import Registry, RegistryError

AdvantageEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]

#: ``algorithm.adv_estimator`` name -> estimator function.
ADV_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")

#: verl's estimators that wait for a feature we lack: name -> why, and what to use instead.
NOT_YET: dict[str, str] = {
    "tir_optimal_token_baseline": (
        "the multi-turn (tool-integrated) optimal token baseline needs multi-turn agent rollouts (issue 15, the "
        "agent loop), which are not built yet; for single-turn rollouts use adv_estimator=optimal_token_baseline"
    ),
}

KNOWN_NEEDS = ("index", "values", "reward_baselines", "old_log_probs", "sum_pi_squared", "rollout_is_weights")


def register_adv_estimator(
    name: str | Sequence[str], *, needs: Sequence[str] = (), optional: Sequence[str] = ()
) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    unknown = (set(needs) | set(optional)) - set(KNOWN_NEEDS)
    if unknown:
        raise ValueError(f"unknown needs {sorted(unknown)} for estimator {name!r}; known: {list(KNOWN_NEEDS)}")

    def decorator(fn: AdvantageEstimator) -> AdvantageEstimator:
        fn.required_fields = tuple(needs)  # type: ignore[attr-defined]
        fn.optional_fields = tuple(optional)  # type: ignore[attr-defined]
        return ADV_ESTIMATORS.register(list(name) if not isinstance(name, str) else name)(fn)

    return decorator


@dataclass(frozen=True)
class EstimatorInputs:
    """One batch as an estimator sees it."""

    #: [batch, response_length]; outcome rewards sit on the last valid token.
    token_level_rewards: torch.Tensor
    response_mask: torch.Tensor
    #: One prompt uid per row; None is refused when the groups are asked for.
    index: Sequence[Hashable] | None = None
    #: [batch, response_length] the critic's values (GAE).
    values: torch.Tensor | None = None

    @cached_property
    def scores(self) -> torch.Tensor:
        """[batch] the sum of each response's token rewards."""
        return self.token_level_rewards.sum(dim=-1)

    @cached_property
    def mask(self) -> torch.Tensor:
        """[batch, response_length] the response mask as floats."""
        return as_float_mask(self.response_mask, self.token_level_rewards)

    @cached_property
    def groups(self) -> list[list[int]]:
        """The rows of each prompt's responses."""
        return list(group_rows(self.index).values())


#: ``fn(inputs, config, **kw)`` returning per-response advantages [batch] (outcome estimators) or
#: ``(advantages, returns)`` per token (token estimators).
EstimatorCore = Callable[..., Any]


def _estimator_with_verl_signature(core: EstimatorCore, finish: Callable[..., Any]) -> AdvantageEstimator:
    @functools.wraps(core)
    @torch.no_grad()
    def estimator(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: Sequence[Hashable] | None = None,
        values: torch.Tensor | None = None,
        config: AdvantageConfig | Mapping[str, Any] | None = None,
        **kw,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = EstimatorInputs(token_level_rewards, response_mask, index, values)
        return finish(core(inputs, advantage_config(config), **kw), inputs)

    return estimator


def _broadcast(per_response: torch.Tensor, inputs: EstimatorInputs) -> tuple[torch.Tensor, torch.Tensor]:
    adv = per_response.unsqueeze(-1) * inputs.mask
    return adv, adv


def register_outcome_estimator(
    name: str | Sequence[str], *, needs: Sequence[str] = ("index",)
) -> Callable[[EstimatorCore], AdvantageEstimator]:
    """Register ``fn(inputs: EstimatorInputs, config: AdvantageConfig, **kw) -> [batch]`` (one advantage per
    response) as an estimator with verl's signature: the advantage is broadcast to the response's valid
    tokens and is also the return, as verl's outcome estimators do."""

    def decorator(fn: EstimatorCore) -> AdvantageEstimator:
        return register_adv_estimator(name, needs=needs)(_estimator_with_verl_signature(fn, _broadcast))

    return decorator


def register_token_estimator(
    name: str | Sequence[str], *, needs: Sequence[str] = (), optional: Sequence[str] = ()
) -> Callable[[EstimatorCore], AdvantageEstimator]:
    """Register ``fn(inputs: EstimatorInputs, config: AdvantageConfig, **kw) -> (advantages, returns)``
    (per token) as an estimator with verl's signature; ``**kw`` carries the batch fields it ``needs``."""

    def decorator(fn: EstimatorCore) -> AdvantageEstimator:
        wrapped = _estimator_with_verl_signature(fn, lambda out, _inputs: out)
        return register_adv_estimator(name, needs=needs, optional=optional)(wrapped)

    return decorator


def returns_to_go(token_level_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """G_t = sum_{k >= t} r_k over the valid tokens, 0 elsewhere."""
    return (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * mask


def uses_critic(name: str) -> bool:
    """Whether estimator ``name`` needs a learned value function (it declares ``needs=("values",)``): the
    trainer then runs the critic. An unregistered name is reported by the config checks, so: False."""
    try:
        return "values" in get_adv_estimator(name).required_fields  # type: ignore[attr-defined]
    except RegistryError:
        return False


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``; an unknown name lists the registered ones. (Importing this
    module imports :mod:`verl.algos.advantages` first, which registers the built-ins.)"""
    return ADV_ESTIMATORS.get(name)
