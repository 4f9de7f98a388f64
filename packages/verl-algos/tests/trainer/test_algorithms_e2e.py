"""Every algorithm end to end for two steps on a tiny model with 2 Ray workers: real Ray, FSDP2 on
gloo, the HF rollout, the reward, validation and tracking."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from algos_test_helpers import VARIED_REWARD
from cli_runs import tiny_overrides

from verl.algos.config import load_config
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import run

pytestmark = pytest.mark.usefixtures("ray_session")


def overrides(model: str, out: str, reward_path: str, *extra: str) -> list[str]:
    """Two steps with validation at the end, four prompts in mini-batches of two."""
    return tiny_overrides(
        model,
        Path(out),
        Path(reward_path),
        2,
        "trainer.test_freq=2",
        "data.train_batch_size=4",
        "data.val_max_samples=6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        *extra,
    )


CASES = {
    # the ppo recipe runs end to end in test_placement (with the critic colocated and on its own pool), the
    # tool_grpo recipe in test_tool_learning: not again here (CI time)
    "grpo": ("grpo", ["actor_rollout_ref.rollout.n=4"], []),
    "drgrpo": ("drgrpo", ["actor_rollout_ref.rollout.n=4"], []),
    "dapo": (
        "dapo",
        ["actor_rollout_ref.rollout.n=4", "algorithm.filter_groups.metric=acc"],
        ["train/num_gen_batches"],
    ),
    "rloo": ("rloo", ["actor_rollout_ref.rollout.n=4"], []),
    "reinforce_plus_plus": ("reinforce_plus_plus", ["actor_rollout_ref.rollout.n=2"], ["actor/reward_kl_penalty"]),
    "remax": ("remax", ["actor_rollout_ref.rollout.n=2"], ["timing_s/gen_max"]),
    "gspo": ("gspo", ["actor_rollout_ref.rollout.n=4"], []),
    "grpo_reward_model": (
        "grpo",
        ["actor_rollout_ref.rollout.n=2", "reward_model.enable=true", "reward_model.model.path={model}"],
        ["reward_model/score/mean"],
    ),
    "grpo_kl_loss": (
        "grpo",
        [
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.kl_loss_type=k3+",
        ],
        ["actor/kl_loss", "timing_s/ref"],
    ),
    # verl's newer families (issue 13), two orthogonal settings per run to keep CI short
    "cispo_decoupled_correction": (
        "grpo",
        [
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
            "algorithm.rollout_correction.rollout_is=token",
            "algorithm.rollout_correction.rollout_rs=token_k1",
            "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0",
        ],
        ["rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_masked_fraction", "timing_s/old_log_prob"],
    ),
    "sapo_grpo_vectorized": (
        "grpo",
        [
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.policy_loss.loss_mode=sapo",
            "actor_rollout_ref.actor.tau_neg=2.0",
            "algorithm.adv_estimator=grpo_vectorized",
        ],
        [],
    ),
    "geo_mean_rloo_vectorized": (
        "grpo",
        [
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean",
            "algorithm.adv_estimator=rloo_vectorized",
        ],
        [],
    ),
    "bypass_ppo_clip_rejection": (
        "grpo",
        [
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",  # a second, off-policy mini-batch
            "algorithm.rollout_correction.bypass_mode=true",
            "algorithm.rollout_correction.rollout_rs=seq_mean_k3",
            "algorithm.rollout_correction.rollout_rs_threshold=0.01",
        ],
        ["rollout_corr/rollout_rs_masked_fraction", "rollout_corr/kl"],
    ),
    "bypass_reinforce_is": (
        "grpo",
        [
            "actor_rollout_ref.rollout.n=4",
            "algorithm.rollout_correction.bypass_mode=true",
            "algorithm.rollout_correction.loss_type=reinforce",
            "algorithm.rollout_correction.rollout_is=sequence",
            "algorithm.rollout_correction.rollout_is_batch_normalize=true",
        ],
        ["rollout_corr/rollout_is_mean", "rollout_corr/chi2_seq"],
    ),
    # the agentic recipe as shipped: builtin:calculator prompts through the tool agent loop and its tool config
    "optimal_token_baseline_pf_ppo": (
        "grpo",
        [
            "actor_rollout_ref.rollout.n=4",
            "algorithm.adv_estimator=optimal_token_baseline",
            "algorithm.use_pf_ppo=true",
            "algorithm.pf_ppo.weight_pow=1.0",
        ],
        ["timing_s/old_log_prob"],
    ),
}

#: Bypass mode has no old-log-prob pass on the driver: its rollout/training mismatch is reported by the loss as
#: rollout_corr/* (per mini-batch, against the policy being trained) instead.
DRIVER_MISMATCH = "training/rollout_log_prob_diff_max"

COMMON_METRICS = [
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/grad_norm",
    "critic/score/mean",
    "critic/advantages/mean",
    "response_length/mean",
    "timing_s/gen",
    "timing_s/update_actor",
    "timing_s/update_weights",
    "timing_s/step",
    "perf/throughput",
    "training/rollout_log_prob_diff_max",
]


@pytest.mark.parametrize("case", list(CASES))
def test_algorithm_runs_two_steps(case, tiny_model_dir, tmp_path):
    recipe, extra, expected = CASES[case]
    reward = tmp_path / "reward.py"
    reward.write_text(VARIED_REWARD)
    out = tmp_path / "run"
    extra = [item.format(model=tiny_model_dir) for item in extra]
    summary = run(load_config(recipe, overrides(tiny_model_dir, str(out), str(reward), *extra)))
    assert summary["steps"] == 2
    records = read_metrics(str(out))
    assert [r["step"] for r in records] == [0, 1, 2]
    assert "val/acc" in records[0] and "val/acc" in records[2]
    common = [k for k in COMMON_METRICS if not (case.startswith("bypass") and k == DRIVER_MISMATCH)]
    for record in records[1:]:
        missing = [k for k in common + expected if k not in record]
        assert not missing, f"{case}: step {record['step']} lacks {missing}"
        for key in common + expected:
            assert isinstance(record[key], float) and math.isfinite(record[key]), (case, key, record[key])
        # the rollout and the training engine agree on the sampled tokens' log-probs (same fp32 weights)
        assert record.get(DRIVER_MISMATCH, 0.0) < 1e-3
    # the varied reward gives non-zero advantages: the policy actually moved
    assert any(abs(r["actor/pg_loss"]) > 0 or r["actor/grad_norm"] > 0 for r in records[1:])
