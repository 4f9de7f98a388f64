"""Reward-function timeouts: a default exists, calls run in parallel, and a batch whose every call
hangs ends in about one timeout (then stops the run through the usual whole-batch failure), not one
timeout per sample."""

from __future__ import annotations

import threading
import time

import pytest
from test_reward_managers import make_batch

from verl.algos.config.schema import RewardModelConfig
from verl.algos.rewards import build_reward_manager
from verl.algos.rewards.failures import RewardFunctionError
from verl.algos.rewards.manager import DEFAULT_TIMEOUT_S
from verl.algos.rewards.parallel import DEFAULT_CONCURRENCY

TIMEOUT_S = 0.5
SAMPLES = 3 * DEFAULT_CONCURRENCY  # more samples than run at once: sequential would be 24 timeouts


@pytest.fixture
def release():
    """Set at the end of a test: the abandoned calls wake up and their threads end."""
    event = threading.Event()
    yield event
    event.set()


def test_timeout_s_has_a_default_which_the_managers_use(tokenizer):
    assert RewardModelConfig().timeout_s == DEFAULT_TIMEOUT_S == 300.0
    for name in ("naive", "dapo", "batch"):
        assert build_reward_manager(name, tokenizer).timeout_s == DEFAULT_TIMEOUT_S


def test_a_batch_whose_every_call_hangs_stops_in_about_one_timeout(tokenizer, release):
    def hangs(data_source, solution_str, ground_truth, extra_info=None):
        release.wait()
        return 1.0

    manager = build_reward_manager("naive", tokenizer, compute_score=hangs, timeout_s=TIMEOUT_S)
    start = time.monotonic()
    with pytest.raises(RewardFunctionError, match=f"ran past reward_model.timeout_s on all {SAMPLES} samples"):
        manager(make_batch(tokenizer, ["19"] * SAMPLES, ["19"] * SAMPLES))
    elapsed = time.monotonic() - start
    assert elapsed < 3 * TIMEOUT_S, f"{elapsed:.2f}s for {SAMPLES} hanging calls with a {TIMEOUT_S}s timeout"


def test_hanging_samples_score_0_and_the_others_are_scored(tokenizer, release):
    def half_hang(data_source, solution_str, ground_truth, extra_info=None):
        if extra_info["index"] % 2:
            release.wait()
        return 1.0

    manager = build_reward_manager("naive", tokenizer, compute_score=half_hang, timeout_s=TIMEOUT_S)
    start = time.monotonic()
    result = manager(make_batch(tokenizer, ["19"] * SAMPLES, ["19"] * SAMPLES))
    elapsed = time.monotonic() - start
    assert result.reward_tensor.sum(-1).tolist() == [1.0, 0.0] * (SAMPLES // 2)
    assert result.metrics["reward/timeouts"] == SAMPLES // 2 == result.metrics["reward/errors"]
    # 12 hanging calls, 8 at a time: two rounds of timeouts, not twelve.
    assert elapsed < 3 * TIMEOUT_S + 0.5, f"{elapsed:.2f}s"


def test_a_batched_function_that_hangs_stops_in_about_two_timeouts(tokenizer, release):
    def hangs(data_sources, solution_strs, ground_truths, extra_infos):
        release.wait()
        return [1.0] * len(data_sources)

    manager = build_reward_manager("batch", tokenizer, compute_score=hangs, timeout_s=TIMEOUT_S)
    start = time.monotonic()
    with pytest.raises(RewardFunctionError, match="ran past reward_model.timeout_s"):
        manager(make_batch(tokenizer, ["19"] * SAMPLES, ["19"] * SAMPLES))
    # The batch call, then each sample alone (all at once: one more timeout).
    assert time.monotonic() - start < 3 * TIMEOUT_S


def test_without_a_timeout_calls_run_one_by_one_in_the_callers_thread(tokenizer):
    threads = set()

    def record_thread(data_source, solution_str, ground_truth, extra_info=None):
        threads.add(threading.get_ident())
        return 1.0

    manager = build_reward_manager("naive", tokenizer, compute_score=record_thread, timeout_s=None)
    assert manager(make_batch(tokenizer, ["19"] * 4, ["19"] * 4)).reward_tensor.sum() == 4.0
    assert threads == {threading.get_ident()}


def test_a_configuration_error_inside_a_parallel_call_still_stops_the_run(tokenizer):
    def returns_none(data_source, solution_str, ground_truth, extra_info=None):
        return None

    manager = build_reward_manager("naive", tokenizer, compute_score=returns_none, timeout_s=TIMEOUT_S)
    with pytest.raises(Exception, match="returned None"):
        manager(make_batch(tokenizer, ["19"] * 3, ["19"] * 3))
