"""A colocated actor + rollout worker as a trainer would build it, for the tests on real Ray workers.

It finds its engines through the registries (never by import path), like the algorithm packages.
"""

from __future__ import annotations

from rank_programs import token_mean_loss

from verl.core.controller import Dispatch, Worker, register
from verl.core.engine import SamplingParams
from verl.core.protocol import DataProto


class ActorRolloutWorker(Worker):
    def __init__(self, model_path: str, lr: float):
        self.model_path = model_path
        self.lr = lr

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> int:
        from verl.core.engine import EngineRegistry, RolloutRegistry
        from verl.core.plugins import load_plugins
        from verl.engines.hybrid import HybridEngine

        load_plugins()
        engine_cls = EngineRegistry.get("language_model", "fsdp2")
        self.actor = engine_cls(engine_cls.config_class(model_path=self.model_path, optim={"lr": self.lr}))
        self.actor.initialize()
        rollout_cls = RolloutRegistry.get("hf")
        self.rollout = rollout_cls(
            rollout_cls.config_class(model_path=self.model_path, load_format="dummy", sleep_level=2)
        )
        self.hybrid = HybridEngine(self.actor, self.rollout)
        return self.actor.dp_size

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        return self.hybrid.generate(prompts, sampling)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, batch: DataProto) -> DataProto:
        with self.actor.eval_mode():
            out = self.actor.forward_only(batch)
        return DataProto.from_dict({"old_log_probs": out["log_probs"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def update_actor(self, batch: DataProto) -> dict:
        with self.actor.train_mode():
            self.actor.optimizer_zero_grad()
            metrics = self.actor.forward_backward(batch, token_mean_loss)
            metrics["grad_norm"] = self.actor.optimizer_step()
            self.actor.lr_scheduler_step()
        return metrics

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.actor.save_checkpoint(path)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def full_parameters(self) -> dict:
        with self.actor.eval_mode():
            return {name: tensor.clone() for name, tensor in self.actor.named_full_parameters()}
