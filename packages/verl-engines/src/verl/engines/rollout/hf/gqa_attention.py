"""Grouped-query attention that reads the KV cache as it is, for decoding on the CPU.

transformers' "sdpa" attention copies every layer's keys and values ``num_attention_heads /
num_key_value_heads`` times (``repeat_kv``) whenever an attention mask is given, which a left-padded
batch always has: it keeps SDPA's ``enable_gqa`` for mask-free calls, because with a mask CUDA falls back
to the math kernel. On the CPU, SDPA's kernel takes a mask and grouped heads together, so the copy (a
few MB per layer and step) is pure overhead. This attention passes grouped heads with a mask straight to
SDPA and hands every other case (no grouping, no mask, position bias, paged caches, attention weights
asked for) to transformers' own function, so it computes the same numbers (checked against "sdpa" in
``tests/test_hf_decode_paths.py``).
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
    if not (grouped and plain) or isinstance(kwargs.get("cache"), _paged_cache_types()):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # With a mask, transformers' function sets is_causal=False too: the mask carries causality.
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


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
