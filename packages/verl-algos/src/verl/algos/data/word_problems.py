"""Multi-step word problems with integer answers, generated offline.

    "Mia has 7 apples. She buys 3 bags with 4 apples each. Then she gives 5 apples to a friend.
     How many apples does Mia have now? Answer with a number."

Difficulty: ``num_steps`` (operations after the starting amount) and ``max_value`` (largest number
in the text). Every intermediate amount stays a non-negative integer. The canonical key is the
arithmetic (start and steps); names and objects are decoration, so two problems that differ only
in them count as the same problem and never straddle the split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from verl.algos.data.splits import split_by_key, task_rows

DATA_SOURCE = "word_problems"
_PEOPLE = [("Mia", "She"), ("Tom", "He"), ("Ana", "She"), ("Leo", "He"), ("Zoe", "She"), ("Sam", "He")]
_OBJECTS = ["apples", "marbles", "stickers", "pencils", "cookies", "cards"]
_STEP_KINDS = ("buy", "give", "bags", "share")


@dataclass(frozen=True)
class WordProblem:
    start: int
    steps: tuple[tuple[str, int, int], ...]  # (kind, n, m): bags uses n bags of m; others use n
    person: int
    obj: int

    @property
    def key(self) -> tuple:
        return (self.start, self.steps)

    @property
    def answer(self) -> int:
        amount = self.start
        for kind, n, m in self.steps:
            amount = _apply(amount, kind, n, m)
        return amount

    @property
    def solution(self) -> str:
        """A worked answer, one arithmetic step per sentence (SFT target), ending in the number."""
        amount, parts = self.start, []
        for kind, n, m in self.steps:
            new = _apply(amount, kind, n, m)
            expr = {"buy": f"{amount} + {n}", "give": f"{amount} - {n}", "bags": f"{amount} + {n} * {m}"}.get(
                kind, f"{amount} / {n}"
            )
            parts.append(f"{expr} = {new}.")
            amount = new
        return " ".join(parts) + f" The answer is {amount}."

    @property
    def question(self) -> str:
        name, pronoun = _PEOPLE[self.person]
        thing = _OBJECTS[self.obj]
        sentences = [f"{name} has {_count(self.start, thing)}."]
        for i, (kind, n, m) in enumerate(self.steps):
            lead = pronoun if i == 0 else f"Then {pronoun.lower()}"
            if kind == "buy":
                sentences.append(f"{lead} buys {n} more {_noun(n, thing)}.")
            elif kind == "give":
                sentences.append(f"{lead} gives {_count(n, thing)} to a friend.")
            elif kind == "bags":
                sentences.append(f"{lead} buys {n} bags with {m} {thing} each.")
            else:
                sentences.append(f"{lead} shares them equally among {n} friends and keeps none.")
                sentences.append(f"How many {thing} does each friend get? Answer with a number.")
                return " ".join(sentences)
        sentences.append(f"How many {thing} does {name} have now? Answer with a number.")
        return " ".join(sentences)


def _noun(n: int, plural: str) -> str:
    return plural[:-1] if n == 1 else plural  # every object name is a regular "-s" plural


def _count(n: int, plural: str) -> str:
    return f"{n} {_noun(n, plural)}"


def _apply(amount: int, kind: str, n: int, m: int) -> int:
    if kind == "buy":
        return amount + n
    if kind == "give":
        return amount - n
    if kind == "bags":
        return amount + n * m
    return amount // n  # share: only drawn when n divides amount


def _draw(rng: random.Random, num_steps: int, max_value: int) -> WordProblem:
    start = rng.randint(1, max_value)
    amount, steps = start, []
    for i in range(num_steps):
        last = i == num_steps - 1
        kinds = [k for k in _STEP_KINDS if k != "share" or last]  # sharing ends the story
        kind = rng.choice(kinds)
        n = m = 0
        if kind == "buy":
            n = rng.randint(1, max_value)
        elif kind == "give" and amount >= 1:
            n = rng.randint(1, min(amount, max_value))
        elif kind == "bags":
            n, m = rng.randint(2, max(2, min(5, max_value))), rng.randint(2, max(2, min(10, max_value)))
        elif kind == "share":
            divisors = [d for d in range(2, min(amount, max_value) + 1) if amount % d == 0]
            if divisors:
                n = rng.choice(divisors)
        if n == 0:  # the drawn step does not fit the current amount: buy instead
            kind, n = "buy", rng.randint(1, max_value)
        steps.append((kind, n, m))
        amount = _apply(amount, kind, n, m)
    return WordProblem(start, tuple(steps), rng.randrange(len(_PEOPLE)), rng.randrange(len(_OBJECTS)))


def generate_word_problems(
    seed: int = 0, num_steps: int = 2, max_value: int = 20, train_size: int = 1000, val_size: int = 128
) -> dict[str, list[dict[str, Any]]]:
    """Rows in verl's schema: ``{"train": [...], "test": [...]}``, disjoint by canonical key and
    deterministic in ``seed``."""
    if num_steps < 1:
        raise ValueError(f"num_steps={num_steps} must be at least 1")
    if max_value < 2:
        raise ValueError(f"max_value={max_value} must be at least 2")
    rng = random.Random(seed)
    wanted = train_size + val_size
    problems: dict[tuple, WordProblem] = {}
    for _ in range(50 * wanted):
        if len(problems) >= wanted:
            break
        problem = _draw(rng, num_steps, max_value)
        problems.setdefault(problem.key, problem)
    if len(problems) < wanted:
        raise ValueError(
            f"only {len(problems)} distinct problems with num_steps={num_steps}, max_value={max_value}; "
            f"asked for {wanted}: raise max_value or num_steps, or ask for fewer"
        )
    train, val = split_by_key(list(problems.values()), lambda p: p.key, val_size, train_size, seed)
    return task_rows(DATA_SOURCE, train, val, key=lambda p: repr(p.key))
