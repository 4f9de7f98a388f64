"""MegatronValueEngine (critic / reward model) against FSDPValueEngine on the same tiny Qwen2 value model
(``Qwen2ForTokenClassification``, one label, score head with bias) and batch, at TP2 x PP2: forward-only
values, the first step's gradients, three AdamW steps of a squared-error value loss (grad norms, losses,
weights), and an export that transformers loads as the value model with the trained weights.

Measured (fp32): values agree to ~3e-6, weights after three steps to ~6e-7, gradients to ~2e-6 of each
tensor's largest entry, grad norms to ~1e-6 relative.
"""

from __future__ import annotations

import math

import pytest
import torch
from engine_helpers import rl_batch, run_ranks
from megatron_helpers import hf_state, write_model, write_value_model
from megatron_programs import value_from_causal_lm, value_training

pytestmark = pytest.mark.megatron


def test_tp2_pp2_value_model_matches_fsdp(tmp_path):
    from transformers import AutoModelForTokenClassification

    model_dir = write_value_model(str(tmp_path / "critic"), "qwen2", seed=6)
    batch = rl_batch(8, 7, 6, seed=3)
    fsdp = run_ranks(value_training, 1, model_dir, None, batch, 3, result_dir=str(tmp_path / "fsdp"))[0]
    export = str(tmp_path / "export")
    megatron = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}
    ranks = run_ranks(value_training, 4, model_dir, megatron, batch, 3, export, result_dir=str(tmp_path / "mg"))

    for rank in ranks:
        assert rank["values"]["values"].shape == (8, 6)
        torch.testing.assert_close(rank["values"]["values"], fsdp["values"]["values"], rtol=1e-5, atol=1e-5)
        assert sorted(rank["grads"]) == sorted(fsdp["grads"])
        assert {"score.weight", "score.bias"} <= set(rank["grads"])
        for name, grad in fsdp["grads"].items():
            assert float((rank["grads"][name] - grad).abs().max() / grad.abs().max()) < 1e-5, name
        for norm, expected in zip(rank["grad_norms"], fsdp["grad_norms"], strict=True):
            assert math.isclose(norm, expected, rel_tol=1e-5)
        for mine, theirs in zip(rank["metrics"], fsdp["metrics"], strict=True):
            torch.testing.assert_close(
                torch.tensor(mine["vf_loss"]), torch.tensor(theirs["vf_loss"]), rtol=1e-5, atol=1e-6
            )
        for name, weight in fsdp["weights"].items():
            torch.testing.assert_close(rank["weights"][name], weight, rtol=0, atol=5e-6, msg=name)

    exported = AutoModelForTokenClassification.from_pretrained(export, dtype=torch.float32)
    params = dict(exported.named_parameters())
    assert sorted(params) == sorted(ranks[0]["weights"])
    for name, weight in ranks[0]["weights"].items():
        assert torch.equal(params[name].detach(), weight), name


def test_value_model_from_a_causal_lm_gets_the_same_fresh_head_on_every_rank(tmp_path):
    model_dir = write_model(str(tmp_path / "actor"), "llama", seed=2)
    batch = rl_batch(4, 5, 4, seed=1)
    ranks = run_ranks(
        value_from_causal_lm, 2, model_dir, {"tensor_model_parallel_size": 2}, batch, result_dir=str(tmp_path / "r")
    )
    backbone = {n: t for n, t in hf_state(model_dir).items() if n != "lm_head.weight"}
    for rank in ranks:
        assert torch.equal(rank["values"], ranks[0]["values"]) and rank["values"].abs().sum() > 0
        assert set(rank["weights"]) == set(backbone) | {"score.weight", "score.bias"}
        for name, tensor in backbone.items():
            assert torch.equal(rank["weights"][name], tensor), name
        assert torch.equal(rank["weights"]["score.weight"], ranks[0]["weights"]["score.weight"])
        assert 0.005 < float(rank["weights"]["score.weight"].std()) < 0.05  # initializer_range 0.02
        assert torch.equal(rank["weights"]["score.bias"], torch.zeros(1))


def _fused(per_expert: dict[str, torch.Tensor], like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Megatron's checkpoint-named tensors (one per expert) in the layout of ``like``: transformers' model in
    memory, whose experts are fused (``experts.gate_up_proj``, ``experts.down_proj``)."""
    from verl.engines.rollout.hf.fused_experts import FusedExpertWeights

    fused = {name: torch.full_like(t, float("nan")) for name, t in like.items() if name not in per_expert}
    router = FusedExpertWeights(fused)
    out = {}
    for name, tensor in per_expert.items():
        if (target := router.fused_name(name)) is None:
            out[name] = tensor
        else:
            router.target(*target).copy_(tensor)
            router.received(*target)
    assert router.complete() == set(fused)
    return {**out, **fused}


def test_moe_value_model_on_expert_parallel_ranks_matches_fsdp(tmp_path):
    """A Qwen2-MoE critic (``Qwen2MoeForTokenClassification``): the score head on megatron's MoE decoder,
    the experts over two ranks (EP2, data-parallel for the rest), against FSDPValueEngine on one rank."""
    model_dir = write_value_model(str(tmp_path / "critic"), "qwen2_moe", seed=6)
    batch = rl_batch(8, 7, 6, seed=3)
    fsdp = run_ranks(value_training, 1, model_dir, None, batch, 2, result_dir=str(tmp_path / "fsdp"))[0]
    megatron = {"expert_model_parallel_size": 2}
    ranks = run_ranks(value_training, 2, model_dir, megatron, batch, 2, result_dir=str(tmp_path / "mg"))

    values = torch.cat([rank["values"]["values"] for rank in ranks])  # each data-parallel rank's shard
    torch.testing.assert_close(values, fsdp["values"]["values"], rtol=1e-5, atol=1e-5)
    for rank in ranks:
        assert any(".experts.3." in name for name in rank["grads"]) and "score.bias" in rank["grads"]
        grads, weights = _fused(rank["grads"], fsdp["grads"]), _fused(rank["weights"], fsdp["weights"])
        assert sorted(grads) == sorted(fsdp["grads"])
        for name, grad in fsdp["grads"].items():
            assert float((grads[name] - grad).abs().max() / grad.abs().max()) < 1e-5, name
        for norm, expected in zip(rank["grad_norms"], fsdp["grad_norms"], strict=True):
            assert math.isclose(norm, expected, rel_tol=1e-5)
        for name, weight in fsdp["weights"].items():
            torch.testing.assert_close(weights[name], weight, rtol=0, atol=5e-6, msg=name)
