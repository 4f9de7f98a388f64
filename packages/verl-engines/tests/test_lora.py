"""LoRA (PEFT) in the FSDP2 engine: only adapters train; one and two gloo ranks agree; the reference is the
base model with the adapter off; checkpoints hold adapters only and resume bit-exactly; both exports and the
hf rollout sync carry the trained model."""

import json
import os

import pytest
import torch
from engine_helpers import rl_batch, run_ranks
from lora_rank_programs import (
    LORA,
    lora_engine,
    lora_gradients,
    lora_hybrid_adapter_steps,
    lora_resume,
    lora_train_and_export,
)
from rank_programs import make_engine, train_step
from safetensors import safe_open


def base_weights(model_path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(model_path, "model.safetensors"))


def test_only_adapters_train_and_the_untrained_adapter_changes_nothing(tiny_model, one_process_group):
    batch = rl_batch(4, 6, 5, seed=1)
    engine = lora_engine(tiny_model)
    trainable = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    # every linear layer of both blocks (q, k, v, o, gate, up, down), A and B; nothing else
    assert len(trainable) == 2 * 7 * 2 and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    in_optimizer = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in engine.module.parameters() if p.requires_grad}

    full = make_engine(tiny_model)
    with engine.eval_mode(), full.eval_mode():
        # B starts at zero: the adapted model computes exactly what the base model does
        assert torch.equal(engine.forward_only(batch)["log_probs"], full.forward_only(batch)["log_probs"])
    result = train_step(engine, batch, 0, 1)
    assert set(result["grads"]) == set(trainable)
    with engine.eval_mode():
        after = dict(engine.named_full_parameters())
        trained = engine.forward_only(batch)["log_probs"]
    with full.eval_mode():
        assert not torch.allclose(trained, full.forward_only(batch)["log_probs"])
    # the merged weights moved only where an adapter sits; the frozen rest is the model folder's
    base = base_weights(tiny_model)
    assert after.keys() == base.keys()
    for name, tensor in base.items():
        adapted = any(
            f".{m}.weight" in name
            for m in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        )
        assert torch.equal(after[name], tensor) != adapted, name


def test_reference_is_the_base_model_with_the_adapter_off_in_the_same_weights(tiny_model, one_process_group):
    batch = rl_batch(4, 6, 5, seed=2)
    engine = lora_engine(tiny_model, optim={"lr": 5e-2})
    train_step(engine, batch, 0, 1)
    storages = {p.to_local().data_ptr() for p in engine.module.parameters()}
    reference = engine.adapter_disabled_reference()
    with reference.eval_mode():
        base = reference.forward_only(batch)["log_probs"]
    with engine.eval_mode():
        trained = engine.forward_only(batch)["log_probs"]  # the adapter is back on after the reference pass
    full = make_engine(tiny_model)
    with full.eval_mode():
        torch.testing.assert_close(base, full.forward_only(batch)["log_probs"], atol=1e-6, rtol=0)
    assert not torch.allclose(trained, base)
    # no second model: the reference runs on the actor's own parameters
    assert reference.actor is engine and {p.to_local().data_ptr() for p in engine.module.parameters()} == storages
    assert (reference.dp_rank, reference.dp_size) == (engine.dp_rank, engine.dp_size)


def test_one_rank_and_two_ranks_give_the_same_adapter_gradients(tiny_model, tmp_path, one_process_group):
    batch = rl_batch(8, 8, 8, seed=11)
    one = lora_gradients(0, 1, tiny_model, batch)
    two = run_ranks(lora_gradients, 2, tiny_model, batch, result_dir=str(tmp_path))
    assert one["grads"].keys() == two[0]["grads"].keys() and len(one["grads"]) == 28
    for name, grad in one["grads"].items():
        torch.testing.assert_close(grad, two[0]["grads"][name], atol=1e-6, rtol=1e-5)
    assert one["grad_norm"] == pytest.approx(two[0]["grad_norm"], rel=1e-5)


def test_checkpoint_holds_adapters_only_and_resumes_bit_exactly(tiny_model, tmp_path, one_process_group):
    batches = [rl_batch(6, 6, 5, seed=s) for s in (1, 2, 3)]
    ckpt_dir = str(tmp_path / "ckpt")
    ranks = run_ranks(lora_resume, 2, tiny_model, batches, ckpt_dir, result_dir=str(tmp_path / "out"))
    for result in ranks:
        assert result["uninterrupted"].keys() == result["resumed"].keys()
        for name, tensor in result["uninterrupted"].items():
            assert torch.equal(tensor, result["resumed"][name]), name
        assert result["grad_norms"][0] == result["grad_norms"][1]
        assert result["lr"][0] == result["lr"][1]
    keys = set()
    for name in os.listdir(os.path.join(ckpt_dir, "state")):
        with safe_open(os.path.join(ckpt_dir, "state", name), "pt") as f:
            keys |= set(f.keys())
    model_keys = {k for k in keys if k.startswith("model.")}
    assert len(model_keys) == 28 and all(".lora_A." in k or ".lora_B." in k for k in model_keys)
    optim_keys = {k for k in keys if k.startswith("optim.")}
    assert optim_keys and all(".lora_A." in k or ".lora_B." in k for k in optim_keys)


def test_a_full_engine_refuses_a_lora_checkpoint(tiny_model, tmp_path, one_process_group):
    engine = lora_engine(tiny_model)
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="saved with lora_rank=4, this engine has lora_rank=0"):
        make_engine(tiny_model).load_checkpoint(str(tmp_path / "ckpt"))


