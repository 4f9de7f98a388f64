"""Samples decoding against one copy of their prompt's keys and values (``shared_prefix``): the attention
against SDPA over the repeated cache on random inputs, and the engine's outputs against the plain loop's."""

import pytest
import torch
from test_decode_attention import Attention
from test_hf_decode_paths import engine, full_forward_log_probs, left_padded_prompts, padded_left
from torch.nn import functional as F
from transformers import StaticCache
from transformers.models.llama import LlamaConfig

from verl.core.engine import SamplingParams
from verl.engines.rollout.hf.gqa_attention import sdpa_gqa_forward
from verl.engines.rollout.hf.shared_prefix import SharedPrefixCache, SharedPrefixLayer
from verl.engines.rollout.hf.static_decode import SHARED_PREFIX_MIN_PROMPT


@pytest.mark.parametrize(("heads", "kv_heads"), [(6, 2), (4, 4), (8, 1)])
@pytest.mark.parametrize(("prompts", "samples"), [(1, 2), (3, 3)])
def test_shared_prefix_attention_equals_sdpa_over_the_repeated_cache(heads, kv_heads, prompts, samples):
    """Prompt keys once per prompt, three response steps written per row; each step's attention equals
    SDPA over [the prompt's keys repeated for the row, the row's own keys], with each prompt's own left
    padding and the not yet written slots masked."""
    g = torch.Generator().manual_seed(heads * 10 + prompts)
    prompt_len, width, dim, rows = 7, 5, 16, prompts * samples
    prompt_k = torch.randn(prompts, kv_heads, prompt_len, dim, generator=g)
    prompt_v = torch.randn(prompts, kv_heads, prompt_len, dim, generator=g)
    layer = SharedPrefixLayer(prompt_k, prompt_v, samples, width)
    padding = torch.randint(0, prompt_len - 1, (prompts,), generator=g).repeat_interleave(samples)
    own_k, own_v = [], []
    for step in range(3):
        k, v = (torch.randn(rows, kv_heads, 1, dim, generator=g) for _ in range(2))
        own_k.append(k)
        own_v.append(v)
        key, value = layer.update(k, v)
        attended = prompt_len + step + 1
        mask = torch.arange(prompt_len + width)[None] < attended
        mask = (mask & (torch.arange(prompt_len + width)[None] >= padding[:, None]))[:, None, None, :]
        q = torch.randn(rows, heads, 1, dim, generator=g)
        full_k = torch.cat([prompt_k.repeat_interleave(samples, 0), *own_k], dim=2)
        full_v = torch.cat([prompt_v.repeat_interleave(samples, 0), *own_v], dim=2)
        expected = F.scaled_dot_product_attention(
            q, full_k, full_v, attn_mask=mask[..., :attended], enable_gqa=True
        ).transpose(1, 2)
        assert layer.unread
        got, _ = sdpa_gqa_forward(Attention(heads, kv_heads), q, key, value, mask)
        assert not layer.unread
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert int(layer.get_seq_length()) == prompt_len + 3  # positions and masks continue after the prompt


TINY = dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=32)


def tiny_static_cache(prompts: int = 2) -> StaticCache:
    """A prefilled 2-layer static cache of 4 slots: 2 KV heads of dimension 4 per prompt."""
    cache = StaticCache(config=LlamaConfig(**TINY), max_cache_len=4)
    for layer in cache.layers:
        layer.update(torch.randn(prompts, 2, 4, 4), torch.randn(prompts, 2, 4, 4))
    return cache


