"""Qwen2-MoE and Qwen3-MoE on megatron's MoE layers (router, SequentialMLP experts, Qwen2-MoE's gated
shared expert; alltoall token dispatcher) through MegatronEngine on gloo, expert parallelism included:

- EP=1 (one rank) and EP=2 (two ranks, each holding two of the four experts; data-parallel for the rest):
  per-token log-probs and entropy equal HF's forward, and the weights gathered back from megatron are the
  HF checkpoint's, bit for bit (HF -> megatron -> HF through real model shards).
- Training: the gradients (summed over micro-batches and data-parallel ranks, gathered to full HF-named
  tensors, experts from their EP ranks), the grad norms and the weights after two AdamW steps of EP=2, of
  PP=2 x EP=2 (four ranks) and of EP=2 with megatron's distributed optimizer equal EP=1's on the same
  global batch.

The router runs in fp32, with no load-balancing loss and no token dropping (what HF's forward computes).
Measured (fp32, gloo, one thread per rank, 2 cores): log-probs vs HF <= 2e-6 (see the assertions'
tolerances), EP2 vs EP1 gradients ~1e-7 of each tensor's largest entry.
"""

from __future__ import annotations

import pytest
import torch
from engine_helpers import make_batch, rl_batch, run_ranks
from megatron_helpers import MOE_ARCHS, VOCAB, hf_state, write_model
from megatron_programs import checkpoint_round, megatron_training, moe_engine_outputs
from test_equivalence import LOGPROB_ATOL, hf_reference

from verl.core.protocol import DataProto

pytestmark = pytest.mark.megatron


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_moe")
    return {arch: write_model(str(root / arch), arch, seed=11 + i) for i, arch in enumerate(MOE_ARCHS)}


@pytest.fixture(scope="module")
def batch():
    return DataProto.from_dict(make_batch(4, 7, 6, seed=3, vocab=VOCAB))


@pytest.mark.parametrize("ep", [1, 2])
def test_moe_logprobs_match_hugging_face_and_weights_round_trip(ep, moe_models, batch, tmp_path):
    dirs = [moe_models[arch] for arch in MOE_ARCHS]
    ranks = run_ranks(moe_engine_outputs, ep, dirs, {"expert_model_parallel_size": ep}, batch, result_dir=str(tmp_path))
    ids = torch.zeros(1, 2, dtype=torch.long)
    for model_dir in dirs:
        _, logp, entropy = hf_reference(model_dir, ids, batch, temperature=1.0)  # the engine's default
        mask = batch.batch["response_mask"].bool()
        expected_weights = hf_state(model_dir)
        for rank in ranks:
            got = rank[model_dir]
            assert got["ep"] == ep
            torch.testing.assert_close(got["outputs"]["log_probs"][mask], logp[mask], atol=LOGPROB_ATOL, rtol=0)
            torch.testing.assert_close(got["outputs"]["entropy"][mask], entropy[mask], atol=LOGPROB_ATOL, rtol=0)
            assert sorted(got["weights"]) == sorted(expected_weights)
            for name, tensor in expected_weights.items():
                assert torch.equal(got["weights"][name], tensor), name


def _relative_max_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max())


#: The training comparisons' global batch, optimizer steps and micro-batch size.
TRAINING = (rl_batch(8, 7, 6, seed=3), 2, 2)


@pytest.fixture(scope="module")
def ep1_training(moe_models, tmp_path_factory):
    """Qwen2-MoE (the shared expert and its gate get gradients too) trained on one rank: the reference."""
    batch, steps, micro = TRAINING
    out = tmp_path_factory.mktemp("ep1")
    return run_ranks(megatron_training, 1, moe_models["qwen2_moe"], {}, batch, steps, micro, result_dir=str(out))[0]


