"""Role workers: one implementation for every training backend, built from the engine registries."""

from verl.algos.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.algos.workers.critic import CriticWorker
from verl.algos.workers.reward_model import RewardModelWorker
from verl.algos.workers.rollout import RolloutWorker

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker", "RolloutWorker"]
