"""The advantage-estimator registry (``algorithm.adv_estimator``).

Every estimator has the same signature, so the trainer calls any of them the same way::

    advantages, returns = fn(token_level_rewards, response_mask, index=None, values=None, config=None, **kw)

- ``token_level_rewards``: [batch, response_length] float; outcome rewards sit on the last valid token.
- ``response_mask``: [batch, response_length], 1 on valid response tokens.
- ``index``: one prompt uid per row (numpy object array); responses sharing a uid form a group.
- ``values``: [batch, response_length] critic values (GAE only).
- ``config``: the ``algorithm`` config (dataclass, dict or OmegaConf): ``gamma``, ``lam``,
  ``norm_adv_by_std_in_grpo``, ... read with :func:`verl.algos.options.option`.
- ``**kw``: estimator-specific tensors such as ``reward_baselines`` (ReMax), ``old_log_probs`` and
  ``sum_pi_squared`` (the optimal token baseline); others ignore them.

Both outputs are [batch, response_length] and zero outside ``response_mask``. Estimators run under
``torch.no_grad()``: advantages are targets, not part of the graph.

Register a new one with ``@register_adv_estimator("name", needs=("index",))``; ``needs`` names the
batch fields beyond rewards and mask that :func:`~verl.algos.advantages.apply.compute_advantage` must
find (``index`` is the non-tensor ``uid``), ``optional`` those it passes when the batch has them. A list
of names registers aliases (verl's ``grpo_vectorized`` is our ``grpo``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

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


def uses_critic(name: str) -> bool:
    """Whether estimator ``name`` needs a learned value function (it declares ``needs=("values",)``): the
    trainer then runs the critic. An unregistered name is reported by the config checks, so: False."""
    try:
        return "values" in get_adv_estimator(name).required_fields  # type: ignore[attr-defined]
    except RegistryError:
        return False


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``; an unknown name lists the registered ones."""
    import verl.algos.advantages  # noqa: F401  (registers the built-ins)

    return ADV_ESTIMATORS.get(name)
