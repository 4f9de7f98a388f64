"""The fast decode path: a preallocated (static) KV cache, each prompt prefilled once, finished rows dropped.

For one micro-batch of rows (``repeats[i]`` consecutive samples of unique prompt ``i``):

1. The left padding that every prompt of the micro-batch has is cut off (the trainer pads prompts to
   ``data.max_prompt_length``; computing those columns is pure waste: they are masked out anyway).
2. The unique prompts are prefilled once: the n samples of a prompt share its prefill instead of
   computing it n times. For prompts of at least ``SHARED_PREFIX_MIN_PROMPT`` tokens (eager CPU step)
   they also share its keys and values while decoding (``shared_prefix``: one copy per prompt, read once
   per KV head and step). Otherwise the prefill goes into a ``StaticCache`` sized prompt +
   ``max_new_tokens`` whose rows are then repeated for the samples (``Cache.reorder_cache``).
3. Each step feeds one token per row with a fixed-width mask (prompt mask, then ones: causality hides the
   slots not written yet), so nothing grows by concatenation. When at least a quarter of the rows have
   finished they are dropped from the batch and the cache (eager mode only: a compiled step keeps its
   shapes and stops when the last row ends); a shared cache becomes a repeated one of the remaining rows.

Exactness: the same tokens attend to the same keys with the same positions as in the plain loop
(``plain_decode``); only the width of the masked attention and the matmul shapes differ, so logits agree to
fp32 rounding, greedy outputs are the same token for token (tested), and the sampled tokens' log-probs are
``log_softmax(logits / T)`` exactly as the training engine recomputes them. Sampling draws from the same
distributions, but after rows are dropped the generator's draws go to other rows than in the plain loop,
so a seeded sampled output differs from the plain path's (it is reproducible within this path).
"""

from __future__ import annotations

import time

import torch

from verl.core.engine import SamplingParams
from verl.engines.rollout.hf.compiled_step import CompiledDecodeStep, forward_last_logits
from verl.engines.rollout.hf.decode_common import DecodeOutput, DecodeSettings, DecodeStats
from verl.engines.rollout.hf.transformers_compat import new_static_cache
from verl.engines.rollout.sampling import next_tokens

#: A compiled step sees cache lengths rounded up to this, so prompts of nearby lengths reuse one graph.
COMPILED_CACHE_BUCKET = 64
#: Drop finished rows once they are at least this share of the batch (a drop copies the cache).
DROP_SHARE = 0.25
#: By default the samples of a prompt share its cache (``shared_prefix``) from this prompt width on. Below
#: it the shared attention's extra small operations cost more than reading the n copies saves (SmolLM2,
#: 8 samples, 2 cores: 43 tokens 4% slower a decode step, 128 tokens 3% faster, 493 tokens 27% faster).
SHARED_PREFIX_MIN_PROMPT = 128


def trim_left_padding(ids, mask, pos):
    """Drop the leading columns that are padding in every row (prompts are left-padded)."""
    used = mask.any(0).nonzero()
    first = int(used[0]) if len(used) else mask.shape[1] - 1
    return ids[:, first:], mask[:, first:], pos[:, first:]


