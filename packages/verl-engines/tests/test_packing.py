"""Sequence packing: packed ("remove padding") and padded forwards give the same per-token outputs,
and packed attention never crosses a sequence boundary."""

import pytest
import torch
from engine_helpers import make_batch

from verl.core.protocol import DataProto
from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig, FSDPValueEngine
from verl.engines.fsdp.packing import build_model_inputs, check_layout, pack, scatter_to_responses

pytestmark = pytest.mark.usefixtures("one_process_group")


def forward(engine_cls, model_path, batch, remove_padding, entropy=False, **config):
    engine = engine_cls(FSDPEngineConfig(model_path=model_path, use_remove_padding=remove_padding, **config))
    engine.initialize()
    with engine.eval_mode():
        return engine.forward_only(batch, compute_entropy=entropy)


@pytest.mark.parametrize("model_fixture", ["tiny_model", "tiny_tied_model"])
def test_packed_and_padded_log_probs_are_equal(model_fixture, request):
    path = request.getfixturevalue(model_fixture)
    batch = DataProto.from_dict(make_batch(9, 7, 6, seed=4), meta_info={"temperature": 0.8})
    packed = forward(FSDPEngine, path, batch, True, entropy=True, ppo_micro_batch_size_per_gpu=4)
    padded = forward(FSDPEngine, path, batch, False, entropy=True, ppo_micro_batch_size_per_gpu=4)
    mask = batch.batch["response_mask"].bool()
    assert packed["log_probs"].shape == (9, 6)
    torch.testing.assert_close(packed["log_probs"], padded["log_probs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed["entropy"], padded["entropy"], atol=1e-5, rtol=1e-5)
    assert (packed["log_probs"][mask] < 0).all() and (packed["log_probs"][~mask] == 0).all()


def test_packed_and_padded_values_are_equal(tiny_model):
    batch = DataProto.from_dict(make_batch(6, 5, 4, seed=5))
    packed = forward(FSDPValueEngine, tiny_model, batch, True)["values"]
    padded = forward(FSDPValueEngine, tiny_model, batch, False)["values"]
    assert packed.shape == (6, 4) and packed.abs().sum() > 0
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)


def test_dynamic_batching_returns_rows_in_batch_order(tiny_model):
    batch = DataProto.from_dict(make_batch(11, 8, 8, seed=6))
    fixed = forward(FSDPEngine, tiny_model, batch, True, ppo_micro_batch_size_per_gpu=11)
    dynamic = forward(FSDPEngine, tiny_model, batch, True, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=24)
    torch.testing.assert_close(dynamic["log_probs"], fixed["log_probs"], atol=1e-5, rtol=1e-5)


def test_packed_attention_stays_inside_each_sequence(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    a, b = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[9, 10, 11]])
    ids = torch.cat([a, b], dim=1)
    restart = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])
    with torch.no_grad():
        alone = model(input_ids=b, use_cache=False).logits[0]
        packed = model(input_ids=ids, position_ids=restart, use_cache=False).logits[0, 4:]
        # Control: without the restart the same tokens attend to sequence a and the logits change.
        unpacked = model(input_ids=ids, position_ids=torch.arange(7)[None], use_cache=False).logits[0, 4:]
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(unpacked, alone, atol=1e-3)


def test_varlen_sdpa_matches_the_block_diagonal_mask(tiny_model):
    from transformers import AutoModelForCausalLM

    from verl.engines.fsdp.varlen_attention import register_varlen_sdpa, sequence_bounds

    t = make_batch(5, 6, 6, seed=9)
    ids, pos = pack(t["input_ids"], t["attention_mask"], t["position_ids"])
    lengths = t["attention_mask"].sum(-1).tolist()
    starts = [sum(lengths[:i]) for i in range(5)]
    assert sequence_bounds(pos[0]) == [(s, s + n) for s, n in zip(starts, lengths)]
    block = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    varlen = AutoModelForCausalLM.from_pretrained(
        tiny_model, dtype=torch.float32, attn_implementation=register_varlen_sdpa()
    )
    with torch.no_grad():
        expected = block(input_ids=ids, position_ids=pos, use_cache=False).logits
        got = varlen(input_ids=ids, position_ids=pos, use_cache=False).logits
        # padded inputs go through transformers' own sdpa path unchanged
        padded = dict(input_ids=t["input_ids"], attention_mask=t["attention_mask"], position_ids=t["position_ids"])
        same = torch.equal(varlen(**padded, use_cache=False).logits, block(**padded, use_cache=False).logits)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert same


