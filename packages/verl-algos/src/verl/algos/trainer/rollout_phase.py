"""Generation and scoring of one training batch: prompts -> n responses each -> rewards.

Kept apart from the trainer loop because DAPO's dynamic sampling repeats exactly this until enough
informative groups are collected, and ReMax adds a greedy pass for its baseline.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algos.advantages import greedy_reward_baselines
from verl.algos.agent.driver import AGENT_STATS, agent_metrics_of_stats
from verl.algos.config.schema import PPOConfig
from verl.algos.run.timing import timer
from verl.core.engine import SamplingParams
from verl.core.protocol import DataProto

PROMPT_TENSORS = ("input_ids", "attention_mask", "position_ids")
#: Non-tensor fields an agent loop starts from (multi_turn.enable): sent to the rollout workers too.
AGENT_FIELDS = ("raw_prompt", "agent_name", "extra_info")


def training_sampling(cfg: PPOConfig, seed: int) -> SamplingParams:
    r = cfg.actor_rollout_ref.rollout
    return SamplingParams(
        n=r.n,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_new_tokens=cfg.data.max_response_length,
        seed=seed,
        logprobs=r.calculate_log_probs,
        do_sample=r.do_sample,
    )


def validation_sampling(cfg: PPOConfig, seed: int) -> SamplingParams:
    v = cfg.actor_rollout_ref.rollout.val_kwargs
    return SamplingParams(
        n=v.n,
        temperature=v.temperature if v.do_sample else 1.0,
        top_p=v.top_p,
        top_k=v.top_k,
        max_new_tokens=cfg.data.max_response_length,
        seed=seed,
        logprobs=False,
        do_sample=v.do_sample,
    )


def split_for_generation(prompts: DataProto) -> tuple[DataProto, DataProto]:
    """(what stays on the driver, what the rollout workers get: the prompt tensors and an agent loop's fields)."""
    rest = prompts.clone()
    gen_input = rest.pop(batch_keys=list(PROMPT_TENSORS))
    for key in AGENT_FIELDS:
        if key in rest.non_tensor_batch:
            gen_input.non_tensor_batch[key] = rest.non_tensor_batch[key]
    return rest, gen_input


def merge_output(rest: DataProto, sampling: SamplingParams, output: DataProto, metrics: dict[str, float]) -> DataProto:
    """The n-times repeated batch with the rollout workers' ``output`` (its metrics go to ``metrics``)."""
    for key, value in output.meta_info.pop("metrics", {}).items():
        metrics[key] = value
    batch = rest.repeat(sampling.n, interleave=True)
    batch.batch = output.batch
    for key, value in output.non_tensor_batch.items():  # what an agent loop adds (__num_turns__, tool_reward)
        batch.non_tensor_batch.setdefault(key, value)
    if AGENT_STATS in output.non_tensor_batch:  # the workers' metrics cover their own rows: recompute over all
        metrics.update(agent_metrics_of_stats(output.non_tensor_batch[AGENT_STATS]))
    return batch


class PendingGeneration:
    """A rollout under way on the rollout workers (``submit_generation``); ``result`` waits for it."""

    def __init__(self, rest: DataProto, sampling: SamplingParams, future: Any):
        self.rest = rest
        self.sampling = sampling
        self.future = future

    def result(self, metrics: dict[str, float]) -> DataProto:
        """The n-times repeated batch with responses; ``timing_s/gen`` is the time spent waiting here."""
        with timer("gen", metrics):
            output = self.future.get()
        return merge_output(self.rest, self.sampling, output, metrics)


def submit_generation(rollout_group: Any, prompts: DataProto, sampling: SamplingParams) -> PendingGeneration:
    """Start the rollout of ``prompts`` (tensors + non-tensors) without waiting for it."""
    rest, gen_input = split_for_generation(prompts)
    return PendingGeneration(rest, sampling, rollout_group.generate_sequences.submit(gen_input, sampling))


def generate(rollout_group: Any, prompts: DataProto, sampling: SamplingParams, metrics: dict[str, float]) -> DataProto:
    """Rollout of ``prompts`` (tensors + non-tensors); returns the n-times repeated batch with responses."""
    return submit_generation(rollout_group, prompts, sampling).result(metrics)


def score(reward_fn: Any, rm_group: Any, batch: DataProto, metrics: dict[str, float]) -> DataProto:
    """``token_level_scores`` (reward function, plus the reward model's score when enabled)."""
    with timer("reward", metrics):
        result = reward_fn(batch)
        result.apply_to(batch)
        metrics.update(result.metrics)
        if rm_group is not None:
            rm = rm_group.compute_rm_score(batch)
            batch.batch["token_level_scores"] = batch.batch["token_level_scores"] + rm.batch["rm_scores"]
            batch.batch["rm_scores"] = rm.batch["rm_scores"]
            metrics["reward_model/score/mean"] = float(rm.batch["rm_scores"].sum(-1).mean())
    return batch


def assign_uids(batch: DataProto, step: int, round_index: int = 0) -> None:
    """Deterministic prompt ids (the same on resume), fresh per generation round."""
    batch.non_tensor_batch["uid"] = np.array([f"{step}-{round_index}-{i}" for i in range(len(batch))], dtype=object)


def remax_baselines(
    rollout_group: Any, reward_fn: Any, prompts: DataProto, cfg: PPOConfig, seed: int, metrics: dict[str, float]
) -> torch.Tensor:
    """ReMax: the reward of each prompt's greedy response, repeated for its n samples."""
    greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=cfg.data.max_response_length, seed=seed)
    with timer("gen_max", metrics):
        greedy_batch = generate(rollout_group, prompts, greedy, {})
        result = reward_fn(greedy_batch)
    return greedy_reward_baselines(result.reward_tensor).repeat_interleave(cfg.actor_rollout_ref.rollout.n)
