"""Sequence packing ("remove padding") and the response-token bookkeeping of a micro-batch.

The rollout layout is ``input_ids = prompt (left-padded) ++ response (right-padded)`` with
``attention_mask`` marking real tokens. Packing drops every pad token and lays the sequences end to
end in one row ``[1, T]``; ``position_ids`` restart at each sequence, which is how transformers
recognises packed sequences (``attention_mask=None``): flash-attention gets per-sequence lengths and
sdpa/eager get a block-diagonal causal mask, so attention never crosses a sequence boundary.

Log-probs are needed only for response tokens: logits at position ``t`` predict token ``t + 1``, so
the model is asked (``logits_to_keep`` as a boolean mask) for exactly the positions that precede a
real response token. Both the padded and the packed layouts list those positions in the same
(row, column) order, so their outputs scatter back into ``[B, R]`` the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelInputs:
    """Tensors for one forward of a Hugging Face model, plus how to map its outputs back."""

    input_ids: torch.Tensor  # [B, L] padded, or [1, T] packed
    position_ids: torch.Tensor  # same shape as input_ids
    attention_mask: torch.Tensor | None  # [B, L] padded; None when packed
    keep: torch.Tensor  # bool, same shape as input_ids: positions whose next token is a response token
    targets: torch.Tensor  # [N] the response tokens those positions predict
    response_valid: torch.Tensor  # bool [B, R]: where the N outputs go

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel()) if self.attention_mask is None else int(self.attention_mask.sum())


def check_layout(attention_mask: torch.Tensor, response_length: int) -> None:
    """Each row must be one contiguous run of real tokens that includes the last prompt token."""
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    first = torch.where(lengths > 0, mask.int().argmax(-1), torch.zeros_like(lengths))
    span = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    contiguous = (span >= first[:, None]) & (span < (first + lengths)[:, None])
    if not torch.equal(contiguous, mask):
        raise ValueError(
            "attention_mask must mark one contiguous run of tokens per row (left-padded prompt followed by a "
            "right-padded response); holes inside a sequence are not supported"
        )
    prompt_end = mask.shape[1] - response_length - 1
    if prompt_end < 0 or not bool(mask[:, prompt_end].all()):
        raise ValueError(
            "every row needs at least one prompt token right before the response (empty prompt, or "
            "input_ids/attention_mask not laid out as prompt ++ responses)"
        )


def response_positions(attention_mask: torch.Tensor, response_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep [B, L], response_valid [B, R]): the predicting positions and the real response tokens."""
    seq_len = attention_mask.shape[1]
    response_valid = attention_mask[:, seq_len - response_length :].bool()
    keep = torch.zeros_like(attention_mask, dtype=torch.bool)
    keep[:, seq_len - response_length - 1 : seq_len - 1] = response_valid
    return keep, response_valid


def pack(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed ``input_ids`` and ``position_ids`` ([1, T]) of the real tokens, row after row."""
    valid = attention_mask.bool()
    if position_ids.dim() != 2:
        raise ValueError(f"packing needs 2-D position_ids [B, L], got shape {tuple(position_ids.shape)}")
    return input_ids[valid].unsqueeze(0), position_ids[valid].unsqueeze(0)


def build_model_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    responses: torch.Tensor,
    remove_padding: bool,
) -> ModelInputs:
    response_length = responses.shape[1]
    check_layout(attention_mask, response_length)
    keep, response_valid = response_positions(attention_mask, response_length)
    targets = responses[response_valid]
    if not remove_padding:
        return ModelInputs(input_ids, position_ids, attention_mask, keep, targets, response_valid)
    packed_ids, packed_pos = pack(input_ids, attention_mask, position_ids)
    # The predicting positions are real tokens (contiguity checked above), so they survive packing.
    packed_keep = keep[attention_mask.bool()].unsqueeze(0)
    return ModelInputs(packed_ids, packed_pos, None, packed_keep, targets, response_valid)


def scatter_to_responses(values: torch.Tensor, response_valid: torch.Tensor) -> torch.Tensor:
    """[N] per-token values -> [B, R] with zeros at non-response positions (differentiable)."""
    out = torch.zeros(response_valid.shape, dtype=values.dtype, device=values.device)
    return out.masked_scatter(response_valid, values)
