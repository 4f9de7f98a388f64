"""GSM8K answers: "#### 72" at the end of the solution (verl's semantics).

- ``strict``: the last "#### <number>" (commas and "$" removed) is the answer; without it, score 0.
- ``flexible``: the last number-like token anywhere in the text (not "" or ".") is the answer.

Only the last 300 characters are searched, as verl does, so a runaway generation cannot make the
regex slow. The answer is compared to the ground truth as a string: ``score`` (1.0) when equal,
``format_score`` (0.0) when an answer was found but is wrong, 0 when there is none.
"""

from __future__ import annotations

import re

_CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k extraction method must be 'strict' or 'flexible', got {method!r}")
    text = solution_str[-_CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(text)
        return found[-1].replace(",", "").replace("$", "") if found else None
    for candidate in reversed(_FLEXIBLE.findall(text)):
        if candidate not in ("", "."):
            return candidate
    return None


def compute_score(
    solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == str(ground_truth) else format_score
