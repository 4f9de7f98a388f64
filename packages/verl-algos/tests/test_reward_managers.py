"""Reward managers (naive, batch, dapo) on a DataProto decoded with a real tokenizer; loading of
custom reward functions and its errors; failures that are counted and never stop the run."""

from __future__ import annotations

import logging
import textwrap
import time

import numpy as np
import pytest
import torch

from verl.algos.rewards import REWARD_MANAGERS, RewardSetupError, build_reward_manager, load_reward_fn
from verl.algos.rewards.custom import load_custom_reward_function
from verl.core.protocol import DataProto


def make_batch(tokenizer, responses: list[str], truths: list, data_source="arithmetic", width: int = 16) -> DataProto:
    """Responses as the rollout returns them: token ids ending in EOS, right-padded to ``width``."""
    rows, masks = [], []
    for text in responses:
        ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]) if text else []
        assert len(ids) <= width, "test response too long for the batch width"
        rows.append(ids + [tokenizer.pad_token_id] * (width - len(ids)))
        masks.append([1] * len(ids) + [0] * (width - len(ids)))
    n = len(responses)
    non_tensor = {
        "data_source": np.array([data_source] * n, dtype=object),
        "reward_model": np.array([{"ground_truth": t, "style": "rule"} for t in truths], dtype=object),
        "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
    }
    prompts = torch.full((n, 4), tokenizer.pad_token_id)
    attention = torch.cat([torch.ones(n, 4, dtype=torch.long), torch.tensor(masks)], dim=1)
    return DataProto.from_dict(
        {
            "prompts": prompts,
            "responses": torch.tensor(rows),
            "response_mask": torch.tensor(masks),
            "attention_mask": attention,
        },
        non_tensor,
    )


def test_naive_scores_on_the_last_valid_token(tokenizer):
    data = make_batch(tokenizer, ["12 + 7 = 19.", "The answer is 20", ""], ["19", "19", "19"])
    result = build_reward_manager("naive", tokenizer)(data)
    scores = result.reward_tensor
    lengths = data.batch["response_mask"].sum(-1)
    assert scores[0, lengths[0] - 1] == 1.0 and scores[0].sum() == 1.0
    assert scores[1].sum() == 0.0
    assert scores[2].sum() == 0.0, "an empty response scores 0 (on position 0)"
    assert result.extra_info["score"] == [1.0, 0.0, 0.0]
    assert result.metrics["reward/errors"] == 0.0
    result.apply_to(data)
    assert torch.equal(data.batch["token_level_scores"], scores)
    assert list(data.non_tensor_batch["score"]) == [1.0, 0.0, 0.0]


def test_response_mask_may_come_from_attention_mask(tokenizer):
    data = make_batch(tokenizer, ["so 19", "so 18"], ["19", "19"])
    data.batch.pop("response_mask")
    result = build_reward_manager("naive", tokenizer)(data)
    assert result.reward_tensor.sum(-1).tolist() == [1.0, 0.0]


def test_dict_rewards_carry_extra_metrics(tokenizer):
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        right = solution_str.strip().endswith(str(ground_truth))
        return {"score": 1.0 if right else -1.0, "acc": right, "index": extra_info["index"]}

    data = make_batch(tokenizer, ["so 19", "so 18"], ["19", "19"])
    result = build_reward_manager("naive", tokenizer, compute_score=compute_score)(data)
    assert result.reward_tensor.sum(-1).tolist() == [1.0, -1.0]
    assert result.extra_info == {"score": [1.0, -1.0], "acc": [True, False], "index": [0, 1]}


def test_an_agent_loops_rows_give_the_score_function_their_tool_and_turn_rewards(tokenizer):
    """What an agent loop adds per row reaches ``extra_info`` under verl's names, next to the row's own keys."""
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(extra_info)
        return extra_info["turn_scores"][-1] if extra_info["turn_scores"] else extra_info["tool_reward"]

    data = make_batch(tokenizer, ["so 19", "so 18"], ["19", "19"])
    for key, values in {"tool_reward": [0.0, -0.05], "turn_scores": [[0.0, 1.0], []], "__num_turns__": [5, 2]}.items():
        data.non_tensor_batch[key] = np.empty(2, dtype=object)
        data.non_tensor_batch[key][:] = values
    result = build_reward_manager("naive", tokenizer, compute_score=compute_score)(data)
    assert result.reward_tensor.sum(-1).tolist() == pytest.approx([1.0, -0.05])
    assert seen == [
        {"index": 0, "tool_reward": 0.0, "turn_scores": [0.0, 1.0], "num_turns": 5},
        {"index": 1, "tool_reward": -0.05, "turn_scores": [], "num_turns": 2},
    ]
    assert "turn_scores" not in data.non_tensor_batch["extra_info"][0], "the row's own extra_info is not changed"


