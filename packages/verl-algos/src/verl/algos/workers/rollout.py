"""``RolloutWorker``: a rollout engine on a pool of its own (``actor_rollout_ref.hybrid_engine=false``).

Each process is one data-parallel rollout replica. Its engine starts with placeholder weights and stays
awake for the whole run (it shares its devices with nothing); the actor's weights arrive over the weight
channel (``WeightReceiver``) before it first generates and after every update the trainer pushes.
"""

from __future__ import annotations

import time

from verl.algos.config.schema import PPOConfig
from verl.algos.workers.rollout_host import RolloutHost
from verl.algos.workers.weight_sync import WeightReceiver
from verl.core.controller import Dispatch, Worker, register
from verl.core.engine import SamplingParams
from verl.core.protocol import DataProto
from verl.core.seeding import seed_host_rngs


class RolloutWorker(Worker, RolloutHost, WeightReceiver):
    def __init__(self, config: PPOConfig):
        self.config = config
        self.rollout = None
        self.agent_context = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, int]:
        from verl.engines.model_zoo import resolve_model_path

        seed_host_rngs(self.config.trainer.seed)
        model_path = resolve_model_path(self.config.actor_rollout_ref.model.path)
        self.set_dp_info(self.rank, self.world_size, True)
        self.build_rollout(model_path, self.world_size)
        self.rollout.wake_up()
        return {"dp_size": self.world_size}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def token_ids(self) -> dict[str, object]:
        """The engine's eos and pad ids (the driver continues partial rollouts with them)."""
        return {"eos_token_ids": list(self.rollout.eos_token_ids), "pad_token_id": int(self.rollout.pad_token_id)}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """Generate (through the agent loops with multi_turn.enable) with the weights last pushed."""
        if self.weight_version == 0:
            raise RuntimeError(
                "generate_sequences before any weights arrived: the rollout holds placeholder weights; push the "
                "actor's first (WeightSync.push)"
            )
        start = time.perf_counter()
        if self.agent_context is not None:
            output = self.agent_generate(self.rollout, prompts, sampling)
        else:
            output = self.rollout.generate(prompts, sampling)
        metrics = output.meta_info.setdefault("metrics", {})
        metrics["timing_s/rollout_generate"] = metrics["timing_s/generate_in_worker"] = time.perf_counter() - start
        return output
