"""Validation: greedy (or sampled, mean@N) generation on the held-out prompts, scored by the reward."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import numpy as np

from verl.algos.agent.driver import AGENT_STATS, agent_metrics_of_stats
from verl.algos.config.schema import PPOConfig
from verl.algos.data import collate_fn
from verl.algos.trainer import rollout_phase as rollout

logger = logging.getLogger("verl.train")


def validate(actor_group: Any, reward_fn: Any, dataset: Any, cfg: PPOConfig, seed: int) -> dict[str, float]:
    """``val/acc`` (mean score over all prompts and samples), per data source ``val/<source>/acc``,
    ``val/mean@N`` when N > 1 samples are drawn per prompt, and ``val/agent/*`` (the agent metrics over
    every validation trajectory) when an agent loop rolled them out."""
    sampling = rollout.validation_sampling(cfg, seed)
    batch_size = cfg.data.val_batch_size or len(dataset)
    scores: list[float] = []
    sources: list[str] = []
    examples: list[tuple[str, float]] = []
    agent_stats: list[dict] = []
    for start in range(0, len(dataset), batch_size):
        prompts = collate_fn([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
        rollout.assign_uids(prompts, -1, start)
        batch = rollout.generate(actor_group, prompts, sampling, {})
        result = reward_fn(batch)
        agent_stats.extend(batch.non_tensor_batch.get(AGENT_STATS, []))
        scores.extend(result.reward_tensor.sum(-1).tolist())
        sources.extend(str(s) for s in batch.non_tensor_batch.get("data_source", ["unknown"] * len(batch)))
        if cfg.trainer.log_val_generations and len(examples) < cfg.trainer.log_val_generations:
            texts = reward_fn.tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
            examples.extend(zip(texts, result.reward_tensor.sum(-1).tolist()))
    for text, value in examples[: cfg.trainer.log_val_generations]:
        logger.info("validation sample (score %.2f): %r", value, text)
    metrics = {"val/acc": float(np.mean(scores))}
    by_source: dict[str, list[float]] = defaultdict(list)
    for source, value in zip(sources, scores):
        by_source[source].append(value)
    if len(by_source) > 1:
        for source, values in by_source.items():
            metrics[f"val/{source}/acc"] = float(np.mean(values))
    if sampling.n > 1:
        metrics[f"val/mean@{sampling.n}"] = metrics["val/acc"]
    if agent_stats:
        metrics.update({f"val/{key}": value for key, value in agent_metrics_of_stats(agent_stats).items()})
    return metrics
