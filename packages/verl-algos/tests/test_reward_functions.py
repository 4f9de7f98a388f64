"""The built-in reward functions on tables of real-looking answers (right, wrong, malformed, empty,
very long), and the default dispatch on data_source."""

from __future__ import annotations

import pytest

from verl.algos.rewards import RewardSetupError, default_compute_score, gsm8k, math_reward, numeric

LONG_RAMBLE = "Let me think about this carefully. " * 3000

GSM8K_CASES = [
    # (completion, ground truth, strict score, flexible score)
    ("Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72", "72", 1.0, 1.0),
    ("She earns 12/60 = $0.2 per minute.\n#### 10", "10", 1.0, 1.0),
    ("The total is 1,234 dollars.\n#### 1,234", "1234", 1.0, 0.0),  # flexible keeps the comma (verl)
    ("#### -5", "-5", 1.0, 1.0),
    ("Adding up gives 71.\n#### 71", "72", 0.0, 0.0),  # wrong
    ("So the answer is 72", "72", 0.0, 1.0),  # no "####": strict finds nothing
    ("#### $72", "72", 0.0, 1.0),  # malformed marker for strict
    ("", "72", 0.0, 0.0),  # empty
    ("I am not sure.", "72", 0.0, 0.0),
    (LONG_RAMBLE + "#### 72", "72", 1.0, 1.0),  # very long, answer at the end
    ("#### 72\n" + LONG_RAMBLE, "72", 0.0, 0.0),  # only the last 300 characters are searched (verl)
]


@pytest.mark.parametrize("completion,truth,strict,flexible", GSM8K_CASES)
def test_gsm8k(completion, truth, strict, flexible):
    assert gsm8k.compute_score(completion, truth) == strict
    assert gsm8k.compute_score(completion, truth, method="flexible") == flexible


def test_gsm8k_format_score():
    assert gsm8k.compute_score("#### 3", "4", format_score=0.1) == 0.1


MATH_CASES = [
    ("So $x = \\boxed{\\frac{1}{2}}$.", "0.5", 1.0),
    ("The probability is \\boxed{0.5}.", "\\frac12", 1.0),
    ("\\boxed{\\sqrt{\\frac{1}{4}}}", "\\frac{1}{2}", 1.0),  # nested braces
    ("Expanding, \\boxed{1+x^2}", "x^2+1", 1.0),
    ("\\fbox{7}", "7", 1.0),
    ("First \\boxed{1}, but correcting: \\boxed{2}", "2", 1.0),  # the last boxed answer counts
    ("\\boxed{7}", "\\boxed{7}", 1.0),  # a boxed ground truth
    ("\\boxed 7$", "7", 1.0),
    ("\\boxed{3}", "4", 0.0),  # wrong
    ("\\boxed{\\pi}", "3.14", 0.0),
    ("The answer is 1/2", "\\frac{1}{2}", 0.0),  # no boxed answer
    ("\\boxed{\\frac{1}{2}", "\\frac{1}{2}", 0.0),  # truncated, unbalanced
    ("", "1", 0.0),  # empty
    ("\\boxed{}", "1", 0.0),
    (LONG_RAMBLE + "\\boxed{42}", "42", 1.0),  # very long
    ("\\boxed{" + "1+" * 2000 + "1}", "2001", 0.0),  # an "answer" too long to be one
]


@pytest.mark.parametrize("completion,truth,expected", MATH_CASES)
def test_math(completion, truth, expected):
    assert math_reward.compute_score(completion, truth) == expected


NUMERIC_CASES = [
    ("12 + 7 = 19.", "19", 1.0),  # the small model's usual answer shape
    ("The answer is 19", "19", 1.0),
    ("19", 19, 1.0),  # an int ground truth
    ("19.0", "19", 1.0),
    ("12-15=-3", "-3", 1.0),  # "-15" after a digit is subtraction; "-3" after "=" is negative
    ("There are 1,234 apples.", "1234", 1.0),
    ("19 is the answer, not 20", "19", 0.0),  # the LAST number counts
    ("19.5", "19", 0.0),
    ("What is 12+7? Answer with a number.", "19", 0.0),
    ("I don't know.", "19", 0.0),
    ("", "19", 0.0),
    ("1 " * 5000 + "19", "19", 1.0),  # very long
]


@pytest.mark.parametrize("completion,truth,expected", NUMERIC_CASES)
def test_numeric(completion, truth, expected):
    assert numeric.compute_score(completion, truth) == expected


def test_numeric_rejects_a_non_numeric_ground_truth():
    with pytest.raises(ValueError, match="not a number"):
        numeric.compute_score("19", "nineteen")


@pytest.mark.parametrize(
    "data_source,completion,truth",
    [
        ("openai/gsm8k", "#### 72", "72"),
        ("lighteval/MATH", "\\boxed{\\frac{1}{2}}", "0.5"),
        ("HuggingFaceH4/MATH-500", "\\boxed{3}", "3"),
        ("arithmetic", "12+7 = 19", "19"),
        ("word_problems", "She has 52 pencils.", "52"),
    ],
)
def test_default_compute_score_dispatches_on_data_source(data_source, completion, truth):
    assert default_compute_score(data_source, completion, truth) == 1.0


def test_unknown_data_source_is_a_setup_error_pointing_to_custom_rewards():
    with pytest.raises(RewardSetupError, match="custom_reward_function.path") as err:
        default_compute_score("my/dataset", "42", "42")
    assert "openai/gsm8k" in str(err.value)
