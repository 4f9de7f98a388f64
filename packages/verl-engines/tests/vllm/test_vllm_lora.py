"""A LoRA actor's weights into vLLM: vLLM receives the merged weights (W + scale * B A, Hugging Face names)
through the same in-place sync as full fine-tuning (not LoRA requests: see README), and after a training step
of the adapters its greedy output is the hf engine's with the merged weights."""

import pytest
import torch
from vllm_test_helpers import GREEDY, prompts_batch, token_mean_loss, vllm_config

from verl.core.engine import SamplingParams
from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

pytestmark = pytest.mark.vllm


def test_vllm_generates_with_the_merged_adapter(qwen2_model, keep_alive):
    from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig
    from verl.engines.hybrid import HybridEngine
    from verl.engines.rollout.vllm import VLLMRolloutEngine

    actor = FSDPEngine(
        FSDPEngineConfig(
            model_path=qwen2_model, optim={"lr": 5e-2, "lr_warmup_steps": 0}, lora={"lora_rank": 8, "lora_alpha": 32}
        )
    )
    actor.initialize()
    rollout = VLLMRolloutEngine(vllm_config(qwen2_model, load_format="dummy"))
    keep_alive(rollout)
    reference = HFRolloutEngine(HFRolloutConfig(model_path=qwen2_model, share_weight_storage=False))
    hybrid = HybridEngine(actor, rollout)
    prompts = prompts_batch(qwen2_model)

    before = hybrid.generate(prompts, GREEDY).batch["responses"]
    assert torch.equal(before, reference.generate(prompts, GREEDY).batch["responses"])  # B = 0: the base model

    for _ in range(2):
        sampled = hybrid.generate(prompts, SamplingParams(n=2, temperature=0.8, max_new_tokens=10, seed=0))
        sampled.meta_info["temperature"] = 0.8
        sampled.batch["advantages"] = torch.ones(sampled.batch["responses"].shape)
        with actor.train_mode():
            actor.forward_backward(sampled, token_mean_loss)
            actor.optimizer_step()
    with actor.eval_mode():
        merged = {name: t.clone() for name, t in actor.named_full_parameters()}
    after = hybrid.generate(prompts, GREEDY).batch["responses"]
    reference.update_weights(merged.items())
    assert torch.equal(after, reference.generate(prompts, GREEDY).batch["responses"])
    assert not torch.equal(after, before)
