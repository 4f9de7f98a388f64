"""The arithmetic task of the embedded default run: "What is 12+7? Answer with a number."

Measured on SmolLM2-135M-Instruct (see the repository's CPU notes): with a plain user message, no
system prompt, a and b in 0..20 and the last integer of the completion as the answer, greedy
accuracy starts near 43% and GRPO lifts it above 80%: a real learning signal on a CPU. Subtraction
and three-term sums start much lower (<=11%) and make harder settings.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

from verl.algos.data.splits import split_by_key, task_rows

DATA_SOURCE = "arithmetic"
OPERATIONS = ("+", "-", "*")
_ENUMERATE_LIMIT = 200_000


@dataclass(frozen=True)
class ArithmeticProblem:
    operands: tuple[int, ...]
    ops: tuple[str, ...]

    @property
    def expression(self) -> str:
        parts = [str(self.operands[0])]
        for op, value in zip(self.ops, self.operands[1:]):
            parts += [op, str(value)]
        return "".join(parts)

    @property
    def question(self) -> str:
        return f"What is {self.expression}? Answer with a number."

    @property
    def answer(self) -> int:
        # Multiplication binds tighter: fold products into terms, then sum the signed terms.
        terms = [self.operands[0]]
        signs = [1]
        for op, value in zip(self.ops, self.operands[1:]):
            if op == "*":
                terms[-1] *= value
            else:
                terms.append(value)
                signs.append(1 if op == "+" else -1)
        return sum(s * t for s, t in zip(signs, terms))

    @property
    def solution(self) -> str:
        """A worked answer in the style the model is trained towards (SFT target): "3 + 5 = 8"."""
        spaced = self.expression
        for op in OPERATIONS:
            spaced = spaced.replace(op, f" {op} ")
        return f"{spaced} = {self.answer}"

    @property
    def key(self) -> str:
        """Canonical key: a two-term sum or product is the same problem in either order."""
        if len(self.operands) == 2 and self.ops[0] in ("+", "*"):
            a, b = sorted(self.operands)
            return f"{a}{self.ops[0]}{b}"
        return self.expression


def _space_size(min_value: int, max_value: int, operations, num_terms: int) -> int:
    return (max_value - min_value + 1) ** num_terms * len(operations) ** (num_terms - 1)


def arithmetic_problems(
    seed: int, min_value: int, max_value: int, operations, num_terms: int, count: int | None
) -> list[ArithmeticProblem]:
    """All problems of the space (when small enough), else ``count`` distinct random ones."""
    values = range(min_value, max_value + 1)
    size = _space_size(min_value, max_value, operations, num_terms)
    if size <= _ENUMERATE_LIMIT:
        return [
            ArithmeticProblem(tuple(nums), tuple(ops))
            for nums in itertools.product(values, repeat=num_terms)
            for ops in itertools.product(operations, repeat=num_terms - 1)
        ]
    if count is None:
        raise ValueError(f"the problem space has {size} problems; give --train-size to sample from it")
    rng = random.Random(seed)
    seen: dict[str, ArithmeticProblem] = {}
    for _ in range(20 * count):
        if len(seen) >= count:
            break
        problem = ArithmeticProblem(
            tuple(rng.choice(values) for _ in range(num_terms)),
            tuple(rng.choice(operations) for _ in range(num_terms - 1)),
        )
        seen.setdefault(problem.key, problem)
    if len(seen) < count:
        raise ValueError(f"could not draw {count} distinct problems; widen the value range or ask for fewer")
    return list(seen.values())


def split_problems(
    seed: int,
    min_value: int,
    max_value: int,
    operations: tuple[str, ...],
    num_terms: int,
    val_size: int,
    train_size: int | None,
) -> tuple[list[ArithmeticProblem], list[ArithmeticProblem]]:
    """(train, validation) problems of the space, checked, drawn and split by canonical key (``seed``); the
    tasks built on this space (arithmetic, calculator) write their own rows from them."""
    unknown = set(operations) - set(OPERATIONS)
    if unknown or not operations:
        raise ValueError(
            f"operations {sorted(unknown) or list(operations)} not supported; choose from {list(OPERATIONS)}"
        )
    if num_terms < 2:
        raise ValueError(f"num_terms={num_terms}: a problem needs at least two terms")
    if min_value > max_value:
        raise ValueError(f"min_value={min_value} > max_value={max_value}")
    count = None if train_size is None else train_size + val_size
    problems = arithmetic_problems(seed, min_value, max_value, tuple(operations), num_terms, count)
    train, val = split_by_key(problems, lambda p: p.key, val_size, train_size, seed)
    return train, val


def generate_arithmetic(
    seed: int = 0,
    min_value: int = 0,
    max_value: int = 20,
    operations: tuple[str, ...] = ("+",),
    num_terms: int = 2,
    val_size: int = 128,
    train_size: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Rows in verl's schema: ``{"train": [...], "test": [...]}``, disjoint by canonical key and
    deterministic in ``seed``. Defaults: the measured task (a+b, a and b in 0..20, 128 validation
    problems, the rest for training)."""
    train, val = split_problems(seed, min_value, max_value, operations, num_terms, val_size, train_size)
    return task_rows(DATA_SOURCE, train, val, key=lambda p: p.key)
