"""The CPU rollout's attention for a decode step (one query per row, the query heads of a KV head laid out
as its query rows) against torch's SDPA, which reads the keys of every head itself, on random inputs."""

import pytest
import torch
from torch.nn import functional as F

from verl.engines.rollout.hf.gqa_attention import sdpa_gqa_forward


class Attention(torch.nn.Module):
    def __init__(self, heads: int, kv_heads: int):
        super().__init__()
        self.num_key_value_groups = heads // kv_heads


def padding_mask(rows: int, width: int, seed: int) -> torch.Tensor:
    """[rows, 1, 1, width] bool: each row's leading padding masked, the last key (the new one) always kept."""
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(0, width - 1, (rows,), generator=g)
    keep = torch.arange(width)[None] >= first[:, None]
    return keep[:, None, None, :]


@pytest.mark.parametrize(("heads", "kv_heads"), [(6, 2), (4, 4), (8, 1)])
@pytest.mark.parametrize("scaling", [None, 0.3])
def test_decode_attention_equals_sdpa(heads, kv_heads, scaling):
    torch.manual_seed(heads + kv_heads)
    rows, keys, dim = 5, 11, 16
    # Laid out as a fused projection's columns leave it: a strided slice of a wider product, heads transposed.
    q = torch.randn(rows, 1, heads * dim + 8)[..., : heads * dim].view(rows, 1, heads, dim).transpose(1, 2)
    k, v = torch.randn(rows, kv_heads, keys, dim), torch.randn(rows, kv_heads, keys, dim)
    mask = padding_mask(rows, keys + 3, seed=heads)  # a mask wider than the keys, as the static cache's
    mask[..., keys - 1] = True  # the new key sits within the cache
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask[..., :keys], scale=scaling, enable_gqa=True
    ).transpose(1, 2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got, weights = sdpa_gqa_forward(Attention(heads, kv_heads), q, k, v, mask, scaling=scaling)
    assert not [e for e in prof.key_averages() if "scaled_dot_product" in e.key]  # two products, not SDPA
    assert weights is None
    assert got.shape == (rows, 1, heads, dim)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # An additive float mask gives the same; so does a second call with the same (cached) boolean mask.
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(sdpa_gqa_forward(Attention(heads, kv_heads), q, k, v, additive, scaling=scaling)[0], got)
    torch.testing.assert_close(sdpa_gqa_forward(Attention(heads, kv_heads), q, k, v, mask, scaling=scaling)[0], got)


def test_a_mask_changed_in_place_is_converted_again():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 1, 8), torch.randn(3, 2, 6, 8), torch.randn(3, 2, 6, 8)
    mask = torch.ones(3, 1, 1, 6, dtype=torch.bool)
    module = Attention(4, 2)
    sdpa_gqa_forward(module, q, k, v, mask)
    mask[:, ..., :3] = False  # the same tensor, now hiding the first three keys
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(sdpa_gqa_forward(module, q, k, v, mask)[0], expected, rtol=1e-5, atol=1e-6)


def test_cache_slots_past_the_last_attended_key_are_not_read():
    """A static cache hands over every slot; those no row attends to yet (masked by causality) are not read:
    here they hold NaN, which would turn every output to NaN if they were multiplied in."""
    torch.manual_seed(1)
    rows, heads, kv_heads, slots, dim, written = 4, 6, 2, 20, 8, 13
    q = torch.randn(rows, heads, 1, dim)
    k, v = torch.randn(rows, kv_heads, slots, dim), torch.randn(rows, kv_heads, slots, dim)
    k[:, :, written:], v[:, :, written:] = float("nan"), float("nan")
    mask = padding_mask(rows, written, seed=2)
    mask[1, ..., written - 3 :] = False  # a row attending to fewer keys than the others
    mask[1, ..., 0] = True
    static_mask = torch.cat([mask, torch.zeros(rows, 1, 1, slots - written, dtype=torch.bool)], dim=-1)
    expected = F.scaled_dot_product_attention(
        q, k[:, :, :written], v[:, :, :written], attn_mask=mask, enable_gqa=True
    ).transpose(1, 2)
    for given in (static_mask, torch.zeros(static_mask.shape).masked_fill(~static_mask, float("-inf"))):
        got = sdpa_gqa_forward(Attention(heads, kv_heads), q, k, v, given)[0]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
