"""Weights from the real FSDP2 actor into vLLM through the hybrid engine: a dummy-initialized vLLM
engine generates with the actor's weights, its log-probs are the ones the actor recomputes, a training
step changes its greedy output, and loading the old weights back restores it."""

import pytest
import torch
from vllm_test_helpers import GREEDY, prompts_batch, token_mean_loss, vllm_config

from verl.core.engine import SamplingParams
from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def setup(llama_tied_model, keep_alive):
    """(actor, vllm rollout with dummy weights, hybrid engine, hf reference rollout), one rank."""
    from verl.engines.fsdp import FSDPEngine, FSDPEngineConfig
    from verl.engines.hybrid import HybridEngine
    from verl.engines.rollout.vllm import VLLMRolloutEngine

    actor = FSDPEngine(FSDPEngineConfig(model_path=llama_tied_model, optim={"lr": 5e-2, "lr_warmup_steps": 0}))
    actor.initialize()
    rollout = VLLMRolloutEngine(vllm_config(llama_tied_model, load_format="dummy"))
    keep_alive(rollout)
    reference = HFRolloutEngine(HFRolloutConfig(model_path=llama_tied_model, share_weight_storage=False))
    return actor, rollout, HybridEngine(actor, rollout), reference


def actor_weights(actor) -> dict[str, torch.Tensor]:
    with actor.eval_mode():
        return {name: t.clone() for name, t in actor.named_full_parameters()}


def reference_greedy(reference, weights, prompts):
    reference.update_weights(weights.items())
    return reference.generate(prompts, GREEDY).batch["responses"]


def test_trained_weights_go_live_and_restoring_them_restores_the_output(setup, llama_tied_model):
    actor, rollout, hybrid, reference = setup
    prompts = prompts_batch(llama_tied_model)
    initial = actor_weights(actor)

    # Dummy weights until the first sync; after it, exactly the hf engine's output with the actor's weights.
    before = hybrid.generate(prompts, GREEDY)
    assert torch.equal(before.batch["responses"], reference_greedy(reference, initial, prompts))
    assert before.meta_info["metrics"]["timing_s/update_weights"] >= 0
    # vLLM copied the weights: the actor's own parameters are untouched by the sync.
    for name, value in actor_weights(actor).items():
        assert torch.equal(value, initial[name]), name

    # One large step on a sampled rollout: the greedy output moves, and matches the new weights.
    sampled = hybrid.generate(prompts, SamplingParams(n=2, temperature=0.8, max_new_tokens=10, logprobs=True, seed=0))
    sampled.meta_info["temperature"] = 0.8
    sampled.batch["advantages"] = torch.ones_like(sampled.batch["rollout_log_probs"])
    with actor.train_mode():
        actor.forward_backward(sampled, token_mean_loss)
        actor.optimizer_step()
    trained = actor_weights(actor)
    after = hybrid.generate(prompts, GREEDY).batch["responses"]
    assert not torch.equal(after, before.batch["responses"])
    assert torch.equal(after, reference_greedy(reference, trained, prompts))

    # Loading the initial weights back restores the initial output.
    rollout.update_weights(initial.items())
    assert torch.equal(rollout.generate(prompts, GREEDY).batch["responses"], before.batch["responses"])


def test_rollout_log_probs_match_the_actors_recomputed_log_probs(setup, llama_tied_model):
    actor, rollout, hybrid, _ = setup
    prompts = prompts_batch(llama_tied_model)
    sampled = hybrid.generate(prompts, SamplingParams(n=4, temperature=0.9, max_new_tokens=12, logprobs=True, seed=3))
    sampled.meta_info["temperature"] = 0.9
    with actor.eval_mode():
        recomputed = actor.forward_only(sampled)["log_probs"]
    mask = sampled.batch["response_mask"].bool()
    diff = (recomputed[mask] - sampled.batch["rollout_log_probs"][mask]).abs()
    # The mismatch metric the trainer logs (training/rollout_log_prob_diff_max): fp32 on both sides.
    print(
        f"\nvllm vs fsdp log-probs over {int(mask.sum())} tokens: max |diff| {diff.max():.2e}, mean {diff.mean():.2e}"
    )
    assert diff.max() < 1e-4


def test_update_weights_names_the_tensor_vllm_rejects(setup):
    _, rollout, _, _ = setup
    with pytest.raises(RuntimeError, match="model.nope.weight"):
        rollout.update_weights([("model.nope.weight", torch.zeros(3))])
    with pytest.raises(ValueError, match="no tensors"):
        rollout.update_weights([])
