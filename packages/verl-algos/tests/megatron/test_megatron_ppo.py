"""``verl train`` with ``actor_rollout_ref.actor.strategy=megatron``: the actor, the reference and the
critic on the Megatron engine with tensor parallelism over two CPU workers (one data-parallel replica of
two TP ranks: both get the same shard, TP rank 0 returns it), and the same GRPO run on the FSDP2 engine
with one worker (also one replica, so the rollouts are the same samples) taking the same steps as TP2 and
as PP2 (two pipeline stages), with a reward model and the KL loss (the reference) on the same engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runs import tiny_overrides, write_reward

from verl.algos import cli

pytestmark = [pytest.mark.megatron, pytest.mark.usefixtures("ray_session")]

MEGATRON_TP2 = [
    "actor_rollout_ref.actor.strategy=megatron",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    "trainer.n_gpus_per_node=2",
]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_ppo_with_a_critic_trains_two_steps_on_megatron_tp2(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    overrides = tiny_overrides(tiny_model_dir, out, write_reward(tmp_path), 2, *MEGATRON_TP2)
    # the KL loss needs the reference: all three roles run on the megatron engine
    overrides += ["actor_rollout_ref.actor.use_kl_loss=true", "trainer.save_freq=-1"]
    assert cli.main(["train", "-r", "ppo", *overrides]) == 0
    steps = [r for r in records(out) if r.get("step", 0) >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("actor/grad_norm", "critic/grad_norm", "critic/vf_loss", "actor/entropy", "actor/kl_loss"):
            assert key in r and r[key] == r[key], key  # present and not NaN
        assert r["actor/grad_norm"] > 0 and r["critic/grad_norm"] > 0
        # the update's own log-probs (the collect rank is the one that ran the loss) equal the rollout's
        assert r["training/rollout_log_prob_diff_max"] < 1e-4
        # the reference is the initial policy: the first step's KL to it is zero
    assert steps[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    # the critic's values move after its first update
    assert steps[1]["critic/values/mean"] != steps[0]["critic/values/mean"]


#: Metrics that must agree between the two engines (wall-clock ones excluded), and how closely.
EXACT = ("response_length/mean", "rollout/prefill_tokens")
CLOSE = {
    "actor/grad_norm": 1e-4,
    "actor/entropy": 1e-5,
    "critic/advantages/max": 1e-5,
    "actor/pg_loss": 1e-5,
    "training/rollout_log_prob_diff_max": 1e-5,
    "reward_model/score/mean": 1e-5,
    "critic/score/mean": 1e-5,  # the reward function's plus the reward model's
    "critic/rewards/mean": 1e-5,
    "actor/kl_loss": 1e-6,
}


@pytest.fixture(scope="module")
def grpo_settings(tmp_path_factory) -> list[str]:
    """Short runs with every role of the actor's workers: a reward model beside the reward function and
    the KL loss (the reference)."""
    from algos_test_helpers import write_tiny_reward_model

    rm = write_tiny_reward_model(str(tmp_path_factory.mktemp("tiny-rm")))
    return [
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "reward_model.enable=true",
        f"reward_model.model.path={rm}",
        "actor_rollout_ref.actor.use_kl_loss=true",
    ]


@pytest.fixture(scope="module")
def fsdp_grpo_run(grpo_settings, tiny_model_dir, tmp_path_factory) -> Path:
    """Three GRPO steps on the FSDP2 engine, one worker."""
    tmp = tmp_path_factory.mktemp("fsdp")
    out = tmp / "run"
    overrides = tiny_overrides(tiny_model_dir, out, write_reward(tmp), 3, *grpo_settings, "trainer.n_gpus_per_node=1")
    assert cli.main(["train", *overrides]) == 0
    return out


PP2 = [
    "actor_rollout_ref.actor.strategy=megatron",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    "trainer.n_gpus_per_node=2",
]


@pytest.mark.parametrize("layout", [MEGATRON_TP2, PP2], ids=["tp2", "pp2"])
def test_grpo_on_megatron_takes_the_fsdp2_steps(layout, grpo_settings, fsdp_grpo_run, tiny_model_dir, tmp_path):
    """PP2: only the last stage runs the loss (the worker records the update's own log-probs there), so
    the collect rank must be on it; the rollout-vs-training metrics below would be far off otherwise."""
    fsdp, megatron = fsdp_grpo_run, tmp_path / "megatron"
    reward = write_reward(tmp_path)
    assert cli.main(["train", *tiny_overrides(tiny_model_dir, megatron, reward, 3, *grpo_settings, *layout)]) == 0
    a = [r for r in records(fsdp) if r.get("step", 0) >= 1]
    b = [r for r in records(megatron) if r.get("step", 0) >= 1]
    assert len(a) == len(b) == 3
    assert any(r["actor/grad_norm"] > 0.1 for r in a)  # the comparison covers real updates
    for x, y in zip(a, b):
        for key in EXACT:
            assert y[key] == x[key], (x["step"], key)
        for key, tol in CLOSE.items():
            assert y[key] == pytest.approx(x[key], rel=tol, abs=tol), (x["step"], key, x[key], y[key])


def test_a_megatron_run_resumes_from_its_checkpoint_and_takes_the_same_steps(
    grpo_settings, fsdp_grpo_run, tiny_model_dir, tmp_path
):
    """Checkpoints of the megatron roles (written by every rank, collectively) resume the run: two
    steps, a checkpoint, then the third step from it, the same as the uninterrupted FSDP2 run's."""
    out, reward = tmp_path / "run", write_reward(tmp_path)
    first = tiny_overrides(tiny_model_dir, out, reward, 2, *grpo_settings, *MEGATRON_TP2, "trainer.save_freq=2")
    assert cli.main(["train", *first]) == 0
    assert (out / "global_step_2").is_dir()
    assert cli.main(["train", *tiny_overrides(tiny_model_dir, out, reward, 3, *grpo_settings, *MEGATRON_TP2)]) == 0
    resumed = [r for r in records(out) if r.get("step") == 3 and "actor/grad_norm" in r]
    (expected,) = [r for r in records(fsdp_grpo_run) if r.get("step") == 3 and "actor/grad_norm" in r]
    assert len(resumed) == 1
    for key, tol in CLOSE.items():
        assert resumed[0][key] == pytest.approx(expected[key], rel=tol, abs=tol), key
