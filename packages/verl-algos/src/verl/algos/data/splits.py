"""Train/validation splits that never share a problem: problems are grouped by a canonical key and
every group goes wholly to one side."""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

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
