"""A run stopped after a checkpoint and resumed writes the same metrics as an uninterrupted run."""

from __future__ import annotations

import pytest

from verl.algos.config import load_config
from verl.algos.run import checkpoint_layout as layout
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import run

pytestmark = pytest.mark.usefixtures("ray_session")


def config(model: str, out: str, steps: int, *extra: str):
    return load_config(
        "grpo",
        [
            f"actor_rollout_ref.model.path={model}",
            f"trainer.default_local_dir={out}",
            "trainer.n_gpus_per_node=2",
            f"trainer.total_training_steps={steps}",
            "trainer.save_freq=2",
            "trainer.test_freq=2",
            "trainer.logger=[file]",
            "data.train_batch_size=4",
            "data.max_response_length=8",
            "data.val_max_samples=6",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            # the schedule must not depend on where the run stops
            "actor_rollout_ref.actor.optim.total_training_steps=4",
            "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
            # a reward that varies, so updates are non-zero (custom reward file written by the test)
            *extra,
        ],
    )


def comparable(record: dict) -> dict:
    """Everything but wall-clock measurements."""
    return {k: v for k, v in record.items() if not k.startswith(("timing_s/", "perf/"))}


def test_stopped_and_resumed_run_matches_uninterrupted(untied_model_dir, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(len(solution_str) % 3) / 2.0\n"
    )
    extra = (f"custom_reward_function.path={reward}",)
    full = tmp_path / "full"
    run(config(untied_model_dir, str(full), 4, *extra))

    split = tmp_path / "split"
    run(config(untied_model_dir, str(split), 2, *extra))
    assert layout.latest_complete(split) == layout.step_dir(split, 2)
    summary = run(config(untied_model_dir, str(split), 4, *extra))  # resume_mode=auto
    assert summary["steps"] == 4

    uninterrupted = {r["step"]: comparable(r) for r in read_metrics(str(full))}
    resumed = {r["step"]: comparable(r) for r in read_metrics(str(split))}
    assert sorted(resumed) == sorted(uninterrupted) == [0, 1, 2, 3, 4]
    for step in (3, 4):
        assert resumed[step] == uninterrupted[step], f"step {step} differs after resume"
    assert resumed[4]["actor/pg_loss"] != 0.0 or resumed[4]["actor/grad_norm"] > 0
    assert layout.latest_complete(split) == layout.step_dir(split, 4)
