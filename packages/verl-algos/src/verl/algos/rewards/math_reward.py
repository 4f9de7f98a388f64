"""MATH-style answers: the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), checked for
mathematical equivalence with the ground truth by the math-verify package (so "\\frac{1}{2}", "0.5"
and "1/2" agree, as do "x^2+1" and "1+x^2").

math-verify bounds its work with SIGALRM timeouts, which only work in the main thread; elsewhere
(e.g. a reward thread pool) it runs without a timeout.
"""

from __future__ import annotations

import threading

_MAX_ANSWER_CHARS = 1000  # a "final answer" longer than this is not an answer; skip the parser
_TIMEOUT_S = 5


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` / ``\\fbox{...}`` (braces balanced), or ``\\boxed <token>``; None if absent."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    if text.startswith("\\boxed ", idx):
        rest = text[idx + len("\\boxed ") :]
        return "\\boxed " + rest.split("$")[0].strip()
    depth, start = 0, None
    for i in range(idx, len(text)):
        if text[i] == "{":
            depth += 1
            start = i if start is None else start
        elif text[i] == "}":
            depth -= 1
            if depth == 0 and start is not None:
                return text[idx : i + 1]
    return None  # unbalanced braces: a truncated answer


def remove_boxed(boxed: str) -> str:
    for prefix in ("\\boxed ", "\\boxed{", "\\fbox{"):
        if boxed.startswith(prefix):
            inner = boxed[len(prefix) :]
            return inner if prefix.endswith(" ") else inner[:-1]
    raise ValueError(f"not a boxed answer: {boxed[:50]!r}")


def extract_boxed_answer(text: str) -> str | None:
    boxed = last_boxed_only_string(text)
    return None if boxed is None else remove_boxed(boxed).strip()


def is_equiv(answer: str, ground_truth: str) -> bool:
    """Equivalence by math-verify (string equality short-cuts it)."""
    if answer.strip() == ground_truth.strip():
        return True
    if len(answer) > _MAX_ANSWER_CHARS:
        return False
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    timeout = _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    gold = parse(f"${ground_truth}$", extraction_config=configs, parsing_timeout=timeout)
    pred = parse(f"${answer}$", extraction_config=configs, parsing_timeout=timeout)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the last boxed answer of ``solution_str`` is equivalent to ``ground_truth`` (which may
    itself be boxed), else 0.0 (also when there is no boxed answer)."""
    answer = extract_boxed_answer(solution_str)
    if answer is None:
        return 0.0
    truth = str(ground_truth)
    if "\\boxed" in truth or "\\fbox" in truth:
        truth = extract_boxed_answer(truth) or truth
    return 1.0 if is_equiv(answer, truth) else 0.0
