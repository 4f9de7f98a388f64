"""vLLM's ``RequestOutput``s as the rollout output batch (the layout of ``verl.core.engine.rollout``).

vLLM returns, per prompt, ``n`` completions with their token ids (eos or the token that completed a
stop string included) and, when asked, one ``{token_id: Logprob}`` entry per generated token. They are
laid out row ``i * n + j`` = prompt ``i``'s sample ``j`` (sorted by vLLM's sample index), right-padded
with the pad token to ``max_new_tokens``, then assembled exactly like the hf engine's output.
"""

from __future__ import annotations

import torch

from verl.core.protocol import DataProto
from verl.engines.rollout.output import assemble_rollout_output


def response_tensors(
    outputs, n: int, width: int, pad_token_id: int, with_logprobs: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(responses [B*n, width], lengths [B*n], log-probs [B*n, width] or None) from vLLM's outputs."""
    rows = len(outputs) * n
    responses = torch.full((rows, width), pad_token_id, dtype=torch.long)
    lengths = torch.zeros(rows, dtype=torch.long)
    logprobs = torch.zeros(rows, width, dtype=torch.float32) if with_logprobs else None
    for i, request in enumerate(outputs):
        completions = sorted(request.outputs, key=lambda c: c.index)
        if len(completions) != n:
            raise RuntimeError(f"vLLM returned {len(completions)} completions for prompt {i}, expected n={n}")
        for j, completion in enumerate(completions):
            row = i * n + j
            ids = list(completion.token_ids)[:width]
            if ids:
                responses[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            lengths[row] = len(ids)
            if logprobs is not None:
                logprobs[row, : len(ids)] = torch.tensor(sampled_logprobs(completion, ids), dtype=torch.float32)
    return responses, lengths, logprobs


def sampled_logprobs(completion, ids: list[int]) -> list[float]:
    """The log-prob of each of ``ids`` (a completion's first tokens) from vLLM's per-token entries."""
    if completion.logprobs is None or len(completion.logprobs) < len(ids):
        raise RuntimeError("vLLM returned no log-probs although SamplingParams.logprobs was set")
    return [completion.logprobs[t][token].logprob for t, token in enumerate(ids)]


def rollout_output(
    prompts: DataProto, outputs, n: int, width: int, pad_token_id: int, with_logprobs: bool
) -> DataProto:
    if len(outputs) != len(prompts):
        raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
    responses, lengths, logprobs = response_tensors(outputs, n, width, pad_token_id, with_logprobs)
    responses = responses.to(prompts.tensors["input_ids"].dtype)
    return assemble_rollout_output(prompts, n, responses, lengths, logprobs)
