"""The fully asynchronous schedule (``async_training.mode=fully_async``): its config rules; with no room for
staleness it is synchronous training, step for step; with room, the rollout runs ahead within its bound,
pushes interrupt generation, and checkpoints keep the data position of what was trained."""

from __future__ import annotations

import pytest
from cli_runs import comparable, tiny_overrides, write_reward

from verl.algos.async_training.config import apply_verl_async_sizes
from verl.algos.config import load_config
from verl.algos.config.consistency import check_consistency
from verl.algos.run import checkpoint_layout as layout
from verl.algos.tracking import read_metrics
from verl.algos.trainer.main import run
from verl.core.config import ConfigError

APART = ["trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1"]


def test_the_recipe_is_a_valid_fully_async_run():
    cfg = load_config("grpo_async", [])
    check_consistency(cfg)
    assert cfg.async_training.mode == "fully_async" and not cfg.actor_rollout_ref.hybrid_engine


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["actor_rollout_ref.hybrid_engine=true"], r"needs the rollout on a pool of its own"),
        (["data.train_batch_size=4"], r"trains async_training.require_batches x .* = 1 x 2 = 2 prompts per step"),
        (
            ["actor_rollout_ref.rollout.multi_turn.enable=true"],
            r"partial_rollout=true continues single responses .* set async_training.partial_rollout=false",
        ),
        (["async_training.staleness_threshold=-1"], r"async_training.staleness_threshold=-1.0 must be >= 0"),
    ],
)
def test_what_fully_async_cannot_do_is_refused_before_ray_starts(overrides, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        check_consistency(load_config("grpo_async", overrides))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # verl's fully async scripts: train_batch_size 0 is the step's prompts; the rollout's totals size the run
        (
            ["data.train_batch_size=0", "async_training.require_batches=3", "rollout.total_rollout_steps=40"],
            {"train_batch_size": 6, "total_training_steps": 6, "test_freq": 10, "total_epochs": 1},
        ),
        (
            ["rollout.test_freq=3", "rollout.total_epochs=2", "trainer.total_epochs=5"],
            # trainer.total_epochs named: the run lasts its epochs (capped by the rollout's), as in verl
            {"train_batch_size": 2, "total_training_steps": None, "test_freq": 6, "total_epochs": 2},
        ),
        (["rollout.test_freq=-1", "rollout.total_rollout_steps=1000"], {"total_training_steps": 20, "test_freq": -1}),
        (["async_training.mode=one_step_off", "rollout.test_freq=3"], {"test_freq": 3}),  # a push per step
    ],
)
def test_verls_rollout_side_sizes_become_the_trainers(overrides, expected):
    cfg = load_config("grpo_async", overrides)
    resolved = {**vars(cfg.data), **vars(cfg.trainer)}
    assert {key: resolved[key] for key in expected} == expected
    apply_verl_async_sizes(cfg)  # as when the run's saved config is loaded again: nothing changes
    assert {**vars(cfg.data), **vars(cfg.trainer)} == resolved


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["async_training.mode=sync", "data.train_batch_size=0"], r"data.train_batch_size=0 leaves the batch to"),
        (["rollout.total_rollout_steps=1"], r"rollout.total_rollout_steps=1 prompts do not fill one step"),
    ],
)
def test_rollout_side_sizes_that_cannot_apply_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("grpo_async", overrides)


def same_schedule(record: dict) -> dict:
    return {k: v for k, v in comparable(record).items() if not k.startswith(("weight_sync/", "async/"))}


@pytest.mark.slow
def test_without_room_for_staleness_it_is_synchronous_training(tiny_model_dir, tmp_path, ray_session):
    """staleness_threshold=0 and a push after every step: each batch is drawn only once the previous one has
    trained and its weights have arrived, as the synchronous trainer does with the same two pools."""
    reward = write_reward(tmp_path)
    common = ["trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false", *APART]
    no_room = [
        "async_training.staleness_threshold=0",
        "async_training.trigger_parameter_sync_step=1",
        "async_training.partial_rollout=false",
    ]
    runs = {}
    for name, extra in (("fully_async", no_room), ("sync", ["async_training.mode=sync"])):
        out = tmp_path / name
        run(load_config("grpo_async", tiny_overrides(tiny_model_dir, out, reward, 3, *common, *extra)))
        runs[name] = read_metrics(str(out))
    mine, theirs = runs["fully_async"], runs["sync"]
    assert [r["step"] for r in mine] == [r["step"] for r in theirs] == [1, 2, 3]
    for record, expected in zip(mine, theirs):
        assert same_schedule(record) == same_schedule(expected)
        assert record["async/staleness_max"] == 0.0 and record["async/partial_ratio"] == 0.0


