"""Two GRPO steps through the real trainer with ``actor_rollout_ref.rollout.name=vllm``: two Ray workers,
each with the FSDP2 actor (gloo, 2 ranks) and a vLLM engine in its own process, weights synced every
step, rollout log-probs checked against the actor's."""

import math
import textwrap

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

#: Varies between samples of a random model, so every group has a learning signal.
VARIED_REWARD = textwrap.dedent(
    """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return float(len(solution_str) % 3) / 2.0
    """
)


def test_grpo_runs_two_steps_with_the_vllm_rollout(qwen2_model, tmp_path):
    import ray

    from verl.algos.config import load_config
    from verl.algos.tracking import read_metrics
    from verl.algos.trainer.main import run

    reward = tmp_path / "reward.py"
    reward.write_text(VARIED_REWARD)
    out = tmp_path / "run"
    overrides = [
        f"actor_rollout_ref.model.path={qwen2_model}",
        f"trainer.default_local_dir={out}",
        f"custom_reward_function.path={reward}",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.logger=[file]",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        "data.val_max_samples=4",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.engine_kwargs.kv_cache_memory_bytes=33554432",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
    ]
    try:
        summary = run(load_config("grpo", overrides))
    finally:
        ray.shutdown()
    assert summary["steps"] == 2
    records = read_metrics(str(out))
    assert [r["step"] for r in records] == [0, 1, 2]
    assert "val/acc" in records[0] and "val/acc" in records[2]
    for record in records[1:]:
        for key in (
            "actor/pg_loss",
            "actor/grad_norm",
            "timing_s/gen",
            "timing_s/update_weights",
            "response_length/mean",
        ):
            assert math.isfinite(record[key]), (record["step"], key)
        # the vLLM engine and the FSDP actor agree on the sampled tokens' log-probs (both fp32)
        print(
            f"\nstep {record['step']}: training/rollout_log_prob_diff_max {record['training/rollout_log_prob_diff_max']:.2e}"
        )
        assert record["training/rollout_log_prob_diff_max"] < 1e-3
    assert any(r["actor/grad_norm"] > 0 for r in records[1:])
