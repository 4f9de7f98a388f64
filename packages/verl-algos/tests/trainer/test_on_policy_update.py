"""On-policy updates skip the old-log-prob pass: a run that uses the update's own detached log-probs
follows the same trajectory as one that recomputes them in a separate pass (the slow reference), on 2
Ray workers with prompt sharing on and off."""

from __future__ import annotations

import pytest
from algos_test_helpers import VARIED_REWARD

from verl.algos.config import load_config
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import run

pytestmark = pytest.mark.usefixtures("ray_session")

COMPARED = ["actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean", "response_length/mean"]


def grpo_run(model: str, out: str, *extra: str) -> list[dict]:
    reward = f"{out}-reward.py"
    with open(reward, "w") as fh:
        fh.write(VARIED_REWARD)
    run(
        load_config(
            "grpo",
            [
                f"actor_rollout_ref.model.path={model}",
                f"trainer.default_local_dir={out}",
                f"custom_reward_function.path={reward}",
                "trainer.n_gpus_per_node=2",
                "trainer.total_training_steps=3",
                "trainer.test_freq=0",
                "trainer.val_before_train=false",
                "trainer.save_freq=0",
                "trainer.logger=[file]",
                "data.train_batch_size=2",
                "data.max_response_length=8",
                "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.optim.lr=1e-2",
                *extra,
            ],
        )
    )
    return read_metrics(out)


@pytest.mark.parametrize("share_prompts", [True, False])
def test_skipping_the_old_log_prob_pass_changes_nothing(tiny_model_dir, tmp_path, share_prompts):
    share = f"actor_rollout_ref.model.share_prompts={str(share_prompts).lower()}"
    reference = grpo_run(
        tiny_model_dir, str(tmp_path / "recompute"), share, "actor_rollout_ref.actor.recompute_old_log_prob=true"
    )
    fast = grpo_run(tiny_model_dir, str(tmp_path / "skip"), share)
    assert [r["step"] for r in fast] == [1, 2, 3]
    for ref, got in zip(reference, fast):
        assert "timing_s/old_log_prob" in ref and "timing_s/old_log_prob" not in got
        # the mismatch metric now comes from the update's forward: still the same weights and tokens
        assert got["training/rollout_log_prob_diff_max"] < 1e-3
        for key in COMPARED:
            assert got[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), (ref["step"], key)
    assert any(r["actor/grad_norm"] > 0 for r in fast)


def test_off_policy_updates_still_recompute(tiny_model_dir, tmp_path):
    records = grpo_run(
        tiny_model_dir,
        str(tmp_path / "two-minibatches"),
        "data.train_batch_size=4",
        "trainer.total_training_steps=1",
    )
    assert "timing_s/old_log_prob" in records[0]
