"""DAPO's dynamic sampling (``algorithm.filter_groups``): keep only prompt groups whose responses
disagree on a metric, and generate more rounds until the batch has ``train_batch_size`` prompts.

A group whose responses all score the same (all right, or all wrong) has zero group-relative
advantage and only dilutes the gradient (Yu et al. 2025, DAPO, arXiv:2503.14476). The metric is
``seq_reward`` (sum of token_level_scores), ``seq_final_reward`` (sum of token_level_rewards), or any
per-sample non-tensor field, e.g. ``score`` or ``acc`` from the reward's extra info. As in verl, a
group of one response is kept.

Usage in a trainer (``generate_round`` returns a scored DataProto with the non-tensor ``uid``)::

    batch, metrics = collect_dynamic_batch(generate_round, train_batch_size=cfg.data.train_batch_size,
                                           metric=cfg.algorithm.filter_groups.metric,
                                           max_num_gen_batches=cfg.algorithm.filter_groups.max_num_gen_batches)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from verl.algos.data.masked import group_rows
from verl.core.protocol import DataProto

logger = logging.getLogger(__name__)

ON_EXHAUSTED = ("error", "warn")


@dataclass
class FilterGroupsConfig:
    """verl's ``algorithm.filter_groups``."""

    enable: bool = False
    #: A per-sample reward field: "score" always exists; "acc" and others when the reward returns them.
    metric: str = "score"
    #: Generation rounds per step before the run stops for lack of groups that disagree.
    max_num_gen_batches: int = 10


_TENSOR_METRICS = {"seq_reward": "token_level_scores", "seq_final_reward": "token_level_rewards"}


class DynamicSamplingExhausted(RuntimeError):
    """``max_num_gen_batches`` rounds did not yield ``train_batch_size`` informative prompt groups."""


def group_metric_values(batch: DataProto, metric: str) -> np.ndarray:
    """One float per row: the metric the groups are filtered on."""
    tensors = set(batch.batch.keys()) if batch.batch is not None else set()
    if metric in _TENSOR_METRICS and _TENSOR_METRICS[metric] in tensors:
        return batch.batch[_TENSOR_METRICS[metric]].sum(-1).double().cpu().numpy()
    if metric in batch.non_tensor_batch:
        try:
            return np.asarray([float(v) for v in batch.non_tensor_batch[metric]], dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"algorithm.filter_groups.metric={metric!r}: the field holds non-numeric values") from None
    available = [name for name, key in _TENSOR_METRICS.items() if key in tensors]
    raise ValueError(
        f"algorithm.filter_groups.metric={metric!r} is not in the batch; available: "
        f"{available + sorted(batch.non_tensor_batch)} (reward extra-info keys such as 'score' or 'acc' appear "
        "once the reward result is applied to the batch)"
    )


def informative_groups(batch: DataProto, metric: str) -> list:
    """uids (in order of first appearance) of the groups to keep: metric not constant, or one response."""
    if "uid" not in batch.non_tensor_batch:
        raise ValueError("dynamic sampling groups responses by the non-tensor field 'uid', which is missing")
    values = group_metric_values(batch, metric)
    kept = []
    for uid, rows in group_rows(batch.non_tensor_batch["uid"]).items():
        if len(rows) == 1 or np.std(values[rows]) > 0:
            kept.append(uid)
    return kept


def rows_of(batch: DataProto, uids) -> DataProto:
    wanted = set(uids)
    return batch[np.asarray([uid in wanted for uid in batch.non_tensor_batch["uid"]], dtype=bool)]


class DynamicSampler:
    """Accumulates informative groups over generation rounds."""

    def __init__(
        self, train_batch_size: int, metric: str = "acc", max_num_gen_batches: int = 0, on_exhausted: str = "error"
    ):
        if train_batch_size <= 0:
            raise ValueError(f"train_batch_size={train_batch_size} must be positive")
        if on_exhausted not in ON_EXHAUSTED:
            raise ValueError(f"on_exhausted={on_exhausted!r}; choose one of {list(ON_EXHAUSTED)}")
        self.train_batch_size = train_batch_size
        self.metric = metric
        self.max_num_gen_batches = max_num_gen_batches
        self.on_exhausted = on_exhausted
        self.reset()

    def reset(self) -> None:
        self.parts: list[DataProto] = []
        self.kept_uids: list = []
        self.num_gen_batches = 0
        self.num_groups_seen = 0

    @property
    def ready(self) -> bool:
        return len(self.kept_uids) >= self.train_batch_size

    @property
    def exhausted(self) -> bool:
        return self.max_num_gen_batches > 0 and self.num_gen_batches >= self.max_num_gen_batches

    def add(self, batch: DataProto) -> bool:
        """Filter one generation round and keep its informative groups; returns :attr:`ready`."""
        uids = informative_groups(batch, self.metric)
        clash = set(uids) & set(self.kept_uids)
        if clash:
            raise ValueError(
                f"uids {sorted(map(str, clash))[:3]} appear in two generation rounds; give each round's prompts fresh uids"
            )
        self.num_gen_batches += 1
        self.num_groups_seen += len(group_rows(batch.non_tensor_batch["uid"]))
        if uids:
            self.parts.append(rows_of(batch, uids))
            self.kept_uids.extend(uids)
        return self.ready

    def pop(self) -> tuple[DataProto, dict[str, float]]:
        """The first ``train_batch_size`` kept groups (surplus groups are dropped), with metrics, and
        reset for the next step. Before :attr:`ready` this is the exhausted case: an error, or with
        ``on_exhausted="warn"`` a warning and the smaller batch."""
        if not self.kept_uids:
            raise DynamicSamplingExhausted(self._exhausted_message())
        if not self.ready:
            if self.on_exhausted == "error":
                raise DynamicSamplingExhausted(self._exhausted_message())
            logger.warning("%s Training on the %d groups kept.", self._exhausted_message(), len(self.kept_uids))
        batch = rows_of(DataProto.concat(self.parts), self.kept_uids[: self.train_batch_size])
        metrics = {
            "train/num_gen_batches": float(self.num_gen_batches),
            "dynamic_sampling/kept_groups": float(len(self.kept_uids)),
            "dynamic_sampling/kept_group_ratio": len(self.kept_uids) / max(self.num_groups_seen, 1),
        }
        self.reset()
        return batch, metrics

    def _exhausted_message(self) -> str:
        return (
            f"dynamic sampling kept {len(self.kept_uids)} of the {self.train_batch_size} prompt groups needed after "
            f"{self.num_gen_batches} generation rounds (algorithm.filter_groups.max_num_gen_batches="
            f"{self.max_num_gen_batches}); most groups score identically on {self.metric!r}. The data may be too easy "
            "or too hard for the model; raise max_num_gen_batches (0 = unlimited) or change the data."
        )


def collect_dynamic_batch(
    generate_round: Callable[[], DataProto],
    train_batch_size: int,
    metric: str = "acc",
    max_num_gen_batches: int = 0,
    on_exhausted: str = "error",
) -> tuple[DataProto, dict[str, float]]:
    """Call ``generate_round()`` (a scored batch with uids) until ``train_batch_size`` informative
    groups are kept or ``max_num_gen_batches`` rounds are spent (0: no limit)."""
    sampler = DynamicSampler(train_batch_size, metric, max_num_gen_batches, on_exhausted)
    while not sampler.ready and not sampler.exhausted:
        sampler.add(generate_round())
    return sampler.pop()
