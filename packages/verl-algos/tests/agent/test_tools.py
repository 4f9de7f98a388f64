"""Tools: verl's YAML tool config, argument validation, the built-ins (calculator, sandboxed code
interpreter, gsm8k), and errors/exceptions/timeouts turned into error results."""

from __future__ import annotations

import sys
import textwrap
import threading

import pytest

from verl.algos.agent.tool_parsers import ToolCall
from verl.algos.agent.tools import TOOL_CLASSES, BaseTool, ToolExecutor, ToolResult, build_tools, load_tools
from verl.algos.agent.tools.calculator import CalculatorError, evaluate


def schema(name: str, **properties: dict) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": properties, "required": list(properties)},
        },
    }


GSM8K_YAML = """
tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k."
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
  - class_name: calculator
    tool_schema:
      type: function
      function:
        name: calc
        description: arithmetic
        parameters: {type: object, properties: {expression: {type: string}}, required: [expression]}
"""


def test_verl_tool_config_file_builds_its_tools(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(GSM8K_YAML)
    tools = load_tools(str(path))
    assert sorted(tools) == ["calc", "calc_gsm8k_reward"]
    assert type(tools["calc_gsm8k_reward"]).__name__ == "Gsm8kTool"
    assert tools["calc"].tool_schema["function"]["description"] == "arithmetic"


@pytest.mark.parametrize(
    "document, message",
    [
        ({}, "'tools' list"),
        ({"tools": [{"tool_schema": schema("a")}]}, "class_name"),
        ({"tools": [{"class_name": "calculater", "tool_schema": schema("a")}]}, "Nearest: 'calculator'"),
        ({"tools": [{"class_name": "no.such.Tool", "tool_schema": schema("a")}]}, "neither registered nor importable"),
        ({"tools": [{"class_name": "calculator", "tool_schema": {"type": "function"}}]}, "tool_schema must be"),
        ({"tools": [{"class_name": "calculator", "tool_schema": schema("")}]}, "non-empty string"),
        (
            {"tools": [{"class_name": "calculator", "tool_schema": schema("a", x={"type": "strnig"})}]},
            "not a valid JSON schema",
        ),
        ({"tools": [{"class_name": "calculator", "tool_schema": schema("a"), "config": {"digits": 3}}]}, "digits"),
        ({"tools": [{"class_name": "calculator", "tool_schema": schema("a")}] * 2}, "a second tool named 'a'"),
        ({"tools": [{"class_name": "threading.Thread", "tool_schema": schema("a")}]}, "not a subclass of"),
    ],
)
def test_bad_tool_configs_say_what_is_wrong(document, message):
    with pytest.raises(ValueError, match=message):
        build_tools(document)


class Echo(BaseTool):
    def execute(self, instance_id, arguments):
        return ToolResult(f"{instance_id}:{arguments['text']}")


def test_a_user_tool_by_import_path_and_by_registration():
    assert build_tools({"tools": [{"class_name": f"{__name__}.Echo", "tool_schema": schema("echo")}]})
    TOOL_CLASSES.register(class_name="test_echo")(Echo)
    try:
        tools = build_tools({"tools": [{"class_name": "test_echo", "tool_schema": schema("echo", text={})}]})
        assert ToolExecutor(tools).run("t0", [ToolCall("echo", {"text": "hi"})])[0].text == "t0:hi"
    finally:
        TOOL_CLASSES.unregister(class_name="test_echo")


@pytest.mark.parametrize(
    "expression, value",
    [
        ("2+3*4", 14),
        ("(2+3)*4", 20),
        ("7/2", 3.5),
        ("7//2", 3),
        ("-2**10", -1024),
        ("1e3 % 7", 6.0),
        ("12345*6789", 83810205),
    ],
)
def test_calculator_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression, message",
    [
        ("__import__('os')", "not Call"),
        ("x + 1", "not Name"),
        ("'a' * 3", "not Constant"),
        ("1/0", "division by zero"),
        ("9**9**9", "exponents are limited"),
        ("2.0**1000 * 2.0**1000", "not finite"),
        ("1 +", "not an arithmetic expression"),
        ("True + 1", "not Constant"),
    ],
)
def test_calculator_refuses_what_is_not_plain_arithmetic(expression, message):
    with pytest.raises(CalculatorError, match=message):
        evaluate(expression)


@pytest.fixture
def calc_executor():
    tools = build_tools(
        {"tools": [{"class_name": "calculator", "tool_schema": schema("calc", expression={"type": "string"})}]}
    )
    return ToolExecutor(tools)


