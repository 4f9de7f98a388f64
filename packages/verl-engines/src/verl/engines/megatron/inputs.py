"""The rollout batch layout -> what megatron's ``GPTModel`` reads.

Rollout batches are ``[left-padded prompt | right-padded response]`` rows with HF ``position_ids``.
megatron's local attention has no padding mask and its rotary embedding ignores ``position_ids``
(positions are 0..S-1), so each row is *left-aligned*: its real tokens moved to the front, padding
after them. Under the causal mask, padding after the last real token cannot change any real token's
output, and the real tokens' positions 0..n-1 are exactly the HF ``position_ids`` of the padded row.

The positions whose logits predict response tokens (``keep``) and the order of the targets are the
FSDP engine's (``verl.engines.fsdp.packing.response_positions``): row-major over real response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl.engines.fsdp.packing import response_positions


@dataclass
class AlignedInputs:
    input_ids: torch.Tensor  # [B, S] real tokens first, then pad (0)
    position_ids: torch.Tensor  # [B, S] 0..S-1
    keep: torch.Tensor  # bool [B, S]: the positions that predict a real response token
    targets: torch.Tensor  # [N] the response tokens they predict, row-major
    response_valid: torch.Tensor  # bool [B, R]: where the N per-token outputs go


def left_align(input_ids: torch.Tensor, attention_mask: torch.Tensor, responses: torch.Tensor) -> AlignedInputs:
    """Move each row's real tokens to the front (the sequence width stays the batch's, so every
    micro-batch of a call has one shape, which pipeline stages exchange)."""
    batch, width = input_ids.shape
    mask = attention_mask.bool()
    keep_padded, response_valid = response_positions(attention_mask, responses.shape[1])
    # Real tokens of a row are contiguous; their new index is the count of real tokens before them.
    new_index = (mask.long().cumsum(-1) - 1).clamp(min=0)
    rows = torch.arange(batch, device=input_ids.device).unsqueeze(-1).expand(-1, width)
    aligned = torch.zeros_like(input_ids)
    aligned[rows[mask], new_index[mask]] = input_ids[mask]
    keep = torch.zeros_like(mask)
    keep[rows[keep_padded], new_index[keep_padded]] = True
    positions = torch.arange(width, device=input_ids.device).unsqueeze(0).expand(batch, -1)
    return AlignedInputs(aligned, positions, keep, responses[response_valid], response_valid)


def causal_mask(seq_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """megatron's boolean attention mask (True = masked out), [1, 1, S, S]. Passed explicitly: megatron's
    default one is built on "cuda"."""
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)[None, None]
