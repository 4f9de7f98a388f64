"""DAPO's dynamic sampling with a fake generator (plain Python, no model)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from verl.algos.data.dynamic_sampling import (
    DynamicSampler,
    DynamicSamplingExhausted,
    collect_dynamic_batch,
    informative_groups,
)
from verl.core.protocol import DataProto


class FakeGenerator:
    """Each round: ``prompts`` prompts x ``n`` responses with 0/1 accuracies from a script of
    per-prompt patterns ("mixed", "all_right", "all_wrong"), cycling."""

    def __init__(self, patterns: list[str], prompts: int = 3, n: int = 4):
        self.patterns, self.prompts, self.n, self.rounds = patterns, prompts, n, 0

    def __call__(self) -> DataProto:
        uids, acc = [], []
        for p in range(self.prompts):
            pattern = self.patterns[(self.rounds * self.prompts + p) % len(self.patterns)]
            uid = f"round{self.rounds}-prompt{p}"
            values = {"mixed": [1, 0, 1, 0], "all_right": [1] * 4, "all_wrong": [0] * 4}[pattern][: self.n]
            uids += [uid] * self.n
            acc += values
        self.rounds += 1
        scores = torch.zeros(len(acc), 3)
        scores[:, -1] = torch.tensor(acc, dtype=torch.float32)
        return DataProto.from_dict(
            {"token_level_scores": scores},
            {"uid": np.array(uids, dtype=object), "acc": np.array(acc, dtype=object)},
        )


def uids_of(batch: DataProto) -> list:
    return list(dict.fromkeys(batch.non_tensor_batch["uid"]))


def test_groups_with_equal_metric_are_dropped_and_singletons_kept():
    batch = DataProto.from_dict(
        {"token_level_scores": torch.tensor([[1.0], [0.0], [1.0], [1.0], [0.0]])},
        {"uid": np.array(["a", "a", "b", "b", "c"], dtype=object)},
    )
    assert informative_groups(batch, "seq_reward") == ["a", "c"]


@pytest.mark.parametrize("metric", ["acc", "seq_reward"])
def test_accumulates_across_rounds_until_the_batch_is_full(metric):
    gen = FakeGenerator(["mixed", "all_right", "all_wrong", "mixed"])
    batch, metrics = collect_dynamic_batch(gen, train_batch_size=4, metric=metric, max_num_gen_batches=10)
    kept = uids_of(batch)
    assert len(kept) == 4 and len(batch) == 16, "exactly train_batch_size whole groups"
    for uid in kept:
        rows = [i for i, u in enumerate(batch.non_tensor_batch["uid"]) if u == uid]
        assert len({float(batch.non_tensor_batch["acc"][i]) for i in rows}) == 2
    assert gen.rounds == metrics["train/num_gen_batches"] == 3
    assert kept == ["round0-prompt0", "round1-prompt0", "round1-prompt1", "round2-prompt1"]


def test_too_many_rounds_is_an_error_with_advice():
    gen = FakeGenerator(["all_right"])
    with pytest.raises(DynamicSamplingExhausted, match="max_num_gen_batches=3"):
        collect_dynamic_batch(gen, train_batch_size=2, metric="acc", max_num_gen_batches=3)
    assert gen.rounds == 3


def test_warn_mode_trains_on_what_was_kept(caplog):
    gen = FakeGenerator(["mixed", "all_wrong", "all_wrong"])
    with caplog.at_level(logging.WARNING):
        batch, metrics = collect_dynamic_batch(gen, 5, "acc", max_num_gen_batches=2, on_exhausted="warn")
    assert len(uids_of(batch)) == 2 and "kept 2 of the 5" in caplog.text
    assert metrics["dynamic_sampling/kept_group_ratio"] == pytest.approx(2 / 6)


def test_unlimited_rounds_with_zero():
    gen = FakeGenerator(["all_wrong"] * 20 + ["mixed"], prompts=1)
    batch, _ = collect_dynamic_batch(gen, train_batch_size=1, metric="acc", max_num_gen_batches=0)
    assert gen.rounds == 21 and len(uids_of(batch)) == 1


def test_reused_uids_and_unknown_metric_are_errors():
    sampler = DynamicSampler(train_batch_size=10, metric="acc")
    gen = FakeGenerator(["mixed"])
    batch = gen()
    sampler.add(batch)
    with pytest.raises(ValueError, match="fresh uids"):
        sampler.add(batch)
    with pytest.raises(ValueError, match="'score' is not in the batch") as err:
        DynamicSampler(2, metric="score").add(gen())
    assert "seq_reward" in str(err.value) and "acc" in str(err.value)
