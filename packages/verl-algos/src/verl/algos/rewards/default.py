"""The default reward function: dispatch on ``data_source`` to a built-in scorer.

| data_source                                                           | scorer                 |
|-----------------------------------------------------------------------|------------------------|
| openai/gsm8k, gsm8k                                                   | gsm8k (strict "####")  |
| lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500, math | math (\\boxed{}, math-verify) |
| arithmetic, word_problems, numeric                                    | last number equals     |
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


@REWARD_SCORERS.register(data_source=["arithmetic", "word_problems", "calculator", "numeric"])
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


def _scalar_truth_problem(ground_truth: Any) -> str | None:
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int, float)):
        return (
            f"reward_model.ground_truth is {ground_truth!r} (type {type(ground_truth).__name__}), but the built-in "
            "reward function of this data_source compares the answer with a string or a number. Store the reference "
            "answer as a string, or set custom_reward_function.path to a function that reads this ground truth"
        )
    return None


def _numeric_truth_problem(ground_truth: Any) -> str | None:
    problem = _scalar_truth_problem(ground_truth)
    if problem:
        return problem
    try:
        numeric._parse(ground_truth)
    except ValueError as e:
        return f"reward_model.ground_truth: {e} (this data_source is scored by comparing numbers)"
    return None


#: What the scorers of this file accept as ground truth. A scorer registered elsewhere may carry its own
#: check as the attribute ``check_ground_truth(ground_truth) -> problem or None``; without one, any
#: non-null ground truth passes.
_GROUND_TRUTH_CHECKS: dict[Callable[..., float], Callable[[Any], str | None]] = {
    score_gsm8k: _scalar_truth_problem,
    score_math: _scalar_truth_problem,
    score_numeric: _numeric_truth_problem,
}


def builtin_scoring_problem(data_source: Any, ground_truth: Any) -> str | None:
    """Why the built-in scorer cannot score a row with this data_source and ground truth (None: it can)."""
    try:
        scorer = REWARD_SCORERS.get(data_source=data_source)
    except RegistryError as e:
        return (
            f"data_source {data_source!r} has no built-in reward function ({e}) Fix the data_source, or write a "
            "reward function fn(data_source, solution_str, ground_truth, extra_info=None) and set "
            "custom_reward_function.path (and .name) to use it"
        )
    check = _GROUND_TRUTH_CHECKS.get(scorer) or getattr(scorer, "check_ground_truth", None)
    problem = check(ground_truth) if check else None
    return f"data_source {data_source!r}: {problem}" if problem else None


def check_builtin_scoring(
    rows: Iterable[tuple[str, int, dict[str, Any]]], config_key: str = "", reward_fn_key: str = "data_source"
) -> None:
    """Before training, when no custom reward function is set: every row (``(file, row index, row)``)
    can be scored by the built-in reward function of its data_source. Otherwise each of its samples
    would fail, or quietly score 0, for the whole run. ``config_key`` (``data.train_files``) starts
    the message."""
    seen: set[tuple[Any, Any]] = set()
    for path, index, row in rows:
        data_source, ground_truth = row.get(reward_fn_key), row["reward_model"]["ground_truth"]
        key = (data_source, ground_truth if isinstance(ground_truth, (str, int, float)) else id(ground_truth))
        if key in seen:
            continue
        seen.add(key)
        problem = builtin_scoring_problem(data_source, ground_truth)
        if problem:
            raise RewardSetupError(f"{config_key + ': ' if config_key else ''}{path}, row {index}: {problem}")
