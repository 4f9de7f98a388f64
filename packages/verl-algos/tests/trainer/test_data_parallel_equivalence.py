"""One worker and two data-parallel workers give the same update for the same batch: the loss scaling
of the algorithm library and the gradient reduction of the engine agree (the engine sums over ranks)."""

from __future__ import annotations

import pytest

from verl.algos.config import load_config
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import run

pytestmark = pytest.mark.usefixtures("ray_session")


def first_step(model: str, out: str, reward: str, workers: int) -> dict:
    run(
        load_config(
            "reinforce_plus_plus",
            [
                f"actor_rollout_ref.model.path={model}",
                f"trainer.default_local_dir={out}",
                f"custom_reward_function.path={reward}",
                f"trainer.n_gpus_per_node={workers}",
                "trainer.total_training_steps=1",
                "trainer.val_before_train=false",
                "trainer.test_freq=-1",
                "trainer.save_freq=-1",
                "trainer.logger=[file]",
                "data.train_batch_size=4",
                "data.max_response_length=8",
                # greedy rollout: the samples do not depend on how prompts are split over ranks
                "actor_rollout_ref.rollout.do_sample=false",
                "actor_rollout_ref.rollout.n=1",
                # one mini-batch: the update does not depend on row order (balancing reorders rows)
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.actor.optim.clip_grad=1000",
            ],
        )
    )
    return read_metrics(out)[-1]


def test_one_and_two_workers_take_the_same_step(tiny_model_dir, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        # varies with the prompt (a greedy tiny model writes responses of one length)
        "    return float(int(ground_truth) % 7)\n"
    )
    one = first_step(tiny_model_dir, str(tmp_path / "one"), str(reward), 1)
    two = first_step(tiny_model_dir, str(tmp_path / "two"), str(reward), 2)
    assert one["actor/grad_norm"] > 0
    assert two["actor/grad_norm"] == pytest.approx(one["actor/grad_norm"], rel=1e-4)
    assert two["critic/score/mean"] == pytest.approx(one["critic/score/mean"])
