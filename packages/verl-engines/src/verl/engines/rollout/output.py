"""Assembling a rollout engine's output batch (the layout documented in ``verl.core.engine.rollout``).

Shared by every backend: given the prompts and the generated token ids, it builds ``prompts``,
``responses``, ``input_ids``, ``attention_mask``, ``position_ids``, ``response_mask`` and the optional
``rollout_log_probs``, and repeats the prompts' non-tensor fields ``n`` times (interleaved).
"""

from __future__ import annotations

import torch

from verl.core.protocol import DataProto


def check_left_padded(attention_mask: torch.Tensor) -> None:
    if attention_mask.shape[1] == 0 or not bool(attention_mask[:, -1].all()):
        raise ValueError(
            "prompts must be left-padded: every row's last attention_mask column must be 1 "
            "(pad on the left, e.g. tokenizer.padding_side = 'left')"
        )


def assemble_rollout_output(
    prompts: DataProto,
    n: int,
    responses: torch.Tensor,
    response_lengths: torch.Tensor,
    rollout_log_probs: torch.Tensor | None = None,
) -> DataProto:
    """``prompts``: the input batch (B rows); ``responses`` [B*n, R] right-padded with the pad token,
    ``response_lengths`` [B*n] generated tokens per row (eos/stop included)."""
    repeated = prompts.repeat(n, interleave=True) if n > 1 else prompts
    prompt_ids = repeated.tensors["input_ids"]
    prompt_mask = repeated.tensors["attention_mask"]
    prompt_pos = repeated.tensors["position_ids"]
    width = responses.shape[1]
    response_mask = (torch.arange(width)[None, :] < response_lengths[:, None]).to(prompt_mask.dtype)
    # Positions continue from each prompt's last position (the positions beyond the end are masked).
    response_pos = prompt_pos[:, -1:] + torch.arange(1, width + 1, dtype=prompt_pos.dtype)[None, :]
    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "position_ids": torch.cat([prompt_pos, response_pos], dim=1),
        "response_mask": response_mask,
    }
    if rollout_log_probs is not None:
        tensors["rollout_log_probs"] = rollout_log_probs.float() * response_mask
    return DataProto.from_dict(tensors, non_tensors=repeated.non_tensor_batch, meta_info=dict(prompts.meta_info))
