"""The ``code`` reward: programs extracted from completions run against verl-style test cases in the
real sandbox; hostile completions score 0 with the reason recorded, and a reward manager scoring a
batch full of them returns a score for every row."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import torch

from verl.algos.rewards import REWARD_SCORERS, build_reward_manager, default_compute_score
from verl.algos.rewards.code import (
    CODE_DATA_SOURCES,
    CodeReward,
    extract_program,
    parse_tests,
    score_code,
    set_default_code_reward,
)
from verl.algos.rewards.sandbox import SandboxLimits
from verl.core.protocol import DataProto

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the code sandbox is Linux-only")

LIMITS = SandboxLimits(cpu_time_s=1, wall_time_s=2, memory_mb=256, max_processes=6)

A_PLUS_B = json.dumps({"inputs": ["1 2\n", "10 20\n", "-5 5\n"], "outputs": ["3\n", "30\n", "0\n"]})
CORRECT = "Read two numbers and add them.\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
WRONG = "```python\na, b = map(int, input().split())\nprint(a * b)\n```"  # wrong on every test

HOSTILE = {
    "fork_bomb": "```python\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n```",
    "infinite_loop": "```python\nwhile True:\n    pass\n```",
    "large_allocation": "```python\nblob = bytearray(8 * 1024 ** 3)\nprint(3)\n```",
    "socket": "```python\nimport socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\nprint(3)\n```",
    "syntax_error": "```python\ndef broken(:\n```",
}


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    return CodeReward(LIMITS, max_workers=2)


@pytest.fixture
def builtin_code_reward(reward):
    """The built-in dispatch (data_source -> code reward) with the tests' short limits."""
    previous = set_default_code_reward(reward)
    yield reward
    set_default_code_reward(previous)


@pytest.fixture
def open_dir():
    path = tempfile.mkdtemp(prefix="verl-code-reward-test-")
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize(
    "completion,program",
    [
        ("Sure:\n```python\nprint(1)\n```\nDone.", "print(1)\n"),
        ("```python\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```", "print(2)\n"),  # the last block
        ("```py\nprint(3)\n```", "print(3)\n"),
        ("```\nprint(4)\n```", "print(4)\n"),  # an untagged block
        ("```python\nprint(5)\n", "print(5)\n"),  # cut off before the closing fence
        ("print(6)", "print(6)"),  # no block: the whole completion
    ],
)
def test_extract_program(completion, program):
    assert extract_program(completion) == program


def test_every_code_data_source_dispatches_to_the_code_reward():
    for source in CODE_DATA_SOURCES:
        assert REWARD_SCORERS.get(data_source=source) is score_code
    assert set(CODE_DATA_SOURCES) >= {"codecontests", "apps", "taco", "code"}


def test_a_correct_program_scores_1_and_a_wrong_one_0(reward):
    right = reward("codecontests", CORRECT, A_PLUS_B)
    assert right == {
        "score": 1.0,
        "acc": 1.0,
        "tests_passed": 3,
        "tests_total": 3,
        "code_status": "passed",
        "code_error": "",
    }
    wrong = reward("codecontests", WRONG, A_PLUS_B)
    assert wrong["score"] == 0.0 and wrong["acc"] == 0.0
    assert wrong["code_status"] == "wrong_answer" and "expected '3'" in wrong["code_error"]


def test_the_score_is_the_fraction_of_tests_passed_or_all_or_nothing():
    only_first = "```python\ninput()\nprint(3)\n```"  # right on the first test only
    assert CodeReward(LIMITS)("apps", only_first, A_PLUS_B)["score"] == pytest.approx(1 / 3)
    assert CodeReward(LIMITS, all_or_nothing=True)("apps", only_first, A_PLUS_B)["score"] == 0.0
    assert CodeReward(LIMITS, max_tests=1)("apps", only_first, A_PLUS_B)["score"] == 1.0  # verl scores the first N


def test_whitespace_differences_do_not_matter(reward):
    truth = {"inputs": [""], "outputs": ["1 2\n3\n"]}
    assert reward("code", "```python\nprint('1  2 ')\nprint(3)\nprint()\n```", truth)["score"] == 1.0


def test_call_based_problems_call_the_function_or_solution_method(reward):
    truth = json.dumps(
        {"fn_name": "twoSum", "inputs": [[[2, 7, 11, 15], 9], [[3, 3], 6]], "outputs": [[[0, 1]], [0, 1]]}
    )
    function = (
        "```python\ndef twoSum(nums, target):\n    seen = {}\n    for i, n in enumerate(nums):\n"
        "        if target - n in seen:\n            return [seen[target - n], i]\n        seen[n] = i\n```"
    )
    method = "```python\nclass Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n```"
    assert reward("apps", function, truth)["score"] == 1.0
    assert reward("apps", method, truth)["score"] == 1.0
    wrong = reward("apps", "```python\ndef twoSum(nums, target):\n    return (1, 0)\n```", truth)
    assert wrong["score"] == 0.0 and wrong["code_status"] == "wrong_answer"


def test_assert_style_test_code(reward):
    truth = {"assert_case": ["assert square(3) == 9", "assert square(-2) == 4", "assert square(0) == 1"]}
    result = reward("code", "```python\ndef square(x):\n    return x * x\n```", truth)
    assert result["tests_passed"] == 2 and result["tests_total"] == 3
    # The assert is evaluated by the trainer on the value square(0) reported, not inside the program.
    assert result["code_status"] == "wrong_answer" and "square(0) == 1 does not hold" in result["code_error"]