def dense_segment_mask(segment_list, length: int) -> torch.Tensor:
    """The [T, T] mask the varlen attention stands for: each segment sees itself causally and, for a
    shared-prompt response, its prompt's first ``prefix_len`` tokens."""
    mask = torch.zeros(length, length, dtype=torch.bool)
    for start, end, prefix_start, prefix_len in segment_list:
        mask[start:end, start:end] = torch.ones(end - start, end - start, dtype=torch.bool).tril()
        mask[start:end, prefix_start : prefix_start + prefix_len] = True
    return mask


def test_varlen_attention_with_shared_prompts_matches_a_dense_mask_with_gradients():
    """Two rows of segments: whole-prompt and partial-prompt responses, new sequences, grouped KV heads;
    outputs and the gradients of q, k and v equal one sdpa over the dense mask."""
    from verl.engines.fsdp.varlen_attention import segments, varlen_sdpa_attention

    positions = torch.tensor(
        [
            [0, 1, 2, 3, 4, 5, 3, 4, 6, 7, 0, 1, 2, 2, 3, 1],  # prefixes 3 and 6 of 6; a new sequence, 2 and 1 of 3
            [0, 1, 2, 3, 1, 2, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8],  # prefixes 1 and 4 of 4; a new sequence
        ]
    )
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, 8, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 16, 8, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 16, 8, generator=g, requires_grad=True)
    weight = torch.randn(2, 16, 4, 8, generator=g)
    out, _ = varlen_sdpa_attention(torch.nn.Module(), q, k, v, None, position_ids=positions)
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))

    masks = torch.stack([dense_segment_mask(segments(row), 16) for row in positions])[:, None]
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=masks, enable_gqa=True)
    expected = expected.transpose(1, 2)
    expected_grads = torch.autograd.grad((expected * weight).sum(), (q, k, v))
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert [prefix for *_, prefix in segments(positions[0])] == [0, 3, 6, 0, 2, 1]  # the cases are there


def test_pack_and_model_inputs_layout():
    t = make_batch(3, 4, 3, seed=7)
    ids, pos = pack(t["input_ids"], t["attention_mask"], t["position_ids"])
    lengths = t["attention_mask"].sum(-1)
    assert ids.shape == (1, int(lengths.sum()))
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    assert (pos[0, starts] == 0).all()  # positions restart at every sequence
    inputs = build_model_inputs(t["input_ids"], t["attention_mask"], t["position_ids"], t["responses"], True)
    assert inputs.attention_mask is None and inputs.keep.numel() == int(t["response_mask"].sum())
    # each kept position is the token right before its target
    assert torch.equal(inputs.input_ids[0, inputs.keep + 1], inputs.targets)
    assert torch.equal(inputs.targets, t["responses"][t["response_mask"].bool()])
    out = scatter_to_responses(torch.arange(1, inputs.targets.numel() + 1).float(), inputs.response_valid)
    assert out.shape == (3, 3) and (out[~t["response_mask"].bool()] == 0).all()


def test_layout_errors_say_what_is_wrong():
    mask = torch.tensor([[1, 1, 0, 1, 1, 0]])
    with pytest.raises(ValueError, match="contiguous"):
        check_layout(mask, 3)
    with pytest.raises(ValueError, match="at least one prompt token"):
        check_layout(torch.tensor([[0, 0, 0, 1, 1, 0]]), 3)
