"""Packed ("varlen") attention with torch's sdpa: one causal attention per packed sequence.

transformers packs by ``position_ids`` (``attention_mask=None``, positions restarting at 0): flash
attention turns that into per-sequence lengths, but sdpa and eager get a block-diagonal
``[T, T]`` mask, which computes (and stores) attention over the whole packed row. On CPU that makes
packing slower than padding once a micro-batch holds more than a few sequences. This attention
function, registered with transformers under :data:`VARLEN_SDPA`, runs ``scaled_dot_product_attention``
with ``is_causal=True`` on each packed sequence instead, so the cost is ``sum(s_i^2)``, not ``T^2``.

Prompt-shared rows (see :mod:`verl.engines.fsdp.packing`): a segment whose positions restart at
``q > 0`` is another response to the current prompt; it attends to the prompt's first ``q`` tokens
and causally to itself, in one sdpa call with a ``[r, q + r]`` mask (memory linear in the response,
never ``T^2``).

Padded inputs (a 2-D ``attention_mask``) and KV-cache decoding go to transformers' own sdpa path
unchanged. The engine uses this when its config asks for ``attn_implementation="sdpa"``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

VARLEN_SDPA = "verl_varlen_sdpa"


def sequence_bounds(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each packed segment in a 1-D row of positions (a new one wherever the
    position does not follow the previous one by exactly 1)."""
    starts = (torch.diff(position_ids) != 1).nonzero().flatten() + 1
    edges = [0, *starts.tolist(), position_ids.numel()]
    return list(zip(edges[:-1], edges[1:]))


def segments(position_ids: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(start, end, prefix_start, prefix_len) of each segment: a segment starting at position 0 opens
    a new sequence (no prefix); one starting at ``q > 0`` continues the current sequence's first ``q``
    tokens (a response sharing its prompt)."""
    first_positions = position_ids[[start for start, _ in sequence_bounds(position_ids)]].tolist()
    out, head = [], None
    for (start, end), q in zip(sequence_bounds(position_ids), first_positions):
        if q == 0 or head is None:
            head = (start, end)
            out.append((start, end, start, 0))
            continue
        if q > head[1] - head[0]:
            raise ValueError(
                f"packed position ids restart at {q} but the current sequence's first segment has only "
                f"{head[1] - head[0]} tokens: a shared-prompt segment must follow its prompt"
            )
        out.append((start, end, head[0], q))
    return out


def _segment_attention(query, key, value, segment, dropout: float, scaling: float | None) -> torch.Tensor:
    start, end, prefix_start, prefix_len = segment
    q = query[:, :, start:end]
    if prefix_len == 0:
        k, v = key[:, :, start:end], value[:, :, start:end]
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True)
    prefix = slice(prefix_start, prefix_start + prefix_len)
    k = torch.cat([key[:, :, prefix], key[:, :, start:end]], dim=2)
    v = torch.cat([value[:, :, prefix], value[:, :, start:end]], dim=2)
    length = end - start
    own = torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
    mask = torch.cat([torch.ones(length, prefix_len, dtype=torch.bool, device=query.device), own], dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)


def varlen_sdpa_mask(*args, attention_mask=None, **kwargs):
    """No mask for packed/unpadded inputs (the attention splits by position ids); sdpa's otherwise."""
    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def varlen_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    position_ids = kwargs.get("position_ids")
    if attention_mask is not None or position_ids is None or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    # From the shapes, not the module: under sequence parallelism a rank holds a share of the heads.
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    dropout = dropout if module.training else 0.0
    rows = []
    for row in range(query.shape[0]):
        row_segments = segments(position_ids[min(row, position_ids.shape[0] - 1)])
        if all(prefix_len == 0 for *_, prefix_len in row_segments):
            lengths = [end - start for start, end, *_ in row_segments]
            # split (not slicing): its backward is one concatenation, not a zero-filled copy per sequence
            pieces = [
                F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True)
                for q, k, v in zip(
                    query[row : row + 1].split(lengths, dim=2),
                    key[row : row + 1].split(lengths, dim=2),
                    value[row : row + 1].split(lengths, dim=2),
                )
            ]
        else:
            q, k, v = query[row : row + 1], key[row : row + 1], value[row : row + 1]
            pieces = [_segment_attention(q, k, v, segment, dropout, scaling) for segment in row_segments]
        rows.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2))
    out = rows[0] if len(rows) == 1 else torch.cat(rows, dim=0)
    return out.transpose(1, 2).contiguous(), None


def register_varlen_sdpa() -> str:
    """Make :data:`VARLEN_SDPA` a transformers attention implementation (idempotent); returns its name."""
    AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN_SDPA, varlen_sdpa_mask)
    return VARLEN_SDPA
