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

Shared prompts: GRPO-style batches hold ``n`` responses to each prompt. With ``share_prompts`` the
packed row holds each distinct prompt once, followed by its responses one after another::

    [P0 | R0a | R0b | R0c | P1 | R1a | R1b ...]   positions  0..p-1 | p.. | p.. | p.. | 0..q-1 | q.. | q..

Each response keeps its own positions (continuing after its prompt), so a position that does not
follow its predecessor marks where a response starts over: a restart at 0 opens a new prompt, a
restart at ``q > 0`` opens another response that sees the first ``q`` tokens of the current prompt
(:mod:`verl.engines.fsdp.varlen_attention` reads this). The prompt is computed once instead of ``n``
times; the logits of its last token predict the first token of every response, so ``keep`` is an
index list (with that position repeated) rather than a mask.
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
    #: The positions whose next token is a response token: a bool mask like input_ids when padded,
    #: an index list [N] into the packed row when packed (a shared prompt's last token repeats).
    keep: torch.Tensor
    targets: torch.Tensor  # [N] the response tokens those positions predict
    response_valid: torch.Tensor  # bool [B, R]: where the N outputs go

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel()) if self.attention_mask is None else int(self.attention_mask.sum())

    def kept(self, per_position: torch.Tensor) -> torch.Tensor:
        """[N, ...] rows of a model output ``[B, L, ...]`` (or ``[1, T, ...]``) at the kept positions."""
        if self.keep.dtype == torch.bool:
            return per_position[self.keep]
        return per_position[0, self.keep]


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
    share_prompts: bool = False,
) -> ModelInputs:
    response_length = responses.shape[1]
    check_layout(attention_mask, response_length)
    keep, response_valid = response_positions(attention_mask, response_length)
    targets = responses[response_valid]
    if not remove_padding:
        return ModelInputs(input_ids, position_ids, attention_mask, keep, targets, response_valid)
    if share_prompts:
        return _pack_sharing_prompts(input_ids, attention_mask, position_ids, response_valid, targets)
    packed_ids, packed_pos = pack(input_ids, attention_mask, position_ids)
    # The predicting positions are real tokens (contiguity checked above), so they survive packing.
    packed_keep = keep[attention_mask.bool()].nonzero().flatten()
    return ModelInputs(packed_ids, packed_pos, None, packed_keep, targets, response_valid)


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int) -> list[list[int]]:
    """Row indices grouped by identical prompt tokens, groups in order of first appearance."""
    prompt_ids = input_ids[:, : input_ids.shape[1] - response_length]
    prompt_mask = attention_mask[:, : input_ids.shape[1] - response_length].bool()
    groups: dict[tuple[int, ...], list[int]] = {}
    for row in range(input_ids.shape[0]):
        groups.setdefault(tuple(prompt_ids[row][prompt_mask[row]].tolist()), []).append(row)
    return list(groups.values())


def prompt_group_units(batch, seqlens: list[int], max_tokens: int) -> list[tuple[list[int], int]]:
    """Rows grouped by prompt, each group cut into runs whose shared size (prompt once plus every
    response) fits ``max_tokens``: the (rows, tokens) units that token-budget micro-batching packs."""
    t = batch.tensors
    response_lens = t["attention_mask"][:, -t["responses"].shape[1] :].sum(-1).tolist()
    units: list[tuple[list[int], int]] = []
    for group in prompt_groups(t["input_ids"], t["attention_mask"], t["responses"].shape[1]):
        prompt_len = seqlens[group[0]] - response_lens[group[0]]
        rows: list[int] = []
        tokens = prompt_len
        for row in group:
            if rows and tokens + response_lens[row] > max_tokens:
                units.append((rows, tokens))
                rows, tokens = [], prompt_len
            rows.append(row)
            tokens += response_lens[row]
        units.append((rows, tokens))
    return units


def _pack_sharing_prompts(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_valid: torch.Tensor,
    targets: torch.Tensor,
) -> ModelInputs:
    response_length = response_valid.shape[1]
    prompt_width = input_ids.shape[1] - response_length
    prompt_valid = attention_mask[:, :prompt_width].bool()
    ids, pos = [], []
    predicting: dict[int, torch.Tensor] = {}  # row -> packed positions predicting its response tokens
    offset = 0
    for group in prompt_groups(input_ids, attention_mask, response_length):
        first = group[0]
        ids.append(input_ids[first, :prompt_width][prompt_valid[first]])
        pos.append(position_ids[first, :prompt_width][prompt_valid[first]])
        offset += ids[-1].numel()
        last_prompt_token = offset - 1
        for row in group:
            valid = response_valid[row]
            n = int(valid.sum())
            ids.append(input_ids[row, prompt_width:][valid])
            pos.append(position_ids[row, prompt_width:][valid])
            # token j of the response is predicted by the token before it: the prompt's last, then j-1
            predicting[row] = torch.cat([torch.tensor([last_prompt_token]), offset + torch.arange(n - 1)])[:n]
            offset += n
    keep = torch.cat([predicting[row] for row in range(input_ids.shape[0])]).to(input_ids.device)
    return ModelInputs(torch.cat(ids).unsqueeze(0), torch.cat(pos).unsqueeze(0), None, keep, targets, response_valid)


def scatter_to_responses(values: torch.Tensor, response_valid: torch.Tensor) -> torch.Tensor:
    """[N] per-token values -> [B, R] with zeros at non-response positions (differentiable)."""
    out = torch.zeros(response_valid.shape, dtype=values.dtype, device=values.device)
    return out.masked_scatter(response_valid, values)
