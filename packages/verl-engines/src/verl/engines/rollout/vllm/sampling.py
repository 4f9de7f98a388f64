"""verl's :class:`~verl.core.engine.SamplingParams` as vLLM's, one request per prompt.

- greedy (``do_sample=False``) is vLLM's ``temperature=0``; top-k -1 (verl's "off") is vLLM's 0;
- ``max_new_tokens`` is ``max_tokens``; ``stop`` strings and ``seed`` carry over; ``logprobs=True``
  asks for the sampled token's log-prob only (``logprobs=0``);
- the eos ids the engine resolved are added as ``stop_token_ids`` (vLLM also stops at the tokenizer's
  and the generation config's eos on its own).

Log-probs: the engine runs vLLM with ``logprobs_mode="processed_logprobs"``, so a sampled token's
log-prob is ``log_softmax(logits / temperature)`` like the hf engine's and the training engine's. With
top-k/top-p truncation vLLM renormalizes over the kept tokens (the hf engine does not), so the two
differ then; with the RL defaults (top_k=-1, top_p=1) they are the same quantity. Greedy log-probs are
the raw model log-probs (temperature 1), as in the hf engine.

Seeds: vLLM gives the ``n`` samples of one request the seeds ``seed, seed + 1, ..., seed + n - 1``.
Each prompt therefore gets its own base seed (``seed + (rank * prompts + i) * n``): identical prompts
in a batch, or on two data-parallel ranks, never share a random stream. A streamed request (``requests``)
carries its own seed, which :func:`stream_seed` mixes with the rank for the same reason.
"""

from __future__ import annotations

from verl.core.engine import SamplingParams
from verl.core.engine.requests import SEED_MODULUS, derive_seed


def request_seeds(base: int | None, num_prompts: int, n: int, rank: int = 0) -> list[int | None]:
    """One base seed per prompt (see the module docstring); all None when ``base`` is None."""
    if base is None:
        return [None] * num_prompts
    return [(base + (rank * num_prompts + i) * n) % SEED_MODULUS for i in range(num_prompts)]


def stream_seed(seed: int | None, rank: int) -> int | None:
    """A streamed request's seed on data-parallel rank ``rank``: a hash of both, so that no two
    (seed, rank) pairs share a random stream (None stays None)."""
    return None if seed is None else derive_seed(seed, rank)


def to_vllm_sampling(vllm, sampling: SamplingParams, seed: int | None, stop_token_ids: list[int]):
    """A ``vllm.SamplingParams`` for one prompt of the batch."""
    if sampling.greedy:
        temperature, top_p, top_k, seed = 0.0, 1.0, 0, None
    else:
        temperature, top_p = sampling.temperature, sampling.top_p
        top_k = 0 if sampling.top_k in (-1, 0) else sampling.top_k
    return vllm.SamplingParams(
        n=sampling.n,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_tokens=sampling.max_new_tokens,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(stop_token_ids),
        seed=seed,
        logprobs=0 if sampling.logprobs else None,
        # Token ids are all the trainer needs; text only for stop strings.
        detokenize=bool(sampling.stop),
    )