def test_the_repeated_cache_of_some_rows_holds_their_prompt_and_own_keys():
    """Where rows leave the batch, the decode goes on with a plain static cache of the remaining rows:
    each row's prompt part (repeated), then its own keys and values, at the same length."""
    prefilled = tiny_static_cache(prompts=2)
    cache = SharedPrefixCache(prefilled, samples=3, width=5)
    written = [(torch.randn(6, 2, 1, 4), torch.randn(6, 2, 1, 4)) for _ in range(2)]
    for keys, values in written:
        for layer in cache.layers:
            layer.update(keys, values)
    rows = torch.tensor([0, 2, 5])  # prompt 0 samples 0 and 2, prompt 1 sample 2
    repeated = cache.repeated(LlamaConfig(**TINY), rows)
    for layer, original in zip(repeated.layers, prefilled.layers, strict=True):
        assert layer.keys.shape == (3, 2, 4 + 5, 4)
        assert int(layer.get_seq_length()) == 4 + 2
        torch.testing.assert_close(layer.keys[:, :, :4], original.keys[rows // 3], rtol=0, atol=0)
        torch.testing.assert_close(layer.values[:, :, :4], original.values[rows // 3], rtol=0, atol=0)
        for step, (keys, values) in enumerate(written):
            torch.testing.assert_close(layer.keys[:, :, 4 + step], keys[rows, :, 0], rtol=0, atol=0)
            torch.testing.assert_close(layer.values[:, :, 4 + step], values[rows, :, 0], rtol=0, atol=0)
        assert not layer.keys[:, :, 4 + 2 :].any()  # the slots still to be written


def test_a_layer_not_attended_through_the_shared_prefix_is_an_error():
    """Another attention reading the response part as if it were the whole cache would be silently wrong;
    the decode checks after every step that each layer was attended through the shared prefix."""
    cache = SharedPrefixCache(tiny_static_cache(), samples=3, width=5)
    for layer in cache.layers:
        layer.update(torch.randn(6, 2, 1, 4), torch.randn(6, 2, 1, 4))
    cache.layers[0].unread = False  # as the shared-prefix attention leaves it
    with pytest.raises(RuntimeError, match=r"layers \[1\] did not attend through the shared prompt keys"):
        cache.check_attended()
    with pytest.raises(NotImplementedError, match="keeps its rows in place"):
        cache.reorder_cache(torch.tensor([0, 1]))


@pytest.mark.parametrize(("micro_batch_size", "n", "shared_share"), [(64, 3, 1.0), (6, 3, 1.0), (4, 3, 1 / 3)])
def test_greedy_with_a_shared_prefix_equals_plain_token_for_token(tiny_model, micro_batch_size, n, shared_share):
    """Micro-batches whose prompts have equal sample counts share; the others (a prompt's samples split
    across micro-batches: with 3 samples in 4 rows, only rows 4-7 and 16-19 hold 2 + 2) decode with the
    repeated cache. Once a quarter of a shared batch has finished, its remaining rows go on in a repeated
    cache and leave as they finish. Outputs are the plain loop's either way."""
    prompts = padded_left(left_padded_prompts(tiny_model), extra=4)
    greedy = SamplingParams(n=n, do_sample=False, max_new_tokens=10, logprobs=True)
    free = engine(tiny_model, eos_token_id=[10_000], cache_implementation="dynamic").generate(prompts, greedy)
    eos = sorted({int(free.batch["responses"][0, 1]), int(free.batch["responses"][n * 2, 4])})
    plain = engine(tiny_model, cache_implementation="dynamic", micro_batch_size=micro_batch_size, eos_token_id=eos)
    shared = engine(tiny_model, shared_prefix=True, micro_batch_size=micro_batch_size, eos_token_id=eos)
    a, b = plain.generate(prompts, greedy), shared.generate(prompts, greedy)
    assert b.meta_info["metrics"]["rollout/shared_prefix"] == pytest.approx(shared_share)
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert len(set(a.batch["response_mask"].sum(-1).tolist())) > 1  # rows really ended at different steps
    torch.testing.assert_close(b.batch["rollout_log_probs"], a.batch["rollout_log_probs"], atol=1e-5, rtol=1e-5)
    if micro_batch_size == 64:  # one shared micro-batch, then rows dropped in the repeated cache
        assert b.meta_info["metrics"]["rollout/decode_rows_per_step"] < len(prompts) * n


def test_sampled_log_probs_with_a_shared_prefix_match_a_full_forward(tiny_model):
    prompts = padded_left(left_padded_prompts(tiny_model), extra=5)
    rollout = engine(tiny_model, shared_prefix=True, micro_batch_size=8)
    out = rollout.generate(
        prompts, SamplingParams(n=4, temperature=0.8, top_p=0.9, max_new_tokens=9, logprobs=True, seed=4)
    )
    assert out.meta_info["metrics"]["rollout/shared_prefix"] == 1.0
    expected = full_forward_log_probs(tiny_model, out, 0.8)
    torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=1e-5, rtol=1e-5)


def test_by_default_prompts_share_from_the_threshold_on(tiny_model):
    sampling = SamplingParams(n=2, do_sample=False, max_new_tokens=3)
    default = engine(tiny_model)
    short = left_padded_prompts(tiny_model, lengths=(SHARED_PREFIX_MIN_PROMPT - 1, 9))
    long = left_padded_prompts(tiny_model, lengths=(SHARED_PREFIX_MIN_PROMPT, 9))
    assert default.generate(short, sampling).meta_info["metrics"]["rollout/shared_prefix"] == 0.0
    assert default.generate(long, sampling).meta_info["metrics"]["rollout/shared_prefix"] == 1.0
    assert (
        engine(tiny_model, shared_prefix=False).generate(long, sampling).meta_info["metrics"]["rollout/shared_prefix"]
        == 0.0
    )


def test_shared_prefix_config_errors(tiny_model):
    with pytest.raises(ValueError, match="shared_prefix=true needs cache_implementation='static'"):
        engine(tiny_model, shared_prefix=True, cache_implementation="dynamic")
    with pytest.raises(ValueError, match="shared_prefix=true cannot be honoured: the attention is 'eager'"):
        engine(tiny_model, shared_prefix=True, attn_implementation="eager")
