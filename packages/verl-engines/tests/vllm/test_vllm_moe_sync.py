"""MoE weights into vLLM on CPU: Qwen3-MoE and Qwen2-MoE (its gated shared expert) from the FSDP2 actor and
from the Megatron actor with expert parallelism.

Two things stood between a trainer's MoE weights and vLLM, both silent (the rollout generated from stale or
mis-laid experts, nothing raised):
- transformers keeps the experts fused in memory; vLLM's loaders know the checkpoint's per-expert names and
  skip any other. The FSDP2 engine now yields the checkpoint layout (``verl.engines.checkpoint_layout``).
- vLLM's CPU experts kernel packs the expert weights once, when it is built; a reload left them in the
  checkpoint layout inside the packed kernel. The sync packs them again (``rollout/vllm/weights.py``).

Each engine is dummy-initialised and gets every weight through the sync; its greedy output must equal vLLM's
and the hf rollout's loaded from the same weights' folder.

Run in a process with no vLLM engine built before: vLLM makes its expert-parallel group only when a process's
first engine is an MoE model (the ``tests-vllm`` session gives this file a pytest run of its own)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import rl_batch, run_ranks
from megatron_sync_programs import megatron_step_then_rollouts
from test_vllm_megatron_sync import folder_with_weights, fsdp2_rollouts, hf_weights
from vllm_test_helpers import GREEDY, build_tokenizer, prompts_batch, vllm_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def moe_model(path: str, arch: str) -> str:
    from verl_test_models import write_causal_lm

    return write_causal_lm(
        path, build_tokenizer(), arch=arch, hidden_size=64, num_heads=2, num_kv_heads=1, seed=3, init_std=0.2
    )


def loaded_outputs(model_dir: str, prompts, keep_alive) -> torch.Tensor:
    """Greedy output of a vLLM engine that loaded ``model_dir`` itself (no sync)."""
    from verl.engines.rollout.vllm import VLLMRolloutEngine

    engine = VLLMRolloutEngine(vllm_config(model_dir))
    keep_alive(engine)
    return engine.generate(prompts, GREEDY).batch["responses"]


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe"])
def test_fsdp2_moe_weights_reach_vllm(arch, keep_alive, tmp_path):
    model_dir = moe_model(str(tmp_path / arch), arch)
    prompts = prompts_batch(model_dir)
    weights, synced, hf = fsdp2_rollouts(model_dir, prompts, keep_alive)
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in weights  # per expert, as the checkpoint
    assert sorted(weights) == sorted(hf_weights(model_dir))
    expected = loaded_outputs(model_dir, prompts, keep_alive)
    assert torch.equal(synced, expected)
    assert torch.equal(hf, expected)


@pytest.mark.megatron
def test_megatron_expert_parallel_weights_reach_vllm(keep_alive, tmp_path):
    """Qwen3-MoE on two ranks (EP2: two experts on each), one training step, then every rank's vLLM and hf
    rollout get the whole model (each expert gathered from its rank) and generate what vLLM and the hf rollout
    fed by the FSDP2 actor with the same weights generate."""
    pytest.importorskip("megatron.core", reason="needs megatron-core (the tests-vllm nox session installs it)")
    model_dir = moe_model(str(tmp_path / "qwen3_moe"), "qwen3_moe")
    prompts = prompts_batch(model_dir)
    batch = rl_batch(4, 8, 6, seed=0, vocab=len(build_tokenizer()))
    ep2 = {"expert_model_parallel_size": 2}
    ranks = run_ranks(
        megatron_step_then_rollouts, 2, model_dir, ep2, batch, prompts, GREEDY, result_dir=str(tmp_path / "ranks")
    )
    initial, streamed = hf_weights(model_dir), ranks[0]["weights"]
    assert sorted(streamed) == sorted(initial)
    name = "model.layers.1.mlp.experts.3.up_proj.weight"  # held by the second rank
    assert not torch.equal(streamed[name], initial[name])  # the step moved it

    fsdp_weights, fsdp_vllm, fsdp_hf = fsdp2_rollouts(
        folder_with_weights(model_dir, streamed, str(tmp_path / "trained")), prompts, keep_alive
    )
    for name, tensor in streamed.items():
        assert torch.equal(fsdp_weights[name], tensor), name
    assert torch.equal(fsdp_vllm, fsdp_hf)
    for rank, out in enumerate(ranks):
        assert torch.equal(out["vllm"], fsdp_vllm), f"rank {rank}: vLLM"
        assert torch.equal(out["hf"], fsdp_hf), f"rank {rank}: hf"
    assert not torch.equal(loaded_outputs(model_dir, prompts, keep_alive), fsdp_vllm)  # the step is seen