def _prefill(
    model, prompts, repeats: torch.Tensor, width: int, settings: DecodeSettings, compiled_step, stats: DecodeStats
):
    """Each unique prompt once (left padding trimmed) into a preallocated cache, then the decode cache of
    prompt + ``width`` slots per sample: (cache, whether it shares the prompts' part, last logits,
    fixed-width mask, next positions), one row per sample.

    The decode cache shares each prompt's keys and values among its samples (``shared_prefix``) where
    ``settings.shared_prefix`` allows it (by default: prompts of at least ``SHARED_PREFIX_MIN_PROMPT``
    tokens), every prompt has the same number (>= 2) of samples, the step is eager, and every layer is
    full attention; otherwise it repeats each prompt's rows for its samples."""
    device = settings.device
    ids, mask, pos = (t.to(device) for t in trim_left_padding(*prompts))
    prompt_width = ids.shape[1]
    cache_len = prompt_width + width
    if compiled_step is not None:
        cache_len = -(-cache_len // COMPILED_CACHE_BUCKET) * COMPILED_CACHE_BUCKET
    samples = int(repeats[0])
    share = (
        settings.shared_prefix is not False
        and compiled_step is None
        and samples >= 2
        and bool((repeats == samples).all())
        and (settings.shared_prefix or prompt_width >= SHARED_PREFIX_MIN_PROMPT)
    )
    if share:
        from verl.engines.rollout.hf import shared_prefix  # needs the StaticLayer the static path checked for

        # The prompts' part is held apart, so this prefill cache needs no response slots.
        cache = new_static_cache(model.config, prompt_width)
        share = shared_prefix.supports_shared_prefix(cache)
    if not share:
        cache = new_static_cache(model.config, cache_len)
    # Fixed-width mask: the prompt's, then ones for every slot a response token will fill (and the
    # bucket's spare slots, never reached: causality masks slots beyond the current position).
    full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], cache_len - prompt_width)], dim=1)
    logits = forward_last_logits(model, ids, full_mask[:, : prompt_width if share else cache_len], pos, cache)
    stats.prefill_tokens = int(ids.numel())

    expand = torch.arange(len(repeats), device=device).repeat_interleave(repeats.to(device))
    if share:
        cache = shared_prefix.SharedPrefixCache(cache, samples, width)
    else:
        cache.reorder_cache(expand)  # each prompt's rows repeated for its samples
    if compiled_step is not None:
        compiled_step.mark_static(cache)
    return cache, share, logits[expand], full_mask[expand], pos[expand, -1:] + 1


def decode_static(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_pos: torch.Tensor,
    repeats: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    stop,
    settings: DecodeSettings,
    compiled_step: CompiledDecodeStep | None = None,
) -> DecodeOutput:
    """``prompt_*``: the unique prompts [u, P] of this micro-batch; ``repeats`` [u]: rows per prompt (its
    samples, consecutive). ``compiled_step``: decode with it instead of the eager forward."""
    device, width = settings.device, sampling.max_new_tokens
    compiled = compiled_step is not None
    stats = DecodeStats()
    start = time.perf_counter()

    cache, shared, logits, full_mask, next_pos = _prefill(
        model, (prompt_ids, prompt_mask, prompt_pos), repeats, width, settings, compiled_step, stats
    )
    stats.prefill_s = time.perf_counter() - start

    rows = int(logits.shape[0])
    stats.shared_prefix_rows = rows if shared else 0
    tokens = torch.full((rows, width), settings.pad_token_id, dtype=prompt_ids.dtype, device=device)
    logprobs = torch.zeros(rows, width, dtype=torch.float32, device=device)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    row_of = torch.arange(rows, device=device)  # output row of each batch row
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    eos = torch.tensor(settings.eos_token_ids, device=device)
    decode_start = time.perf_counter()
    for step in range(width):
        token, logprob = next_tokens(logits.float(), sampling, generator)
        active = ~finished
        live = row_of[active]
        tokens[live, step] = token[active]
        logprobs[live, step] = logprob[active]
        lengths[live] += 1
        done = active & torch.isin(token, eos)
        if stop is not None:
            done |= active & stop(tokens[row_of, : step + 1], None).to(device)
        finished |= done
        if step == width - 1 or bool(finished.all()):
            break
        if not compiled and int(finished.sum()) >= DROP_SHARE * len(finished):
            keep = (~finished).nonzero().squeeze(1)
            if shared:  # the remaining rows go on with their prompt's part repeated (it keeps no gaps)
                cache, shared = cache.repeated(model.config, keep), False
            else:
                cache.reorder_cache(keep)
            full_mask, next_pos, row_of, token = full_mask[keep], next_pos[keep], row_of[keep], token[keep]
            finished = finished[keep]
        # Finished rows still in the batch feed their last token; their outputs are discarded.
        if compiled_step is not None:
            logits, compile_s = compiled_step(model, token[:, None], full_mask, next_pos, cache)
            stats.compile_s += compile_s
        else:
            logits = forward_last_logits(model, token[:, None], full_mask, next_pos, cache)
            if shared:
                cache.check_attended()
        next_pos = next_pos + 1
        stats.steps += 1
        stats.row_steps += len(row_of)
    stats.decode_s = time.perf_counter() - decode_start - stats.compile_s
    return DecodeOutput(tokens.cpu(), lengths.cpu(), logprobs.cpu(), stats)
