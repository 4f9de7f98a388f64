"""Weights from the megatron actor into the rollout engines: on TP2 x PP2 (four gloo processes, each with
its own vLLM and hf rollout as a verl worker has), after a training step the actor's per-tensor iterator
(full HF-named tensors gathered over TP and PP) streams into vLLM through the hybrid engine and into the hf
rollout; both generate exactly what vLLM and the hf rollout generate from the FSDP2 actor given the same
weights. Needs vLLM and megatron-core (the ``tests-vllm`` nox session installs both)."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from engine_helpers import rl_batch, run_ranks
from megatron_sync_programs import megatron_step_then_rollouts
from vllm_test_helpers import GREEDY, build_tokenizer, prompts_batch, vllm_config

pytestmark = [pytest.mark.vllm, pytest.mark.megatron, pytest.mark.slow]

TP2_PP2 = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}


@pytest.fixture(scope="module")
def tied_qwen2(tmp_path_factory) -> str:
    """Qwen2 (q/k/v biases), tied embeddings, 2 query and 2 KV heads of 32 (TP2 splits both), 2 layers
    (PP2: one per stage, the tied output layer on the last). Vocabulary 384: megatron pads it to 512."""
    from verl_test_models import write_causal_lm

    path = str(tmp_path_factory.mktemp("vllm_megatron_qwen2"))
    return write_causal_lm(
        path, build_tokenizer(), hidden_size=64, num_heads=2, num_kv_heads=2, tie=True, seed=3, init_std=0.2
    )


def hf_weights(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


def folder_with_weights(source: str, weights: dict[str, torch.Tensor], dest: str) -> str:
    """``source``'s model folder (config, tokenizer, generation config) with ``weights`` instead."""
    from safetensors.torch import save_file

    shutil.copytree(source, dest)
    save_file({n: t.contiguous() for n, t in weights.items()}, os.path.join(dest, "model.safetensors"))
    return dest


def fsdp2_rollouts(model_dir: str, prompts, keep_alive) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The FSDP2 actor built from ``model_dir``: its gathered weights, and the greedy outputs of a vLLM
    engine (synced through the hybrid engine) and of the hf rollout fed from it."""
    from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig
    from verl.engines.hybrid import HybridEngine
    from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine
    from verl.engines.rollout.vllm import VLLMRolloutEngine

    actor = FSDPEngine(FSDPEngineConfig(model_path=model_dir))
    actor.initialize()
    vllm = VLLMRolloutEngine(vllm_config(model_dir, load_format="dummy"))
    keep_alive(vllm)
    vllm_out = HybridEngine(actor, vllm).generate(prompts, GREEDY).batch["responses"]
    hf = HFRolloutEngine(HFRolloutConfig(model_path=model_dir, load_format="dummy", share_weight_storage=False))
    with actor.eval_mode():
        weights = {name: tensor.clone() for name, tensor in actor.named_full_parameters()}
        hf.update_weights(actor.named_full_parameters())
    return weights, vllm_out, hf.generate(prompts, GREEDY).batch["responses"]


def test_megatron_tp2_pp2_weights_reach_vllm_and_hf_as_the_fsdp2_actors_do(tied_qwen2, keep_alive, tmp_path):
    pytest.importorskip("megatron.core", reason="needs megatron-core (the tests-vllm nox session installs it)")
    from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

    prompts = prompts_batch(tied_qwen2)
    batch = rl_batch(4, 8, 6, seed=0, vocab=len(build_tokenizer()))
    ranks = run_ranks(
        megatron_step_then_rollouts, 4, tied_qwen2, TP2_PP2, batch, prompts, GREEDY, result_dir=str(tmp_path / "ranks")
    )
    initial, streamed = hf_weights(tied_qwen2), ranks[0]["weights"]
    # Full HF tensors under HF names: vocabulary padding stripped, the tied head not sent twice.
    assert sorted(streamed) == sorted(initial) and "lm_head.weight" not in streamed
    for name, tensor in initial.items():
        assert streamed[name].shape == tensor.shape and streamed[name].dtype == tensor.dtype, name
    assert not torch.equal(streamed["model.embed_tokens.weight"], initial["model.embed_tokens.weight"])

    # The FSDP2 actor given the same weights, and the rollouts it feeds.
    fsdp_weights, fsdp_vllm, fsdp_hf = fsdp2_rollouts(
        folder_with_weights(tied_qwen2, streamed, str(tmp_path / "trained")), prompts, keep_alive
    )
    for name, tensor in streamed.items():
        assert torch.equal(fsdp_weights[name], tensor), name
    assert torch.equal(fsdp_vllm, fsdp_hf)
    for rank, out in enumerate(ranks):  # every TP / PP rank's engines got the whole model
        assert torch.equal(out["vllm"], fsdp_vllm), f"rank {rank}: vLLM"
        assert torch.equal(out["hf"], fsdp_hf), f"rank {rank}: hf"
        assert out["update_weights_s"] > 0

    # The step mattered: the initial weights give another greedy output.
    untrained = HFRolloutEngine(HFRolloutConfig(model_path=tied_qwen2))
    assert not torch.equal(untrained.generate(prompts, GREEDY).batch["responses"], fsdp_vllm)
