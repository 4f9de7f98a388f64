"""The reward function's and DAPO's overlong-shaping settings: these classes are the run config's
``custom_reward_function`` and ``reward_model.overlong_buffer`` nodes, and what the reward code reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong punishment (reward manager ``dapo``)."""

    enable: bool = False
    #: The last ``len`` tokens before data.max_response_length, over which the penalty grows to -penalty_factor.
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False


@dataclass
class CustomRewardFunctionConfig:
    #: A Python file defining the reward function (null: the built-in scorers by data_source).
    path: str | None = None
    name: str = "compute_score"
    #: Keyword arguments bound to the function (verl's ``+custom_reward_function.reward_kwargs.x=...``).
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
