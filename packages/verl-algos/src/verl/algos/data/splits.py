"""Train/validation splits that never share a problem (problems are grouped by a canonical key and
every group goes wholly to one side), written as rows of verl's schema."""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol, TypeVar

P = TypeVar("P")


def split_by_key(
    problems: Sequence[P], key: Callable[[P], Hashable], val_size: int, train_size: int | None, seed: int
) -> tuple[list[P], list[P]]:
    """(train, validation). Keys are shuffled with ``seed``; validation takes whole key groups until
    it holds ``val_size`` problems (exactly, whenever the group sizes allow), the train split takes
    up to ``train_size`` problems (all when None) from the remaining groups."""
    groups: dict[Hashable, list[P]] = {}
    for problem in problems:
        groups.setdefault(key(problem), []).append(problem)
    keys = list(groups)
    random.Random(seed).shuffle(keys)
    val: list[P] = []
    train_keys = []
    for k in keys:
        if len(val) + len(groups[k]) <= val_size:
            val.extend(groups[k])
        else:
            train_keys.append(k)
    train = [p for k in train_keys for p in groups[k]]
    if train_size is not None:
        if train_size > len(train):
            raise ValueError(
                f"asked for {train_size} training problems but only {len(train)} remain after {len(val)} for validation; "
                "widen the value range, or lower --train-size/--val-size"
            )
        train = train[:train_size]
    return train, val


class GeneratedProblem(Protocol):
    @property
    def question(self) -> str: ...

    @property
    def answer(self) -> int: ...

    @property
    def solution(self) -> str: ...


def task_rows(
    data_source: str, train: Sequence[GeneratedProblem], val: Sequence[GeneratedProblem], key: Callable[[Any], str]
) -> dict[str, list[dict[str, Any]]]:
    """``{"train": [...], "test": [...]}`` in verl's schema: a chat prompt, the answer as the rule-based
    reward's ground truth, and the problem's split, index, canonical ``key``, question and solution."""

    def row(problem: GeneratedProblem, split: str, index: int) -> dict[str, Any]:
        return {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": problem.question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(problem.answer)},
            "extra_info": {
                "split": split,
                "index": index,
                "key": key(problem),
                "question": problem.question,
                "solution": problem.solution,
            },
        }

    return {
        "train": [row(p, "train", i) for i, p in enumerate(train)],
        "test": [row(p, "test", i) for i, p in enumerate(val)],
    }