@pytest.mark.slow
def test_a_run_killed_while_the_rollout_ran_ahead_resumes_without_losing_or_repeating_a_batch(tiny_model_dir, tmp_path):
    """``verl train`` SIGKILLed after its step-2 checkpoint, with the rollout drawing ahead, then resumed:
    the steps the final weights went through (the killed run's up to its last checkpoint, the resumed run's
    after it) trained the data order's batches 0, 1, 2, ... once each. Room for 3 steps' worth of prompts
    per push (threshold 0.5, a push every 2 steps), partial rollouts of 4 tokens: samples lag by at most the
    bound, and each checkpoint holds the position after the batches trained, although the rollout had drawn
    further."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from cli_runs import launch, tail

    reward = write_reward(tmp_path)
    out = tmp_path / "run"
    steps = 6
    args = tiny_overrides(
        tiny_model_dir,
        out,
        reward,
        steps,
        "trainer.save_freq=2",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "data.max_response_length=24",
        "async_training.partial_rollout_tokens=4",
        *APART,
    )
    log = tmp_path / "killed.log"
    proc = launch(["-r", "grpo_async", *args], log)
    try:
        deadline = time.monotonic() + 300
        while layout.latest_complete(out) is None:
            assert proc.poll() is None, tail(log)
            assert time.monotonic() < deadline, tail(log)
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    kept = layout.step_of(layout.latest_complete(out))
    assert kept < steps, "the run finished before the kill: lengthen it"
    resumed = subprocess.run(
        [sys.executable, "-m", "verl.algos.cli", "train", "-r", "grpo_async", *args], capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {layout.step_dir(out, kept)} " in resumed.stderr
    # one record per step, a re-run step's from the resumed run: the steps the final weights went through
    records = read_metrics(str(out))
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert [r["async/data_batch"] for r in records] == [float(i) for i in range(steps)]
    for r in records:
        assert 0.0 <= r["async/staleness_max"] <= 2 + 3  # pushes every 2 steps, 3 steps' worth drawn at most
        assert 0.0 <= r["async/partial_ratio"] <= 1.0
    assert any(r["async/staleness_max"] > 0 for r in records), "the rollout never ran ahead of training"
    # (whether a finished batch already waited in the queue depends on the two cores' timing: not asserted)
    for step in (2, 4, 6):
        state = layout.read_trainer_state(layout.step_dir(out, step))
        assert state["batch_order"] == {"epoch": 0, "batch_in_epoch": step}


@pytest.mark.slow
def test_a_reward_that_breaks_in_the_rollouter_stops_the_run_as_the_sync_trainer_does(
    tiny_model_dir, tmp_path, ray_session
):
    """The rollouter scores step 3's samples ahead of time; its reward raises on all of them. The run stops
    when step 3 takes them, with the reward's own error, after step 2 trained and saved."""
    from verl.algos.rewards import RewardFunctionError

    reward = tmp_path / "breaks.py"
    # 2 prompts x 2 samples per step: calls 9.. are step 3's
    reward.write_text(
        "import itertools\n"
        "calls = itertools.count(1)\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if next(calls) > 8:\n"
        "        raise RuntimeError('grader bug')\n"
        "    return float(len(solution_str) % 3) / 2.0\n"
    )
    out = tmp_path / "run"
    overrides = tiny_overrides(
        tiny_model_dir, out, reward, 4, "trainer.save_freq=1", "trainer.test_freq=-1", "trainer.val_before_train=false"
    )
    with pytest.raises(RewardFunctionError, match="RuntimeError: grader bug"):
        run(load_config("grpo_async", [*overrides, *APART, "async_training.partial_rollout=false"]))
    assert layout.latest_complete(out) == layout.step_dir(out, 2), "the last complete checkpoint is kept"
    assert [r["step"] for r in read_metrics(str(out))] == [1, 2]
