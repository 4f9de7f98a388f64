"""The ``async_training`` section: which schedule overlaps generation with training, and verl's keys of its
fully asynchronous trainer.

verl selects its asynchronous trainers by their entry points
(``python -m verl.experimental.one_step_off_policy.main_ppo``, ``...fully_async_policy.fully_async_main``);
here ``async_training.mode`` does, so that ``verl train -r grpo_one_step_off`` and ``-r grpo_async`` are
recipes like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl.core.checks import check_choice, check_positive

#: "sync": generate, then train, step by step (the default). "one_step_off": the rollout of step k+1 runs
#: on its own pool, with the weights from before step k's update, while step k trains. "fully_async": the
#: rollout pool generates continuously into a queue the trainer takes from (see async_training.rollouter).
MODES = ("sync", "one_step_off", "fully_async")


@dataclass
class AsyncTrainingConfig:
    mode: str = "sync"
    #: fully_async (verl's keys and defaults): how many more prompts than a push's worth of steps the rollout
    #: may draw between two pushes, as a fraction; 0 is synchronous.
    staleness_threshold: float = 0.1
    #: steps between two weight pushes to the rollout pool
    trigger_parameter_sync_step: int = 4
    #: mini-batches (actor.ppo_mini_batch_size prompts each) one step trains
    require_batches: int = 1
    #: a push interrupts the generation in flight, which continues with the new weights
    partial_rollout: bool = True
    #: ours: with partial_rollout, new tokens per generation call (a push lands between two calls); 0: a
    #: quarter of data.max_response_length
    partial_rollout_tokens: int = 0

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, MODES)
        check_positive("staleness_threshold", self.staleness_threshold, allow_zero=True)
        check_positive("trigger_parameter_sync_step", self.trigger_parameter_sync_step)
        check_positive("require_batches", self.require_batches)
        check_positive("partial_rollout_tokens", self.partial_rollout_tokens, allow_zero=True)


def apply_verl_async_sizes(cfg: Any) -> None:
    """verl's fully async scripts size a run from the rollout's side; here the trainer's keys do. Derives
    them (the saved config holds the result, and deriving again changes nothing):

    - ``data.train_batch_size=0`` (verl ignores it in this mode): ``async_training.require_batches`` x
      ``actor_rollout_ref.actor.ppo_mini_batch_size``, fully_async mode only;
    - ``rollout.total_rollout_steps`` prompts: at most that // ``data.train_batch_size`` training steps;
    - ``rollout.total_epochs``: caps ``trainer.total_epochs``;
    - ``rollout.test_freq`` pushes: ``trainer.test_freq`` in steps.
    """
    at, data, trainer, rollout = cfg.async_training, cfg.data, cfg.trainer, cfg.rollout
    if data.train_batch_size == 0:
        if at.mode != "fully_async":
            raise ValueError(
                "data.train_batch_size=0 leaves the batch to async_training.mode=fully_async (require_batches x "
                f"actor_rollout_ref.actor.ppo_mini_batch_size), but async_training.mode={at.mode}: set "
                "data.train_batch_size to the prompts of one step"
            )
        data.train_batch_size = at.require_batches * cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    if rollout.total_rollout_steps is not None:
        steps = rollout.total_rollout_steps // data.train_batch_size
        if steps == 0:
            raise ValueError(
                f"rollout.total_rollout_steps={rollout.total_rollout_steps} prompts do not fill one step of "
                f"data.train_batch_size={data.train_batch_size}: raise rollout.total_rollout_steps"
            )
        trainer.total_training_steps = min(trainer.total_training_steps or steps, steps)
    if rollout.total_epochs is not None:
        trainer.total_epochs = min(trainer.total_epochs, rollout.total_epochs)
    if rollout.test_freq is not None:
        per_push = at.trigger_parameter_sync_step if at.mode == "fully_async" else 1
        trainer.test_freq = rollout.test_freq * per_push if rollout.test_freq > 0 else rollout.test_freq
