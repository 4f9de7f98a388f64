"""Programs the distributed tests run on each gloo rank (spawned processes import them from here).

Each takes ``(rank, world_size, *args)`` and returns what the test compares (torch-saved by the
runner in ``engine_helpers.run_ranks``).
"""

from __future__ import annotations

import torch

from verl.core.protocol import DataProto


def agree_on_micro_batch_counts(rank, world_size):
    from verl.engines.fsdp.dynamic_batch import fixed_size_micro_batches, token_budget_micro_batches

    # Rank 0 has many short sequences, rank 1 one long one: both must run rank 0's count.
    seqlens = [30] * 8 if rank == 0 else [100]
    dynamic = token_budget_micro_batches(seqlens, 100)
    fixed = fixed_size_micro_batches(5 if rank == 0 else 2, 2)
    return dynamic, fixed


def token_mean_loss(outputs, micro):
    """Policy-gradient-shaped loss scaled for the global batch, plus a small entropy bonus."""
    mask = micro.batch["response_mask"].float()
    weights = micro.batch["advantages"]
    total = micro.meta_info["global_response_tokens"]
    loss = -(outputs["log_probs"] * weights * mask).sum() / total
    if "entropy" in outputs:
        loss = loss - 0.01 * (outputs["entropy"] * mask).sum() / total
    return loss, {"loss": loss.detach()}


def make_engine(model_path, **overrides):
    from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig

    config = dict(model_path=model_path, optim={"lr": 1e-2, "lr_warmup_steps": 3, "weight_decay": 0.1})
    config.update(overrides)
    engine = FSDPEngine(FSDPEngineConfig(**config))
    engine.initialize()
    return engine


def train_step(engine, batch: DataProto, rank: int, world_size: int, shard_sizes=None) -> dict:
    if shard_sizes is None:
        shard = batch.chunk(world_size)[rank]
    else:  # uneven shards (the engine must still keep the ranks' collectives in step)
        start = sum(shard_sizes[:rank])
        shard = batch[start : start + shard_sizes[rank]]
    with engine.train_mode():
        engine.optimizer_zero_grad()
        metrics = engine.forward_backward(shard, token_mean_loss)
        # clone: with one rank full_tensor() may alias the gradient, which clipping then scales in place
        grads = {n: p.grad.full_tensor().clone() for n, p in engine.module.named_parameters() if p.grad is not None}
        grad_norm = engine.optimizer_step()
        engine.lr_scheduler_step()
    return {"grads": grads, "grad_norm": grad_norm, "metrics": metrics}


def full_params(engine) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in engine.named_full_parameters()}


def gradients_of_one_step(rank, world_size, model_path, batch, overrides, shard_sizes=None):
    engine = make_engine(model_path, **overrides)
    return train_step(engine, batch, rank, world_size, shard_sizes)


def train_save_export_train(rank, world_size, model_path, batch_a, batch_b, ckpt_dir, export_dir):
    """Step on batch a, save and export, step on batch b; returns the states to compare."""
    engine = make_engine(model_path)
    train_step(engine, batch_a, rank, world_size)
    engine.save_checkpoint(ckpt_dir)
    saved = {"params": full_params(engine), "lr": engine.lr, "rng": torch.get_rng_state()}
    engine.export_hf(export_dir)
    train_step(engine, batch_b, rank, world_size)
    return {"saved": saved, "after": full_params(engine)}


def prompts_batch(n: int, prompt_len: int, seed: int) -> DataProto:
    from engine_helpers import make_batch

    t = make_batch(n, prompt_len, 1, seed=seed)
    keys = ("input_ids", "attention_mask", "position_ids")
    return DataProto.from_dict({k: t[k][:, :prompt_len] for k in keys}, non_tensors={"uid": list(range(n))})


