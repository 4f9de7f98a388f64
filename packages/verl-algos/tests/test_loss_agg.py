"""Loss aggregation: each mode against a reference loop, and the global-batch contract: the same
loss and gradient however the mini-batch is cut into micro-batches and data-parallel ranks (ranks
simulated here as FSDP treats them, and for real with FSDP2 over gloo)."""

from __future__ import annotations

import time

import pytest
import torch
from algos_test_helpers import agg_reference, random_mask

from verl.algos.losses.aggregation import LOSS_AGG_MODES, LossNormalizer, agg_loss

SCALE = 11.0  # the constant C of seq-mean-token-sum-norm in these tests


def reference(loss_mat, mask, mode, scale=SCALE):
    return agg_reference(loss_mat, mask, mode, scale)


def make_batch(seed: int, batch: int = 10, length: int = 12):
    g = torch.Generator().manual_seed(seed)
    mask = random_mask(batch, length, g, empty_rows=(3,))
    a = torch.randn(batch, length, generator=g)
    b = torch.randn(batch, length, generator=g)
    return mask, a, b


def loss_matrix(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A per-token loss with a non-trivial gradient in the parameter w."""
    return w * a + w**2 * b


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_modes_match_their_formula(mode):
    mask, a, b = make_batch(0)
    loss_mat = loss_matrix(torch.tensor(0.7), a, b)
    normalizer = LossNormalizer.from_mask(mask, loss_scale_factor=SCALE)
    torch.testing.assert_close(agg_loss(loss_mat, mask, mode, normalizer), reference(loss_mat, mask, mode))


def test_without_a_normalizer_the_micro_batch_is_the_batch():
    mask, a, b = make_batch(1)
    loss_mat = loss_matrix(torch.tensor(0.3), a, b)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        torch.testing.assert_close(agg_loss(loss_mat, mask, mode), reference(loss_mat, mask, mode))
    # seq-mean-token-sum-norm then defaults C to the response length.
    torch.testing.assert_close(
        agg_loss(loss_mat, mask, "seq-mean-token-sum-norm"),
        reference(loss_mat, mask, "seq-mean-token-sum-norm", scale=mask.shape[-1]),
    )


def test_all_empty_batch_gives_a_zero_loss_that_still_backpropagates():
    w = torch.tensor(0.5, requires_grad=True)
    mask = torch.zeros(3, 4)
    for mode in LOSS_AGG_MODES:
        loss = agg_loss(loss_matrix(w, torch.ones(3, 4), torch.ones(3, 4)), mask, mode)
        loss.backward()
        assert float(loss.detach()) == 0.0 and float(w.grad) == 0.0


def test_unknown_mode_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(torch.zeros(1, 1), torch.ones(1, 1), "token-sum-mean")


def split_rows(n: int, sizes: list[int]) -> list[range]:
    assert sum(sizes) == n
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


def trim_padding(mask: torch.Tensor, *tensors: torch.Tensor):
    """Cut the micro-batch to its own longest response, as dynamic batching pads per micro-batch."""
    width = max(int(torch.nonzero(mask.sum(0)).max()) + 1, 1) if mask.any() else 1
    return (mask[:, :width], *(t[:, :width] for t in tensors))


# (rank shard sizes, micro-batch sizes per rank): uneven shards, uneven micro-batches.
LAYOUTS = [
    ([10], [[10]]),
    ([10], [[3, 3, 4]]),
    ([5, 5], [[2, 3], [5]]),
    ([4, 3, 3], [[1, 3], [3], [2, 1]]),
]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("shards,micro", LAYOUTS)
def test_loss_and_gradient_do_not_depend_on_micro_batches_or_dp_size(mode, shards, micro):
    mask, a, b = make_batch(2)
    dp_size = len(shards)
    w_ref = torch.tensor(0.4, requires_grad=True)
    expected = reference(loss_matrix(w_ref, a, b), mask, mode)
    expected.backward()

    # Each rank counts its own rows; the counts are summed across ranks (the all-reduce).
    rank_rows = split_rows(len(mask), shards)
    counts = [LossNormalizer.from_mask(mask[list(r)]) for r in rank_rows]
    normalizer = LossNormalizer(
        sum(c.num_tokens for c in counts), sum(c.num_seqs for c in counts), dp_size=dp_size, loss_scale_factor=SCALE
    )
    rank_grads, total_loss = [], 0.0
    for rows, sizes in zip(rank_rows, micro):
        w = torch.tensor(0.4, requires_grad=True)  # this rank's replica of the parameter
        for piece in split_rows(len(rows), sizes):
            idx = [rows[j] for j in piece]
            m, aa, bb = trim_padding(mask[idx], a[idx], b[idx])
            loss = agg_loss(loss_matrix(w, aa, bb), m, mode, normalizer)
            loss.backward()  # the engine accumulates gradients over micro-batches
            total_loss += float(loss.detach())
        rank_grads.append(w.grad.clone())
    fsdp_grad = sum(rank_grads) / dp_size  # FSDP averages gradients over ranks
    torch.testing.assert_close(fsdp_grad, w_ref.grad)
    torch.testing.assert_close(torch.tensor(total_loss / dp_size), expected.detach())


def test_real_fsdp2_over_gloo_matches_the_global_batch_gradient():
    """Two processes, FSDP2 (which averages gradients over ranks), uneven micro-batches: the
    gradients equal the single-process gradient of the global loss, for every mode."""
    import torch.multiprocessing as mp
    from fsdp_loss_worker import free_port, fsdp_worker

    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    procs = mp.start_processes(
        fsdp_worker, args=(2, free_port(), list(LOSS_AGG_MODES), errors), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 180
    while not procs.join(timeout=1):  # raises if a worker failed
        if time.monotonic() > deadline:
            for p in procs.processes:
                p.kill()
            pytest.fail("the FSDP workers did not finish in 180 s (collective mismatch?)")
    assert errors.empty()
