"""``PPOTrainer``: the single controller. It runs the RL dataflow as plain Python and calls the worker
groups for everything that touches a model:

    prompts -> n responses each (hybrid engine) -> rewards (function and/or model) -> old log-probs
    -> reference log-probs (KL) -> values (critic) -> advantages -> critic and actor updates -> metrics

plus validation, checkpoints (verl's layout, crash-safe) and resume, and tracking.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import torch

from verl.algos.advantages import compute_advantage, get_adv_estimator
from verl.algos.advantages.pf_ppo import pf_ppo_resample
from verl.algos.advantages.registry import uses_critic
from verl.algos.config.placement import GLOBAL_POOL, plan_placement
from verl.algos.config.schema import PPOConfig
from verl.algos.data import collate_fn
from verl.algos.data.chat_template import set_chat_template
from verl.algos.data.dataset import load_rl_dataset
from verl.algos.data.dynamic_sampling import DynamicSampler
from verl.algos.data.metrics import compute_data_metrics, rollout_mismatch_metrics
from verl.algos.data.source import ResumableBatchOrder, resolve_files
from verl.algos.losses.kl_control import apply_kl_penalty, build_kl_controller
from verl.algos.rewards import REWARD_MANAGERS, build_reward_manager, load_reward_fn
from verl.algos.rewards.default import check_builtin_scoring
from verl.algos.rollout_correction import (
    apply_bypass_mode,
    apply_decoupled_correction,
)
from verl.algos.run.loop import RunLoop, reduce_over_ranks
from verl.algos.run.nonfinite import NonFiniteError, describe, nonfinite_rows, sample_ids
from verl.algos.run.timing import timer
from verl.algos.trainer import rollout_phase as rollout
from verl.algos.trainer.balance import balance_batch
from verl.algos.trainer.step_metrics import (
    entropy_metric,
    mfu_metrics,
    model_flops_info,
    throughput_metrics,
)
from verl.algos.trainer.validation import validate
from verl.algos.workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker, RolloutWorker
from verl.algos.workers.update_loop import one_update_per_batch
from verl.algos.workers.weight_sync import WeightSync
from verl.core.controller import ResourcePool, WorkerGroup
from verl.core.platform import get_platform
from verl.core.protocol import DataProto
from verl.core.seeding import seed_host_rngs

logger = logging.getLogger("verl.train")


def reward_manager_kwargs(cfg: PPOConfig) -> dict[str, Any]:
    """The reward manager's keyword arguments: what its class takes from the run config (dapo: the
    overlong buffer), then ``reward_model.reward_kwargs`` as verl passes them (its ``overlong_buffer_cfg``
    is our ``overlong_buffer``)."""
    manager = REWARD_MANAGERS.get(cfg.reward_model.reward_manager)
    from_config = getattr(manager, "kwargs_from_config", None)
    kwargs: dict[str, Any] = from_config(cfg) if from_config else {}
    extra = dict(cfg.reward_model.reward_kwargs)
    if "overlong_buffer_cfg" in extra:
        extra["overlong_buffer"] = extra.pop("overlong_buffer_cfg")
    return {**kwargs, **extra}


class PPOTrainer(RunLoop):
    def __init__(self, config: PPOConfig, model_path: str):
        """``model_path``: the actor's resolved local folder (checked before Ray starts)."""
        super().__init__()
        self.config = config
        self.model_path = model_path
        self.local_dir = config.trainer.default_local_dir
        # What runs follows from what the estimator declares it needs (its registry entry), not its name.
        self.use_critic = uses_critic(config.algorithm.adv_estimator)
        self.use_ref = config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward
        # On-policy updates use their own detached log-probs as the old ones (see update_actor); the KL
        # penalty in the reward, decoupled rollout correction and some estimators still need them before the
        # update. Rollout correction's bypass mode takes the rollout's log-probs instead.
        rollout_correction = config.algorithm.rollout_correction
        estimator_needs = get_adv_estimator(config.algorithm.adv_estimator).required_fields
        self.estimator_needs = frozenset(estimator_needs)
        self.bypass_mode = rollout_correction.bypass_mode
        self.needs_old_log_prob = not self.bypass_mode and (
            not one_update_per_batch(config)
            or config.algorithm.use_kl_in_reward
            or config.actor_rollout_ref.actor.recompute_old_log_prob
            or rollout_correction.decoupled
            or "old_log_probs" in estimator_needs
        )
        self.needs_sum_pi_squared = (
            "sum_pi_squared" in estimator_needs or config.actor_rollout_ref.actor.calculate_sum_pi_squared
        )
        self.checkpoints_to_keep = config.trainer.max_actor_ckpt_to_keep
        #: one colocated group per resource pool (the global pool's first)
        self.groups: list[WorkerGroup] = []
        #: the pools of roles placed apart from the global pool (``self.pool``)
        self.own_pools: list[ResourcePool] = []
        self.pool: ResourcePool | None = None
        #: who generates: the actor's workers (the hybrid engine), or the rollout pool's
        self.rollout_workers: Any = None
        #: hybrid_engine=false: the weight channel to the rollout pool (None with the hybrid engine)
        self.weight_sync: WeightSync | None = None
        #: actor updates in this process so far: the version of the policy that generates next
        self.policy_version = 0

    # -- setup ----------------------------------------------------------------------------------------
    def setup_data(self, cache_dir: str | None = None) -> None:
        """Tokenizer, datasets and reward manager: everything that can fail on bad input, before Ray.
        Built-in tasks are generated under ``cache_dir`` (default: the run folder's ``data/``)."""
        seed_host_rngs(self.config.trainer.seed)  # the driver runs the reward functions
        from transformers import AutoTokenizer

        cfg = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.tokenizer_path or self.model_path)
        if cfg.actor_rollout_ref.model.custom_chat_template:
            set_chat_template(self.tokenizer, cfg.actor_rollout_ref.model.custom_chat_template)
        self._load_datasets(cache_dir or os.path.join(self.local_dir, "data"))
        self.plan_steps(cfg.actor_rollout_ref.actor.optim, cfg.critic.optim)
        self._build_reward()
        self.kl_ctrl = build_kl_controller(cfg.algorithm.kl_ctrl)
        self.flops_info = model_flops_info(self.model_path)

    def _load_datasets(self, cache: str) -> None:
        data = self.config.data
        builtin = dict(data.builtin)
        dataset_args = dict(
            tokenizer=self.tokenizer,
            max_prompt_length=data.max_prompt_length,
            prompt_key=data.prompt_key,
            filter_overlong_prompts=data.filter_overlong_prompts,
            truncation=data.truncation,
            plain_prompt_fallback=data.plain_prompt_fallback,
            apply_chat_template_kwargs=data.apply_chat_template_kwargs,
            # agent loops start from the messages (verl's data.return_raw_chat, implied by multi_turn.enable)
            return_raw_chat=self.config.actor_rollout_ref.rollout.multi_turn.enable,
        )
        self.train_dataset = load_rl_dataset(
            "data.train_files",
            resolve_files(data.train_files, "train", builtin, cache),
            max_samples=data.train_max_samples,
            **dataset_args,
        )
        self.val_dataset = load_rl_dataset(
            "data.val_files",
            resolve_files(data.val_files, "test", builtin, cache),
            max_samples=data.val_max_samples,
            **dataset_args,
        )
        if len(self.val_dataset) == 0:
            raise ValueError(
                "the validation set is empty after filtering; check data.val_files and data.max_prompt_length"
            )
        self.batch_order = ResumableBatchOrder(
            len(self.train_dataset), data.train_batch_size, shuffle=data.shuffle, seed=data.seed
        )

    def _build_reward(self) -> None:
        cfg = self.config
        if not cfg.custom_reward_function.path:  # every row must be scorable by its built-in reward function
            check_builtin_scoring(self.train_dataset.source_rows(), "data.train_files")
            check_builtin_scoring(self.val_dataset.source_rows(), "data.val_files")
        try:
            self.reward_fn = build_reward_manager(
                cfg.reward_model.reward_manager,
                self.tokenizer,
                compute_score=load_reward_fn(cfg.custom_reward_function),
                timeout_s=cfg.reward_model.timeout_s,
                **reward_manager_kwargs(cfg),
            )
        except TypeError as exc:  # a reward_kwargs key the manager does not take
            raise ValueError(f"reward_model.reward_kwargs: {exc}") from None

    def start_workers(self) -> None:
        """One colocated worker group per resource pool, hosting the roles placed there (see
        ``config.placement``; by default every role shares the global pool)."""
        cfg = self.config
        processes = cfg.trainer.n_gpus_per_node
        self.num_devices = processes * cfg.trainer.nnodes
        placement = plan_placement(cfg)
        self.pool = self.start_ray(placement.processes)
        hybrid = cfg.actor_rollout_ref.hybrid_engine
        actor_role = ("actor_rollout" if hybrid else "actor") + ("_ref" if self.use_ref else "")
        specs: dict[str, Any] = {
            "actor_rollout_ref": (ActorRolloutRefWorker, (cfg, actor_role), {}),
            "rollout": (RolloutWorker, (cfg,), {}),
            "critic": (CriticWorker, (cfg,), {}),
            "rm": (RewardModelWorker, (cfg,), {}),
        }
        handles: dict[str, Any] = {}
        pools = {GLOBAL_POOL: self.pool}
        for name, nodes in placement.pools.items():
            if name != GLOBAL_POOL:
                pools[name] = ResourcePool(process_on_nodes=nodes)
                self.own_pools.append(pools[name])
        for pool in pools.values():
            pool.slots()  # every pool placed before any process starts: each then knows who shares its cores
        for name, pool in pools.items():
            roles = {role: specs[role] for role in placement.roles_in(name)}
            group = WorkerGroup.colocated(pool, roles, call_timeout_s=cfg.trainer.worker_timeout_s)
            self.groups.append(group)
            handles.update({role: getattr(group, role) for role in roles})
            logger.info("placement: %s, pids %s: %s", name, [site.pid for site in group.sites], ", ".join(roles))
        self.actor = handles["actor_rollout_ref"]
        self.critic = handles.get("critic")
        self.rm = handles.get("rm")
        # data-parallel replicas of the actor: every device for FSDP, devices / (TP x PP) for megatron
        self.dp_size = int(self.actor.init_model()[0]["dp_size"])
        if self.critic is not None:
            self.critic.init_model()
        if self.rm is not None:
            self.rm.init_model()
        self.rollout_workers = handles.get("rollout", self.actor)
        if not hybrid:
            self.rollout_workers.init_model()
            self.weight_sync = WeightSync(self.actor, self.rollout_workers)
            self.weight_sync.open()
        # the processes sharing a node with a trainer process (a CPU's cores are split between all pools' ones)
        sharing = sum(nodes[0] for nodes in placement.pools.values())
        self.peak_flops = get_platform().peak_flops(torch.float32, workers_on_node=sharing)

    # -- checkpoints ------------------------------------------------------------------------------------
    def checkpoint_roles(self) -> dict[str, Any]:
        roles = {"actor": self.actor}
        if self.critic is not None:
            roles["critic"] = self.critic
        return roles

    def extra_state(self) -> dict[str, Any]:
        return {"kl_coef": self.kl_ctrl.value}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.kl_ctrl.value = float(state.get("kl_coef", self.kl_ctrl.value))
        if self.weight_sync is not None:  # the actor's weights came from the checkpoint
            self.weight_sync.stale = True

    def generating_workers(self, metrics: dict[str, float]) -> Any:
        """The workers that generate, holding the actor's current weights (a rollout pool of its own
        gets them pushed first when the actor has stepped since the last push)."""
        if self.weight_sync is not None and self.weight_sync.stale:
            metrics.update(self.weight_sync.push())
        return self.rollout_workers

    @property
    def strategy(self) -> str:
        return self.config.actor_rollout_ref.actor.strategy

    # -- one step ---------------------------------------------------------------------------------------
    def _next_prompts(self, round_index: int, step: int) -> DataProto:
        prompts = collate_fn([self.train_dataset[i] for i in self.batch_order.next_batch()])
        rollout.assign_uids(prompts, step, round_index)
        return prompts

    def generation_seed(self, step: int) -> int:
        """The sampling seed of step ``step``'s rollouts (the same on resume)."""
        return self.config.trainer.seed * 1_000_003 + step

    def _generate_scored(self, metrics: dict[str, float]) -> DataProto:
        cfg = self.config
        step = self.global_step
        seed = self.generation_seed(step)
        sampling = rollout.training_sampling(cfg, seed)

        def one_round(round_index: int) -> DataProto:
            prompts = self._next_prompts(round_index, step)
            workers = self.generating_workers(metrics)
            batch = rollout.generate(workers, prompts, sampling, metrics)
            if "reward_baselines" in self.estimator_needs:  # ReMax: the reward of a greedy response
                batch.batch["reward_baselines"] = rollout.remax_baselines(
                    workers, self.reward_fn, prompts, cfg, seed, metrics
                )
            return rollout.score(self.reward_fn, self.rm, batch, metrics)

        if not cfg.algorithm.filter_groups.enable:
            return one_round(0)
        fg = cfg.algorithm.filter_groups
        sampler = DynamicSampler(cfg.data.train_batch_size, fg.metric, fg.max_num_gen_batches)
        round_index = 0
        while not sampler.ready and not sampler.exhausted:
            sampler.add(one_round(round_index))
            round_index += 1
        batch, sampling_metrics = sampler.pop()
        metrics.update(sampling_metrics)
        return batch

    def train_step(self) -> dict[str, float]:
        cfg = self.config
        metrics: dict[str, float] = {}
        step_start = time.perf_counter()
        batch = self._generate_scored(metrics)
        batch.meta_info["global_step"] = self.global_step
        if cfg.trainer.balance_batch:
            metrics.update(balance_batch(batch, self.dp_size))
        if self.bypass_mode:
            apply_bypass_mode(batch)
        if self.needs_old_log_prob:
            if self.needs_sum_pi_squared:
                batch.meta_info["compute_sum_pi_squared"] = True
            with timer("old_log_prob", metrics):
                batch = batch.union(self.actor.compute_log_prob(batch))
            metrics.update(entropy_metric(batch))
            if "rollout_log_probs" in batch.batch.keys():
                t = batch.batch
                metrics.update(rollout_mismatch_metrics(t["rollout_log_probs"], t["old_log_probs"], t["response_mask"]))
        if self.use_ref:
            with timer("ref", metrics):
                batch = batch.union(self.actor.compute_ref_log_prob(batch))
        if self.use_critic:
            with timer("values", metrics):
                batch = batch.union(self.critic.compute_values(batch))
        with timer("adv", metrics):
            if cfg.algorithm.use_kl_in_reward:
                batch, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl, cfg.algorithm.kl_penalty)
                metrics.update(kl_metrics)
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            if cfg.algorithm.rollout_correction.decoupled:
                metrics.update(apply_decoupled_correction(batch, cfg.algorithm.rollout_correction))
            compute_advantage(batch, cfg.algorithm.adv_estimator, cfg.algorithm)
            if cfg.algorithm.use_pf_ppo:
                seeded = torch.Generator().manual_seed(cfg.trainer.seed * 1_000_003 + self.global_step)
                pf = cfg.algorithm.pf_ppo
                batch = pf_ppo_resample(batch, pf.reweight_method, pf.weight_pow, generator=seeded)
        t = batch.batch
        returns = t["returns"] if "returns" in t.keys() else None
        bad = nonfinite_rows(t["response_mask"], t["token_level_rewards"], t["advantages"], returns)
        if bad:
            self._nonfinite("rewards or advantages", sample_ids(batch, bad), metrics)
            return self._finish_step(batch, metrics, step_start)
        if self.use_critic:
            with timer("update_critic", metrics):
                metrics.update(reduce_over_ranks(self.critic.update_critic(batch)))
        if self.global_step < cfg.trainer.critic_warmup:  # verl's rule: the actor starts at step critic_warmup
            return self._finish_step(batch, metrics, step_start)
        with timer("update_actor", metrics):
            per_rank = self.actor.update_actor(batch)
        self.policy_version += 1
        if self.weight_sync is not None:
            self.weight_sync.stale = True
        culprits = [name for result in per_rank for name in result.pop("nonfinite_samples", [])]
        metrics.update(reduce_over_ranks(per_rank))
        if culprits or not math.isfinite(metrics["actor/grad_norm"]):
            # the engine already skipped the optimizer step on every rank (the grad norm is global)
            self._nonfinite("loss or gradients", culprits, metrics)
        return self._finish_step(batch, metrics, step_start)

    def _nonfinite(self, where: str, ids: list[str], metrics: dict[str, float]) -> None:
        message = describe(self.global_step, where, ids)
        if self.config.trainer.nonfinite == "stop":
            raise NonFiniteError(
                f"{message}. Stopping (trainer.nonfinite=stop); the last complete checkpoint is kept. Set "
                "trainer.nonfinite=skip to skip such steps instead"
            )
        logger.warning("%s; skipping the step (trainer.nonfinite=skip): the weights are unchanged", message)
        metrics["training/nonfinite_skipped"] = 1.0

    def _finish_step(self, batch: DataProto, metrics: dict[str, float], step_start: float):
        updated = metrics.setdefault("training/nonfinite_skipped", 0.0) == 0.0  # _nonfinite sets 1 on a skip
        metrics.update(compute_data_metrics(batch, use_critic=self.use_critic))
        step_time = time.perf_counter() - step_start
        metrics["timing_s/step"] = step_time
        metrics.update(throughput_metrics(batch, step_time, self.num_devices))
        if updated and "timing_s/update_actor" in metrics:  # not during trainer.critic_warmup
            metrics.update(
                mfu_metrics(batch, metrics["timing_s/update_actor"], self.flops_info, self.peak_flops, self.num_devices)
            )
        return metrics

    # -- the loop (RunLoop.fit) -------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        seed = self.config.trainer.seed * 1_000_003 - 1
        metrics: dict[str, float] = {}
        workers = self.generating_workers(metrics)
        return {**metrics, **validate(workers, self.reward_fn, self.val_dataset, self.config, seed)}

    def stop_workers(self) -> None:
        """Kill the worker processes and free their placement groups (for the next run in this process, or
        for new workers after a fault). Tracking stays open."""
        for group in self.groups:
            group.shutdown()
        self.groups = []
        self.rollout_workers = self.weight_sync = None
        for pool in [*self.own_pools, self.pool]:
            if pool is not None:
                pool.shutdown()
        self.own_pools = []
        self.pool = None
