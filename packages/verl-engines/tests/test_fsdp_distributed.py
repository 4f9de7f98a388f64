"""FSDP2 on real gloo process groups: one rank and two ranks agree (gradients, checkpoints, export)."""

import os

import pytest
import torch
from engine_helpers import rl_batch, run_ranks
from rank_programs import (
    build_any_engine,
    full_params,
    full_training_state,
    gradients_of_one_step,
    make_engine,
    step_and_save,
    train_save_export_train,
    train_step,
)

from verl.core.protocol import DataProto


def assert_grads_equal(a, b):
    assert a.keys() == b.keys() and len(a) > 10
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize(
    "overrides",
    [
        {"ppo_micro_batch_size_per_gpu": 2},
        # Uneven shards: six 16-token sequences on rank 0 (six micro-batches of <= 20 tokens), two short
        # ones on rank 1, which must join four more micro-batches with zero-weight dummies.
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 20},
    ],
    ids=["fixed_micro_batches", "dynamic_uneven_micro_batches"],
)
def test_one_rank_and_two_ranks_give_the_same_gradients(tiny_model, tmp_path, one_process_group, overrides):
    shard_sizes = None
    if overrides.get("use_dynamic_bsz"):
        batch = DataProto.concat([rl_batch(6, 8, 8, seed=11, min_len=8), rl_batch(2, 8, 8, seed=12, max_len=2)])
        shard_sizes = [6, 2]
    else:
        batch = rl_batch(8, 8, 8, seed=11)
    one = gradients_of_one_step(0, 1, tiny_model, batch, overrides)
    two = run_ranks(gradients_of_one_step, 2, tiny_model, batch, overrides, shard_sizes, result_dir=str(tmp_path))
    assert_grads_equal(one["grads"], two[0]["grads"])
    assert one["grad_norm"] == pytest.approx(two[0]["grad_norm"], rel=1e-5)
    assert two[0]["grad_norm"] == two[1]["grad_norm"]  # every rank sees the global norm
    if overrides.get("use_dynamic_bsz"):
        # the ranks really did run different amounts of real work
        assert len(two[0]["metrics"]["loss"]) == 6 and len(two[1]["metrics"]["loss"]) == 2


def test_save_on_two_ranks_load_on_one_and_export(tiny_model, tmp_path, one_process_group):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    batch_a, batch_b = rl_batch(6, 6, 5, seed=1), rl_batch(6, 6, 5, seed=2)
    ckpt_dir, export_dir = str(tmp_path / "ckpt" / "actor"), str(tmp_path / "export")
    two = run_ranks(
        train_save_export_train, 2, tiny_model, batch_a, batch_b, ckpt_dir, export_dir, result_dir=str(tmp_path / "r")
    )
    saved, after = two[0]["saved"], two[0]["after"]
    assert not os.path.exists(ckpt_dir + ".tmp") and os.path.isfile(os.path.join(ckpt_dir, "engine_state.json"))
    # Nothing that loading would have to unpickle: tensors in safetensors, the rest in JSON.
    written = [os.path.join(d, f) for d, _, files in os.walk(ckpt_dir) for f in files]
    assert written and all(f.endswith((".safetensors", ".json")) for f in written), written

    engine = make_engine(tiny_model)
    assert not torch.equal(full_params(engine)["lm_head.weight"], saved["params"]["lm_head.weight"])
    engine.load_checkpoint(ckpt_dir)
    loaded = full_params(engine)
    for name, value in saved["params"].items():
        assert torch.equal(loaded[name], value), name
    assert engine.lr == pytest.approx(saved["lr"])
    assert torch.equal(torch.get_rng_state(), saved["rng"])

    # The next step from the loaded state matches the next step the two ranks took.
    # (Adam divides by sqrt(v): reduction-order noise of ~1e-7 in a gradient moves an update by ~1e-6.)
    train_step(engine, batch_b, 0, 1)
    for name, value in full_params(engine).items():
        torch.testing.assert_close(value, after[name], atol=1e-5, rtol=1e-4)

    # The export (gathered on two ranks) is a Hugging Face folder with the saved weights.
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        assert os.path.isfile(os.path.join(export_dir, name)), name
    exported = AutoModelForCausalLM.from_pretrained(export_dir)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    reference.load_state_dict(saved["params"], strict=True)
    ids = torch.randint(3, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(exported(input_ids=ids).logits, reference(input_ids=ids).logits)
    assert AutoTokenizer.from_pretrained(export_dir).eos_token == "<eos>"


@pytest.mark.parametrize(
    ("model_fixture", "model_type"),
    [("tiny_tied_model", "language_model"), ("tiny_model", "value_model")],
    ids=["tied_embeddings", "value_model"],
)
def test_checkpoint_keeps_tied_weights_and_tiny_shards(model_fixture, model_type, request, tmp_path, one_process_group):
    """Tied embeddings (one storage, two names) and a value head whose 1-element bias leaves rank 1 an
    empty shard: every model and optimizer tensor survives 2 ranks -> 1 rank exactly."""
    path = request.getfixturevalue(model_fixture)
    batch = rl_batch(4, 5, 4, seed=3)
    ckpt_dir = str(tmp_path / "ckpt")
    saved = run_ranks(step_and_save, 2, path, model_type, batch, ckpt_dir, result_dir=str(tmp_path / "r"))[0]
    engine = build_any_engine(path, model_type)
    engine.load_checkpoint(ckpt_dir)
    loaded = full_training_state(engine)
    assert loaded.keys() == saved.keys()
    for key, value in saved.items():
        assert torch.equal(loaded[key], value), key
    if model_type == "language_model":
        assert engine.module.lm_head.weight is engine.module.model.embed_tokens.weight


def test_loading_an_incomplete_checkpoint_is_refused(tiny_model, tmp_path, one_process_group):
    engine = make_engine(tiny_model)
    os.makedirs(tmp_path / "actor.tmp" / "state")
    with pytest.raises(FileNotFoundError, match="interrupted"):
        engine.load_checkpoint(str(tmp_path / "actor"))


def test_hybrid_sharding_gives_the_same_gradients_as_one_rank(tiny_model, tmp_path, one_process_group):
    """verl's fsdp_size=2 on 4 ranks: two replicas of a 2-way shard (HSDP on a named 2-D mesh)."""
    batch = rl_batch(8, 8, 8, seed=13)
    one = gradients_of_one_step(0, 1, tiny_model, batch, {"ppo_micro_batch_size_per_gpu": 2})
    overrides = {"ppo_micro_batch_size_per_gpu": 2, "fsdp_config": {"fsdp_size": 2}}
    four = run_ranks(gradients_of_one_step, 4, tiny_model, batch, overrides, None, result_dir=str(tmp_path))
    for rank in range(4):
        assert_grads_equal(one["grads"], four[rank]["grads"])
        assert four[rank]["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
