"""Runs with Ulysses sequence parallelism (two ranks, one data-parallel group) take the same steps as the
same runs on one rank: the same samples, rewards, log-probs, values, losses and gradient norms (GRPO with
the actor, reference and a reward model split; PPO with the critic split too)."""

from __future__ import annotations

import pytest

from verl.algos.config import load_config
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import run

pytestmark = pytest.mark.usefixtures("ray_session")

#: Metrics that measure the machine (time, memory, throughput), not the algorithm.
MACHINE = ("timing", "perf/", "memory", "throughput", "_s/", "time")


def varied_reward(tmp_path) -> str:
    """A score that differs between a prompt's samples (the untrained model solves nothing), so GRPO's
    advantages, and the gradients, are not zero."""
    path = tmp_path / "reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(sum(map(ord, solution_str)) % 7)\n"
    )
    return str(path)


def run_steps(recipe: str, model: str, out: str, workers: int, sp: int, extra: list[str]) -> list[dict]:
    run(
        load_config(
            recipe,
            [
                *extra,
                f"actor_rollout_ref.model.path={model}",
                f"trainer.default_local_dir={out}",
                f"trainer.n_gpus_per_node={workers}",
                f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}",
                "trainer.total_training_steps=2",
                "trainer.val_before_train=false",
                "trainer.test_freq=-1",
                "trainer.save_freq=-1",
                "trainer.logger=[file]",
                "data.train_batch_size=2",
                "data.max_response_length=8",
                "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=1",  # two optimizer steps per training step
                "actor_rollout_ref.actor.recompute_old_log_prob=true",
            ],
        )
    )
    return read_metrics(out)


def assert_same_steps(one: list[dict], two: list[dict], required: tuple[str, ...]) -> None:
    assert len(one) == len(two) == 2
    assert all(one[-1][key] != 0 for key in required), required  # (the KL is 0 before the first update)
    for step_one, step_two in zip(one, two):
        # one data-parallel rank: the driver did not balance the batch over two
        assert "global_seqlen/imbalance" not in step_two
        compared = 0
        for key, value in step_one.items():
            if not isinstance(value, (int, float)) or any(part in key for part in MACHINE):
                continue
            assert step_two[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
            compared += 1
        assert compared > 20


@pytest.mark.parametrize(
    "recipe, extra, required",
    [
        # the reference (the actor's SP group) runs for the KL loss; a reward model split as well
        (
            "grpo",
            ["actor_rollout_ref.actor.use_kl_loss=true", "reward_model.ulysses_sequence_parallel_size=2"],
            ("actor/grad_norm", "actor/kl_loss", "reward_model/score/mean"),
        ),
        ("ppo", ["critic.ulysses_sequence_parallel_size=2"], ("actor/grad_norm", "critic/grad_norm")),
    ],
    ids=["grpo", "ppo_with_critic"],
)
def test_sequence_parallel_run_matches_one_rank(recipe, extra, required, tiny_model_dir, tmp_path):
    extra = [*extra, f"custom_reward_function.path={varied_reward(tmp_path)}"]
    if any(e.startswith("reward_model.") for e in extra):
        from algos_test_helpers import write_tiny_reward_model

        rm = write_tiny_reward_model(str(tmp_path / "rm"))
        extra += ["reward_model.enable=true", f"reward_model.model.path={rm}"]
    one = run_steps(recipe, tiny_model_dir, str(tmp_path / "one"), 1, 1, [e.replace("size=2", "size=1") for e in extra])
    two = run_steps(recipe, tiny_model_dir, str(tmp_path / "sp2"), 2, 2, extra)
    assert_same_steps(one, two, required)


def sft_steps(model: str, out: str, workers: int, sp: int) -> list[dict]:
    from verl.algos.config.sft_schema import SFTConfig
    from verl.algos.trainer.sft_main import run_sft
    from verl.core.config import build_config

    cfg = build_config(
        SFTConfig,
        overrides=[
            f"model.path={model}",
            f"ulysses_sequence_parallel_size={sp}",  # verl's SFT key, top level
            f"trainer.n_gpus_per_node={workers}",
            f"trainer.default_local_dir={out}",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            "trainer.logger=[file]",
            "data.train_batch_size=8",
            "data.micro_batch_size_per_gpu=4",
            "data.val_max_samples=8",
            "optim.lr=1e-3",
        ],
    )
    run_sft(cfg)
    return read_metrics(out)


def test_sft_with_sequence_parallelism_matches_one_rank(tiny_model_dir, tmp_path):
    """``verl sft ulysses_sequence_parallel_size=2`` on two ranks (one data-parallel group) takes the steps
    of the same run on one rank: losses, gradient norms and the validation loss."""
    one = sft_steps(tiny_model_dir, str(tmp_path / "one"), 1, 1)
    two = sft_steps(tiny_model_dir, str(tmp_path / "sp2"), 2, 2)
    assert len(one) == len(two) >= 2
    compared = []
    for step_one, step_two in zip(one, two):
        for key, value in step_one.items():
            if key.startswith(("sft/", "val")) and isinstance(value, (int, float)):
                assert step_two[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
                compared.append(key)
    assert {"sft/loss", "sft/grad_norm"} <= set(compared) and any(key.startswith("val") for key in compared)
    # the two ranks are one data-parallel rank: a Ulysses group, not two replicas
    assert [step["perf/dp_size"] for step in two] == [1] * len(two)
