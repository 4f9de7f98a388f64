"""A run written the way verl's scripts write it: a single path for data.train_files / val_files (not a
list), verl's key names for our settings, verl's trainer.critic_warmup and model.override_config (real Ray, FSDP2, HF rollout)."""

from __future__ import annotations

import pandas as pd
import pytest
from algos_test_helpers import VARIED_REWARD

from verl.algos.config import load_config
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import run

pytestmark = pytest.mark.usefixtures("ray_session")


def write_rows(path, count: int) -> str:
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} plus 3?"}],
            "reward_model": {"style": "rule", "ground_truth": str(i + 3)},
            "extra_info": {"index": i},
        }
        for i in range(count)
    ]
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def test_single_path_data_files_and_critic_warmup(tiny_model_dir, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text(VARIED_REWARD)
    out = tmp_path / "run"
    cfg = load_config(
        "ppo",
        [
            f"data.train_files={write_rows(tmp_path / 'train.parquet', 8)}",  # one path, as verl's scripts give it
            f"data.val_files={write_rows(tmp_path / 'test.parquet', 4)}",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"trainer.default_local_dir={out}",
            f"custom_reward_function.path={reward}",
            "trainer.n_gpus_per_node=2",
            "trainer.total_training_steps=2",
            "trainer.critic_warmup=2",  # verl: the actor first updates at step critic_warmup
            "trainer.logger=[file]",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "data.train_batch_size=2",
            "data.max_response_length=8",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "critic.model.fsdp_config.param_offload=false",  # verl's critic keeps fsdp_config under model
            # verl's override_config reaches the actor and its rollout alike: their log-probs still agree
            "+actor_rollout_ref.model.override_config.rms_norm_eps=0.001",
        ],
    )
    assert cfg.data.train_files == [str(tmp_path / "train.parquet")]
    assert run(cfg)["steps"] == 2
    step1, step2 = read_metrics(str(out))
    assert "critic/vf_loss" in step1 and "actor/pg_loss" not in step1
    assert "critic/vf_loss" in step2 and "actor/pg_loss" in step2
    assert step2["training/rollout_log_prob_diff_max"] < 1e-3
