"""The default reward function: dispatch on ``data_source`` to a built-in scorer.

| data_source                                                           | scorer                 |
|-----------------------------------------------------------------------|------------------------|
| openai/gsm8k, gsm8k                                                   | gsm8k (strict "####")  |
| lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500, math | math (\\boxed{}, math-verify) |
| arithmetic, word_problems, numeric                                    | last number equals     |
"""

from __future__ import annotations

from typing import Any

from verl.algos.rewards import gsm8k, math_reward, numeric
from verl.algos.rewards.registry import REWARD_SCORERS
from verl.algos.rewards.scoring import RewardSetupError
from verl.core.registry import RegistryError


@REWARD_SCORERS.register(data_source=["openai/gsm8k", "gsm8k"])
def score_gsm8k(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return gsm8k.compute_score(solution_str, str(ground_truth))


@REWARD_SCORERS.register(
    data_source=["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math"]
)
def score_math(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return math_reward.compute_score(solution_str, str(ground_truth))


@REWARD_SCORERS.register(data_source=["arithmetic", "word_problems", "numeric"])
def score_numeric(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return numeric.compute_score(solution_str, ground_truth)


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None):
    """verl's ``default_compute_score``: the built-in scorer registered for ``data_source``."""
    try:
        scorer = REWARD_SCORERS.get(data_source=data_source)
    except RegistryError as e:
        raise RewardSetupError(
            f"{e} Write a reward function fn(data_source, solution_str, ground_truth, extra_info=None) and set "
            "custom_reward_function.path (and .name) to use it."
        ) from None
    return scorer(solution_str, ground_truth, extra_info)


def default_compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos):
    """The batched form the ``batch`` reward manager calls, over :func:`default_compute_score`."""
    return [
        default_compute_score(ds, sol, gt, info)
        for ds, sol, gt, info in zip(data_sources, solution_strs, ground_truths, extra_infos)
    ]
