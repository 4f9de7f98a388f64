"""The PPO update loop shared by the actor and the critic: epochs over mini-batches, each one optimizer
step with gradients accumulated over the engine's micro-batches."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from verl.algos.losses.aggregation import LossNormalizer, global_normalizer
from verl.core.engine import LossFn, TrainingEngine
from verl.core.protocol import DataProto


def ppo_update(
    engine: TrainingEngine,
    data: DataProto,
    *,
    mini_batch_rows: int,
    epochs: int,
    shuffle: bool,
    seed: int,
    make_loss_fn: Callable[[LossNormalizer], LossFn],
    metric_prefix: str,
) -> dict[str, list[float]]:
    """Run ``epochs`` passes over ``data`` (this rank's shard) in mini-batches of ``mini_batch_rows``.

    Every rank holds the same number of rows (the dispatcher pads), so every rank runs the same number
    of mini-batches and their collectives line up. The loss normalizer of each mini-batch is counted
    over all data-parallel ranks before its micro-batches run (see ``verl.algos.losses.aggregation``).
    """
    metrics: dict[str, list[float]] = defaultdict(list)
    mini_batch_rows = max(1, min(mini_batch_rows, len(data)))
    for epoch in range(epochs):
        if shuffle:
            generator = torch.Generator().manual_seed(seed * 1000 + epoch)
            data = data[torch.randperm(len(data), generator=generator)]
        for mini in data.split(mini_batch_rows):
            # dp_size=1: training engines sum gradients over ranks (see verl.core.engine.LossFn).
            normalizer = global_normalizer(mini.batch["response_mask"], group=engine.dp_group, dp_size=1)
            engine.optimizer_zero_grad()
            step_metrics = engine.forward_backward(mini, make_loss_fn(normalizer))
            grad_norm = engine.optimizer_step()
            for key, values in step_metrics.items():
                metrics[key].extend(values if isinstance(values, list) else [values])
            metrics[f"{metric_prefix}/grad_norm"].append(grad_norm)
    return dict(metrics)


def update_role(
    engine: TrainingEngine,
    data: DataProto,
    *,
    mini_batch_rows: int,
    epochs: int,
    shuffle: bool,
    make_loss_fn: Callable[[LossNormalizer], LossFn],
    metric_prefix: str,
) -> dict[str, float]:
    """One role's update in a training step: :func:`ppo_update` in train mode (its shuffle seeded by the
    batch's ``global_step``), then the lr schedule's step. The metrics averaged over micro-batches, with
    ``<prefix>/lr`` and ``timing_s/update_<prefix>_in_worker``."""
    start = time.perf_counter()
    with engine.train_mode():
        metrics = ppo_update(
            engine,
            data,
            mini_batch_rows=mini_batch_rows,
            epochs=epochs,
            shuffle=shuffle,
            seed=int(data.meta_info.get("global_step", 0)),
            make_loss_fn=make_loss_fn,
            metric_prefix=metric_prefix,
        )
        lr = engine.lr_scheduler_step()
    result = mean_metrics(metrics)
    result[f"{metric_prefix}/lr"] = lr
    result[f"timing_s/update_{metric_prefix}_in_worker"] = time.perf_counter() - start
    return result


def one_update_per_batch(config: Any) -> bool:
    """True when the actor makes one optimizer step over the whole batch (one PPO epoch, one
    mini-batch): the policy being updated is then the one that sampled the batch (on-policy)."""
    actor = config.actor_rollout_ref.actor
    return actor.ppo_epochs == 1 and actor.ppo_mini_batch_size >= config.data.train_batch_size


def mean_metrics(metrics: dict[str, list[Any]]) -> dict[str, float]:
    return {k: float(sum(v) / len(v)) for k, v in metrics.items() if v and all(isinstance(x, (int, float)) for x in v)}