def test_a_raising_reward_scores_zero_is_counted_and_logs_one_traceback(tokenizer, caplog):
    def flaky(data_source, solution_str, ground_truth, extra_info=None):
        if "boom" in solution_str:
            raise RuntimeError("grader crashed")
        return 1.0

    manager = build_reward_manager("naive", tokenizer, compute_score=flaky)
    data = make_batch(tokenizer, ["19", "boom", "19", "boom"], ["19"] * 4)
    with caplog.at_level(logging.WARNING, logger="verl.algos.rewards"):
        first = manager(data)
        second = manager(data)
    assert first.reward_tensor.sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert first.metrics["reward/errors"] == 2.0 and second.metrics["reward/errors"] == 2.0
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and "grader crashed" in str(tracebacks[0].exc_info[1])
    assert "flaky" in tracebacks[0].getMessage()


@pytest.mark.parametrize("bad", ["19", None, [1.0], {"acc": 1.0}, float("nan")])
def test_a_non_number_reward_is_a_clear_error(tokenizer, bad):
    def returns_bad(data_source, solution_str, ground_truth, extra_info=None):
        return bad

    manager = build_reward_manager("naive", tokenizer, compute_score=returns_bad)
    with pytest.raises(RewardSetupError, match="returns_bad") as err:
        manager(make_batch(tokenizer, ["19"], ["19"]))
    assert "score" in str(err.value) or "NaN" in str(err.value)


def test_numpy_and_tensor_scores_are_numbers(tokenizer):
    for value in (np.float32(1.0), torch.tensor(1.0), True, 1):
        manager = build_reward_manager("naive", tokenizer, compute_score=lambda value=value, **kw: value)
        assert manager(make_batch(tokenizer, ["x"], ["1"])).reward_tensor.sum() == 1.0


def test_unknown_data_source_stops_the_run(tokenizer):
    with pytest.raises(RewardSetupError, match="my/source"):
        build_reward_manager("naive", tokenizer)(make_batch(tokenizer, ["19"], ["19"], data_source="my/source"))


def test_a_reward_function_with_the_wrong_parameters_fails_at_setup(tokenizer):
    def wrong(source, text, answer):
        return 1.0

    with pytest.raises(RewardSetupError, match="solution_str"):
        build_reward_manager("naive", tokenizer, compute_score=wrong)


def test_batch_manager_calls_once_and_isolates_failing_samples(tokenizer):
    calls = []

    def batched(data_sources, solution_strs, ground_truths, extra_infos):
        calls.append(len(solution_strs))
        if len(solution_strs) > 1 and any("boom" in s for s in solution_strs):
            raise RuntimeError("one bad sample spoils the batch call")
        if "boom" in solution_strs[0]:
            raise RuntimeError("bad sample")
        return [1.0 if s.strip().endswith(str(t)) else 0.0 for s, t in zip(solution_strs, ground_truths)]

    manager = build_reward_manager("batch", tokenizer, compute_score=batched)
    ok = manager(make_batch(tokenizer, ["so 19", "so 18"], ["19", "19"]))
    assert calls == [2] and ok.reward_tensor.sum(-1).tolist() == [1.0, 0.0]
    mixed = manager(make_batch(tokenizer, ["so 19", "boom", "so 7"], ["19", "19", "7"]))
    assert mixed.reward_tensor.sum(-1).tolist() == [1.0, 0.0, 1.0]
    assert mixed.metrics["reward/errors"] == 1.0


def test_batch_manager_default_uses_the_built_in_scorers(tokenizer):
    result = build_reward_manager("batch", tokenizer)(make_batch(tokenizer, ["19", "18"], ["19", "19"]))
    assert result.reward_tensor.sum(-1).tolist() == [1.0, 0.0]


