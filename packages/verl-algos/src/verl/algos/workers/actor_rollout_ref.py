"""``ActorRolloutRefWorker``: the actor, its rollout engine and the reference policy in one process per
device (the hybrid engine). Engines come from the registries by ``actor.strategy`` and ``rollout.name``,
so this one worker drives every training and rollout backend. With ``actor_rollout_ref.hybrid_engine=false``
the rollout runs on a pool of its own (``RolloutWorker``) and this worker sends it the weights
(``WeightSender``).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import torch

from verl.algos.config.schema import PPOConfig
from verl.algos.data.metrics import rollout_mismatch_metrics
from verl.algos.losses.actor import make_actor_loss_fn
from verl.algos.run.nonfinite import nonfinite_rows, sample_ids
from verl.algos.workers.engine_config import (
    engine_takes,
    megatron_setting,
    role_setting,
    training_engine_values,
)
from verl.algos.workers.engine_worker import EngineWorker
from verl.algos.workers.rollout_host import RolloutHost
from verl.algos.workers.update_loop import one_update_per_batch, update_role
from verl.algos.workers.weight_sync import WeightSender
from verl.core.controller import Dispatch, register
from verl.core.engine import LANGUAGE_MODEL, EngineRegistry, SamplingParams
from verl.core.protocol import DataProto

logger = logging.getLogger(__name__)


#: role -> (has the actor, has the rollout engine, has the reference)
ROLES = {
    "actor_rollout_ref": (True, True, True),
    "actor_rollout": (True, True, False),
    "actor_ref": (True, False, True),
    "actor": (True, False, False),
    "ref": (False, False, True),
}


class ActorRolloutRefWorker(EngineWorker, RolloutHost, WeightSender):
    """``role``: which of the actor, the rollout engine and the reference this worker holds (``ROLES``).
    Checkpoints and exports are the actor's (the reference's where there is no actor)."""

    def __init__(self, config: PPOConfig, role: str = "actor_rollout_ref"):
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; one of {sorted(ROLES)}")
        super().__init__(config)
        self.role = role
        self.actor = self.rollout = self.ref = self.hybrid = None
        self.agent_context = None  # multi_turn.enable: what the agent loops share (tokenizer, tools, limits)

    # -- setup --------------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        cfg = self.config.actor_rollout_ref
        model_path = self.begin_init(cfg.model.path)
        strategy = cfg.actor.strategy
        engine_cls = EngineRegistry.get(LANGUAGE_MODEL, strategy)
        has_actor, has_rollout, has_ref = ROLES[self.role]
        if has_actor:
            self.actor = self.build_engine(engine_cls, self._actor_values(model_path), strategy)
        if has_rollout:
            from verl.engines.hybrid import HybridEngine

            self.build_rollout(model_path, self.actor.dp_size)
            self.hybrid = HybridEngine(self.actor, self.rollout)
        if has_actor and has_ref and cfg.model.lora_rank:
            # LoRA: the reference is the actor's base model with the adapter off, no second copy (as verl)
            self.ref = self.actor.adapter_disabled_reference()
        elif has_ref:
            setting = functools.partial(role_setting, self.config)
            values = self._actor_values(model_path)
            values["fsdp_config"] = setting("actor_rollout_ref.ref.fsdp_config")
            values["megatron"] = (
                megatron_setting(self.config, "actor_rollout_ref.ref.megatron")
                if engine_takes(engine_cls.config_class, "megatron")
                else setting("actor_rollout_ref.ref.megatron")
            )
            values["log_prob_micro_batch_size_per_gpu"] = setting(
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"
            )
            values["log_prob_use_dynamic_bsz"] = setting("actor_rollout_ref.ref.log_prob_use_dynamic_bsz")
            values["log_prob_max_token_len_per_gpu"] = setting("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu")
            # values["optim"] is the actor's: the reference never steps, so its optimizer is never used.
            values.pop("lora", None)  # a reference of its own is the base model
            self.ref = self.build_engine(engine_cls, values, strategy)
        self.engine = self.actor or self.ref
        return {"model_path": model_path, "dp_size": self.engine.dp_size}

    def _actor_values(self, model_path: str) -> dict[str, Any]:
        cfg = self.config.actor_rollout_ref
        setting = functools.partial(role_setting, self.config)
        return training_engine_values(
            model_path=model_path,
            model=cfg.model,
            model_key="actor_rollout_ref.model",
            optim=cfg.actor.optim,
            fsdp_config=setting("actor_rollout_ref.actor.fsdp_config"),
            megatron=setting("actor_rollout_ref.actor.megatron"),
            micro_batch_size=cfg.actor.ppo_micro_batch_size_per_gpu,
            use_dynamic_bsz=setting("actor_rollout_ref.actor.use_dynamic_bsz"),
            max_token_len=setting("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
            seed=self.config.trainer.seed,
            forward_micro_batch_size=cfg.rollout.log_prob_micro_batch_size_per_gpu,
            forward_use_dynamic_bsz=setting("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz"),
            forward_max_token_len=setting("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"),
            # The reference follows it too (it shares these processes and their data-parallel layout;
            # the config check refuses a different actor_rollout_ref.ref.ulysses_sequence_parallel_size).
            sequence_parallel=setting("actor_rollout_ref.actor.ulysses_sequence_parallel_size"),
        )

    # -- rollout ------------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """Sync the actor's weights into the rollout engine, generate (through the agent loops with
        multi_turn.enable), and return to training."""
        start = time.perf_counter()
        output = self.hybrid.generate(prompts, sampling, via=self.agent_generate if self.agent_context else None)
        output.meta_info.setdefault("metrics", {})["timing_s/generate_in_worker"] = time.perf_counter() - start
        return output

    # -- log-probs ----------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """The actor's log-probs of the responses (``old_log_probs``) and their ``entropys``; also
        ``sum_pi_squared`` when ``meta_info["compute_sum_pi_squared"]`` (the optimal token baseline)."""
        data.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        with self.actor.eval_mode():
            out = self.actor.forward_only(data, compute_entropy=True)
        fields = {"old_log_probs": out["log_probs"], "entropys": out["entropy"]}
        if "sum_pi_squared" in out:
            fields["sum_pi_squared"] = out["sum_pi_squared"]
        return DataProto.from_dict(fields)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        data.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        with self.ref.eval_mode():
            out = self.ref.forward_only(data)
        return DataProto.from_dict({"ref_log_prob": out["log_probs"]})

    # -- update -------------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO epochs over mini-batches of this rank's shard; one lr-schedule step per call.

        Without ``old_log_probs`` in ``data`` (the trainer skips that pass when the update is one
        optimizer step over the whole batch) the update's own log-probs stand in for them, and the
        rollout-vs-training mismatch metrics are computed from them here."""
        cfg = self.config.actor_rollout_ref
        data.meta_info["temperature"] = cfg.rollout.temperature
        data.meta_info["compute_entropy"] = True
        on_policy = "old_log_probs" not in data.batch.keys()
        rows = self._mini_batch_rows(data, on_policy)
        data.batch["row_index"] = torch.arange(len(data))
        train_log_probs = torch.zeros_like(data.batch["responses"], dtype=torch.float32) if on_policy else None
        nonfinite: list[int] = []  # rows of micro-batches whose loss was NaN/inf
        make_loss_fn = self._checked_loss_factory(on_policy, train_log_probs, nonfinite)

        result = update_role(
            self.actor,
            data,
            mini_batch_rows=rows,
            epochs=cfg.actor.ppo_epochs,
            shuffle=cfg.actor.shuffle,
            make_loss_fn=make_loss_fn,
            metric_prefix="actor",
        )
        if train_log_probs is not None and "rollout_log_probs" in data.batch.keys():
            result.update(
                rollout_mismatch_metrics(data.batch["rollout_log_probs"], train_log_probs, data.batch["response_mask"])
            )
        # not a metric: the trainer pops it (ids of the samples whose loss was not finite)
        result["nonfinite_samples"] = sample_ids(data, sorted(set(nonfinite)))
        return result

    def _mini_batch_rows(self, data: DataProto, on_policy: bool) -> int:
        cfg = self.config.actor_rollout_ref
        if one_update_per_batch(self.config):
            return len(data)  # the dispatcher's padding rows must not start a second mini-batch
        if on_policy:
            raise ValueError(
                "update_actor got no old_log_probs but the update is not one optimizer step over the batch "
                f"(ppo_epochs={cfg.actor.ppo_epochs}, ppo_mini_batch_size={cfg.actor.ppo_mini_batch_size} < "
                f"train_batch_size={self.config.data.train_batch_size}): compute them with compute_log_prob first"
            )
        # verl counts ppo_mini_batch_size in prompts; each has rollout.n responses, split over dp ranks.
        return cfg.actor.ppo_mini_batch_size * cfg.rollout.n // self.actor.dp_size

    def _checked_loss_factory(self, on_policy: bool, train_log_probs: torch.Tensor | None, nonfinite: list[int]):
        """``make_loss_fn`` for ``ppo_update``: the actor's loss, which also keeps the update's own log-probs
        (on-policy: they are the old ones) and the rows of any micro-batch whose loss is not finite."""
        cfg = self.config.actor_rollout_ref

        def make_loss_fn(normalizer):
            loss_fn = make_actor_loss_fn(
                cfg.actor, normalizer, on_policy=on_policy, rollout_correction=self.config.algorithm.rollout_correction
            )

            def checked_loss_fn(outputs, micro):
                rows = micro.batch["row_index"].cpu()
                if train_log_probs is not None:
                    train_log_probs[rows] = outputs["log_probs"].detach().float().cpu()
                loss, metrics = loss_fn(outputs, micro)
                if not bool(torch.isfinite(loss)):
                    # its gradients make the engine skip the optimizer step; name the samples behind it
                    culprits = nonfinite_rows(
                        micro.batch["response_mask"], outputs["log_probs"], outputs.get("entropy")
                    )
                    nonfinite.extend(rows[culprits].tolist() if culprits else rows.tolist())
                return loss, metrics

            return checked_loss_fn

        return make_loss_fn
