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
that head's query rows, so the grouped keys and values are read as they are here too. Of a static
cache's slots it reads only those up to the last one any row attends to (the later ones are not written
yet). Keys registered by a cache that holds only part of what the step attends to (``shared_prefix``:
the responses' part, the prompts' part held once per prompt) go to that cache's own attention. During a
generate with ``cpu_kernels`` the step goes to a fused kernel instead, one pass per row and KV head
(``single_query_kernel``).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import TypeGuard

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
    owner = _key_owner(key)
    if owner is not None:  # keys that hold only part of what the step attends to (``shared_prefix``)
        if not (plain and dropout == 0.0 and _one_query_per_row(attention_mask, query)):
            raise RuntimeError("a shared-prefix KV cache is read by one-query decode steps only")
        additive, attended = _ADDITIVE_MASK.of(attention_mask, query.dtype)
        return owner.attend(query, additive, attended, _scale(query, scaling)), None
    if plain and not paged and dropout == 0.0 and _one_query_per_row(attention_mask, query, key):
        additive, attended = _ADDITIVE_MASK.of(attention_mask, query.dtype)
        return _single_query_attention(query, key, value, additive, attended, _scale(query, scaling)), None
    if not (grouped and plain) or paged:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # With a mask, transformers' function sets is_causal=False too: the mask carries causality.
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


def _one_query_per_row(
    mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor | None = None
) -> TypeGuard[torch.Tensor]:
    """A decode step on the CPU whose mask is one row of keys per sequence ([b, 1, 1, >= keys]), run eagerly
    (a compiled step fuses SDPA's surroundings itself, and the mask's conversion is kept per tensor object,
    which a trace cannot guard on). ``key``: also check the plain cache's keys [b, kv heads, keys, d]."""
    return (
        mask is not None
        and query.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and query.shape[2] == 1
        and mask.dim() == 4
        and mask.shape[1] == mask.shape[2] == 1
        and (key is None or (query.shape[1] % key.shape[1] == 0 and mask.shape[3] >= key.shape[2]))
    )


def _scale(query: torch.Tensor, scaling: float | None) -> float:
    return query.shape[-1] ** -0.5 if scaling is None else scaling


def _single_query_attention(query, key, value, additive, attended: int, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v for query [b, heads, 1, d] over key/value [b, kv heads, s, d]:
    the ``heads / kv heads`` queries of a KV head become its query rows. ``additive``: the mask as floats,
    ``attended``: how many leading slots any row attends to. Returns [b, 1, heads, d]."""
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    # A static cache hands over all its slots, the ones not written yet masked out; keys past the last
    # one any row attends to add exactly 0 to the softmax, so they are not read (on average a fifth of a
    # prompt + 24-token cache).
    keys = min(attended, key.shape[2])
    if _SINGLE_QUERY_KERNELS:
        out = _SINGLE_QUERY_KERNELS[-1](query, key, value, additive, keys, scale)
        if out is not None:
            return out
    key, value = key[:, :, :keys], value[:, :, :keys]
    scores = torch.matmul(query.reshape(rows, kv_heads, heads // kv_heads, dim), key.transpose(-1, -2))
    # The mask [b, 1, 1, s] broadcasts over the KV heads and their query rows. Every row attends to at
    # least its own new key, so no row of the softmax is all -inf.
    scores.mul_(scale).add_(additive[..., :keys])
    out = torch.matmul(torch.softmax(scores, dim=-1), value)  # [b, kv heads, group, d]
    return out.view(rows, heads, 1, dim).transpose(1, 2)


#: Kernels that compute ``_single_query_attention(query, key, value, additive, keys, scale)`` over the first
#: ``keys`` slots, or return None for inputs they do not take; the last one entered is used.
_SINGLE_QUERY_KERNELS: list = []


@contextlib.contextmanager
def single_query_kernel(kernel):
    """Within the block, one-query decode attention goes to ``kernel`` where it takes the inputs."""
    _SINGLE_QUERY_KERNELS.append(kernel)
    try:
        yield
    finally:
        _SINGLE_QUERY_KERNELS.remove(kernel)


class _AdditiveMask:
    """The additive float form of a mask and the number of leading key slots any row attends to, kept
    for the mask last seen: a decode step hands the same mask tensor to every layer, so it is converted
    once a step, not once a layer."""

    def __init__(self):
        self._key: tuple | None = None
        self._value: tuple[torch.Tensor, int] | None = None

    def of(self, mask: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
        key = (mask, mask._version, dtype)
        if self._key is None or not (self._key[0] is mask and self._key[1:] == key[1:]):
            if mask.dtype == torch.bool:
                additive, attends = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf")), mask
            else:
                additive, attends = mask, mask > float("-inf")
            used = attends.reshape(-1, mask.shape[-1]).any(0).nonzero()
            self._value = (additive, int(used[-1]) + 1 if len(used) else mask.shape[-1])
            self._key = key
        return self._value  # type: ignore[return-value]


_ADDITIVE_MASK = _AdditiveMask()

#: Objects that attend a decode step themselves (``attend(query, additive mask, attended, scale)``), by the
#: id of the keys tensor their cache hands to the attention (``shared_prefix``: keys that hold only the
#: responses' part; the prompts' part is the owner's).
_KEY_OWNERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def register_key_owner(keys: torch.Tensor, owner) -> None:
    _KEY_OWNERS[id(keys)] = owner


def _key_owner(key: torch.Tensor):
    owner = _KEY_OWNERS.get(id(key))
    return owner if owner is not None and owner.keys is key else None


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
