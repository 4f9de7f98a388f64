"""Balance tokens across data-parallel ranks (``trainer.balance_batch``).

Data-parallel dispatch gives rank d the d-th contiguous chunk of the batch; with variable-length
responses one rank can get far more tokens than another and everybody waits for it. Reordering the
rows so each chunk holds about the same number of tokens fixes that (greedy longest-first assignment).
"""

from __future__ import annotations

import heapq

import torch

from verl.core.protocol import DataProto


def balanced_order(seq_lengths: list[int], parts: int) -> list[int]:
    """A permutation of rows that, cut into ``parts`` equal contiguous chunks, balances the token sums.
    Requires ``len(seq_lengths) % parts == 0``."""
    n = len(seq_lengths)
    if parts <= 1 or n % parts:
        return list(range(n))
    per_part = n // parts
    heap = [(0, p) for p in range(parts)]  # (tokens, part)
    members: list[list[int]] = [[] for _ in range(parts)]
    for row in sorted(range(n), key=lambda i: -seq_lengths[i]):
        full = []
        while True:
            tokens, part = heapq.heappop(heap)
            if len(members[part]) < per_part:
                break
            full.append((tokens, part))
        members[part].append(row)
        heapq.heappush(heap, (tokens + seq_lengths[row], part))
        for item in full:
            heapq.heappush(heap, item)
    return [row for part in members for row in sorted(part)]


def balance_batch(batch: DataProto, dp_size: int) -> dict[str, float]:
    """Reorder ``batch`` in place; returns the imbalance before and after (max/mean tokens per rank)."""
    lengths = batch.batch["attention_mask"].sum(-1).tolist()

    def imbalance(order: list[int]) -> float:
        size = len(order) // dp_size
        sums = [sum(lengths[i] for i in order[d * size : (d + 1) * size]) for d in range(dp_size)]
        return max(sums) / max(1e-9, sum(sums) / dp_size)

    if dp_size <= 1 or len(batch) % dp_size:
        return {}
    before = imbalance(list(range(len(batch))))
    order = balanced_order(lengths, dp_size)
    batch.reorder(torch.tensor(order))
    return {"global_seqlen/imbalance_before": before, "global_seqlen/imbalance": imbalance(list(range(len(batch))))}
