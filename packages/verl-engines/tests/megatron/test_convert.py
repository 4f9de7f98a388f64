"""The HF <-> megatron converter, on tensors only (no process group): HF -> megatron -> HF is bit-exact
for Llama (untied), Qwen2 (tied, qkv bias) and Qwen3 (q/k norm), directly and through TP=2 / PP=2
shards put back together; the fused layouts are megatron's; the layer spec is chosen by platform."""

from __future__ import annotations

import pytest
import torch
from megatron_helpers import ARCHS, hf_config, random_hf_model

from verl.engines.megatron import convert, sharding
from verl.engines.megatron.layer_spec import spec_name
from verl.engines.megatron.model_config import model_shape, padded_vocab_size

pytestmark = pytest.mark.megatron


def _hf(arch, layers=2):
    model = random_hf_model(arch, seed=3, layers=layers)
    # A tied model's state dict repeats the embedding as lm_head.weight; a HF folder stores it once.
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return model.config, state


def assert_same_state(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", ["local", "transformer_engine"])
def test_round_trip_is_bit_exact(arch, spec):
    config, state = _hf(arch)
    shape = model_shape(config)
    padded = padded_vocab_size(shape.vocab_size, 128, 1)
    mg = convert.hf_to_megatron(state, shape, padded, spec)
    assert mg[convert.EMBEDDING].shape == (256, 64)  # 200 padded to 256
    assert torch.equal(mg[convert.EMBEDDING][200:], torch.zeros(56, 64))
    assert_same_state(convert.megatron_to_hf(mg, shape, spec), state)


@pytest.mark.parametrize("arch", ARCHS)
def test_architecture_flags(arch):
    config, state = _hf(arch)
    shape = model_shape(config)
    mg = convert.hf_to_megatron(state, shape, 256)
    assert ("decoder.layers.0.self_attention.linear_qkv.bias" in mg) == (arch == "qwen2")
    assert ("decoder.layers.1.self_attention.q_layernorm.weight" in mg) == (arch == "qwen3")
    assert shape.tie_embeddings == (arch == "qwen2")
    if arch == "llama":
        assert shape.rope_theta == 5e5
    if arch == "qwen3":
        assert shape.head_dim == 16


def test_qkv_layout_is_grouped_by_query_group():
    config, state = _hf("qwen3")  # 4 query heads, 2 kv heads, head_dim 16
    shape = model_shape(config)
    fused = convert.hf_to_megatron(state, shape, 256)["decoder.layers.0.self_attention.linear_qkv.weight"]
    q, k, v = (state[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    d = 16
    # group 0: q heads 0, 1, then k head 0, v head 0; group 1: q heads 2, 3, k head 1, v head 1
    expected = torch.cat([q[0 : 2 * d], k[0:d], v[0:d], q[2 * d : 4 * d], k[d : 2 * d], v[d : 2 * d]])
    assert torch.equal(fused, expected)
    # TP=2: each rank holds one whole group
    rule = next(r for r in convert.conversion_rules(shape) if r.megatron.endswith("0.self_attention.linear_qkv.weight"))
    assert torch.equal(sharding.split_for_rank(rule, fused, 1, 2), expected[4 * d :])


def test_gate_up_is_split_per_rank():
    config, state = _hf("llama")
    shape = model_shape(config)
    rule = next(r for r in convert.conversion_rules(shape) if r.megatron.endswith("0.mlp.linear_fc1.weight"))
    full = convert.hf_to_megatron(state, shape, 256)[rule.megatron]
    gate, up = state["model.layers.0.mlp.gate_proj.weight"], state["model.layers.0.mlp.up_proj.weight"]
    shard1 = sharding.split_for_rank(rule, full, 1, 2)
    assert torch.equal(shard1, torch.cat([gate[64:], up[64:]]))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("tp", "pp", "vpp"), [(2, 1, None), (1, 2, None), (2, 2, None), (1, 2, 2)])
def test_sharded_round_trip_is_bit_exact(arch, tp, pp, vpp):
    config, state = _hf(arch, layers=4)
    shape = model_shape(config)
    padded = padded_vocab_size(shape.vocab_size, 128, tp)
    rules = convert.conversion_rules(shape)
    full = convert.hf_to_megatron(state, shape, padded)
    per_rank = {
        (t, p, v): sharding.rank_state_dict(full, rules, shape, tp_rank=t, tp=tp, pp_rank=p, pp=pp, vpp=vpp, vp_stage=v)
        for t in range(tp)
        for p in range(pp)
        for v in range(vpp or 1)
    }
    # Every stage holds its share: embedding first, output layer and final norm last, layers in order.
    first, last = per_rank[(0, 0, 0)], per_rank[(0, pp - 1, (vpp or 1) - 1)]
    assert convert.EMBEDDING in first and convert.FINAL_NORM in last
    if pp > 1:
        assert convert.EMBEDDING not in last and convert.OUTPUT_LAYER in last  # tied or not: a copy there
    else:
        assert (convert.OUTPUT_LAYER in last) == (not shape.tie_embeddings)
    assert per_rank[(0, 0, 0)][convert.EMBEDDING].shape == (padded // tp, 64)
    # Reassemble from the shards alone.
    rebuilt = {}
    for rule in rules:
        if not rule.export:
            continue
        p, v = sharding.owner_stage(rule, shape, pp, vpp)
        layers = sharding.stage_layers(shape.num_layers, pp, p, vpp, v)
        shards = [per_rank[(t, p, v)][sharding.local_name(rule, layers)] for t in range(tp)]
        rebuilt.update(convert.unfuse(rule, sharding.merge_shards(rule, shards), shape))
    assert_same_state(rebuilt, state)


def test_stage_layers_match_megatron_offsets():
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from verl.engines.megatron.model_config import transformer_config

    shape = model_shape(hf_config("llama", layers=8))
    for pp, vpp in [(2, None), (4, None), (2, 2)]:
        tc = transformer_config(shape, pp=pp, vpp=vpp)
        for p in range(pp):
            for v in range(vpp or 1):
                ours = sharding.stage_layers(8, pp, p, vpp, v)
                assert ours.start == get_transformer_layer_offset(tc, vp_stage=v if vpp else None, pp_rank=p), (
                    pp,
                    vpp,
                    p,
                    v,
                )


def test_unsupported_model_is_named():
    from transformers import GPT2Config, LlamaConfig

    with pytest.raises(NotImplementedError, match="model_type='gpt2'"):
        model_shape(GPT2Config())
    with pytest.raises(NotImplementedError, match="rope scaling 'llama3'"):
        model_shape(
            LlamaConfig(
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 5e5,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                }
            )
        )


@pytest.mark.parametrize(
    ("device", "te", "expected"),
    [("cuda", True, "transformer_engine"), ("cuda", False, "local"), ("cpu", True, "local"), ("npu", True, "local")],
)
def test_layer_spec_selection(device, te, expected):
    assert spec_name(device, te_available=te) == expected


def test_layer_spec_selection_probes_transformer_engine(monkeypatch):
    import importlib.util

    from verl.engines.megatron import layer_spec

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "transformer_engine" else real(n, *a)
    )
    assert layer_spec.spec_name("cuda") == "transformer_engine"
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "transformer_engine" else real(n, *a))
    assert layer_spec.spec_name("cuda") == "local"
