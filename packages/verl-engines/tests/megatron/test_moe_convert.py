"""The HF <-> megatron converter for Qwen2-MoE (gated shared expert, qkv bias) and Qwen3-MoE (q/k norm), on
tensors only: HF checkpoint -> megatron -> HF is bit-exact, directly and through EP=2 (and EP=2 x TP=2)
shards put back together; the router, experts and shared expert land on megatron's names; the HF config
maps to megatron's MoE settings; layouts megatron cannot train on the local spec are refused."""

from __future__ import annotations

import pytest
import torch
from megatron_helpers import EXPERTS, MOE_ARCHS, checkpoint_state, hf_config, random_hf_model

from verl.engines.megatron import convert, sharding
from verl.engines.megatron.config import MegatronConfig
from verl.engines.megatron.model_config import check_moe_layout, model_shape, moe_config_kwargs, padded_vocab_size

pytestmark = pytest.mark.megatron


@pytest.fixture(scope="module", params=MOE_ARCHS)
def moe_model(request):
    model = random_hf_model(request.param, seed=5)
    return request.param, model.config, checkpoint_state(model)


def test_checkpoint_holds_one_tensor_per_expert(moe_model):
    arch, _, state = moe_model
    assert state["model.layers.1.mlp.experts.3.down_proj.weight"].shape == (64, 32)
    assert state["model.layers.0.mlp.gate.weight"].shape == (EXPERTS, 64)
    assert ("model.layers.0.mlp.shared_expert_gate.weight" in state) == (arch == "qwen2_moe")


def test_round_trip_is_bit_exact(moe_model):
    arch, config, state = moe_model
    shape = model_shape(config)
    padded = padded_vocab_size(shape.vocab_size, 128, 1)
    for spec in ("local", "transformer_engine"):
        mg = convert.hf_to_megatron(state, shape, padded, spec)
        back = convert.megatron_to_hf(mg, shape, spec)
        assert sorted(back) == sorted(state)
        for name in state:
            assert torch.equal(back[name], state[name]), name


def test_megatron_names_and_layouts(moe_model):
    arch, config, state = moe_model
    shape = model_shape(config)
    mg = convert.hf_to_megatron(state, shape, 256)
    m, h = "decoder.layers.1.mlp.", "model.layers.1.mlp."
    assert torch.equal(mg[m + "router.weight"], state[h + "gate.weight"])
    fc1 = mg[m + "experts.local_experts.2.linear_fc1.weight"]
    assert torch.equal(fc1, torch.cat([state[h + "experts.2.gate_proj.weight"], state[h + "experts.2.up_proj.weight"]]))
    assert torch.equal(mg[m + "experts.local_experts.2.linear_fc2.weight"], state[h + "experts.2.down_proj.weight"])
    assert "decoder.layers.1.pre_mlp_layernorm.weight" in mg
    assert not any(".mlp.linear_fc1" in name for name in mg)
    if arch == "qwen2_moe":
        assert torch.equal(mg[m + "shared_experts.gate_weight"], state[h + "shared_expert_gate.weight"])
        assert mg[m + "shared_experts.linear_fc1.weight"].shape == (96, 64)
        assert "decoder.layers.0.self_attention.linear_qkv.bias" in mg
    else:
        assert not any("shared_experts" in name for name in mg)
        assert "decoder.layers.0.self_attention.q_layernorm.weight" in mg


@pytest.mark.parametrize("tp", [1, 2])
def test_expert_parallel_shards_put_back_together(moe_model, tp):
    """Each (EP rank, TP rank) gets its two experts as local_experts.0/1 (TP shards of them) and every
    replicated tensor; merging the TP shards and collecting the EP ranks' experts gives the full tensors."""
    arch, config, state = moe_model
    shape = model_shape(config)
    ep, padded = 2, padded_vocab_size(shape.vocab_size, 128, tp)
    full = convert.hf_to_megatron(state, shape, padded)
    rules = convert.conversion_rules(shape)
    ranks = {
        (e, t): sharding.rank_state_dict(full, rules, shape, tp_rank=t, tp=tp, pp_rank=0, pp=1, ep_rank=e, ep=ep)
        for e in range(ep)
        for t in range(tp)
    }
    local = "decoder.layers.0.mlp.experts.local_experts."
    assert sorted(k for k in ranks[(1, 0)] if k.startswith(local)) == [
        local + f"{j}.linear_fc{n}.weight" for j in (0, 1) for n in (1, 2)
    ]
    assert not any(".local_experts.2." in name for name in ranks[(0, 0)])
    rebuilt = {}
    layers = range(shape.num_layers)
    for rule in rules:
        owner = sharding.expert_owner(rule, shape, ep)
        name = sharding.local_name(rule, layers, shape, ep)
        rebuilt[rule.megatron] = sharding.merge_shards(rule, [ranks[(owner, t)][name] for t in range(tp)])
    assert sharding.expert_owner(next(r for r in rules if r.expert == 3), shape, ep) == 1
    back = convert.megatron_to_hf(rebuilt, shape)
    for name in state:
        assert torch.equal(back[name], state[name]), name


def test_moe_settings_follow_the_hf_config():
    qwen2 = model_shape(hf_config("qwen2_moe")).moe
    qwen3 = model_shape(hf_config("qwen3_moe")).moe
    assert qwen2 is not None and qwen3 is not None
    assert (qwen2.num_experts, qwen2.topk, qwen2.expert_ffn_hidden_size) == (EXPERTS, 2, 32)
    kw2, kw3 = moe_config_kwargs(qwen2, ep=2), moe_config_kwargs(qwen3, ep=1)
    # HF softmax over all experts then top-k: renormalised (qwen3 here) is megatron's default order.
    assert kw2["moe_router_pre_softmax"] is True and kw3["moe_router_pre_softmax"] is False
    assert kw2["moe_shared_expert_intermediate_size"] == 48 and kw2["moe_shared_expert_gate"] is True
    assert kw3["moe_shared_expert_intermediate_size"] is None and kw3["moe_shared_expert_gate"] is False
    assert kw2["expert_model_parallel_size"] == 2
    assert kw2["moe_router_load_balancing_type"] == "none" and kw2["moe_router_dtype"] == "fp32"
    with pytest.raises(ValueError, match="must divide the model's 4 experts"):
        moe_config_kwargs(qwen2, ep=3)


def test_unsupported_moe_configs_are_refused():
    config = hf_config("qwen2_moe")
    config.mlp_only_layers = [1]
    with pytest.raises(NotImplementedError, match="mlp_only_layers"):
        model_shape(config)
    config = hf_config("qwen3_moe")
    config.decoder_sparse_step = 2
    with pytest.raises(NotImplementedError, match="decoder_sparse_step"):
        model_shape(config)


def test_moe_tensor_parallel_layouts_megatron_cannot_train_are_refused():
    shape = model_shape(hf_config("qwen3_moe"))
    check_moe_layout(shape, "local", tp=1, sequence_parallel=False)
    with pytest.raises(NotImplementedError, match="sequence_parallel"):
        check_moe_layout(shape, "local", tp=2, sequence_parallel=False)
    with pytest.raises(ValueError, match="sequence_parallel=true"):
        check_moe_layout(shape, "transformer_engine", tp=2, sequence_parallel=False)
    check_moe_layout(shape, "transformer_engine", tp=2, sequence_parallel=True)
    check_moe_layout(model_shape(hf_config("qwen2")), "local", tp=2, sequence_parallel=False)  # dense: fine
    assert MegatronConfig(expert_model_parallel_size=2).expert_model_parallel_size == 2
