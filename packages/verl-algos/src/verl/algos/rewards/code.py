"""The ``code`` reward: run the model's program against the row's test cases, in the sandbox.

Data (verl's convention for codecontests / apps / taco / codeforces, as in its prime and sandbox-fusion
code rewards): ``reward_model.ground_truth`` is a JSON string (or a dict) with

- ``inputs`` and ``outputs``: equal-length lists; test i feeds ``inputs[i]`` on standard input and
  expects ``outputs[i]`` on standard output (None: any output, the program only has to exit cleanly);
- ``assert_case`` (optional): a list as long as ``inputs`` of test code (``assert f(2) == 4``) run
  after the program for test i; with only ``assert_case``, ``inputs``/``outputs`` may be left out.
  Each top-level ``assert`` is split (:mod:`.code_judge`): what needs the program (``f(2)``) runs in
  the sandbox, the comparison (``== 4``) in the trainer; asserts inside blocks are refused;
- ``fn_name`` (optional, APPS/LeetCode "call-based" problems): test i calls the function ``fn_name``
  (or the method of a ``Solution()`` instance) with the arguments ``inputs[i]`` (a list, or JSON text
  with one argument per line) and compares its return value with ``outputs[i]`` (also accepted
  wrapped in a one-element list, as APPS stores them).

The verdict never rests on the program's exit status alone: the program runs under a harness
(:mod:`.code_harness`) that reports values, and the trainer compares them with expectations the
program never sees, so rewriting the exit path, patching builtins or printing fake results scores 0.

The program is the last ```python fenced block of the completion, else the last ``` block, else the
whole completion. Outputs match when their whitespace-separated tokens are equal (trailing spaces and
newlines do not matter).

Score (verl's ``default_compute_score`` for these sources, ``continuous=True``): the fraction of the
first ``max_tests`` (10) test cases that pass; ``all_or_nothing=True`` gives 1 only when all of them
pass. A program that fails in any way (syntax error, exception, timeout, memory, killed, too much
output) fails that test; after a timeout the remaining tests are not run and fail too (each would
cost a full time limit). The result is a dict: ``score``, ``acc`` (1.0 when every test passed),
``tests_passed``, ``tests_total``, ``code_status`` (``passed`` or the first failure's kind:
``wrong_answer``, ``timeout``, ``memory``, ``runtime_error``, ``killed``, ``output_limit``) and
``code_error`` (what went wrong, "" when all passed). A malformed ground truth raises ValueError (the
reward manager scores that row 0 and counts it in ``reward/errors``); a machine that cannot sandbox
raises :class:`~verl.algos.rewards.sandbox.SandboxUnavailableError` and stops the run.

To change the limits, point ``custom_reward_function.path`` at a file with
``compute_score = CodeReward(SandboxLimits(cpu_time_s=2), max_workers=8)``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl.algos.rewards import code_harness
from verl.algos.rewards.code_judge import JudgeError, TestPlan, evaluate, plan_assert_case, plan_call, read_records
from verl.algos.rewards.registry import REWARD_SCORERS
from verl.algos.rewards.sandbox import (
    Isolation,
    RunResult,
    RunStatus,
    Sandbox,
    SandboxLimits,
    SandboxUnavailableError,
)

logger = logging.getLogger(__name__)

#: verl's code data sources, plus a generic one.
CODE_DATA_SOURCES = ("codecontests", "apps", "taco", "codeforces", "code")

_PYTHON_BLOCK = re.compile(r"```(?:python|py|python3)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_ANY_BLOCK = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)
_HARNESS_SOURCE = Path(code_harness.__file__).read_text(encoding="utf-8")


def extract_program(completion: str) -> str:
    """The last ```python block, else the last ``` block, else the whole completion."""
    for pattern in (_PYTHON_BLOCK, _ANY_BLOCK):
        blocks = pattern.findall(completion)
        if blocks:
            return blocks[-1]
    return completion


@dataclass
class CodeTest:
    stdin: str
    expected: Any  # str for stdin/stdout tests, a value for call-based ones, None: no check
    plan: TestPlan = field(default_factory=TestPlan)  # what the harness runs after the program
    call_based: bool = False  # ``expected`` is the return value of the plan's one call


@dataclass
class CodeTestOutcome:
    passed: bool
    status: str  # passed, wrong_answer, or a RunStatus value other than completed
    reason: str


def parse_tests(ground_truth: Any) -> tuple[list[CodeTest], str | None]:
    """The test cases of a row and its ``fn_name`` (None for stdin/stdout problems)."""
    spec = ground_truth
    if isinstance(spec, (str, bytes)):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ValueError(f"code reward: ground_truth is not valid JSON ({e}); {_FORMAT}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"code reward: ground_truth must be a JSON object, got {type(spec).__name__}; {_FORMAT}")
    asserts = spec.get("assert_case")
    if asserts is not None and not isinstance(asserts, list):
        raise ValueError(f"code reward: ground_truth 'assert_case' must be a list; {_FORMAT}")
    count = len(asserts) if asserts is not None else None
    inputs = spec.get("inputs", [""] * count if count is not None else None)
    outputs = spec.get("outputs", [None] * count if count is not None else None)
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError(f"code reward: ground_truth needs 'inputs' and 'outputs' lists; {_FORMAT}")
    if len(inputs) != len(outputs) or (count is not None and count != len(inputs)):
        raise ValueError(
            f"code reward: ground_truth has {len(inputs)} inputs, {len(outputs)} outputs"
            + (f" and {count} assert cases" if count is not None else "")
            + "; they must be as many"
        )
    if not inputs:
        raise ValueError(f"code reward: ground_truth has no test cases; {_FORMAT}")
    fn_name = spec.get("fn_name") or None
    cases = []
    for i, (stdin, expected) in enumerate(zip(inputs, outputs)):
        if asserts and asserts[i]:
            # The asserts decide; with fn_name (KodCode), the function is called by the asserts.
            plan = plan_assert_case(str(asserts[i]), i)
            text = "\n".join(map(str, stdin)) if isinstance(stdin, list) else ("" if stdin is None else str(stdin))
            want = (
                None
                if fn_name or expected is None
                else "\n".join(map(str, expected))
                if isinstance(expected, list)
                else str(expected)
            )
            cases.append(CodeTest(text, want, plan))
        elif fn_name:
            try:
                args = stdin if isinstance(stdin, list) else [json.loads(s) for s in str(stdin).splitlines() if s]
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"code reward: input {i} of fn_name={fn_name!r} must be a list of arguments or JSON text with one "
                    f"argument per line ({e})"
                ) from None
            cases.append(CodeTest("", expected, plan_call(fn_name, args), call_based=True))
        else:
            text = "\n".join(map(str, stdin)) if isinstance(stdin, list) else ("" if stdin is None else str(stdin))
            want = "\n".join(map(str, expected)) if isinstance(expected, list) else expected
            cases.append(CodeTest(text, None if want is None else str(want)))
    return cases, fn_name


_FORMAT = (
    'expected {"inputs": [stdin, ...], "outputs": [expected stdout, ...]} with optional "fn_name" and '
    '"assert_case" (verl\'s code dataset convention)'
)


def outputs_match(actual: str, expected: str) -> bool:
    return actual.split() == expected.split()


def harnessed(program: str, plan: TestPlan) -> str:
    """The source the sandbox runs: the harness (:mod:`.code_harness`), then the call of its
    ``main`` with the model's program and the test's steps (as literals)."""
    spec = json.dumps({"steps": plan.steps})
    return f"{_HARNESS_SOURCE}\n\nmain({program!r}, json.loads({spec!r}))\n"


class CodeReward:
    """The code reward with verl's signature ``(data_source, solution_str, ground_truth, extra_info=None)``.

    ``limits`` and ``isolation`` configure the sandbox each test runs in; ``max_workers`` bounds how
    many programs run at once (the tests of concurrent calls share the pool); ``max_tests`` how many
    test cases of a row are run (None: all)."""

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        isolation: Isolation | None = None,
        python: str | None = None,
        max_workers: int = 2,
        max_tests: int | None = 10,
        all_or_nothing: bool = False,
    ):
        if max_workers < 1:
            raise ValueError(f"CodeReward(max_workers={max_workers}) must be at least 1")
        if max_tests is not None and max_tests < 1:
            raise ValueError(f"CodeReward(max_tests={max_tests}) must be at least 1 (or None for all)")
        self.sandbox = Sandbox(limits, isolation, python)
        self.max_workers = max_workers
        self.max_tests = max_tests
        self.all_or_nothing = all_or_nothing
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict:
        return self.score(solution_str, ground_truth)

    def score(self, solution_str: str, ground_truth: Any) -> dict[str, Any]:
        cases, fn_name = parse_tests(ground_truth)
        if self.max_tests is not None:
            cases = cases[: self.max_tests]
        self.sandbox.check()  # once: a machine that cannot sandbox stops the run here, clearly
        program = extract_program(solution_str)
        outcomes = self._run_all(program, cases, fn_name)
        passed = sum(o.passed for o in outcomes)
        first_failure = next((o for o in outcomes if not o.passed), None)
        all_passed = first_failure is None
        if self.all_or_nothing:
            score = 1.0 if all_passed else 0.0
        else:
            score = passed / len(cases)
        return {
            "score": score,
            "acc": 1.0 if all_passed else 0.0,
            "tests_passed": passed,
            "tests_total": len(cases),
            "code_status": "passed" if all_passed else first_failure.status,
            "code_error": "" if all_passed else first_failure.reason,
        }

    # -- running the tests --------------------------------------------------------------------------
    @property
    def pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="verl-code-reward")
            return self._pool

    def _run_all(self, program: str, cases: list[CodeTest], fn_name: str | None) -> list[CodeTestOutcome]:
        """Run the cases, at most ``max_workers`` at a time, in order; stop starting new ones once
        the outcome is settled (a failure in all-or-nothing mode, a timeout in any mode): the cases
        not run fail."""
        outcomes: list[CodeTestOutcome | None] = [None] * len(cases)
        waiting = list(range(len(cases)))
        running: dict[Future, int] = {}
        stop: tuple[int, CodeTestOutcome] | None = None
        while waiting or running:
            while waiting and stop is None and len(running) < self.max_workers:
                i = waiting.pop(0)
                running[self.pool.submit(self._run_one, program, cases[i], fn_name)] = i
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                outcome = outcomes[i] = future.result()
                settled = self.all_or_nothing or outcome.status == RunStatus.TIMEOUT.value
                if not outcome.passed and settled and (stop is None or i < stop[0]):
                    stop = (i, outcome)
        for i in waiting:
            first, outcome = stop
            outcomes[i] = CodeTestOutcome(False, outcome.status, f"not run after test {first + 1}: {outcome.reason}")
        return outcomes

    def _run_one(self, program: str, case: CodeTest, fn_name: str | None) -> CodeTestOutcome:
        try:
            result = self.sandbox.run(harnessed(program, case.plan), case.stdin)
            return self._judge(result, case)
        except SandboxUnavailableError:
            raise
        except Exception as e:  # a failure of the judge itself: never a pass, never an escape from the reward
            logger.exception("code reward: judging a test failed; the test scores 0")
            return CodeTestOutcome(False, RunStatus.SANDBOX_ERROR.value, f"the judge failed: {type(e).__name__}: {e}")

    @staticmethod
    def _judge(result: RunResult, case: CodeTest) -> CodeTestOutcome:
        """The verdict, from the harness's records and values compared here (see :mod:`.code_judge`)."""
        records = read_records(result.stdout)
        if not result.ok:
            return CodeTestOutcome(False, result.status.value, result.reason)
        if records.error is not None:
            step, message = records.error
            return CodeTestOutcome(False, RunStatus.RUNTIME_ERROR.value, f"{message} (in {step})")
        if not records.ran:
            return CodeTestOutcome(
                False, RunStatus.RUNTIME_ERROR.value, "the program ended before its tests ran (it exited from within)"
            )
        missing = [i for i in case.plan.probes if i not in records.values]
        if missing:
            step = case.plan.steps[missing[0]]
            return CodeTestOutcome(
                False,
                RunStatus.RUNTIME_ERROR.value,
                f"the test step {step.get('probe') or step.get('call')!r} reported no value (the program ended it)",
            )
        if case.call_based:
            value = _as_json_like(records.values[case.plan.probes[0]])
            expected = case.expected
            if case.expected is not None and not (
                value == expected or (isinstance(expected, list) and len(expected) == 1 and value == expected[0])
            ):
                return CodeTestOutcome(
                    False, "wrong_answer", f"returned {json.dumps(value)[:200]}, expected {json.dumps(expected)[:200]}"
                )
        for check in case.plan.checks:
            try:
                holds = bool(evaluate(check, records.values))
            except (JudgeError, ArithmeticError, TypeError, ValueError, KeyError, IndexError) as e:
                return CodeTestOutcome(False, "wrong_answer", f"{check.source}: {type(e).__name__}: {e}"[:300])
            if not holds:
                return CodeTestOutcome(False, "wrong_answer", f"{check.source} does not hold"[:300])
        if case.expected is not None and not case.call_based and not outputs_match(records.output, case.expected):
            return CodeTestOutcome(
                False,
                "wrong_answer",
                f"printed {records.output.strip()[:200]!r}, expected {case.expected.strip()[:200]!r}",
            )
        return CodeTestOutcome(True, "passed", "")


def _as_json_like(value: Any) -> Any:
    """Tuples as lists, as the JSON of the dataset's expected values has them."""
    if isinstance(value, (list, tuple)):
        return [_as_json_like(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_json_like(v) for k, v in value.items()}
    return value


_default_reward: CodeReward | None = None
_default_lock = threading.Lock()


def default_code_reward() -> CodeReward:
    """The CodeReward that the code data sources use: the one given to :func:`set_default_code_reward`,
    else one with the default limits (built on first use)."""
    global _default_reward
    with _default_lock:
        if _default_reward is None:
            _default_reward = CodeReward()
        return _default_reward


def set_default_code_reward(reward: CodeReward | None) -> CodeReward | None:
    """Make ``reward`` the one the code data sources use in this process (None: back to the default
    limits); returns the previous one. An alternative to a ``custom_reward_function`` for a plugin or
    a script that wants other limits for the built-in dispatch."""
    global _default_reward
    with _default_lock:
        previous, _default_reward = _default_reward, reward
        return previous


@REWARD_SCORERS.register(data_source=list(CODE_DATA_SOURCES))
def score_code(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    return default_code_reward().score(solution_str, ground_truth)
