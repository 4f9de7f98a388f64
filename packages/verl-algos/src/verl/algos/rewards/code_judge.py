"""The trainer's side of judging a code test: the verdict comes from values compared here, never
from the program's exit status or from anything the program says about itself.

An ``assert_case`` is split before the program runs. Top-level statements that are not asserts run
in the sandbox as setup. Each ``assert`` is kept here as a template; the parts of it that need the
program (a call of its function, a name the setup defined) become *probes*, evaluated in the sandbox
by :mod:`.code_harness`, which writes their values back as record lines. The template is then
evaluated here, with the probes' values, by a small evaluator that knows constants, containers,
arithmetic, comparisons, boolean logic and a few pure builtins (``len``, ``sorted``, ``abs``,
``math.isclose``...). So ``assert f(2) == 4`` evaluates ``f(2)`` in the sandbox and ``== 4`` here:
the ``4`` never enters the program's process, and no rewrite of the program's exit path, of
``assert`` or of ``__eq__`` can make a wrong value pass.

Asserts inside blocks (``for``, ``def``, ``if``...) cannot be split: how often they run is decided
in the program's process. They are refused with a clear error (write each as its own top-level
``assert``).
"""

from __future__ import annotations

import ast
import base64
import json
import math
import operator
from dataclasses import dataclass, field
from typing import Any

from verl.algos.rewards.code_harness import MARKER, MAX_DEPTH


class JudgeError(ValueError):
    """A value cannot be judged (a malformed record, an operation the evaluator refuses)."""


# ------------------------------------------------------------------------------------------ plans
@dataclass
class Check:
    """One assert: its template (probes replaced by ``__probe_<step>`` names) and its source text."""

    template: ast.expression
    source: str


@dataclass
class TestPlan:
    """The steps the harness runs after the program (``{"exec": ...}``, ``{"probe": ...}`` or
    ``{"call": name, "args": [...]}``) and the checks evaluated here once their probes have values."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def probes(self) -> list[int]:
        return [i for i, step in enumerate(self.steps) if "exec" not in step]


_SAFE_FUNCTIONS = {
    "abs": abs,
    "all": all,
    "any": any,
    "bool": bool,
    "dict": dict,
    "float": float,
    "frozenset": frozenset,
    "int": int,
    "len": len,
    "list": list,
    "max": max,
    "min": min,
    "round": round,
    "set": set,
    "sorted": sorted,
    "str": str,
    "sum": sum,
    "tuple": tuple,
}
_SAFE_MATH_FUNCTIONS = {name: getattr(math, name) for name in ("isclose", "isnan", "isinf", "isfinite", "fabs")}
_SAFE_MATH_CONSTANTS = {name: getattr(math, name) for name in ("inf", "nan", "pi", "e")}
#: Nodes that only make sense where they stand (a lambda's value cannot leave the program).
_UNSPLITTABLE = (ast.Lambda, ast.Starred, ast.NamedExpr, ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)


def plan_assert_case(text: str, index: int) -> TestPlan:
    """Split one ``assert_case`` (test code appended to the program, verl's convention) into steps
    and checks. Raises ValueError naming what cannot be judged."""
    try:
        module = ast.parse(text)
    except SyntaxError as e:
        raise ValueError(f"code reward: assert_case {index} is not valid Python ({e.msg}, line {e.lineno})") from None
    plan = TestPlan()
    for statement in module.body:
        if isinstance(statement, ast.Assert):
            source = ast.unparse(statement)[:300]  # before the split rewrites it
            template = _Splitter(plan).split(statement.test)
            plan.checks.append(Check(ast.fix_missing_locations(ast.Expression(template)), source))
            continue
        nested = next((n for n in ast.walk(statement) if isinstance(n, ast.Assert)), None)
        if nested is not None:
            raise ValueError(
                f"code reward: assert_case {index} has an assert inside a block ({ast.unparse(nested)[:120]!r}); the "
                "judge evaluates only top-level assert statements outside the program, so write each check as its own "
                "top-level `assert <expression>` line"
            )
        plan.steps.append({"exec": ast.unparse(statement)})
    return plan


def plan_call(fn_name: str, args: list[Any]) -> TestPlan:
    """A call-based test: one probe, the call of ``fn_name`` (or the Solution method) with ``args``."""
    return TestPlan(steps=[{"call": fn_name, "args": args}])


class _Splitter:
    """Replaces the parts of an assert's expression that need the program by probe names."""

    def __init__(self, plan: TestPlan):
        self.plan = plan

    def probe(self, node: ast.expr) -> ast.expr:
        self.plan.steps.append({"probe": ast.unparse(node)})
        return ast.Name(id=f"__probe_{len(self.plan.steps) - 1}", ctx=ast.Load())

    def split(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.Constant):
            return node
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            if any(isinstance(e, ast.Starred) for e in node.elts):
                return self.probe(node)
            node.elts = [self.split(e) for e in node.elts]
            return node
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                return self.probe(node)
            node.keys = [self.split(k) for k in node.keys]
            node.values = [self.split(v) for v in node.values]
            return node
        if isinstance(node, ast.UnaryOp):
            node.operand = self.split(node.operand)
            return node
        if isinstance(node, ast.BinOp):
            node.left, node.right = self.split(node.left), self.split(node.right)
            return node
        if isinstance(node, ast.BoolOp):
            node.values = [self.split(v) for v in node.values]
            return node
        if isinstance(node, ast.Compare):
            node.left = self.split(node.left)
            node.comparators = [self.split(c) for c in node.comparators]
            return node
        if isinstance(node, ast.IfExp):
            node.test, node.body, node.orelse = self.split(node.test), self.split(node.body), self.split(node.orelse)
            return node
        if isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
            node.value, node.slice = self.split(node.value), self.split(node.slice)
            return node
        if isinstance(node, ast.Attribute) and _math_name(node) in _SAFE_MATH_CONSTANTS:
            return node
        if isinstance(node, ast.Call) and _safe_function(node.func) is not None:
            children = [*node.args, *(k.value for k in node.keywords)]
            if all(k.arg is not None for k in node.keywords) and not any(
                isinstance(n, _UNSPLITTABLE) for c in children for n in ast.walk(c)
            ):
                node.args = [self.split(a) for a in node.args]
                for keyword in node.keywords:
                    keyword.value = self.split(keyword.value)
                return node
        return self.probe(node)


def _math_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math":
        return node.attr
    return None


def _safe_function(node: ast.expr):
    if isinstance(node, ast.Name):
        return _SAFE_FUNCTIONS.get(node.id)
    name = _math_name(node)
    return _SAFE_MATH_FUNCTIONS.get(name) if name else None


# ------------------------------------------------------------------------------------------ records
@dataclass
class Records:
    """What the harness reported: whether the program ran to its end, the probes' values, the first
    error (``(step, message)``), and the program's own output with the record lines taken out."""

    ran: bool
    values: dict[int, Any]
    error: tuple[Any, str] | None
    output: str


def read_records(stdout: str) -> Records:
    ran, values, error, lines = False, {}, None, []
    for line in stdout.split("\n"):
        if not line.startswith(MARKER):
            lines.append(line)
            continue
        try:
            fields = json.loads(line[len(MARKER) :])
            kind = fields[0]
            if kind == "ran":
                ran = True
            elif kind == "value":
                values[int(fields[1])] = decode(fields[2])
            elif kind == "error" and error is None:
                error = (fields[1], str(fields[2]))
        except (ValueError, TypeError, IndexError, KeyError, RecursionError):
            continue  # not a record the harness wrote: the probe it claims stays without a value
    return Records(ran, values, error, "\n".join(lines))


def decode(data: Any, depth: int = 0) -> Any:
    """The value :func:`code_harness.encode` wrote. Raises JudgeError on anything else."""
    if depth > MAX_DEPTH + 1:
        raise JudgeError("a value nested too deeply")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode(v, depth + 1) for v in data]
    if isinstance(data, dict) and len(data) == 1:
        ((tag, inner),) = data.items()
        if tag in ("t", "s", "fs", "d", "c") and not isinstance(inner, list):
            raise JudgeError(f"a malformed {tag!r} value: {str(inner)[:100]!r}")
        try:
            if tag == "t":
                return tuple(decode(v, depth + 1) for v in inner)
            if tag == "s":
                return {decode(v, depth + 1) for v in inner}
            if tag == "fs":
                return frozenset(decode(v, depth + 1) for v in inner)
            if tag == "d":
                return {decode(k, depth + 1): decode(v, depth + 1) for k, v in inner}
            if tag == "b":
                return base64.b64decode(inner, validate=True)
            if tag == "c":
                return complex(float(inner[0]), float(inner[1]))
            if tag == "i":
                return int(inner, 16)
        except (TypeError, ValueError) as e:
            raise JudgeError(f"a malformed {tag!r} value: {e}") from None
    raise JudgeError(f"not a judge value: {str(data)[:100]!r}")


# ------------------------------------------------------------------------------------------ evaluation
_BIN_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}
_UNARY_OPS = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}
_COMPARE_OPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
#: The largest sequence or number of bits an operation here may build (the trainer's memory).
_MAX_SIZE = 10**7


def evaluate(check: Check, values: dict[int, Any]) -> Any:
    """The value of an assert's expression with its probes' ``values``."""
    return _eval(check.template.body, values)


def _eval(node: ast.expr, values: dict[int, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id.startswith("__probe_"):
        return values[int(node.id[len("__probe_") :])]
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e, values) for e in node.elts)
    if isinstance(node, ast.List):
        return [_eval(e, values) for e in node.elts]
    if isinstance(node, ast.Set):
        return {_eval(e, values) for e in node.elts}
    if isinstance(node, ast.Dict):
        return {_eval(k, values): _eval(v, values) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp):
        return _UNARY_OPS[type(node.op)](_eval(node.operand, values))
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, values), _eval(node.right, values)
        _check_size(type(node.op), left, right)
        return _BIN_OPS[type(node.op)](left, right)
    if isinstance(node, ast.BoolOp):
        result = None
        for value_node in node.values:
            result = _eval(value_node, values)
            if isinstance(node.op, ast.And) and not result or isinstance(node.op, ast.Or) and result:
                return result
        return result
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, values)
            if not _COMPARE_OPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, values) else node.orelse, values)
    if isinstance(node, ast.Subscript):
        return _eval(node.value, values)[_eval(node.slice, values)]
    if isinstance(node, ast.Attribute) and _math_name(node) in _SAFE_MATH_CONSTANTS:
        return _SAFE_MATH_CONSTANTS[_math_name(node)]
    if isinstance(node, ast.Call):
        function = _safe_function(node.func)
        args = [_eval(a, values) for a in node.args]
        kwargs = {k.arg: _eval(k.value, values) for k in node.keywords}
        return function(*args, **kwargs)
    raise JudgeError(f"the judge cannot evaluate {ast.unparse(node)[:100]!r}")


def _check_size(op: type, left: Any, right: Any) -> None:
    """Refuse operations that would build something huge in the trainer from a program's value."""
    if op is ast.Mult:
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(count, int) and len(seq) * count > _MAX_SIZE:
                raise JudgeError(f"a sequence repeated {count} times is too large to compare")
    if op is ast.Pow and isinstance(left, int) and isinstance(right, int):
        if right > 0 and max(abs(left), 2).bit_length() * right > _MAX_SIZE:
            raise JudgeError(f"{left} ** {right} is too large to compare")
    if op is ast.LShift and isinstance(right, int) and right > _MAX_SIZE:
        raise JudgeError(f"a shift by {right} bits is too large to compare")
