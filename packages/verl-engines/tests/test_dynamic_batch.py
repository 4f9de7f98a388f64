"""Token-budget micro-batching and balanced assignment of sequences to data-parallel ranks."""

import random

import pytest
import torch
from engine_helpers import make_batch, run_ranks
from rank_programs import agree_on_micro_batch_counts

from verl.core.protocol import DataProto
from verl.engines.fsdp.dynamic_batch import (
    balance_batch,
    balanced_dp_order,
    fixed_size_micro_batches,
    lpt_partition,
    token_budget_micro_batches,
)


def sums(parts, weights):
    return [sum(weights[i] for i in p) for p in parts]


def test_lpt_covers_every_index_once_and_balances():
    rng = random.Random(0)
    weights = [rng.randint(1, 500) for _ in range(97)]
    parts = lpt_partition(weights, 6)
    assert sorted(i for p in parts for i in p) == list(range(97))
    totals = sums(parts, weights)
    # LPT guarantee: the heaviest bin is within the largest item of the lightest one.
    assert max(totals) - min(totals) <= max(weights)


def test_equal_size_partitions_have_equal_counts():
    weights = [100, 90, 80, 70, 1, 2, 3, 4]  # split in order: 340 tokens vs 10
    parts = lpt_partition(weights, 2, equal_size=True)
    assert [len(p) for p in parts] == [4, 4]
    totals = sums(parts, weights)
    assert abs(totals[0] - totals[1]) <= 4
    with pytest.raises(ValueError, match="pad the batch"):
        lpt_partition([1, 2, 3], 2, equal_size=True)


def test_balanced_dp_order_beats_contiguous_split():
    # Sorted lengths: the contiguous split gives one rank all the long sequences.
    seqlens = list(range(10, 330, 10))
    perm = balanced_dp_order(seqlens, 4)
    assert sorted(perm.tolist()) == list(range(len(seqlens)))
    reordered = [seqlens[i] for i in perm.tolist()]
    balanced = [sum(reordered[i * 8 : (i + 1) * 8]) for i in range(4)]
    contiguous = [sum(seqlens[i * 8 : (i + 1) * 8]) for i in range(4)]
    assert max(balanced) - min(balanced) < (max(contiguous) - min(contiguous)) / 10


def test_balance_batch_reorders_a_dataproto():
    tensors = make_batch(8, 6, 6, seed=3)
    batch = DataProto.from_dict(tensors, non_tensors={"uid": list(range(8))})
    balance_batch(batch, 2)
    tokens = [int(c.batch["attention_mask"].sum()) for c in batch.chunk(2)]
    total = int(tensors["attention_mask"].sum())
    assert sum(tokens) == total and abs(tokens[0] - tokens[1]) <= int(tensors["attention_mask"].sum(-1).max())
    # rows moved together with their non-tensor fields
    for row, uid in enumerate(batch.non_tensor_batch["uid"]):
        assert torch.equal(batch.batch["input_ids"][row], tensors["input_ids"][uid])


def test_token_budget_respected_and_minimal_count():
    rng = random.Random(1)
    seqlens = [rng.randint(5, 60) for _ in range(40)]
    parts = token_budget_micro_batches(seqlens, 128)
    assert sorted(i for p in parts for i in p) == list(range(40))
    assert all(t <= 128 for t in sums(parts, seqlens))
    assert len(parts) <= -(-sum(seqlens) // 128) + 2  # close to the lower bound


def test_sequence_longer_than_budget_is_a_clear_error():
    with pytest.raises(ValueError, match="raise it to at least 300"):
        token_budget_micro_batches([10, 300], 256)


def test_fixed_size_micro_batches():
    assert fixed_size_micro_batches(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]


def test_micro_batch_count_is_agreed_across_ranks(tmp_path):
    (dyn0, fix0), (dyn1, fix1) = run_ranks(agree_on_micro_batch_counts, 2, result_dir=str(tmp_path))
    assert len(dyn0) == len(dyn1) == 3
    assert sorted(i for p in dyn0 for i in p) == list(range(8))
    assert dyn1 == [[0], [], []]  # the rank with fewer sequences gets empty (dummy) micro-batches
    assert len(fix0) == len(fix1) == 3 and fix1 == [[0, 1], [], []]


def test_forward_only_passes_take_their_own_batching_settings():
    from verl.engines.fsdp.config import FSDPEngineConfig

    cfg = FSDPEngineConfig(
        model_path="unused",
        ppo_micro_batch_size_per_gpu=4,
        use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=100,
        log_prob_use_dynamic_bsz=True,
        log_prob_max_token_len_per_gpu=300,
    )
    assert cfg.micro_batching(forward_only=False) == (4, 100, False)
    assert cfg.micro_batching(forward_only=True) == (4, 300, True)
    inherited = FSDPEngineConfig(model_path="unused", use_dynamic_bsz=True, ppo_max_token_len_per_gpu=100)
    assert inherited.micro_batching(forward_only=True) == (4, 100, True)
