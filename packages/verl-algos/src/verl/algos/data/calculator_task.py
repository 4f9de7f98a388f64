"""The tool-use task of ``-r tool_grpo``: multi-digit products the model answers by calling a calculator.

"What is 347*28?" is out of reach for a 135M model's mental arithmetic (SmolLM2-135M-Instruct gets such
products wrong) and one calculator call away. Each prompt says how to call the tool in the Hermes
format, since small models' chat templates (SmolLM2's among them) do not render tool schemas; rows name
the ``tool_agent`` loop, and ``extra_info.solution`` is the first turn of a good episode (the call itself),
so that ``verl sft`` can warm-start a model that cannot form a call yet on a handful of them. Scored by the
numeric reward (the last number of the response: the model's final answer, after the tool's result).
"""

from __future__ import annotations

import json
from typing import Any

from verl.algos.data.arithmetic import ArithmeticProblem, split_problems

DATA_SOURCE = "calculator"
#: The function name of the built-in calculator tool (``builtin:calculator`` tool config).
TOOL_NAME = "calc"
INSTRUCTIONS = (
    "You have a calculator. To use it, write "
    f'<tool_call>{{"name": "{TOOL_NAME}", "arguments": {{"expression": "..."}}}}</tool_call> '
    "with the expression in place of ..., and you will get its result."
)


def tool_call(expression: str) -> str:
    return "<tool_call>" + json.dumps({"name": TOOL_NAME, "arguments": {"expression": expression}}) + "</tool_call>"


def generate_calculator(
    seed: int = 0,
    min_value: int = 100,
    max_value: int = 999,
    operations: tuple[str, ...] = ("*",),
    num_terms: int = 2,
    val_size: int = 128,
    train_size: int | None = 2000,
) -> dict[str, list[dict[str, Any]]]:
    """Rows in verl's schema (``{"train": [...], "test": [...]}``, disjoint by canonical key, deterministic
    in ``seed``). Defaults: 3-digit x 3-digit products, 128 held-out problems, 2000 for training."""
    train, val = split_problems(seed, min_value, max_value, operations, num_terms, val_size, train_size)
    return {
        "train": [_row(p, "train", i) for i, p in enumerate(train)],
        "test": [_row(p, "test", i) for i, p in enumerate(val)],
    }


def _row(problem: ArithmeticProblem, split: str, index: int) -> dict[str, Any]:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{INSTRUCTIONS} {problem.question}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(problem.answer)},
        "agent_name": "tool_agent",
        "extra_info": {
            "split": split,
            "index": index,
            "key": problem.key,
            "question": problem.question,
            "solution": tool_call(problem.expression),
        },
    }
