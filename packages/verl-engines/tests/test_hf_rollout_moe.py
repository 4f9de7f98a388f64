"""An MoE model's expert weights reach the hf rollout under the checkpoint's per-expert names (what the Megatron
engine's converter and vLLM use) and land in transformers' fused expert parameters exactly where transformers'
own loading puts them."""

import pytest
import torch
from safetensors.torch import load_file

from verl.core.engine import SamplingParams
from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

GREEDY = SamplingParams(do_sample=False, max_new_tokens=6)


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen2_moe"])
def moe_folder(request, tmp_path_factory):
    """A tiny Qwen3-MoE / Qwen2-MoE (with its shared expert) saved by transformers, which writes the experts in
    the checkpoint's per-expert layout."""
    import transformers

    torch.manual_seed(0)
    common = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_experts=4,
        num_experts_per_tok=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    if request.param == "qwen3_moe":
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(head_dim=16, **common))
    else:
        config = transformers.Qwen2MoeConfig(shared_expert_intermediate_size=32, **common)
        model = transformers.Qwen2MoeForCausalLM(config)
    for param in model.parameters():  # large enough that every expert changes the output
        torch.nn.init.normal_(param, std=0.3)
    path = str(tmp_path_factory.mktemp(request.param))
    model.save_pretrained(path)
    return path


def checkpoint_tensors(folder):
    return load_file(f"{folder}/model.safetensors")


def prompts():
    from verl.core.protocol import DataProto

    ids = torch.tensor([[0, 5, 9, 20], [7, 3, 11, 2]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    )


@pytest.mark.parametrize("sleep_level", [1, 2])
def test_per_expert_tensors_fill_the_fused_experts(moe_folder, sleep_level):
    state = checkpoint_tensors(moe_folder)
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in state  # the checkpoint keeps experts apart
    loaded = HFRolloutEngine(HFRolloutConfig(model_path=moe_folder, load_format="hf"))
    rollout = HFRolloutEngine(
        HFRolloutConfig(model_path=moe_folder, load_format="dummy", share_weight_storage=False, sleep_level=sleep_level)
    )
    if sleep_level == 2:  # the weights are dropped: the sync must re-create every one, the fused ones included
        rollout.sleep()
        rollout.wake_up()
    rollout.update_weights(state.items())
    expected = dict(loaded.model.named_parameters())
    for name, param in rollout.model.named_parameters():
        assert torch.equal(param, expected[name]), name
    assert torch.equal(
        rollout.generate(prompts(), GREEDY).batch["responses"], loaded.generate(prompts(), GREEDY).batch["responses"]
    )


def test_a_missing_expert_is_named_after_a_sleep_that_dropped_the_weights(moe_folder):
    state = checkpoint_tensors(moe_folder)
    del state["model.layers.1.mlp.experts.2.gate_proj.weight"]
    rollout = HFRolloutEngine(HFRolloutConfig(model_path=moe_folder, load_format="dummy", sleep_level=2))
    rollout.sleep()
    rollout.wake_up()
    with pytest.raises(RuntimeError, match=r"model\.layers\.1\.mlp\.experts\.gate_up_proj"):
        rollout.update_weights(state.items())


def test_an_expert_the_model_does_not_have_is_refused(moe_folder):
    rollout = HFRolloutEngine(HFRolloutConfig(model_path=moe_folder, load_format="dummy"))
    with pytest.raises(KeyError, match="expert 9"):
        rollout.update_weights([("model.layers.0.mlp.experts.9.down_proj.weight", torch.zeros(32, 16))])


def test_the_fsdp2_actor_streams_and_exports_the_checkpoint_layout(moe_folder, tmp_path):
    """transformers fuses the experts in memory; the FSDP2 engine (two ranks: each fused tensor gathered, then
    split) yields and exports them per expert, exactly the checkpoint's tensors, which vLLM's loaders and the
    hf rollout read."""
    from engine_helpers import run_ranks
    from rank_programs import full_weights_and_export

    export = str(tmp_path / "export")
    ranks = run_ranks(full_weights_and_export, 2, moe_folder, export, result_dir=str(tmp_path / "ranks"))
    state = checkpoint_tensors(moe_folder)
    for rank in ranks:
        assert list(rank["weights"]) == [name for name, _ in rank["planned"]]
        assert sorted(rank["weights"]) == sorted(state)
        for name, tensor in state.items():
            assert torch.equal(rank["weights"][name], tensor), name
    exported = checkpoint_tensors(export)
    assert sorted(exported) == sorted(state) and all(torch.equal(exported[n], t) for n, t in state.items())
    rollout = HFRolloutEngine(HFRolloutConfig(model_path=moe_folder, load_format="dummy"))
    rollout.update_weights(ranks[0]["weights"].items())
    loaded = HFRolloutEngine(HFRolloutConfig(model_path=moe_folder, load_format="hf"))
    assert torch.equal(
        rollout.generate(prompts(), GREEDY).batch["responses"], loaded.generate(prompts(), GREEDY).batch["responses"]
    )


def test_a_dense_model_keeps_its_names_and_tensors():
    """No conversion to reverse (Llama / Qwen2 dense): the layout passes the very tensors through."""
    import transformers

    from verl.engines.checkpoint_layout import CheckpointLayout
    from verl.engines.models import named_weights

    config = transformers.Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    model = transformers.Qwen2ForCausalLM(config)
    named = list(named_weights(model))
    layout = CheckpointLayout(model, [(name, tensor.shape) for name, tensor in named])
    assert not layout.converts
    passed = list(layout.weights(named))
    assert [n for n, _ in passed] == [n for n, _ in named]
    assert all(mine is theirs for (_, mine), (_, theirs) in zip(passed, named, strict=True))
