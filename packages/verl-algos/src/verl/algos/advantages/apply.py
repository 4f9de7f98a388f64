"""Applying the configured estimator to a batch, and the ReMax greedy baseline."""

from __future__ import annotations

from typing import Any

import torch

from verl.algos.advantages.registry import get_adv_estimator
from verl.algos.data.fields import response_mask_of
from verl.core.protocol import DataProto


def compute_advantage(data: DataProto, adv_estimator: str, config: Any = None) -> DataProto:
    """Run estimator ``adv_estimator`` on ``data`` and write ``advantages`` and ``returns`` into it.

    Reads ``token_level_rewards``, ``response_mask`` (or the response part of ``attention_mask``),
    and what the estimator needs: non-tensor ``uid`` (group estimators), ``values`` (gae),
    ``reward_baselines`` (remax), ``old_log_probs`` and ``sum_pi_squared`` (optimal_token_baseline). ``config`` is the ``algorithm`` config. Returns ``data``.
    """
    fn = get_adv_estimator(adv_estimator)
    batch = data.batch
    if batch is None or "token_level_rewards" not in batch.keys():
        raise ValueError(
            "compute_advantage needs 'token_level_rewards' in the batch (the reward, with the in-reward KL "
            "penalty applied when algorithm.use_kl_in_reward=true, else a copy of token_level_scores)"
        )
    kwargs: dict[str, Any] = {}
    for need in getattr(fn, "required_fields", ()):
        if need == "index":
            if "uid" not in data.non_tensor_batch:
                raise ValueError(
                    f"adv_estimator={adv_estimator!r} groups responses by prompt and needs the non-tensor field "
                    "'uid' (one id per prompt, repeated for its n responses)"
                )
            kwargs["index"] = data.non_tensor_batch["uid"]
        elif need not in batch.keys():
            raise ValueError(
                f"adv_estimator={adv_estimator!r} needs the batch field {need!r}, which is missing "
                f"(fields: {data.keys()})"
            )
        else:
            kwargs[need] = batch[need]
    for extra in getattr(fn, "optional_fields", ()):
        if extra in batch.keys():
            kwargs[extra] = batch[extra]
    advantages, returns = fn(batch["token_level_rewards"], response_mask_of(data), config=config, **kwargs)
    batch["advantages"] = advantages
    batch["returns"] = returns
    return data


def greedy_reward_baselines(greedy_scores: torch.Tensor) -> torch.Tensor:
    """ReMax's baseline from the token-level scores of one greedy response per row: the sequence
    reward ``sum_t score_t``. The trainer generates the greedy responses (temperature 0, n=1),
    repeats them to align with the sampled rows, scores them with the reward manager and stores this
    as the batch field ``reward_baselines``."""
    return greedy_scores.sum(dim=-1)
