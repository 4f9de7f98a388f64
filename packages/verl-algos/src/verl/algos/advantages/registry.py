"""The advantage-estimator registry (``algorithm.adv_estimator``).

Every estimator has the same signature, so the trainer calls any of them the same way::

    advantages, returns = fn(token_level_rewards, response_mask, index=None, values=None, config=None, **kw)

- ``token_level_rewards``: [batch, response_length] float; outcome rewards sit on the last valid token.
- ``response_mask``: [batch, response_length], 1 on valid response tokens.
- ``index``: one prompt uid per row (numpy object array); responses sharing a uid form a group.
- ``values``: [batch, response_length] critic values (GAE only).
- ``config``: the ``algorithm`` config (dataclass, dict or OmegaConf): ``gamma``, ``lam``,
  ``norm_adv_by_std_in_grpo``, ... read with :func:`verl.algos.options.option`.
- ``**kw``: estimator-specific tensors such as ``reward_baselines`` (ReMax); others ignore them.

Both outputs are [batch, response_length] and zero outside ``response_mask``. Estimators run under
``torch.no_grad()``: advantages are targets, not part of the graph.

Register a new one with ``@register_adv_estimator("name", needs=("index",))``; ``needs`` names the
batch fields beyond rewards and mask that :func:`~verl.algos.advantages.apply.compute_advantage` must
find (``index`` is the non-tensor ``uid``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from verl.core.registry import Registry

AdvantageEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]

#: ``algorithm.adv_estimator`` name -> estimator function.
ADV_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")

KNOWN_NEEDS = ("index", "values", "reward_baselines")


def register_adv_estimator(
    name: str, *, needs: Sequence[str] = ()
) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    unknown = set(needs) - set(KNOWN_NEEDS)
    if unknown:
        raise ValueError(f"unknown needs {sorted(unknown)} for estimator {name!r}; known: {list(KNOWN_NEEDS)}")

    def decorator(fn: AdvantageEstimator) -> AdvantageEstimator:
        fn.required_fields = tuple(needs)  # type: ignore[attr-defined]
        return ADV_ESTIMATORS.register(name)(fn)

    return decorator


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``; an unknown name lists the registered ones."""
    import verl.algos.advantages  # noqa: F401  (registers the built-ins)

    return ADV_ESTIMATORS.get(name)