def test_merged_and_adapter_exports_carry_the_trained_model(tiny_model, tmp_path, one_process_group):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    batches = [rl_batch(6, 6, 5, seed=s) for s in (4, 5)]
    merged_dir, adapter_dir = str(tmp_path / "merged"), str(tmp_path / "adapter")
    ranks = run_ranks(
        lora_train_and_export, 2, tiny_model, batches, merged_dir, adapter_dir, result_dir=str(tmp_path / "out")
    )
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        adapter_config = json.load(f)
    assert adapter_config["r"] == LORA["lora_rank"] and adapter_config["lora_alpha"] == LORA["lora_alpha"]
    assert adapter_config["peft_type"] == "LORA"

    # PEFT's own merge of the adapter folder onto the base model is the merged export
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), adapter_dir)
    reference = peft_model.merge_and_unload().state_dict()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).state_dict()
    assert merged.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(merged[name], tensor, atol=1e-6, rtol=1e-6, msg=lambda m, n=name: f"{n}: {m}")

    # the merged folder, run by a full engine, gives the LoRA engine's log-probs; the original gives the base's
    probe = batches[0]  # each rank ran the whole first batch
    for folder, key in ((merged_dir, "trained"), (tiny_model, "base")):
        engine = make_engine(folder)
        with engine.eval_mode():
            torch.testing.assert_close(engine.forward_only(probe)["log_probs"], ranks[0][key], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("sleep_level", [1, 2])
def test_the_hf_rollout_serves_the_adapter_in_place(tiny_model, one_process_group, sleep_level):
    """The base weights reach the hf rollout once (again after each sleep that drops them), then only the
    adapter; sampled log-probs equal the trainer's recomputation and greedy output equals a rollout given
    the merged weights. With one rank on CPU the rollout's base weights are the trainer's own storage."""
    from verl.core.engine import SamplingParams
    from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

    result = lora_hybrid_adapter_steps(0, 1, tiny_model, rl_batch(4, 6, 5, seed=6), sleep_level)
    generations = 4  # two rounds of a sampled and a greedy generation
    assert result["base_syncs"] == (1 if sleep_level == 1 else generations)
    for done in result["rounds"]:
        assert done["metrics"]["weight_sync/adapter_only"] == 1.0
        assert 0 < done["metrics"]["weight_sync/adapter_mb"] < 1
        mask = done["response_mask"].bool()
        torch.testing.assert_close(done["rollout_log_probs"][mask], done["recomputed"][mask], atol=2e-5, rtol=1e-5)
    assert not torch.equal(result["rounds"][0]["greedy"], result["rounds"][1]["greedy"])  # the adapter moved
    assert result["shares_base"] == (sleep_level == 1)  # level 2 re-creates what sleep dropped

    merged = HFRolloutEngine(HFRolloutConfig(model_path=tiny_model, load_format="dummy", share_weight_storage=False))
    merged.update_weights(result["merged"].items())
    greedy = merged.generate(result["prompts"], SamplingParams(do_sample=False, max_new_tokens=6))
    assert torch.equal(greedy.batch["responses"], result["rounds"][1]["greedy"])


def base_q(model_path):
    return base_weights(model_path)["model.layers.0.self_attn.q_proj.weight"]


@pytest.mark.parametrize("exclude", [None, ".*layers\\.1\\..*"], ids=["no_exclude", "regex_exclude"])
def test_a_value_model_trains_its_head_in_full_and_adapters(tiny_model, one_process_group, exclude):
    from rank_programs import value_loss

    from verl.engines.fsdp import FSDPEngineConfig, FSDPValueEngine

    lora = dict(LORA, exclude_modules=exclude)
    engine = FSDPValueEngine(FSDPEngineConfig(model_path=tiny_model, optim={"lr": 1e-2}, lora=lora))
    engine.initialize()
    trainable = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    heads = [n for n in trainable if ".lora_" not in n]
    assert set(heads) == {"base_model.model.score.weight", "base_model.model.score.bias"}
    # adapters on every linear layer of both blocks, or of block 0 only when block 1 is excluded
    assert len(trainable) == 2 + (28 if exclude is None else 14)
    batch = rl_batch(4, 6, 5, seed=7)
    with engine.train_mode():
        engine.forward_backward(batch, value_loss)
        assert all(p.grad is not None for p in engine.module.parameters() if p.requires_grad)
        engine.optimizer_step()
    with pytest.raises(ValueError, match="head is trained in full"):
        engine.export_adapter("unused")


def test_bad_lora_settings_are_refused_with_the_fix(tiny_model, one_process_group):
    from verl.engines.fsdp.lora import LoRAConfig

    with pytest.raises(ValueError, match="lora_rank=-1 must be >= 0"):
        LoRAConfig(lora_rank=-1)
    with pytest.raises(ValueError, match="target_modules=.*must name modules"):
        make_engine(tiny_model, lora={"lora_rank": 4, "target_modules": ["no_such_proj"]})


def test_activation_checkpointing_gives_the_same_adapter_gradients(tiny_model, one_process_group):
    """verl's LoRA scripts turn enable_gradient_checkpointing on: recomputation with a frozen base (whose
    embeddings' outputs need no gradient) must still reach every adapter, with the same gradients."""
    batch = rl_batch(4, 6, 5, seed=8)
    plain = train_step(lora_engine(tiny_model), batch, 0, 1)
    recomputed = train_step(lora_engine(tiny_model, enable_gradient_checkpointing=True), batch, 0, 1)
    assert plain["grads"].keys() == recomputed["grads"].keys() and len(plain["grads"]) == 28
    for name, grad in plain["grads"].items():
        torch.testing.assert_close(recomputed["grads"][name], grad, atol=1e-6, rtol=1e-5)
