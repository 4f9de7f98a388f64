"""``verl train actor_rollout_ref.rollout.name=vllm`` as a user types it, with no KV cache setting: the
rollout sizes its CPU KV cache from the run's batch and lengths, and two GRPO steps finish."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm


def test_verl_train_with_the_vllm_rollout_needs_no_kv_cache_setting(qwen2_model, tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    out = tmp_path / "run"
    verl = Path(sys.executable).with_name("verl")  # the console script of this environment
    command = [
        str(verl),
        "train",
        f"actor_rollout_ref.model.path={qwen2_model}",
        "actor_rollout_ref.rollout.name=vllm",
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[console,file]",
        "trainer.test_freq=-1",
        "data.val_max_samples=4",
        "trainer.save_freq=-1",
        "data.train_batch_size=2",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=420, env=env, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    # the size chosen for this run, and how: the largest call is validation over 4 prompts (n=1) or
    # training, 2 prompts x n=2: 4 sequences of 72 tokens (1 block each), ceil(4 x 1.1) = 5 blocks + null
    assert "KV cache 0.4 MiB: 4 sequences (" in output, output[-6000:]
    assert "x 1 blocks of 128 tokens (max_model_len=72) +10% margin + 1 null block = 6 blocks x 512 B/token" in output
    assert "settings with no effect on cpu: gpu_memory_utilization=0.5" in output
    assert "needs an explicit KV cache size" not in output
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-2:] == [1, 2]
