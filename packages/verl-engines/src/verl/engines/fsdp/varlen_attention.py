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


def _row_attention(query, key, value, row_segments, dropout: float, scaling: float | None) -> list[torch.Tensor]:
    """Each segment of one packed row [1, heads, T, d] attended causally on its own; a shared-prompt
    response also attends to its prompt's first ``prefix_len`` tokens.

    The row is split into its segments once (a split's backward is one concatenation) rather than sliced
    per segment: a slice's backward allocates a zero-filled gradient of the whole row, which with n
    responses per prompt, q/k/v and every layer came to over a gigabyte of memset per update on SmolLM2.
    """
    lengths = [end - start for start, end, *_ in row_segments]
    qs, ks, vs = (t.split(lengths, dim=2) for t in (query, key, value))
    index_of = {start: i for i, (start, *_) in enumerate(row_segments)}
    pieces = []
    for i, (start, end, prefix_start, prefix_len) in enumerate(row_segments):
        length = end - start
        if prefix_len == 0:
            pieces.append(
                F.scaled_dot_product_attention(qs[i], ks[i], vs[i], dropout_p=dropout, scale=scaling, is_causal=True)
            )
            continue
        head = index_of[prefix_start]
        # The prompt's segment also holds its first response (whose positions simply continue the
        # prompt's), so the prefix is usually a slice of that piece: a gradient the size of one sequence.
        k_prefix, v_prefix = ks[head], vs[head]
        if prefix_len < lengths[head]:
            k_prefix, v_prefix = k_prefix[:, :, :prefix_len], v_prefix[:, :, :prefix_len]
        k = torch.cat([k_prefix, ks[i]], dim=2)
        v = torch.cat([v_prefix, vs[i]], dim=2)
        own = torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
        mask = torch.cat([torch.ones(length, prefix_len, dtype=torch.bool, device=query.device), own], dim=1)
        pieces.append(F.scaled_dot_product_attention(qs[i], k, v, attn_mask=mask, dropout_p=dropout, scale=scaling))
    return pieces


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
    # split (not slicing) into rows and segments: its backward is one concatenation, not a zero-filled
    # gradient of the whole tensor per piece
    for row, (q, k, v) in enumerate(zip(query.split(1), key.split(1), value.split(1), strict=True)):
        row_segments = segments(position_ids[min(row, position_ids.shape[0] - 1)])
        pieces = _row_attention(q, k, v, row_segments, dropout, scaling)
        rows.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2))
    out = rows[0] if len(rows) == 1 else torch.cat(rows, dim=0)
    return out.transpose(1, 2).contiguous(), None


def register_varlen_sdpa() -> str:
    """Make :data:`VARLEN_SDPA` a transformers attention implementation (idempotent); returns its name."""
    AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN_SDPA, varlen_sdpa_mask)
    return VARLEN_SDPA