def test_dapo_overlong_penalty(tokenizer):
    manager = build_reward_manager(
        "dapo",
        tokenizer,
        max_resp_len=16,
        overlong_buffer={"enable": True, "len": 8, "penalty_factor": 1.0},
    )
    short, long_text = "19", "12 + 7 = 19. The answer is 19"
    data = make_batch(tokenizer, [short, long_text], ["19", "19"])
    lengths = data.batch["response_mask"].sum(-1).tolist()
    assert lengths[0] <= 8 < lengths[1], "one response inside and one in the overlong buffer"
    result = manager(data)
    expected_penalty = min(-(lengths[1] - 8) / 8 * 1.0, 0.0)
    assert result.reward_tensor.sum(-1).tolist() == pytest.approx([1.0, 1.0 + expected_penalty])
    assert result.extra_info["overlong"] == [False, True]
    assert result.extra_info["overlong_reward"][1] == pytest.approx(expected_penalty)
    assert result.extra_info["score"] == [1.0, 1.0]
    assert result.metrics["reward/overlong_ratio"] == 0.5


def test_dapo_overlong_needs_the_response_length(tokenizer):
    with pytest.raises(ValueError, match="max_resp_len"):
        build_reward_manager("dapo", tokenizer, overlong_buffer={"enable": True, "len": 4})


def test_a_reward_call_past_its_timeout_scores_zero(tokenizer):
    def slow(data_source, solution_str, ground_truth, extra_info=None):
        if "slow" in solution_str:
            time.sleep(1.0)
        return 1.0

    manager = build_reward_manager("naive", tokenizer, compute_score=slow, timeout_s=0.2)
    result = manager(make_batch(tokenizer, ["19", "slow"], ["19", "19"]))
    assert result.reward_tensor.sum(-1).tolist() == [1.0, 0.0]
    assert result.metrics["reward/timeouts"] == 1.0 and result.metrics["reward/errors"] == 1.0


def test_managers_are_registered_by_verl_names():
    assert {"naive", "batch", "dapo"} <= set(REWARD_MANAGERS.names())


# ---------------------------------------------------------------- custom reward functions


def write(tmp_path, name: str, source: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_custom_reward_function_is_loaded_with_its_kwargs(tmp_path, tokenizer):
    path = write(
        tmp_path,
        "my_reward.py",
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
            return float(solution_str.strip() == ground_truth) + bonus

        def other(data_source, solution_str, ground_truth, extra_info=None):
            return 0.25
        """,
    )
    fn = load_reward_fn({"path": str(path), "name": "compute_score", "reward_kwargs": {"bonus": 0.5}})
    assert fn("x", "19", "19") == 1.5
    assert load_reward_fn({"path": str(path), "name": "other"})("x", "a", "b") == 0.25
    assert load_reward_fn({"path": None}) is None
    manager = build_reward_manager("naive", tokenizer, compute_score=fn)
    assert manager(make_batch(tokenizer, ["19"], ["19"], data_source="my/private")).reward_tensor.sum() == 1.5


def test_custom_reward_file_missing(tmp_path):
    with pytest.raises(RewardSetupError, match="does not exist") as err:
        load_custom_reward_function(tmp_path / "nope.py")
    assert "nope.py" in str(err.value)


def test_custom_reward_function_missing_lists_what_is_there(tmp_path):
    path = write(
        tmp_path, "r.py", "def score_it(data_source, solution_str, ground_truth, extra_info=None):\n    return 1\n"
    )
    with pytest.raises(RewardSetupError, match="'compute_score' is not defined") as err:
        load_custom_reward_function(path)
    assert "score_it" in str(err.value)


def test_custom_reward_not_callable(tmp_path):
    path = write(tmp_path, "r.py", "compute_score = 3\n")
    with pytest.raises(RewardSetupError, match="not a function"):
        load_custom_reward_function(path)


def test_custom_reward_file_that_fails_to_import(tmp_path):
    path = write(tmp_path, "r.py", "def compute_score(:\n")
    with pytest.raises(RewardSetupError, match="failed to import") as err:
        load_custom_reward_function(path)
    assert "SyntaxError" in str(err.value)
