"""Token log-probs and entropy from logits, chunked along tokens.

A float32 ``[tokens, vocab]`` tensor is large (4k tokens x 150k vocab = 2.4 GB), and the naive
``log_softmax(logits.float())`` keeps several of them alive for backward. Here each chunk of rows is
upcast, reduced to per-token values, and dropped; under autograd each chunk is recomputed during
backward (activation checkpointing), so only the logits the model produced are kept.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def _chunk_logprob_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, compute_entropy: bool
) -> tuple[torch.Tensor, ...]:
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not compute_entropy:
        return (logp,)
    # H = lse - sum(p * z): one softmax-sized temporary per chunk.
    entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logp, entropy


def logprobs_from_logits(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-row ``log_softmax(logits / temperature)[target]`` and optionally the entropy, in float32.

    ``logits`` is [N, V] (any float dtype), ``targets`` [N] token ids. Returns ([N], [N] or None).
    """
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"expected logits [N, V] and targets [N], got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    n = logits.shape[0]
    if n == 0:
        empty = logits.new_zeros(0, dtype=torch.float32)
        return empty, (empty.clone() if compute_entropy else None)
    recompute = torch.is_grad_enabled() and logits.requires_grad
    logps, entropies = [], []
    for start in range(0, n, chunk_size):
        chunk, chunk_targets = logits[start : start + chunk_size], targets[start : start + chunk_size]
        if recompute:
            out = checkpoint(
                _chunk_logprob_entropy, chunk, chunk_targets, temperature, compute_entropy, use_reentrant=False
            )
        else:
            out = _chunk_logprob_entropy(chunk, chunk_targets, temperature, compute_entropy)
        logps.append(out[0])
        if compute_entropy:
            entropies.append(out[1])
    logp = torch.cat(logps) if len(logps) > 1 else logps[0]
    if not compute_entropy:
        return logp, None
    return logp, torch.cat(entropies) if len(entropies) > 1 else entropies[0]


@torch.no_grad()
def sum_pi_squared_from_logits(
    logits: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = 1024
) -> torch.Tensor:
    """Per-row ``sum_v softmax(logits / temperature)_v ** 2`` in float32 ([N, V] -> [N]), chunked like the
    log-probs: the squared norm of the policy's distribution, which the optimal token baseline needs
    (||grad_logits log pi(y)||^2 = 1 - 2 pi(y) + sum_v pi_v^2)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    pieces = []
    for start in range(0, logits.shape[0], chunk_size):
        z = logits[start : start + chunk_size].float()
        if temperature != 1.0:
            z = z / temperature
        pieces.append(torch.softmax(z, dim=-1).square().sum(-1))
    return torch.cat(pieces) if pieces else logits.new_zeros(0, dtype=torch.float32)
