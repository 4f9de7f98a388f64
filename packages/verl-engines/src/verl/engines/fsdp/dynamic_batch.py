"""Micro-batching by a token budget, and balanced assignment of sequences to data-parallel ranks.

Sequence lengths vary a lot in RL (a response can stop after 3 tokens or run to the limit). Splitting
by a fixed number of sequences then wastes memory on short micro-batches and risks OOM on long ones;
``use_dynamic_bsz`` instead fills micro-batches up to ``ppo_max_token_len_per_gpu`` tokens, balanced
with the longest-processing-time-first heuristic (sort by length, give each sequence to the lightest
bin).

FSDP runs collectives in every forward and backward, so all data-parallel ranks must run the same
number of micro-batches: the count is agreed with an all-reduce (MAX), and a rank with fewer
sequences than micro-batches gets empty ones (the engine runs a zero-weight dummy for those).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch
import torch.distributed as dist

from verl.core.protocol import DataProto


def lpt_partition(weights: Sequence[int], k: int, equal_size: bool = False) -> list[list[int]]:
    """Split item indices into ``k`` bins with nearly equal weight sums (greedy LPT, ties by index).

    With ``equal_size`` every bin gets exactly ``len(weights) / k`` items (which must divide).
    Each bin lists its indices in increasing order.
    """
    n = len(weights)
    if k < 1:
        raise ValueError(f"number of partitions must be >= 1, got {k}")
    if equal_size and n % k:
        raise ValueError(f"{n} sequences do not split into {k} equal parts; pad the batch to a multiple of {k} first")
    capacity = n // k if equal_size else n
    bins: list[list[int]] = [[] for _ in range(k)]
    heap = [(0, b) for b in range(k)]  # (weight sum, bin id): the lightest bin pops first
    order = sorted(range(n), key=lambda i: (-weights[i], i))
    for i in order:
        total, b = heapq.heappop(heap)
        bins[b].append(i)
        if len(bins[b]) < capacity:  # a full bin leaves the heap for good
            heapq.heappush(heap, (total + weights[i], b))
    return [sorted(b) for b in bins]


def _all_reduce_max(value: int, group) -> int:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend(group) != "gloo":
        from verl.core.platform import get_platform

        t = t.to(get_platform().device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def token_budget_micro_batches(seqlens: Sequence[int], max_tokens: int, group=None) -> list[list[int]]:
    """Index lists of micro-batches whose token sums stay within ``max_tokens``; the same count on
    every rank of ``group`` (trailing empty lists where this rank has too few sequences)."""
    seqlens = [int(s) for s in seqlens]
    longest = max(seqlens, default=0)
    if longest > max_tokens:
        raise ValueError(
            f"a sequence of {longest} tokens does not fit the token budget ppo_max_token_len_per_gpu="
            f"{max_tokens}; raise it to at least {longest} (or shorten prompts/responses)"
        )

    def fits(k: int) -> tuple[bool, list[list[int]]]:
        if k >= len(seqlens):  # one sequence per micro-batch always fits (checked above)
            return True, [[i] for i in range(len(seqlens))]
        parts = lpt_partition(seqlens, k)
        return all(sum(seqlens[i] for i in p) <= max_tokens for p in parts), parts

    k = max(1, -(-sum(seqlens) // max_tokens))
    while not fits(k)[0]:
        k += 1
    # Agree on a count; a larger k can, rarely, still overflow a bin on some rank: then all go up by one.
    while True:
        agreed = _all_reduce_max(k, group)
        ok, parts = fits(agreed)
        proposal = agreed if ok else agreed + 1
        if _all_reduce_max(proposal, group) == agreed:
            break
        k = proposal
    parts = [p for p in parts if p]
    # Largest micro-batches first: peak memory shows up at once rather than late in the step.
    parts.sort(key=lambda p: -sum(seqlens[i] for i in p))
    return parts + [[] for _ in range(agreed - len(parts))]


def fixed_size_micro_batches(n: int, micro_batch_size: int, group=None) -> list[list[int]]:
    """Consecutive index lists of ``micro_batch_size`` rows, padded with empty lists to the largest
    count on any rank of ``group``."""
    parts = [list(range(i, min(n, i + micro_batch_size))) for i in range(0, n, micro_batch_size)]
    agreed = _all_reduce_max(len(parts), group)
    return parts + [[] for _ in range(agreed - len(parts))]


def balanced_dp_order(seqlens: Sequence[int], dp_size: int) -> torch.Tensor:
    """A permutation of the batch rows such that ``reorder(perm).chunk(dp_size)`` gives every
    data-parallel rank the same number of sequences and nearly the same number of tokens."""
    parts = lpt_partition(seqlens, dp_size, equal_size=True)
    return torch.tensor([i for part in parts for i in part], dtype=torch.long)


def balance_batch(batch: DataProto, dp_size: int) -> DataProto:
    """Reorder ``batch`` in place (by its ``attention_mask`` token counts) for a balanced split over
    ``dp_size`` ranks; call it on the driver before dispatching. Returns the batch."""
    seqlens = batch.tensors["attention_mask"].sum(-1).tolist()
    return batch.reorder(balanced_dp_order(seqlens, dp_size))
