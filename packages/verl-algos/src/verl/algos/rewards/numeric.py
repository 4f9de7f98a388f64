"""Plain numeric answers: the LAST number in the completion must equal the ground truth.

This is the scorer of the embedded arithmetic and word-problem tasks: a small model tends to answer
"12 + 13 = 25", so the last number (not the first) is its answer. Thousands separators ("1,234") are
accepted; "25." at the end of a sentence reads as 25; "12-5" reads as 12 and 5 (a minus sign glued
to a preceding digit is an operator, not a sign).
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"(?<![\d.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\d.])-?\d+(?:\.\d+)?")
_CLIP_CHARS = 1000  # the answer is at the end; bound the regex work on runaway generations


def extract_last_number(text: str) -> str | None:
    found = _NUMBER.findall(text[-_CLIP_CHARS:])
    return found[-1].replace(",", "") if found else None


def _parse(value) -> float:
    try:
        return float(str(value).replace(",", "").strip())
    except ValueError:
        raise ValueError(f"numeric reward: ground truth {value!r} is not a number") from None


def compute_score(solution_str: str, ground_truth, tolerance: float = 1e-6) -> float:
    """1.0 if the last number of ``solution_str`` equals ``ground_truth`` (within ``tolerance``,
    relative for large values), else 0.0."""
    expected = _parse(ground_truth)
    answer = extract_last_number(solution_str)
    if answer is None:
        return 0.0
    got = float(answer)
    return 1.0 if abs(got - expected) <= tolerance * max(1.0, abs(expected)) else 0.0