def hybrid_cycle(rank, world_size, model_path, offload_actor=None, sleep_level=1):
    """Generate (greedy and sampled) through the hybrid engine, train one step on the sampled rollout,
    generate greedily again. Returns what the tests compare."""
    from verl.core.engine import SamplingParams
    from verl.engines.hybrid import HybridEngine
    from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

    actor = make_engine(model_path, optim={"lr": 5e-2})
    rollout = HFRolloutEngine(HFRolloutConfig(model_path=model_path, load_format="dummy", sleep_level=sleep_level))
    hybrid = HybridEngine(actor, rollout, offload_actor=offload_actor)
    prompts = prompts_batch(6, 5, seed=3).chunk(world_size)[rank]
    greedy = SamplingParams(do_sample=False, max_new_tokens=6)

    before = hybrid.generate(prompts, greedy)
    state_after_gen = actor.offload_state
    sampled = hybrid.generate(prompts, SamplingParams(n=2, temperature=0.8, max_new_tokens=6, logprobs=True, seed=rank))
    sampled.meta_info["temperature"] = 0.8
    with actor.eval_mode():
        recomputed = actor.forward_only(sampled)["log_probs"]
    hybrid.to_rollout()
    shares_storage = rollout.model.lm_head.weight.data_ptr() == actor.module.lm_head.weight.to_local().data_ptr()
    rollout_weights = {n: t.clone() for n, t in rollout.model.named_parameters()}
    hybrid.to_training()
    with actor.eval_mode():
        actor_weights = full_params(actor)

    sampled.batch["advantages"] = torch.ones_like(sampled.batch["rollout_log_probs"])
    with actor.train_mode():
        actor.forward_backward(sampled, token_mean_loss)
        actor.optimizer_step()
    after = hybrid.generate(prompts, greedy)
    return {
        "before": before.batch["responses"],
        "after": after.batch["responses"],
        "metrics": after.meta_info["metrics"],
        "sampled": sampled.batch,
        "recomputed": recomputed,
        "shares_storage": shares_storage,
        "rollout_weights": rollout_weights,
        "actor_weights": actor_weights,
        "state_after_gen": state_after_gen,
    }


def value_loss(outputs, micro):
    mask = micro.batch["response_mask"].float()
    loss = ((outputs["values"] - micro.batch["advantages"]) ** 2 * mask).sum() / micro.meta_info[
        "global_response_tokens"
    ]
    return loss, {"vf_loss": loss.detach()}


def full_training_state(engine) -> dict[str, torch.Tensor]:
    """Every model and optimizer tensor, gathered (collective), under flat names."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True)
    model_sd, optim_sd = get_state_dict(engine.module, engine.optimizer, options=options)
    state = {f"model.{k}": v.clone() for k, v in model_sd.items()}
    state.update({f"optim.{k}": v.clone() for k, v in optim_sd.items() if isinstance(v, torch.Tensor)})
    return state


def build_any_engine(model_path, model_type):
    from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig, FSDPValueEngine

    cls = FSDPValueEngine if model_type == "value_model" else FSDPEngine
    engine = cls(FSDPEngineConfig(model_path=model_path, optim={"lr": 1e-2}))
    engine.initialize()
    return engine


def step_and_save(rank, world_size, model_path, model_type, batch, ckpt_dir):
    engine = build_any_engine(model_path, model_type)
    loss = value_loss if model_type == "value_model" else token_mean_loss
    with engine.train_mode():
        engine.forward_backward(batch.chunk(world_size)[rank], loss)
        engine.optimizer_step()
    engine.save_checkpoint(ckpt_dir)
    return full_training_state(engine)


def full_weights_and_export(rank, world_size, model_path, export_dir):
    """The FSDP2 engine's ``named_full_parameters`` (cloned), the names and shapes it plans exports from,
    and an export into ``export_dir``."""
    engine = make_engine(model_path)
    with engine.eval_mode():
        weights = {name: tensor.clone() for name, tensor in engine.named_full_parameters()}
    engine.export_hf(export_dir)
    return {"weights": weights, "planned": list(engine._param_shapes)}
