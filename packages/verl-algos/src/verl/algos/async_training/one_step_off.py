"""``OneStepOffTrainer``: step k+1's rollout runs while step k trains (``async_training.mode=one_step_off``).

The schedule is verl's one-step-off-policy trainer's. At step k the trainer waits for batch k, pushes the
actor's current weights to the rollout pool, starts batch k+1's rollout with them, and trains on batch k
meanwhile. Batch k was generated with the weights from before step k-1's update, so every batch after the
first is one update stale (``async/staleness`` says how many updates a step's samples lag;
``param_version`` in a sample records the policy version that generated it). The PPO
ratio and any off-policy correction (``algorithm.rollout_correction``; the recipe ``grpo_one_step_off``
trains in bypass mode on the rollout's own log-probs, as verl's recipe does) see exactly that.

Generation and training overlap only when the rollout has devices of its own
(``actor_rollout_ref.hybrid_engine=false``; the config check requires it). ``timing_s/gen`` is the time
the trainer still waits for a batch.

A checkpoint records the data order's position before the batch drawn ahead, not that batch (nothing of it
has been trained on): a resumed run draws it again, generated with the resumed weights, so no prompt is lost
or trained on twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verl.algos.trainer import rollout_phase as rollout
from verl.algos.trainer.ppo_trainer import PPOTrainer
from verl.core.protocol import DataProto


@dataclass
class DrawnAhead:
    """A batch whose rollout is under way."""

    step: int
    #: the data order's position before this batch was drawn
    position: dict[str, int]
    #: the policy version generating it
    version: int
    generation: rollout.PendingGeneration


class OneStepOffTrainer(PPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ahead: DrawnAhead | None = None

    def _draw(self, step: int, metrics: dict[str, float]) -> DrawnAhead:
        """Start step ``step``'s rollout with the actor's current weights."""
        position = self.batch_order.state_dict()
        prompts = self._next_prompts(0, step)
        sampling = rollout.training_sampling(self.config, self.generation_seed(step))
        workers = self.generating_workers(metrics)  # pushes the weights first when the actor has stepped
        return DrawnAhead(step, position, self.policy_version, rollout.submit_generation(workers, prompts, sampling))

    def _generate_scored(self, metrics: dict[str, float]) -> DataProto:
        step = self.global_step
        current = self.ahead if self.ahead is not None else self._draw(step, metrics)
        if current.step != step:
            raise RuntimeError(f"the batch drawn ahead is step {current.step}'s, but this is step {step}")
        batch = current.generation.result(metrics)
        self.ahead = self._draw(step + 1, metrics) if step < self.total_steps else None
        batch.non_tensor_batch["param_version"] = np.full(len(batch), current.version, dtype=np.int64)
        metrics["async/staleness"] = float(self.policy_version - current.version)
        return rollout.score(self.reward_fn, self.rm, batch, metrics)

    def trained_position(self) -> dict[str, int]:
        return self.ahead.position if self.ahead is not None else self.batch_order.state_dict()

    def stop_workers(self) -> None:
        self.ahead = None  # its rollout dies with the workers; a resumed run draws it again
        super().stop_workers()
