"""The ``async_training`` section: which schedule overlaps generation with training.

verl selects its one-step-off-policy trainer by its entry point
(``python -m verl.experimental.one_step_off_policy.main_ppo``); here ``async_training.mode`` does, so that
``verl train -r grpo_one_step_off`` is a recipe like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.core.checks import check_choice

#: "sync": generate, then train, step by step (the default). "one_step_off": the rollout of step k+1 runs
#: on its own pool, with the weights from before step k's update, while step k trains.
MODES = ("sync", "one_step_off")


@dataclass
class AsyncTrainingConfig:
    mode: str = "sync"

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, MODES)
