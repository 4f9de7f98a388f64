"""Grouped-query attention that reads the KV cache as it is, for decoding on the CPU.

transformers' "sdpa" attention copies every layer's keys and values ``num_attention_heads /
num_key_value_heads`` times (``repeat_kv``) whenever an attention mask is given, which a left-padded
batch always has: it keeps SDPA's ``enable_gqa`` for mask-free calls, because with a mask CUDA falls back
to the math kernel. On the CPU, SDPA's kernel takes a mask and grouped heads together, so the copy (a
few MB per layer and step) is pure overhead. This attention passes grouped heads with a mask straight to
SDPA and hands every other case (no grouping, no mask, position bias, paged caches, attention weights
asked for) to transformers' own function, so it computes the same numbers (checked against "sdpa" in
``tests/test_hf_decode_paths.py``).

A decode step (one query per row) does not go to SDPA at all: its CPU kernel is built for long query
blocks, and for one query it took ~250 us per SmolLM2 layer at 16 rows where two batched products and a
softmax take ~190 (~1.8 ms of a ~57 ms decode step). The query heads that share a KV head are laid out as
that head's query rows, so the grouped keys and values are read as they are here too.
"""

from __future__ import annotations

import functools

import torch

NAME = "verl_sdpa_gqa"


def sdpa_gqa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = attention_mask is not None and kwargs.get("position_bias") is None and not kwargs.get("output_attentions")
    paged = isinstance(kwargs.get("cache"), _paged_cache_types())
    if plain and not paged and dropout == 0.0 and _one_query_per_row(query, key, attention_mask):
        return _single_query_attention(query, key, value, attention_mask, scaling), None
    if not (grouped and plain) or paged:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # With a mask, transformers' function sets is_causal=False too: the mask carries causality.
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


def _one_query_per_row(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """A decode step on the CPU whose mask is one row of keys per sequence ([b, 1, 1, >= keys]), run eagerly
    (a compiled step fuses SDPA's surroundings itself, and the mask's conversion is kept per tensor object,
    which a trace cannot guard on)."""
    return (
        mask is not None
        and query.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and query.shape[2] == 1
        and query.shape[1] % key.shape[1] == 0
        and mask.dim() == 4
        and mask.shape[1] == mask.shape[2] == 1
        and mask.shape[3] >= key.shape[2]
    )


def _single_query_attention(query, key, value, mask, scaling: float | None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v for query [b, heads, 1, d] over key/value [b, kv heads, s, d]:
    the ``heads / kv heads`` queries of a KV head become its query rows. Returns [b, 1, heads, d]."""
    rows, heads, _, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    scale = dim**-0.5 if scaling is None else scaling
    scores = torch.matmul(query.reshape(rows, kv_heads, heads // kv_heads, dim), key.transpose(-1, -2))
    # The mask [b, 1, 1, s] broadcasts over the KV heads and their query rows. Every row attends to at
    # least its own new key, so no row of the softmax is all -inf.
    scores.mul_(scale).add_(_ADDITIVE_MASK.of(mask, scores.dtype)[..., :keys])
    out = torch.matmul(torch.softmax(scores, dim=-1), value)  # [b, kv heads, group, d]
    return out.view(rows, heads, 1, dim).transpose(1, 2)


class _AdditiveMask:
    """The additive float form of a boolean mask, kept for the mask last converted: a decode step hands
    the same mask tensor to every layer, so it is converted once a step, not once a layer."""

    def __init__(self):
        self._key: tuple | None = None
        self._value: torch.Tensor | None = None

    def of(self, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if mask.dtype != torch.bool:
            return mask
        key = (mask, mask._version, dtype)
        if self._key is None or not (self._key[0] is mask and self._key[1:] == key[1:]):
            self._value = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))
            self._key = key
        return self._value  # type: ignore[return-value]


_ADDITIVE_MASK = _AdditiveMask()


@functools.cache
def _paged_cache_types() -> tuple[type, ...]:
    """transformers' paged KV cache (continuous batching), which its own function handles; () where this
    transformers has none."""
    try:
        from transformers.generation.continuous_batching.cache import PagedAttentionCache
    except ImportError:
        return ()
    return (PagedAttentionCache,)


@functools.cache
def gqa_attention_name() -> str | None:
    """Registers the attention (and sdpa's mask format for it) with transformers; None when this
    transformers has no attention registry."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    except ImportError:
        return None
    AttentionInterface.register(NAME, sdpa_gqa_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME
