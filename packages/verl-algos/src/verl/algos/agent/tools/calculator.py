"""A calculator tool: arithmetic on numbers, evaluated by walking the parsed expression (never eval).

Allowed: int/float literals, + - * / // % **, unary + -, parentheses. Powers are bounded so that a
call like ``9**9**9`` is refused instead of taking the machine.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from verl.algos.agent.tools.base import TOOL_CLASSES, BaseTool, ToolResult

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPONENT = 1000
_MAX_DIGITS = 4000
_MAX_LENGTH = 1000


class CalculatorError(ValueError):
    """An expression the calculator does not evaluate; the message says why."""


def evaluate(expression: str) -> int | float:
    if len(expression) > _MAX_LENGTH:
        raise CalculatorError(f"the expression is longer than {_MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"{expression!r} is not an arithmetic expression") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise CalculatorError(f"exponents are limited to {_MAX_EXPONENT} in absolute value")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is too large") from None
        if isinstance(result, complex):
            raise CalculatorError("the result is not a real number")
        if isinstance(result, int) and result.bit_length() > _MAX_DIGITS * 3.33:
            raise CalculatorError(f"the result has more than {_MAX_DIGITS} digits")
        if isinstance(result, float) and not math.isfinite(result):
            raise CalculatorError("the result is not finite")
        return result
    raise CalculatorError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")


def format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


@TOOL_CLASSES.register(class_name=["calculator", "verl.algos.agent.tools.calculator.CalculatorTool"])
class CalculatorTool(BaseTool):
    """Schema parameters: ``{"expression": string}``."""

    def __init__(self, config: dict[str, Any], tool_schema: dict[str, Any]):
        super().__init__(config, tool_schema)
        self.reject_unknown_config(set())

    def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            return ToolResult(format_number(evaluate(str(arguments["expression"]))))
        except CalculatorError as e:
            return ToolResult(f"Error: {e}.", error=True)
