"""Config errors are reported before Ray starts, naming the key and the nearest valid ones."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import ray

from verl.algos.trainer.main import train
from verl.core.config import ConfigError


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["actor_rollout_ref.actor.optim.lrr=1e-5"], "Did you mean: actor_rollout_ref.actor.optim.lr"),
        (["data.train_batch_size=many"], "bad value for 'data.train_batch_size'"),
        (
            ["algorithm.kl_ctrl.type=pid"],
            "'algorithm.kl_ctrl.type' (from the command line): 'pid'; expected one of: fixed, adaptive",
        ),
        (["actor_rollout_ref.rollout.n=0"], "actor_rollout_ref.rollout.n=0 must be > 0"),
        (["actor_rollout_ref.model.path=/nonexistent/model"], "actor_rollout_ref.model.path"),
        (["algorithm.adv_estimator=grpoo"], "grpo"),
        (
            [
                "actor_rollout_ref.actor.strategy=megatron",
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                "critic.megatron.tensor_model_parallel_size=4",
            ],
            "critic.megatron.tensor_model_parallel_size=4: the roles share processes",
        ),
    ],
)
def test_bad_config_is_reported_without_starting_ray(overrides, message, tiny_model_dir, tmp_path):
    base = [f"trainer.default_local_dir={tmp_path}"]
    if not any(o.startswith("actor_rollout_ref.model.path") for o in overrides):
        base.append(f"actor_rollout_ref.model.path={tiny_model_dir}")
    with pytest.raises((ConfigError, KeyError)) as exc:
        train(None, [*base, *overrides])
    assert message in str(exc.value)
    assert not ray.is_initialized()


def test_missing_data_file_names_it(tiny_model_dir, tmp_path):
    missing = tmp_path / "train.parquet"
    with pytest.raises(ConfigError, match="train.parquet"):
        train(
            None,
            [
                f"actor_rollout_ref.model.path={tiny_model_dir}",
                f"data.train_files=[{missing}]",
                f"trainer.default_local_dir={tmp_path}",
            ],
        )
    assert not ray.is_initialized()


def test_cli_exits_2_with_the_message(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl.algos.cli",
            "train",
            "trainer.total_epochs=1",
            "trainer.logr=[file]",
            f"trainer.default_local_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=120,
    )
    assert result.returncode == 2
    assert "unknown config key 'trainer.logr'" in result.stderr and "trainer.logger" in result.stderr
    assert "Started a local Ray" not in result.stderr + result.stdout


def test_unknown_recipe_lists_the_recipes():
    with pytest.raises(ConfigError, match="built-in recipes: dapo, drgrpo, grpo"):
        train("grpp", [])
