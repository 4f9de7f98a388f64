"""Next-token choice from logits: greedy, or sampling with temperature, top-k and top-p.

The log-prob returned for a sampled token is ``log_softmax(logits / temperature)[token]`` over the
whole vocabulary, before top-k/top-p truncation: the same quantity the training engine recomputes
(``log_softmax(logits / T)``), so rollout and training log-probs are directly comparable. For greedy
decoding the temperature is 1 (raw model log-probs).
"""

from __future__ import annotations

import torch

from verl.core.engine import SamplingParams


def truncate_logits(z: torch.Tensor, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """``z`` with -inf outside the top-k tokens and outside the smallest top-p nucleus (at least
    one token always survives); ``z`` itself when nothing is to be truncated."""
    if 0 < top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        probs = torch.softmax(sorted_z, dim=-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass.
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


#: Vocabulary entries per block of the two-level inverse CDF (see :func:`sample_rows`).
SAMPLING_BLOCK = 256


def sample_rows(
    probs: torch.Tensor, generator: torch.Generator | None = None, block: int = SAMPLING_BLOCK
) -> torch.Tensor:
    """One draw per row of the categorical distributions ``probs`` [b, V] (rows need not sum to exactly 1).

    Inverse CDF in two levels: one uniform number per row, located first in the cumulative sum of the
    vocabulary's blocks of ``block`` entries, then in the cumulative sum of the chosen block only.
    ``torch.multinomial`` draws V exponential numbers per row instead (~13 ms of an ~80 ms decode step for
    a 49k vocabulary on CPU), and one cumulative sum over the whole vocabulary in float64 took 3.5 ms of
    it; this takes ~0.1 ms. A block's mass is summed in float32 (pairwise: its relative error is a few
    units of float32 rounding, ~1e-7, where converting the whole vocabulary to float64 first copied 6 MB a
    step); the cumulative sums over blocks and within the chosen block are float64.

    A token of probability 0 (truncated by top-k/top-p) is never drawn: the chosen block has
    ``cdf[j-1] <= u < cdf[j]``, so positive mass, and within it the chosen index ``i`` has
    ``within[i-1] <= u < within[i]``, so ``probs[i] > 0``. Should rounding put ``u`` past the block's own
    sum (which equals ``cdf[j]`` only up to the order of the additions), the block's last positive entry
    is taken.
    """
    rows, vocab = probs.shape
    pad = (-vocab) % block
    blocks = (torch.nn.functional.pad(probs, (0, pad)) if pad else probs).view(rows, -1, block)
    cdf = blocks.sum(-1).double().cumsum(-1)  # [b, blocks]
    u = torch.rand(rows, 1, dtype=torch.float64, device=probs.device, generator=generator) * cdf[:, -1:]
    j = torch.searchsorted(cdf, u, right=True).clamp_(max=blocks.shape[1] - 1)  # [b, 1]
    before = torch.where(j > 0, cdf.gather(1, (j - 1).clamp(min=0)), 0.0)
    chosen = blocks.gather(1, j[..., None].expand(rows, 1, block)).squeeze(1)  # [b, block]
    i = torch.searchsorted(chosen.double().cumsum(-1) + before, u, right=True)
    last_positive = block - 1 - (chosen > 0).flip(-1).int().argmax(-1, keepdim=True)
    i = torch.where(i >= block, last_positive, i)
    return (j * block + i).squeeze(-1)


def next_tokens(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [b], log-probs [b]) from float32 logits [b, V].

    Sampling without truncation takes one softmax over the vocabulary, both to draw from and for the
    drawn token's log-prob (``log(p)``, which agrees with ``log_softmax`` to float32 rounding: ``p`` is
    within a few ulps relative, so its log within a few 1e-7 absolute). A separate ``log_softmax`` and the
    block sums' float64 copy were ~2.5 ms of a ~55 ms CPU decode step at 16 x 49k. The one case where
    ``log(p)`` is not exact, ``p`` below float32's normal range, falls back to ``log_softmax`` for its row.
    """
    if sampling.greedy:
        tokens = logits.argmax(-1)
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, logprobs
    z = logits / sampling.temperature if sampling.temperature != 1.0 else logits
    probs = torch.softmax(z, dim=-1)
    truncated = truncate_logits(z, sampling.top_k, sampling.top_p)
    # The draw is from the truncated distribution; the log-prob is under the full one (see the module doc).
    tokens = sample_rows(probs if truncated is z else torch.softmax(truncated, dim=-1), generator)
    drawn = probs.gather(-1, tokens[:, None]).squeeze(-1)
    logprobs = drawn.log()
    subnormal = drawn < torch.finfo(drawn.dtype).tiny
    if bool(subnormal.any()):
        exact = torch.log_softmax(z[subnormal], dim=-1).gather(-1, tokens[subnormal, None]).squeeze(-1)
        logprobs[subnormal] = exact
    return tokens, logprobs
