"""A LoRA actor's weights into vLLM, both ways:

- built with the actor's ``lora_rank`` (what the trainer does), vLLM gets the base weights once and then
  the adapter as a LoRA request after every update;
- built without, it receives the merged weights (W + scale * B A, Hugging Face names) through the same
  in-place sync as full fine-tuning.

Either way, after training steps of the adapter, its greedy output is the hf engine's with the merged
weights, and its sampled log-probs are what the trainer recomputes."""

import pytest
import torch
from vllm_test_helpers import GREEDY, prompts_batch, token_mean_loss, vllm_config

from verl.core.engine import SamplingParams
from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

pytestmark = pytest.mark.vllm

LORA_RANK = 8


def lora_actor(model_path):
    from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig

    lora = {"lora_rank": LORA_RANK, "lora_alpha": 32}
    actor = FSDPEngine(FSDPEngineConfig(model_path=model_path, optim={"lr": 5e-2, "lr_warmup_steps": 0}, lora=lora))
    actor.initialize()
    return actor


def train_on_own_samples(hybrid, actor, prompts, steps=2):
    """Steps of the adapter on the rollout's samples; then a batch sampled with the trained adapter, and
    the trainer's log-probs of it."""
    for step in range(steps + 1):
        sampling = SamplingParams(n=2, temperature=0.8, max_new_tokens=10, seed=step, logprobs=True)
        sampled = hybrid.generate(prompts, sampling)
        sampled.meta_info["temperature"] = 0.8
        if step == steps:
            break
        sampled.batch["advantages"] = torch.ones(sampled.batch["responses"].shape)
        with actor.train_mode():
            actor.forward_backward(sampled, token_mean_loss)
            actor.optimizer_step()
    with actor.eval_mode():
        recomputed = actor.forward_only(sampled)["log_probs"]
    return sampled, recomputed


@pytest.mark.parametrize("served", ["adapter", "merged"])
def test_vllm_generates_with_the_trained_adapter(qwen2_model, keep_alive, served):
    from verl.engines.hybrid import HybridEngine
    from verl.engines.rollout.vllm import VLLMRolloutEngine

    actor = lora_actor(qwen2_model)
    lora_rank = LORA_RANK if served == "adapter" else 0
    rollout = VLLMRolloutEngine(vllm_config(qwen2_model, load_format="dummy", lora_rank=lora_rank))
    keep_alive(rollout)
    assert rollout.supports_lora_adapters == (served == "adapter")
    reference = HFRolloutEngine(HFRolloutConfig(model_path=qwen2_model, share_weight_storage=False))
    hybrid = HybridEngine(actor, rollout)
    prompts = prompts_batch(qwen2_model)

    before = hybrid.generate(prompts, GREEDY)
    assert torch.equal(before.batch["responses"], reference.generate(prompts, GREEDY).batch["responses"])  # B = 0
    assert before.meta_info["metrics"]["weight_sync/adapter_only"] == float(served == "adapter")

    sampled, recomputed = train_on_own_samples(hybrid, actor, prompts)
    mask = sampled.batch["response_mask"].bool()
    torch.testing.assert_close(sampled.batch["rollout_log_probs"][mask], recomputed[mask], atol=1e-4, rtol=0)
    with actor.eval_mode():
        merged = {name: t.clone() for name, t in actor.named_full_parameters()}
    after = hybrid.generate(prompts, GREEDY).batch["responses"]
    reference.update_weights(merged.items())
    assert torch.equal(after, reference.generate(prompts, GREEDY).batch["responses"])
    assert not torch.equal(after, before.batch["responses"])


def test_an_adapter_wider_than_the_engines_slots_is_refused(qwen2_model, keep_alive):
    from verl.core.engine import LoRAAdapter
    from verl.engines.rollout.vllm import VLLMRolloutEngine

    rollout = VLLMRolloutEngine(vllm_config(qwen2_model, lora_rank=1))
    keep_alive(rollout)
    with pytest.raises(ValueError, match="rank 16 does not fit the engine's LoRA slots"):
        rollout.update_adapter(LoRAAdapter({"r": 16}, {}, 1))
