"""Programs the sequence-parallel tests run on each gloo rank (spawned processes import them from here)."""

from __future__ import annotations

from verl.core.protocol import DataProto


def one_engine_step(engine_cls, model_path: str, batch: DataProto, loss_fn, config: dict) -> dict:
    """forward_only then one forward_backward on ``batch``: outputs, loss metrics, full gradients, the
    engine's data-parallel coordinates."""
    from verl.engines.fsdp import FSDPEngineConfig

    engine = engine_cls(FSDPEngineConfig(model_path=model_path, optim={"lr": 1e-2}, **config))
    engine.initialize()
    with engine.eval_mode():
        outputs = engine.forward_only(batch, compute_entropy=bool(batch.meta_info.get("compute_entropy")))
    with engine.train_mode():
        engine.optimizer_zero_grad()
        metrics = engine.forward_backward(batch, loss_fn)
        grads = {n: p.grad.full_tensor().clone() for n, p in engine.module.named_parameters() if p.grad is not None}
        grad_norm = engine.optimizer_step()
    params = {n: t.clone() for n, t in engine.named_full_parameters()}
    return {
        "engine": engine,
        "params": params,
        "outputs": outputs,
        "metrics": metrics,
        "grads": grads,
        "grad_norm": grad_norm,
        "layout": (engine.dp_rank, engine.dp_size, engine.is_collect_rank, engine.sp_size),
    }


def run_cases(rank: int, world_size: int, cases: list[tuple]) -> list[dict]:
    """Each case is (engine class, model path, batch, loss_fn, config); a data-parallel rank (a whole
    sequence-parallel group) takes its chunk of the batch, as the controller's dispatch gives it."""
    results = []
    for engine_cls, model_path, batch, loss_fn, config in cases:
        sp = config.get("ulysses_sequence_parallel_size", 1)
        dp = world_size // sp
        shard = batch.chunk(dp)[rank // sp] if dp > 1 else batch
        result = one_engine_step(engine_cls, model_path, shard, loss_fn, config)
        result.pop("engine")
        results.append(result)
    return results


def step_and_save(rank: int, world_size: int, model_path: str, batch: DataProto, loss_fn, ckpt_dir: str) -> dict:
    """One SP=world_size step, then a checkpoint; returns the full parameters it saved."""
    from verl.engines.fsdp import FSDPEngine

    result = one_engine_step(FSDPEngine, model_path, batch, loss_fn, {"ulysses_sequence_parallel_size": world_size})
    result["engine"].save_checkpoint(ckpt_dir)
    return {"params": result["params"]}