KODCODE_PROGRAM = """```python
def merge_intervals(intervals):
    intervals.sort(key=lambda x: x[0])
    merged = [intervals[0]]
    for current in intervals[1:]:
        last = merged[-1]
        if current[0] <= last[1]:
            merged[-1] = (last[0], max(last[1], current[1]))
        else:
            merged.append(current)
    return merged
```"""


def test_kodcode_asserts_with_fn_name_as_verl_tests_them(reward):
    """verl's sandbox-fusion test case (KodCode): fn_name plus assert_case, tuples in the expected values;
    the third assert expects a wrong value, so the program passes 2 of 3."""
    truth = {
        "fn_name": "merge_intervals",
        "assert_case": [
            "assert merge_intervals([(0, 1), (3, 5), (4, 7), (6, 8), (10, 12), (12, 14)]) == [(0, 1), (3, 8), (10, 14)]",
            "assert merge_intervals([(1, 2), (2, 3), (3, 4)]) == [(1, 4)]",
            "assert merge_intervals([(1, 2), (3, 4), (5, 6)]) == [(1, 2), (3, 4), (5, 5)]",
        ],
    }
    result = reward("code", KODCODE_PROGRAM, truth)
    assert (result["tests_passed"], result["tests_total"]) == (2, 3), result
    assert result["code_status"] == "wrong_answer" and "(5, 5)" in result["code_error"]


@pytest.mark.parametrize(
    "truth,message",
    [
        ("not json", "not valid JSON"),
        (json.dumps([1, 2]), "must be a JSON object"),
        (json.dumps({"inputs": ["1"], "outputs": []}), "1 inputs, 0 outputs"),
        (json.dumps({"inputs": [], "outputs": []}), "no test cases"),
    ],
)
def test_a_malformed_ground_truth_is_a_clear_error(truth, message):
    with pytest.raises(ValueError, match=message):
        parse_tests(truth)


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_programs_score_0_with_the_reason(reward, kind):
    truth = {"inputs": ["", ""], "outputs": ["3", "3"]}
    result = reward("code", HOSTILE[kind], truth)
    assert result["score"] == 0.0 and result["acc"] == 0.0
    expected_status = {
        "fork_bomb": "timeout",
        "infinite_loop": "timeout",
        "large_allocation": "memory",
        "socket": "runtime_error",
        "syntax_error": "runtime_error",
    }[kind]
    assert result["code_status"] == expected_status, result
    assert result["code_error"], "the reason is recorded"


def test_a_write_outside_its_directory_fails_and_scores_0(reward, open_dir):
    target = os.path.join(open_dir, "pwned.txt")
    completion = f"```python\nopen({target!r}, 'w').write('x')\nprint(3)\n```"
    result = reward("code", completion, {"inputs": [""], "outputs": ["3"]})
    assert result["score"] == 0.0 and "PermissionError" in result["code_error"]
    assert not os.path.exists(target)


def test_default_compute_score_runs_the_code_reward(builtin_code_reward):
    result = default_compute_score("taco", CORRECT, A_PLUS_B)
    assert result["score"] == 1.0 and result["code_status"] == "passed"


def make_batch(tokenizer, completions: list[str], truths: list, data_source: str) -> DataProto:
    """Responses as the rollout returns them: token ids ending in EOS, right-padded."""
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for text in completions]
    width = max(len(row) for row in ids)
    responses = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    n = len(completions)
    non_tensor = {
        "data_source": np.array([data_source] * n, dtype=object),
        "reward_model": np.array([{"ground_truth": t, "style": "rule"} for t in truths], dtype=object),
    }
    return DataProto.from_dict({"responses": responses, "response_mask": mask}, non_tensor)


@pytest.mark.parametrize("manager", ["naive", "batch"])
def test_a_batch_of_hostile_completions_gets_a_score_for_every_row(tokenizer, open_dir, manager, builtin_code_reward):
    """The trainer carries on: the built-in code reward through a reward manager, on a batch mixing
    correct, wrong and hostile programs, returns a score for every row and no reward errors."""
    escape = os.path.join(open_dir, "escaped.txt")
    completions = [
        CORRECT,
        WRONG,
        *HOSTILE.values(),
        f"```python\nopen({escape!r}, 'w').write('x')\n```",
        textwrap.dedent(
            """
            ```python
            import os, signal
            os.kill(os.getppid(), signal.SIGKILL)  # the sandbox's reaper: refused
            a, b = map(int, input().split())
            print(a + b)
            ```
            """
        ),
    ]
    data = make_batch(tokenizer, completions, [A_PLUS_B] * len(completions), "codecontests")
    result = build_reward_manager(manager, tokenizer)(data)
    scores = result.reward_tensor.sum(-1).tolist()
    assert scores[0] == 1.0
    assert scores[1:] == [0.0] * (len(completions) - 1)
    assert result.metrics["reward/errors"] == 0.0, "program failures are scores, not reward-function errors"
    statuses = result.extra_info["code_status"]
    assert statuses[0] == "passed" and statuses[1] == "wrong_answer"
    assert statuses[2:4] == ["timeout", "timeout"] and statuses[4] == "memory"
    assert all(status != "passed" for status in statuses[1:])
    assert not os.path.exists(escape)