def test_calculator_tool_answers_and_reports_bad_expressions(calc_executor):
    good, bad = calc_executor.run(
        "t", [ToolCall("calc", {"expression": "6*7"}), ToolCall("calc", {"expression": "1/0"})]
    )
    assert (good.text, good.error) == ("42", False)
    assert bad.error and bad.text == "Error: division by zero."


@pytest.mark.parametrize(
    "call, message",
    [
        (ToolCall("calculator", {"expression": "1"}), "no tool named 'calculator'; the tools are: calc"),
        (ToolCall("calc", {}), "'expression' is a required property"),
        (ToolCall("calc", {"expression": 3}), "expression: 3 is not of type 'string'"),
    ],
)
def test_unknown_tools_and_bad_arguments_become_error_results(calc_executor, call, message):
    [result] = calc_executor.run("t", [call])
    assert result.error and message in result.text


class Exploding(BaseTool):
    def execute(self, instance_id, arguments):
        raise RuntimeError("the backend is down")


class Hanging(BaseTool):
    release_event = threading.Event()

    def execute(self, instance_id, arguments):
        self.release_event.wait(30)
        return ToolResult("late")


def test_exceptions_and_timeouts_become_error_results():
    tools = {
        "boom": Exploding({}, schema("boom")),
        "hang": Hanging({"timeout_s": 0.2}, schema("hang")),
    }
    executor = ToolExecutor(tools)
    boom, hang = executor.run("t", [ToolCall("boom", {}), ToolCall("hang", {})])
    Hanging.release_event.set()
    assert boom.error and boom.text == "Error: boom failed: RuntimeError: the backend is down"
    assert hang.error and hang.text == "Error: hang did not answer within 0.2 s."


def test_gsm8k_tool_scores_and_penalises_answers_that_do_not_improve():
    [tool] = build_tools(
        {
            "tools": [
                {"class_name": "verl.tools.gsm8k_tool.Gsm8kTool", "tool_schema": schema("g", answer={"type": "string"})}
            ]
        }
    ).values()
    tool.create("a", ground_truth="72")
    wrong = tool.execute("a", {"answer": "70"})
    assert (wrong.text, wrong.reward) == ("Current parsed answer='70' reward=0.0", -0.05)
    right = tool.execute("a", {"answer": "72"})
    assert (right.text, right.reward, tool.calc_reward("a")) == ("Current parsed answer='72' reward=1.0", 0.0, 1.0)
    assert tool.execute("a", {"answer": "#### 72"}).reward == -0.05  # no improvement on 1.0
    tool.release("a")
    with pytest.raises(ValueError, match="create_kwargs.ground_truth"):
        tool.create("b")


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the code sandbox is Linux-only")


@pytest.fixture(scope="module")
def code_executor():
    config = {"cpu_time_s": 1, "wall_time_s": 3, "memory_mb": 256, "max_processes": 4}
    tool = {
        "class_name": "code_interpreter",
        "config": config,
        "tool_schema": schema("python", code={"type": "string"}),
    }
    tools = build_tools({"tools": [tool]})
    tools["python"].sandbox.check()
    return ToolExecutor(tools)


def run_code(executor, code):
    return executor.run("t", [ToolCall("python", {"code": textwrap.dedent(code)})])[0]


@linux_only
def test_code_interpreter_prints_come_back(code_executor):
    assert run_code(code_executor, "print(12345 * 6789)").text == "83810205\n"
    assert run_code(code_executor, "x = 1").text == "(no output)"


@linux_only
def test_code_interpreter_exception_comes_back_with_its_traceback(code_executor):
    result = run_code(code_executor, "print('before')\nraise ValueError('bad')")
    assert result.error and "runtime_error" in result.text and "before" in result.text
    assert "ValueError: bad" in result.text


@linux_only
def test_code_interpreter_infinite_loop_is_stopped_by_the_sandbox(code_executor):
    result = run_code(code_executor, "while True: pass")
    assert result.error and "timeout" in result.text


@linux_only
@pytest.mark.parametrize(
    "code, status",
    [
        ("open('/etc/escape_attempt', 'w').write('x')", "runtime_error"),
        ("import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)", "runtime_error"),
        ("x = bytearray(1024 * 1024 * 1024)", "memory"),
    ],
)
def test_code_interpreter_contains_escapes(code_executor, code, status):
    result = run_code(code_executor, code)
    assert result.error and status in result.text
