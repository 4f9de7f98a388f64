"""The trainer's side of the code reward's verdict (code_judge.py), checked against Python itself: for
honest programs, splitting an assert into probes (run through the harness's encoding) and evaluating
the rest in the trainer gives the verdict the assert gives when run in-process."""

from __future__ import annotations

import json
import random

import pytest

from verl.algos.rewards.code_harness import MARKER, encode
from verl.algos.rewards.code_judge import JudgeError, decode, evaluate, plan_assert_case, read_records

PROGRAM = """
import math
def square(x):
    return x * x
def pairs(n):
    return [(i, i + 1) for i in range(n)]
def uniq(xs):
    return set(xs)
def table(n):
    return {i: str(i) for i in range(n)}
def half(x):
    return x / 2
def is_even(n):
    return n % 2 == 0
class Solution:
    def twice(self, s):
        return s + s
"""

ASSERTS = [
    "assert square({a}) == {b}",
    "assert square({a}) != {b}",
    "assert pairs({n}) == [(i, i + 1) for i in range({n})]",
    "assert pairs({n}) == {list_literal}",
    "assert uniq([{a}, {a}, {b}]) == {{{a}, {b}}}",
    "assert table({n}) == {dict_literal}",
    "assert abs(half({a}) - {a} / 2) < 1e-9",
    "assert math.isclose(half({a}), {b} / 2)",
    "assert is_even({a}) and not is_even({a} + 1)",
    "assert is_even({a}) or is_even({b})",
    "assert len(pairs({n})) == {n}",
    "assert sorted(uniq([{b}, {a}])) == sorted([{a}, {b}])",
    "assert pairs({n})[0] == (0, 1) if {n} else True",
    "s = Solution()\nassert s.twice('ab') == 'abab'",
    "assert square({a}) in ({b}, {a} * {a})",
    "assert square({a}) > {b} >= 0",
]


def run_in_process(test: str) -> bool:
    namespace: dict = {}
    exec(PROGRAM, namespace)
    try:
        exec(test, namespace)
    except AssertionError:
        return False
    return True


def run_split(test: str) -> bool:
    """The judge's way: the probes evaluated (and encoded/decoded) as the harness does, the rest here."""
    plan = plan_assert_case(test, 0)
    namespace: dict = {}
    exec(PROGRAM, namespace)
    values = {}
    for index, step in enumerate(plan.steps):
        if "exec" in step:
            exec(step["exec"], namespace)
        else:
            values[index] = decode(json.loads(json.dumps(encode(eval(step["probe"], namespace)))))
    return all(evaluate(check, values) for check in plan.checks)


@pytest.mark.parametrize("seed", range(20))
def test_the_split_verdict_equals_pythons_own_on_random_cases(seed):
    rng = random.Random(seed)
    for template in ASSERTS:
        a, b, n = rng.randint(-6, 6), rng.randint(-40, 40), rng.randint(0, 4)
        truth_pairs = [(i, i + 1) for i in range(n)]
        if rng.random() < 0.5 and truth_pairs:
            truth_pairs[-1] = (n, n)  # a wrong expectation half of the time
        table = {i: str(i) for i in range(n)}
        if rng.random() < 0.5:
            table[n] = "extra"
        test = template.format(a=a, b=b, n=n, list_literal=repr(truth_pairs), dict_literal=repr(table))
        assert run_split(test) == run_in_process(test), test


def test_the_expected_value_stays_in_the_trainer():
    plan = plan_assert_case("assert square(3) == 9", 0)
    assert plan.steps == [{"probe": "square(3)"}]
    assert "9" not in json.dumps(plan.steps)


@pytest.mark.parametrize(
    "test",
    ["for x in range(3):\n    assert square(x) == x * x", "def check(f):\n    assert f(2) == 4\ncheck(square)"],
)
def test_asserts_inside_blocks_are_refused_with_a_clear_error(test):
    with pytest.raises(ValueError, match="top-level"):
        plan_assert_case(test, 4)


VALUES = [None, True, 3, 2**20000, -1.5, float("inf"), 1 + 2j, "é", b"\x00", [1, (2, 3)], {4, 5}, {"k": [1]}]


@pytest.mark.parametrize("value", VALUES, ids=[type(v).__name__ + str(i) for i, v in enumerate(VALUES)])
def test_values_survive_the_record_encoding(value):
    assert decode(json.loads(json.dumps(encode(value)))) == value
    assert type(decode(json.loads(json.dumps(encode(value))))) is type(value)


def test_objects_the_trainer_cannot_compare_are_refused_by_the_harness():
    class Anything:
        def __eq__(self, other):
            return True

    with pytest.raises(TypeError, match="cannot compare outside the program"):
        encode(Anything())
    with pytest.raises(ValueError, match="nested"):
        nested: list = []
        for _ in range(200):
            nested = [nested]
        encode(nested)


def test_records_that_the_harness_did_not_write_are_ignored():
    stdout = f'hello\n{MARKER}not json\n{MARKER}["value", 0, {{"t": "oops"}}]\n{MARKER}["ran"]\nworld\n'
    records = read_records(stdout)
    assert records.ran and records.values == {} and records.output == "hello\nworld\n"
    with pytest.raises(JudgeError):
        decode({"weird": 1})


def test_the_evaluator_refuses_to_build_huge_values():
    plan = plan_assert_case("assert square(2) * 10**9 == 0", 0)
    with pytest.raises(JudgeError):
        evaluate(plan.checks[0], {0: [1] * 100})
