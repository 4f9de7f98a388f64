"""What each gloo rank of the megatron -> rollout sync test runs (``engine_helpers.run_ranks`` spawns it;
spawned ranks import this module by name from this folder, which conftest.py puts on ``sys.path``).

Each rank does what a verl worker with ``actor.strategy=megatron`` does: the megatron actor (its TP / PP
share of the model), one training step, then its own colocated rollout engines fed by the actor's
per-tensor iterator (every rank of the model-parallel group consumes it: the gather is collective).
"""

from __future__ import annotations

from verl.core.protocol import DataProto

#: A large lr without warm-up: one step moves the greedy output.
OPTIM = {"lr": 5e-2, "lr_warmup_steps": 0}
#: This process's vLLM engines: dropping one shuts it down, which destroys the default process group.
_KEEP_ALIVE: list = []


def megatron_step_then_rollouts(
    rank, world_size, model_dir: str, megatron: dict, batch: DataProto, prompts: DataProto, greedy
) -> dict:
    """One training step of the megatron actor on ``batch``, then the weights streamed into a vLLM engine
    (dummy-initialised, through the hybrid engine as the worker does) and into an hf rollout engine;
    both generate greedily from ``prompts``. Returns both outputs, and rank 0 the weights it streamed."""
    from rank_programs import token_mean_loss
    from vllm_test_helpers import vllm_config

    from verl.engines.hybrid import HybridEngine
    from verl.engines.megatron.config import MegatronEngineConfig
    from verl.engines.megatron.engine import MegatronEngine
    from verl.engines.megatron.parallel import destroy_megatron_parallel
    from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine
    from verl.engines.rollout.vllm import VLLMRolloutEngine

    actor = MegatronEngine(
        MegatronEngineConfig(model_path=model_dir, megatron=megatron, optim=OPTIM, ppo_micro_batch_size_per_gpu=2)
    )
    actor.initialize()
    try:
        with actor.train_mode():
            actor.optimizer_zero_grad()
            actor.forward_backward(batch, token_mean_loss)
            actor.optimizer_step()
        vllm = VLLMRolloutEngine(vllm_config(model_dir, load_format="dummy"))
        _KEEP_ALIVE.append(vllm)  # until the process exits (see the vllm engine's docstring: lifetime)
        out = HybridEngine(actor, vllm).generate(prompts, greedy)
        hf = HFRolloutEngine(HFRolloutConfig(model_path=model_dir, load_format="dummy", share_weight_storage=False))
        with actor.eval_mode():
            hf.update_weights(actor.named_full_parameters())
            weights = {name: tensor.clone() for name, tensor in actor.named_full_parameters()}
        return {
            "vllm": out.batch["responses"],
            "hf": hf.generate(prompts, greedy).batch["responses"],
            "update_weights_s": out.meta_info["metrics"]["timing_s/update_weights"],
            "weights": weights if rank == 0 else None,
        }
    finally:
        destroy_megatron_parallel()
