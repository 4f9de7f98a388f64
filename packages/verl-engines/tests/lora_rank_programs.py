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


class CountingHFRollout:
    """Builds the real hf rollout engine and counts the base-weight syncs it receives."""

    @staticmethod
    def build(model_path, **config):
        from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

        class Counting(HFRolloutEngine):
            weight_syncs = 0

            def update_weights(self, weights) -> None:
                type(self).weight_syncs += 1
                super().update_weights(weights)

        return Counting(HFRolloutConfig(model_path=model_path, load_format="dummy", **config))


def lora_hybrid_adapter_steps(rank, world_size, model_path, batch, sleep_level):
    """Two rounds of (training step, sampled generation, greedy generation) through the hybrid engine
    with the hf rollout serving the adapter in place; what the rollout produced and what the trainer
    recomputes for it, and the merged weights of the last round."""
    from verl.core.engine import SamplingParams
    from verl.core.protocol import DataProto
    from verl.engines.hybrid import HybridEngine

    engine = lora_engine(model_path, optim={"lr": 5e-2})
    rollout = CountingHFRollout.build(model_path, sleep_level=sleep_level)
    hybrid = HybridEngine(engine, rollout)
    t = batch.batch
    width = t["prompts"].shape[1]
    prompts = DataProto.from_dict({k: t[k][:, :width] for k in ("input_ids", "attention_mask", "position_ids")})
    rounds = []
    for step in range(2):
        train_step(engine, batch, rank, world_size)
        sampled = hybrid.generate(
            prompts, SamplingParams(n=2, temperature=0.9, max_new_tokens=6, seed=step, logprobs=True)
        )
        sampled.meta_info["temperature"] = 0.9
        with engine.eval_mode():
            recomputed = engine.forward_only(sampled)["log_probs"]
        greedy = hybrid.generate(prompts, SamplingParams(do_sample=False, max_new_tokens=6))
        rounds.append(
            {
                "metrics": sampled.meta_info["metrics"],
                "rollout_log_probs": sampled.batch["rollout_log_probs"],
                "recomputed": recomputed,
                "response_mask": sampled.batch["response_mask"],
                "greedy": greedy.batch["responses"],
            }
        )
    with engine.eval_mode():
        merged = {name: t.clone() for name, t in engine.named_full_parameters()}
        shares_base = all(
            rollout._tensors[name].data_ptr() == tensor.data_ptr() for name, tensor in engine.named_base_parameters()
        )
    return {
        "rounds": rounds,
        "merged": merged,
        "prompts": prompts,
        "base_syncs": type(rollout).weight_syncs,
        "shares_base": shares_base,
    }


__all__ = ["token_mean_loss"]
