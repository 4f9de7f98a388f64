"""The plain decode loop: transformers' DynamicCache, grown by concatenation, every row prefilled with its
whole (left-padded) prompt, finished rows decoded until the last one ends.

It is the reference the static path (``static_decode``) is checked against, token for token for greedy
decoding, and what runs where the static cache is not available (``cache_implementation="dynamic"``).
"""

from __future__ import annotations

import time

import torch

from verl.core.engine import SamplingParams
from verl.engines.rollout.hf.decode_common import DecodeOutput, DecodeSettings, DecodeStats
from verl.engines.rollout.hf.transformers_compat import cache_kwarg, output_cache
from verl.engines.rollout.sampling import next_tokens


def decode_plain(
    model, input_ids, attention_mask, position_ids, sampling: SamplingParams, generator, stop, settings: DecodeSettings
) -> DecodeOutput:
    """One micro-batch of rows (each sample its own row, prompts already repeated)."""
    device = settings.device
    b, width = input_ids.shape[0], sampling.max_new_tokens
    tokens = torch.full((b, width), settings.pad_token_id, dtype=input_ids.dtype, device=device)
    logprobs = torch.zeros(b, width, dtype=torch.float32, device=device)
    lengths = torch.zeros(b, dtype=torch.long, device=device)
    finished = torch.zeros(b, dtype=torch.bool, device=device)
    eos = torch.tensor(settings.eos_token_ids, device=device)
    step_ids, step_pos = input_ids.to(device), position_ids.to(device)
    mask = attention_mask.to(device)
    stats = DecodeStats(prefill_tokens=int(input_ids.numel()))
    past = None
    cache_name = cache_kwarg(model)
    start = time.perf_counter()
    for step in range(width):
        out = model(
            input_ids=step_ids,
            attention_mask=mask,
            position_ids=step_pos,
            use_cache=True,
            logits_to_keep=1,
            **{cache_name: past},
        )
        past = output_cache(out)
        if step == 0:
            stats.prefill_s = time.perf_counter() - start
        else:
            stats.steps += 1
            stats.row_steps += b
        token, logprob = next_tokens(out.logits[:, -1, :].float(), sampling, generator)
        active = ~finished
        token = torch.where(active, token, settings.pad_token_id)
        tokens[:, step] = token
        logprobs[:, step] = torch.where(active, logprob, 0.0)
        lengths += active.long()
        done = active & torch.isin(token, eos)
        if stop is not None:
            done |= active & stop(tokens[:, : step + 1], None).to(device)
        finished |= done
        if bool(finished.all()):
            break
        step_ids = token[:, None]
        step_pos = step_pos[:, -1:] + 1
        # Finished rows keep decoding pads (their outputs are discarded); their mask stays 1 so no
        # query row is ever fully masked.
        mask = torch.cat([mask, torch.ones(b, 1, dtype=mask.dtype, device=device)], dim=1)
    stats.decode_s = time.perf_counter() - start - stats.prefill_s
    return DecodeOutput(tokens.cpu(), lengths.cpu(), logprobs.cpu(), stats)
