"""Programs the LoRA tests run on each gloo rank (spawned processes import them from here)."""

from __future__ import annotations

import torch
from rank_programs import make_engine, token_mean_loss, train_step

LORA = {"lora_rank": 4, "lora_alpha": 8}


def lora_engine(model_path, **overrides):
    return make_engine(model_path, lora=dict(LORA), **overrides)


def trainable_state(engine) -> dict[str, torch.Tensor]:
    """Every parameter that trains, gathered (collective)."""
    return {n: p.full_tensor().clone() for n, p in engine.module.named_parameters() if p.requires_grad}


def lora_gradients(rank, world_size, model_path, batch):
    return train_step(lora_engine(model_path), batch, rank, world_size)


def lora_resume(rank, world_size, model_path, batches, ckpt_dir):
    """Two steps, save, a third step; then a fresh engine loads the checkpoint and takes the third step."""
    engine = lora_engine(model_path)
    for batch in batches[:2]:
        train_step(engine, batch, rank, world_size)
    engine.save_checkpoint(ckpt_dir)
    third = train_step(engine, batches[2], rank, world_size)
    uninterrupted = trainable_state(engine)

    resumed = lora_engine(model_path)
    resumed.load_checkpoint(ckpt_dir)
    third_again = train_step(resumed, batches[2], rank, world_size)
    return {
        "uninterrupted": uninterrupted,
        "resumed": trainable_state(resumed),
        "grad_norms": (third["grad_norm"], third_again["grad_norm"]),
        "lr": (engine.lr, resumed.lr),
    }


def lora_train_and_export(rank, world_size, model_path, batches, merged_dir, adapter_dir):
    """Train (so that the adapters are not zero), then export both ways; returns the engine's log-probs
    of the first batch with and without the adapter."""
    engine = lora_engine(model_path, optim={"lr": 5e-2})
    for batch in batches:
        train_step(engine, batch, rank, world_size)
    engine.export_hf(merged_dir)
    engine.export_adapter(adapter_dir)
    probe = batches[0]
    with engine.eval_mode():
        trained = engine.forward_only(probe)["log_probs"]
    reference = engine.adapter_disabled_reference()
    with reference.eval_mode():
        base = reference.forward_only(probe)["log_probs"]
    return {"trained": trained, "base": base}


def lora_hybrid_sync(rank, world_size, model_path, batch):
    """A training step, then the weights the hf rollout engine receives (merged) and the engine's own."""
    from verl.engines.hybrid import HybridEngine
    from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

    engine = lora_engine(model_path, optim={"lr": 5e-2})
    train_step(engine, batch, rank, world_size)
    rollout = HFRolloutEngine(HFRolloutConfig(model_path=model_path, load_format="dummy"))
    hybrid = HybridEngine(engine, rollout)
    hybrid.to_rollout()
    rollout_weights = {n: t.detach().clone() for n, t in rollout.model.state_dict().items()}
    hybrid.to_training()
    with engine.eval_mode():
        probe = engine.forward_only(batch)["log_probs"]
    return {"rollout_weights": rollout_weights, "log_probs": probe}


__all__ = ["token_mean_loss"]
