"""Programs the VeOmni tests run on each gloo rank: the FSDP2 engine and the VeOmni engine side by side in
the same processes, on the same shard of the same batch."""

from __future__ import annotations

from rank_programs import full_params, token_mean_loss

from verl.core.protocol import DataProto

OPTIM = {"lr": 1e-2, "lr_warmup_steps": 0, "weight_decay": 0.1, "clip_grad": 1.0}


def make(engine_cls, model_path: str, **overrides):
    engine = engine_cls({"model_path": model_path, "optim": dict(OPTIM), **overrides})
    engine.initialize()
    return engine


def shard_of(engine, batch: DataProto) -> DataProto:
    """This rank's data-parallel shard (a Ulysses group shares one)."""
    return batch.chunk(engine.dp_size)[engine.dp_rank]


def run_steps(engine, batch: DataProto, steps: int) -> dict:
    """Log-probs / entropy before training, then ``steps`` updates: first step's gradients, every step's
    loss and grad norm, the parameters after the last."""
    shard = shard_of(engine, batch)
    with engine.eval_mode():
        before = engine.forward_only(shard, compute_entropy=True)
    losses, norms, grads = [], [], {}
    for step in range(steps):
        with engine.train_mode():
            engine.optimizer_zero_grad()
            shard.meta_info["compute_entropy"] = True
            metrics = engine.forward_backward(shard, token_mean_loss)
            if step == 0:
                grads = {n: p.grad.full_tensor().clone() for n, p in engine.module.named_parameters()}
            norms.append(engine.optimizer_step())
            engine.lr_scheduler_step()
        losses.append(sum(float(v) for v in metrics["loss"]))
    with engine.eval_mode():
        params = full_params(engine)
    return {
        "outputs": before,
        "losses": losses,
        "grad_norms": norms,
        "grads": grads,
        "params": params,
        "model_modules": [cls.__module__ for cls in type(engine.module).__mro__],
        "layout": (engine.dp_size, engine.sp_size),
    }


def fsdp_and_veomni(rank, world_size, model_path, batch, steps, overrides):
    from verl.engines.fsdp import FSDPEngine
    from verl.engines.veomni import VeOmniEngine

    fsdp = run_steps(make(FSDPEngine, model_path, **overrides), batch, steps)
    veomni = run_steps(make(VeOmniEngine, model_path, **overrides), batch, steps)
    return {"fsdp": fsdp, "veomni": veomni}


def one_update(engine, shard: DataProto) -> None:
    with engine.train_mode():
        engine.optimizer_zero_grad()
        engine.forward_backward(shard, token_mean_loss)
        engine.optimizer_step()
        engine.lr_scheduler_step()


def save_export_resume(rank, world_size, model_path, batch_a, batch_b, ckpt_dir, export_dir):
    """Step on a, save and export, step on b; then a fresh engine loads the checkpoint and steps on b."""
    from verl.engines.veomni import VeOmniEngine

    engine = make(VeOmniEngine, model_path)
    one_update(engine, shard_of(engine, batch_a))
    engine.save_checkpoint(ckpt_dir)
    with engine.eval_mode():
        saved = full_params(engine)
    engine.export_hf(export_dir)
    one_update(engine, shard_of(engine, batch_b))
    with engine.eval_mode():
        after = full_params(engine)
    resumed = make(VeOmniEngine, model_path)
    resumed.load_checkpoint(ckpt_dir)
    with resumed.eval_mode():
        loaded = full_params(resumed)
    one_update(resumed, shard_of(resumed, batch_b))
    with resumed.eval_mode():
        resumed_after = full_params(resumed)
    return {"saved": saved, "loaded": loaded, "after": after, "resumed_after": resumed_after, "lr": resumed.lr}


def value_steps(engine, batch: DataProto) -> dict:
    """Values before training, then one critic update: its gradients and the parameters after it."""
    from rank_programs import value_loss

    shard = shard_of(engine, batch)
    with engine.eval_mode():
        values = engine.forward_only(shard)["values"]
    with engine.train_mode():
        engine.optimizer_zero_grad()
        metrics = engine.forward_backward(shard, value_loss)
        grads = {n: p.grad.full_tensor().clone() for n, p in engine.module.named_parameters()}
        engine.optimizer_step()
    with engine.eval_mode():
        params = full_params(engine)
    return {"values": values, "loss": metrics["vf_loss"], "grads": grads, "params": params}


def fsdp_and_veomni_values(rank, world_size, model_path, batch):
    from verl.engines.fsdp import FSDPValueEngine
    from verl.engines.veomni import VeOmniValueEngine

    fsdp = value_steps(make(FSDPValueEngine, model_path, ppo_micro_batch_size_per_gpu=2), batch)
    veomni = value_steps(make(VeOmniValueEngine, model_path, ppo_micro_batch_size_per_gpu=2), batch)
    return {"fsdp": fsdp, "veomni": veomni}