def _assert_trains_like(rank: dict, reference: dict, *, grads: bool = True) -> None:
    if grads:
        assert sorted(rank["grads"]) == sorted(reference["grads"])
        for name, grad in reference["grads"].items():
            assert grad.abs().max() > 0, name
            assert _relative_max_diff(rank["grads"][name], grad) < 1e-5, name
    for norm, expected in zip(rank["grad_norms"], reference["grad_norms"], strict=True):
        assert norm == pytest.approx(expected, rel=1e-5)
    assert sorted(rank["weights"]) == sorted(reference["weights"])
    for name, weight in reference["weights"].items():
        torch.testing.assert_close(rank["weights"][name], weight, atol=2e-6, rtol=0, msg=name)


@pytest.mark.parametrize(
    ("world", "layout"),
    [
        (2, {"expert_model_parallel_size": 2}),
        # Two pipeline stages of one layer each, each stage's experts over two ranks (1F1B schedule).
        (4, {"pipeline_model_parallel_size": 2, "expert_model_parallel_size": 2}),
        # megatron's distributed optimizer: each data-parallel rank keeps a shard of the Adam state, the
        # experts' shard over the expert-data-parallel group.
        (2, {"expert_model_parallel_size": 2, "use_distributed_optimizer": True}),
    ],
    ids=["ep2", "pp2-ep2", "ep2-distributed-optimizer"],
)
def test_expert_parallel_training_matches_ep1(world, layout, moe_models, ep1_training, tmp_path):
    batch, steps, micro = TRAINING
    ranks = run_ranks(
        megatron_training, world, moe_models["qwen2_moe"], layout, batch, steps, micro, result_dir=str(tmp_path)
    )
    assert any(".experts.3." in name for name in ep1_training["grads"])
    for rank in ranks:
        assert rank["dp"][1] == world // layout.get("pipeline_model_parallel_size", 1)
        distributed = layout.get("use_distributed_optimizer", False)
        # One optimizer for the dense parameters, one for the experts (their own data-parallel group).
        expected = "DistributedOptimizer" if distributed else "FP32Optimizer"
        assert rank["optimizers"] == [expected, expected]
        # megatron_training gathers no gradients under the distributed optimizer (their buffers are sharded).
        _assert_trains_like(rank, ep1_training, grads=not distributed)


def test_expert_parallel_checkpoint_loads_on_one_rank_and_exports(moe_models, tmp_path):
    """A step, save and export on EP2; loading that checkpoint on one rank (EP1) restores the same
    weights, moments and lr (the next step agrees to fp32 rounding); the export is the HF checkpoint
    layout (one tensor per expert) that transformers loads."""
    from transformers import AutoModelForCausalLM

    model_dir = moe_models["qwen3_moe"]
    batch_a, batch_b = rl_batch(8, 7, 6, seed=3), rl_batch(8, 7, 6, seed=8)
    ckpt, export = str(tmp_path / "ckpt"), str(tmp_path / "export")
    ep2 = {"expert_model_parallel_size": 2}
    saved = run_ranks(
        checkpoint_round, 2, model_dir, ep2, batch_a, batch_b, ckpt, export, result_dir=str(tmp_path / "a")
    )
    loaded = run_ranks(checkpoint_round, 1, model_dir, {}, None, batch_b, ckpt, result_dir=str(tmp_path / "b"))[0]
    reference = saved[0]
    assert loaded["lr"] == reference["lr"]
    assert loaded["norm"] == pytest.approx(reference["norm"], rel=1e-5)
    for name, weight in reference["at_checkpoint"]["weights"].items():
        assert torch.equal(loaded["at_checkpoint"]["weights"][name], weight), name
        torch.testing.assert_close(loaded["after"][name], reference["after"][name], rtol=0, atol=5e-6, msg=name)
    exported = hf_state(export)
    assert sorted(exported) == sorted(reference["at_checkpoint"]["weights"])
    for name, weight in reference["at_checkpoint"]["weights"].items():
        assert torch.equal(exported[name], weight), name
    AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)  # transformers reads the layout
