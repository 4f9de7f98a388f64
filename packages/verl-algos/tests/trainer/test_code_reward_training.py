"""A tiny real GRPO run on a jsonl dataset of code tasks (data_source "codecontests"), scored by the
built-in code reward: every completion the model writes runs in the sandbox, from inside the trainer
process with Ray and its workers up, and the run finishes its steps."""

from __future__ import annotations

import json
import sys

import pytest

from verl.algos.config import load_config
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import run

pytestmark = [
    pytest.mark.usefixtures("ray_session"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the code sandbox is Linux-only"),
]


def write_code_tasks(path, count: int = 8) -> str:
    """verl's schema: chat prompt, data_source, and the tests as JSON in reward_model.ground_truth."""
    with open(path, "w") as f:
        for i in range(count):
            tests = {"inputs": [f"{i} {i + 1}\n", "2 2\n"], "outputs": [f"{2 * i + 1}\n", "4\n"]}
            row = {
                "data_source": "codecontests",
                "prompt": [{"role": "user", "content": f"Task {i}: read two integers and print their sum."}],
                "ability": "code",
                "reward_model": {"style": "rule", "ground_truth": json.dumps(tests)},
                "extra_info": {"index": i},
            }
            f.write(json.dumps(row) + "\n")
    return str(path)


def test_grpo_with_the_code_reward_finishes_its_steps(tiny_model_dir, tmp_path):
    tasks = write_code_tasks(tmp_path / "code_tasks.jsonl")
    out = tmp_path / "run"
    overrides = [
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"trainer.default_local_dir={out}",
        f"data.train_files=[{tasks}]",
        f"data.val_files=[{tasks}]",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.logger=[file]",
        "data.train_batch_size=4",
        "data.max_response_length=16",
        "data.val_max_samples=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    ]
    summary = run(load_config("grpo", overrides))
    assert summary["steps"] == 2
    records = read_metrics(str(out))
    assert [r["step"] for r in records] == [0, 1, 2]
    assert "val/acc" in records[0] and "val/acc" in records[2]
    for record in records[1:]:
        # a random tiny model writes no working program: every sample ran, failed and scored 0, and
        # none of that was a reward-function error
        assert record["critic/score/mean"] == 0.0
        assert record["reward/errors"] == 0.0
