"""Partial rollouts: a batch generated in segments of at most ``segment_tokens`` new tokens, so that new
weights can arrive between two segments and the rows still unfinished continue with them.

Each segment is one ordinary ``generate_sequences`` call on the rollout workers. The rows that have not
stopped (no eos or stop string, fewer than the response limit) continue in the next one from their prompt
and what they have generated so far, as a prompt of their own (left-padded, n=1). At the end every row's
segments are concatenated into one response, with its mask and the rollout's log-probs, in the layout one
call returns; ``param_version_start`` and ``param_version_end`` record the policy versions
that generated its first and last segment, and the tensor ``rollout_param_versions`` the version that
generated each response token (-1 past the response).

Greedy decoding in segments with unchanged weights gives the one-call tokens; sampled decoding draws each
later segment from a seed of its own (``derive_seed`` of the batch's seed and the segment).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from verl.core.engine import SamplingParams
from verl.core.engine.requests import derive_seed
from verl.core.protocol import DataProto

#: A generation call: (prompts with input_ids/attention_mask/position_ids, sampling) -> the rollout's output.
Generate = Callable[[DataProto, SamplingParams], DataProto]


def generate_in_segments(
    generate: Generate,
    prompts: DataProto,
    sampling: SamplingParams,
    segment_tokens: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    version: Callable[[], int],
    between: Callable[[], None] = lambda: None,
) -> DataProto:
    """``prompts`` (B rows) x ``sampling.n`` samples of at most ``sampling.max_new_tokens`` tokens, generated
    ``segment_tokens`` at a time. ``between()`` runs after each segment that leaves rows unfinished (it may
    wait for new weights); ``version()``, asked right after a segment returns, is the policy version that
    generated it."""
    limit = sampling.max_new_tokens
    first = generate(prompts, replace(sampling, max_new_tokens=min(segment_tokens, limit)))
    rows = len(first)
    tokens = [_row_tokens(first, i) for i in range(rows)]
    logprobs = [_row_logprobs(first, i) for i in range(rows)]
    start = np.full(rows, version(), dtype=np.int64)
    end = start.copy()
    versions = [torch.full((len(t),), int(start[0]), dtype=torch.long) for t in tokens]
    done = [_stopped(t, min(segment_tokens, limit), eos_token_ids) or len(t) >= limit for t in tokens]
    segment = 1
    while not all(done):
        between()
        pending = [i for i in range(rows) if not done[i]]
        context = _continuation_prompts(first, pending, tokens, pad_token_id)
        room = min(segment_tokens, limit - min(len(tokens[i]) for i in pending))
        # one sample per continued row, drawn from a stream of the segment's own
        seed = None if sampling.seed is None else derive_seed(sampling.seed, "segment", segment)
        out = generate(context, replace(sampling, n=1, max_new_tokens=room, seed=seed))
        current = version()
        for k, i in enumerate(pending):
            more = _row_tokens(out, k)[: limit - len(tokens[i])]
            tokens[i] = torch.cat([tokens[i], more])
            logprobs[i] = torch.cat([logprobs[i], _row_logprobs(out, k)[: len(more)]])
            versions[i] = torch.cat([versions[i], torch.full((len(more),), current, dtype=torch.long)])
            end[i] = current
            done[i] = _stopped(more, room, eos_token_ids) or len(tokens[i]) >= limit
        segment += 1
    return _assembled(first, prompts, sampling, tokens, logprobs, versions, start, end, pad_token_id)


def _row_tokens(output: DataProto, row: int) -> torch.Tensor:
    mask = output.batch["response_mask"][row].bool()
    return output.batch["responses"][row][mask]


def _row_logprobs(output: DataProto, row: int) -> torch.Tensor:
    mask = output.batch["response_mask"][row].bool()
    if "rollout_log_probs" not in output.batch.keys():
        return torch.zeros(int(mask.sum()), dtype=torch.float32)
    return output.batch["rollout_log_probs"][row][mask].float()


def _stopped(new_tokens: torch.Tensor, room: int, eos_token_ids: list[int]) -> bool:
    """The row ended inside this segment: it stopped short of the room it had, or on an eos token."""
    return len(new_tokens) < room or (len(new_tokens) > 0 and int(new_tokens[-1]) in eos_token_ids)


def _continuation_prompts(first: DataProto, pending: list[int], tokens: list, pad_token_id: int) -> DataProto:
    """Each pending row's prompt and response so far, left-padded into one batch."""
    texts = []
    prompt_width = first.batch["prompts"].shape[1]
    for i in pending:
        prompt_mask = first.batch["attention_mask"][i][:prompt_width].bool()
        texts.append(torch.cat([first.batch["prompts"][i][prompt_mask], tokens[i]]))
    width = max(len(t) for t in texts)
    input_ids = torch.full((len(texts), width), pad_token_id, dtype=texts[0].dtype)
    attention_mask = torch.zeros((len(texts), width), dtype=torch.long)
    for k, text in enumerate(texts):
        input_ids[k, width - len(text) :] = text
        attention_mask[k, width - len(text) :] = 1
    position_ids = torch.clamp(attention_mask.cumsum(-1) - 1, min=0)
    non_tensors = {key: value[pending] for key, value in first.non_tensor_batch.items()}
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        non_tensors=non_tensors,
        meta_info=dict(first.meta_info),
    )


def _assembled(
    first: DataProto,
    prompts: DataProto,
    sampling: SamplingParams,
    tokens: list,
    logprobs: list,
    versions: list,
    start: np.ndarray,
    end: np.ndarray,
    pad_token_id: int,
) -> DataProto:
    from verl.engines.rollout.output import assemble_rollout_output

    rows, width = len(tokens), sampling.max_new_tokens
    responses = torch.full((rows, width), pad_token_id, dtype=first.batch["responses"].dtype)
    lengths = torch.zeros(rows, dtype=torch.long)
    rollout_log_probs = torch.zeros(rows, width, dtype=torch.float32)
    token_versions = torch.full((rows, width), -1, dtype=torch.long)
    for i, (row_tokens, row_logprobs) in enumerate(zip(tokens, logprobs)):
        responses[i, : len(row_tokens)] = row_tokens
        rollout_log_probs[i, : len(row_logprobs)] = row_logprobs
        token_versions[i, : len(row_tokens)] = versions[i]
        lengths[i] = len(row_tokens)
    output = assemble_rollout_output(
        prompts, sampling.n, responses, lengths, rollout_log_probs if sampling.logprobs else None
    )
    output.meta_info["metrics"] = first.meta_info.get("metrics", {})
    output.batch["rollout_param_versions"] = token_versions
    output.non_tensor_batch["param_version_start"] = start
    output.non_tensor_batch["param_version_end"] = end
    return output
