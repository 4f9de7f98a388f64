"""The learning test with LoRA: the same experiment as ``test_learning`` (a tiny Qwen2 warm-started with SFT
on the built-in arithmetic task, then GRPO from ``verl train``; the warm start is built once per session and shared), with the actor trained through rank-16
adapters on all linear layers (``actor_rollout_ref.model.lora_rank=16``) instead of in full. Held-out greedy
accuracy must rise by the same margins as the full fine-tuning test requires.

LoRA moves far fewer parameters per step, so its learning rate is 10x the full run's (2e-3; the usual LoRA
practice); everything else is test_learning's.
"""

from __future__ import annotations

import pytest
from test_learning import MIN_GAIN, MIN_RATIO, SEED, grpo, warm_start

LORA = (
    "actor_rollout_ref.model.lora_rank=16",
    "actor_rollout_ref.model.lora_alpha=32",
    "actor_rollout_ref.model.target_modules=all-linear",
    "actor_rollout_ref.actor.optim.lr=2e-3",
)


@pytest.mark.slow
def test_grpo_with_lora_lifts_held_out_accuracy(ray_session, learning_dir, tmp_path):
    summary = grpo(warm_start(learning_dir, SEED), tmp_path / "grpo", SEED, extra=LORA)
    before, after = summary["val_before"], summary["val_after"]
    print(f"LoRA GRPO held-out accuracy {before:.3f} -> {after:.3f}")
    assert 0.05 <= before <= 0.75, f"the SFT warm start should be partially right, got {before:.3f}"
    assert after >= before + MIN_GAIN and after >= MIN_RATIO * before, (
        f"GRPO with LoRA did not learn: held-out accuracy {before:.3f} -> {after:.3f} "
        f"(needs +{MIN_GAIN:.2f} and x{MIN_RATIO})"
    )
