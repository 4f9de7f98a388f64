"""MegatronEngine checkpoints and export: a step, save and export on TP2; then loading that checkpoint on
the same layout continues bit-exactly, and on others (PP2; one rank) to fp32 rounding (the
checkpoint stores full HF-named tensors, resharded on load); the export is a HF folder that transformers
loads with the engine's weights; damaged checkpoints are refused before anything is read."""

from __future__ import annotations

import json
import os

import pytest
import torch
from engine_helpers import rl_batch, run_ranks
from megatron_helpers import write_model
from megatron_programs import checkpoint_round

from verl.engines.megatron import checkpoint

pytestmark = pytest.mark.megatron

TP2 = {"tensor_model_parallel_size": 2}
PP2 = {"pipeline_model_parallel_size": 2}


def test_save_load_on_any_layout_and_export(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = write_model(str(tmp_path / "qwen2"), "qwen2", seed=4)
    batch_a, batch_b = rl_batch(8, 7, 6, seed=3), rl_batch(8, 7, 6, seed=8)
    ckpt, export = str(tmp_path / "ckpt"), str(tmp_path / "export")
    saved = run_ranks(
        checkpoint_round, 2, model_dir, TP2, batch_a, batch_b, ckpt, export, result_dir=str(tmp_path / "a")
    )
    assert not os.path.exists(f"{ckpt}.tmp") and checkpoint.is_checkpoint(ckpt)
    same = run_ranks(checkpoint_round, 2, model_dir, TP2, None, batch_b, ckpt, result_dir=str(tmp_path / "b"))
    other = run_ranks(checkpoint_round, 2, model_dir, PP2, None, batch_b, ckpt, result_dir=str(tmp_path / "c"))
    other += run_ranks(checkpoint_round, 1, model_dir, {}, None, batch_b, ckpt, result_dir=str(tmp_path / "d"))

    reference = saved[0]
    for rank in same:  # same layout: everything restored exactly
        assert rank["lr"] == reference["lr"] and rank["norm"] == reference["norm"]
        assert torch.equal(rank["at_checkpoint"]["rng"], reference["at_checkpoint"]["rng"])
        for name, weight in reference["at_checkpoint"]["weights"].items():
            assert torch.equal(rank["at_checkpoint"]["weights"][name], weight), name
            assert torch.equal(rank["after"][name], reference["after"][name]), name
    for rank in other:  # PP2, and one rank: the same weights, moments and lr; the next step to fp32 rounding
        assert rank["lr"] == reference["lr"]
        assert rank["norm"] == pytest.approx(reference["norm"], rel=1e-5)
        for name, weight in reference["at_checkpoint"]["weights"].items():
            assert torch.equal(rank["at_checkpoint"]["weights"][name], weight), name
            torch.testing.assert_close(rank["after"][name], reference["after"][name], rtol=0, atol=5e-6, msg=name)

    hf = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    exported = dict(hf.named_parameters())
    assert sorted(exported) == sorted(reference["at_checkpoint"]["weights"])  # tied head: one tensor
    for name, weight in reference["at_checkpoint"]["weights"].items():
        assert torch.equal(exported[name].detach(), weight), name
    assert AutoTokenizer.from_pretrained(export).vocab_size == AutoTokenizer.from_pretrained(model_dir).vocab_size
    assert os.path.isfile(os.path.join(export, "generation_config.json"))

    # A truncated tensor file is refused before anything is read; so is another engine's checkpoint.
    model_file = os.path.join(ckpt, checkpoint.TENSOR_DIR, "model-00000.safetensors")
    with open(model_file, "r+b") as f:
        f.truncate(os.path.getsize(model_file) - 10)
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        checkpoint.read_engine_state(ckpt)
    state_file = os.path.join(ckpt, checkpoint.ENGINE_STATE_FILE)
    with open(state_file) as f:
        state = json.load(f)
    state.pop("backend")
    with open(state_file, "w") as f:
        json.dump(state, f)
    with pytest.raises(ValueError, match="written by the 'fsdp' engine"):
        checkpoint.read_engine_state(ckpt)
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        checkpoint.read_engine_state(str(tmp_path / "missing"))


def test_bf16_with_offload_saves_fp32_master_weights_and_resumes_exactly(tmp_path):
    """bf16 parameters (Float16Module, megatron's mixed-precision optimizer with fp32 main parameters), all
    offloads on: the checkpoint holds the fp32 masters (the bf16 weights are their rounding) and a resumed
    run continues bit-exactly."""
    from safetensors.torch import load_file

    model_dir = write_model(str(tmp_path / "qwen2"), "qwen2", seed=4)
    batch_a, batch_b = rl_batch(8, 7, 6, seed=3), rl_batch(8, 7, 6, seed=8)
    ckpt = str(tmp_path / "ckpt")
    config = {**TP2, "params_dtype": "bf16", "param_offload": True, "grad_offload": True, "optimizer_offload": True}
    saved = run_ranks(
        checkpoint_round,
        2,
        model_dir,
        config,
        batch_a,
        batch_b,
        ckpt,
        str(tmp_path / "export"),
        result_dir=str(tmp_path / "a"),
    )[0]
    resumed = run_ranks(checkpoint_round, 2, model_dir, config, None, batch_b, ckpt, result_dir=str(tmp_path / "b"))[0]

    masters = load_file(os.path.join(ckpt, checkpoint.TENSOR_DIR, "model-00000.safetensors"))
    weights = saved["at_checkpoint"]["weights"]
    assert all(w.dtype == torch.bfloat16 for w in weights.values())
    assert all(
        masters[n].dtype == torch.float32 and torch.equal(masters[n].to(torch.bfloat16), w) for n, w in weights.items()
    )
    assert any(not torch.equal(m, m.to(torch.bfloat16).float()) for m in masters.values())  # finer than bf16
    assert resumed["norm"] == saved["norm"] and resumed["lr"] == saved["lr"]
    for name, weight in saved["after"].items():
        assert torch.equal(resumed["after"][name], weight), name


def test_distributed_optimizer_checkpoint_resumes_exactly_and_loads_into_the_plain_optimizer(tmp_path):
    """megatron's distributed optimizer (DP2: each rank holds half of every parameter's fp32 master and
    moments): the checkpoint gathers the slices into full tensors; loading cuts them back (resumes
    bit-exactly) or into the plain optimizer of another layout (TP2: to fp32 rounding)."""
    model_dir = write_model(str(tmp_path / "qwen2"), "qwen2", seed=4)
    batch_a, batch_b = rl_batch(8, 7, 6, seed=3), rl_batch(8, 7, 6, seed=8)
    ckpt = str(tmp_path / "ckpt")
    distributed = {"use_distributed_optimizer": True}
    saved = run_ranks(
        checkpoint_round,
        2,
        model_dir,
        distributed,
        batch_a,
        batch_b,
        ckpt,
        str(tmp_path / "x"),
        result_dir=str(tmp_path / "a"),
    )[0]
    same = run_ranks(checkpoint_round, 2, model_dir, distributed, None, batch_b, ckpt, result_dir=str(tmp_path / "b"))[
        0
    ]
    plain = run_ranks(checkpoint_round, 2, model_dir, TP2, None, batch_b, ckpt, result_dir=str(tmp_path / "c"))[0]
    assert same["norm"] == saved["norm"] and plain["norm"] == pytest.approx(saved["norm"], rel=1e-5)
    for name, weight in saved["at_checkpoint"]["weights"].items():
        assert torch.equal(same["at_checkpoint"]["weights"][name], weight), name
        assert torch.equal(plain["at_checkpoint"]["weights"][name], weight), name
        assert torch.equal(same["after"][name], saved["after"][name]), name
        torch.testing.assert_close(plain["after"][name], saved["after"][name], rtol=0, atol=5e-6, msg=name)
